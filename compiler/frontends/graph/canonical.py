"""Raw IR -> the ``forward`` graph ``compiler/trace.py`` would give, with canonical names, and the
architecture the graph itself describes.

The raw IR (``emit.RawIR``) holds the right ops wired as the source wires them, under the source's
names. This walks it as a Llama-family decoder from the embedding to the logits, block by block,
by structure alone: the RMSNorm that reads the residual stream, the three linears it feeds (q and
k through a ROPE into the attention, v straight in: which is which is where they go), the output
projection, the residual add, the second norm, the two MLP linears (the one behind the SiLU is the
gate), the product, the down projection, the second add; then the final norm and the LM head. Any
node off that path, or a path that differs, ends the conversion naming the source node where it
differs and what the block has there.

It then emits every node again, in the tracer's order and with its names (``blk.3.attn_q``,
``blk.3.rope.1``, ...), so that everything after the frontend (passes, quantization, lowering,
calibration, the quality report) reads the graph exactly as it reads a traced one; and it reads
the config from the graph: sizes from the weights, heads and scale from the attentions, eps from the
norms, the rope config fitted to the frequencies the ROPEs apply, a tied head from the LM head's
weight being the embedding table, q/k/v biases (Qwen2's) from the linears that have them (a bias on
any other linear, or on some of q, k and v only, is refused naming its node).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grokc.compiler.frontends.graph.emit import RawIR
from grokc.compiler.frontends.graph.rope_fit import fit_rope
from grokc.core.config import RopeConfig
from grokc.core.errors import UnsupportedModel
from grokc.core.ir import AttentionAttrs, DType, Graph, LinearAttrs, Node, OpKind, RmsNormAttrs, TensorType
from grokc.core.meta import CarriedInt4
from grokc.core.tensors import LM_HEAD, Tensor, name


@dataclass(frozen=True)
class Canonical:
    graph: Graph
    weights: dict[str, np.ndarray]        # canonical name -> f32 (the module's parameters, less rope_inv_freq)
    carried: dict[str, CarriedInt4]       # canonical weight name -> the source's int4 grid
    fields: dict                          # ModelConfig fields the graph decides


@dataclass(frozen=True)
class _Block:
    attn_norm: Node
    q: Node
    q_rope: Node
    k: Node
    k_rope: Node
    v: Node
    attention: Node
    attn_output: Node
    add: Node
    ffn_norm: Node
    gate: Node
    silu: Node
    up: Node
    mul: Node
    down: Node
    add_1: Node


class _Walk:
    def __init__(self, raw: RawIR, where: str):
        self.raw, self.where = raw, where
        self.prod = {n.outputs[0]: n for n in raw.nodes}
        self.uses: dict[str, list[Node]] = {}
        for n in raw.nodes:
            for src in n.inputs.values():
                self.uses.setdefault(src, []).append(n)
        self.seen: set[str] = set()

    def fail(self, node: Node, expected: str) -> UnsupportedModel:
        src = self.raw.source[node.name]
        return UnsupportedModel(f"{self.where}: node {src.describe()} (read as {node.op.value}) is not where a "
                                f"Llama-family decoder has {expected}")

    def take(self, node: Node | None, op: OpKind, expected: str, at: Node) -> Node:
        if node is None or node.op is not op or node.name in self.seen:
            raise self.fail(node or at, expected)
        self.seen.add(node.name)
        return node

    def users(self, tensor: str) -> list[Node]:
        return self.uses.get(tensor, [])

    def only_user(self, node: Node, op: OpKind, expected: str) -> Node:
        users = self.users(node.outputs[0])
        if len(users) != 1:
            raise self.fail(users[1] if len(users) > 1 else node, expected)
        return self.take(users[0], op, expected, node)

    def block(self, h: str, at: Node) -> _Block | None:
        """The block reading the residual stream ``h`` (None: ``h`` goes to the final norm)."""
        users = self.users(h)
        norms = [u for u in users if u.op is OpKind.RMS_NORM]
        adds = [u for u in users if u.op is OpKind.ADD]
        if len(users) == 1 and norms:
            return None
        if len(norms) != 1 or len(adds) != 1 or len(users) != 2:
            raise self.fail(next((u for u in users if u not in norms[:1] + adds[:1]), at),
                            "the residual stream's RMSNorm and residual add")
        n1 = self.take(norms[0], OpKind.RMS_NORM, "an attention RMSNorm", at)
        lins = self.users(n1.outputs[0])
        ropes = {r.inputs["x"]: r for lin in lins for r in self.users(lin.outputs[0]) if r.op is OpKind.ROPE}
        attn = next((u for lin in lins for r in self.users(lin.outputs[0]) for u in self.users(r.outputs[0])
                     if u.op is OpKind.ATTENTION), None)
        if attn is None or len(lins) != 3:
            raise self.fail(lins[0] if lins else n1, "q, k and v projections into an attention")
        q_rope = self.take(self.prod.get(attn.inputs["q"]), OpKind.ROPE, "the query's rotary embedding", attn)
        k_rope = self.take(self.prod.get(attn.inputs["k"]), OpKind.ROPE, "the key's rotary embedding", attn)
        q = self.take(self.prod.get(q_rope.inputs["x"]), OpKind.LINEAR, "the q projection", q_rope)
        k = self.take(self.prod.get(k_rope.inputs["x"]), OpKind.LINEAR, "the k projection", k_rope)
        v = self.take(self.prod.get(attn.inputs["v"]), OpKind.LINEAR, "the v projection", attn)
        if {q.name, k.name, v.name} != {lin.name for lin in lins} or len(ropes) != 2:
            raise self.fail(attn, "an attention over the q, k and v projections of one normed input")
        self.take(attn, OpKind.ATTENTION, "attention", n1)
        for node in (q, k, v, q_rope, k_rope):
            if len(self.users(node.outputs[0])) != 1:
                raise self.fail(self.users(node.outputs[0])[1], "nothing else reading the attention's inputs")
        o = self.only_user(attn, OpKind.LINEAR, "the attention's output projection")
        add = self.only_user(o, OpKind.ADD, "the residual add after attention")
        if add.name != adds[0].name:
            raise self.fail(add, "a residual add of the block's input and its attention")
        after = self.users(add.outputs[0])
        n2 = next((u for u in after if u.op is OpKind.RMS_NORM), None)
        add_1 = next((u for u in after if u.op is OpKind.ADD), None)
        if len(after) != 2 or n2 is None or add_1 is None:
            raise self.fail(after[0] if after else add, "the MLP's RMSNorm and the second residual add")
        self.take(n2, OpKind.RMS_NORM, "the MLP's RMSNorm", add)
        mlp = self.users(n2.outputs[0])
        gate = next((u for u in mlp if any(s.op is OpKind.SILU for s in self.users(u.outputs[0]))), None)
        up = next((u for u in mlp if u is not gate), None)
        if len(mlp) != 2 or gate is None or up is None:
            raise self.fail(mlp[0] if mlp else n2, "the gate and up projections of a SwiGLU MLP")
        self.take(gate, OpKind.LINEAR, "the MLP's gate projection", n2)
        self.take(up, OpKind.LINEAR, "the MLP's up projection", n2)
        silu = self.only_user(gate, OpKind.SILU, "SiLU of the gate projection")
        mul = self.only_user(silu, OpKind.MUL, "the product silu(gate) * up")
        if set(mul.inputs.values()) != {silu.outputs[0], up.outputs[0]} or len(self.users(up.outputs[0])) != 1:
            raise self.fail(mul, "the product silu(gate) * up")
        down = self.only_user(mul, OpKind.LINEAR, "the MLP's down projection")
        end = self.only_user(down, OpKind.ADD, "the residual add after the MLP")
        if end.name != add_1.name or set(end.inputs.values()) != {add.outputs[0], down.outputs[0]}:
            raise self.fail(end, "a residual add of the attention's sum and the MLP")
        return _Block(n1, q, q_rope, k, k_rope, v, attn, o, add, n2, gate, silu, up, mul, down, end)


def canonicalize(raw: RawIR, logits: str, where: str) -> Canonical:
    """The canonical ``forward`` graph of ``raw`` whose logits are the IR tensor ``logits``."""
    w = _Walk(raw, where)
    embeddings = [n for n in raw.nodes if n.op is OpKind.EMBEDDING]
    if len(embeddings) != 1:
        raise UnsupportedModel(f"{where}: the graph has {len(embeddings)} token embeddings; a Llama-family "
                               "decoder has one")
    emb = w.take(embeddings[0], OpKind.EMBEDDING, "the token embedding", embeddings[0])
    h, blocks = emb.outputs[0], []
    while (b := w.block(h, emb)) is not None:
        blocks.append(b)
        h = b.add_1.outputs[0]
    final = w.take(w.users(h)[0], OpKind.RMS_NORM, "the final RMSNorm", emb)
    head = w.only_user(final, OpKind.LINEAR, "the LM head")
    if head.outputs[0] != logits:
        raise w.fail(head, "the LM head whose output is the logits")
    stray = [n for n in raw.nodes if n.name not in w.seen]
    if stray:
        raise w.fail(stray[0], "nothing beyond its blocks")
    if not blocks:
        raise UnsupportedModel(f"{where}: the graph has no attention blocks")
    _check_biases(raw, blocks, head, where)
    return _emit(raw, emb, blocks, final, head, where)


def _check_biases(raw: RawIR, blocks: list[_Block], head: Node, where: str) -> None:
    """Raise unless the linears with a bias are the q, k and v projections, all of them or none."""
    others = [(n, role) for b in blocks for n, role in ((b.attn_output, "attention's output projection"),
              (b.gate, "MLP's gate projection"), (b.up, "MLP's up projection"), (b.down, "MLP's down projection"))]
    for node, role in [*others, (head, "LM head")]:
        if "bias" in node.inputs:
            raise UnsupportedModel(f"{where}: node {raw.source[node.name].describe()} adds a bias to the {role}; "
                                   "grokc's decoders have biases on the q, k and v projections only (Qwen2's)")
    qkv = [n for b in blocks for n in (b.q, b.k, b.v)]
    if len({"bias" in n.inputs for n in qkv}) > 1:
        bare = next(n for n in qkv if "bias" not in n.inputs)
        raise UnsupportedModel(f"{where}: node {raw.source[bare.name].describe()} is a q/k/v projection without a "
                               "bias where others have one; grokc compiles biases on all of them or none")


def _emit(raw: RawIR, emb: Node, blocks: list[_Block], final: Node, head: Node, where: str) -> Canonical:
    weights: dict[str, np.ndarray] = {}
    carried: dict[str, CarriedInt4] = {}

    def weight(node: Node, role: str, canonical: str) -> str:
        src = node.inputs[role]
        weights[canonical] = raw.params[src]
        if src in raw.carried:
            carried[canonical] = raw.carried[src]
        return canonical

    table = weight(emb, "table", name(Tensor.TOKEN_EMBD))
    hidden = weights[table].shape[1]
    nodes = [Node(OpKind.EMBEDDING, "token_embd", {"table": table, "tokens": "tokens"}, ("token_embd",), emb.attrs)]
    types = {"tokens": TensorType(("T",), DType.I32), "positions": TensorType(("T",), DType.I32)}

    def out(node: Node, new: str, inputs: dict[str, str], attrs=None) -> str:
        if node.op is OpKind.RMS_NORM:
            attrs = RmsNormAttrs(eps=_eps_key(node.attrs.eps))
        nodes.append(Node(node.op, new, inputs, (new,), node.attrs if attrs is None else attrs))
        types[new] = raw.types[node.outputs[0]]
        return new

    types["token_embd"] = raw.types[emb.outputs[0]]
    h = "token_embd"
    rope_ins = {"positions": "positions", "inv_freq": "rope_inv_freq"}

    def linear(node: Node, kind: Tensor, i: int, src: str) -> str:
        bias = {"bias": weight(node, "bias", name(kind, i, "bias"))} if "bias" in node.inputs else {}
        return out(node, f"blk.{i}.{kind.value}", {"x": src, "weight": weight(node, "weight", name(kind, i)), **bias})

    for i, b in enumerate(blocks):
        p = f"blk.{i}"
        lin = lambda node, kind, src, i=i: linear(node, kind, i, src)  # noqa: E731
        x = out(b.attn_norm, f"{p}.attn_norm", {"x": h, "weight": weight(b.attn_norm, "weight", name(Tensor.ATTN_NORM, i))})
        q, k, v = lin(b.q, Tensor.ATTN_Q, x), lin(b.k, Tensor.ATTN_K, x), lin(b.v, Tensor.ATTN_V, x)   # the tracer's order
        q = out(b.q_rope, f"{p}.rope", {"x": q, **rope_ins})
        k = out(b.k_rope, f"{p}.rope.1", {"x": k, **rope_ins})
        a = out(b.attention, f"{p}.attention", {"q": q, "k": k, "v": v}, _layer(b.attention.attrs, i))
        h = out(b.add, f"{p}.add", {"a": h, "b": lin(b.attn_output, Tensor.ATTN_OUTPUT, a)})
        x = out(b.ffn_norm, f"{p}.ffn_norm", {"x": h, "weight": weight(b.ffn_norm, "weight", name(Tensor.FFN_NORM, i))})
        s = out(b.silu, f"{p}.silu", {"x": lin(b.gate, Tensor.FFN_GATE, x)})
        m = out(b.mul, f"{p}.mul", {"a": s, "b": lin(b.up, Tensor.FFN_UP, x)})
        h = out(b.add_1, f"{p}.add.1", {"a": h, "b": lin(b.down, Tensor.FFN_DOWN, m)})
    x = out(final, "output_norm", {"x": h, "weight": weight(final, "weight", name(Tensor.OUTPUT_NORM))})
    head_w = raw.params[head.inputs["weight"]]
    tied = head.inputs["weight"] == emb.inputs["table"] or (
        head_w.shape == weights[table].shape and np.array_equal(head_w, weights[table]))
    head_name = table if tied else weight(head, "weight", LM_HEAD)
    if tied and head.inputs["weight"] in raw.carried:
        carried[LM_HEAD] = raw.carried[head.inputs["weight"]]
    out(head, "output", {"x": x, "weight": head_name}, LinearAttrs(out_dtype=DType.F32))
    types["output"] = TensorType(("T", head_w.shape[0]), DType.F32)
    graph = Graph("forward", tuple(nodes), ("tokens", "positions"), ("output",), types)
    return Canonical(graph, weights, carried, _fields(raw, blocks, hidden, weights, tied, where))


def _layer(attrs: AttentionAttrs, i: int) -> AttentionAttrs:
    return AttentionAttrs(i, attrs.n_heads, attrs.n_kv_heads, attrs.head_dim, attrs.scale)


def _fields(raw: RawIR, blocks: list[_Block], hidden: int, weights: dict[str, np.ndarray], tied: bool,
            where: str) -> dict:
    attn = {b.attention.attrs for b in blocks}
    eps = {n.attrs.eps for b in blocks for n in (b.attn_norm, b.ffn_norm)}
    if len({(a.n_heads, a.n_kv_heads, a.head_dim) for a in attn}) != 1:
        raise UnsupportedModel(f"{where}: the attention blocks differ in heads ({sorted(attn, key=str)}); grokc "
                               "compiles decoders whose blocks are alike")
    if len({_eps_key(e) for e in eps}) != 1:
        raise UnsupportedModel(f"{where}: the RMSNorms use different epsilons {sorted(eps)}; grokc compiles one eps")
    a = next(iter(attn))
    return {"vocab_size": weights[name(Tensor.TOKEN_EMBD)].shape[0], "hidden_size": hidden,
            "intermediate_size": weights[name(Tensor.FFN_GATE, 0)].shape[0], "num_layers": len(blocks),
            "num_heads": a.n_heads, "num_kv_heads": a.n_kv_heads, "head_dim": a.head_dim,
            "rms_norm_eps": _eps_key(next(iter(eps))), "rope": _rope(raw, blocks, a.head_dim, where),
            "tie_word_embeddings": tied, "qkv_bias": "bias" in blocks[0].q.inputs}


def _eps_key(eps: float) -> float:
    """eps as the model file meant it: the shortest decimal of its f32 value (an f32 1e-6 reads back as
    9.99999997e-07)."""
    return float(str(np.float32(eps)))


def _rope(raw: RawIR, blocks: list[_Block], head_dim: int, where: str) -> RopeConfig:
    fits = [raw.rope[n.outputs[0]] for b in blocks for n in (b.q_rope, b.k_rope)]
    first = fits[0]
    for f in fits[1:]:
        if not np.allclose(f.inv_freq, first.inv_freq, rtol=1e-5) or abs(f.mscale - first.mscale) > 1e-6:
            raise UnsupportedModel(f"{where}: the rotary embeddings of the blocks differ; grokc compiles one rope")
    return fit_rope(first, head_dim, f"{where}: node {raw.source[blocks[0].q_rope.name].describe()}")
