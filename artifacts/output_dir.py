"""Where an artifact may be written, and how a new one replaces an old one without losing either.

grokc deletes only what it wrote. ``check_output`` refuses, with one ``ArtifactError`` line naming
the path, an ``-o`` that is a symbolic link, an existing file, a path under ``/proc``, ``/sys`` or
``/dev``, the working directory or a folder holding it, a protected path (the source model) or a
folder holding one, and a non-empty folder that is not a grokc artifact or holds anything its
manifest does not list.

``staging_path`` names a folder beside the target, ``.<name>.grokc-staging.<pid>.<random>``, after
removing such folders whose process no longer runs (a build killed before it could clean up).
``swap_in`` puts the finished staging folder in place: one ``renameat2(RENAME_EXCHANGE)`` swaps it
with an existing artifact atomically (then the old one, now in the staging folder, is removed),
or one ``rename`` when there is none. Where the filesystem cannot exchange, the old artifact is
first renamed to ``.<name>.grokc-old.<pid>.<random>`` and the next write into the target puts it back if
the process died before the new one was in place, and so does ``recover`` when the artifact is
opened (as SQLite rolls back a hot journal on open). A kill at any instant leaves either the old
artifact or the new one whole at the target, as the next writer or reader sees it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import signal
import threading
from pathlib import Path
from typing import Iterable, Iterator

from grokc.artifacts.manifest import MANIFEST, MAX_MANIFEST_BYTES
from grokc.core.errors import ArtifactError

SYSTEM_FOLDERS = (Path("/proc"), Path("/sys"), Path("/dev"))
_STAGING = "grokc-staging"
_OLD = "grokc-old"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def check_output(out: Path, protect: Iterable[Path] = ()) -> None:
    """Raise ``ArtifactError`` unless an artifact may be written to ``out`` (see the module docstring)."""
    out = Path(out)
    where = f"output folder '{out}'"
    if out.is_symlink():
        raise ArtifactError(f"{where} is a symbolic link; give the folder it points to, or a new path")
    resolved = out.resolve()
    for system in SYSTEM_FOLDERS:
        if resolved == system or system in resolved.parents:
            raise ArtifactError(f"{where} lies under {system}, a system folder; write the artifact to a normal folder")
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"{where} is an existing file, not a folder; choose a new folder path")
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise ArtifactError(f"{where} is the working directory or holds it, which a build would replace; "
                            "choose a new folder such as dist/NAME")
    for path in protect:
        source = Path(path).resolve()
        if resolved == source or resolved in source.parents:
            raise ArtifactError(f"{where} is the source model '{path}' or a folder holding it, which a build would "
                                "replace; choose a new folder such as dist/NAME")
    if out.is_dir():
        foreign = _foreign_entry(out)
        if foreign is not None:
            raise ArtifactError(f"{where} is not empty and holds '{foreign}', which is not part of a grokc artifact; "
                                "grokc replaces only folders it wrote: choose an empty or new folder")


def _foreign_entry(out: Path) -> str | None:
    """The first entry of ``out`` that no grokc artifact manifest there accounts for, or None."""
    entries = _entries(out)
    if not entries:
        return None
    owned = _manifest_files(out / MANIFEST)
    if owned is None:
        return entries[0]
    folders = {p.rsplit("/", i)[0] for p in owned for i in range(1, p.count("/") + 1)}
    for rel, is_dir in ((e.rstrip("/"), e.endswith("/")) for e in entries):
        if rel not in (folders if is_dir else owned | {MANIFEST}):
            return rel
    return None


def _entries(root: Path) -> list[str]:
    """Every path under ``root`` (folders with a trailing '/'), symbolic links not followed, sorted."""
    found = []
    for top, dirs, files in os.walk(root, followlinks=False):
        rel = Path(top).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        found += [prefix + d + ("" if os.path.islink(os.path.join(top, d)) else "/") for d in dirs]
        found += [prefix + f for f in files]
    return sorted(found)


def _manifest_files(path: Path) -> set[str] | None:
    """The file names a grokc manifest lists (any format version), or None when ``path`` is not one."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        body = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or "grokc_version" not in body or not isinstance(body.get("files"), dict):
        return None
    return {name for name in body["files"] if isinstance(name, str)}


# -- staging and the swap ----------------------------------------------------------------------

@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (in the main thread; elsewhere nothing changes),
    so a Ctrl-C never lands between the two halves of a swap or in the middle of a cleanup."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def staging_path(out: Path) -> Path:
    """A new name beside ``out`` for the folder to write the artifact into (stale ones removed
    first); the caller creates it, so an interrupt cannot leave it behind unnamed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with interrupts_deferred():
        clean_stale(out)
    return out.parent / f".{out.name}.{_STAGING}.{os.getpid()}.{secrets.token_hex(4)}"


def clean_stale(out: Path) -> None:
    """Remove staging folders beside ``out`` left by processes that no longer run; put back an old
    artifact a dead process had moved aside when ``out`` is missing (the fallback swap)."""
    recover(out)
    for entry, kind in _left_by_dead(out):
        if kind == _STAGING or out.exists():    # a backup stays while it is the only copy
            shutil.rmtree(entry, ignore_errors=True)


def recover(out: Path) -> Path:
    """Where the artifact ``out`` is: ``out`` itself, unless it is missing because a process died
    between the fallback swap's two renames; then its backup is renamed back to ``out`` (or, where
    that is not allowed, the backup is where it is)."""
    if out.exists() or not out.parent.is_dir():
        return out
    for entry, kind in _left_by_dead(out):
        if kind == _OLD:
            try:
                os.rename(entry, out)
            except OSError:
                return entry
            return out
    return out


def _left_by_dead(out: Path) -> list[tuple[Path, str]]:
    """The staging and backup folders beside ``out`` whose process no longer runs, with their kind."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.({_STAGING}|{_OLD})\.(\d+)\.[0-9a-f]{{8}}")
    found = []
    for entry in sorted(out.parent.iterdir()):
        match = pattern.fullmatch(entry.name)
        if match is not None and not entry.is_symlink() and entry.is_dir() and not _alive(int(match.group(2))):
            found.append((entry, match.group(1)))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def swap_in(staged: Path, out: Path) -> None:
    """Put the finished folder ``staged`` at ``out``; an old artifact there ends up removed."""
    for top, _, files in os.walk(staged):
        for name in files:
            _fsync(Path(top) / name)
        _fsync(Path(top))
    with interrupts_deferred():
        if not out.exists():
            os.rename(staged, out)
        elif _exchange(staged, out):
            shutil.rmtree(staged)       # now the old artifact
        else:
            old = out.parent / f".{out.name}.{_OLD}.{os.getpid()}.{secrets.token_hex(4)}"
            os.rename(out, old)
            try:
                os.rename(staged, out)
            except OSError:
                os.rename(old, out)
                raise
            shutil.rmtree(old)
    _fsync(out.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where the system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync(path: Path) -> None:
    """Flush a file or folder to disk: the swap must not expose a file whose bytes are still only in
    the page cache (a power cut after the rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
