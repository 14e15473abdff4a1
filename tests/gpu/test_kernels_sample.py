"""The sample kernels against the numpy oracle (``runner/cpu.py``): same token, same state.

Every rule runs every case: the one-block kernel and, on sm_90+, the cluster kernel (8 blocks a row,
each with a slice; V = 300 leaves five of them empty, odd V takes the unaligned paths).

Greedy must match exactly, ties included (lowest index). Sampled tokens must match exactly too:
``u = uniform(seed, c)`` is bit-identical on both sides, and the logits are continuous random
draws, so no kept-mass boundary falls near ``u * mass`` except with negligible probability.
State (tokens, positions, active, out_tokens, out_count) must be identical, in prefill mode
(``slot``/``n_real`` set, ``c = 0``) and decode mode (null ``slot``/``n_real``; inactive rows
untouched), with EOS and ``max_new`` stops and ``c >= max_out``.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import run_kernel, seeded

from grokc.runner.cpu import OPS
from grokc.targets import build_kernels, get_target
from grokc.targets import rules_misc as rm
from grokc.targets.archs import TARGETS
from grokc.targets.base import KernelCall

F32, I32 = np.float32, np.int32
STATE = ("tokens", "positions", "active", "out_tokens", "out_count")


@pytest.fixture(scope="module", params=[rm.sample_cluster, rm.sample_block], ids=lambda r: r.__name__)
def sampler(request, cuda_context):
    """(cubin, rule) for every sample rule this GPU runs: the cluster kernel needs sm_90."""
    major, minor = cuda_context.compute_capability
    target = get_target(f"sm{major}{minor}")
    choice = request.param(KernelCall("sample", dims={"M": 1, "V": 1000, "n_eos": 1, "max_out": 1}), target)
    if choice is None:
        pytest.skip(f"{request.param.__name__} does not run on {target.name}")
    return build_kernels([choice.kernel], target), request.param



def sample_args(rng, logits, *, batch, temperature, top_k, top_p, prefill_slot=None, n_real=0,
                active=None, max_out=64, eos=(7,), max_new=None):
    m, v = logits.shape
    out_count = rng.integers(0, 10, batch).astype(I32)
    return {
        "logits": logits.astype(F32), "M": m, "V": v,
        "slot": None if prefill_slot is None else np.array([prefill_slot], I32),
        "n_real": None if prefill_slot is None else np.array([n_real], I32),
        "temperature": np.broadcast_to(np.asarray(temperature, F32), (batch,)).copy(),
        "top_k": np.broadcast_to(np.asarray(top_k, I32), (batch,)).copy(),
        "top_p": np.broadcast_to(np.asarray(top_p, F32), (batch,)).copy(),
        "seed": rng.integers(-(2**31), 2**31 - 1, batch).astype(I32),
        "tokens": rng.integers(0, v, batch).astype(I32),
        "positions": rng.integers(0, 1000, batch).astype(I32),
        "active": np.ones(batch, I32) if active is None else np.array(active, I32),
        "out_tokens": np.full((batch, max(max_out, 1)), -5, I32),
        "out_count": out_count,
        "max_new": (np.full(batch, 1000, I32) if max_new is None else np.array(max_new, I32)),
        "eos_ids": np.array(eos, I32), "n_eos": len(eos), "max_out": max_out,
    }


def run_both(sampler, args):
    cubin, rule = sampler
    call = KernelCall("sample", dims={k: args[k] for k in ("M", "V", "n_eos", "max_out")})
    choice = rule(call, TARGETS["sm90"])
    assert choice is not None
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    OPS["sample"](want, {})
    got = run_kernel(cubin, choice.kernel, choice.grid, choice.block, choice.smem, "sample", args)
    for name in STATE:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    return got, want


@pytest.mark.parametrize("v", [128256, 49152, 1000, 1001, 300])
def test_greedy_exact_with_ties(sampler, v):
    rng = seeded("greedy", v)
    logits = rng.standard_normal((4, v)).astype(F32) * 3
    for i, row in enumerate(logits):  # a tie for the maximum: the lower index wins
        a, b = sorted(rng.choice(v, 2, replace=False))
        row[a] = row[b] = row.max() + 1 + i
    got, _ = run_both(sampler, sample_args(rng, logits, batch=4, temperature=0.0, top_k=0, top_p=1.0))
    assert (got["tokens"] == [np.argmax(r) for r in logits]).all()


SAMPLING = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 50, 1.0), (0.8, 1, 1.0), (1.0, 0, 0.9), (0.6, 40, 0.95),
    (1.0, 0, 0.5), (2.0, 1000, 0.3), (1.0, 1001, 0.0), (1.0, -3, 1.0),
]


@pytest.mark.parametrize("v", [128256, 49152, 1001, 300])
@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: "T{}_k{}_p{}".format(*p))
def test_sampled_matches_oracle(sampler, v, params):
    temperature, top_k, top_p = params
    rng = seeded("sampled", v, params)
    batch = 8
    logits = (rng.standard_normal((batch, v)) * rng.uniform(1, 4, (batch, 1))).astype(F32)
    run_both(sampler, sample_args(rng, logits, batch=batch, temperature=temperature,
                                top_k=top_k if top_k != 1001 else v, top_p=top_p))


def test_many_seeds_agree(sampler):
    """32 rows x 8 launches of plain temperature sampling: every draw identical."""
    for rep in range(8):
        rng = seeded("seeds", rep)
        logits = (rng.standard_normal((32, 49152)) * 2.5).astype(F32)
        run_both(sampler, sample_args(rng, logits, batch=32, temperature=1.0, top_k=0, top_p=1.0))


def test_decode_mode_state(sampler):
    """Inactive rows untouched; EOS and max_new stop a slot; c >= max_out leaves out_tokens alone."""
    rng = seeded("decode-state")
    batch, v = 6, 5000
    logits = rng.standard_normal((batch, v)).astype(F32)
    logits[1, 7] = 100.0                          # greedy picks EOS 7 -> active 0
    args = sample_args(rng, logits, batch=batch, temperature=[0, 0, 0, 1.0, 0.9, 0], top_k=[0, 0, 0, 20, 0, 0],
                       top_p=[1, 1, 1, 0.8, 1, 1], active=[1, 1, 0, 1, 1, 1], max_out=8,
                       max_new=[1000, 1000, 1000, 1000, 3, 1000])
    args["out_count"][:] = [0, 3, 4, 5, 2, 8]     # slot 4 reaches max_new; slot 5 has c == max_out
    got, want = run_both(sampler, args)
    for name in STATE:                             # slot 2 is inactive: nothing of it changes
        np.testing.assert_array_equal(got[name][2], args[name][2], err_msg=name)
    assert got["active"][1] == 0 and got["active"][4] == 0 and got["active"][0] == 1
    assert (got["out_tokens"][5] == -5).all()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_prefill_mode_state(sampler, temperature):
    """slot/n_real set, M == 1: c is 0 whatever out_count holds, positions = n_real."""
    rng = seeded("prefill-state", temperature)
    batch, v = 4, 128256
    logits = (rng.standard_normal((1, v)) * 3).astype(F32)
    args = sample_args(rng, logits, batch=batch, temperature=temperature, top_k=0, top_p=0.9,
                       prefill_slot=2, n_real=37, active=[0, 1, 0, 1], max_new=[5, 5, 1, 5])
    got, _ = run_both(sampler, args)
    assert got["positions"][2] == 37 and got["out_count"][2] == 1 and got["active"][2] == 0
    for b in (0, 1, 3):
        for name in STATE:
            np.testing.assert_array_equal(got[name][b], args[name][b], err_msg=f"{name}[{b}]")
