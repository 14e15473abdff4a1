"""``manifest.json``: what an artifact holds, as typed sections, and the hash and size of every file.

The manifest is plain JSON written with sorted keys. Its own integrity is covered by
``manifest_sha256``: the SHA-256 of the manifest serialised without that field. Every section
is a frozen dataclass with ``to_json``/``from_json``; the records the passes decide (shapes,
RoPE table, quantization) are ``core/meta.py``'s own, so the compiler and the runner read one
definition. A manifest that does not parse into these sections is an ``ArtifactError``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from grokc.abi.synthetic import SyntheticTensor
from grokc.artifacts.manifest_checks import check_manifest
from grokc.core.config import ModelConfig
from grokc.core.errors import ArtifactError
from grokc.core.meta import QuantInfo, RopeTable, Shapes

FORMAT_VERSION = 3
MAX_MANIFEST_BYTES = 64 << 20   # a real manifest is a few kB (a synthetic 70B one under 1 MB)

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
TOKENIZER = "tokenizer.json"


def plan_file(arch: str) -> str:
    return f"{arch}/plan.json"


def kernels_file(arch: str, ptx: bool) -> str:
    """The arch's kernels: a cubin (SASS only), or a fatbin when it also carries PTX."""
    return f"{arch}/kernels.fatbin" if ptx else f"{arch}/kernels.cubin"


@dataclass(frozen=True)
class Source:
    format: str   # "gguf" | "hf" | "config" (synthetic weights)
    sha256: str   # of the bytes the model came from (each frontend says what exactly)


@dataclass(frozen=True)
class TokenizerInfo:
    file: str
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "chat_template": self.chat_template, "bos_token_id": self.bos_token_id,
                "eos_token_ids": list(self.eos_token_ids)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TokenizerInfo":
        return cls(d["file"], d["chat_template"], d["bos_token_id"], tuple(d["eos_token_ids"]))


@dataclass(frozen=True)
class SyntheticSpec:
    """Weights the runner fills on the device at load (``abi/synthetic.py``) instead of reading them."""

    seed: int
    tensors: Mapping[str, SyntheticTensor]

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "tensors": {n: t.to_json() for n, t in sorted(self.tensors.items())}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SyntheticSpec":
        return cls(d["seed"], {n: SyntheticTensor.from_json(t) for n, t in d["tensors"].items()})


@dataclass(frozen=True)
class WeightsInfo:
    file: str
    bytes: int = 0                          # size of the weights file, set when it is written
    synthetic: SyntheticSpec | None = None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.bytes,
                "synthetic": None if self.synthetic is None else self.synthetic.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "WeightsInfo":
        spec = d["synthetic"]
        return cls(d["file"], d["bytes"], None if spec is None else SyntheticSpec.from_json(spec))


@dataclass(frozen=True)
class ArchInfo:
    """One architecture's part of the artifact: its plan, its kernels and the passes run for it alone."""

    plan: str                     # relative path of plan.json
    kernels_file: str             # relative path of the cubin / fatbin
    ptx: bool                     # the kernels file also carries PTX (newer GPUs JIT-compile it)
    kernels: tuple[str, ...]      # kernel symbols in it
    passes: tuple[str, ...]       # the target's own passes, after the shared ones
    deterministic: bool = False   # kernels chosen for replay-deterministic results (--deterministic)

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "kernels_file": self.kernels_file, "ptx": self.ptx, "kernels": list(self.kernels),
                "passes": list(self.passes), "deterministic": self.deterministic}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ArchInfo":
        return cls(d["plan"], d["kernels_file"], d["ptx"], tuple(d["kernels"]), tuple(d["passes"]), d["deterministic"])


@dataclass(frozen=True)
class FileInfo:
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    grokc_version: str
    source: Source
    model: ModelConfig
    archs: Mapping[str, ArchInfo]       # arch name -> its plan and kernels
    shapes: Shapes
    quant: QuantInfo
    rope: tuple[RopeTable, ...]         # one table per RoPE of the model
    tokenizer: TokenizerInfo
    passes: tuple[str, ...]             # the passes every arch shares, in order
    weights: WeightsInfo
    files: Mapping[str, FileInfo] = field(default_factory=dict)  # relative path -> hash and size
    format_version: int = FORMAT_VERSION

    def with_files(self, files: Mapping[str, FileInfo]) -> "Manifest":
        return replace(self, files=dict(sorted(files.items())),
                       weights=replace(self.weights, bytes=files[self.weights.file].bytes))

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version, "grokc_version": self.grokc_version,
            "source": {"format": self.source.format, "sha256": self.source.sha256},
            "model": self.model.to_json(), "archs": {a: info.to_json() for a, info in sorted(self.archs.items())},
            "shapes": self.shapes.to_json(), "quant": self.quant.to_json(), "rope": [r.to_json() for r in self.rope],
            "tokenizer": self.tokenizer.to_json(), "passes": list(self.passes), "weights": self.weights.to_json(),
            "files": {rel: {"sha256": f.sha256, "bytes": f.bytes} for rel, f in sorted(self.files.items())},
        }

    def to_bytes(self) -> bytes:
        body = self.to_json()
        body["manifest_sha256"] = _digest(body)
        return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Manifest":
        return cls(
            grokc_version=d["grokc_version"], source=Source(**d["source"]), model=ModelConfig.from_json(d["model"]),
            archs={a: ArchInfo.from_json(info) for a, info in d["archs"].items()},
            shapes=Shapes.from_json(d["shapes"]), quant=QuantInfo.from_json(d["quant"]),
            rope=tuple(RopeTable.from_json(r) for r in d["rope"]), tokenizer=TokenizerInfo.from_json(d["tokenizer"]),
            passes=tuple(d["passes"]), weights=WeightsInfo.from_json(d["weights"]),
            files={rel: FileInfo(**f) for rel, f in d["files"].items()}, format_version=d["format_version"],
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Manifest":
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ArtifactError(f"{MANIFEST} is corrupt (not valid JSON); rebuild the artifact") from None
        if not isinstance(body, dict) or "format_version" not in body:
            raise ArtifactError(f"{MANIFEST} is not a grokc manifest; rebuild the artifact")
        if type(body["format_version"]) is not int or body["format_version"] != FORMAT_VERSION:
            raise ArtifactError(
                f"artifact format {str(body['format_version'])[:20]} is not the format {FORMAT_VERSION} this grokc "
                "reads; rebuild it with this grokc version"
            )
        claimed = body.pop("manifest_sha256", None)
        try:
            digest = _digest(body)
        except RecursionError:
            digest = None
        if digest is None or claimed != digest:
            raise ArtifactError(f"{MANIFEST} was modified after the build (its checksum does not match); rebuild the artifact")
        try:
            manifest = cls.from_json(body)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ArtifactError(f"{MANIFEST} does not describe a grokc artifact ({type(e).__name__}: "
                                f"{str(e)[:200]}); rebuild the artifact") from None
        check_manifest(manifest, MANIFEST)
        return manifest


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
