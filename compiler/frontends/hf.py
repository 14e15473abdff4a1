"""Hugging Face frontend: a folder with config.json, *.safetensors and tokenizer.json -> ``LoadedModel``.

Accepted: a ``model_type`` that one of ``compiler/models``' architectures reads, whose
``architectures`` classes it accepts; the keys every Llama-like config has are read here, the
family's own by its ``hf_config`` hook (whose fields take precedence), which refuses what its graph
lacks. Refused with one ``UnsupportedModel`` line: other architectures, partial rotary embeddings,
rope scaling other than default/linear/llama3/yarn/longrope, missing or unexpected tensors, a
folder without safetensors or tokenizer.json.

Weights: every tensor of the safetensors files (those listed in ``model.safetensors.index.json``
when it exists, else every ``*.safetensors`` in the folder), converted to float32 numpy and
renamed to the canonical names through the architecture's Hugging Face name table; a fused tensor
(``Architecture.splits``) is split into its parts' rows, and norm weights get the architecture's
``hf_norm_shift`` added (Gemma's ``1 + w``, as GGUF stores them). A tied ``lm_head.weight`` found
in the files is dropped, as the GGUF frontend never has one.

``tokenizer_json`` is the text of ``tokenizer.json``; ``chat_template`` comes from
``chat_template.jinja`` if present, else from ``tokenizer_config.json``'s ``chat_template``.
End-of-sequence ids are config.json's ``eos_token_id`` followed by any further ones in
``generation_config.json``. ``source_sha256`` is defined by ``folder_sha256``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from grokc.compiler import models
from grokc.compiler.frontends import LoadedModel, check_weight_shapes, file_sha256
from grokc.compiler.frontends.config_checks import check_hf_config, check_hf_index
from grokc.compiler.models.hf_keys import rope_from_hf, rope_params
from grokc.core.config import ModelConfig, RopeConfig
from grokc.core.errors import UnsupportedModel
from grokc.core.tensors import parse

# Non-persistent buffers some older checkpoints still carry.
_ROTARY_BUFFER = re.compile(r"(model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq")
# Files whose bytes, besides the safetensors, decide what the loaded model is.
HASHED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def load_hf(folder: Path, progress: Callable[[str], None] | None = None) -> LoadedModel:
    """Load a Llama-family Hugging Face folder: fp32 weights, config, tokenizer.json text."""
    say = progress or (lambda _msg: None)
    folder = Path(folder)
    raw = _read_json(folder / "config.json")
    config = config_from_hf(raw, folder, _read_json(folder / "generation_config.json", missing_ok=True))
    if not models.get(config.architecture).hf_weights:
        raise UnsupportedModel(f"folder '{folder}' is a {config.architecture} model, whose checkpoints grokc does not "
                               "read; build its config with --synthetic-weights")
    if not (folder / "tokenizer.json").is_file():
        raise UnsupportedModel(
            f"folder '{folder}' has no tokenizer.json; save the fast tokenizer there (tokenizer.save_pretrained)"
        )
    files = safetensors_files(folder)
    say(f"reading {len(files)} safetensors file(s) from {folder.name}")
    weights = _read_weights(folder, files, config)
    check_weight_shapes(weights, config, f"'{folder}'")
    say(f"hashing {folder.name}")
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer_json=(folder / "tokenizer.json").read_text(encoding="utf-8"),
        chat_template=_chat_template(folder),
        source_sha256=folder_sha256(folder, files),
        source_format="hf",
    )


def safetensors_files(folder: Path) -> list[str]:
    """The weight files: those of ``model.safetensors.index.json``, else every ``*.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        raw = _read_json(index)
        check_hf_index(raw, f"'{index}'")
        files = sorted(set(raw.get("weight_map", {}).values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise UnsupportedModel(f"folder '{folder}' has no *.safetensors weights; save the model with safe_serialization=True")
    for name in files:
        if not (folder / name).is_file():
            raise UnsupportedModel(f"safetensors shard '{name}' listed in '{index}' is missing; re-download the model")
    return files


def folder_sha256(folder: Path, files: list[str] | None = None) -> str:
    """The source hash of a Hugging Face folder.

    SHA-256 over the lines ``"<sha256 of file>  <relative name>\\n"`` (``sha256sum``'s format),
    sorted by name, for the safetensors weight files and those of ``HASHED_FILES`` that exist
    (config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja,
    generation_config.json): everything the loaded model is made from. In a shell, with
    ``LC_ALL=C``: ``sha256sum <those files> | sort -k2 | sha256sum``.
    """
    names = set(files if files is not None else safetensors_files(folder))
    names |= {n for n in HASHED_FILES if (folder / n).is_file()}
    listing = "".join(f"{file_sha256(folder / n)}  {n}\n" for n in sorted(names))
    return hashlib.sha256(listing.encode("utf-8")).hexdigest()


def config_from_hf(raw: dict[str, Any], folder: Path, generation: dict[str, Any] | None = None) -> ModelConfig:
    """``ModelConfig`` from a Hugging Face ``config.json`` dict, refusing what grokc cannot compile."""
    where = f"config.json in '{folder}'"
    check_hf_config(raw, generation, where)
    arch = models.for_hf(raw.get("model_type"), where)
    classes = raw.get("architectures") or []
    if any(c not in arch.hf_classes for c in classes):
        raise UnsupportedModel(f"{where} declares architectures {classes}; the {arch.name} family reads "
                               f"{', '.join(arch.hf_classes)}")
    quant = (raw.get("quantization_config") or {}).get("quant_method")
    if quant not in (None, "gguf"):  # "gguf": saved from a GGUF load by transformers, plain float weights
        raise UnsupportedModel(
            f"{where} is a pre-quantized checkpoint (quant_method {quant!r}); load the unquantized fp16/bf16/fp32 model instead"
        )
    eos = _ids(raw.get("eos_token_id")) + _ids((generation or {}).get("eos_token_id"))
    bos = raw.get("bos_token_id")
    try:
        extra = arch.hf_config(raw, where)
        hidden = _required(raw, "hidden_size")
        heads = _required(raw, "num_attention_heads")
        fields = dict(
            vocab_size=_required(raw, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_required(raw, "intermediate_size"),
            num_layers=_required(raw, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=1e-6 if raw.get("rms_norm_eps") is None else float(raw["rms_norm_eps"]),
            rope=extra["rope"] if "rope" in extra else _rope_from_hf(raw, where),
            max_position_embeddings=2048 if raw.get("max_position_embeddings") is None else int(raw["max_position_embeddings"]),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=tuple(dict.fromkeys(eos)),
            architecture=arch.name,
        )
        return ModelConfig(**{**fields, **extra})
    except KeyError as exc:
        raise UnsupportedModel(f"{where} lacks {exc.args[0]!r}, which every {arch.name} config has; re-export the model") from exc
    except ValueError as exc:  # ModelConfig's own consistency checks
        raise UnsupportedModel(f"{where} describes an inconsistent {arch.name} model: {exc}") from exc


def _required(raw: dict[str, Any], key: str) -> int:
    """An integer key every config has (``check_hf_config`` checked its type); KeyError when absent or null."""
    if raw.get(key) is None:
        raise KeyError(key)
    return int(raw[key])


def _rope_from_hf(raw: dict[str, Any], where: str) -> RopeConfig:
    params = rope_params(raw)
    if any(isinstance(v, dict) for v in params.values()):
        raise UnsupportedModel(f"{where} has per-layer-type rope parameters {sorted(params)}; only one rope for all layers is supported")
    return rope_from_hf(params, raw, where)


def _read_weights(folder: Path, files: list[str], config: ModelConfig) -> dict[str, np.ndarray]:
    arch = models.get(config.architecture)
    handles = [_open(folder / file) for file in files]
    count = sum(len(h.keys()) for h in handles)
    if config.num_layers > count:   # before anything lists the layers' weights
        raise UnsupportedModel(f"config.json in '{folder}' has num_hidden_layers {config.num_layers} but the "
                               f"safetensors files hold only {count} tensors; the config belongs to another model")
    canonical = arch.hf_to_canonical(config)
    fused = arch.split_sources(config, hf=True)
    stacked = arch.hf_stacked(config)                      # canonical -> one HF tensor per expert
    slice_of = {hf: c for c, names in stacked.items() for hf in names}
    slices: dict[str, np.ndarray] = {}
    found: dict[str, np.ndarray] = {}
    for file, handle in zip(files, handles):
        with handle as f:
            for name in f.keys():
                if name in canonical:
                    found[canonical[name]] = _to_fp32(f.get_tensor(name), arch.hf_norm_shift, canonical[name])
                elif name in fused:
                    parts = arch.split_rows(_to_fp32(f.get_tensor(name)), fused[name], config)
                    if parts is None:
                        raise UnsupportedModel(f"'{folder / file}' tensor {name!r} has shape {list(f.get_slice(name).get_shape())}, "
                                               f"not the rows of {', '.join(fused[name])} stacked; re-export the model")
                    found.update(parts)
                elif name in slice_of:
                    slices[name] = _to_fp32(f.get_tensor(name))
                elif (name == "lm_head.weight" and config.tie_word_embeddings) or _ROTARY_BUFFER.fullmatch(name):
                    continue
                else:
                    feature = " (a bias)" if name.endswith(".bias") else ""
                    raise UnsupportedModel(
                        f"'{folder / file}' holds tensor {name!r}{feature}, which a {arch.name} model does not have; "
                        "the checkpoint is not of the family its config.json names"
                    )
    expected = arch.weight_shapes(config)
    missing = ([hf for hf, c in canonical.items() if c not in found] + [hf for hf, c in fused.items() if c[0] not in found]
               + [hf for hf in slice_of if hf not in slices])
    if missing:
        raise UnsupportedModel(
            f"folder '{folder}' lacks weight {missing[0]!r} ({len(missing)} missing in all) that a "
            f"{config.num_layers}-layer {arch.name} model needs; check the safetensors files are complete"
        )
    for name, names in stacked.items():
        found[name] = _stack([slices[hf] for hf in names], names[0], folder)
    return {name: found[name] for name in expected}


def _open(path: Path):
    """A ``safe_open`` handle of ``path`` (its header read), or ``UnsupportedModel``."""
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # safetensors raises its own error types on bad headers
        raise UnsupportedModel(f"cannot read safetensors file '{path}' ({exc}); re-download it") from exc


def _stack(experts: list[np.ndarray], first: str, folder: Path) -> np.ndarray:
    """One expert-stacked weight ``[E, out, in]`` from its experts' tensors (read-only f32)."""
    if len({e.shape for e in experts}) != 1:
        raise UnsupportedModel(f"the experts of '{first}' in '{folder}' differ in shape "
                               f"({sorted({e.shape for e in experts})}); the checkpoint is corrupt, re-export it")
    out = np.stack(experts)
    out.flags.writeable = False
    return out


def _to_fp32(t: torch.Tensor, norm_shift: float = 0.0, canonical: str = "") -> np.ndarray:
    """``t`` as read-only float32; a norm weight (``canonical`` names its kind) plus ``norm_shift``."""
    t = t.to(torch.float32)
    if norm_shift and parse(canonical)[0].is_norm:
        t = t + norm_shift
    arr = t.contiguous().numpy()  # shares the tensor's memory, which it keeps alive
    arr.flags.writeable = False
    return arr


def _chat_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = _read_json(folder / "tokenizer_config.json", missing_ok=True).get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _read_json(path: Path, missing_ok: bool = False) -> dict[str, Any]:
    if missing_ok and not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModel(f"cannot read '{path}' as JSON ({str(exc).splitlines()[0]}); fix or re-download it") from exc
    if not isinstance(data, dict):
        raise UnsupportedModel(f"'{path}' holds a JSON {type(data).__name__}, not an object; fix or re-download it")
    return data


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]
