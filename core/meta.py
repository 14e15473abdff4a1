"""What the passes decide, as typed records: the module's ``meta`` and the manifest's sections.

A pass that decides something about the whole module records it here instead of in an untyped
dict: ``static_shapes`` the ``Shapes``, ``rope_table`` the ``RopeTable``, ``quantize`` the
``QuantInfo``, ``memory_plan`` the ``MemoryPlan``; the pipeline appends to ``passes``. A graph
frontend records what its source had already decided: ``carried``, the int4 grids of weights the
source stored quantized (``CarriedInt4``), which the quantize pass keeps. The records
the runner needs (shapes, RoPE, quantization) are written into ``manifest.json`` as they are
(``to_json``/``from_json``), so the compiler and the runner read one definition.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from grokc.core.config import RopeConfig

if TYPE_CHECKING:
    from grokc.core.ir import TensorType


@dataclass(frozen=True)
class Shapes:
    """The static shapes every graph of the artifact was compiled for."""

    batch: int                          # decode slots
    buckets: tuple[int, ...]            # prefill lengths, increasing
    max_seq: int                        # longest sequence a slot holds (prompt + generated)
    decode_batches: tuple[int, ...]     # batch sizes with a decode graph: 1, 2, 4, ... and batch
    kv_block_size: int                  # tokens per KV-cache block
    kv_blocks: int                      # blocks in the shared pool
    max_blocks_per_seq: int             # blocks one slot can hold

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "buckets": list(self.buckets), "decode_batches": list(self.decode_batches)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Shapes":
        return cls(**{**d, "buckets": tuple(d["buckets"]), "decode_batches": tuple(d["decode_batches"])})


@dataclass(frozen=True)
class RopeTable:
    """One RoPE lookup table the artifact stores (``passes/rope_table.py``): a model has one per RoPE
    (``core/rope.py``'s ``ropes``)."""

    name: str              # the table's parameter ("rope_table")
    inv_freq: str          # the frequencies' parameter ("rope_inv_freq"), for positions past the table
    config: RopeConfig
    table_length: int      # positions covered; later ones are computed on the fly
    mscale: float          # attention scaling folded into the table
    table_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "config": self.config.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RopeTable":
        return cls(**{**d, "config": RopeConfig.from_json(d["config"])})


@dataclass(frozen=True)
class QuantInfo:
    """How the weights were stored: the recipe (``quant/recipe.py``'s ``to_json``), how it was
    calibrated, and the build's quality report when there was one."""

    recipe: Mapping[str, Any]
    calibration: Mapping[str, Any] | None = None
    quality: Mapping[str, Any] | None = None
    carried: Mapping[str, Any] | None = None   # int4 weights kept on the source's own grid (CarriedInt4)

    @property
    def name(self) -> str:
        return self.recipe["name"]

    @property
    def weight_format(self) -> str:
        return self.recipe["weight_format"]

    def to_json(self) -> dict[str, Any]:
        """The recipe's fields, plus ``calibration``, ``quality`` and ``carried`` where present."""
        d = dict(self.recipe)
        for key in ("calibration", "quality", "carried"):
            if getattr(self, key) is not None:
                d[key] = dict(getattr(self, key))
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "QuantInfo":
        recipe = {k: v for k, v in d.items() if k not in ("calibration", "quality", "carried")}
        return cls(recipe, d.get("calibration"), d.get("quality"), d.get("carried"))


@dataclass(frozen=True)
class Placement:
    buffer: str         # unique arena buffer name ("decode:blk.3.attn_qkv", or the state name)
    offset: int
    type: TensorType
    scratch: bool


@dataclass(frozen=True)
class MemoryPlan:
    """One arena: state buffers at fixed offsets, then a scratch region the graphs share
    (``passes/memory_plan.py``)."""

    arena_bytes: int
    state: Mapping[str, Placement]                    # state name -> placement
    scratch: Mapping[str, Mapping[str, Placement]]    # graph -> tensor -> placement
    scratch_naive_bytes: int                          # what the scratch would take without reuse

    def placement(self, graph: str, tensor: str) -> Placement:
        return self.scratch[graph][tensor] if tensor in self.scratch[graph] else self.state[tensor]


@dataclass(frozen=True)
class CarriedInt4:
    """The int4 grid a source model already quantized one weight ``[N, K]`` on (an ONNX
    ``MatMulNBits``): f32 ``scales [N, G]`` and ``zeros [N, G]`` (None: symmetric, code 8) per
    ``group_size`` inputs, ``G = ceil(K / group_size)``. The weight's f32 values lie on it exactly."""

    scales: Any                # np.ndarray f32 [N, G]
    zeros: Any | None          # np.ndarray f32 [N, G] or None
    group_size: int
    source: str                # what the source called it, for the manifest ("MatMulNBits")


@dataclass(frozen=True)
class ModuleMeta:
    """Everything the passes decided about a module; ``None`` until the pass that decides it ran."""

    shapes: Shapes | None = None
    rope: tuple[RopeTable, ...] = ()
    quant: QuantInfo | None = None
    memory: MemoryPlan | None = None
    passes: tuple[str, ...] = field(default=())
    carried: Mapping[str, CarriedInt4] = field(default_factory=dict)  # canonical weight name -> grid
    residual_scale: float = 1.0   # the residual stream is stored times this (passes/scale_residual.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passes", tuple(self.passes))
        object.__setattr__(self, "rope", tuple(self.rope))

    def rope_table(self, name: str) -> RopeTable:
        """The record of the RoPE table parameter ``name``."""
        return next(r for r in self.rope if r.name == name)

