"""Incoherence rotation: the model's weights turned by orthogonal matrices it computes the same with.

What (QuaRot's and SpinQuant's offline rotations R1 and R2, with no online transform): every
RMSNorm weight that feeds a linear is folded into that linear's input columns (the norm keeps
weight 1); the residual stream is then turned by one orthogonal ``Q`` [H, H] (the embedding table
and every reading linear ``W <- W Q``, the LM head included; every writing linear ``W <- Qᵀ W``),
and each attention head's values by one orthogonal ``P`` [d, d] (``attn_v`` rows and ``attn_output``
columns per head). RMSNorm without weight commutes with an orthogonal map (it keeps the norm) and
attention is linear in its values, so the rotated model computes the same logits in exact
arithmetic. Per output channel, int4 then quantizes rows whose large inputs are spread over all
columns instead of a few outlier ones, which is what the grid serves badly.

Assumes: a dense (not MoE) family without post-attention/post-MLP norms (a norm after a writing
linear does not commute with ``Q``); every norm is the plain ``x / rms(x) * w``.
Guarantees: the same architecture and config except ``tie_word_embeddings=False`` (the head is
``E diag(w_final) Q``, no longer the table ``E Q``): an artifact of a tied model then holds a head
of its own. Deterministic: ``Q`` and ``P`` are randomized Hadamard matrices (``hadamard``: Sylvester
and Paley constructions) with signs from ``numpy.random.default_rng(seed)``; an order with no
construction here takes a seeded random orthogonal matrix (QR of a Gaussian one).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Mapping

import numpy as np

from grokc.core import tensors as names
from grokc.core.config import ModelConfig
from grokc.core.errors import BuildOptionError

T = names.Tensor
_READS = {T.ATTN_NORM: (T.ATTN_Q, T.ATTN_K, T.ATTN_V), T.FFN_NORM: (T.FFN_GATE, T.FFN_UP)}  # norm -> the linears it feeds
_WRITES = (T.ATTN_OUTPUT, T.FFN_DOWN)


def _paley(q: int) -> np.ndarray:
    """The Hadamard matrix of order ``q + 1`` for a prime ``q`` = 3 mod 4 (Paley's first construction)."""
    residues = {(i * i) % q for i in range(1, q)}
    chi = np.array([0] + [1 if i in residues else -1 for i in range(1, q)])
    jacobsthal = chi[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q]
    s = np.zeros((q + 1, q + 1), np.int64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jacobsthal
    return s + np.eye(q + 1, dtype=np.int64)


_BASES = {12: 11, 20: 19, 28: None, 44: 43}   # order -> Paley prime (28: no prime; left to the fallback)


@lru_cache(maxsize=None)
def hadamard(n: int) -> np.ndarray | None:
    """A ±1 matrix ``H`` of order ``n`` with ``H Hᵀ = n I``, or None when none is constructed here
    (Kronecker products of 2 and the Paley orders 12, 20, 44)."""
    if n == 1:
        return np.ones((1, 1), np.int64)
    for order, q in _BASES.items():
        if q is not None and n % order == 0 and (rest := hadamard(n // order)) is not None:
            return np.kron(_paley(q), rest)
    if n % 2 == 0 and (rest := hadamard(n // 2)) is not None:
        return np.kron(np.array([[1, 1], [1, -1]], np.int64), rest)
    return None


def orthogonal(n: int, seed: int) -> np.ndarray:
    """A float64 orthogonal ``[n, n]``: ``diag(±1) H / sqrt(n)``, or a random orthogonal matrix when
    ``hadamard(n)`` is None; a function of ``n`` and ``seed``."""
    rng = np.random.default_rng([seed, n])
    h = hadamard(n)
    if h is None:
        q, r = np.linalg.qr(rng.standard_normal((n, n)))
        return q * np.sign(np.diag(r))[None, :]
    signs = rng.integers(0, 2, n) * 2 - 1
    return signs[:, None] * h / np.sqrt(n)


def refusal(config: ModelConfig) -> str | None:
    """Why ``config``'s model cannot be rotated, or None."""
    if config.moe is not None:
        return "a mixture-of-experts model"
    if config.post_norms:
        return f"a {config.architecture} model (its norms after the attention and the MLP do not commute with a rotation)"
    return None


def rotated(config: ModelConfig, weights: Mapping[str, np.ndarray], seed: int = 0) -> tuple[ModelConfig, dict]:
    """``(config, weights)`` turned as the module doc says: float32 C-contiguous arrays as given."""
    why = refusal(config)
    if why is not None:
        raise BuildOptionError(f"--rotate cannot turn {why}; build it without --rotate")
    q = orthogonal(config.hidden_size, seed)
    p = orthogonal(config.head_dim, seed + 1)
    out = dict(weights)

    def f64(key: str) -> np.ndarray:   # one tensor at a time: never the whole model in float64
        return np.asarray(weights[key], np.float64)

    def put(key: str, value: np.ndarray) -> None:
        out[key] = np.ascontiguousarray(value, dtype=np.float32)

    d, heads, kv, hidden = config.head_dim, config.num_heads, config.num_kv_heads, config.hidden_size
    embd = names.name(T.TOKEN_EMBD)
    head = f64(names.LM_HEAD if names.LM_HEAD in weights else embd) * f64(names.name(T.OUTPUT_NORM))[None, :]
    put(names.LM_HEAD, head @ q)
    put(embd, f64(embd) @ q)
    put(names.name(T.OUTPUT_NORM), np.ones(hidden))
    for i in range(config.num_layers):
        for norm, linears in _READS.items():
            gamma = f64(names.name(norm, i))
            for kind in linears:
                turned = (f64(names.name(kind, i)) * gamma[None, :]) @ q
                if kind is T.ATTN_V:   # each head's rows: Pᵀ W_v
                    turned = np.einsum("ed,hek->hdk", p, turned.reshape(kv, d, -1)).reshape(kv * d, -1)
                put(names.name(kind, i), turned)
            put(names.name(norm, i), np.ones(hidden))
        bias = names.name(T.ATTN_V, i, "bias")
        if bias in weights:
            put(bias, (f64(bias).reshape(kv, d) @ p).reshape(-1))
        o_key = names.name(T.ATTN_OUTPUT, i)
        o = f64(o_key).reshape(hidden, heads, d) @ p                      # each head's columns: W_o P
        put(o_key, q.T @ o.reshape(hidden, heads * d))
        put(names.name(T.FFN_DOWN, i), q.T @ f64(names.name(T.FFN_DOWN, i)))
    return replace(config, tie_word_embeddings=False), out
