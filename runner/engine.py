"""Serving on a static plan: slots, KV blocks, prefill into a bucket, queued decode steps.

The engine is backend-agnostic: it only writes per-step input buffers, replays graphs and reads
results through an ``Executor``. Each request gets one of the ``B`` slots and, up front, every KV
block it can need (``ceil((prompt + max_new) / 16)``), so decode steps can be queued on the device
with no host round trip: the decode graph feeds each slot's sampled token and next position back
by itself and stops a slot (``io.active``) at EOS or its token budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grokc.abi.ops import KV_BLOCK_SIZE
from grokc.artifacts.plan import IO, Plan
from grokc.core.errors import RequestError
from grokc.core.meta import Shapes
from grokc.runner.executor import Executor


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.0   # 0: greedy
    top_k: int = 0             # 0: no top-k filter
    top_p: float = 1.0         # 1: no nucleus filter
    seed: int = 0


class Engine:
    def __init__(self, executor: Executor, plan: Plan, shapes: Shapes):
        self.ex, self.plan, self.shapes = executor, plan, shapes
        self.free_slots = list(range(shapes.batch))
        self.free_blocks = list(range(shapes.kv_blocks))
        self.blocks_of: dict[int, list[int]] = {}
        self.ex.write(IO.ACTIVE.value, np.zeros(shapes.batch, np.int32))

    # -- admission ---------------------------------------------------------------------------
    def bucket_for(self, n_tokens: int) -> int:
        for b in self.shapes.buckets:
            if n_tokens <= b:
                return b
        raise RequestError(f"prompt of {n_tokens} tokens is longer than the largest bucket "
                           f"({self.shapes.buckets[-1]}); shorten it or rebuild with a larger --buckets entry")

    def add(self, prompt: list[int], params: SamplingParams, bucket: int | None = None) -> int:
        """Prefill ``prompt`` into a free slot (queued) and return the slot.

        ``bucket`` forces a larger prefill graph than the smallest that fits (tests use it).
        """
        n = len(prompt)
        if n == 0:
            raise RequestError("the prompt is empty; give at least one token")
        if params.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens={params.max_new_tokens} must be at least 1")
        if bucket is None:
            bucket = self.bucket_for(n)
        elif bucket not in self.shapes.buckets or bucket < n:
            raise RequestError(f"bucket {bucket} cannot hold {n} tokens; compiled buckets: {list(self.shapes.buckets)}")
        if n + params.max_new_tokens > self.shapes.max_seq:
            raise RequestError(f"prompt ({n} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                               f"context of {self.shapes.max_seq}; lower max_new_tokens or rebuild with a larger --max-seq")
        if not self.free_slots:
            raise RequestError(f"all {self.shapes.batch} batch slots are busy; wait for a request to finish "
                               "or rebuild with a larger --batch")
        need = -(-(n + params.max_new_tokens) // KV_BLOCK_SIZE)
        if need > len(self.free_blocks):
            raise RequestError(f"out_of_kv_slots: the request needs {need} KV blocks of {KV_BLOCK_SIZE} tokens but "
                               f"only {len(self.free_blocks)} are free; wait for a request to finish or rebuild "
                               "with a larger --kv-blocks")
        slot = self.free_slots.pop(0)
        blocks, self.free_blocks = self.free_blocks[:need], self.free_blocks[need:]
        self.blocks_of[slot] = blocks
        table = np.zeros(self.plan.buffers[IO.BLOCK_TABLE.value].shape[1], np.int32)
        table[:need] = blocks
        w = self.ex.write
        w(IO.BLOCK_TABLE.value, table, (slot,))
        w(IO.TEMPERATURE.value, np.float32(params.temperature), (slot,))
        w(IO.TOP_K.value, np.int32(params.top_k), (slot,))
        w(IO.TOP_P.value, np.float32(params.top_p), (slot,))
        w(IO.SEED.value, np.int32(np.uint32(params.seed & 0xFFFFFFFF).view(np.int32)), (slot,))
        w(IO.MAX_NEW.value, np.int32(params.max_new_tokens), (slot,))
        prompt_buf = np.zeros(self.plan.buffers[IO.PROMPT.value].shape[0], np.int32)
        prompt_buf[:n] = prompt
        w(IO.PROMPT.value, prompt_buf)
        w(IO.N_REAL.value, np.array([n], np.int32))
        w(IO.SLOT.value, np.array([slot], np.int32))
        self.ex.replay(f"prefill_{bucket}")
        return slot

    def release(self, slot: int) -> None:
        self.ex.write(IO.ACTIVE.value, np.int32(0), (slot,))
        self.free_blocks = sorted(self.free_blocks + self.blocks_of.pop(slot))
        self.free_slots = sorted(self.free_slots + [slot])

    # -- decoding ----------------------------------------------------------------------------
    def decode_graph(self) -> str:
        """The smallest decode graph that covers every busy slot (slots fill from 0 up)."""
        top = max(self.blocks_of, default=0) + 1
        return f"decode_{min(b for b in self.shapes.decode_batches if b >= top)}"

    def decode(self, steps: int) -> None:
        """Queue ``steps`` decode replays (slots that finished are skipped on the device)."""
        graph = self.decode_graph()
        for _ in range(steps):
            self.ex.replay(graph)

    def active(self) -> np.ndarray:
        return self.ex.read(IO.ACTIVE.value).astype(bool)

    def tokens(self, slot: int) -> list[int]:
        count = int(self.ex.read(IO.OUT_COUNT.value)[slot])
        return self.ex.read(IO.OUT_TOKENS.value)[slot, :count].tolist()

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
            slots = []
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
            out += [np.stack(rows[s]) for s in slots]
            for s in slots:
                self.release(s)
        return out

    def generate(self, prompts: list[list[int]], params: SamplingParams, chunk: int = 16) -> list[list[int]]:
        """Token ids generated for each prompt, at most ``batch`` prompts at a time."""
        results: list[list[int]] = []
        for start in range(0, len(prompts), self.shapes.batch):
            wave = prompts[start:start + self.shapes.batch]
            slots = [self.add(p, params) for p in wave]
            remaining = params.max_new_tokens - 1
            while remaining > 0 and self.active()[slots].any():
                self.decode(min(chunk, remaining))
                remaining -= chunk
            results += [self.tokens(s) for s in slots]
            for s in slots:
                self.release(s)
        return results
