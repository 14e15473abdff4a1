"""What the GPU-against-CPU tests of a whole plan share: the logits' error measure, a prefill's
logits read back from either executor, and the CPU's greedy tokens that no fp16 near-tie can flip."""

import numpy as np
from near_tie import clear_prefix

from grokc.runner import Runner, SamplingParams

TOL = 3e-2   # GPU and CPU logits agree to this fraction of their RMS (max over every entry)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.sqrt((b ** 2).mean()))


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
