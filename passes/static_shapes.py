"""Static shapes: one graph per prompt bucket and one decode graph, over a paged KV cache.

What: the symbolic ``forward`` graph (``T`` tokens of one sequence) is instantiated as
- ``prefill_<L>`` for each bucket ``L``: the prompt is padded to ``L`` tokens at positions
  ``0..L-1`` and written into slot ``io.slot`` of the KV cache; only the last real token's row
  goes through the LM head (a TAKE_LAST node in front of it), and a SAMPLE node picks the first
  generated token and arms the slot for decoding;
- ``decode_<b>`` for each decode batch ``b`` (powers of two below ``batch``, and ``batch``): one
  token for each of slots ``0..b-1`` at ``io.positions``, attending over the slot's cached
  tokens, then SAMPLE, which feeds the token and next position back on the device. The runner
  replays the smallest graph that covers its highest busy slot, so one request decodes with
  ``M = 1`` kernels even when the build serves 8 (as vLLM and TensorRT-LLM capture a CUDA graph
  per batch size).
Per-step inputs (``artifacts.plan.IO``) and the KV cache (``kv.<i>.k``/``kv.<i>.v``, f16
``[kv_blocks, n_kv_heads, 16, head_dim]``) become module state shared by all graphs.

Requires: fused attention (``fuse_attention``) and RoPE tables (``rope_table``); a ``forward``
graph whose single output is the logits of a LINEAR.
Guarantees: every tensor shape is static; ``forward`` is gone; ``meta.shapes`` records batch,
buckets, max_seq and the KV geometry; padded tokens never reach the cache (the attention op's
contract).
Not handled: chunked prefill of prompts longer than the largest bucket (the runner refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from grokc.abi.ops import KV_BLOCK_SIZE
from grokc.artifacts.plan import IO
from grokc.core.errors import BuildOptionError
from grokc.core.ir import AttnMode, DType, Graph, Module, Node, OpKind, TensorType, frozen_array
from grokc.core.meta import Shapes
from grokc.passes._graph import rebuild_module

EOS_IDS = "sampling.eos_ids"


MAX_BATCH = 65535   # CUDA's limit on gridDim.y, which the decode attention launch spends on slots

@dataclass(frozen=True)
class StaticShapes:
    batch: int
    buckets: tuple[int, ...]
    max_seq: int
    kv_blocks: int = 0  # 0: enough for every slot to hold max_seq tokens
    one_decode_graph: bool = False  # only decode_<batch>: every step runs the same kernels (deterministic builds)

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_seq // KV_BLOCK_SIZE)

    @property
    def decode_batches(self) -> tuple[int, ...]:
        """Batch sizes that get a decode graph: 1, 2, 4, ... below ``batch``, and ``batch`` (only
        ``batch`` with ``one_decode_graph``)."""
        sizes = [] if self.one_decode_graph else [1 << i for i in range(self.batch.bit_length()) if (1 << i) < self.batch]
        return tuple(sizes + [self.batch])

    @property
    def pool_blocks(self) -> int:
        return self.kv_blocks or self.batch * self.max_blocks_per_seq

    def validate(self, context: int) -> None:
        if not 1 <= self.batch <= MAX_BATCH:
            raise BuildOptionError(f"--batch {self.batch} is invalid; use 1 to {MAX_BATCH} (a decode launch's grid "
                                   "has one row of blocks per slot)")
        if not self.buckets or list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 1:
            raise BuildOptionError(f"--buckets {','.join(map(str, self.buckets))} must be increasing positive lengths")
        if self.max_seq > context:
            raise BuildOptionError(f"--max-seq {self.max_seq} exceeds the model's context of {context} tokens; "
                                   f"use --max-seq {context} or less")
        if self.buckets[-1] > self.max_seq:
            raise BuildOptionError(f"bucket {self.buckets[-1]} is larger than --max-seq {self.max_seq}; "
                                   "drop it or raise --max-seq")
        if self.kv_blocks and self.kv_blocks < self.max_blocks_per_seq:
            raise BuildOptionError(f"--kv-blocks {self.kv_blocks} cannot hold one {self.max_seq}-token sequence; "
                                   f"use at least {self.max_blocks_per_seq}")

    def record(self) -> Shapes:
        """What the artifact records of these shapes (``core/meta.py``)."""
        return Shapes(self.batch, tuple(self.buckets), self.max_seq, self.decode_batches, KV_BLOCK_SIZE,
                      self.pool_blocks, self.max_blocks_per_seq)


def run(module: Module, shapes: StaticShapes) -> Module:
    c = module.config
    shapes.validate(c.max_position_embeddings)
    fwd = module.graphs["forward"]
    graphs = {f"prefill_{L}": _instantiate(fwd, f"prefill_{L}", L, AttnMode.PREFILL) for L in shapes.buckets}
    for b in shapes.decode_batches:
        graphs[f"decode_{b}"] = _instantiate(fwd, f"decode_{b}", b, AttnMode.DECODE)
    eos = np.array(c.eos_token_ids or (-1,), dtype=np.int32)
    return rebuild_module(module, graphs, {EOS_IDS: frozen_array(eos)}, state=_state(module, shapes),
                          meta=replace(module.meta, shapes=shapes.record()))


def _state(module: Module, s: StaticShapes) -> dict[str, TensorType]:
    c = module.config
    b, i32, f32 = s.batch, DType.I32, DType.F32
    state = {
        IO.PROMPT.value: TensorType((s.buckets[-1],), i32),
        IO.N_REAL.value: TensorType((1,), i32),
        IO.SLOT.value: TensorType((1,), i32),
        IO.TOKENS.value: TensorType((b,), i32),
        IO.POSITIONS.value: TensorType((b,), i32),
        IO.ACTIVE.value: TensorType((b,), i32),
        IO.BLOCK_TABLE.value: TensorType((b, s.max_blocks_per_seq), i32),
        IO.TEMPERATURE.value: TensorType((b,), f32),
        IO.TOP_K.value: TensorType((b,), i32),
        IO.TOP_P.value: TensorType((b,), f32),
        IO.SEED.value: TensorType((b,), i32),
        IO.MAX_NEW.value: TensorType((b,), i32),
        IO.OUT_TOKENS.value: TensorType((b, s.max_seq), i32),
        IO.OUT_COUNT.value: TensorType((b,), i32),
    }
    cache = TensorType((s.pool_blocks, c.num_kv_heads, KV_BLOCK_SIZE, c.head_dim), DType.F16)
    for layer in range(c.num_layers):
        state[f"kv.{layer}.k"] = cache
        state[f"kv.{layer}.v"] = cache
    return state


def _instantiate(fwd: Graph, name: str, tokens: int, mode: AttnMode) -> Graph:
    prefill = mode is AttnMode.PREFILL
    renames = {"tokens": IO.PROMPT.value if prefill else IO.TOKENS.value, "positions": IO.POSITIONS.value}
    (logits,) = fwd.outputs
    types = {k: TensorType(tuple(tokens if d == "T" else d for d in t.shape), t.dtype) for k, t in fwd.tensors.items()
             if k not in fwd.inputs}
    nodes: list[Node] = []
    for n in fwd.nodes:
        inputs = {r: renames.get(s, s) for r, s in n.inputs.items()}
        if n.op is OpKind.ATTENTION:
            assert n.attrs.fused_rope, "static_shapes needs fused attention"
            inputs.pop("positions")
            inputs.update(k_cache=f"kv.{n.attrs.layer}.k", v_cache=f"kv.{n.attrs.layer}.v",
                          block_table=IO.BLOCK_TABLE.value)
            inputs.update({"slot": IO.SLOT.value, "n_real": IO.N_REAL.value} if prefill else
                          {"positions": IO.POSITIONS.value, "active": IO.ACTIVE.value})
            n = Node(n.op, n.name, inputs, n.outputs, replace(n.attrs, mode=mode))
        elif n.op is OpKind.MOE_ROUTE and prefill:   # padding tokens are not routed
            n = Node(n.op, n.name, {**inputs, "n_real": IO.N_REAL.value}, n.outputs, n.attrs)
        elif n.outputs == (logits,) and prefill:
            last = f"{n.inputs['x']}.last"
            types[last] = TensorType((1, types[n.inputs["x"]].shape[1]), types[n.inputs["x"]].dtype)
            types[logits] = TensorType((1, types[logits].shape[1]), DType.F32)
            nodes.append(Node(OpKind.TAKE_LAST, "take_last", {"x": inputs["x"], "n_real": IO.N_REAL.value}, (last,)))
            inputs["x"] = last
            n = Node(n.op, n.name, inputs, n.outputs, n.attrs)
        else:
            n = Node(n.op, n.name, inputs, n.outputs, n.attrs)
        nodes.append(n)
    sample_inputs = {"logits": logits, **{io.name.lower(): io.value for io in (
        IO.TEMPERATURE, IO.TOP_K, IO.TOP_P, IO.SEED, IO.TOKENS, IO.POSITIONS, IO.ACTIVE, IO.OUT_TOKENS,
        IO.OUT_COUNT, IO.MAX_NEW)}, "eos_ids": EOS_IDS}
    if prefill:
        sample_inputs.update(slot=IO.SLOT.value, n_real=IO.N_REAL.value)
    nodes.append(Node(OpKind.SAMPLE, "sample", sample_inputs, ()))
    return Graph(name, tuple(nodes), (), (logits,), types)
