"""scripts/perf_table.py: README's and docs/performance.md's performance table is what the script makes
of bench/results/*.json (so the pages cannot drift from the JSON), and the table follows the JSON.

The expected rows below are written out by hand from the numbers put into the JSON, not taken from
the script's own formatting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import perf_table  # scripts/, on the path by conftest.py
import pytest


def between_markers(text: str) -> str:
    return text.split(perf_table.BEGIN, 1)[1].split(perf_table.END, 1)[0].strip("\n")


def bench(ms1: float, ms_b: float, batch: int, compile1: float, compile_b: float) -> dict:
    """A grokc bench document (cli/bench.py's fields) with the derived fields filled as it fills them."""
    bw, nbytes = 4000.0, 1.0e9
    decode = {}
    for b, ms, base in ((1, ms1, compile1), (batch, ms_b, compile_b)):
        gbps = nbytes / (ms * 1e-3) / 1e9
        decode[str(b)] = {"ms_per_step": ms, "bytes_per_step": nbytes, "GBps": gbps, "slots_active_at_end": b,
                          "roofline_fraction": gbps / bw, "roofline_ms": nbytes / (bw * 1e9) * 1e3,
                          "speedup": {"eager_fp16": 10.0 / ms, "eager_cudagraph_fp16": 2.0 / ms,
                                      "compile_cudagraph_fp16": base / ms}}
    return {"device": "NVIDIA H200", "arch": "sm90", "quant": "int4", "synthetic_weights": True, "context": 128,
            "steps": 100, "copy_bandwidth_GBps": bw,
            "grokc": {"load_s": 0.5, "ttft_ms": 3.25, "prefill_ms": {"512": 7.0, "128": 3.0}, "decode": decode},
            "torch": {"1": {"eager_fp16": 10.0, "eager_cudagraph_fp16": 2.0, "compile_cudagraph_fp16": compile1},
                      str(batch): {"eager_fp16": 12.0, "eager_cudagraph_fp16": 2.5, "compile_cudagraph_fp16": compile_b}}}


def write(folder: Path, name: str, date: str, models: dict, note: str | None = None) -> None:
    run = {"date": date, "device": "NVIDIA H200", "commit": None, "command": "bench/run_bench.py"}
    if note:
        run["note"] = note
    (folder / name).write_text(json.dumps({"run": run, "models": models}))


@pytest.mark.parametrize("page", perf_table.PAGES, ids=lambda p: p.name)
def test_the_pages_hold_the_table_of_the_bench_results(page):
    assert between_markers(page.read_text()) == perf_table.render(perf_table.load())


def test_check_mode_finds_nothing_stale_and_changes_nothing():
    before = [p.read_text() for p in perf_table.PAGES]
    assert perf_table.main(["--check"]) == 0
    assert [p.read_text() for p in perf_table.PAGES] == before


def test_a_row_shows_the_json_values_with_machine_and_date(tmp_path):
    write(tmp_path, "a.json", "2026-12-24", {"llama1b": bench(0.5, 0.6, 4, 1.0, 1.2)}, note="a test run")
    block = perf_table.render(perf_table.load(tmp_path))
    lines = block.splitlines()
    assert ("| Llama-3.2-1B shape, synthetic weights | int4 | NVIDIA H200, 2026-12-24 | 0.500 ms/step "
            "| 50.0 % (0.250 ms) | 1.000 ms | 2.00x | B=4: 0.600 ms, 2.00x |") in lines
    assert ("| Llama-3.2-1B shape, synthetic weights | 128: 3.00 ms, 512: 7.00 ms | 0.50 s | 3.25 ms | 10.0 ms "
            "| 2.000 ms | 4000 GB/s |") in lines
    assert "`bench/results/a.json`: `bench/run_bench.py`; a test run." in lines


def test_the_newest_run_of_each_model_gives_its_row(tmp_path):
    write(tmp_path, "old.json", "2026-11-01", {"llama1b": bench(0.9, 1.0, 8, 1.8, 2.0),
                                               "smollm2": bench(0.45, 0.5, 4, 1.0, 1.1)})
    write(tmp_path, "new.json", "2026-12-01", {"llama1b": bench(0.45, 0.6, 8, 1.8, 1.8)})
    rows = [ln for ln in perf_table.render(perf_table.load(tmp_path)).splitlines() if "ms/step" in ln]
    assert [r.split(" | ")[0] for r in rows] == ["| Llama-3.2-1B shape, synthetic weights", "| SmolLM2-135M-Instruct, synthetic weights"]
    assert "NVIDIA H200, 2026-12-01 | 0.450 ms/step" in rows[0] and "B=8: 0.600 ms, 3.00x" in rows[0]
    assert "NVIDIA H200, 2026-11-01 | 0.450 ms/step" in rows[1] and "B=4: 0.500 ms, 2.20x" in rows[1]


def test_the_table_changes_when_the_json_changes(tmp_path):
    shutil.copytree(perf_table.RESULTS, tmp_path / "results")
    path = sorted((tmp_path / "results").glob("*.json"))[-1]   # the newest run: its rows are the ones shown
    doc = json.loads(path.read_text())
    model = next(iter(doc["models"].values()))
    model["grokc"]["decode"]["1"]["ms_per_step"] = 0.3217
    path.write_text(json.dumps(doc))
    block = perf_table.render(perf_table.load(tmp_path / "results"))
    assert block != between_markers(perf_table.PAGES[0].read_text())
    assert "| 0.322 ms/step |" in block


def test_splice_replaces_only_the_block_and_needs_both_markers():
    page = f"# t\nbefore\n{perf_table.BEGIN}\nold\n{perf_table.END}\nafter\n"
    assert perf_table.splice(page, "new") == f"# t\nbefore\n{perf_table.BEGIN}\nnew\n{perf_table.END}\nafter\n"
    with pytest.raises(SystemExit, match="needs one"):
        perf_table.splice("no markers here", "new")
