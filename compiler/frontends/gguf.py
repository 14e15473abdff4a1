"""GGUF frontend: a llama.cpp GGUF file -> ``LoadedModel`` with fp32 weights in Hugging Face layout.

What it does, in order:

1. reads the header with the ``gguf`` package; any failure of that reader on a damaged file becomes
   one ``UnsupportedModel`` line (the reader raises ``ValueError``, ``IndexError``, ... on bad bytes);
2. finds the architecture of ``general.architecture`` (``compiler/models``) and refuses tensors
   it does not have (biases, experts, ...); the tensors that carry config (``config_tensors``:
   rope factor tables) are read by the architecture's ``gguf_config`` hook;
3. builds ``ModelConfig`` from the ``<arch>.*`` keys: head_dim is ``attention.key_length`` or
   ``embedding_length / head_count``; rope scaling from ``rope.scaling.*`` (linear, yarn), or --
   for Llama 3.x files, where llama.cpp stores the llama3 scaling only as the per-frequency
   ``rope_freqs.weight`` table -- by recovering the llama3 parameters from that table and checking
   they reproduce it; ``tie_word_embeddings`` is "no ``output.weight`` tensor"; eos ids are
   ``eos_token_id`` followed by ``eot_token_id`` / ``eom_token_id`` where present;
4. rebuilds ``tokenizer.json`` from the tokenizer metadata (``gguf_tokenizer``; SentencePiece
   vocabularies the way the architecture's are read);
5. dequantizes every tensor to float32 (``gguf.quants.dequantize``), keeps its name (GGUF names
   are grokc's canonical ones), splits the fused ones (``Architecture.splits``: Phi-3's
   ``attn_qkv``, its ``ffn_up`` holding gate and up) into their parts, and undoes llama.cpp's q/k
   row permutation where the architecture's converter applies one (see ``unpermute_qk``);
6. ``source_sha256`` is the SHA-256 of the file's bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from grokc.compiler import models
from grokc.compiler.frontends import LoadedModel, file_sha256, frozen_fp32
from grokc.compiler.frontends.config_checks import check_gguf_metadata
from grokc.compiler.frontends.gguf_tokenizer import build_tokenizer_json
from grokc.compiler.models.architecture import Architecture
from grokc.core.config import ModelConfig, RopeConfig, RopeType
from grokc.core.errors import UnsupportedModel
from grokc.core.tensors import Tensor, parse
from grokc.core.tensors import name as tensor_name

ROPE_FREQS = tensor_name(Tensor.ROPE_FREQS)

# llama3 scaling leaves only the ratios original_context / {low,high}_freq_factor in rope_freqs;
# the context itself is taken from the metadata, else Llama 3's own value.
_LLAMA3_DEFAULT_ORIGINAL_CONTEXT = 8192


def load_gguf(path: Path, progress: Callable[[str], None] | None = None) -> LoadedModel:
    """Load a GGUF file: fp32 weights under canonical names in Hugging Face layout, config, tokenizer.

    ``source_sha256`` is the SHA-256 of the file's bytes (``sha256sum FILE``).
    """
    say = progress or (lambda _msg: None)
    path = Path(path)
    say(f"reading GGUF header of {path.name}")
    reader = _open_reader(path)
    metadata = _metadata(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    gguf_arch = metadata.get("general.architecture")
    arch = models.for_gguf(gguf_arch, f"GGUF '{path.name}'", moe=bool(metadata.get(f"{gguf_arch}.expert_count")))
    config = _config_from_metadata(arch, metadata, tensors, path)
    if config.num_layers > len(tensors):   # before anything lists the layers' weights
        raise UnsupportedModel(f"GGUF '{path.name}' has {gguf_arch}.block_count {config.num_layers} but holds only "
                               f"{len(tensors)} tensors; the metadata is corrupt, re-export the file")
    shapes = arch.weight_shapes(config)
    fused = arch.split_sources(config, hf=False)
    in_parts = {p for parts in fused.values() for p in parts}
    stored = {n: s for n, s in shapes.items() if n not in in_parts}   # file name -> shape
    for n, parts in fused.items():
        stored[n] = (sum(shapes[p][0] for p in parts), *shapes[parts[0]][1:])
    _check_tensor_names(arch, tensors, stored, path)
    missing = [n for n in stored if n not in tensors]
    if missing:
        raise UnsupportedModel(
            f"GGUF '{path.name}' lacks tensor {missing[0]!r} ({len(missing)} missing in all) that a "
            f"{config.num_layers}-layer {arch.name} model needs; the file is incomplete, re-export it"
        )
    for name, shape in stored.items():
        got = tuple(int(n) for n in reversed(tensors[name].shape))
        if got != shape:
            raise UnsupportedModel(
                f"GGUF '{path.name}' tensor {name!r} has shape {list(got)} but its metadata implies "
                f"{list(shape)}; the file's metadata and tensors disagree, so re-export it"
            )

    # Before the slow part, so a file with an unsupported tokenizer is refused at once.
    say("rebuilding the tokenizer from GGUF metadata")
    tokenizer_json = build_tokenizer_json(metadata, arch.gguf_sentencepiece)

    say(f"dequantizing {len(stored)} tensors to float32")
    heads = {Tensor.ATTN_Q: config.num_heads, Tensor.ATTN_K: config.num_kv_heads} if arch.gguf_permutes_qk else {}
    found: dict[str, np.ndarray] = {}
    for name in stored:
        w = _dequantize(tensors[name], path)
        if name in fused:
            found.update(arch.split_rows(w, fused[name], config))
            continue
        kind = parse(name)[0]
        found[name] = unpermute_qk(w, heads[kind]) if kind in heads else w
    weights = {name: frozen_fp32(found[name]) for name in shapes}
    say(f"hashing {path.name}")
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer_json=tokenizer_json,
        chat_template=metadata.get("tokenizer.chat_template"),
        source_sha256=file_sha256(path),
        source_format="gguf",
    )


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation, giving the Hugging Face row order.

    ``convert_hf_to_gguf.py`` reorders the rows of each head of ``q_proj`` / ``k_proj`` from HF's
    rotate-half layout (first half of the head's rows, then the second) to GGML's interleaved
    pairs: ``w.reshape(n_head, 2, d, in).swapaxes(1, 2)`` with ``d = head_dim / 2``. This is its
    inverse, exactly as transformers' ``LlamaTensorProcessor`` does it. ``n_head`` is the number
    of query heads for q and of key/value heads for k.
    """
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """A GGUF file's key/value metadata as Python values (str, int, float, bool, lists)."""
    path = Path(path)
    return _metadata(_open_reader(path), path)


def _metadata(reader: gguf.GGUFReader, path: Path) -> dict[str, Any]:
    return {key: _field_value(field, path) for key, field in reader.fields.items()}


def _open_reader(path: Path) -> gguf.GGUFReader:
    """Parse the GGUF header, turning the reader's many failure modes into one line."""
    try:
        reader = gguf.GGUFReader(path)
    except OSError as exc:
        raise UnsupportedModel(f"cannot read GGUF file '{path}' ({exc.strerror or exc})") from exc
    except Exception as exc:  # the gguf reader raises ValueError, IndexError, KeyError, ... on bad bytes
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnsupportedModel(
            f"GGUF file '{path}' is truncated or corrupt (the reader failed: {detail}); re-download or re-export it"
        ) from exc
    size = path.stat().st_size
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise UnsupportedModel(
            f"GGUF file '{path}' is truncated: its tensors need {end} bytes but the file has {size}; re-download it"
        )
    return reader


def _field_value(field: Any, path: Path) -> Any:
    """A GGUF metadata value as Python: str, int, float, bool, or a list of those."""
    types = field.types
    try:
        if types[0] == gguf.GGUFValueType.ARRAY:
            if not field.data:
                return []
            if types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            if types[-1] == gguf.GGUFValueType.ARRAY:
                return None  # nested arrays: nothing grokc reads
            return np.concatenate([field.parts[i] for i in field.data]).tolist()
        if types[0] == gguf.GGUFValueType.STRING:
            return bytes(field.parts[field.data[0]]).decode("utf-8")
        return field.parts[field.data[0]][0].item()
    except UnicodeDecodeError as exc:
        raise UnsupportedModel(
            f"GGUF file '{path}' has metadata {field.name!r} that is not valid UTF-8; the file is corrupt, re-export it"
        ) from exc


def _check_tensor_names(arch: Architecture, tensors: dict[str, Any], expected: dict[str, tuple], path: Path) -> None:
    """Refuse tensors the architecture does not have, naming the feature where one is recognisable."""
    config_tensors = {tensor_name(kind) for kind in arch.config_tensors}
    for name in tensors:
        if name in expected or name in config_tensors:
            continue
        if name.endswith(".bias"):
            feature = "biases"
        elif "exps" in name or "ffn_gate_inp" in name:
            feature = "mixture-of-experts layers"
        else:
            feature = "this tensor"
        raise UnsupportedModel(
            f"GGUF '{path.name}' has tensor {name!r}, but grokc's {arch.name} graph has no {feature}; "
            "the file is not of the family its general.architecture names"
        )


def _config_from_metadata(arch: Architecture, metadata: dict[str, Any], tensors: dict[str, Any],
                          path: Path) -> ModelConfig:
    prefix = arch.gguf_arch
    check_gguf_metadata(metadata, prefix, f"GGUF '{path.name}'")

    def key(name: str, default: Any = ...) -> Any:
        full = f"{prefix}.{name}"
        if full in metadata:
            return metadata[full]
        if default is ...:
            raise UnsupportedModel(
                f"GGUF '{path.name}' lacks metadata key {full!r} that a {arch.name} model needs; the file is "
                "incomplete, re-export it"
            )
        return default

    hidden = key("embedding_length")
    num_heads = key("attention.head_count")
    num_kv_heads = key("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, list):  # per-layer counts: fine only when all equal
        if len(set(num_kv_heads)) != 1:
            raise UnsupportedModel(
                f"GGUF '{path.name}' has per-layer {prefix}.attention.head_count_kv {sorted(set(num_kv_heads))}; "
                "only models with one KV head count for all layers are supported"
            )
        num_kv_heads = num_kv_heads[0]
    head_dim = key("attention.key_length", hidden // num_heads)
    value_dim = key("attention.value_length", head_dim)
    rope_dim = key("rope.dimension_count", head_dim)
    if value_dim != head_dim or rope_dim != head_dim:
        raise UnsupportedModel(
            f"GGUF '{path.name}' has head_dim {head_dim} but value length {value_dim} and rotary dimension "
            f"{rope_dim}; only models with full-width rotary embeddings and equal key/value head sizes are supported"
        )
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab_size = key("vocab_size", len(tokens) if tokens is not None else None)
    if vocab_size is None:
        vocab_size = int(tensors["token_embd.weight"].shape[-1]) if "token_embd.weight" in tensors else 0
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    eos_ids = [metadata.get(f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id", "eom_token_id")]

    def tensor(kind: Tensor) -> np.ndarray | None:
        found = tensors.get(tensor_name(kind))
        return None if found is None else _dequantize(found, path).astype(np.float32)

    try:
        fields = dict(
            vocab_size=int(vocab_size),
            hidden_size=int(hidden),
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=int(num_heads),
            num_kv_heads=int(num_kv_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            rope=_rope_from_metadata(key, tensors, int(head_dim), path, prefix),
            max_position_embeddings=int(key("context_length")),
            tie_word_embeddings="output.weight" not in tensors,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos_ids if e is not None)),
            architecture=arch.name,
        )
        return ModelConfig(**{**fields, **arch.gguf_config(key, tensor, f"GGUF '{path.name}'")})
    except ValueError as exc:  # ModelConfig's own consistency checks
        raise UnsupportedModel(f"GGUF '{path.name}' describes an inconsistent {arch.name} model: {exc}") from exc


def _rope_from_metadata(key: Callable[..., Any], tensors: dict[str, Any], head_dim: int, path: Path,
                        arch_prefix: str) -> RopeConfig:
    theta = float(key("rope.freq_base", 10000.0))
    scaling = key("rope.scaling.type", "none")
    factor = float(key("rope.scaling.factor", 1.0))
    if scaling == "none" and key("rope.scale_linear", None) is not None:  # older files
        scaling, factor = "linear", float(key("rope.scale_linear"))
    has_freqs = ROPE_FREQS in tensors
    if has_freqs and scaling != "none":
        raise UnsupportedModel(
            f"GGUF '{path.name}' has both {arch_prefix}.rope.scaling.type {scaling!r} and a {ROPE_FREQS} table; "
            "only one form of rope scaling is supported"
        )
    if has_freqs:
        original = int(key("rope.scaling.original_context_length", _LLAMA3_DEFAULT_ORIGINAL_CONTEXT))
        factors = _dequantize(tensors[ROPE_FREQS], path).reshape(-1)
        return llama3_rope_from_factors(factors, theta, head_dim, original, path.name)
    if scaling == "none" or (scaling == "linear" and factor == 1.0):
        return RopeConfig(theta=theta)
    if scaling == "linear":
        return RopeConfig(theta=theta, type=RopeType.LINEAR, factor=factor)
    if scaling == "yarn":
        if key("rope.scaling.yarn_log_multiplier", 0.0):
            raise UnsupportedModel(
                f"GGUF '{path.name}' sets {arch_prefix}.rope.scaling.yarn_log_multiplier "
                f"{key('rope.scaling.yarn_log_multiplier')}; only plain yarn rope scaling is supported"
            )
        attn = key("rope.scaling.attn_factor", None)
        return RopeConfig(
            theta=theta,
            type=RopeType.YARN,
            factor=factor,
            original_max_position_embeddings=int(key("rope.scaling.original_context_length", 0)),
            beta_fast=float(key("rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(key("rope.scaling.yarn_beta_slow", 1.0)),
            attention_factor=None if attn is None else float(attn),
        )
    raise UnsupportedModel(
        f"GGUF '{path.name}' uses {arch_prefix}.rope.scaling.type {scaling!r}; supported: none, linear, yarn, "
        f"and llama3 (as a {ROPE_FREQS} table)"
    )


def llama3_rope_factors(
    theta: float, head_dim: int, factor: float, low_freq_factor: float, high_freq_factor: float, original_context: int
) -> np.ndarray:
    """llama.cpp's ``rope_freqs`` table for llama3 scaling: the divisor of each rotary frequency."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    low_wavelen, high_wavelen = original_context / low_freq_factor, original_context / high_freq_factor
    return np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, factor, mid))


def llama3_rope_from_factors(
    factors: np.ndarray, theta: float, head_dim: int, original_context: int, source: str
) -> RopeConfig:
    """Recover llama3 rope scaling from llama.cpp's per-frequency ``rope_freqs`` table.

    The table is 1 for short wavelengths, ``factor`` for long ones, and in between
    ``1 / ((1 - s) / factor + s)`` with ``s = (C / wavelen - low) / (high - low)``, linear in
    ``1 / wavelen``. A line fit through the in-between entries gives ``C / (high - low)`` and
    ``low / (high - low)``; with ``C = original_context`` that fixes ``low`` and ``high``. The
    result is accepted only if it reproduces the table.
    """
    f = np.asarray(factors, dtype=np.float64)
    if f.shape != (head_dim // 2,):
        raise UnsupportedModel(
            f"GGUF '{source}' has a {ROPE_FREQS} table of shape {list(f.shape)} where head_dim {head_dim} "
            f"implies [{head_dim // 2}]; re-export the file"
        )
    factor = float(f.max())
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    mid = (f > 1 + 1e-6) & (f < factor * (1 - 1e-6))
    rope = None
    if factor > 1 and mid.sum() >= 2:
        s = (1 / f[mid] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(1 / wavelen[mid], s, 1)
        span = original_context / slope  # high - low
        low = round(-intercept * span, 4)
        high = round(low + span, 4)
        try:   # a table of another shape fits to parameters RopeConfig refuses (a negative factor)
            rope = RopeConfig(
                theta=theta,
                type=RopeType.LLAMA3,
                factor=factor,
                low_freq_factor=low,
                high_freq_factor=high,
                original_max_position_embeddings=original_context,
            )
        except ValueError:
            rope = None
        if rope is not None and not np.allclose(llama3_rope_factors(theta, head_dim, factor, low, high, original_context),
                                                f, rtol=1e-4, atol=0):
            rope = None
    if rope is None:
        raise UnsupportedModel(
            f"GGUF '{source}' has a {ROPE_FREQS} table that is not llama3 rope scaling grokc can recover "
            f"(factors {f.min():.4g}..{f.max():.4g}); only llama3-style rope_freqs are supported"
        )
    return rope


def _dequantize(tensor: Any, path: Path) -> np.ndarray:
    """One GGUF tensor as float32 in numpy order (``[out, in]`` for a linear)."""
    shape = tuple(int(n) for n in reversed(tensor.shape))
    try:
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise UnsupportedModel(
            f"GGUF '{path.name}' tensor {tensor.name!r} has type {tensor.tensor_type.name}, which the gguf package "
            "cannot dequantize; re-quantize the model to a supported type (e.g. Q8_0, Q4_K, F16)"
        ) from exc
    return w.reshape(shape)
