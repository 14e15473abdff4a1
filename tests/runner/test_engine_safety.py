"""The Python API refuses bad requests with grokc's error types and loses nothing to them: good
requests run between bad ones give exactly what a fresh Runner gives, and every slot and KV block
comes back."""

from __future__ import annotations

import dataclasses
import math

import pytest

from grokc.core.errors import GrokcError, RequestError, RequestTypeError
from grokc.runner import Runner, SamplingParams

GOOD = ["t5 t6 t7", "t9 t100 t3 t44", "t17", "t200 t201"]

# (arguments of generate, the error type, a fragment of its message)
BAD = [
    (dict(prompt=["t5 t6", "t1 " * 70]), RequestError, "largest bucket"),
    (dict(prompt=["t5", ""]), RequestError, "empty"),
    (dict(prompt="t5", temperature="hot"), RequestTypeError, "temperature must be a number"),
    (dict(prompt="t5", temperature=math.nan), RequestError, "finite"),
    (dict(prompt="t5", temperature=math.inf), RequestError, "finite"),
    (dict(prompt="t5", temperature=-0.5), RequestError, "must be >= 0"),
    (dict(prompt="t5", top_p=0.0), RequestError, "top_p=0.0 must be in (0, 1]"),
    (dict(prompt="t5", top_p=1.5), RequestError, "top_p"),
    (dict(prompt="t5", top_k=-1), RequestError, "top_k=-1"),
    (dict(prompt="t5", top_k=257), RequestError, "[0, 256]"),
    (dict(prompt="t5", top_k=2.5), RequestTypeError, "top_k must be an integer"),
    (dict(prompt="t5", seed=2**32), RequestError, "32-bit"),
    (dict(prompt="t5", seed=-1), RequestError, "seed=-1"),
    (dict(prompt="t5", max_new_tokens=0), RequestError, "at least 1"),
    (dict(prompt="t5", max_new_tokens=True), RequestTypeError, "max_new_tokens must be an integer"),
    (dict(prompt="t5", max_new_tokens=128), RequestError, "context of 128"),
    (dict(prompt=5), RequestTypeError, "prompt must be a string"),
    (dict(prompt=[]), RequestTypeError, "non-empty list"),
    (dict(prompt=["t5", None]), RequestTypeError, "every prompt must be a string"),
]


def good_outputs(r: Runner) -> list:
    return [r.generate(GOOD, max_new_tokens=8),
            r.generate(GOOD[:3], max_new_tokens=6, temperature=0.9, top_k=50, top_p=0.9, seed=2**32 - 1),
            r.generate(GOOD[1], max_new_tokens=10, temperature=1.3, seed=7)]


@pytest.fixture(scope="module")
def fresh(tiny_serving_artifact):
    return good_outputs(Runner(tiny_serving_artifact, device="cpu"))


def test_bad_requests_raise_grokc_errors_and_leak_nothing(tiny_serving_artifact, fresh):
    r = Runner(tiny_serving_artifact, device="cpu")
    for kwargs, kind, fragment in BAD:
        with pytest.raises(kind) as err:
            r.generate(**kwargs)
        assert isinstance(err.value, GrokcError), kwargs
        assert isinstance(err.value, TypeError if kind is RequestTypeError else ValueError), kwargs
        assert fragment in str(err.value), (kwargs, str(err.value))
        assert "\n" not in str(err.value)
        assert r.engine.free_slots == [0, 1, 2, 3] and len(r.engine.free_blocks) == 10, kwargs
        assert good_outputs(r) == fresh, f"after {kwargs}"


def test_a_failure_inside_a_wave_frees_the_slots_taken_before_it(tiny_serving_artifact, fresh, monkeypatch):
    """The engine checks prompts first, but a device failure after two prompts took slots must
    give both back too."""
    r = Runner(tiny_serving_artifact, device="cpu")
    replay, calls = r.executor.replay, []

    def failing(graph):
        calls.append(graph)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        replay(graph)

    monkeypatch.setattr(r.executor, "replay", failing)
    with pytest.raises(RuntimeError, match="device lost"):
        r.generate(GOOD, max_new_tokens=8)
    monkeypatch.setattr(r.executor, "replay", replay)
    assert r.engine.free_slots == [0, 1, 2, 3] and len(r.engine.free_blocks) == 10
    assert good_outputs(r) == fresh


def test_seeds_use_all_32_bits_and_larger_ones_are_refused(tiny_serving_artifact):
    """Seeds that agree in their low 32 bits were one seed before (2**32 + 1 ran as 1): now a seed
    past 32 bits is refused, and the top bit of one in range changes what is sampled."""
    r = Runner(tiny_serving_artifact, device="cpu")
    params = dict(max_new_tokens=12, temperature=5.0)
    assert r.generate("t5 t6", seed=1, **params) != r.generate("t5 t6", seed=2**31 + 1, **params)
    with pytest.raises(RequestError):
        r.generate("t5 t6", seed=2**32 + 1, **params)


def test_kv_capacity_is_checked_before_anything_runs(tiny_serving_artifact):
    """A request larger than the whole KV pool is refused naming ``out_of_kv_slots`` and the numbers
    (a build never makes such a pool, so the pool is shrunk here); one that fits later is not."""
    r = Runner(tiny_serving_artifact, device="cpu")
    r.engine.shapes = dataclasses.replace(r.engine.shapes, kv_blocks=3)
    with pytest.raises(RequestError, match=r"out_of_kv_slots: the request needs 4 KV blocks .* has 3 in all"):
        r.engine.check([5, 6], SamplingParams(max_new_tokens=60))
    assert r.engine.check([5, 6], SamplingParams(max_new_tokens=40)) == 16


def test_sampling_params_check_by_itself():
    SamplingParams(max_new_tokens=1, temperature=0, top_k=256, top_p=1, seed=2**32 - 1).check(256)
    with pytest.raises(RequestError):
        SamplingParams(top_p=math.nan).check(256)
