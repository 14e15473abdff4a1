"""bench/probes/trace_plan.py and bench/probes/plan_variants.py on a tiny synthetic build: what they print holds together.

trace_plan: every launch of the graph is found (the script itself fails when a block record is
missing), and per launch its first block begins no later than its last, the release is not before
its first block and its end not before the release, and launches end in graph order. plan_variants:
an identity variant compiles the same kernels and times the same graph, a real rewrite changes the
symbols it names and nothing else. Timings themselves are not asserted (they are measurements).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grokc.compiler.build import BuildOptions, build

PROBES = Path(__file__).resolve().parents[2] / "bench" / "probes"
CFG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("tools")
    (tmp / "config.json").write_text(json.dumps(CFG))
    build(tmp / "config.json", tmp / "art", BuildOptions(batch=2, buckets=(32,), max_seq=256, synthetic_seed=3))
    return tmp / "art"


def run_script(name: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, str(PROBES / name), *args], capture_output=True, text=True, cwd=PROBES)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_trace_plan_timeline_is_consistent(artifact):
    d = run_script("trace_plan.py", str(artifact), "--batch", "1", "--context", "16", "--replays", "4")
    rows = d["launches"]
    assert [r["node"] for r in rows][0] == "token_embd" and rows[-1]["node"] == "sample"
    tol = 0.05  # µs: %globaltimer of different multiprocessors
    for prev, r in zip([None, *rows[:-1]], rows):
        assert r["start"] <= r["started"] + tol and r["start"] <= r["released"] + tol <= r["end"] + 2 * tol, r
        if prev is not None:
            assert r["end"] + tol >= prev["end"], (prev["node"], r["node"])
    assert abs(d["graph_us"] - rows[-1]["end"]) < 0.1


def test_plan_variants_rewrites_only_what_it_names(artifact):
    d = run_script("plan_variants.py", str(artifact), "--batch", "1", "--context", "16", "--reps", "5", "--rounds", "2",
                   "--variant", "same=^(sample_rows_c\\d+)$=>\\1", "--variant", "no_t1=^(linear_gemv2\\w+)t1$=>\\1")
    v = d["variants"]
    assert v["base"]["changed"] == [] and v["same"]["changed"] == []
    assert v["no_t1"]["changed"] and all(s.startswith("linear_gemv2") and not s.endswith("t1")
                                         for s in v["no_t1"]["changed"])
    assert all(x["median_us"] > 0 for x in v.values())
