"""What the GPU-against-CPU tests of a whole plan share: the logits' error measure and its bound, a
prefill's logits read back from either executor, and the CPU's greedy tokens that no fp16 near-tie
can flip."""

from typing import Callable

import numpy as np
from near_tie import clear_prefix

from grokc.runner import Runner, SamplingParams

TOL = 3e-2   # GPU and CPU logits agree to this fraction of their RMS (max over every entry)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.sqrt((b ** 2).mean()))


SPREAD_FACTOR = 3   # the GPU rounds at more points than the weight noise models (attention operands, half2 sums)


def rounding_spread(cpu: Runner, measure: Callable[[Runner], np.ndarray], clean: np.ndarray | None = None,
                    seed: int = 0) -> float:
    """How far f16-level rounding moves this model's output, measured on the CPU executor alone:
    ``rel_err`` of ``measure(cpu)`` with every linear's weight times ``1 + u`` (``u`` uniform in
    +-2**-11, half an f16 ulp: what the GPU's f16 products of weights and norm weights round by)
    against the clean output (``clean``, when the caller has it). A model whose logits amplify rounding
    (Gemma-3-270M's int4 build: 1.7-2.7 % of their RMS) earns a wider bound than the fixed ``TOL``; a
    wrong kernel is off by O(1)."""
    clean = measure(cpu) if clean is None else clean
    dense = cpu.executor._dense                     # the executor's cache of f32 linear weights
    saved = dict(dense)
    rng = np.random.default_rng(seed)
    try:
        for key, w in saved.items():
            dense[key] = w * (1 + rng.uniform(-2.0 ** -11, 2.0 ** -11, w.shape).astype(np.float32))
        return rel_err(measure(cpu), clean)
    finally:
        dense.clear()
        dense.update(saved)


def assert_close(gpu_out: np.ndarray, cpu_out: np.ndarray, cpu: Runner, measure: Callable[[Runner], np.ndarray]):
    """GPU within ``TOL`` of the CPU, or, where not, within ``SPREAD_FACTOR`` times the model's own
    ``rounding_spread`` (measured only then: it costs one more CPU run)."""
    err = rel_err(gpu_out, cpu_out)
    if err < TOL:
        return
    spread = rounding_spread(cpu, measure, cpu_out)
    assert err < SPREAD_FACTOR * spread, f"GPU vs CPU {err:.4f} of the logits' RMS; rounding spread {spread:.4f}"


def prefill_logits(r: Runner, ids: list[int], bucket: int) -> np.ndarray:
    slot = r.engine.add(ids, SamplingParams(max_new_tokens=1), bucket=bucket)
    out = r.executor.read(r.plan.graphs[f"prefill_{bucket}"].logits)[0].copy()
    r.engine.release(slot)
    return out


def clear_greedy(cpu: Runner, ids: list[int], n_new: int) -> list[int]:
    """The CPU executor's first greedy tokens after ``ids`` (of ``n_new``) up to the first whose top-1
    lead is under ``2 * TOL`` of the step's logit RMS. Where the GPU's logits are within ``TOL`` of
    the CPU's (the tests' logit checks), none of these choices can flip, so the GPU must produce
    exactly them; past a near-tie a different token is rounding, not an error."""
    want = cpu.generate_ids([ids], SamplingParams(max_new_tokens=n_new))[0]
    steps = cpu.engine.score([ids + want])[0][len(ids) - 1:len(ids) - 1 + len(want)]
    return want[:clear_prefix(steps, TOL)]
