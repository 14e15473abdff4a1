"""Writing an artifact folder, and opening one with every file's hash checked.

Nothing outside ``artifacts/`` knows the folder layout: the compiler hands ``write`` a manifest
and the file contents; the runner and ``grokc verify`` call ``open_artifact``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from grokc.abi.synthetic import SyntheticTensor
from grokc.artifacts import kernels_file, output_dir, safetensors_io
from grokc.artifacts.manifest import MANIFEST, MAX_MANIFEST_BYTES, TOKENIZER, FileInfo, Manifest
from grokc.artifacts.plan import Plan
from grokc.core.errors import ArtifactError


def write(out: Path, manifest: Manifest, plans: Mapping[str, Plan], kernels: Mapping[str, bytes],
          weights: Mapping[str, np.ndarray], tokenizer_json: str, protect: Iterable[Path] = ()) -> Manifest:
    """Write the artifact into ``out`` and return the final manifest.

    ``out`` is checked first (``output_dir.check_output``: never a folder grokc did not write, nor one
    of ``protect`` or a folder holding one); the files go into a staging folder beside it, which
    then replaces ``out`` atomically. ``plans`` and ``kernels`` (the cubin or fatbin bytes) are keyed
    by arch; where each goes is ``manifest.archs[arch]``'s to say."""
    out = Path(out)
    output_dir.check_output(out, protect)
    staged = output_dir.staging_path(out)
    try:
        staged.mkdir(mode=0o755)
        safetensors_io.save(staged / manifest.weights.file, weights)
        (staged / TOKENIZER).write_text(tokenizer_json, encoding="utf-8")
        for arch, plan in plans.items():
            info = manifest.archs[arch]
            (staged / info.plan).parent.mkdir(parents=True, exist_ok=True)
            (staged / info.plan).write_text(json.dumps(plan.to_json(), sort_keys=True, indent=1) + "\n")
            (staged / info.kernels_file).write_bytes(kernels[arch])
        manifest = manifest.with_files({rel: FileInfo(_sha256(staged / rel), (staged / rel).stat().st_size)
                                        for rel in _files(staged)})
        (staged / MANIFEST).write_bytes(manifest.to_bytes())
        output_dir.check_output(out, protect)   # again: the folder may have changed during the build
        output_dir.swap_in(staged, out)
    except OSError as e:
        raise ArtifactError(f"cannot write the artifact to '{out}' ({e.strerror or e}); check that its folder "
                            "is writable and the disk has room") from None
    finally:
        with output_dir.interrupts_deferred():
            if staged.exists():
                shutil.rmtree(staged, ignore_errors=True)
    return manifest


@dataclass(frozen=True)
class Artifact:
    """An opened artifact: its manifest was checked (``manifest_checks``) and every file it lists is a
    regular file inside the folder, of the listed size; with ``verify``, of the listed SHA-256 too."""

    path: Path
    manifest: Manifest

    def plan(self, arch: str) -> Plan:
        """The arch's plan, checked (``Plan.validate``) against the manifest's shapes and vocabulary, the
        weights' dtypes and shapes and the kernels file's symbols."""
        rel = self.manifest.archs[arch].plan
        try:
            body = json.loads(_read(self.path, rel))
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ArtifactError(f"artifact file '{rel}' is not JSON; rebuild the artifact") from None
        if not isinstance(body, dict) or not {"arch", "arena_bytes", "buffers", "graphs"} <= set(body):
            raise ArtifactError(f"artifact file '{rel}' is not a grokc plan (it needs arch, arena_bytes, buffers "
                                "and graphs); rebuild the artifact")
        plan = Plan.from_json(body)
        if plan.arch != arch:
            raise ArtifactError(f"artifact file '{rel}' holds the plan for {plan.arch!r}, not {arch}; rebuild the artifact")
        rel_kernels = self.manifest.archs[arch].kernels_file
        plan.validate(weights={**self.weights(), **self.synthetic()}, shapes=self.manifest.shapes,
                      vocab=self.manifest.model.vocab_size,
                      kernels=kernels_file.read(self.kernels(arch), rel_kernels).symbols)
        return plan

    def kernels(self, arch: str) -> bytes:
        """The arch's cubin or fatbin (``cuModuleLoadData`` takes either)."""
        return _read(self.path, self.manifest.archs[arch].kernels_file)

    def weights(self) -> dict[str, np.ndarray]:
        """The stored weights (memory-mapped, read-only); synthetic ones are in ``synthetic()``."""
        return safetensors_io.load(_inside(self.path, self.manifest.weights.file))

    def synthetic(self) -> dict[str, SyntheticTensor]:
        """Weights the runner fills on the device (``abi/synthetic.py``); empty for real models."""
        spec = self.manifest.weights.synthetic
        return {} if spec is None else dict(spec.tensors)

    def tokenizer_json(self) -> str:
        rel = self.manifest.tokenizer.file
        try:
            return _read(self.path, rel).decode("utf-8")
        except UnicodeDecodeError:
            raise ArtifactError(f"artifact file '{rel}' is not UTF-8 text; rebuild the artifact") from None


def open_artifact(path: str | Path, verify: bool = True) -> Artifact:
    """Open an artifact folder: its manifest checked, every file it lists a regular file inside the
    folder of the listed size; with ``verify`` also of the listed SHA-256, and nothing else there.
    A writer killed inside the fallback swap left it in a backup, which ``output_dir.recover`` puts back."""
    path = output_dir.recover(Path(path))
    if not (path / MANIFEST).is_file():
        raise ArtifactError(f"'{path}' is not a grokc artifact (no {MANIFEST}); build one with `grokc build MODEL -o {path}`")
    manifest = Manifest.from_bytes(_read(path, MANIFEST, MAX_MANIFEST_BYTES))
    for rel, want in sorted(manifest.files.items()):
        size = _inside(path, rel).stat().st_size
        if size != want.bytes:
            raise ArtifactError(f"artifact file '{rel}' has {size} bytes but the manifest lists {want.bytes}; "
                                "rebuild the artifact")
    safetensors_io.load(_inside(path, manifest.weights.file))   # its header, before hours of hashing a fake
    if verify:
        verify_files(path, manifest)
    return Artifact(path, manifest)


def verify_files(path: Path, manifest: Manifest) -> None:
    """Raise ArtifactError naming the first file that is missing, extra, of the wrong size, or changed."""
    for rel, want in sorted(manifest.files.items()):
        f = _inside(path, rel)
        if f.stat().st_size != want.bytes:
            raise ArtifactError(f"artifact file '{rel}' has {f.stat().st_size} bytes but the manifest lists "
                                f"{want.bytes}; rebuild the artifact")
        if _sha256(f) != want.sha256:
            raise ArtifactError(f"artifact file '{rel}' is corrupt or was modified (SHA-256 mismatch); rebuild the artifact")
    extra = sorted(set(_files(path)) - set(manifest.files) - {MANIFEST})
    if extra:
        raise ArtifactError(f"artifact holds an unexpected entry '{extra[0]}'; remove it or rebuild the artifact")


def _inside(root: Path, rel: str) -> Path:
    """``root / rel`` when it is a regular file reached without symbolic links; else ``ArtifactError``.

    ``rel`` is a plain relative path (``manifest_checks`` refused any other before this runs), so
    nothing outside ``root`` is ever looked at."""
    path = root
    for part in rel.split("/"):
        path = path / part
        try:
            st = path.lstat()
        except FileNotFoundError:
            raise ArtifactError(f"artifact file '{rel}' is missing; rebuild the artifact") from None
        except OSError as e:
            raise ArtifactError(f"artifact file '{rel}' cannot be read ({e.strerror}); rebuild the artifact") from None
        if stat.S_ISLNK(st.st_mode):
            raise ArtifactError(f"artifact file '{rel}' is or lies behind a symbolic link, which an artifact never "
                                "holds; rebuild the artifact")
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactError(f"artifact file '{rel}' is not a regular file; rebuild the artifact")
    return path


def _read(root: Path, rel: str, limit: int | None = None) -> bytes:
    """The bytes of ``_inside(root, rel)``, at most ``limit`` of them (more is an ``ArtifactError``)."""
    path = _inside(root, rel)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read() if limit is None else f.read(limit + 1)
    except OSError as e:
        raise ArtifactError(f"artifact file '{rel}' cannot be read ({e.strerror}); rebuild the artifact") from None
    if limit is not None and len(data) > limit:
        raise ArtifactError(f"artifact file '{rel}' is larger than {limit} bytes, more than grokc ever writes; "
                            "rebuild the artifact")
    return data


def _files(root: Path) -> list[str]:
    """Every entry under ``root`` that is not a folder (files, links, devices), links not followed."""
    out = []
    for top, dirs, files in os.walk(root, followlinks=False):
        rel = Path(top).relative_to(root)
        out += [(rel / n).as_posix() for n in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]]
    return sorted(out)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
