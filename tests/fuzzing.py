"""Shared pieces of the fuzz tests (Hypothesis): how many cases, a JSON mutator, and the one rule.

``FUZZ`` is the settings every fuzz test runs under: ``GROKC_FUZZ_EXAMPLES`` cases each (default
500: 3000 over the six fuzz tests, about 75 s of calls on 2 shared cores), no per-case deadline
(the machine is shared; a hang is caught by ``CASE_SECONDS``), derandomized so CI is repeatable
(``GROKC_FUZZ_SEED`` picks another sequence).

``mutate(data, doc)`` applies 1..3 edits to a copy of a JSON document: it walks down to a random
node and replaces it with a hostile value (negative, huge, non-finite, wrong type, a path leaving
the folder), deletes it, or adds a key beside it.

``only_grokc_errors(call)`` runs ``call``; it may succeed or raise a ``GrokcError`` whose message is
one line; any other exception, or a case longer than ``CASE_SECONDS``, fails the test.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from grokc.core.errors import GrokcError

CASE_SECONDS = 20.0
FUZZ = settings(
    max_examples=int(os.environ.get("GROKC_FUZZ_EXAMPLES", "500")),
    deadline=None,
    derandomize="GROKC_FUZZ_SEED" not in os.environ,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2, 3, 16, 255, 256, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63, -(2**63), 2**64]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "x", "../../etc/passwd", "/etc/hostname", "sm90/plan.json", "tokenizer.json", "f16", "q4",
                     "int32", "float32", "scratch", "io", "linear", "0" * 64, "sm90", "llama", "1e-5", "NaN"]),
    st.text(max_size=12),
    st.lists(st.integers(-3, 2**33), max_size=5),
    st.just([]),
    st.just({}),
    st.dictionaries(st.text(max_size=6), st.integers(-2, 2**40), max_size=3),
)


def mutate(data: st.DataObject, doc: Any, max_edits: int = 3) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, max_edits), label="edits")):
        doc = _mutate_once(data, doc)
    return doc


def _mutate_once(data: st.DataObject, doc: Any) -> Any:
    parent, key, node = None, None, doc
    while isinstance(node, (dict, list)) and node and (parent is None or data.draw(st.integers(0, 7)) != 0):
        keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
        k = data.draw(st.sampled_from(keys))
        parent, key, node = node, k, node[k]
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if parent is None:   # an empty document
        return data.draw(HOSTILE)
    if action == "replace":
        parent[key] = data.draw(HOSTILE)
    elif action == "delete":
        del parent[key]
    elif isinstance(parent, dict):
        parent[data.draw(st.sampled_from(["extra", "../x", "", "files", "offset", "shape"]))] = data.draw(HOSTILE)
    else:
        parent.append(copy.deepcopy(node))
    return doc


def only_grokc_errors(call: Callable[[], Any]) -> str | None:
    """The error line of ``call``, or None when it succeeds; fails on anything else (see the module docstring)."""
    t0 = time.perf_counter()
    try:
        call()
        message = None
    except GrokcError as e:
        message = str(e)
        assert message and "\n" not in message, repr(message)
    elapsed = time.perf_counter() - t0
    assert elapsed < CASE_SECONDS, f"one case took {elapsed:.1f} s"
    return message
