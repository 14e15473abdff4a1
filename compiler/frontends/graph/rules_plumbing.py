"""Rules that move an activation between views without computing anything (``kinds.py``'s table).

They emit no IR: reshapes into and out of heads, the head transposes, the key/value-cache
``Concat`` with a past input, GQA's ``repeat_kv`` (Unsqueeze, Expand, Reshape, or torch's
``repeat_interleave`` over the heads), sdpa's key
transpose through 3-D (Reshape, Transpose [0, 2, 1], Reshape), and ops that change nothing (casts
between float types, full slices, identities). Each checks the shapes it relies on: the source's
own where they are known, else the reshape's target computed on a probe.
"""

from __future__ import annotations

import numpy as np

from grokc.compiler.frontends.graph.convert import Conversion, Rule
from grokc.compiler.frontends.graph.kinds import FLAT, FLATT, HEADS, HEADS5, KT, SPLIT, TOKENS, Act, Past
from grokc.compiler.frontends.graph.opgraph import OpNode
from grokc.compiler.frontends.graph.pattern import Match, Op, Var

X = Var("x", Act)
_PROBE = (5, 3)   # (S, P) of the probe a reshape's target is computed on when the source does not say


def dims(cv: Conversion, value: str) -> tuple:
    """The shape of ``value``: an int where it is known, None where it is symbolic or unknown. Where
    the source does not know a Reshape's dims, they are its target computed on a probe."""
    shape = cv.graph.shape(value)
    node = cv.graph.producer(value)
    unknown = shape is None or any(not isinstance(d, (int, str)) or d == 0 for d in shape)
    if unknown and node is not None and node.op == "Reshape" and len(node.inputs) > 1:
        probed = _probe_reshape(cv, node)
        if probed is not None and (shape is None or len(shape) == len(probed)):
            return tuple(None if shape is not None and isinstance(shape[i], str) else p for i, p in enumerate(probed))
    return () if shape is None else tuple(d if isinstance(d, int) and d > 0 else None for d in shape)


def _probe_reshape(cv: Conversion, node: OpNode) -> tuple | None:
    src = cv.kind(node.inputs[0])
    if not isinstance(src, Act) or not cv.is_side(node.inputs[1]):
        return None
    seq, past = _PROBE if cv.inputs.past else (_PROBE[0], 0)
    target = [int(d) for d in np.asarray(cv.probe([node.inputs[1]], seq, past)[0]).reshape(-1)]
    in_shape = src.shape(seq, past)
    if not node.attrs.get("allowzero", 0):
        target = [in_shape[i] if d == 0 and i < len(in_shape) else d for i, d in enumerate(target)]
    if target.count(-1) == 1:
        rest = int(np.prod([d for d in target if d != -1]))
        target[target.index(-1)] = int(np.prod(in_shape)) // rest if rest else 0
    return tuple(target)


def _perm(node: OpNode) -> tuple[int, ...]:
    return tuple(node.attrs.get("perm", ()))


def _identity(m: Match, cv: Conversion) -> bool:
    node, x = m.nodes["n"], cv.act(m.values["x"])
    if node.op == "Cast":
        return str(node.attrs.get("to", "")).startswith("float")
    if node.op == "Slice":
        return _full_slice(node)
    if node.op == "Reshape":   # to the shape it has (torch's reshape of attention outputs)
        out = dims(cv, node.outputs[0])
        return x.view == HEADS and len(out) == 4 and out[1] == x.heads and out[3] == x.head_dim
    return True


def _full_slice(node: OpNode) -> bool:
    starts, ends, steps = (node.attrs.get(k) for k in ("starts", "ends", "steps"))
    if starts is None or ends is None:
        return False
    return all(s == 0 for s in starts) and all(e >= 2 ** 31 - 1 for e in ends) and all(s == 1 for s in steps or (1,))


def _same(m: Match, cv: Conversion) -> None:
    cv.kinds[m.nodes["n"].outputs[0]] = cv.act(m.values["x"])


def _split_check(m: Match, cv: Conversion) -> bool:
    x, out = cv.act(m.values["x"]), dims(cv, m.nodes["n"].outputs[0])
    return x.view == TOKENS and len(out) == 4 and None not in out[2:] and out[2] * out[3] == x.channels


def _split(m: Match, cv: Conversion) -> None:
    out = dims(cv, m.nodes["n"].outputs[0])
    cv.kinds[m.nodes["n"].outputs[0]] = cv.act(m.values["x"]).but(view=SPLIT, heads=out[2], head_dim=out[3])


def _merge_check(m: Match, cv: Conversion) -> bool:
    x, out = cv.act(m.values["x"]), dims(cv, m.nodes["n"].outputs[0])
    return x.view == SPLIT and x.repeat == 1 and len(out) == 3 and out[2] == x.heads * x.head_dim


def _merge(m: Match, cv: Conversion) -> None:
    cv.kinds[m.nodes["n"].outputs[0]] = cv.act(m.values["x"]).but(view=TOKENS, heads=0, head_dim=0)


_TRANSPOSES = {(SPLIT, (0, 2, 1, 3)): HEADS, (HEADS, (0, 2, 1, 3)): SPLIT, (HEADS, (0, 1, 3, 2)): KT,
               (FLAT, (0, 2, 1)): FLATT}


def _transpose_check(m: Match, cv: Conversion) -> bool:
    x = cv.act(m.values["x"])
    to = _TRANSPOSES.get((x.view, _perm(m.nodes["n"])))
    return to is not None and not (to == SPLIT and (x.present or x.repeat > 1))


def _transpose(m: Match, cv: Conversion) -> None:
    x = cv.act(m.values["x"])
    cv.kinds[m.nodes["n"].outputs[0]] = x.but(view=_TRANSPOSES[(x.view, _perm(m.nodes["n"]))])


def _cache_check(m: Match, cv: Conversion) -> bool:
    node, x = m.nodes["n"], cv.act(m.values["x"])
    past = cv.graph.shape(m.values["past"]) or ()
    fits = lambda d, want: not isinstance(d, int) or d == want  # noqa: E731
    return (x.view == HEADS and not x.present and x.repeat == 1 and node.attrs.get("axis") in (2, -2)
            and len(past) == 4 and fits(past[1], x.heads) and fits(past[3], x.head_dim))


def _cache(m: Match, cv: Conversion) -> None:
    out = m.nodes["n"].outputs[0]
    cv.kinds[out] = cv.act(m.values["x"]).but(present=out)


def _unsqueeze_check(m: Match, cv: Conversion) -> bool:
    x = cv.act(m.values["x"])
    return x.view == HEADS and x.repeat == 1 and tuple(m.nodes["n"].attrs.get("axes", ())) == (2,)


def _unsqueeze(m: Match, cv: Conversion) -> None:
    cv.kinds[m.nodes["n"].outputs[0]] = cv.act(m.values["x"]).but(view=HEADS5)


def _expand_check(m: Match, cv: Conversion) -> bool:
    x, out = cv.act(m.values["x"]), dims(cv, m.nodes["n"].outputs[0])
    return x.view == HEADS5 and x.repeat == 1 and len(out) == 5 and out[2] is not None and out[1] in (x.heads, None)


def _expand(m: Match, cv: Conversion) -> None:
    x, r = cv.act(m.values["x"]), dims(cv, m.nodes["n"].outputs[0])[2]
    cv.kinds[m.nodes["n"].outputs[0]] = x.but(heads=x.heads * r, repeat=r)


def _repeat_check(m: Match, cv: Conversion) -> bool:
    x, a = cv.act(m.values["x"]), m.nodes["n"].attrs
    return x.view == HEADS and x.repeat == 1 and a.get("axis") == 1 and isinstance(a.get("repeats"), int)


def _repeat(m: Match, cv: Conversion) -> None:
    x, r = cv.act(m.values["x"]), m.nodes["n"].attrs["repeats"]
    cv.kinds[m.nodes["n"].outputs[0]] = x.but(heads=x.heads * r, repeat=r)


def _reshape_check(m: Match, cv: Conversion) -> bool:
    """Reshape out of HEADS5 (repeat_kv's end), into FLAT or out of FLATT (sdpa's key transpose)."""
    x, out = cv.act(m.values["x"]), dims(cv, m.nodes["n"].outputs[0])
    if x.view == HEADS5:
        return len(out) == 4 and out[1] in (x.heads, None) and out[3] in (x.head_dim, None)
    if x.view == HEADS:
        return len(out) == 3 and out[0] in (x.heads, None) and out[2] == x.head_dim
    if x.view == FLATT:
        return len(out) == 4 and out[1] in (x.heads, None) and out[2] == x.head_dim
    return False


def _reshape(m: Match, cv: Conversion) -> None:
    x = cv.act(m.values["x"])
    cv.kinds[m.nodes["n"].outputs[0]] = x.but(view={HEADS5: HEADS, HEADS: FLAT, FLATT: KT}[x.view])


RULES = [
    Rule("identity", Op(("Cast", "Identity", "Dropout", "Slice", "Reshape"), X, name="n"), _identity, _same),
    Rule("split into heads", Op("Reshape", X, name="n"), _split_check, _split),
    Rule("merge heads", Op("Reshape", X, name="n"), _merge_check, _merge),
    Rule("head transpose", Op("Transpose", X, name="n"), _transpose_check, _transpose),
    Rule("key/value cache", Op("Concat", Var("past", Past), X, name="n"), _cache_check, _cache),
    Rule("repeat_kv unsqueeze", Op("Unsqueeze", X, name="n"), _unsqueeze_check, _unsqueeze),
    Rule("repeat_kv expand", Op("Expand", X, name="n"), _expand_check, _expand),
    Rule("repeat_kv and key reshapes", Op("Reshape", X, name="n"), _reshape_check, _reshape),
    Rule("repeat_kv (repeat_interleave)", Op("RepeatInterleave", X, name="n"), _repeat_check, _repeat),
]
