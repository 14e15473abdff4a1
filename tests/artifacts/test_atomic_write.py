"""Rebuilding over an artifact, killed at any instant (artifacts/store.py, artifacts/output_dir.py).

A forked child process writes a new artifact over an old one and is sent SIGKILL or SIGINT at each
line of the write phase in turn (a line tracer over store.py, output_dir.py and safetensors_io.py
counts the lines it runs; a first, unkilled run of the same write over the same old artifact says
how many there are, where the swap begins and where its critical part begins, the block that
defers interrupts: every line from there to the end is a kill point, 20 more spread over the
swap's fsyncs and 10 over the writing before), or after a random delay. The children run
``store.write`` itself, not the conftest's wrapper that reads the weights back after it.
After each kill the target must hold the old artifact or the new one, byte for byte as written,
every hash checking; SIGINT must leave no staging folder; the next write removes what SIGKILL left.
The same runs again with the fallback swap (two renames, for filesystems without RENAME_EXCHANGE),
where a kill between the renames leaves the old artifact in its backup folder until the next
reader or writer puts it back.
"""

import functools
import inspect
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from grokc.artifacts import output_dir, safetensors_io, store
from grokc.artifacts.store import open_artifact

_INPUTS: dict[Path, tuple] = {}   # source -> what store.write takes, read once in the parent; children inherit it


def write_new(source: Path, target: Path, exchange: str = "exchange") -> None:
    """Write the new artifact (the source's, 4 MB bigger) over ``target``."""
    if source not in _INPUTS:
        art = open_artifact(source)
        weights = {**{n: np.array(a) for n, a in art.weights().items()}, "pad": np.arange(1 << 20, dtype=np.float32)}
        _INPUTS[source] = (art.manifest, {a: art.plan(a) for a in art.manifest.archs},
                           {a: art.kernels(a) for a in art.manifest.archs}, weights, art.tokenizer_json())
    if exchange == "fallback":
        output_dir._exchange = lambda a, b: False
    inspect.unwrap(store.write)(target, *_INPUTS[source])


TRACED = {os.path.realpath(m.__file__) for m in (store, output_dir, safetensors_io)}


@functools.lru_cache(maxsize=None)
def traced(filename: str) -> bool:
    """Whether lines of ``filename`` are kill points (cached: the tracer asks at every call, and a
    ``realpath`` each time made one traced write take 20 s instead of 0.5)."""
    return os.path.realpath(filename) in TRACED


def child(source: Path, target: Path, kill_at: int = 0, sig: int = signal.SIGKILL, exchange: str = "exchange",
          counter: Path | None = None) -> int:
    """Fork a process that writes the new artifact over ``target`` and sends itself ``sig`` when it
    reaches the ``kill_at``-th line of the write (0: never; ``counter`` then receives how many lines
    there were, where ``swap_in`` began and where it entered its interrupt-deferring block). Returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    # Python's KeyboardInterrupt on SIGINT even where the suite was started with SIGINT ignored (a
    # background job of a shell without job control inherits SIG_IGN, and Python then keeps it)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        count, swap_start, critical = 0, 0, 0

        def local(frame, event, arg):
            nonlocal count
            if event == "line":
                count += 1
                if count == kill_at:
                    os.kill(os.getpid(), sig)
            return local

        def calls(frame, event, arg):
            nonlocal swap_start, critical
            if not traced(frame.f_code.co_filename):
                return None
            if frame.f_code.co_name == "swap_in" and not swap_start:
                swap_start = count
            if frame.f_code.co_name == "interrupts_deferred" and frame.f_back.f_back.f_code.co_name == "swap_in":
                critical = critical or count   # (f_back is contextlib's __enter__)
            return local

        sys.settrace(calls)
        write_new(source, target, exchange)
        sys.settrace(None)
        if counter is not None:
            counter.write_text(f"{count} {swap_start} {critical}")
        code = 0
    except KeyboardInterrupt:
        code = 130
    finally:
        os._exit(code)


def wait(pid: int) -> int:
    """The child's exit status, or minus the signal that killed it."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def staging_left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".grokc-" in p.name)


@pytest.fixture(scope="module")
def old_and_new(tiny_artifact, tmp_path_factory):
    """The old artifact (the tiny one), the new one the child writes, and, for each swap, how many
    lines its write over the old artifact runs, where the swap begins and where its critical part does."""
    root = tmp_path_factory.mktemp("atomic")
    write_new(tiny_artifact, root / "warm")   # reads the inputs here, so the children only write
    counts = {}
    for exchange in ("exchange", "fallback"):
        target, counter = root / exchange / "out", root / f"{exchange}.lines"   # alone in its folder, as in
        shutil.copytree(tiny_artifact, target)   # the tests (clean_stale's lines depend on the entries beside)
        assert wait(child(tiny_artifact, target, exchange=exchange, counter=counter)) == 0
        lines, swap_start, critical = map(int, counter.read_text().split())
        assert 30 < swap_start < critical < lines, (lines, swap_start, critical)
        counts[exchange] = lines, swap_start, critical
    old_manifest = (tiny_artifact / "manifest.json").read_bytes()
    new_manifest = (root / "exchange" / "out" / "manifest.json").read_bytes()
    assert old_manifest != new_manifest
    return tiny_artifact, old_manifest, new_manifest, counts


def check_whole(target: Path, old: bytes, new: bytes) -> str:
    """'old' or 'new': what the target holds as a reader opens it (which puts back the fallback's
    backup of a dead writer), after checking it is that artifact whole."""
    opened = open_artifact(target, verify=True)   # every file there, of its size and hash, nothing else
    assert opened.path == target
    manifest = (target / "manifest.json").read_bytes()
    assert manifest in (old, new)
    return "old" if manifest == old else "new"


@pytest.mark.parametrize("exchange", ["exchange", "fallback"])
def test_a_rebuild_killed_at_any_line_leaves_the_old_or_the_new_artifact(old_and_new, tmp_path, exchange):
    source, old, new, counts = old_and_new
    lines, swap_start, critical = counts[exchange]
    target = tmp_path / "out"
    seen, missing = set(), 0
    # Every line from the swap's critical part on (the exchange or the two renames, removing the old
    # artifact, the cleanup), each with SIGKILL (SIGINT waits for the block to end) and every other one
    # with SIGINT too; 20 spread over the fsyncs before and 10 over the writing, SIGKILL and SIGINT alternating.
    points = [(k, (signal.SIGKILL, signal.SIGINT)[k % 2]) for k in sorted(
        {*range(1, swap_start, max(1, swap_start // 10)),
         *range(swap_start, critical, max(1, (critical - swap_start) // 20))})]
    points += [(k, signal.SIGKILL) for k in range(critical, lines + 1)]
    points += [(k, signal.SIGINT) for k in range(critical, lines + 1, 2)]
    for kill_at, sig in points:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        status = wait(child(source, target, kill_at, sig, exchange))
        assert status == (-signal.SIGKILL if sig == signal.SIGKILL else 130), f"line {kill_at}: status {status}"
        if sig == signal.SIGINT:
            assert staging_left(tmp_path) == [], f"line {kill_at}: SIGINT left {staging_left(tmp_path)}"
        missing += not target.exists()
        seen.add(check_whole(target, old, new))
        output_dir.clean_stale(target)      # what the next write does first
        assert staging_left(tmp_path) == [], f"line {kill_at}: {staging_left(tmp_path)} left after clean_stale"
    assert seen == {"old", "new"}       # the kills landed on both sides of the swap
    assert (missing > 0) == (exchange == "fallback")    # only the two renames leave a gap, and it was hit


@pytest.mark.parametrize("exchange", ["exchange", "fallback"])
def test_a_rebuild_killed_after_a_random_delay(old_and_new, tmp_path, exchange):
    source, old, new, _ = old_and_new
    target = tmp_path / "out"
    t0 = time.perf_counter()
    assert wait(child(source, tmp_path / "timing", exchange=exchange)) == 0
    whole_run = time.perf_counter() - t0
    rng = random.Random(0)
    for sig in (signal.SIGKILL, signal.SIGINT) * 4:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        pid = child(source, target, exchange=exchange)
        time.sleep(rng.uniform(0.0, 1.0) * whole_run)
        os.kill(pid, sig)
        wait(pid)
        check_whole(target, old, new)
        output_dir.clean_stale(target)
        assert staging_left(tmp_path) == [], staging_left(tmp_path)


def test_the_next_write_removes_what_a_killed_one_left(old_and_new, tmp_path):
    source, old, new, counts = old_and_new
    target = tmp_path / "out"
    shutil.copytree(source, target)
    # killed as the swap begins: the staging folder is whole and stays behind
    assert wait(child(source, target, counts["exchange"][1], signal.SIGKILL)) == -signal.SIGKILL
    assert len(staging_left(tmp_path)) == 1
    assert wait(child(source, target)) == 0
    assert staging_left(tmp_path) == []
    assert check_whole(target, old, new) == "new"


def test_a_live_writers_staging_folder_is_left_alone(tmp_path):
    """Only staging folders of processes that no longer run are stale: a concurrent build's stays."""
    live = tmp_path / f".out.grokc-staging.{os.getpid()}.0123abcd"
    dead = tmp_path / f".out.grokc-staging.{int(Path('/proc/sys/kernel/pid_max').read_text()) + 1}.0123abcd"
    mine = tmp_path / ".out.backup"           # the user's own folder of a similar name
    for d in (live, dead, mine):
        d.mkdir()
        (d / "f").write_text("x")
    output_dir.clean_stale(tmp_path / "out")
    assert live.is_dir() and mine.is_dir() and not dead.exists()


def test_a_reader_that_may_not_rename_opens_the_backup_in_place(tiny_artifact, tmp_path, monkeypatch):
    """The fallback's gap seen by a reader without write access to the folder: the dead writer's
    backup is opened where it lies, and nothing is deleted."""
    dead_pid = int(Path('/proc/sys/kernel/pid_max').read_text()) + 1
    backup = tmp_path / f".out.grokc-old.{dead_pid}.0123abcd"
    shutil.copytree(tiny_artifact, backup)

    def refuse(a, b):
        raise PermissionError(13, "Permission denied", str(a))
    monkeypatch.setattr(os, "rename", refuse)
    assert open_artifact(tmp_path / "out").path == backup
    output_dir.clean_stale(tmp_path / "out")      # the only copy stays
    assert backup.is_dir() and not (tmp_path / "out").exists()
