"""The server's metrics in the Prometheus text format (``GET /metrics``).

Counters and histograms are updated by the scheduler thread and read by the HTTP thread, under
one lock; gauges (queue, slots, KV blocks) are read from the scheduler when the page is rendered.
Tokens per second is the rate of generated tokens over the last ``RATE_WINDOW_S`` seconds.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

RATE_WINDOW_S = 10.0
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{"+Inf" if bound == float("inf") else repr(bound)}"}} {running}')
        return out + [f"{name}_sum {self.sum!r}", f"{name}_count {running}"]


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.responses: Counter[str] = Counter()      # HTTP status of every finished generation request
        self.refusals: Counter[str] = Counter()       # error code of every refused or failed request
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self._recent: deque[tuple[float, int]] = deque()   # (time, tokens) of the last RATE_WINDOW_S

    def refused(self, code: str) -> None:
        with self.lock:
            self.refusals[code] += 1

    def responded(self, status: int) -> None:
        with self.lock:
            self.responses[str(status)] += 1

    def generated(self, tokens: int, now: float) -> None:
        with self.lock:
            self.generated_tokens += tokens
            self._recent.append((now, tokens))

    def finished(self, prompt_tokens: int, ttft_s: float | None, tpot_s: float | None) -> None:
        with self.lock:
            self.prompt_tokens += prompt_tokens
            if ttft_s is not None:
                self.ttft.observe(ttft_s)
            if tpot_s is not None:
                self.tpot.observe(tpot_s)

    def tokens_per_second(self, now: float) -> float:
        with self.lock:
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / RATE_WINDOW_S

    def render(self, gauges: Callable[[], dict[str, tuple[str, float]]]) -> str:
        """The page; ``gauges()`` gives name -> (help, value) of the scheduler's current state."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[str]) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *samples])

        for name, (help_, value) in {**gauges(), "grokc_generation_tokens_per_second": (
                f"generated tokens per second over the last {RATE_WINDOW_S:g} s",
                self.tokens_per_second(time.monotonic()))}.items():
            metric(name, "gauge", help_, [f"{name} {value!r}"])
        with self.lock:
            metric("grokc_prompt_tokens_total", "counter", "prompt tokens of requests served",
                   [f"grokc_prompt_tokens_total {self.prompt_tokens}"])
            metric("grokc_generation_tokens_total", "counter", "tokens generated",
                   [f"grokc_generation_tokens_total {self.generated_tokens}"])
            metric("grokc_responses_total", "counter", "generation requests answered, by HTTP status",
                   [f'grokc_responses_total{{status="{s}"}} {n}' for s, n in sorted(self.responses.items())])
            metric("grokc_refusals_total", "counter", "requests refused or failed, by error code",
                   [f'grokc_refusals_total{{reason="{c}"}} {n}' for c, n in sorted(self.refusals.items())])
            metric("grokc_time_to_first_token_seconds", "histogram", "arrival to the first token sent",
                   self.ttft.lines("grokc_time_to_first_token_seconds"))
            metric("grokc_time_per_output_token_seconds", "histogram",
                   "time per generated token after the first, per request", self.tpot.lines(
                       "grokc_time_per_output_token_seconds"))
        return "\n".join(lines) + "\n"
