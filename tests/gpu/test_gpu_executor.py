"""The CUDA driver wrapper and the GPU executor, on stand-in kernels compiled here with nvcc.

No compiler or artifact is involved: the kernels below are tiny and exact (integer arithmetic),
and the executor's kernels have the parameter lists of real ABI ops (``take_last``, ``linear``)
and read buffers of those ops' dtypes and sizes (f16 buffers carry 16-bit integers), so that a
hand-written ``Plan`` passes ``Plan.validate``. What is checked:

- ``cuda_driver``: launches, a graph of 3 dependent kernel nodes, replaying it twice, events;
- ``GpuExecutor``: replay runs launches in order (a dependent chain), replaying twice applies the
  graph twice, write/read round trips (whole buffer, sub-arrays, f16), i32 and f32 scalars arrive
  bit-exact, null pointers arrive as 0 and buffer/weight pointers as their addresses, grid/block
  and >48 KB dynamic shared memory are honoured, weights are 256-byte aligned;
- ``check_device`` refuses a wrong arch in one line; a missing kernel or a kernel whose parameters
  don't match the ABI is an ``ArtifactError``;
- ``kernel_harness.run_kernel`` itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import find_nvcc, nvcc_cubin, run_kernel

from grokc.abi.ops import ArgKind, Param
from grokc.artifacts.plan import Arg, Buffer, BufferKind, GraphPlan, Launch, Plan
from grokc.core.errors import ArtifactError, TargetError
from grokc.runner import cuda_driver as cd
from grokc.runner.gpu import GpuExecutor, check_device

SOURCE = r"""
extern "C" __global__ void add_one(int* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

extern "C" __global__ void scale_add(float* p, float s, int n) {   // p = p * s + 1
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * s + 1.0f;
}

// take_last's ABI (out, x, n_real, hidden) on f16 buffers read as 16-bit integers; stand-in
// semantics: out = 3 * out + x + n_real[0] (mod 2^16).
extern "C" __global__ void fake_take_last(unsigned short* out, const unsigned short* x, const int* n_real, int hidden) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;   // no grid-stride loop: the grid must cover
    if (i < hidden) out[i] = (unsigned short)(3 * out[i] + x[i] + n_real[0]);
}

// linear's ABI; records what arrived: null flags, scalars, eps's bits, x[0] through the far end
// of the dynamic shared memory, weight[0], the dynamic smem size, and two pointers' values.
extern "C" __global__ void probe_linear(int* out, const int* x, const int* weight,
                                        const void* scales, const void* zeros, const void* norm,
                                        const void* residual, const void* addend, const void* bias, int M, int N, int K,
                                        int group_size, float eps) {
    extern __shared__ int smem[];
    unsigned dyn;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        volatile int* s = smem;
        s[dyn / 4 - 1] = x[0];
        out[0] = scales == nullptr; out[1] = zeros == nullptr;
        out[2] = norm == nullptr;   out[3] = residual == nullptr;
        out[4] = M; out[5] = N; out[6] = K; out[7] = group_size;
        out[8] = __float_as_int(eps);
        out[9] = s[dyn / 4 - 1];
        out[10] = weight[0];
        out[11] = (int)dyn;
        unsigned long long r = (unsigned long long)residual, w = (unsigned long long)weight;
        out[12] = (int)(unsigned)(r & 0xffffffffu); out[13] = (int)(unsigned)(r >> 32);
        out[14] = (int)(unsigned)(w & 0xffffffffu); out[15] = (int)(unsigned)(w >> 32);
    }
}
"""

HIDDEN = 50           # elements the chain kernels touch (of 64): grid (2,) x block (32,) covers 64
PROBE_SMEM = 64 * 1024  # past the 48 KB default: the executor must raise the kernel's limit
# valid for the plan check: out = probe (32 f16 = the 16 words written), x = c (64 f16), weight N x K f16
SCALARS = {"M": 1, "N": 32, "K": 64, "group_size": 0, "eps": 1e-6}


@pytest.fixture(scope="module")
def arch(cuda_context) -> str:
    major, minor = cuda_context.compute_capability
    return f"sm{major}{minor}"


@pytest.fixture(scope="module")
def cubin(arch) -> bytes:
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    return nvcc_cubin(SOURCE, arch="sm_" + arch[2:])


def _i32_words(addr: int) -> list[int]:
    lo, hi = addr & 0xFFFFFFFF, addr >> 32
    return [int(np.uint32(lo).view(np.int32)), int(np.uint32(hi).view(np.int32))]


# -- cuda_driver directly ----------------------------------------------------------------------

ADD_ONE = (Param("p", ArgKind.PTR), Param("n", ArgKind.I32))
SCALE_ADD = (Param("p", ArgKind.PTR), Param("s", ArgKind.F32), Param("n", ArgKind.I32))


def test_driver_launch_and_graph_replay(cuda_context, cubin):
    n = 100
    ints = np.arange(n, dtype=np.int32) * 7 - 300
    floats = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    with cd.Module(cubin) as module, cd.Stream() as stream, \
            cd.DeviceBuffer(ints.nbytes) as pi, cd.DeviceBuffer(floats.nbytes) as pf:
        pi.upload(ints)
        pf.upload(floats)
        add_one, scale_add = module.function("add_one"), module.function("scale_add")
        grid, block = (1, 1, 1), (128, 1, 1)

        cd.launch(add_one, grid, block, 0, cd.pack_args(ADD_ONE, [pi.ptr, n]), stream)
        stream.synchronize()
        np.testing.assert_array_equal(pi.download().view(np.int32), ints + 1)

        graph = cd.Graph([
            cd.KernelLaunch(add_one, grid, block, 0, cd.pack_args(ADD_ONE, [pi, n])),
            cd.KernelLaunch(scale_add, grid, block, 0, cd.pack_args(SCALE_ADD, [pf, 2.5, n])),
            cd.KernelLaunch(add_one, grid, block, 0, cd.pack_args(ADD_ONE, [pi, n])),
        ])
        start, end = cd.Event(), cd.Event()
        start.record(stream)
        graph.launch(stream)
        graph.launch(stream)
        end.record(stream)
        assert start.elapsed_ms(end) >= 0.0
        stream.synchronize()
        np.testing.assert_array_equal(pi.download().view(np.int32), ints + 1 + 4)
        want = floats
        for _ in range(2):
            want = want * np.float32(2.5) + np.float32(1.0)
        np.testing.assert_allclose(pf.download().view(np.float32), want, rtol=1e-6)
        graph.close()
        start.close()
        end.close()


def test_driver_errors_name_the_call(cuda_context, cubin):
    with cd.Module(cubin) as module:
        want = r"cuModuleGetFunction\('no_such_kernel'\) failed: CUDA_ERROR_NOT_FOUND"
        with pytest.raises(cd.CudaError, match=want):
            module.function("no_such_kernel")


def test_param_sizes(cuda_context, cubin):
    with cd.Module(cubin) as module:
        sizes = module.function("probe_linear").param_sizes()
        if sizes is None:
            pytest.skip("the driver cannot report kernel parameter sizes")
        assert sizes == (8,) * 9 + (4,) * 5   # linear's 9 pointers, then M, N, K, group_size, eps
        assert module.function("add_one").param_sizes() == (8, 4)


# -- the executor ------------------------------------------------------------------------------


def _buffers() -> dict[str, Buffer]:
    specs = [("a", BufferKind.IO, "float16", (64,)), ("b", BufferKind.SCRATCH, "float16", (64,)),
             ("c", BufferKind.SCRATCH, "float16", (64,)), ("n", BufferKind.IO, "int32", (1,)),
             ("probe", BufferKind.SCRATCH, "float16", (32,)), ("d", BufferKind.SCRATCH, "float16", (64,)),
             ("grid2", BufferKind.IO, "int32", (3, 4)), ("h", BufferKind.IO, "float16", (2, 5))]
    return {name: Buffer(name, kind, dtype, shape, 256 * i)
            for i, (name, kind, dtype, shape) in enumerate(specs)}


def _take_last(out: str, x: str, hidden: int, node: str, kernel: str = "fake_take_last") -> Launch:
    args = (Arg("out", buffer=out), Arg("x", buffer=x), Arg("n_real", buffer="n"),
            Arg("hidden", value=hidden))
    return Launch("take_last", kernel, (2, 1, 1), (32, 1, 1), 0, args, node=node)


def _probe() -> Launch:
    args = (Arg("out", buffer="probe"), Arg("x", buffer="c"), Arg("weight", weight="w.probe"),
            Arg("scales"), Arg("zeros"), Arg("norm"), Arg("residual", buffer="a"), Arg("addend"), Arg("bias"),
            *(Arg(name, value=v) for name, v in SCALARS.items()))
    attrs = {"weight_format": "f16", "act": "none", "out_dtype": "f16", "x_dtype": "f16", "residual_dtype": "f16"}
    return Launch("linear", "probe_linear", (1, 1, 1), (32, 1, 1), PROBE_SMEM, args, attrs, node="probe")


def _plan(arch: str, chain_kernel: str = "fake_take_last") -> Plan:
    chain = GraphPlan("chain", 1, (_take_last("b", "a", HIDDEN, "b", chain_kernel),
                                   _take_last("c", "b", HIDDEN, "c"), _probe()), logits="probe")
    other = GraphPlan("other", 1, (_take_last("d", "a", 8, "d"),), logits="d")
    buffers = _buffers()
    plan = Plan(arch, 256 * len(buffers), buffers, {"chain": chain, "other": other})  # the last one ends in it
    plan.validate()
    return plan


WEIGHTS = {
    "w.f16": np.arange(5, dtype=np.float16) / 3,   # 10 bytes: the next weight must still be aligned
    "w.probe": (np.arange(SCALARS["N"] * SCALARS["K"]) % 1000).astype(np.float16),
    "w.u8": (np.arange(300) % 251).astype(np.uint8),
}


@pytest.fixture
def executor(arch, cubin):
    ex = GpuExecutor(_plan(arch), WEIGHTS, cubin)
    yield ex
    ex.close()


def test_replay_runs_launches_in_order_and_twice_applies_twice(executor):
    a = np.random.default_rng(2).integers(0, 1000, 64).astype(np.uint16)
    executor.write("a", a.view(np.float16))
    executor.write("n", np.array([5], np.int32))
    b, c = np.zeros(64, np.uint16), np.zeros(64, np.uint16)   # uint16 arithmetic wraps as the kernel's
    for replay in range(3):
        executor.replay("chain")
        b[:HIDDEN] = 3 * b[:HIDDEN] + a[:HIDDEN] + 5   # each step sees the previous one's output
        c[:HIDDEN] = 3 * c[:HIDDEN] + b[:HIDDEN] + 5
        if replay == 1:
            executor.synchronize()
            np.testing.assert_array_equal(executor.read("b").view(np.uint16), b)
    np.testing.assert_array_equal(executor.read("b").view(np.uint16), b)  # past HIDDEN stays 0: the grid was (2,)x(32,)
    np.testing.assert_array_equal(executor.read("c").view(np.uint16), c)
    assert executor.read("probe").view(np.int32)[9] == c[:2].view(np.int32)[0]  # the third launch ran after the second
    assert not executor.read("d").any()  # another graph's buffer is untouched


def test_scalars_nulls_pointers_and_smem_arrive(executor):
    executor.write("n", np.array([0], np.int32))
    executor.replay("chain")
    probe = executor.read("probe").view(np.int32)
    want = [1, 1, 1, 0, SCALARS["M"], SCALARS["N"], SCALARS["K"], SCALARS["group_size"],
            int(np.float32(SCALARS["eps"]).view(np.int32)), 0, int(WEIGHTS["w.probe"][:2].view(np.int32)[0]), PROBE_SMEM,
            *_i32_words(executor.buffer_address("a")), *_i32_words(executor.weight_address("w.probe"))]
    assert probe.tolist() == want


def test_write_read_round_trip(executor):
    grid2 = np.arange(12, dtype=np.int32).reshape(3, 4)
    executor.write("grid2", grid2)
    executor.write("grid2", np.array([40, 41, 42, 43]), index=1)
    executor.write("grid2", np.int32(-9), index=(2, 3))
    executor.write("grid2", 7, index=(-3, 0))
    grid2[1] = [40, 41, 42, 43]
    grid2[2, 3] = -9
    grid2[0, 0] = 7
    got = executor.read("grid2")
    assert got.dtype == np.int32 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, grid2)
    got[:] = 0  # a host copy: the device keeps its values
    np.testing.assert_array_equal(executor.read("grid2"), grid2)

    h = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float16)
    executor.write("h", h)
    got = executor.read("h")
    assert got.dtype == np.float16 and got.shape == (2, 5)
    np.testing.assert_array_equal(got.view(np.uint16), h.view(np.uint16))

    executor.write("grid2", 3)  # a scalar broadcast over the whole buffer
    np.testing.assert_array_equal(executor.read("grid2"), np.full((3, 4), 3, np.int32))
    with pytest.raises(IndexError):
        executor.write("grid2", 1, index=(3, 0))


def test_arena_starts_zeroed_and_weights_are_aligned(executor):
    for name in ("a", "b", "c", "probe", "grid2"):
        assert not executor.read(name).any()
    for name, w in WEIGHTS.items():
        addr = executor.weight_address(name)
        assert addr % 256 == 0
        raw = executor.weights.download(addr - executor.weights.ptr, w.nbytes)
        assert raw.tobytes() == w.tobytes()


def test_check_device(cuda_context, arch):
    assert check_device({arch: False}) == arch
    assert check_device({"sm10": True, arch: False}) == arch
    wrong = "sm80" if arch != "sm80" else "sm86"
    with pytest.raises(TargetError) as info:
        check_device({wrong: False})
    message = str(info.value)
    assert "\n" not in message
    major, minor = cuda_context.compute_capability
    assert f"compute capability {major}.{minor}" in message
    assert wrong in message and f"rebuild with --arch {arch}" in message
    assert cuda_context.name in message


def test_executor_refuses_wrong_arch_missing_kernel_and_abi_mismatch(arch, cubin):
    wrong = "sm80" if arch != "sm80" else "sm86"
    with pytest.raises(TargetError, match=f"rebuild with --arch {arch}"):
        GpuExecutor(_plan(wrong), WEIGHTS, cubin)
    with pytest.raises(ArtifactError, match="'no_such_kernel' is not in the"):
        GpuExecutor(_plan(arch, chain_kernel="no_such_kernel"), WEIGHTS, cubin)
    with cd.Module(cubin) as module:
        if module.function("add_one").param_sizes() is None:
            pytest.skip("the driver cannot report kernel parameter sizes")
    with pytest.raises(ArtifactError, match="'add_one' takes parameters of"):
        GpuExecutor(_plan(arch, chain_kernel="add_one"), WEIGHTS, cubin)


# -- the kernel harness ------------------------------------------------------------------------


def test_run_kernel_harness(cuda_context, cubin):
    x = np.arange(64, dtype=np.uint16) * 3   # fake_take_last reads its f16 buffers as 16-bit integers
    out = np.full(64, 10, np.uint16)
    got = run_kernel(cubin, "fake_take_last", (2, 1, 1), (32, 1, 1), 0, "take_last",
                     {"out": out, "x": x, "n_real": np.array([4], np.int32), "hidden": HIDDEN})
    want = out.copy()
    want[:HIDDEN] = 30 + x[:HIDDEN] + 4
    np.testing.assert_array_equal(got["out"], want)
    np.testing.assert_array_equal(got["x"], x)
    assert set(got) == {"out", "x", "n_real"}
    assert (out == 10).all()  # the caller's arrays are not modified

    floats = np.linspace(-1, 1, 40, dtype=np.float32)
    got = run_kernel(cubin, "scale_add", (1, 1, 1), (64, 1, 1), 0, SCALE_ADD,
                     {"p": floats, "s": -0.5, "n": 40})
    np.testing.assert_array_equal(got["p"], floats * np.float32(-0.5) + np.float32(1))

    with pytest.raises(ValueError, match="missing"):
        run_kernel(cubin, "add_one", (1, 1, 1), (32, 1, 1), 0, ADD_ONE, {"p": x})
