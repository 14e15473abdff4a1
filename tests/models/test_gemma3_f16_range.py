"""A Gemma 3 whose residual stream passes the f16 range, built ``--quant fp16`` (the real 270M's
does: ``tests/e2e/test_gemma3_vs_hf.py``), against transformers fp32 on the CPU plan.

The model is the tiny random Gemma 3 of ``tiny_families.py`` with its post-feedforward norms scaling
by about ``POST_NORM`` (``1 + w`` times it), so that its residual stream reaches past 65504 in fp32
(checked) while every other activation stays in range. Compared:

- with ``passes/scale_residual.py`` (the architecture's ``residual_shift``): last-token logits of a
  12- and a 40-token prompt within ``LOGIT_TOL`` of their RMS with the same argmax, and 16 greedy
  tokens equal to transformers' on a prompt without near-ties;
- the same build with the pass off (``residual_shift`` 0): non-finite logits, the overflow the
  pass prevents;
- on the unscaled tiny Gemma 3 (no overflow), the pass moves the logits by less than
  ``SAME_TOL`` of their RMS (it only changes exponents; values it makes f16 subnormals keep fewer
  bits), well inside ``LOGIT_TOL``.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
import torch
from test_families_vs_hf import LOGIT_TOL, clear_greedy_prompt, prefill_logits, prompt, rel_err
from tiny_families import hf_model

from grokc.compiler import models
from grokc.compiler.build import BuildOptions, build
from grokc.runner import Runner, SamplingParams

POST_NORM = 16384.0
F16_MAX = 65504.0
SAME_TOL = 1e-3
BUILD = dict(archs=("sm90",), batch=2, buckets=(16, 64), max_seq=128)


def overflowing_gemma3():
    model, tok = hf_model("gemma3")
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.post_feedforward_layernorm.weight
            w.copy_((1 + w) * POST_NORM - 1)
    return model, tok


@contextlib.contextmanager
def residual_shift(shift: int):
    """Gemma 3's architecture record with ``residual_shift`` = ``shift`` for this block."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(models.ARCHITECTURES, "gemma3", dataclasses.replace(models.get("gemma3"), residual_shift=shift))
        yield


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(model, shift) -> the CPU runner of that build (``shift`` None: the architecture's own), and the
    transformers models by name."""
    root = tmp_path_factory.mktemp("gemma3-f16-range")
    sources = {"overflowing": overflowing_gemma3(), "plain": hf_model("gemma3")}
    for name, (model, tok) in sources.items():
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    runners = {}

    def get(name: str, shift: int | None = None) -> Runner:
        if (name, shift) not in runners:
            out = root / f"{name}-{shift}"
            with contextlib.nullcontext() if shift is None else residual_shift(shift):
                build(root / name, out, BuildOptions(quant="fp16", **BUILD))
            runners[name, shift] = Runner(out, device="cpu")
        return runners[name, shift]

    return get, {name: model for name, (model, _) in sources.items()}


def residual_max(model, ids: list[int]) -> float:
    """max |h| of transformers' residual stream (each layer's output) on ``ids``."""
    seen = []
    hooks = [layer.register_forward_hook(lambda m, i, o: seen.append(float(o[0].abs().max() if isinstance(o, tuple)
                                                                           else o.abs().max())))
             for layer in model.model.layers]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return max(seen)


def test_the_test_model_passes_the_f16_range(built):
    _, refs = built
    assert residual_max(refs["overflowing"], prompt(40, seed=40)) > 2 * F16_MAX
    assert residual_max(refs["plain"], prompt(40, seed=40)) < F16_MAX / 2 ** models.get("gemma3").residual_shift


def test_prefill_logits_match_transformers_past_the_f16_range(built):
    get, refs = built
    runner = get("overflowing")
    for n in (12, 40):
        ids = prompt(n, seed=n)
        with torch.no_grad():
            want = refs["overflowing"](torch.tensor([ids])).logits[0, -1].numpy()
        got = prefill_logits(runner, ids)
        assert rel_err(got, want) < LOGIT_TOL and got.argmax() == want.argmax(), f"{n} tokens: {rel_err(got, want):.3g}"


def test_greedy_tokens_match_transformers_past_the_f16_range(built):
    get, refs = built
    ids, want = clear_greedy_prompt(refs["overflowing"], 10, 16)
    assert get("overflowing").generate_ids([ids], SamplingParams(max_new_tokens=16))[0] == want


def test_without_the_pass_the_logits_overflow(built):
    get, _ = built
    assert not np.isfinite(prefill_logits(get("overflowing", shift=0), prompt(12, seed=12))).all()


def test_the_pass_keeps_the_logits_of_a_model_in_range(built):
    get, _ = built
    for n in (12, 40):
        ids = prompt(n, seed=n)
        scaled, plain = prefill_logits(get("plain"), ids), prefill_logits(get("plain", shift=0), ids)
        assert rel_err(scaled, plain) < SAME_TOL, f"{n} tokens: {rel_err(scaled, plain):.3g}"
