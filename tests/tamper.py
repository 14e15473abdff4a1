"""An attacker's tools against an artifact: rewrite any file and then every hash, so that only the
checks of what the files mean can catch the change (not the SHA-256s), and a recorder of every
file the process opens or changes (``sys.addaudithook``) to prove nothing outside a folder is touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_manifest(art: Path, body: dict) -> None:
    """Write ``body`` as the manifest with a matching ``manifest_sha256``."""
    body = {k: v for k, v in body.items() if k != "manifest_sha256"}
    body["manifest_sha256"] = _checksum(body)
    (art / "manifest.json").write_text(json.dumps(body, sort_keys=True, indent=1) + "\n")


def manifest(art: Path) -> dict:
    return json.loads((art / "manifest.json").read_text())


def rehash(art: Path, edit: Callable[[dict], Any] = lambda body: None) -> None:
    """Apply ``edit`` to the manifest, then set every listed file that exists inside ``art`` to its
    real size and SHA-256, and the manifest's own checksum: what a tamperer who rewrites all hashes does."""
    body = manifest(art)
    edit(body)
    for rel, info in body.get("files", {}).items():
        f = art / rel
        if isinstance(rel, str) and not rel.startswith("/") and ".." not in rel and f.is_file() and isinstance(info, dict):
            info.update(sha256=hashlib.sha256(f.read_bytes()).hexdigest(), bytes=f.stat().st_size)
    if isinstance(body.get("weights"), dict) and isinstance(body.get("files"), dict):
        info = body["files"].get(body["weights"].get("file"))
        if isinstance(info, dict):
            body["weights"]["bytes"] = info.get("bytes")
    write_manifest(art, body)


def edit_plan(art: Path, edit: Callable[[dict], Any], arch: str = "sm90") -> None:
    """Apply ``edit`` to the arch's plan.json (a dict), then rehash the artifact."""
    path = art / arch / "plan.json"
    plan = json.loads(path.read_text())
    edit(plan)
    path.write_text(json.dumps(plan, sort_keys=True, indent=1))
    rehash(art)


_CHANGES = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate", "os.chmod",
            "os.symlink", "os.link", "os.replace"}


@contextlib.contextmanager
def file_accesses() -> Iterator[list[tuple[str, str]]]:
    """Record ``(event, path)`` for every file opened or changed in this process inside the block."""
    seen: list[tuple[str, str]] = []
    _RECORDERS.append(seen)
    try:
        yield seen
    finally:
        _RECORDERS.remove(seen)


_RECORDERS: list[list[tuple[str, str]]] = []


def _hook(event: str, args: tuple) -> None:
    if not _RECORDERS or (event != "open" and event not in _CHANGES):
        return
    path = args[0] if args else None
    if isinstance(path, (str, bytes, os.PathLike)):
        for seen in _RECORDERS:
            seen.append((event, os.path.abspath(os.fsdecode(path))))


sys.addaudithook(_hook)


def outside(accesses: list[tuple[str, str]], *folders: Path) -> list[tuple[str, str]]:
    """The accesses to files under none of ``folders`` and not of Python's own (modules, site-packages)."""
    roots = [str(Path(f).resolve()) for f in folders]
    python = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path) if p]
    out = []
    for event, path in accesses:
        real = os.path.realpath(path)
        if any(real == r or real.startswith(r + os.sep) for r in roots):
            continue
        if event == "open" and (real.startswith(tuple(python)) or real.startswith("/proc/") or real == "/dev/null"):
            continue
        out.append((event, path))
    return out
