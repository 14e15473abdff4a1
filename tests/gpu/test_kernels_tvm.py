"""Apache TVM's ``linear`` kernels (``targets/rules_tvm.py``) against the numpy oracle, on the GPU.

Each case of ``bench/tvm_cases.py`` (every call ``bench/kernels_tvm.py`` times, and odd shapes no
tile divides: M = 1, 16, 17, 33, 64, 100, 130; K = 64 .. 8192; f16 / int4 per channel with and
without zeros; f16 / f32 out; with and without a residual) is selected with ``--kernels tvm``
(``linear.tvm_gemv`` at M = 1, ``linear.tvm_gemm`` from M = 16), compiled by our nvcc step for this
GPU, launched through the op's own parameter list on NaN-poisoned ``out``, and compared with
``OPS["linear"]`` (``runner/cpu.py``) in fp32:

    ||got - want|| / ||want|| <= 2e-3,   max |got - want| <= 20 * 2e-3 * rms(want)

(x and the codes minus their integer zero are exact in f16 and the sums fp32: the error is the f16
rounding of the output, 2**-11, and the order of the sums). Also that ``out`` aliasing ``residual``
gives the same. And a tiny synthetic Llama built with ``--kernels tvm`` (``tvm_cases.tiny_tvm_build``:
TVM's kernels in every prefill bucket and in ``decode_1``, between our kernels in one CUDA graph)
gives the CPU executor's logits to ``plan_compare.TOL`` in every bucket and teacher-forced decode.
A GPU node has no TVM: the kernels come from ``$GROKC_TVM_KERNELS``
(``bench/tvm_kernels_gen.py``, scripts/device_tvm.sh); without TVM or that folder the tests skip.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from kernel_harness import Launch, Shared, run_chain, run_kernel
from plan_compare import TOL as PLAN_TOL
from plan_compare import prefill_logits, rel_err

from grokc.runner import Runner
from grokc.runner.cpu import OPS
from grokc.targets import build_kernels, get_target, rules_tvm, select

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tvm_cases import BENCH, ODD, TINY_BUCKETS, Case, host_args, tiny_tvm_build  # noqa: E402

TOL = 2e-3
CASES = list(dict.fromkeys(ODD + BENCH))


def _tvm_available() -> bool:
    if os.environ.get(rules_tvm.KERNELS_ENV):
        return True
    try:
        import tvm  # noqa: F401
    except ImportError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _tvm_available(), reason=f"neither Apache TVM nor ${rules_tvm.KERNELS_ENV}")


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), f"{what}: {np.isnan(got).sum()} of {got.size} outputs unwritten or NaN"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    rms = np.sqrt(np.mean(want**2))
    assert err <= TOL, f"{what}: relative error {err:.2e} > {TOL:.0e}"
    assert np.abs(got - want).max() <= 20 * TOL * rms, f"{what}: max error {np.abs(got - want).max():.3e}"


def launch(c: Case, sm: int, args: dict) -> dict:
    target = dataclasses.replace(get_target(f"sm{sm}"), kernels="tvm")
    choice = select(c.call(), target)
    assert choice.rule == ("linear.tvm_gemv" if c.m == 1 else "linear.tvm_gemm") and choice.kernel == c.symbol
    cubin = build_kernels([choice.kernel], target)
    return run_kernel(cubin, choice.kernel, choice.grid, choice.block, choice.smem, "linear", args)


def oracle(c: Case, args: dict) -> np.ndarray:
    ref = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in args.items()}
    OPS["linear"](ref, c.attrs)
    return ref["out"].astype(np.float64)


@pytest.mark.parametrize("c", CASES, ids=[f"{c.name}-m{c.m}n{c.n}k{c.k}-{c.wf}-{c.out}{'-z' if c.zeros else ''}"
                                         f"{'-res' if c.residual else ''}" for c in CASES])
def test_tvm_kernel_matches_the_oracle(c, sm):
    args = host_args(c, seed=1)
    check(launch(c, sm, args)["out"], oracle(c, args), c.symbol)


@pytest.mark.parametrize("c", [c for c in ODD if c.residual and c.out == "f16"][:2], ids=lambda c: c.symbol)
def test_out_may_alias_residual(c, sm):
    """The op lets ``out`` be ``residual`` (o and down add into the hidden state in place)."""
    args = host_args(c, seed=2)
    want = oracle(c, args)
    target = dataclasses.replace(get_target(f"sm{sm}"), kernels="tvm")
    choice = select(c.call(), target)
    cubin = build_kernels([choice.kernel], target)
    shared = {"h": args["residual"].copy()}
    got = run_chain([Launch(cubin, choice.kernel, choice.grid, choice.block, choice.smem, "linear",
                            {**args, "out": Shared("h"), "residual": Shared("h")})], shared)
    check(got["h"], want, c.symbol + " (out = residual)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, sm):
    path = tiny_tvm_build(tmp_path_factory.mktemp("tvm-tiny"), f"sm{sm}")
    return Runner(path, device="cuda"), Runner(path, device="cpu")


def test_a_tvm_build_runs_on_the_gpu_as_on_the_cpu(tiny):
    gpu, cpu = tiny
    rules = {launch.rule for g in gpu.plan.graphs.values() for launch in g.launches}
    assert {"linear.tvm_gemv", "linear.tvm_gemm"} <= rules
    rng = np.random.default_rng(0)
    for bucket in TINY_BUCKETS:
        for n in (5, bucket):
            ids = [int(t) for t in rng.integers(3, 1000, n)]
            assert rel_err(prefill_logits(gpu, ids, bucket), prefill_logits(cpu, ids, bucket)) < PLAN_TOL
    seqs = [[int(t) for t in rng.integers(3, 1000, n)] for n in (40, 23, 9)]   # 3 sequences > batch 2
    for g, c in zip(gpu.engine.score(seqs), cpu.engine.score(seqs)):
        assert rel_err(g, c) < PLAN_TOL
