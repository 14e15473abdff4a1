"""What the GPU-against-CPU tests of a whole plan share: the logits' error measure and a prefill's
logits read back from either executor."""

import numpy as np

from grokc.runner import Runner, SamplingParams

TOL = 3e-2   # GPU and CPU logits agree to this fraction of their RMS (max over every entry)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.sqrt((b ** 2).mean()))


def prefill_logits(r: Runner, ids: list[int], bucket: int) -> np.ndarray:
    slot = r.engine.add(ids, SamplingParams(max_new_tokens=1), bucket=bucket)
    out = r.executor.read(r.plan.graphs[f"prefill_{bucket}"].logits)[0].copy()
    r.engine.release(slot)
    return out
