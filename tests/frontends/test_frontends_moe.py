"""Mixture-of-experts checkpoints through both frontends: a tiny Mixtral as transformers saves it
(one tensor per expert) and as llama.cpp stores it (``llama`` with ``expert_count``, the experts
stacked in ``ffn_gate_exps`` etc.) load to the same canonical weights and config, bit for bit; a
tiny Qwen2-MoE as transformers saves it (experts and the shared expert with its gate) loads bit for
bit, and the Qwen2-MoE settings its graph lacks are refused in one line. A Mixtral with a sliding
window loads as a windowed model whose torch model equals transformers' (logits within 1e-3 of their
RMS, fp32 both, on more tokens than the window). Tiny Qwen2-MoE and Qwen3-MoE models written as
llama.cpp's converter writes them (``qwen2moe`` / ``qwen3moe``) load bit for bit as their folders do,
and the GGUF-loaded models of all three families match transformers. A Grok-1 folder (config.json
only is read) and Grok-2's settings are refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from calib_tiny import byte_tokenizer_json
from frontends_tiny import add_kv, tiny_tokenizer_metadata
from tiny_moe import hf_model, moe_config, moe_weights

from grokc.compiler.frontends import load_model
from grokc.compiler.quality import reference_model
from grokc.core.errors import UnsupportedModel

pytest.importorskip("transformers")

CFG = moe_config("mixtral", vocab_size=260, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def weights():
    return moe_weights(CFG, seed=5)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, weights):
    folder = tmp_path_factory.mktemp("mixtral-hf")
    hf_model(CFG, weights, folder)
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    return folder


GGUF_ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's q/k row order (HF rotate-half -> GGML interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_moe_gguf(path, cfg, weights: dict[str, np.ndarray]) -> None:
    """``weights`` (canonical names are GGUF's) as llama.cpp's converter writes the family: Mixtral as
    ``llama`` with ``expert_count`` and permuted q/k rows (``LlamaModel``); Qwen2-MoE / Qwen3-MoE with
    ``expert_feed_forward_length`` (and ``expert_shared_feed_forward_length``) and Qwen3's
    ``key_length`` (``Qwen2MoeModel``, ``TextModel.set_gguf_parameters``), q/k rows as they are."""
    arch, moe = GGUF_ARCH[cfg.architecture], cfg.moe
    keys = {"block_count": cfg.num_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": cfg.num_heads, "attention.head_count_kv": cfg.num_kv_heads,
            "rope.freq_base": cfg.rope.theta, "attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
            "expert_count": moe.n_experts, "expert_used_count": moe.top_k}
    if arch == "llama":
        keys |= {"rope.dimension_count": cfg.head_dim, "vocab_size": cfg.vocab_size}
    else:
        keys |= {"expert_feed_forward_length": moe.expert_size}
    if moe.shared_size:
        keys |= {"expert_shared_feed_forward_length": moe.shared_size}
    if cfg.architecture == "qwen3_moe":
        keys |= {"attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim}
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in {**{f"{arch}.{k}": v for k, v in keys.items()}, **tiny_tokenizer_metadata()}.items():
        add_kv(writer, key, float(value) if isinstance(value, float) else value)
    heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads} if arch == "llama" else {}
    for name, w in weights.items():
        kind = name.split(".")[-2]
        writer.add_tensor(name, _permute(w, heads[kind]) if kind in heads else w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_hf_folder_loads_stacked_experts(hf_folder, weights):
    loaded = load_model(hf_folder)
    assert loaded.config.architecture == "mixtral" and loaded.config.moe == CFG.moe
    assert sorted(loaded.weights) == sorted(weights)
    for name, w in weights.items():
        np.testing.assert_array_equal(loaded.weights[name], w, err_msg=name)


@pytest.fixture(scope="module", params=list(GGUF_ARCH))
def family_files(request, tmp_path_factory):
    """(config, weights, transformers model, HF folder, GGUF) of a tiny model of one family."""
    cfg = moe_config(request.param, vocab_size=260, tie_word_embeddings=False)
    weights = moe_weights(cfg, seed=8)
    root = tmp_path_factory.mktemp(request.param)
    (root / "hf").mkdir()
    hf = hf_model(cfg, weights, root / "hf")
    (root / "hf" / "tokenizer.json").write_text(byte_tokenizer_json())
    write_moe_gguf(root / "model.gguf", cfg, weights)
    return cfg, weights, hf, root / "hf", root / "model.gguf"


def _comparable(cfg):
    """``cfg`` without what GGUF and HF files need not share: the special ids (the GGUF's vocabulary is
    frontends_tiny's) and the norm epsilon's digits beyond float32 (GGUF stores it as f32)."""
    return replace(cfg, bos_token_id=None, eos_token_ids=(), rms_norm_eps=float(np.float32(cfg.rms_norm_eps)))


def test_gguf_loads_the_same_model_as_the_hf_folder(family_files):
    cfg, weights, _, folder, path = family_files
    from_gguf, from_hf = load_model(path), load_model(folder)
    assert _comparable(from_gguf.config) == _comparable(from_hf.config)
    assert from_gguf.config.moe == cfg.moe and sorted(from_gguf.weights) == sorted(weights)
    for name, w in from_hf.weights.items():
        assert from_gguf.weights[name].tobytes() == w.tobytes(), name


def test_gguf_model_matches_transformers(family_files):
    _, _, hf, _, path = family_files
    loaded = load_model(path)
    tokens = torch.from_numpy(np.random.default_rng(4).integers(0, 260, 40))
    with torch.no_grad():
        want = hf(tokens[None]).logits[0].numpy()
        got = reference_model(loaded.config, loaded.weights)(tokens.int(), torch.arange(40, dtype=torch.int32)).numpy()
    assert np.abs(got - want).max() / np.sqrt((want ** 2).mean()) < 1e-3   # fp32 both: summation order only


def test_missing_expert_is_one_line(tmp_path, hf_folder):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "broken"
    folder.mkdir()
    for f in ("config.json", "tokenizer.json"):
        (folder / f).write_text((hf_folder / f).read_text())
    tensors = load_file(str(hf_folder / "model.safetensors"))
    gone = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
    save_file({k: v for k, v in tensors.items() if k != gone}, str(folder / "model.safetensors"))
    with pytest.raises(UnsupportedModel, match=f"lacks weight '{gone}'"):
        load_model(folder)


def test_inconsistent_expert_count_is_one_line(tmp_path, hf_folder):
    folder = tmp_path / "bad-config"
    folder.mkdir()
    raw = json.loads((hf_folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "num_experts_per_tok": 9}))
    (folder / "tokenizer.json").write_text((hf_folder / "tokenizer.json").read_text())
    (folder / "model.safetensors").symlink_to(hf_folder / "model.safetensors")
    with pytest.raises(UnsupportedModel, match="inconsistent mixture of experts.*top_k 9"):
        load_model(folder)


QWEN = moe_config("qwen2_moe", vocab_size=260, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2-moe-hf")
    weights = moe_weights(QWEN, seed=6)
    hf_model(QWEN, weights, folder)
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    return folder, weights


def test_qwen2_moe_folder_loads_experts_and_the_gated_shared_expert(qwen_folder):
    folder, weights = qwen_folder
    loaded = load_model(folder)
    assert loaded.config.architecture == "qwen2_moe" and loaded.config.moe == QWEN.moe
    assert sorted(loaded.weights) == sorted(weights)
    assert loaded.weights["blk.0.ffn_gate_inp_shexp.weight"].shape == (1, QWEN.hidden_size)
    for name, w in weights.items():
        np.testing.assert_array_equal(loaded.weights[name], w, err_msg=name)


@pytest.mark.parametrize("change, message", [
    ({"qkv_bias": False}, r"holds tensor 'model\.layers\.\d\.self_attn\.[qkv]_proj\.bias' \(a bias\)"),   # biases there
    ({"decoder_sparse_step": 2}, "mixes dense and sparse layers"),
    ({"mlp_only_layers": [1]}, "mixes dense and sparse layers"),
    ({"shared_expert_intermediate_size": 0}, "inconsistent mixture of experts.*shared gate needs a shared expert"),
])
def test_qwen2_moe_settings_the_graph_lacks_are_one_line(tmp_path, qwen_folder, change, message):
    folder = qwen_folder[0]
    raw = json.loads((folder / "config.json").read_text())
    raw = {k: v for k, v in {**raw, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(UnsupportedModel, match=message):
        load_model(tmp_path)


def test_mixtral_sliding_window_matches_transformers(tmp_path):
    cfg = moe_config("mixtral", vocab_size=260, tie_word_embeddings=False, sliding_window=8, local_layers=(0, 1))
    weights = moe_weights(cfg, seed=7)
    hf = hf_model(cfg, weights, tmp_path)
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    loaded = load_model(tmp_path)
    assert (loaded.config.sliding_window, loaded.config.local_layers) == (8, (0, 1))
    tokens = torch.from_numpy(np.random.default_rng(3).integers(0, 260, 40))
    with torch.no_grad():
        want = hf(tokens[None]).logits[0].numpy()
        got = reference_model(loaded.config, loaded.weights)(tokens.int(), torch.arange(40, dtype=torch.int32)).numpy()
    assert np.abs(got - want).max() / np.sqrt((want ** 2).mean()) < 1e-3


GROK1 = json.loads((Path(__file__).parents[2] / "bench" / "grok-1-shape.json").read_text())


@pytest.mark.parametrize("change, message", [
    ({}, "grok1 model, whose checkpoints grokc does not read; build its config with --synthetic-weights"),
    ({"residual_moe": True}, r"residual_moe=True \(Grok-2\)"),
    ({"attn_logit_softcapping": 30.0, "final_logit_softcapping": 50.0}, r"final_logit_softcapping=50.0 \(Grok-2\)"),
])
def test_grok1_folders_and_grok2_settings_are_one_line(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**GROK1, **change}))
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    from safetensors.numpy import save_file
    save_file({"model.embed_tokens.weight": np.zeros((2, 2), np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(UnsupportedModel, match=message):
        load_model(tmp_path)
