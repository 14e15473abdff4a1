"""Tiny random transformers models, exported the ways users export them, and the references the graph
frontend tests compare grokc against.

- ``hf_folder``: a random ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (norm weights in [0.5, 1.5],
  biases N(0, 0.1), so a wrong mapping shows) saved with an offline word-level tokenizer;
- ``export_torch``: ``torch.onnx.export(dynamo=True)`` of it, with or without ``past_key_values``
  inputs (``WithCache`` / ``NoCache``, the code the exporter needs for transformers 5);
- ``build_genai``: onnxruntime-genai's model builder on the folder (``python -m
  onnxruntime_genai.models.builder``);
- ``ort_steps`` / ``ort_greedy``: onnxruntime's logits for a prompt and teacher-forced steps, and its
  greedy tokens (the reference); ``exact``: a copy of a model with MatMulNBits at
  ``accuracy_level=0`` (onnxruntime's default level 4 rounds the activations to int8);
- ``torch_steps`` / ``torch_greedy``: the same from the eager transformers model in fp32 (the
  reference for ``.pt2`` programs);
- ``plan_steps``: the same logits from grokc's CPU plan.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import torch

from grokc.artifacts.plan import IO
from grokc.runner import Runner, SamplingParams

Dim = torch.export.Dim


# Llama 3.1's rope scaling, but with the original context at 64 so that in these tiny models (head_dim
# 16, theta 500000: wavelengths 6.3, 32.5, 168, ...) one pair lies on the smooth ramp and six are
# divided by the factor: a graph read as plain rope would be far off from the first position on.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def hf_folder(folder: Path, family: str = "llama", seed: int = 0, **overrides) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=192, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                pad_token_id=0, tie_word_embeddings=False)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**base, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(folder)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"t{i}": i for i in range(4, model.config.vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(folder)
    return folder


def hf_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()


class NoCache(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask, position_ids):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).logits


class WithCache(torch.nn.Module):
    """Flat ``past_key_values.{i}.key/value [B, kv, past, D]`` -> logits and flat ``present.*``."""

    def __init__(self, m):
        super().__init__()
        self.m, self.layers = m, m.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, position_ids, past):
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.layers)],
                             config=self.m.config)
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                     use_cache=True)
        return (out.logits, *[t for layer in out.cache.layers for t in (layer.keys, layer.values)])


def export_torch(folder: Path, path: Path, cache: bool, opset: int | None = None) -> Path:
    model = hf_model(folder)
    c = model.config
    b, s = Dim("batch"), Dim("seq")
    ids = torch.randint(4, c.vocab_size, (2, 5))
    pos = torch.arange(5).expand(2, 5).contiguous()
    kw = {} if opset is None else {"opset_version": opset}
    if not cache:
        torch.onnx.export(NoCache(model).eval(), (ids, torch.ones(2, 5, dtype=torch.int64), pos), str(path), dynamo=True,
                          input_names=["input_ids", "attention_mask", "position_ids"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s},
                                          "position_ids": {0: b, 1: s}}, verbose=False, **kw)
        return path
    d = c.hidden_size // c.num_attention_heads
    past = [torch.randn(2, c.num_key_value_heads, 3, d) for _ in range(2 * c.num_hidden_layers)]
    names = [f"past_key_values.{i}.{kv}" for i in range(c.num_hidden_layers) for kv in ("key", "value")]
    torch.onnx.export(WithCache(model).eval(), (ids, torch.ones(2, 8, dtype=torch.int64), pos + 3, past), str(path),
                      dynamo=True, input_names=["input_ids", "attention_mask", "position_ids", *names],
                      output_names=["logits", *(n.replace("past_key_values", "present") for n in names)],
                      dynamic_shapes={"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: Dim("total")},
                                      "position_ids": {0: b, 1: s}, "past": [{0: b, 2: Dim("past")}] * len(names)},
                      verbose=False, **kw)
    return path


def build_genai(folder: Path, out: Path, precision: str, cache: Path, **extra: str) -> Path:
    options = [f"{k}={v}" for k, v in extra.items()]
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out), "-p", precision,
           "-e", "cpu", "-c", str(cache), *(["--extra_options", *options] if options else [])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out / "model.onnx"


def exact(path: Path) -> Path:
    """A copy of the model beside it whose MatMulNBits run at accuracy_level 0 (f32 activations)."""
    model = onnx.load(str(path), load_external_data=False)
    for n in model.graph.node:
        for a in n.attribute:
            if n.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = 0
    out = path.with_name(path.stem + ".exact.onnx")
    onnx.save(model, str(out))
    return out


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def ort_steps(path: Path, tokens: list[int], prompt: int, head_dim: int) -> list[np.ndarray]:
    """onnxruntime's last-token logits after ``tokens[:prompt]`` and after each further token (a graph
    with past inputs is fed its own presents; one without reruns the whole sequence)."""
    s = _session(path)
    names = {i.name: i for i in s.get_inputs()}
    past = {n: i for n, i in names.items() if n.startswith("past_key_values")}
    kv = {n: np.zeros((1, i.shape[1], 0, head_dim), np.float32) for n, i in past.items()}
    out, done = [], 0
    for n in [prompt] + [1] * (len(tokens) - prompt):
        start = done if past else 0
        feeds = {"input_ids": np.array([tokens[start:done + n]], np.int64),
                 "attention_mask": np.ones((1, done + n), np.int64), **kv}
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(start, done + n)[None]
        res = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
        out.append(res["logits"][0, -1])
        kv = {k: res[k.replace("past_key_values", "present")] for k in kv}
        done += n
    return out


def ort_greedy(path: Path, prompt: list[int], n: int, head_dim: int, eos: tuple[int, ...]) -> list[int]:
    """onnxruntime's greedy continuation (recomputing the whole sequence each step)."""
    seq = list(prompt)
    for _ in range(n):
        nxt = int(ort_steps(path, seq, len(seq), head_dim)[0].argmax())
        seq.append(nxt)
        if nxt in eos:
            break
    return seq[len(prompt):]


def torch_steps(folder: Path, tokens: list[int], prompt: int) -> list[np.ndarray]:
    """Eager transformers (fp32): last-token logits after ``tokens[:prompt]`` and after each further token."""
    model = hf_model(folder)
    with torch.no_grad():
        return [model(input_ids=torch.tensor([tokens[:n]])).logits[0, -1].numpy()
                for n in range(prompt, len(tokens) + 1)]


def torch_greedy(folder: Path, prompt: list[int], n: int, eos: tuple[int, ...]) -> list[int]:
    """Eager transformers' greedy continuation (fp32)."""
    model, seq = hf_model(folder), list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
            if seq[-1] in eos:
                break
    return seq[len(prompt):]


def plan_steps(artifact: Path, tokens: list[int], prompt: int, bucket: int = 16) -> list[np.ndarray]:
    """grokc's CPU plan: prefill logits of ``tokens[:prompt]``, then one decode step per further token."""
    r = Runner(artifact, device="cpu")
    slot = r.engine.add(tokens[:prompt], SamplingParams(max_new_tokens=len(tokens)), bucket=bucket)
    out = [r.executor.read(r.plan.graphs[f"prefill_{bucket}"].logits)[0].copy()]
    for t in tokens[prompt:]:
        r.executor.write(IO.TOKENS.value, np.int32(t), (slot,))
        r.engine.decode(1)
        out.append(r.executor.read(r.plan.graphs[r.engine.decode_graph()].logits)[slot].copy())
    r.engine.release(slot)
    return out


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference, relative to the RMS of the reference logits."""
    return float(np.abs(got - want).max() / np.sqrt((want.astype(np.float64) ** 2).mean()))


def build(loaded, out: Path, quant: str = "fp16", **options) -> Path:
    """``build_loaded`` for sm90 with small shapes (every tiny model here has the same shapes, so the
    kernel cache compiles their kernels once)."""
    from grokc.compiler.build import BuildOptions, build_loaded

    build_loaded(loaded, out, BuildOptions(archs=("sm90",), quant=quant, batch=1, buckets=(16,), max_seq=64, **options))
    return out


def ort_quantize(path: Path, out: Path, bits: int, block_size: int, symmetric: bool) -> Path:
    """``path``'s MatMuls as MatMulNBits, by onnxruntime's own quantizer (as the model builder does)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(str(path)), bits=bits, block_size=block_size, is_symmetric=symmetric,
                             accuracy_level=0)
    q.process()
    onnx.save(q.model.model, str(out), save_as_external_data=True, location=out.name + ".data")
    return out


def ort_dequantized(path: Path) -> dict[str, np.ndarray]:
    """Each MatMulNBits node's weight ``[N, K]`` as onnxruntime computes with it: the node run alone at
    accuracy_level 0 on the identity matrix. Keyed by node name."""
    import onnxruntime as ort
    from onnx import helper

    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        k, nn = a["K"], a["N"]
        node = helper.make_node("MatMulNBits", ["A", *n.input[1:]], ["Y"], domain="com.microsoft",
                                **{**a, "accuracy_level": 0})
        g = helper.make_graph([node], "w", [helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [k, k])],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [k, nn])],
                              initializer=[inits[i] for i in n.input[1:] if i])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        out[n.name] = s.run(None, {"A": np.eye(k, dtype=np.float32)})[0].T
    return out
