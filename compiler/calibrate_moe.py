"""Calibration statistics of a mixture-of-experts layer, expert by expert, for GPTQ.

Each expert sees only the tokens routed to it, so its statistics come from those: for expert
``e`` of layer ``i``, ``S_e = sum x x^T`` over its tokens' normed inputs (its gate and up rows'
input) and ``D_e = sum a a^T`` over its activations ``a = act(gate_e x) * up_e x`` (its down rows'
input), routed by the torch model's own router on the calibration text. The shared expert's chunks
(``passes/fuse_moe.py``) see every token.

Experts that see few tokens: a few hundred tokens cannot pin down a ``[K, K]`` second moment (its
rank is at most the token count), and GPTQ on such a matrix fits the handful of tokens seen rather
than the expert's inputs in general. Each expert's matrix is therefore shrunk towards the pooled
one of its layer, as if ``PRIOR_TOKENS`` more tokens had been drawn from it::

    H_e = (S_e + PRIOR_TOKENS * P) / (n_e + PRIOR_TOKENS)

with ``P`` the mean ``x x^T`` of every token reaching the layer (gate/up: the same normed input
all experts read) or of every expert's activations (down). An expert no calibration token chose
gets ``P`` itself; one with thousands of tokens keeps mostly its own. The token counts go into the
manifest (``calibration.experts``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from grokc.compiler.models import moe as moe_model
from grokc.core import tensors as names
from grokc.core.config import ModelConfig
from grokc.passes import fuse_moe

PRIOR_TOKENS = 256  # pooled tokens each expert's statistics are shrunk with

Quantizer = Callable[[str, np.ndarray, np.ndarray], np.ndarray]  # (weight name, W f32, H) -> dequantized W


class ExpertStats:
    """The running sums of one MoE layer's inputs; ``hook`` records them (a forward hook on the
    block's ``ffn_norm``, whose output every expert reads)."""

    def __init__(self, block: nn.Module, cfg: ModelConfig, layer: int):
        self.block, self.cfg, self.layer = block, cfg, layer
        moe = cfg.moe
        self.chunks = fuse_moe.shared_chunks(moe.shared_size, moe.expert_size) if moe.shared_size else 0
        stacked = moe.n_experts + self.chunks
        self.inputs = [torch.zeros(cfg.hidden_size, cfg.hidden_size, dtype=torch.float64) for _ in range(stacked)]
        self.acts = [torch.zeros(moe.expert_size, moe.expert_size, dtype=torch.float64) for _ in range(stacked)]
        self.tokens = np.zeros(stacked, np.int64)
        self.pool = torch.zeros(cfg.hidden_size, cfg.hidden_size, dtype=torch.float64)
        self.pool_tokens = 0

    @torch.no_grad()
    def hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        moe, b, act = self.cfg.moe, self.block, moe_model.act_name(self.cfg)
        x = output.reshape(-1, output.shape[-1]).float()                                # [T, H]
        xtx = (x.T @ x).double()
        self.pool += xtx
        self.pool_tokens += x.shape[0]
        _, experts = moe_model.route(x, b.ffn_gate_inp.weight, moe.top_k, moe.norm_top_k)
        for e in torch.unique(experts).tolist():
            xe = x[(experts == e).any(-1)]
            a = moe_model.activation(xe, b.ffn_gate_exps.weight[e], b.ffn_up_exps.weight[e], act)
            self.inputs[e] += (xe.T @ xe).double()
            self.acts[e] += (a.T @ a).double()
            self.tokens[e] += xe.shape[0]
        if self.chunks:
            a = moe_model.activation(x, b.ffn_gate_shexp.weight, b.ffn_up_shexp.weight, act)       # [T, Is]
            a = F.pad(a, (0, self.chunks * moe.expert_size - a.shape[1])).reshape(x.shape[0], self.chunks, -1)
            for j in range(self.chunks):
                e = moe.n_experts + j
                self.inputs[e] += xtx
                self.acts[e] += (a[:, j].T @ a[:, j]).double()
                self.tokens[e] += x.shape[0]

    def hessians(self) -> dict[str, np.ndarray]:
        """Each expert's shrunk second moments (module docstring), keyed as ``passes/quantize_moe.py`` asks."""
        gate_up = names.name(names.Tensor.FFN_GATE_UP_EXPS, self.layer)
        down = names.name(names.Tensor.FFN_DOWN_EXPS, self.layer)
        pool_in = self.pool / max(self.pool_tokens, 1)
        pool_act = sum(self.acts) / max(int(self.tokens.sum()), 1)
        out = {}
        for e, n in enumerate(self.tokens.tolist()):
            out[names.expert_key(gate_up, e)] = _shrunk(self.inputs[e], n, pool_in)
            out[names.expert_key(down, e)] = _shrunk(self.acts[e], n, pool_act)
        return out

    @torch.no_grad()
    def quantize(self, quantize: Quantizer, hessians: dict[str, np.ndarray]) -> None:
        """Replace the block's expert weights by their stored values (as ``quantize_moe`` will quantize
        them: stacked with the shared chunks, expert by expert), for sequential calibration."""
        b, moe = self.block, self.cfg.moe
        w = {k: None if moe_model.weight(b, k) is None else moe_model.weight(b, k).numpy()
             for k in moe_model.ROUTED + moe_model.SHARED}
        gate, up, down = w["ffn_gate_exps"], w["ffn_up_exps"], w["ffn_down_exps"]
        if self.chunks:
            gate, up, down = fuse_moe.with_shared(gate, up, down, w["ffn_gate_shexp"], w["ffn_up_shexp"],
                                                   w["ffn_down_shexp"])
        stacked = {"gate_up": (names.name(names.Tensor.FFN_GATE_UP_EXPS, self.layer), np.concatenate([gate, up], 1)),
                   "down": (names.name(names.Tensor.FFN_DOWN_EXPS, self.layer), down)}
        deq = {part: np.stack([quantize(wname, a[e], hessians[names.expert_key(wname, e)]) for e in range(a.shape[0])])
               for part, (wname, a) in stacked.items()}
        canonical = fuse_moe.canonical_weights(self.layer, w["ffn_gate_inp"], deq["gate_up"], deq["down"],
                                               moe.n_experts, moe.shared_size)
        for key, value in canonical.items():
            kind = names.parse(key)[0].value
            if kind != "ffn_gate_inp":                           # the router stays as it is (f16 in the artifact)
                getattr(b, kind).weight.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def _shrunk(own: torch.Tensor, n: int, pool: torch.Tensor) -> np.ndarray:
    return ((own + PRIOR_TOKENS * pool) / (n + PRIOR_TOKENS)).float().numpy()


def summary(stats: list[ExpertStats]) -> dict:
    """What the manifest records of the experts' calibration: the prior, and the tokens each saw."""
    counts = np.concatenate([s.tokens[:s.cfg.moe.n_experts] for s in stats])
    return {"prior_tokens": PRIOR_TOKENS, "fewest_tokens": int(counts.min()), "most_tokens": int(counts.max()),
            "experts_below_prior": int((counts < PRIOR_TOKENS).sum()), "routed_experts": int(counts.size)}
