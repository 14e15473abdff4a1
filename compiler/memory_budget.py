"""The device memory an artifact needs, stated by the build and held to a budget (``--max-memory``).

A GPU holds one arena per plan (the KV cache, the per-step buffers and the graphs' shared scratch:
``passes/memory_plan.py``) and the weights, each at a 256-byte aligned offset (``runner/gpu.py``).
``check_kv`` runs before any work, on the KV cache alone, which the options decide; ``check_plan``
runs on each lowered plan with the stored weights and returns the line the build prints. Either
raises ``BuildOptionError`` naming the sizes and the budget when the artifact would not fit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from grokc.abi.ops import KV_BLOCK_SIZE
from grokc.artifacts.plan import Plan
from grokc.core.config import ModelConfig
from grokc.core.errors import BuildOptionError
from grokc.passes.static_shapes import StaticShapes

DEFAULT_BUDGET = 64 << 30   # 64 GiB: a typo such as --batch 100000 is refused; an 80 GB GPU's user raises it
WEIGHT_ALIGN = 256
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
FIX = "lower --batch, --max-seq or --kv-blocks, or raise --max-memory"


def parse_size(text: str, option: str = "--max-memory") -> int:
    """``"64GiB"``, ``"80G"`` (binary), ``"500MB"`` (decimal) or plain bytes -> bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if match is None or match.group(2).lower() not in _UNITS or float(match.group(1)) <= 0:
        raise BuildOptionError(f"{option} '{text}' must be a positive size such as 64GiB, 80G or 500MB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def kv_bytes(cfg: ModelConfig, shapes: StaticShapes) -> int:
    """Bytes of the KV cache: f16 k and v per layer, ``[pool blocks, kv heads, 16, head_dim]``."""
    return cfg.num_layers * 2 * shapes.pool_blocks * cfg.num_kv_heads * KV_BLOCK_SIZE * cfg.head_dim * 2


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_kv(cfg: ModelConfig, shapes: StaticShapes, budget: int) -> None:
    """Refuse options whose KV cache alone is over ``budget``."""
    kv = kv_bytes(cfg, shapes)
    if kv > budget:
        raise BuildOptionError(f"the KV cache of {shapes.pool_blocks} blocks of {KV_BLOCK_SIZE} tokens (batch "
                               f"{shapes.batch}, max-seq {shapes.max_seq}) needs {_gib(kv)}, more than the "
                               f"--max-memory budget of {_gib(budget)}; {FIX}")


def weight_bytes(weights: Mapping[str, np.ndarray]) -> int:
    """Bytes the weights take on the device, each at a 256-byte aligned offset."""
    return sum(-(-int(a.nbytes) // WEIGHT_ALIGN) * WEIGHT_ALIGN for a in weights.values())


def check_plan(plan: Plan, weights: int, kv: int, budget: int) -> str:
    """The memory line of a lowered plan; ``BuildOptionError`` when arena + weights pass ``budget``."""
    need = plan.arena_bytes + weights
    line = (f"memory for {plan.arch}: arena {_gib(plan.arena_bytes)} (KV cache {_gib(kv)}) + weights "
            f"{_gib(weights)} = {_gib(need)} of the {_gib(budget)} budget")
    if need > budget:
        raise BuildOptionError(f"the {plan.arch} artifact needs {_gib(need)} of device memory (arena "
                               f"{_gib(plan.arena_bytes)}, of which KV cache {_gib(kv)}, and weights {_gib(weights)}), "
                               f"more than the --max-memory budget of {_gib(budget)}; {FIX}")
    return line
