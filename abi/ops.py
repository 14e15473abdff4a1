"""The kernel ABI: what every launch in a plan means, independent of the hardware that runs it.

A plan (``artifacts/plan.py``) is a list of launches. Each launch names an *op* from the table
below and passes that op's parameters, in this order, as arena buffers, weights, or scalars. Three
parties implement or produce the same contract and are tested against each other:

- ``targets/`` lowers the graph IR to launches and compiles one CUDA kernel per (op, variant),
  whose C parameter list is exactly ``KERNEL_ABI[op]`` (pointers as ``T*``, ``i32`` as ``int``,
  ``f32`` as ``float``);
- ``runner/cpu.py`` executes each op with numpy (the oracle);
- ``runner/gpu.py`` launches the cubins with the same arguments.

Variants of an op (weight format, epilogue, output dtype) are carried in ``Launch.attrs``; the
parameter list is the same for every variant so a missing optional input is passed as a null
pointer. Shapes below use ``B`` = static batch (slots), ``L`` = prefill bucket, ``H`` = hidden,
``D`` = head_dim, ``NH``/``NKV`` = query/kv heads, ``S`` = KV block size (16), ``MB`` = KV blocks
per slot, ``NB`` = KV blocks in the pool.

Semantics (fp16 storage, fp32 arithmetic unless stated):

``embedding``: ``out[i, :] = T[tokens[i], :] * scale`` (f16 ``[n, hidden]``) for ``i < n``, the
  product in f32 rounded to f16 once (``scale == 1``: the row as is); a token outside
  ``[0, vocab)`` gives a zero row. The table ``T [vocab, hidden]`` by ``attrs["weight_format"]``:
  - ``"f16"``: ``table`` f16 ``[vocab, hidden]``; ``scales`` and ``zeros`` null.
  - ``"q8"``: ``table`` u8 ``[vocab, hidden]``, one code per byte (``abi/int8.py``). ``"q4"``: ``table`` u8
    ``[vocab, hidden/2]`` packed as ``abi/int4.py`` says (``hidden % 8 == 0``). Both:
    ``scales`` f16 ``[vocab, G]``, ``zeros`` f16 ``[vocab, G]`` or null (null means the symmetric
    code: 128 for q8, 8 for q4), ``G = ceil(hidden / gs)`` with ``gs = group_size`` (0 or a multiple
    of 8) or ``hidden`` when ``group_size == 0``:
    ``T[v, h] = (code[v, h] - zero[v, h // gs]) * scales[v, h // gs]`` in f32 (times ``scale``),
    rounded to f16 once.

``linear``: ``out = epilogue(prologue(x) @ W^T)`` with ``x`` f16 ``[M, K]``, or f32 when
  ``attrs["x_dtype"]`` is ``"f32"``: an f32 input is rounded to f16 as it is read, so it means the
  f16 tensor it stands for (the batch-1 decode graph keeps its layer outputs as f32 sums,
  ``mlp_decode`` below).
  - prologue: when ``norm`` is not null, each row is RMS-normalised:
    ``x_i * rsqrt(mean(x_i**2) + eps) * norm`` (``norm`` f16 ``[K]``).
  - ``W`` by ``attrs["weight_format"]``: ``"f16"``: ``weight`` f16 ``[NW, K]``, ``scales`` and
    ``zeros`` null. ``"q4"``: ``weight`` u8 ``[NW, K/2]`` packed as ``abi/int4.py`` says,
    ``scales`` f16 ``[NW, G]``, ``zeros`` f16 ``[NW, G]`` or null (null means the symmetric code
    8), ``G = ceil(K / gs)`` with ``gs = group_size`` or ``K`` when ``group_size == 0``:
    ``W[n, k] = (code[n, k] - zero[n, k // gs]) * scale[n, k // gs]``. ``"q8"``: ``weight`` u8
    ``[NW, K]``, one code per byte (``abi/int8.py``), ``scales`` and ``zeros`` as for q4
    (null ``zeros`` means the symmetric code 128), the same formula.
  - ``attrs["act"]``: ``"none"``: ``NW = N``. ``"silu_mul"``: ``NW = 2N``, rows ``[0, N)`` are the
    gate and ``[N, 2N)`` the up projection: ``y = silu(y[:, :N]) * y[:, N:]``. ``"gelu_tanh_mul"``:
    the same with ``gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))`` for silu.
  - when ``addend`` (f32 ``[M, NW]``) is not null it is added to the raw products before the
    activation: ``y = prologue(x) @ W^T + addend`` (gate and up rows alike); ``sparse_residual``
    writes it. When ``bias`` (f16 ``[NW]``) is not null, ``bias[n]`` is added to column ``n`` of
    every row at the same point.
  - when ``residual`` (f16 ``[M, N]``; f32 when ``attrs["residual_dtype"]`` is ``"f32"``, rounded
    to f16 as it is read) is not null: ``y += residual``. ``out`` may alias ``residual``.
  - ``out`` is f16 or f32 by ``attrs["out_dtype"]``.

``sparse_residual``: the f16 corrections a q4 linear keeps beside its codes
  (``passes/sparse_residual.py``), as a product for that linear's ``addend``: ``out`` f32
  ``[M, NW]``, ``out[m, n] = sum_{e in [rowptr[n], rowptr[n+1])} vals[e] * xn[m, cols[e]]`` with
  ``xn = prologue(x)`` of the linear (``x`` f16 ``[M, K]``, RMS-normalised by ``norm`` and ``eps``
  when ``norm`` is not null) and the correction in CSR form: ``rowptr`` i32 ``[NW + 1]``, ``cols``
  i32 ``[nnz]`` in ``[0, K)``, ``vals`` f16 ``[nnz]``. A row with no entries gives 0.

``mlp_decode``: a batch-1 SwiGLU MLP whose result is added into an f32 sum:
  ``acc += x + down(silu(gate) * up)`` with ``x`` f16 ``[1, hidden]``, ``gate`` and ``up`` the two
  halves of ``prologue(x) @ gate_up^T`` (``norm`` f16 ``[hidden]``, ``eps``), the activation rounded
  to f16, and ``down`` its product with the down weight, in f32. Both weights are q4 per output
  channel (``linear``'s formula) with their codes in ``artifacts/mlp_tiles.py``'s layouts:
  ``gate_up_tiles`` (``GATE_UP`` of the u8 ``[2 inter, hidden/2]`` weight, gate rows then up rows)
  with ``gate_up_scales`` (and ``gate_up_zeros`` or null) f16 ``[2 inter]``; ``down_tiles``
  (``DOWN`` of ``[hidden, inter/2]``) with ``down_scales`` (``down_zeros``) f16 ``[hidden]``.
  ``acc`` f32 ``[1, hidden]`` must hold zeros on entry (the kernel adds into it from many blocks);
  ``clear`` f32 ``[1, hidden]``, another buffer, is set to zeros: the next ``mlp_decode``'s ``acc``.

``rms_norm``: ``out[m, :] = x[m, :] * rsqrt(mean(x[m, :]**2) + eps) * weight (+ residual[m, :])``
  for ``m < M``: ``x`` f16 ``[M, hidden]``, ``weight`` f16 ``[hidden]``, ``residual`` f16
  ``[M, hidden]`` or null; f32 arithmetic, rounded to f16 once; ``out`` may alias ``residual``.

``qk_norm``: per-head RMSNorm of the q and k heads of a fused ``qkv`` f16 ``[M, (NH + 2*NKV) * D]``
  (q heads, k heads, v heads): ``out[m, h, :] = qkv[m, h, :] * rsqrt(mean(qkv[m, h, :]**2) + eps)
  * w`` with ``w = q_norm`` (f16 ``[D]``) for ``h < NH`` and ``w = k_norm`` for
  ``NH <= h < NH + NKV``, f32 arithmetic rounded to f16 once; the v heads are copied as they are.

``pack_mlp_tiles``: ``out`` u8 = ``artifacts/mlp_tiles.py``'s layout ``part`` (0 ``GATE_UP``, 1
  ``DOWN``) of the q4 ``weight`` of an MLP of sizes ``hidden``, ``inter`` (u8 ``[2 inter, hidden/2]``
  or ``[hidden, inter/2]``); the ``init`` graph runs it once at load.

``attention_prefill``: one sequence of ``L`` padded tokens at positions ``0..L-1`` into slot
  ``b = slot[0]``, of which the first ``t_real = n_real[0]`` are real. ``qkv`` f16
  ``[L, (NH + 2*NKV) * D]`` holds q heads, then k heads, then v heads. RoPE (below) rotates q and
  k; rotated q and k are rounded to f16. For ``t < t_real``: the rotated ``k_t`` and ``v_t`` are
  stored in the KV cache at position ``t`` of slot ``b``, and ``out[t]`` is causal grouped-query
  attention of ``q_t`` over keys/values ``lo(t)..t`` with ``softmax(cap(scale * q.k))`` (query head ``h``
  reads kv head ``h // (NH / NKV)``, in decode too), where ``lo(t) = 0``, or
  ``max(0, t - window + 1)`` when ``window > 0`` (a local layer: ``window`` keys, the query's own
  included), ``cap(s) = softcap * tanhf(s / softcap)`` when ``softcap > 0`` (Grok-1's 30), else ``s``;
  f32 scores. Rows ``t >= t_real`` of ``out`` are zero and nothing of them reaches the cache.

``attention_decode``: one new token per slot. For each ``b < B`` with ``active[b] != 0`` and
  ``p = positions[b]``: rotate q and k at position ``p``, store k and v at position ``p`` of slot
  ``b``, and ``out[b]`` is attention of ``q`` over positions ``lo(p)..p`` of the slot (``lo`` as
  in prefill: a local layer reads only its window of the cache; scores capped as in prefill). Inactive slots get a zero row and
  leave the cache untouched.

  KV cache: ``k_cache``, ``v_cache`` f16 ``[NB, NKV, S, D]`` per layer. Position ``p`` of slot
  ``b`` lives in block ``block_table[b, p // S]`` at row ``p % S``.

  RoPE (Hugging Face's rotate-half convention): for each head, ``x1 = x[:D/2]``, ``x2 = x[D/2:]``,
  ``out1 = x1*cos - x2*sin``, ``out2 = x2*cos + x1*sin`` with ``(cos, sin) = rope_table[p, i]``
  (f32 ``[table_len, D/2, 2]``, attention scaling already folded in) for ``p < table_len``, and
  ``(cos, sin) = mscale * (cosf(p * inv_freq[i]), sinf(p * inv_freq[i]))`` past the table.

``take_last``: ``out[0, :] = x[n_real[0] - 1, :]`` (``x`` f16 ``[L, H]``).

``sample``: picks one token per row of ``logits`` (f32 ``[M, V]``) and advances the slot.
  Row ``i`` belongs to slot ``b = slot[0]`` when ``slot`` is not null (prefill, ``M == 1``),
  else ``b = i`` (decode; rows with ``active[b] == 0`` are skipped). With
  ``c = out_count[b]`` before the step (0 in prefill):

  - choice: ``temperature[b] <= 0``: argmax (lowest index on ties). Otherwise, with
    ``l = logits / temperature[b]`` and ``p = exp(l - max(l))``: keep ``l_j >= kth`` where
    ``kth`` is the ``top_k[b]``-th largest ``l`` (all when ``top_k[b] <= 0`` or ``>= V``); then,
    when ``0 < top_p[b] < 1``, keep ``p_j >= tau`` for the largest ``tau`` whose kept mass (the
    sum of the kept ``p_j >= tau``) is at least ``top_p[b]`` times the mass kept so far; then walk
    the kept tokens in index order and take the first whose running mass reaches
    ``u * kept mass``, with ``u = uniform(seed[b], c)`` (``artifacts/rng.py``).
  - update: ``tokens[b] = t``; ``out_tokens[b, c] = t`` when ``c < max_out``;
    ``out_count[b] = c + 1``; ``positions[b] = n_real[0]`` in prefill, ``+= 1`` in decode;
    ``active[b] = 0`` when ``t`` is one of ``eos_ids`` or ``c + 1 >= max_new[b]``, else 1.

A mixture-of-experts FFN is five launches (``passes/fuse_moe.py``): the router's ``linear`` (f32
logits), then the four below. ``E = n_experts`` routed experts, ``k = top_k``, ``c = n_shared``
shared-expert chunks (experts ``E .. E + c - 1`` of the stacked weights, ``E' = E + c``); each token
fills ``S = k + c`` slots, and its entries ``(t, s)`` become the rows ``r < R = T * S`` of the
per-expert tensors, grouped by expert.

``moe_route``: rows ``t < n`` are routed, ``n = n_real[0]`` when ``n_real`` is not null (prefill),
  else ``T``. ``logits`` f32 ``[T, E + g]`` with ``g = shared_gate`` (column ``E``: the shared gate's
  logit). Slot ``s < k`` of token ``t`` holds the expert with the ``s``-th largest ``l = logits[t, :E]``
  (ties: the lower index first), weighted by ``p_e = exp(l_e - max l) / sum_j exp(l_j - max l)``,
  divided by the sum of the ``k`` chosen ``p`` when ``norm_top_k != 0``; slot ``k + j`` holds expert
  ``E + j``, weighted by ``sigmoid(logits[t, E])`` when ``shared_gate != 0``, else 1. Grouping: the
  entries of the routed rows, sorted by expert and within an expert by ``t``, are rows ``0 ..
  n*S - 1``: ``offsets`` i32 ``[E' + 1]``, ``offsets[e]`` = entries whose expert is below ``e``;
  ``slot_rows[t, s]`` (i32 ``[T, S]``) = the row of entry ``(t, s)``, ``row_token[r]`` (i32 ``[R]``) =
  its token; ``weights`` f32 ``[T, S]``. Rows ``t >= n`` get ``slot_rows`` -1 and weight 0.
  ``active`` i32 ``[E' + 1]``: ``active[0]`` = the number of experts with an entry, ``active[1 + j]``
  for ``j < active[0]`` those experts in increasing order (the rest is not read).

``moe_gather``: ``out`` f16 ``[R, hidden]``, ``out[r] = prologue(x)[row_token[r]]`` for ``r <
  offsets[n_experts]`` (``linear``'s prologue of ``x`` f16 ``[T, hidden]`` with ``norm`` and ``eps``,
  in f32, rounded to f16 once); later rows are not written.

``moe_linear``: for each expert ``e < n_experts`` and each row ``r`` in ``[offsets[e],
  offsets[e + 1])``: ``out[r] = act(x[r] @ W_e^T)``, ``x`` f16 ``[R, K]``, ``out`` f16 or f32 ``[R, N]``
  by ``attrs["out_dtype"]``; later rows are not written. ``W_e`` is expert ``e``'s ``[NW, K]`` matrix
  of the stacked ``weight``, read as ``linear`` reads its weight (``"f16"``: f16 ``[n_experts, NW,
  K]``; ``"q4"``: u8 ``[n_experts, NW, K/2]``, ``scales`` f16 ``[n_experts, NW, G]``, ``zeros`` the same
  or null), and ``act`` is ``linear``'s (``silu_mul``: each expert's gate rows, then its up rows).
  ``active`` is ``moe_route``'s list of the experts with rows (the kernels' grid walks it); the rows
  came from ``T`` tokens, so no expert has more than ``T``.

``moe_combine``: ``out[t] = residual[t] + sum_{s < S, slot_rows[t, s] >= 0} weights[t, s] *
  y[slot_rows[t, s]]`` for ``t < T``, in f32 in slot order, rounded to f16 once: ``y`` f32 ``[R,
  hidden]``, ``residual`` f16 ``[T, hidden]`` or null (zeros); ``out`` may alias ``residual``.

``fill_synthetic``: ``out[i]`` for ``i < n`` as ``artifacts/synthetic.py`` defines for ``fill``
  (0 bytes: ``out`` u8, else ``out`` f16), from ``seed`` and ``scale``. Run once at load by the
  ``init`` graph of a synthetic-weights artifact.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ArgKind(enum.Enum):
    PTR = "ptr"  # device address of an arena buffer or a weight; may be null where optional
    I32 = "i32"
    F32 = "f32"


@dataclass(frozen=True)
class Param:
    name: str
    kind: ArgKind
    optional: bool = False  # a pointer that may be null


def _p(name: str, optional: bool = False) -> Param:
    return Param(name, ArgKind.PTR, optional)


def _i(name: str) -> Param:
    return Param(name, ArgKind.I32)


def _f(name: str) -> Param:
    return Param(name, ArgKind.F32)


KV_BLOCK_SIZE = 16  # tokens per KV-cache block ("slot of 16 tokens" in DESIGN.md)

_ROPE_AND_CACHE = (_p("rope_table"), _p("inv_freq"), _p("k_cache"), _p("v_cache"), _p("block_table"))
_ATTN_SCALARS = (_i("n_heads"), _i("n_kv_heads"), _i("head_dim"), _i("table_len"), _i("max_blocks"),
                 _i("window"), _f("scale"), _f("mscale"), _f("softcap"))

KERNEL_ABI: dict[str, tuple[Param, ...]] = {
    "embedding": (_p("out"), _p("tokens"), _p("table"), _p("scales", True), _p("zeros", True),
                  _i("n"), _i("hidden"), _i("vocab"), _i("group_size"), _f("scale")),
    "linear": (_p("out"), _p("x"), _p("weight"), _p("scales", True), _p("zeros", True),
               _p("norm", True), _p("residual", True), _p("addend", True), _p("bias", True),
               _i("M"), _i("N"), _i("K"), _i("group_size"), _f("eps")),
    "rms_norm": (_p("out"), _p("x"), _p("weight"), _p("residual", True), _i("M"), _i("hidden"), _f("eps")),
    "qk_norm": (_p("out"), _p("qkv"), _p("q_norm"), _p("k_norm"), _i("M"), _i("n_heads"), _i("n_kv_heads"),
                _i("head_dim"), _f("eps")),
    "mlp_decode": (_p("acc"), _p("clear"), _p("x"), _p("norm"), _p("gate_up_tiles"), _p("gate_up_scales"),
                   _p("gate_up_zeros", True), _p("down_tiles"), _p("down_scales"), _p("down_zeros", True),
                   _i("hidden"), _i("inter"), _f("eps")),
    "pack_mlp_tiles": (_p("out"), _p("weight"), _i("part"), _i("hidden"), _i("inter")),
    "sparse_residual": (_p("out"), _p("x"), _p("norm", True), _p("rowptr"), _p("cols"), _p("vals"),
                        _i("M"), _i("NW"), _i("K"), _f("eps")),
    "attention_prefill": (_p("out"), _p("qkv"), *_ROPE_AND_CACHE, _p("slot"), _p("n_real"),
                          _i("L"), *_ATTN_SCALARS),
    "attention_decode": (_p("out"), _p("qkv"), *_ROPE_AND_CACHE, _p("positions"), _p("active"),
                         _i("B"), *_ATTN_SCALARS),
    "take_last": (_p("out"), _p("x"), _p("n_real"), _i("hidden")),
    "sample": (_p("logits"), _i("M"), _i("V"), _p("slot", True), _p("n_real", True),
               _p("temperature"), _p("top_k"), _p("top_p"), _p("seed"),
               _p("tokens"), _p("positions"), _p("active"), _p("out_tokens"), _p("out_count"),
               _p("max_new"), _p("eos_ids"), _i("n_eos"), _i("max_out")),
    "fill_synthetic": (_p("out"), _i("n"), _i("fill"), _i("seed"), _f("scale")),
    "moe_route": (_p("weights"), _p("slot_rows"), _p("row_token"), _p("offsets"), _p("active"), _p("logits"),
                  _p("n_real", True), _i("T"), _i("n_experts"), _i("top_k"), _i("n_shared"), _i("norm_top_k"),
                  _i("shared_gate")),
    "moe_gather": (_p("out"), _p("x"), _p("norm", True), _p("row_token"), _p("offsets"), _i("T"), _i("R"),
                   _i("hidden"), _i("n_experts"), _f("eps")),
    "moe_linear": (_p("out"), _p("x"), _p("weight"), _p("scales", True), _p("zeros", True), _p("offsets"),
                   _p("active"), _i("T"), _i("R"), _i("N"), _i("K"), _i("group_size"), _i("n_experts")),
    "moe_combine": (_p("out"), _p("y"), _p("weights"), _p("slot_rows"), _p("residual", True), _i("T"),
                    _i("hidden"), _i("S")),
}

# Variant attributes each op's launches carry (values are strings, part of the kernel's identity).
KERNEL_VARIANTS: dict[str, dict[str, tuple[str, ...]]] = {
    "embedding": {"weight_format": ("f16", "q8", "q4")},
    "linear": {"weight_format": ("f16", "q4", "q8"), "act": ("none", "silu_mul", "gelu_tanh_mul"),
               "out_dtype": ("f16", "f32"),
               "x_dtype": ("f16", "f32"), "residual_dtype": ("f16", "f32")},
    "moe_linear": {"weight_format": ("f16", "q4"), "act": ("none", "silu_mul", "gelu_tanh_mul"),
                   "out_dtype": ("f16", "f32")},
}
