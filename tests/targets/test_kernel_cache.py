"""The kernel cache: a hit gives the bytes nvcc gives, without running nvcc; anything nvcc's output
depends on changes the key; off means no files; a folder it cannot write only costs the compile."""

from __future__ import annotations

import subprocess

import pytest

from grokc.targets import build_kernels, get_target, kernel_cache

KERNELS = ["linear_ref_q4_none_f16", "linear_ref_f16_none_f32"]


def no_nvcc(*args, **kwargs):
    raise AssertionError("nvcc ran on what should have been a cache hit")


@pytest.mark.usefixtures("nvcc")
def test_a_hit_is_the_compiled_bytes_and_runs_no_nvcc(monkeypatch, tmp_path):
    target = get_target("sm90")
    monkeypatch.setenv("GROKC_KERNEL_CACHE", kernel_cache.OFF)
    fresh = build_kernels(KERNELS, target)
    monkeypatch.setenv("GROKC_KERNEL_CACHE", str(tmp_path / "cache"))
    assert build_kernels(KERNELS, target) == fresh   # a miss: compiled and stored
    assert len(list((tmp_path / "cache").iterdir())) == 1
    monkeypatch.setattr(subprocess, "run", no_nvcc)
    assert build_kernels(list(reversed(KERNELS)), target) == fresh   # the same translation unit: a hit
    with pytest.raises(AssertionError, match="nvcc ran"):
        build_kernels(KERNELS, get_target("sm80"))   # another arch is another entry


def test_the_key_follows_flags_source_headers_and_nvcc(tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\n")
    headers = tmp_path / "kernels"
    headers.mkdir()
    (headers / "a.cuh").write_text("int a;\n")
    base = kernel_cache.key(str(fake), ["-O3", "--cubin"], "src", headers)
    assert kernel_cache.key(str(fake), ["-O3", "--cubin"], "src", headers) == base
    assert kernel_cache.key(str(fake), ["-O2", "--cubin"], "src", headers) != base
    assert kernel_cache.key(str(fake), ["-O3", "--cubin"], "src2", headers) != base
    other = tmp_path / "kernels2"
    other.mkdir()
    (other / "a.cuh").write_text("int b;\n")
    assert kernel_cache.key(str(fake), ["-O3", "--cubin"], "src", other) != base
    fake.write_text("#!/bin/sh\n# another nvcc\n")
    assert kernel_cache.key(str(fake), ["-O3", "--cubin"], "src", headers) != base


def test_off_writes_nothing_and_an_unwritable_folder_is_a_miss(monkeypatch, tmp_path):
    monkeypatch.setenv("GROKC_KERNEL_CACHE", kernel_cache.OFF)
    kernel_cache.put("k", b"data")
    assert kernel_cache.get("k") is None
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GROKC_KERNEL_CACHE", str(blocker / "cache"))
    kernel_cache.put("k", b"data")
    assert kernel_cache.get("k") is None
    monkeypatch.setenv("GROKC_KERNEL_CACHE", str(tmp_path / "cache"))
    kernel_cache.put("k", b"data")
    assert kernel_cache.get("k") == b"data" and [p.name for p in (tmp_path / "cache").iterdir()] == ["k"]
