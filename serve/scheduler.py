"""Continuous batching in the artifact's static slots, on one thread that owns the device.

The HTTP side ``submit``s a ``Job`` and gets a ``Ticket``; events for it (``Delta`` text for a
stream, then ``Done`` or ``Failed``) arrive on the ticket's asyncio queue. The scheduler thread
loads the artifact (the GPU executor must be driven by the thread that built it), runs a warm-up
generation, and then repeats one step:

1. requests whose client went away (``Ticket.cancel``) or whose deadline passed give their slot and
   KV blocks back at once; a queued request past its deadline is refused with 504;
2. queued requests are prefilled into free slots, first come first served, while a slot and enough
   KV blocks are free (a request that fits only later keeps its place at the head of the queue);
3. one replay of the decode graph that covers the busy slots advances every one of them; the new
   tokens become text (stop strings checked on the host), and a finished request frees its slot.

A request's tokens do not depend on what else runs beside it (the CPU plan is batch-invariant,
``runner/cpu.py``), so every answer is the one the request would get alone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grokc.core.errors import GrokcError, RequestError
from grokc.runner import Runner, SamplingParams
from grokc.runner.engine import SlotProgress
from grokc.serve.api import ApiError, Context, Job, engine_refusal
from grokc.serve.chat import ChatTemplate
from grokc.serve.detok import TextStream
from grokc.serve.limits import Limits
from grokc.serve.metrics import Metrics
from grokc.serve.profile import LaunchProfiler

log = logging.getLogger("grokc.serve")


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Done:
    finish_reason: str      # "stop" (EOS or a stop string) or "length"
    text: str               # the whole completion (what the deltas added up to)
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    error: ApiError


class Ticket:
    """A submitted job: the HTTP side awaits ``events``; the scheduler thread owns the rest."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop, deadline: float):
        self.job, self.loop, self.deadline = job, loop, deadline
        self.events: asyncio.Queue = asyncio.Queue()
        self.arrival = time.monotonic()
        self.cancelled = False
        self.count = 0                          # tokens generated so far
        self.first_token_at: float | None = None
        self.text: TextStream | None = None

    def cancel(self) -> None:
        """The client is gone: the scheduler frees the slot at its next step (no-op once finished)."""
        self.cancelled = True

    def send(self, event: Delta | Done | Failed) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:   # the event loop is closed: nobody is listening any more
            pass


def error(status: int, code: str, message: str, **headers: str) -> ApiError:
    return ApiError(status, code, message, headers=headers)


class Scheduler:
    def __init__(self, load: Callable[[], Runner], limits: Limits, metrics: Metrics, model: str,
                 profile: Path | None = None, profile_steps: int = 20, progress: Callable[[str], None] = print):
        self.load, self.metrics, self.model, self.progress = load, metrics, model, progress
        self.limits = limits                # resolved against the artifact once it is loaded
        self.profile, self.profile_steps = profile, profile_steps
        self.state = "loading"              # loading -> ready -> draining; or failed
        self.load_error: GrokcError | None = None
        self.context: Context | None = None
        self.stopping = False
        self.drain_deadline: float | None = None   # set by drain: what is in flight fails once it passes
        self.cond = threading.Condition()
        self.queue: deque[Ticket] = deque()
        self.running: dict[int, Ticket] = {}
        self.thread = threading.Thread(target=self._main, name="grokc-scheduler", daemon=True)

    # -- the HTTP side --------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Queue ``job``, or refuse it: 503 while loading, draining or failed; 429 when the queue is full."""
        if self.state != "ready":
            raise self.unavailable()
        try:
            self.engine.check(job.prompt, job.params)
        except RequestError as exc:
            raise engine_refusal(exc) from None
        with self.cond:
            if len(self.queue) >= self.limits.max_queue:
                raise error(429, "queue_full", f"{len(self.queue)} requests are already waiting for a slot (the "
                            f"limit is {self.limits.max_queue}); retry later", **{"Retry-After": str(self.limits.retry_after_s)})
            ticket = Ticket(job, loop, time.monotonic() + self.limits.request_timeout_s)
            self.queue.append(ticket)
            self.cond.notify()
        return ticket

    def unavailable(self) -> ApiError:
        return {"loading": error(503, "loading", "the model is still loading; retry when /health answers 200",
                                 **{"Retry-After": "1"}),
                "draining": error(503, "draining", "the server is shutting down and takes no new requests"),
                "failed": error(503, "engine_failed", "the engine failed and this server serves no more requests; "
                                "restart it")}.get(self.state) or error(503, "unavailable", "the server is not ready")

    def drain(self, timeout_s: float) -> None:
        """Stop admission (new requests get 503); what is queued or running goes on for ``timeout_s``
        seconds more, then fails with 503 ``shutting_down`` (checked before every decode step)."""
        with self.cond:
            if self.state in ("loading", "ready"):
                self.state = "draining"
            if self.drain_deadline is None:
                self.drain_deadline = time.monotonic() + timeout_s
            self.cond.notify()

    def idle(self) -> bool:
        return not self.queue and not self.running

    def stop(self, wait: bool = True, timeout: float = 10.0) -> None:
        """Fail what is left (503 ``shutting_down``), write the profile, end the thread (``wait``: join it)."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if wait and self.thread.is_alive():
            self.thread.join(timeout)

    def gauges(self) -> dict[str, tuple[str, float]]:
        engine = getattr(self, "engine", None)
        shapes = engine.shapes if engine else None
        return {
            "grokc_ready": ("1 when the server admits requests", float(self.state == "ready")),
            "grokc_queue_length": ("requests waiting for a slot", float(len(self.queue))),
            "grokc_slots_busy": ("batch slots generating", float(len(self.running))),
            "grokc_slots_total": ("batch slots of the artifact", float(shapes.batch if shapes else 0)),
            "grokc_kv_blocks_in_use": ("KV-cache blocks held by requests", float(engine.blocks_in_use if engine else 0)),
            "grokc_kv_blocks_total": ("KV-cache blocks of the artifact", float(shapes.kv_blocks if shapes else 0)),
        }

    # -- the scheduler thread -------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._load()
        except GrokcError as exc:
            self.load_error, self.state = exc, "failed"
            return
        profiler = None
        if self.profile is not None:
            profiler = self.engine.profiler = LaunchProfiler(self.runner.plan, self.profile_steps)
        try:
            while self._wait():
                try:
                    self._step()
                except Exception:   # a bug or a device failure: nothing the engine holds can be trusted
                    log.error("the engine failed:\n%s", traceback.format_exc())
                    self.state = "failed"
                    self._fail_everything(error(500, "internal_error", "the engine failed while serving this request"))
            self._fail_everything(error(503, "shutting_down", "the server shut down before this request finished"))
        finally:
            if profiler is not None:
                profiler.write(self.profile)
                self.progress(f"wrote the profile of {sum(profiler.counts.values())} replays to {self.profile}\n"
                              + profiler.table())

    def _load(self) -> None:
        self.runner = self.load()
        self.engine = self.runner.engine
        self.limits = self.limits.resolve(self.engine.shapes)
        manifest = self.runner.artifact.manifest
        self.eos = set(manifest.tokenizer.eos_token_ids)
        template = manifest.tokenizer.chat_template
        tok = self.runner.tokenizer
        chat = None if template is None else ChatTemplate(
            template, *(tok.id_to_token(i) or "" if i is not None else "" for i in
                        (manifest.tokenizer.bos_token_id, min(self.eos, default=None))))
        self.context = Context(self.model, self.limits, self.engine.shapes.max_seq,
                               lambda text, special: tok.encode(text, add_special_tokens=special).ids,
                               None if chat is None else chat.render)
        warm = self.engine.generate([[min(self.eos, default=0)]], SamplingParams(max_new_tokens=2))
        if len(warm[0]) < 1:
            raise GrokcError("the warm-up generation produced no token; the artifact cannot serve")
        with self.cond:
            if self.state == "loading":
                self.state = "ready"
        self.progress(f"ready: {self.model} on {self.runner.device} ({self.runner.backend.arch} plan), "
                      f"{self.engine.shapes.batch} slots, {self.engine.shapes.kv_blocks} KV blocks")

    def _wait(self) -> bool:
        """Sleep until there is work; False when the thread should end."""
        with self.cond:
            while not self.queue and not self.running and not self.stopping:
                self.cond.wait()
            drained = self.drain_deadline is not None and time.monotonic() > self.drain_deadline
            return not self.stopping and not drained

    def _step(self) -> None:
        now = time.monotonic()
        for slot, t in list(self.running.items()):
            if t.cancelled:
                self._finish(slot, None)
            elif now > t.deadline:
                self._finish(slot, Failed(self._deadline(t)))
        if self._admit(now):
            self._emit(self.engine.progress())   # the prefills' first tokens, before the next decode step
        if self.running:
            self.engine.decode(1)
            self._emit(self.engine.progress())

    def _deadline(self, t: Ticket) -> ApiError:
        return error(504, "deadline_exceeded", f"the request did not finish within {self.limits.request_timeout_s:g} s "
                     f"({t.count} tokens generated); ask for fewer tokens or retry")

    def _admit(self, now: float) -> bool:
        admit: list[Ticket] = []
        with self.cond:
            for t in list(self.queue):
                if t.cancelled or now > t.deadline:
                    self.queue.remove(t)
                    if not t.cancelled:
                        t.send(Failed(self._deadline(t)))
            free_slots, free_blocks = len(self.engine.free_slots), len(self.engine.free_blocks)
            while self.queue and free_slots:   # first come, first served: the head waits for room
                need = self.engine.blocks_needed(len(self.queue[0].job.prompt), self.queue[0].job.params.max_new_tokens)
                if need > free_blocks:
                    break
                admit.append(self.queue.popleft())
                free_slots, free_blocks = free_slots - 1, free_blocks - need
        for t in admit:
            try:
                slot = self.engine.add(t.job.prompt, t.job.params)
            except RequestError as exc:
                t.send(Failed(engine_refusal(exc)))
                continue
            t.text = TextStream(self.runner.decode, t.job.stop)
            self.running[slot] = t
        return bool(admit)

    def _emit(self, progress: dict[int, SlotProgress]) -> None:
        now = time.monotonic()
        for slot, t in list(self.running.items()):
            p = progress[slot]
            if len(p.tokens) == t.count and p.active:
                continue
            self.metrics.generated(len(p.tokens) - t.count, now)
            t.count = len(p.tokens)
            if t.first_token_at is None:
                t.first_token_at = now
            eos = bool(p.tokens) and not p.active and p.tokens[-1] in self.eos
            delta = t.text.feed(p.tokens[:-1] if eos else p.tokens, final=not p.active)
            if delta and t.job.stream:
                t.send(Delta(delta))
            if t.text.stopped or not p.active:
                reason = "stop" if t.text.stopped or eos else "length"
                self._finish(slot, Done(reason, t.text.out, len(t.job.prompt), t.count))

    def _finish(self, slot: int, event: Done | Failed | None) -> None:
        t = self.running.pop(slot)
        self.engine.release(slot)
        ttft = None if t.first_token_at is None else t.first_token_at - t.arrival
        tpot = (time.monotonic() - t.first_token_at) / (t.count - 1) if t.first_token_at and t.count > 1 else None
        self.metrics.finished(len(t.job.prompt), ttft, tpot)
        if event is not None:
            t.send(event)

    def _fail_everything(self, err: ApiError) -> None:
        for slot, t in list(self.running.items()):
            del self.running[slot]
            t.send(Failed(err))
            try:
                self.engine.release(slot)
            except Exception:   # the engine is broken; the ticket has its answer all the same
                log.error("releasing slot %d failed:\n%s", slot, traceback.format_exc())
        with self.cond:
            while self.queue:
                self.queue.popleft().send(Failed(err))
