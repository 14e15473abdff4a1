"""What a parsed manifest must satisfy before anything it names is opened.

``check_manifest`` raises ``ArtifactError`` (one line, naming the field) unless

- every field has its declared type (``field_types``);
- ``files`` lists exactly the files the manifest's sections name (the weights, the tokenizer, each
  arch's plan and kernels file), each a plain relative path inside the artifact (letters, digits,
  ``._-`` and ``/`` between components; no ``..``, no absolute path), with a 64-digit SHA-256 and
  a size within ``MAX_FILE_BYTES`` for its kind;
- arch names are ``sm<digits>``; the shapes are positive, ordered and consistent with the KV
  geometry (``Shapes``); the tokenizer's ids lie in the vocabulary; the recipe names its formats;
  the quality report, where there is one, holds numbers.

The model config and the RoPE config check their own ranges when they are built (``core/config.py``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

from grokc.abi.ops import KV_BLOCK_SIZE
from grokc.artifacts.field_types import check_field_types
from grokc.core.errors import ArtifactError

if TYPE_CHECKING:
    from grokc.artifacts.manifest import Manifest

I32_MAX = 2**31 - 1
PLAIN_PATH = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}){0,3}")
ARCH = re.compile(r"sm[0-9]{2,3}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# Largest file of each kind a grokc build writes, far above any real one (a 70B model's plan is a few
# MB): a manifest cannot make a reader hash or parse more than this.
MAX_FILE_BYTES = {"plan": 1 << 30, "kernels": 1 << 31, "tokenizer": 1 << 30, "weights": 1 << 42}
WEIGHT_FORMATS = ("f16", "q8", "q4")
# The numbers of each genre of a build's quality report (compiler/quality.py's build_report).
QUALITY_NUMBERS = ("ppl_reference", "ppl_artifact", "ppl_increase", "top1_agreement", "kl_mean", "positions")


def check_manifest(m: "Manifest", where: str) -> None:
    """Raise ``ArtifactError`` unless ``m`` is a manifest this grokc can trust the layout of."""
    check_field_types(m, where)

    def bad(what: str) -> ArtifactError:
        return ArtifactError(f"{where} {what}; rebuild the artifact")

    for arch in m.archs:
        if not ARCH.fullmatch(arch):
            raise bad(f"names arch {arch!r}, not sm<digits>")
    kinds = {m.weights.file: "weights", m.tokenizer.file: "tokenizer"}
    for info in m.archs.values():
        kinds.update({info.plan: "plan", info.kernels_file: "kernels"})
    named = [m.weights.file, m.tokenizer.file, *(p for a in m.archs.values() for p in (a.plan, a.kernels_file))]
    for rel in sorted(set(named) | set(m.files)):
        if not PLAIN_PATH.fullmatch(rel) or any(part in (".", "..") for part in rel.split("/")):
            raise bad(f"names {rel!r}, which is not a plain relative path inside the artifact")
    if len(set(named)) != len(named):
        raise bad("names one file for two roles")
    if set(m.files) != set(named):
        odd = sorted(set(m.files) ^ set(named))[0]
        raise bad(f"lists '{odd}' in files but not among the files its sections name, or the other way round")
    for rel, info in m.files.items():
        if not SHA256.fullmatch(info.sha256):
            raise bad(f"gives '{rel}' the SHA-256 {info.sha256[:70]!r}, not 64 hex digits")
        if not 0 <= info.bytes <= MAX_FILE_BYTES[kinds[rel]]:
            raise bad(f"gives '{rel}' a size of {info.bytes} bytes, outside [0, {MAX_FILE_BYTES[kinds[rel]]}]")
    if m.weights.bytes != m.files[m.weights.file].bytes:
        raise bad(f"gives the weights {m.weights.bytes} bytes but lists {m.files[m.weights.file].bytes}")
    _check_shapes(m, bad)
    vocab = m.model.vocab_size
    for token in (*m.tokenizer.eos_token_ids, *([] if m.tokenizer.bos_token_id is None else [m.tokenizer.bos_token_id])):
        if not 0 <= token < vocab:
            raise bad(f"gives the tokenizer token id {token}, outside the vocabulary of {vocab}")
    if not m.rope:
        raise bad("has no RoPE table")
    for rope in m.rope:
        if not 0 <= rope.table_length <= I32_MAX or rope.mscale <= 0:
            raise bad(f"has a RoPE table of {rope.table_length} positions with mscale {rope.mscale}")
    _check_quant(m.quant.recipe, m.quant.quality, bad)


def _check_shapes(m: "Manifest", bad) -> None:
    s = m.shapes
    sizes = {"batch": s.batch, "max_seq": s.max_seq, "kv_blocks": s.kv_blocks,
             "max_blocks_per_seq": s.max_blocks_per_seq, **{f"bucket {b}": b for b in s.buckets}}
    for name, value in sizes.items():
        if not 1 <= value <= I32_MAX:
            raise bad(f"has shapes.{name} = {value}, outside [1, {I32_MAX}]")
    if not s.buckets or list(s.buckets) != sorted(set(s.buckets)) or s.buckets[-1] > s.max_seq:
        raise bad(f"has buckets {list(s.buckets)}, not increasing lengths up to max_seq {s.max_seq}")
    if s.kv_block_size != KV_BLOCK_SIZE or s.max_blocks_per_seq != -(-s.max_seq // KV_BLOCK_SIZE):
        raise bad(f"has a KV geometry ({s.max_blocks_per_seq} blocks of {s.kv_block_size} a slot) that does not "
                  f"hold max_seq {s.max_seq} in blocks of {KV_BLOCK_SIZE}")
    if s.kv_blocks < s.max_blocks_per_seq:
        raise bad(f"has {s.kv_blocks} KV blocks, fewer than one sequence needs ({s.max_blocks_per_seq})")
    if not s.decode_batches or list(s.decode_batches) != sorted(set(s.decode_batches)) \
            or s.decode_batches[0] < 1 or s.decode_batches[-1] != s.batch:
        raise bad(f"has decode batches {list(s.decode_batches)}, not increasing sizes up to the batch {s.batch}")


def _check_quant(recipe: Mapping[str, Any], quality: Mapping[str, Any] | None, bad) -> None:
    if not isinstance(recipe.get("name"), str):
        raise bad("has a quantization recipe without a name")
    for key in ("weight_format", "lm_head", "embeddings"):
        if key in recipe or key == "weight_format":
            if recipe.get(key) not in WEIGHT_FORMATS:
                raise bad(f"has quant.{key} = {recipe.get(key)!r}, not one of {', '.join(WEIGHT_FORMATS)}")
    group = recipe.get("group_size")
    if type(group) is not int or group < 0 or type(recipe.get("symmetric")) is not bool:
        raise bad(f"has quant.group_size = {group!r} and quant.symmetric = {recipe.get('symmetric')!r}")
    residual = recipe.get("fp16_residual", 0.0)
    if type(residual) not in (int, float) or not 0 <= residual <= 1:
        raise bad(f"has quant.fp16_residual = {residual!r}")
    if quality is not None:
        genres = quality.get("genres")
        if type(quality.get("tokens")) is not int or not isinstance(genres, dict) or not genres:
            raise bad(f"has a quality report with tokens {quality.get('tokens')!r} and genres {genres!r}")
        for genre, report in genres.items():
            for key in QUALITY_NUMBERS:
                value = report.get(key) if isinstance(report, dict) else None
                if type(value) not in (int, float):
                    raise bad(f"has a quality report whose {genre} {key} is {value!r}, not a number")
