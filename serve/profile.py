"""Per-launch times of some replays, as a Chrome trace (Perfetto opens it) and a top-N table.

``Engine.profiler = LaunchProfiler(plan, steps=20)`` (``runner/engine.py``) times the first ``steps`` replays of each
graph with ``Executor.replay_timed``: CUDA events around every launch on the GPU (the launches
then run one by one, outside their CUDA graph), ``perf_counter`` around every op of the numpy
executor on the CPU. Each launch becomes one complete event named by the plan, its node and
kernel (``blk.1.attn_output linear_f16``), on the track of its graph; each replay one enclosing
event. Replays are placed on the host clock at the moment they were timed.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from grokc.artifacts.plan import Plan
from grokc.runner.executor import Executor


@dataclass(frozen=True)
class TimedReplay:
    graph: str
    start_s: float                        # host clock (perf_counter) when the replay was issued
    launches: list[tuple[float, float]]   # per launch of the graph: (start offset, duration) in s


class LaunchProfiler:
    def __init__(self, plan: Plan, steps: int = 20):
        self.plan, self.steps = plan, steps
        self.counts: dict[str, int] = defaultdict(int)
        self.replays: list[TimedReplay] = []

    def wants(self, graph: str) -> bool:
        return self.counts[graph] < self.steps

    def record(self, graph: str, executor: Executor) -> None:
        """Replay ``graph`` once on ``executor``, timing each launch."""
        t0 = time.perf_counter()
        self.replays.append(TimedReplay(graph, t0, executor.replay_timed(graph)))
        self.counts[graph] += 1

    def _timed(self):
        """(replay, launch index, launch, event name, start s, duration s) of every timed launch."""
        for r in self.replays:
            for i, (launch, (start, dur)) in enumerate(zip(self.plan.graphs[r.graph].launches, r.launches)):
                name = f"{launch.node} {launch.kernel}" if launch.node else launch.kernel
                yield r, i, launch, name, r.start_s + start, dur

    def chrome_trace(self) -> dict:
        """The Trace Event Format: one ``X`` event per launch (µs), one per replay around them."""
        tracks = {g: i + 1 for i, g in enumerate(sorted({r.graph for r in self.replays}))}
        events: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": g}}
                              for g, tid in tracks.items()]
        events += [{"ph": "X", "name": r.graph, "cat": "replay", "pid": 1, "tid": tracks[r.graph],
                    "ts": r.start_s * 1e6, "dur": max((s + d for s, d in r.launches), default=0.0) * 1e6}
                   for r in self.replays]
        events += [{"ph": "X", "name": name, "cat": launch.op, "pid": 1, "tid": tracks[r.graph],
                    "ts": start * 1e6, "dur": dur * 1e6,
                    "args": {"graph": r.graph, "launch": i, "op": launch.op, "kernel": launch.kernel,
                             "grid": list(launch.grid), "block": list(launch.block)}}
                   for r, i, launch, name, start, dur in self._timed()]
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.chrome_trace()))

    def top(self, n: int = 15) -> list[dict]:
        """The ``n`` launches (by name) that took the most time in all: calls, total ms, share."""
        total: dict[str, float] = defaultdict(float)
        calls: dict[str, int] = defaultdict(int)
        for *_, name, _, dur in self._timed():
            total[name] += dur
            calls[name] += 1
        whole = sum(total.values()) or 1.0
        rows = sorted(total, key=lambda k: -total[k])[:n]
        return [{"name": k, "calls": calls[k], "total_ms": total[k] * 1e3, "mean_us": total[k] / calls[k] * 1e6,
                 "share": total[k] / whole} for k in rows]

    def table(self, n: int = 15) -> str:
        lines = [f"{'total ms':>10} {'share':>6} {'calls':>6} {'mean us':>10}  launch"]
        lines += [f"{r['total_ms']:10.3f} {r['share']:6.1%} {r['calls']:6d} {r['mean_us']:10.1f}  {r['name']}"
                  for r in self.top(n)]
        return "\n".join(lines)
