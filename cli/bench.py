"""``grokc bench``: the artifact's speed on this GPU, beside PyTorch on the same shapes, as JSON.

Measured on the runner (CUDA graphs, no torch in the timed path): load time, time to first token,
prefill ms per bucket, decode ms per step at batch 1 and at the build's batch. Every decode
figure comes with the bytes a step must read (every weight the decode graph touches once, one
embedding row per slot, the KV cache up to the context) and the bandwidth that implies, as a
fraction of the card's device-to-device copy bandwidth measured in the same run (the roofline).
The baselines (``cli/baselines.py``: decode steps, and a prompt of the largest bucket's length for dense
models) run in the same process, after the artifact; the time to first token is also taken for a
prompt of each bucket's length.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from grokc.artifacts.plan import Plan
from grokc.core.config import ModelConfig
from grokc.runner import Runner, SamplingParams

Progress = Callable[[str], None]


def experts_read(plan: Plan, batch: int, graph: str | None = None) -> tuple[int, int]:
    """``(experts a decode step of ``batch`` rows reads, experts stacked)`` of the plan's MoE layers:
    each row's ``top_k`` routed experts, ``min(E, batch * top_k)`` when the rows choose different
    ones (exact at batch 1), plus the shared chunks every row uses; ``(0, 0)`` without experts."""
    route = next((l for l in plan.graphs[graph or f"decode_{batch}"].launches if l.op == "moe_route"), None)
    if route is None:
        return 0, 0
    e, k, c = (int(route.arg(p).value) for p in ("n_experts", "top_k", "n_shared"))
    return min(e, batch * k) + c, e + c


def decode_bytes(plan: Plan, weights: dict[str, int], cfg: ModelConfig, batch: int, context: int,
                 graph: str | None = None) -> int:
    """Bytes one decode step of ``batch`` requests must read, run by ``graph`` (default
    ``decode_{batch}``; a ``--deterministic`` plan has only ``decode_B``): its weights once (one
    embedding row per slot: of the table and of its scales and zeros when quantized; one row of the RoPE table per attention launch; the q4
    codes ``mlp_decode`` reads from its tiles, packed from the weights at load; of stacked experts,
    the ones ``experts_read`` counts) + the KV cache."""
    total = 0
    read, stacked = experts_read(plan, batch, graph)
    for launch in plan.graphs[graph or f"decode_{batch}"].launches:
        if launch.op == "mlp_decode":
            total += sum(plan.buffers[launch.arg(p).buffer].nbytes for p in ("gate_up_tiles", "down_tiles"))
        for arg in launch.args:
            if arg.weight is None:
                continue
            if launch.op == "moe_linear":  # the chosen experts' slices of the stacked weights
                total += weights[arg.weight] // stacked * read
            elif launch.op == "embedding":   # every embedding weight has one row per token of the vocabulary
                total += batch * (weights[arg.weight] // cfg.vocab_size)
            elif arg.param == "rope_table":  # (cos, sin) at the step's position: one row of table_len
                total += weights[arg.weight] // int(launch.arg("table_len").value)
            else:
                total += weights[arg.weight]
    kv = cfg.num_layers * 2 * batch * context * cfg.kv_dim * 2
    return total + kv


def _time(fn: Callable[[], None], sync: Callable[[], None], steps: int) -> float:
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e3 / steps


def profile_launches(runner: Runner, prompt: list[int], steps: int, out: Path, progress: Progress) -> None:
    """Per-launch times of ``steps`` replays of the first bucket's prefill and of the full-batch decode
    graph (``serve/profile.py``), as a Chrome trace in ``out`` and a top-N table."""
    from grokc.serve.profile import LaunchProfiler

    engine = runner.engine
    engine.profiler = profiler = LaunchProfiler(runner.plan, steps)
    slots = []
    try:
        for _ in range(engine.shapes.batch):
            slots.append(engine.add(prompt[:engine.shapes.buckets[0]], SamplingParams(max_new_tokens=steps + 1)))
        engine.decode(steps)
        runner.executor.synchronize()
    finally:
        engine.profiler = None
        for s in slots:
            engine.release(s)
    profiler.write(out)
    progress(f"wrote the per-launch profile to {out}\n{profiler.table()}")


def bench_artifact(path: Path, steps: int = 100, context: int = 128, baselines: bool = True,
                   progress: Progress = lambda s: None, profile: Path | None = None) -> dict:
    t0 = time.perf_counter()
    runner = Runner(path, device="cuda")
    load_s = time.perf_counter() - t0
    manifest, plan, ex, engine = runner.artifact.manifest, runner.plan, runner.executor, runner.engine
    cfg = manifest.model
    batch, buckets = manifest.shapes.batch, manifest.shapes.buckets
    sizes = {n: a.nbytes for n, a in {**runner.artifact.weights(), **runner.artifact.synthetic()}.items()}
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, cfg.vocab_size - 100, context)]

    ttft_ms = _first_token_ms(engine, prompt, tries=1)   # the first request after load

    prefill, ttft_by_prompt = {}, {}
    for L in buckets:
        slot = engine.add(prompt[:1] * L, SamplingParams(max_new_tokens=1), bucket=L)
        prefill[L] = _time(lambda: ex.replay(f"prefill_{L}"), ex.synchronize, max(3, steps // 10))
        engine.release(slot)
        ttft_by_prompt[L] = _first_token_ms(engine, [int(t) for t in rng.integers(100, cfg.vocab_size - 100, L)])

    decode = {}
    for b in sorted({1, batch}):
        progress(f"grokc decode at batch {b}")
        slots = [engine.add(prompt, SamplingParams(max_new_tokens=steps + 16)) for _ in range(b)]
        graph = engine.decode_graph()
        ms = _time(lambda: engine.decode(1), ex.synchronize, steps)
        still_active = int(engine.active()[slots].sum())
        for s in slots:
            engine.release(s)
        nbytes = decode_bytes(plan, sizes, cfg, b, context + steps // 2, graph)
        decode[b] = {"graph": graph, "ms_per_step": ms, "bytes_per_step": nbytes, "GBps": nbytes / (ms * 1e-3) / 1e9,
                     "slots_active_at_end": still_active}
    result = {
        "artifact": str(path), "device": runner.executor.ctx.name, "arch": runner.backend.arch,
        "model": {k: getattr(cfg, k) for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                                  "intermediate_size", "vocab_size")},
        "quant": manifest.quant.name, "synthetic_weights": runner.synthetic,
        "context": context, "steps": steps,
        "grokc": {"load_s": load_s, "ttft_ms": ttft_ms, "ttft_ms_by_prompt": ttft_by_prompt, "prefill_ms": prefill,
                  "decode": decode},
    }
    if profile is not None:
        profile_launches(runner, prompt, min(steps, 20), profile, progress)
    runner.executor.close()
    if baselines:
        from grokc.cli.baselines import copy_bandwidth_gbps, decode_baselines

        bw = copy_bandwidth_gbps()
        result["copy_bandwidth_GBps"] = bw
        for b, d in decode.items():
            d["roofline_fraction"] = d["GBps"] / bw
            d["roofline_ms"] = d["bytes_per_step"] / (bw * 1e9) * 1e3
        result["torch"] = {}
        for b in decode:
            progress(f"torch baselines at batch {b}")
            base = decode_baselines(cfg, b, manifest.shapes.max_seq, context + steps // 2, steps)
            result["torch"][b] = base
            decode[b]["speedup"] = {k: v / decode[b]["ms_per_step"] for k, v in base.items()}
        if cfg.moe is None:
            from grokc.cli.baselines import prefill_baselines

            L = max(buckets)
            progress(f"torch prefill of {L} tokens")
            result["torch_prefill"] = {L: prefill_baselines(cfg, manifest.shapes.max_seq, L, max(3, steps // 10))}
    return result


def _first_token_ms(engine, prompt: list[int], tries: int = 5) -> float:
    """Median ms from handing the engine ``prompt`` to holding its first token (host work included)."""
    times = []
    for _ in range(tries):
        t0 = time.perf_counter()
        slot = engine.add(prompt, SamplingParams(max_new_tokens=1))
        engine.tokens(slot)
        times.append((time.perf_counter() - t0) * 1e3)
        engine.release(slot)
    return float(np.median(times))
