"""Writing an artifact folder, and opening one with every file's hash checked.

Nothing outside ``artifacts/`` knows the folder layout: the compiler hands ``write`` a manifest
and the file contents; the runner and ``grokc verify`` call ``open_artifact``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from grokc.abi.synthetic import SyntheticTensor
from grokc.artifacts import safetensors_io
from grokc.artifacts.manifest import MANIFEST, TOKENIZER, FileInfo, Manifest
from grokc.artifacts.plan import Plan
from grokc.core.errors import ArtifactError


def write(out: Path, manifest: Manifest, plans: Mapping[str, Plan], kernels: Mapping[str, bytes],
          weights: Mapping[str, np.ndarray], tokenizer_json: str) -> Manifest:
    """Write the artifact into ``out`` (replacing it atomically) and return the final manifest.

    ``plans`` and ``kernels`` (the cubin or fatbin bytes) are keyed by arch; where each goes is
    ``manifest.archs[arch]``'s to say."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        safetensors_io.save(staging / manifest.weights.file, weights)
        (staging / TOKENIZER).write_text(tokenizer_json, encoding="utf-8")
        for arch, plan in plans.items():
            info = manifest.archs[arch]
            (staging / info.plan).parent.mkdir(parents=True, exist_ok=True)
            (staging / info.plan).write_text(json.dumps(plan.to_json(), sort_keys=True, indent=1) + "\n")
            (staging / info.kernels_file).write_bytes(kernels[arch])
        manifest = manifest.with_files({rel: FileInfo(_sha256(staging / rel), (staging / rel).stat().st_size)
                                        for rel in _files(staging)})
        (staging / MANIFEST).write_bytes(manifest.to_bytes())
        os.chmod(staging, 0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return manifest


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: Manifest

    def plan(self, arch: str) -> Plan:
        return Plan.from_json(json.loads((self.path / self.manifest.archs[arch].plan).read_text()))

    def kernels(self, arch: str) -> bytes:
        """The arch's cubin or fatbin (``cuModuleLoadData`` takes either)."""
        return (self.path / self.manifest.archs[arch].kernels_file).read_bytes()

    def weights(self) -> dict[str, np.ndarray]:
        """The stored weights (memory-mapped, read-only); synthetic ones are in ``synthetic()``."""
        return safetensors_io.load(self.path / self.manifest.weights.file)

    def synthetic(self) -> dict[str, SyntheticTensor]:
        """Weights the runner fills on the device (``abi/synthetic.py``); empty for real models."""
        spec = self.manifest.weights.synthetic
        return {} if spec is None else dict(spec.tensors)

    def tokenizer_json(self) -> str:
        return (self.path / TOKENIZER).read_text(encoding="utf-8")


def open_artifact(path: str | Path, verify: bool = True) -> Artifact:
    """Open an artifact folder; with ``verify`` every file's SHA-256 is checked against the manifest."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise ArtifactError(f"'{path}' is not a grokc artifact (no {MANIFEST}); build one with `grokc build MODEL -o {path}`")
    manifest = Manifest.from_bytes((path / MANIFEST).read_bytes())
    if verify:
        verify_files(path, manifest)
    return Artifact(path, manifest)


def verify_files(path: Path, manifest: Manifest) -> None:
    """Raise ArtifactError naming the first file that is missing, extra, or changed."""
    for rel, want in sorted(manifest.files.items()):
        f = path / rel
        if not f.is_file():
            raise ArtifactError(f"artifact file '{rel}' is missing; rebuild the artifact")
        if _sha256(f) != want.sha256:
            raise ArtifactError(f"artifact file '{rel}' is corrupt or was modified (SHA-256 mismatch); rebuild the artifact")
    extra = sorted(set(_files(path)) - set(manifest.files) - {MANIFEST})
    if extra:
        raise ArtifactError(f"artifact holds an unexpected file '{extra[0]}'; remove it or rebuild the artifact")


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
