"""The mixture-of-experts FFN of grokc's torch model: its parameters, its reference semantics as
one ``grokc::moe`` op, and the routing that calibration reads.

A block whose config has ``moe`` holds, in place of ``ffn_gate``/``ffn_up``/``ffn_down``, the
router ``ffn_gate_inp`` [E, H] and the experts stacked as GGUF stores them (``ffn_gate_exps``,
``ffn_up_exps`` [E, I, H], ``ffn_down_exps`` [E, H, I]), plus a shared expert (``ffn_*_shexp``,
and ``ffn_gate_inp_shexp`` [1, H] for its sigmoid gate) where the config has one. ``torch.export``
keeps ``grokc::moe`` as one node (``compiler/trace.py`` makes it a MOE node); the passes turn it
into device-side routing and expert kernels (``passes/fuse_moe.py``).

Semantics (``core/config.py``'s ``MoeConfig``), computed in fp32 whatever the input dtype:
``p = softmax(x @ router^T)``; the ``top_k`` largest ``p`` of each token, in decreasing order,
pick its experts, weighted by those ``p`` (divided by their sum when ``norm_top_k``); the output
is the weighted sum of ``down_e(act(gate_e x) * up_e x)`` over the chosen ``e``, plus the shared
expert's ``down(act(gate x) * up x)`` times ``sigmoid(x . gate_inp_shexp)`` (or 1 without a gate).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.library import custom_op
from torch.nn import functional as F

from grokc.core.config import ModelConfig, MoeConfig
from grokc.core.errors import UnsupportedModel

ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}

# Block attributes (canonical kinds) of the routed and the shared experts, in op argument order.
ROUTED = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
SHARED = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp")


class Weight(nn.Module):
    """One parameter named ``<module>.weight``, so that a block's tensors keep their canonical names."""

    def __init__(self, *shape: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape))


def add_params(block: nn.Module, cfg: ModelConfig) -> None:
    """Give ``block`` the MoE FFN's parameters of ``cfg`` under their canonical names."""
    moe, h = cfg.moe, cfg.hidden_size
    e, i = moe.n_experts, moe.expert_size
    for kind, shape in zip(ROUTED, ((e, h), (e, i, h), (e, i, h), (e, h, i))):
        setattr(block, kind, Weight(*shape))
    if moe.shared_size:
        s = moe.shared_size
        for kind, shape in zip(SHARED, ((s, h), (s, h), (h, s), (1, h))):
            if kind != "ffn_gate_inp_shexp" or moe.shared_gate:
                setattr(block, kind, Weight(*shape))


def act_name(cfg: ModelConfig) -> str:
    """The experts' gated activation, a key of ``ACTIVATIONS``: the config's (Grok-1's GELU)."""
    return cfg.activation.value


def weight(block: nn.Module, kind: str) -> torch.Tensor | None:
    """``block``'s parameter of ``kind`` (a name of ``ROUTED`` or ``SHARED``), or None where it has none."""
    return getattr(block, kind).weight if hasattr(block, kind) else None


def ffn(block: nn.Module, x: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """The MoE FFN of ``block`` on its normed input ``x [T, H]`` -> ``[T, H]``."""
    moe = cfg.moe
    return torch.ops.grokc.moe(x, *(weight(block, k) for k in ROUTED + SHARED), moe.top_k, moe.norm_top_k,
                               act_name(cfg))


def route(x: torch.Tensor, router: torch.Tensor, top_k: int, norm_top_k: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights f32 [T, k], experts i64 [T, k])`` of each token, largest softmax probability first."""
    probs = torch.softmax(F.linear(x.float(), router.float()), dim=-1)      # [T, E]
    weights, experts = torch.topk(probs, top_k, dim=-1)                     # [T, k]
    if norm_top_k:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, experts


def activation(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """``act(gate x) * up x`` in fp32 (the down projection's input): ``x [T, H]``, ``gate``/``up`` [I, H]."""
    x = x.float()
    return ACTIVATIONS[act](F.linear(x, gate.float())) * F.linear(x, up.float())


def gated_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, act: str) -> torch.Tensor:
    """``down(act(gate x) * up x)`` in fp32, ``down`` [H, I]."""
    return F.linear(activation(x, gate, up, act), down.float())


@custom_op("grokc::moe", mutates_args=())
def moe(x: torch.Tensor, router: torch.Tensor, gate_exps: torch.Tensor, up_exps: torch.Tensor,
        down_exps: torch.Tensor, shexp_gate: torch.Tensor | None, shexp_up: torch.Tensor | None,
        shexp_down: torch.Tensor | None, shexp_gate_inp: torch.Tensor | None, top_k: int, norm_top_k: bool,
        act: str) -> torch.Tensor:
    """The MoE FFN of ``x [T, H]`` (module docstring), in x's dtype."""
    weights, experts = route(x, router, top_k, norm_top_k)
    y = torch.zeros(x.shape, dtype=torch.float32)
    for e in torch.unique(experts).tolist():
        rows, slot = torch.nonzero(experts == e, as_tuple=True)
        out = gated_mlp(x[rows], gate_exps[e], up_exps[e], down_exps[e], act)
        y.index_add_(0, rows, out * weights[rows, slot, None])
    if shexp_gate is not None:
        shared = gated_mlp(x, shexp_gate, shexp_up, shexp_down, act)
        if shexp_gate_inp is not None:
            shared = shared * torch.sigmoid(F.linear(x.float(), shexp_gate_inp.float()))   # [T, 1]
        y = y + shared
    return y.to(x.dtype)


@moe.register_fake
def _(x, router, gate_exps, up_exps, down_exps, shexp_gate, shexp_up, shexp_down, shexp_gate_inp, top_k, norm_top_k,
      act):
    return torch.empty_like(x)


def refuse_dense_layers(raw: dict, where: str) -> None:
    """Refuse a Qwen-MoE config.json with dense MLP layers between the sparse ones
    (``decoder_sparse_step`` > 1 or ``mlp_only_layers``): grokc's MoE models are sparse in every layer."""
    if int(raw.get("decoder_sparse_step") or 1) != 1 or raw.get("mlp_only_layers"):
        raise UnsupportedModel(f"{where} mixes dense and sparse layers (decoder_sparse_step "
                               f"{raw.get('decoder_sparse_step', 1)}, mlp_only_layers {raw.get('mlp_only_layers')}); "
                               "only models whose every layer is a mixture of experts are supported")


def read_config(read: Callable[[], MoeConfig], where: str, family: str) -> dict:
    """``{"moe": read()}`` for an architecture's config hook; a missing key (``KeyError``) or an
    inconsistent ``MoeConfig`` becomes one ``UnsupportedModel`` line naming ``where``."""
    try:
        return {"moe": read()}
    except KeyError as exc:
        raise UnsupportedModel(f"{where} lacks {exc.args[0]!r}, which every {family} config has; "
                               "re-export the model") from exc
    except ValueError as exc:
        raise UnsupportedModel(f"{where} describes an inconsistent mixture of experts: {exc}") from exc
