"""The graph plan: what the runner replays, as plain data.

One ``Plan`` per architecture (``<arch>/plan.json`` in an artifact). It holds

- the memory plan: one arena; every buffer (per-step inputs, KV cache, intermediates) at a fixed
  byte offset. Buffers of kind ``io`` and ``state`` are persistent; ``scratch`` buffers of
  different graphs may overlap because graphs never run at the same time;
- one ``GraphPlan`` per graph (``prefill_<L>`` per bucket, ``decode_<b>`` per decode batch size,
  ``init`` for synthetic weights): the ordered kernel
  launches, each with kernel symbol, grid, block, dynamic shared memory and its arguments in
  ``kernel_abi.KERNEL_ABI`` order.

The runner turns each ``GraphPlan`` into a CUDA graph once at load and replays it; the CPU
executor runs the same launches with numpy. Nothing here knows about torch or the compiler.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grokc.artifacts.field_types import check_field_types
from grokc.core.errors import ArtifactError
from grokc.core.meta import Shapes


class BufferKind(enum.Enum):
    IO = "io"            # per-step inputs/outputs the host reads or writes between replays
    STATE = "state"      # persistent device state (the KV cache)
    SCRATCH = "scratch"  # intermediates, live only inside one graph


class IO(enum.Enum):
    """The per-step buffers every plan has, by role. ``B`` slots, ``MB`` KV blocks per slot."""

    PROMPT = "io.prompt"            # i32 [max_bucket]   token ids of the prompt being prefilled
    N_REAL = "io.n_real"            # i32 [1]            real tokens in the prompt
    SLOT = "io.slot"                # i32 [1]            slot the prompt is prefilled into
    TOKENS = "io.tokens"            # i32 [B]            next input token of each slot
    POSITIONS = "io.positions"      # i32 [B]            position of that token
    ACTIVE = "io.active"            # i32 [B]            1 while the slot is generating
    BLOCK_TABLE = "io.block_table"  # i32 [B, MB]        KV blocks of each slot
    TEMPERATURE = "io.temperature"  # f32 [B]
    TOP_K = "io.top_k"              # i32 [B]
    TOP_P = "io.top_p"              # f32 [B]
    SEED = "io.seed"                # i32 [B]
    MAX_NEW = "io.max_new"          # i32 [B]            tokens to generate, the first included
    OUT_TOKENS = "io.out_tokens"    # i32 [B, max_seq]   generated tokens of each slot
    OUT_COUNT = "io.out_count"      # i32 [B]            how many are in out_tokens


@dataclass(frozen=True)
class Buffer:
    name: str
    kind: BufferKind
    dtype: str  # numpy dtype name: "float16", "float32", "int32", "uint8"
    shape: tuple[int, ...]
    offset: int  # bytes from the arena base, aligned to ARENA_ALIGN

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * _ITEMSIZE[self.dtype]


_ITEMSIZE = {"float16": 2, "float32": 4, "int32": 4, "uint8": 1}
ARENA_ALIGN = 256


@dataclass(frozen=True)
class Arg:
    """One kernel argument: exactly one of buffer, weight, value is set (none: a null pointer)."""

    param: str
    buffer: str | None = None
    weight: str | None = None
    value: int | float | None = None

    def to_json(self) -> dict:
        d: dict[str, Any] = {"param": self.param}
        for key in ("buffer", "weight", "value"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


@dataclass(frozen=True)
class Launch:
    op: str            # a KERNEL_ABI key
    kernel: str        # symbol in this arch's cubin
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int          # dynamic shared memory, bytes
    args: tuple[Arg, ...]
    attrs: dict[str, str] = field(default_factory=dict)  # the op's variant (KERNEL_VARIANTS)
    node: str = ""     # the IR node it came from, for inspect and debugging
    rule: str = ""     # the kernel rule that chose it
    pdl: bool = False  # the kernel waits with griddepcontrol: it may start while the launch before
                       # it finishes (a programmatic edge in the CUDA graph; sm_90+)

    def arg(self, param: str) -> Arg:
        for a in self.args:
            if a.param == param:
                return a
        raise KeyError(param)


@dataclass(frozen=True)
class GraphPlan:
    name: str          # "prefill_128", "decode_4", "init"
    tokens: int        # tokens per replay: the bucket length, or B for decode
    launches: tuple[Launch, ...]
    logits: str        # buffer holding the last logits after a replay (f32 [M, vocab])


@dataclass(frozen=True)
class Plan:
    arch: str
    arena_bytes: int
    buffers: dict[str, Buffer]
    graphs: dict[str, GraphPlan]

    def validate(self, *, weights: Mapping[str, Any] | None = None, shapes: Shapes | None = None,
                 vocab: int | None = None, kernels: frozenset[str] | None = None) -> None:
        """Raise ``ArtifactError`` unless the plan is safe to bind: ``artifacts/plan_checks.py`` says what
        is checked; each argument given (weights' dtypes and shapes, the manifest's shapes and
        vocabulary, the kernels file's symbols) is checked against too."""
        from grokc.artifacts.plan_checks import check_plan

        check_plan(self, f"the {self.arch} plan", weights=weights, shapes=shapes, vocab=vocab, kernels=kernels)

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "arch": self.arch,
            "arena_bytes": self.arena_bytes,
            "buffers": {
                name: {"kind": b.kind.value, "dtype": b.dtype, "shape": list(b.shape), "offset": b.offset}
                for name, b in self.buffers.items()
            },
            "graphs": {
                name: {
                    "tokens": g.tokens,
                    "logits": g.logits,
                    "launches": [
                        {
                            "op": l.op, "kernel": l.kernel, "grid": list(l.grid), "block": list(l.block),
                            "smem": l.smem, "args": [a.to_json() for a in l.args], "attrs": l.attrs,
                            "node": l.node, "rule": l.rule, "pdl": l.pdl,
                        }
                        for l in g.launches
                    ],
                }
                for name, g in self.graphs.items()
            },
        }

    @classmethod
    def from_json(cls, d: Any) -> "Plan":
        """The plan of ``plan.json``'s parsed JSON; ``ArtifactError`` when it is not one (every field of
        its declared type; ``validate`` checks what the values mean)."""
        try:
            plan = cls._from_json(d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ArtifactError(f"plan.json does not describe a grokc plan ({type(e).__name__}: {str(e)[:200]}); "
                                "rebuild the artifact") from None
        check_field_types(plan, "plan.json")
        return plan

    @classmethod
    def _from_json(cls, d: dict) -> "Plan":
        buffers = {
            name: Buffer(name, BufferKind(b["kind"]), b["dtype"], tuple(b["shape"]), b["offset"])
            for name, b in d["buffers"].items()
        }
        graphs = {
            name: GraphPlan(
                name=name,
                tokens=g["tokens"],
                logits=g["logits"],
                launches=tuple(
                    Launch(
                        op=l["op"], kernel=l["kernel"], grid=tuple(l["grid"]), block=tuple(l["block"]),
                        smem=l["smem"], args=tuple(Arg(**a) for a in l["args"]), attrs=dict(l["attrs"]),
                        node=l["node"], rule=l["rule"], pdl=l["pdl"],
                    )
                    for l in g["launches"]
                ),
            )
            for name, g in d["graphs"].items()
        }
        return cls(arch=d["arch"], arena_bytes=d["arena_bytes"], buffers=buffers, graphs=graphs)
