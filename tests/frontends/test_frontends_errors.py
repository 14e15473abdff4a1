"""Every refusal of the frontends is one UnsupportedModel line that names the offending value."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from frontends_tiny import tiny_hf_config

from grokc.compiler.frontends import load_model
from grokc.core.errors import GrokcError, UnsupportedModel


def refusal(path, *needles: str) -> str:
    """Load ``path``, expect UnsupportedModel, check it is one line holding every needle."""
    with pytest.raises(UnsupportedModel) as err:
        load_model(path)
    message = str(err.value)
    assert isinstance(err.value, GrokcError)
    assert "\n" not in message and message.strip() == message and message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message


# --- what the path is -------------------------------------------------------------------------


def test_missing_path(tmp_path):
    refusal(tmp_path / "nope.gguf", "nope.gguf", "does not exist", ".gguf file, a Hugging Face folder with config.json, an .onnx file or a torch.export .pt2 file")


def test_folder_without_config(tmp_path):
    refusal(tmp_path, "no config.json")


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("definitely not a model\n")
    refusal(path, "model.gguf", "not a GGUF file", "b'defi'")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    refusal(path, "not a GGUF file")


@pytest.mark.parametrize("size", [4, 1000, 1_000_000])
def test_truncated_gguf(tmp_path, smollm2_gguf, size):
    path = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as f:
        path.write_bytes(f.read(size))
    refusal(path, "cut.gguf", "truncated")


def test_gguf_cut_inside_the_last_tensor(tmp_path, tiny_gguf):
    full = tiny_gguf().read_bytes()
    path = tmp_path / "tail.gguf"
    path.write_bytes(full[:-100])
    refusal(path, "tail.gguf", "truncated")


# --- GGUF contents ----------------------------------------------------------------------------


def test_gguf_other_architecture(tiny_gguf):
    refusal(tiny_gguf(arch="mamba"), "'mamba'", "supported: llama")


def test_gguf_attention_bias(tiny_gguf):
    path = tiny_gguf(extra_tensors={"blk.0.attn_q.bias": np.zeros(64, np.float32)})
    refusal(path, "'blk.0.attn_q.bias'", "no biases")


def test_gguf_mlp_bias(tiny_gguf):
    path = tiny_gguf(extra_tensors={"blk.1.ffn_up.bias": np.zeros(128, np.float32)})
    refusal(path, "'blk.1.ffn_up.bias'", "no biases")


def test_gguf_unknown_tensor(tiny_gguf):
    path = tiny_gguf(extra_tensors={"blk.0.attn_q_norm.weight": np.ones(16, np.float32)})
    refusal(path, "'blk.0.attn_q_norm.weight'")


def test_gguf_missing_tensor(tiny_gguf):
    refusal(tiny_gguf(drop=("blk.1.ffn_down.weight",)), "'blk.1.ffn_down.weight'", "lacks tensor")


def test_gguf_metadata_disagrees_with_tensors(tiny_gguf):
    refusal(tiny_gguf(metadata={"llama.feed_forward_length": 256}), "'blk.0.ffn_gate.weight'", "[128, 64]", "[256, 64]")


def test_gguf_missing_metadata(tiny_gguf):
    refusal(tiny_gguf(metadata={"llama.block_count": None}), "'llama.block_count'")


def test_gguf_moe_without_its_expert_keys(tiny_gguf):
    # expert_count makes a llama GGUF a Mixtral (tests/frontends/test_frontends_moe.py), which needs the rest
    refusal(tiny_gguf(metadata={"llama.expert_count": 8}), "'llama.expert_used_count'", "mixtral")


def test_gguf_unsupported_rope_scaling(tiny_gguf):
    refusal(tiny_gguf(metadata={"llama.rope.scaling.type": "longrope"}), "'longrope'")


def test_gguf_unknown_tokenizer_model(tiny_gguf):
    refusal(tiny_gguf(metadata={"tokenizer.ggml.model": "t5"}), "tokenizer.ggml.model", "'t5'")


def test_gguf_heads_not_divisible(tiny_gguf):
    refusal(tiny_gguf(metadata={"llama.attention.head_count_kv": 3}), "num_kv_heads (3)")


# --- Hugging Face folders ---------------------------------------------------------------------


def test_hf_tiny_folder_loads(tiny_hf):
    loaded = load_model(tiny_hf())
    assert loaded.source_format == "hf" and len(loaded.weights) == 2 * 9 + 3


@pytest.mark.parametrize(
    "overrides,needles",
    [
        ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}, ("'mamba'", "supported: llama")),
        ({"architectures": ["LlamaForSequenceClassification"]}, ("LlamaForSequenceClassification",)),
        ({"attention_bias": True}, ("attention_bias",)),
        ({"mlp_bias": True}, ("mlp_bias",)),
        ({"hidden_act": "gelu"}, ("'gelu'",)),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, ("'dynamic'",)),
        ({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}, ("'deepseek_v3'", "qwen3_moe")),
        ({"num_hidden_layers": None}, ("'num_hidden_layers'",)),
    ],
)
def test_hf_config_refusals(tiny_hf, overrides, needles):
    refusal(tiny_hf(config=tiny_hf_config(**overrides)), *needles)


def test_hf_mistral_window_is_every_layer_or_none(tiny_hf):
    cfg = tiny_hf_config(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None)
    loaded = load_model(tiny_hf(config=cfg)).config
    assert (loaded.architecture, loaded.local_layers, loaded.sliding_window) == ("mistral", (), 0)
    cfg = tiny_hf_config(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=128)
    loaded = load_model(tiny_hf(config=cfg)).config
    assert (loaded.local_layers, loaded.sliding_window) == ((0, 1), 128)


def test_hf_missing_tensor(tiny_hf):
    refusal(tiny_hf(drop=("model.layers.1.mlp.up_proj.weight",)), "'model.layers.1.mlp.up_proj.weight'")


def test_hf_bias_tensor(tiny_hf):
    extra = {"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}
    refusal(tiny_hf(extra_tensors=extra), "'model.layers.0.self_attn.q_proj.bias'", "(a bias)")


def test_hf_without_tokenizer(tiny_hf):
    refusal(tiny_hf(tokenizer=False), "no tokenizer.json")


def test_hf_without_safetensors(tiny_hf):
    folder = tiny_hf()
    (folder / "model.safetensors").unlink()
    refusal(folder, "no *.safetensors")


def test_hf_bad_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    refusal(tmp_path, "config.json")


def test_hf_corrupt_safetensors(tiny_hf):
    folder = tiny_hf()
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    refusal(folder, "model.safetensors")


def test_hf_quantized_checkpoint(tiny_hf):
    cfg = tiny_hf_config(quantization_config={"quant_method": "gptq", "bits": 4})
    refusal(tiny_hf(config=cfg), "'gptq'")


def test_hf_shard_listed_but_missing(tiny_hf):
    folder = tiny_hf()
    index = {"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    refusal(folder, "model-00002-of-00002.safetensors")


def test_a_layer_count_past_the_tensors_is_refused_before_the_layers_are_listed(tmp_path):
    """A GGUF whose block_count has a byte flipped (found by the fuzz test: listing 6.5 million
    layers' weight names took 14 GB) and a config.json claiming a million layers: one line each, at once."""
    from frontends_tiny import write_tiny_gguf, write_tiny_hf

    path = write_tiny_gguf(tmp_path / "m.gguf")
    raw = bytearray(path.read_bytes())
    at = raw.index(b"llama.block_count") + len("llama.block_count") + 4   # the u32 after its type
    assert int.from_bytes(raw[at:at + 4], "little") == 2
    raw[at + 2] = 100
    path.write_bytes(bytes(raw))
    with pytest.raises(UnsupportedModel, match=r"has llama.block_count 6553602 but holds only \d+ tensors"):
        load_model(path)
    folder = write_tiny_hf(tmp_path / "hf", config={**tiny_hf_config(), "num_hidden_layers": 1_000_000})
    with pytest.raises(UnsupportedModel, match=r"has num_hidden_layers 1000000 but the safetensors files hold only"):
        load_model(folder)
