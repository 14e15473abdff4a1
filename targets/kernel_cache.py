"""A content-addressed cache of nvcc's output, so that a rebuild (or a test suite's hundred builds)
compiles each kernel set once.

The key is the SHA-256 of everything nvcc's bytes depend on: the command line (flags, arch), the
translation unit, every header under ``targets/kernels`` (names and bytes), and the nvcc binary
(its resolved path, size and modification time). nvcc is deterministic for fixed inputs, so a hit
returns the bytes a compile would; builds stay byte-identical with or without the cache.

Where: ``$GROKC_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/grokc/kernels``, else ``~/.cache/grokc/kernels``;
``GROKC_KERNEL_CACHE=off`` turns it off. An entry is written to a temporary file and renamed into
place (a killed build or two builds at once leave whole entries or none); an entry that cannot be
read or written is treated as a miss, never as an error: the cache only saves time.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

OFF = "off"


def folder() -> Path | None:
    """The cache folder, or None when the cache is off."""
    env = os.environ.get("GROKC_KERNEL_CACHE")
    if env == OFF:
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "grokc" / "kernels"


@functools.lru_cache(maxsize=8)
def _headers_digest(kernel_dir: Path) -> bytes:
    h = hashlib.sha256()
    for path in sorted(kernel_dir.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(kernel_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.digest()


def key(nvcc: str, cmd: Sequence[str], source: str, kernel_dir: Path) -> str:
    """The entry's name for compiling ``source`` with ``cmd`` (the arguments after nvcc) by ``nvcc``."""
    real = Path(nvcc).resolve()
    st = real.stat()
    h = hashlib.sha256()
    for part in (str(real), str(st.st_size), str(st.st_mtime_ns), *cmd):
        h.update(part.encode() + b"\0")
    h.update(_headers_digest(kernel_dir))
    h.update(source.encode())
    return h.hexdigest()


def get(name: str) -> bytes | None:
    """The cached bytes of entry ``name``, or None (off, missing, unreadable)."""
    root = folder()
    if root is None:
        return None
    try:
        return (root / name).read_bytes()
    except OSError:
        return None


def put(name: str, data: bytes) -> None:
    """Store ``data`` as entry ``name`` (atomically; silently skipped when the folder is not writable)."""
    root = folder()
    if root is None:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=root)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, root / name)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
