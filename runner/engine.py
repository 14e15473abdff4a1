"""Serving on a static plan: slots, KV blocks, prefill into a bucket, queued decode steps.

The engine is backend-agnostic: it only writes per-step input buffers, replays graphs and reads
results through an ``Executor``. Each request gets one of the ``B`` slots and, up front, every KV
block it can need (``ceil((prompt + max_new) / 16)``), so decode steps can be queued on the device
with no host round trip: the decode graph feeds each slot's sampled token and next position back
by itself and stops a slot (``io.active``) at EOS or its token budget.

Every request is checked whole (``check``) before it takes anything, and a request that fails
after taking a slot gives the slot and its blocks back before the error leaves the engine, so a
bad request never costs the next one anything. Slots are independent: ``add`` may prefill a new
request between two ``decode`` steps of the others (continuous batching, ``grokc serve``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from grokc.abi.ops import KV_BLOCK_SIZE
from grokc.artifacts.plan import IO, Plan
from grokc.core.errors import RequestError, RequestTypeError
from grokc.core.meta import Shapes
from grokc.runner.executor import Executor

SEED_RANGE = 2**32   # the sampler's RNG takes a 32-bit seed (abi/rng.py); larger seeds are refused
F32_MAX = float(np.finfo(np.float32).max)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RequestTypeError(f"{name} must be an integer, not {type(value).__name__} {value!r}")
    return int(value)


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RequestTypeError(f"{name} must be a number, not {type(value).__name__} {value!r}")
    try:
        real = float(value)
    except OverflowError:   # an integer past the float range
        real = math.inf
    if not math.isfinite(real) or abs(real) > F32_MAX:   # the device holds it as an f32
        raise RequestError(f"{name}={value!r:.40} must be a finite number")
    return real


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.0   # 0: greedy
    top_k: int = 0             # 0: no top-k filter
    top_p: float = 1.0         # 1: no nucleus filter
    seed: int = 0              # 0 <= seed < 2**32

    def check(self, vocab: int) -> None:
        """Raise ``RequestTypeError`` for a wrong type and ``RequestError`` for a value out of range."""
        if _integer("max_new_tokens", self.max_new_tokens) < 1:
            raise RequestError(f"max_new_tokens={self.max_new_tokens} must be at least 1")
        if _real("temperature", self.temperature) < 0:
            raise RequestError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < np.float32(_real("top_p", self.top_p)) <= 1:   # as the device sees it
            raise RequestError(f"top_p={self.top_p} must be in (0, 1] (1 = no nucleus filter)")
        if not 0 <= _integer("top_k", self.top_k) <= vocab:
            raise RequestError(f"top_k={self.top_k} must be in [0, {vocab}] (the vocabulary; 0 = no top-k filter)")
        if not 0 <= _integer("seed", self.seed) < SEED_RANGE:
            raise RequestError(f"seed={self.seed} must be in [0, 2**32): the sampler's random numbers take a 32-bit seed")


class Profiler(Protocol):
    """Times some replays itself (``serve/profile.py``'s ``LaunchProfiler``)."""

    def wants(self, graph: str) -> bool: ...
    def record(self, graph: str, executor: Executor) -> None: ...


@dataclass(frozen=True)
class SlotProgress:
    tokens: list[int]   # every token the slot generated so far, the prefill's first included
    active: bool        # still generating (False: EOS or its token budget reached)


class Engine:
    def __init__(self, executor: Executor, plan: Plan, shapes: Shapes):
        self.ex, self.plan, self.shapes = executor, plan, shapes
        self.vocab = plan.buffers[plan.graphs[f"decode_{shapes.decode_batches[0]}"].logits].shape[-1]
        self.free_slots = list(range(shapes.batch))
        self.free_blocks = list(range(shapes.kv_blocks))
        self.blocks_of: dict[int, list[int]] = {}
        self.profiler: Profiler | None = None   # when set, it times the replays it asks for
        self.ex.write(IO.ACTIVE.value, np.zeros(shapes.batch, np.int32))

    # -- admission ---------------------------------------------------------------------------
    def bucket_for(self, n_tokens: int) -> int:
        for b in self.shapes.buckets:
            if n_tokens <= b:
                return b
        raise RequestError(f"prompt of {n_tokens} tokens is longer than the largest bucket "
                           f"({self.shapes.buckets[-1]}); shorten it or rebuild with a larger --buckets entry")

    @staticmethod
    def blocks_needed(n_tokens: int, max_new_tokens: int) -> int:
        return -(-(n_tokens + max_new_tokens) // KV_BLOCK_SIZE)

    def check(self, prompt: list[int], params: SamplingParams, bucket: int | None = None) -> int:
        """Everything about one request that can be known before it runs; returns its prefill bucket.

        Raises ``RequestError`` (or ``RequestTypeError``) naming the problem; touches nothing.
        """
        if not isinstance(prompt, (list, tuple)):
            raise RequestTypeError(f"a prompt must be a list of token ids, not {type(prompt).__name__}")
        if not prompt:
            raise RequestError("the prompt is empty; give at least one token")
        for t in prompt:
            if not 0 <= _integer("a prompt token", t) < self.vocab:
                raise RequestError(f"prompt token {t} is outside the vocabulary [0, {self.vocab})")
        params.check(self.vocab)
        n = len(prompt)
        if bucket is None:
            bucket = self.bucket_for(n)
        elif bucket not in self.shapes.buckets or bucket < n:
            raise RequestError(f"bucket {bucket} cannot hold {n} tokens; compiled buckets: {list(self.shapes.buckets)}")
        if n + params.max_new_tokens > self.shapes.max_seq:
            raise RequestError(f"prompt ({n} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                               f"context of {self.shapes.max_seq}; lower max_new_tokens or rebuild with a larger --max-seq")
        need = self.blocks_needed(n, params.max_new_tokens)
        if need > self.shapes.kv_blocks:
            raise RequestError(f"out_of_kv_slots: the request needs {need} KV blocks of {KV_BLOCK_SIZE} tokens but the "
                               f"cache has {self.shapes.kv_blocks} in all; lower max_new_tokens or rebuild with a "
                               "larger --kv-blocks")
        return bucket

    def fits_now(self, n_tokens: int, max_new_tokens: int) -> bool:
        """A free slot and enough free KV blocks for a request of this size."""
        return bool(self.free_slots) and self.blocks_needed(n_tokens, max_new_tokens) <= len(self.free_blocks)

    def add(self, prompt: list[int], params: SamplingParams, bucket: int | None = None) -> int:
        """Prefill ``prompt`` into a free slot (queued) and return the slot.

        ``bucket`` forces a larger prefill graph than the smallest that fits (tests use it).
        """
        bucket = self.check(prompt, params, bucket)
        n = len(prompt)
        if not self.free_slots:
            raise RequestError(f"all {self.shapes.batch} batch slots are busy; wait for a request to finish "
                               "or rebuild with a larger --batch")
        need = self.blocks_needed(n, params.max_new_tokens)
        if need > len(self.free_blocks):
            raise RequestError(f"out_of_kv_slots: the request needs {need} KV blocks of {KV_BLOCK_SIZE} tokens but "
                               f"only {len(self.free_blocks)} are free; wait for a request to finish or rebuild "
                               "with a larger --kv-blocks")
        slot = self.free_slots.pop(0)
        blocks, self.free_blocks = self.free_blocks[:need], self.free_blocks[need:]
        self.blocks_of[slot] = blocks
        try:
            self._prefill(slot, blocks, prompt, params, bucket)
        except BaseException:
            self.release(slot)
            raise
        return slot

    def _prefill(self, slot: int, blocks: list[int], prompt: list[int], params: SamplingParams, bucket: int) -> None:
        table = np.zeros(self.plan.buffers[IO.BLOCK_TABLE.value].shape[1], np.int32)
        table[:len(blocks)] = blocks
        w = self.ex.write
        w(IO.BLOCK_TABLE.value, table, (slot,))
        w(IO.TEMPERATURE.value, np.float32(params.temperature), (slot,))
        w(IO.TOP_K.value, np.int32(params.top_k), (slot,))
        w(IO.TOP_P.value, np.float32(params.top_p), (slot,))
        w(IO.SEED.value, np.uint32(params.seed).view(np.int32), (slot,))
        w(IO.MAX_NEW.value, np.int32(params.max_new_tokens), (slot,))
        prompt_buf = np.zeros(self.plan.buffers[IO.PROMPT.value].shape[0], np.int32)
        prompt_buf[:len(prompt)] = prompt
        w(IO.PROMPT.value, prompt_buf)
        w(IO.N_REAL.value, np.array([len(prompt)], np.int32))
        w(IO.SLOT.value, np.array([slot], np.int32))
        self._replay(f"prefill_{bucket}")

    def release(self, slot: int) -> None:
        """Stop ``slot`` and give back its KV blocks (at once: the next ``add`` may take them)."""
        self.ex.write(IO.ACTIVE.value, np.int32(0), (slot,))
        self.free_blocks = sorted(self.free_blocks + self.blocks_of.pop(slot))
        self.free_slots = sorted(self.free_slots + [slot])

    @property
    def busy_slots(self) -> list[int]:
        return sorted(self.blocks_of)

    @property
    def blocks_in_use(self) -> int:
        return self.shapes.kv_blocks - len(self.free_blocks)

    # -- decoding ----------------------------------------------------------------------------
    def decode_graph(self) -> str:
        """The smallest decode graph that covers every busy slot (slots fill from 0 up)."""
        top = max(self.blocks_of, default=0) + 1
        return f"decode_{min(b for b in self.shapes.decode_batches if b >= top)}"

    def decode(self, steps: int) -> None:
        """Queue ``steps`` decode replays (slots that finished are skipped on the device)."""
        graph = self.decode_graph()
        for _ in range(steps):
            self._replay(graph)

    def _replay(self, graph: str) -> None:
        if self.profiler is not None and self.profiler.wants(graph):
            self.profiler.record(graph, self.ex)
        else:
            self.ex.replay(graph)

    def active(self) -> np.ndarray:
        return self.ex.read(IO.ACTIVE.value).astype(bool)

    def tokens(self, slot: int) -> list[int]:
        count = int(self.ex.read(IO.OUT_COUNT.value)[slot])
        return self.ex.read(IO.OUT_TOKENS.value)[slot, :count].tolist()

    def progress(self) -> dict[int, SlotProgress]:
        """Each busy slot's tokens so far and whether it still generates (three reads, whatever B)."""
        active, counts, out = (self.ex.read(b.value) for b in (IO.ACTIVE, IO.OUT_COUNT, IO.OUT_TOKENS))
        return {s: SlotProgress(out[s, :counts[s]].tolist(), bool(active[s])) for s in self.busy_slots}

    def score(self, sequences: list[list[int]]) -> list[np.ndarray]:
        """Teacher-forced logits: f32 ``[len(seq), vocab]`` after each token of each sequence.

        Token 0 is prefilled alone; every later token is written over the sampled one before its
        decode step, so each row is the plan's prediction given the true prefix. The slot is kept
        active too: a sampled EOS must not stop a teacher-forced sequence.
        """
        out: list[np.ndarray] = []
        for start in range(0, len(sequences), self.shapes.batch):
            wave = sequences[start:start + self.shapes.batch]
            rows: dict[int, list[np.ndarray]] = {}
            slots: list[int] = []
            try:
                for seq in wave:
                    slot = self.add(seq[:1], SamplingParams(max_new_tokens=len(seq)))
                    rows[slot] = [self.ex.read(self.plan.graphs[f"prefill_{self.bucket_for(1)}"].logits)[0]]
                    slots.append(slot)
                for t in range(1, max(len(s) for s in wave)):
                    for slot, seq in zip(slots, wave):
                        if t < len(seq):
                            self.ex.write(IO.TOKENS.value, np.int32(seq[t]), (slot,))
                            self.ex.write(IO.ACTIVE.value, np.int32(1), (slot,))
                    self.decode(1)
                    logits = self.ex.read(self.plan.graphs[self.decode_graph()].logits)
                    for slot, seq in zip(slots, wave):
                        if t < len(seq):
                            rows[slot].append(logits[slot])
            finally:
                for s in slots:
                    self.release(s)
            out += [np.stack(rows[s]) for s in slots]
        return out

    def generate(self, prompts: list[list[int]], params: SamplingParams, chunk: int = 16) -> list[list[int]]:
        """Token ids generated for each prompt, at most ``batch`` prompts at a time.

        Every prompt is checked before any runs, so a bad one fails the call with nothing done.
        """
        for p in prompts:
            self.check(p, params)
        results: list[list[int]] = []
        for start in range(0, len(prompts), self.shapes.batch):
            slots: list[int] = []
            try:
                for p in prompts[start:start + self.shapes.batch]:
                    slots.append(self.add(p, params))
                remaining = params.max_new_tokens - 1
                while remaining > 0 and self.active()[slots].any():
                    self.decode(min(chunk, remaining))
                    remaining -= chunk
                results += [self.tokens(s) for s in slots]
            finally:
                for s in slots:
                    self.release(s)
        return results
