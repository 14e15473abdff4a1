"""The interface both runner backends implement: buffers in one arena, graphs to replay.

``Engine`` (runner/engine.py) drives generation through this and nothing else, so the CPU
executor (numpy) and the GPU executor (CUDA graphs) are interchangeable.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Executor(Protocol):
    def write(self, buffer: str, value: np.ndarray, index: int | tuple[int, ...] = ()) -> None:
        """Copy ``value`` into ``buffer`` (the whole buffer, or the sub-array at ``index``)."""

    def read(self, buffer: str) -> np.ndarray:
        """A host copy of ``buffer`` with its plan dtype and shape (waits for queued work)."""

    def replay(self, graph: str) -> None:
        """Queue one run of the graph; may return before it finishes."""

    def replay_timed(self, graph: str) -> list[tuple[float, float]]:
        """Run the graph once and wait: each launch's (start from the first, duration) in seconds.

        For profiling (``runner/profile.py``): the GPU runs the launches one by one between CUDA
        events, outside their CUDA graph, so the sum is a little more than a replay takes."""

    def synchronize(self) -> None:
        """Wait until every queued replay has finished."""
