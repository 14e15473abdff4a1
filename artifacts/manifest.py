"""``manifest.json``: what an artifact holds, and the hash of every file in it.

The manifest is plain JSON written with sorted keys. Its own integrity is covered by
``manifest_sha256``: the SHA-256 of the manifest serialised without that field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from grokc.core.errors import ArtifactError

FORMAT_VERSION = 1

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
TOKENIZER = "tokenizer.json"


def plan_file(arch: str) -> str:
    return f"{arch}/plan.json"


def cubin_file(arch: str) -> str:
    return f"{arch}/kernels.cubin"


@dataclass(frozen=True)
class Manifest:
    grokc_version: str
    source: dict[str, Any]          # {"format", "name", "sha256"}
    model: dict[str, Any]           # the ModelConfig, as JSON
    archs: list[str]
    shapes: dict[str, Any]          # batch, buckets, max_seq, KV geometry
    quant: dict[str, Any]           # the recipe
    rope: dict[str, Any]            # config, table length, mscale, table hash
    tokenizer: dict[str, Any]       # {"file", "chat_template", "bos_token_id", "eos_token_ids"}
    passes: list[str]
    weights: dict[str, Any]         # {"file", "bytes", "synthetic": None | spec}
    kernels: dict[str, list[str]]   # arch -> kernel symbols in its cubin
    files: dict[str, str] = field(default_factory=dict)  # relative path -> SHA-256
    format_version: int = FORMAT_VERSION

    def to_bytes(self) -> bytes:
        body = dataclasses.asdict(self)
        body["manifest_sha256"] = _digest(body)
        return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Manifest":
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ArtifactError(f"{MANIFEST} is corrupt (not valid JSON); rebuild the artifact") from None
        if not isinstance(body, dict) or "format_version" not in body:
            raise ArtifactError(f"{MANIFEST} is not a grokc manifest; rebuild the artifact")
        if body["format_version"] != FORMAT_VERSION:
            raise ArtifactError(
                f"artifact format {body['format_version']} is not the format {FORMAT_VERSION} this grokc reads; "
                "rebuild it with this grokc version"
            )
        claimed = body.pop("manifest_sha256", None)
        if claimed != _digest(body):
            raise ArtifactError(f"{MANIFEST} was modified after the build (its checksum does not match); rebuild the artifact")
        try:
            return cls(**body)
        except TypeError as e:
            raise ArtifactError(f"{MANIFEST} has unexpected fields ({e}); rebuild the artifact") from None


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
