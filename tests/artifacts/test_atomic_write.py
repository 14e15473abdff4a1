"""Rebuilding over an artifact, killed at any instant (artifacts/store.py, artifacts/output_dir.py).

A forked child process writes a new artifact over an old one and is sent SIGKILL or SIGINT at each
line of the write phase in turn (a line tracer over store.py, output_dir.py and safetensors_io.py
counts the lines it runs; the first, unkilled run says how many there are and where the swap
begins: every one of the last 40 lines is a kill point, 20 more spread over the swap's fsyncs and
10 over the writing before), or after a random delay.
After each kill the target must hold the old artifact or the new one, byte for byte as written,
every hash checking; SIGINT must leave no staging folder; the next write removes what SIGKILL left.
The same runs again with the fallback swap (two renames, for filesystems without RENAME_EXCHANGE),
where the old artifact may wait in its backup folder until the next write puts it back.
"""

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
    store.write(target, *_INPUTS[source])


TRACED = {os.path.realpath(m.__file__) for m in (store, output_dir, safetensors_io)}


def child(source: Path, target: Path, kill_at: int = 0, sig: int = signal.SIGKILL, exchange: str = "exchange",
          counter: Path | None = None) -> int:
    """Fork a process that writes the new artifact over ``target`` and sends itself ``sig`` when it
    reaches the ``kill_at``-th line of the write (0: never; ``counter`` then receives how many lines
    there were). Returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        count, swap_start = 0, 0

        def local(frame, event, arg):
            nonlocal count
            if event == "line":
                count += 1
                if count == kill_at:
                    os.kill(os.getpid(), sig)
            return local

        def calls(frame, event, arg):
            nonlocal swap_start
            if os.path.realpath(frame.f_code.co_filename) not in TRACED:
                return None
            if frame.f_code.co_name == "swap_in" and not swap_start:
                swap_start = count
            return local

        sys.settrace(calls)
        write_new(source, target, exchange)
        sys.settrace(None)
        if counter is not None:
            counter.write_text(f"{count} {swap_start}")
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
    """The old artifact (the tiny one), the new one the child writes, and how many lines its write runs."""
    root = tmp_path_factory.mktemp("atomic")
    write_new(tiny_artifact, root / "warm")   # reads the inputs here, so the children only write
    new, counter = root / "new", root / "lines"
    assert wait(child(tiny_artifact, new, counter=counter)) == 0
    old_manifest, new_manifest = (tiny_artifact / "manifest.json").read_bytes(), (new / "manifest.json").read_bytes()
    assert old_manifest != new_manifest
    lines, swap_start = map(int, counter.read_text().split())
    assert 30 < swap_start < lines - 40
    return tiny_artifact, old_manifest, new_manifest, lines, swap_start


def check_whole(target: Path, old: bytes, new: bytes) -> str:
    """'old' or 'new': what the target holds, after checking it is that artifact whole."""
    manifest = (target / "manifest.json").read_bytes()
    assert manifest in (old, new)
    open_artifact(target, verify=True)   # every file there, of its size and hash, nothing else
    return "old" if manifest == old else "new"


@pytest.mark.parametrize("exchange", ["exchange", "fallback"])
def test_a_rebuild_killed_at_any_line_leaves_the_old_or_the_new_artifact(old_and_new, tmp_path, exchange):
    source, old, new, lines, swap_start = old_and_new
    target = tmp_path / "out"
    seen = set()
    # Every one of the last 40 lines (the exchange or the two renames, removing the old artifact, the
    # cleanup), 20 spread over the fsyncs before them and 10 over the writing: SIGKILL and SIGINT alternating.
    tail = lines - 40
    points = sorted({*range(1, swap_start, max(1, swap_start // 10)),
                     *range(swap_start, tail, max(1, (tail - swap_start) // 20)), *range(tail, lines + 1)})
    for kill_at in points:
        sig = (signal.SIGKILL, signal.SIGINT)[kill_at % 2]
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        status = wait(child(source, target, kill_at, sig, exchange))
        assert status == (-signal.SIGKILL if sig == signal.SIGKILL else 130), f"line {kill_at}: status {status}"
        if sig == signal.SIGINT:
            assert staging_left(tmp_path) == [], f"line {kill_at}: SIGINT left {staging_left(tmp_path)}"
        output_dir.clean_stale(target)      # what the next write does first (the fallback's backup comes back)
        assert staging_left(tmp_path) == [], f"line {kill_at}: {staging_left(tmp_path)} left after clean_stale"
        seen.add(check_whole(target, old, new))
    assert seen == {"old", "new"}       # the kills landed on both sides of the swap


def test_a_rebuild_killed_after_a_random_delay(old_and_new, tmp_path):
    source, old, new, _, _ = old_and_new
    target = tmp_path / "out"
    t0 = time.perf_counter()
    assert wait(child(source, tmp_path / "timing")) == 0
    whole_run = time.perf_counter() - t0
    rng = random.Random(0)
    for sig in (signal.SIGKILL, signal.SIGINT) * 4:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        pid = child(source, target)
        time.sleep(rng.uniform(0.0, 1.0) * whole_run)
        os.kill(pid, sig)
        wait(pid)
        output_dir.clean_stale(target)
        check_whole(target, old, new)
        assert staging_left(tmp_path) == [], staging_left(tmp_path)


def test_the_next_write_removes_what_a_killed_one_left(old_and_new, tmp_path):
    source, old, new, _, swap_start = old_and_new
    target = tmp_path / "out"
    # killed as the swap begins: the staging folder is whole and stays behind
    assert wait(child(source, target, swap_start, signal.SIGKILL)) == -signal.SIGKILL
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
