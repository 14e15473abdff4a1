"""A quantization scheme as one frozen recipe, and the registry of named presets (``--quant``).

A ``QuantRecipe`` says how every weight of a model is stored: the transformer-block linears
(f16, or int4 per output channel or per group, symmetric or with a zero-point, rounded to
nearest or by GPTQ with its options), the LM head (f16, int8 or int4), the embedding table (f16,
int8 or int4), the optional fp16 residual of int4 weights, and, in a mixed recipe (``fine``), the
linears of some kinds stored in finer groups than the rest. ``__post_init__`` refuses
inconsistent combinations with one sentence each. ``QUANT`` holds the presets by name; a build
takes one and overrides its parts from the command line (``dataclasses.replace``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from grokc.core import tensors as names
from grokc.core.errors import BuildOptionError
from grokc.core.ir import WeightFormat

# Largest --fp16-residual: each kept entry costs 6 bytes (i32 column, f16 value), so at 10% the
# residual already outweighs the int4 codes it corrects (0.6 vs 0.5 bytes per weight).
MAX_RESIDUAL = 0.1


# The linears a mixed recipe may store finer: those no fusion pass concatenates, so calibration (which
# sees attn_q, ffn_gate, ...) and the quantize pass (which sees attn_qkv, ffn_gate_up) agree on them.
FINE_KINDS = (names.Tensor.ATTN_OUTPUT.value, names.Tensor.FFN_DOWN.value)


class Rounding(enum.Enum):
    RTN = "rtn"    # round to nearest (rounding.py)
    GPTQ = "gptq"  # calibrated error compensation (gptq.py)


@dataclass(frozen=True)
class QuantRecipe:
    """A weight-quantization scheme. ``name`` is how ``--quant`` and the manifest call it."""

    name: str
    weight_format: WeightFormat          # of the transformer-block LINEARs
    group_size: int = 0                  # 0: per output channel
    symmetric: bool = True
    rounding: Rounding = Rounding.RTN
    act_order: bool = False              # GPTQ: visit columns by decreasing input energy
    clip_search: bool = False            # GPTQ per channel: shrink each row's range where that lowers the error
    damp: float = 0.01                   # GPTQ: fraction of the mean Hessian diagonal added to it
    lm_head: WeightFormat = WeightFormat.F16
    fp16_residual: float = 0.0           # fraction of each int4 weight's entries kept as f16 corrections
    embeddings: WeightFormat = WeightFormat.F16  # the token embedding table: f16, q8 or q4 (round to nearest)
    fine: tuple[str, ...] = ()           # mixed: kinds of FINE_KINDS stored, in every block, ...
    fine_group_size: int = 64            # ... in groups of this many inputs, whatever ``group_size`` says
    rotate: bool = False                 # turn the residual stream and the heads' values first (rotation.py)
    rotate_where_supported: bool = False  # with rotate: a model rotation refuses is quantized unrotated, not refused
    rotated_tied_head: WeightFormat | None = None  # with rotate: a tied LM head's own copy in this format (None: lm_head)
    not_rotated: str = ""                # why a recipe rotating where supported did not rotate this model (for_model)

    def __post_init__(self) -> None:
        if self.weight_format not in (WeightFormat.F16, WeightFormat.Q4):
            raise BuildOptionError(f"quantization '{self.name}' must store f16 or q4 weights")
        if self.lm_head not in (WeightFormat.F16, WeightFormat.Q8, WeightFormat.Q4):
            raise BuildOptionError(f"--lm-head {self.lm_head.value} is not supported; choose fp16, int8 or int4")
        if self.embeddings not in (WeightFormat.F16, WeightFormat.Q8, WeightFormat.Q4):
            raise BuildOptionError(f"--embeddings {self.embeddings.value} is not supported; choose fp16, int8 or int4")
        if self.group_size < 0 or (self.group_size and self.group_size % 8):
            raise BuildOptionError(
                f"--group-size {self.group_size} is invalid; use 0 (per output channel) or a positive multiple of 8"
            )
        if self.rounding is Rounding.GPTQ and WeightFormat.Q4 not in (self.weight_format, self.lm_head):
            raise BuildOptionError(f"quantization '{self.name}' asks for GPTQ rounding but stores no int4 weights")
        if self.rounding is Rounding.RTN and (self.act_order or self.clip_search):
            raise BuildOptionError(f"quantization '{self.name}': act_order and clip_search need GPTQ rounding")
        if self.clip_search and self.group_size and not self.act_order:
            raise BuildOptionError(f"quantization '{self.name}': clip_search with groups needs act_order "
                                   "(static group scales)")
        unknown = [k for k in self.fine if k not in FINE_KINDS]
        if unknown:
            raise BuildOptionError(f"quantization '{self.name}': fine kind {unknown[0]!r} cannot be stored finer; "
                                   f"choose among {', '.join(FINE_KINDS)}")
        if self.fine and (self.fine_group_size <= 0 or self.fine_group_size % 8):
            raise BuildOptionError(f"quantization '{self.name}': fine_group_size {self.fine_group_size} must be a "
                                   "positive multiple of 8")
        if not 0 < self.damp < 1:
            raise BuildOptionError(f"quantization '{self.name}': damp {self.damp} must lie in (0, 1)")
        if not 0 <= self.fp16_residual <= MAX_RESIDUAL:
            raise BuildOptionError(f"--fp16-residual {self.fp16_residual:.4g} is outside [0, {MAX_RESIDUAL:.0%}]; "
                                   "use a small fraction of the weights such as 0.5% (0 turns it off)")
        if self.rotate and self.weight_format is not WeightFormat.Q4:
            raise BuildOptionError(f"--rotate spreads outliers for int4 weights but quantization '{self.name}' "
                                   "stores none; choose an int4 recipe")
        if (self.rotate_where_supported or self.rotated_tied_head is not None) and not self.rotate:
            raise BuildOptionError(f"quantization '{self.name}': rotate_where_supported and rotated_tied_head "
                                   "need rotate")
        if self.rotated_tied_head is not None and self.rotated_tied_head not in _FORMAT_NAMES:
            raise BuildOptionError(f"quantization '{self.name}': rotated_tied_head must be f16, q8 or q4")
        if self.fp16_residual and WeightFormat.Q4 not in (self.weight_format, self.lm_head):
            raise BuildOptionError(f"--fp16-residual corrects int4 weights but quantization '{self.name}' stores "
                                   "none; choose an int4 recipe or --lm-head int4")

    def for_weight(self, weight: str) -> "QuantRecipe":
        """The recipe of one block linear (canonical ``weight`` name, fused or not): for a kind of
        ``fine``, this one with groups of ``fine_group_size``; else this one."""
        parsed = names.parse(weight) if self.fine else None
        if parsed is None or parsed[1] is None or parsed[0].value not in self.fine:
            return self
        return replace(self, group_size=self.fine_group_size, fine=())

    def for_model(self, refusal: str | None, tied: bool) -> "QuantRecipe":
        """The recipe as one model gets it: ``refusal`` says why the model cannot be rotated (None: it
        can), ``tied`` whether its LM head reads the embedding table. A recipe rotating where supported
        leaves a refusing model unrotated and says why (``not_rotated``); a rotated tied head gets
        ``rotated_tied_head``'s format. The result has both options settled (the manifest records
        what was done); a recipe that must rotate is returned for the build to refuse the model."""
        if self.rotate and self.rotate_where_supported and refusal is not None:
            return replace(self, rotate=False, rotate_where_supported=False, rotated_tied_head=None,
                           not_rotated=refusal)
        if not self.rotate:
            return self
        head = self.rotated_tied_head if tied and self.rotated_tied_head is not None else self.lm_head
        return replace(self, lm_head=head, rotate_where_supported=False, rotated_tied_head=None)

    @property
    def calibrated(self) -> bool:
        """True when the recipe needs calibration statistics (``Calibration``)."""
        return self.rounding is Rounding.GPTQ

    @property
    def summary(self) -> str:
        """One line for ``--help`` and ``grokc inspect``."""
        if self.weight_format is WeightFormat.F16:
            return "f16 weights"
        parts = ["per output channel" if not self.group_size else f"groups of {self.group_size}",
                 "symmetric" if self.symmetric else "asymmetric"]
        if self.calibrated:
            parts.append("GPTQ" + "".join(f", {x}" for x, on in (("act-order", self.act_order),
                                                                 ("clip search", self.clip_search)) if on))
        else:
            parts.append("round to nearest")
        if self.fp16_residual:
            parts.append(f"fp16 residual {self.fp16_residual:.3g}")
        if self.fine:
            parts.append(f"{'/'.join(self.fine)} in groups of {self.fine_group_size}")
        if self.rotate:
            parts.append("rotated where supported" if self.rotate_where_supported else "rotated")
        if self.rotated_tied_head is not None:
            parts.append(f"a rotated tied LM head in {_FORMAT_NAMES[self.rotated_tied_head]}")
        if self.not_rotated:
            parts.append(f"not rotated: {self.not_rotated}")
        return ", ".join(parts)

    def uncalibrated(self) -> "QuantRecipe":
        """The same layout with round-to-nearest codes (for weights whose values do not matter)."""
        return replace(self, rounding=Rounding.RTN, act_order=False, clip_search=False)

    def to_json(self) -> dict:
        return {"name": self.name, "weight_format": self.weight_format.value, "group_size": self.group_size,
                "symmetric": self.symmetric, "rounding": self.rounding.value, "act_order": self.act_order,
                "clip_search": self.clip_search, "damp": self.damp, "lm_head": self.lm_head.value,
                "embeddings": self.embeddings.value,
                **({"fp16_residual": self.fp16_residual} if self.fp16_residual else {}),  # absent when off: same bytes as before
                **({"fine": list(self.fine), "fine_group_size": self.fine_group_size} if self.fine else {}),
                **({"rotate": True} if self.rotate else {}),
                **({"rotate_where_supported": True} if self.rotate_where_supported else {}),
                **({"rotated_tied_head": self.rotated_tied_head.value} if self.rotated_tied_head is not None else {}),
                **({"not_rotated": self.not_rotated} if self.not_rotated else {})}


# The weight formats --lm-head, --embeddings and rotated_tied_head may take, by their option names
WEIGHT_FORMATS = {"fp16": WeightFormat.F16, "int8": WeightFormat.Q8, "int4": WeightFormat.Q4}
_FORMAT_NAMES = {f: name for name, f in WEIGHT_FORMATS.items()}


_A = dict(weight_format=WeightFormat.Q4, symmetric=False, rounding=Rounding.GPTQ, act_order=True, clip_search=True)
# The default: rotated where the model allows it (the rest unrotated, the manifest saying why), a tied
# LM head's own copy then int8 (SmolLM2's worst held-out genre: +16.5 %, unrotated +27.5 %; README's quality table).
QUANT: dict[str, QuantRecipe] = {
    "int4": QuantRecipe("int4", **_A, rotate=True, rotate_where_supported=True, rotated_tied_head=WeightFormat.Q8),
    "int4-norot": QuantRecipe("int4-norot", **_A),
    "int4-g128": QuantRecipe("int4-g128", **_A, group_size=128),
    "int4-g64": QuantRecipe("int4-g64", **_A, group_size=64),
    "int4-mixed": QuantRecipe("int4-mixed", **_A, fine=(names.Tensor.FFN_DOWN.value,)),
    "int4-rot": QuantRecipe("int4-rot", **_A, rotate=True),
    "int4-rtn": QuantRecipe("int4-rtn", WeightFormat.Q4),
    "int4-g64-rtn": QuantRecipe("int4-g64-rtn", WeightFormat.Q4, group_size=64, symmetric=False),
    "fp16": QuantRecipe("fp16", WeightFormat.F16),
}
