"""What the kernel benchmarks share: timing a chain of launches as one CUDA graph (grokc's driver
bindings, or torch's graphs for the baselines), device buffers, and parallel kernel builds.

A timing is CUDA events around ``reps`` replays of one graph of chained launches, repeated
``repeats`` times; the median of the repeats, per launch. Callers rotate weights over enough copies
that a chain reads them from HBM, not from the 60 MB L2.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from grokc.runner import cuda_driver as cd
from grokc.targets import build_kernels
from grokc.targets.base import Target

L2_BYTES = 60 * 2**20                 # the H200's L2
ROTATE_BYTES = 3 * L2_BYTES           # weight copies of a chain together: more than L2 holds


class Timer:
    """Times graphs of launches on one stream of grokc's driver."""

    def __init__(self, stream: cd.Stream):
        self.stream = stream
        self.e0, self.e1 = cd.Event(), cd.Event()

    def graph(self, launches: list[cd.KernelLaunch], reps: int = 10, repeats: int = 5) -> tuple[float, float]:
        """(median µs per launch, spread (max - min) / median) over replays of one graph of ``launches``."""
        g = cd.Graph(launches)
        try:
            g.launch(self.stream)
            self.stream.synchronize()
            times = []
            for _ in range(repeats):
                self.e0.record(self.stream)
                for _ in range(reps):
                    g.launch(self.stream)
                self.e1.record(self.stream)
                self.e1.synchronize()
                times.append(self.e0.elapsed_ms(self.e1) * 1e3 / (reps * len(launches)))
        finally:
            g.close()
        med = statistics.median(times)
        return med, (max(times) - min(times)) / med


def chain_length(copies: int, at_least: int = 16) -> int:
    """Launches in a timed chain over ``copies`` weight copies: a multiple of them, >= ``at_least``."""
    return copies * max(1, -(-at_least // copies))


def torch_graph_us(torch, fns: list, calls: int = 20, reps: int = 10, repeats: int = 5) -> float:
    """Median µs per call of ``fns`` (cycled to ``calls`` calls, at least one each) captured in one torch
    CUDA graph: the baselines, timed the way grokc's chains are."""
    n = max(calls, len(fns))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n):
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        e0.record()
        for _ in range(reps):
            graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / (reps * n))
    del graph
    torch.cuda.empty_cache()
    return statistics.median(times)


class Uploads:
    """Device copies of host arrays, freed together."""

    def __init__(self) -> None:
        self.buffers: list[cd.DeviceBuffer] = []

    def buffer(self, a: np.ndarray) -> cd.DeviceBuffer:
        b = cd.DeviceBuffer(max(a.nbytes, 256))
        b.upload(np.ascontiguousarray(a))
        self.buffers.append(b)
        return b

    def ptr(self, a: np.ndarray | None) -> int | None:
        """The device address of a copy of ``a``; None (a null pointer) for None."""
        return None if a is None else self.buffer(a).ptr

    def close(self) -> None:
        for b in self.buffers:
            b.close()
        self.buffers = []


def build_parallel(symbols: list[str], target: Target, jobs: int) -> dict[str, bytes]:
    """symbol -> the cubin holding it: ``symbols`` compiled in ``jobs`` chunks side by side."""
    symbols = sorted(set(symbols))
    n = max(1, min(jobs, len(symbols)))
    chunks = [symbols[i::n] for i in range(n)]
    with ThreadPoolExecutor(n) as pool:
        built = list(pool.map(lambda c: build_kernels(c, target), chunks))
    return {s: cubin for chunk, cubin in zip(chunks, built) for s in chunk}
