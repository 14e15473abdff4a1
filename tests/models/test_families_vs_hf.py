"""The CPU plan of every family's tiny model against transformers (fp32), from its Hugging Face
folder and from its GGUF (``--quant fp16``: f16 weights and activations against fp32).

Compared, for each family and source:

- last-token logits of a 12-token prompt (bucket 16) and a 40-token one (bucket 64; longer than
  Mistral's window of 6 and Gemma's of 5): within ``LOGIT_TOL`` of their RMS, same argmax;
- teacher-forced logits of 30 decode steps after a 1-token prefill (``Engine.score``) against
  transformers run the same way, one token at a time with its KV cache: within ``LOGIT_TOL``;
- the first 16 greedy tokens (Hugging Face builds) against ``generate``: identical, on a prompt
  whose greedy path has no near-tie that the tolerance above could flip (``clear_greedy_prompt``).

The GGUF reference is transformers loaded from the GGUF (``conftest.GGUF_OVERRIDES``: the fields
a GGUF lacks, as grokc reads them). A Mistral GGUF loads as Llama in both, without its window.
The two builds of a family store the same weight bytes; only a longrope's tables may differ by f32
rounding, the GGUF holding its factors in f32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from near_tie import clear_prefix
from safetensors.numpy import load_file
from tiny_families import FAMILIES, cached_logits

from grokc.runner import Runner, SamplingParams

LOGIT_TOL = 2e-2  # of the logits' RMS: f16 weights and activations (measured: <= 6e-3)
SOURCES = ("hf", "gguf")


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(5, 300, n).tolist()


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.sqrt((want ** 2).mean()))


def prefill_logits(runner: Runner, ids: list[int]) -> np.ndarray:
    slot = runner.engine.add(ids, SamplingParams(max_new_tokens=1))
    logits = runner.executor.read(runner.plan.graphs[f"prefill_{runner.engine.bucket_for(len(ids))}"].logits)[0].copy()
    runner.engine.release(slot)
    return logits


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(family_artifact, hf_reference, family, source):
    runner = Runner(family_artifact(family, source), device="cpu")
    ref = hf_reference(family, source)
    for n in (12, 40):
        if family == "phi3_longrope" and n > 16:
            continue   # past original_max_position_embeddings: test_longrope_switches_per_position
        ids = prompt(n, seed=n)
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0, -1].numpy()
        got = prefill_logits(runner, ids)
        assert rel_err(got, want) < LOGIT_TOL, f"{family}/{source} bucket of {n}: {rel_err(got, want):.3g}"
        assert got.argmax() == want.argmax()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_steps_match_transformers(family_artifact, hf_reference, family, source):
    runner = Runner(family_artifact(family, source), device="cpu")
    seq = prompt(31, seed=7)
    got = runner.engine.score([seq])[0]
    want = cached_logits(hf_reference(family, source), seq)
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert max(errs) < LOGIT_TOL, f"{family}/{source}: worst step {int(np.argmax(errs))} at {max(errs):.3g}"


def greedy(ref, ids: list[int], n_new: int, cached: bool) -> list[int]:
    """transformers' greedy continuation: ``generate``, or (``cached``) its own loop of one token at
    a time with the KV cache (``cached_logits``; for longrope, see ``test_longrope_switches_per_position``)."""
    if not cached:
        with torch.no_grad():
            return ref.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(ids):].tolist()
    out = []
    for _ in range(n_new):
        out.append(int(cached_logits(ref, ids + out)[-1].argmax()))
    return out


def clear_greedy_prompt(ref, n_prompt: int, n_new: int, cached: bool = False,
                        min_new: int | None = None) -> tuple[list[int], list[int]]:
    """A seed's prompt and the leading tokens of its transformers greedy continuation (``n_new``
    tokens, none of them EOS: grokc stops there) that each have a top-1 lead of at least
    ``2 * LOGIT_TOL`` of the logits' RMS: where each logit is within ``LOGIT_TOL`` of transformers'
    (the tests above), no choice can flip, so any difference is an error and not an fp16 near-tie.
    The first seed whose clear start has ``min_new`` tokens (default ``n_new``: all of them)."""
    need = n_new if min_new is None else min_new
    eos = ref.config.eos_token_id
    for seed in range(100, 140):
        ids = prompt(n_prompt, seed)
        want = greedy(ref, ids, n_new, cached)
        if eos in want:
            continue
        n_clear = clear_prefix(cached_logits(ref, ids + want)[n_prompt - 1:-1], LOGIT_TOL)
        if n_clear >= need:
            return ids, want[:n_clear]
    raise AssertionError(f"no prompt among 40 seeds has {need} greedy tokens without a near-tie")


@pytest.mark.parametrize("family", FAMILIES)
def test_first_16_greedy_tokens_match_transformers(family_artifact, hf_reference, family):
    runner = Runner(family_artifact(family, "hf"), device="cpu")
    ids, want = clear_greedy_prompt(hf_reference(family), 10, 16, cached=family == "phi3_longrope")
    assert runner.generate_ids([ids], SamplingParams(max_new_tokens=16))[0] == want


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_and_gguf_builds_store_the_same_weights(family_artifact, family):
    hf, gg = (load_file(str(family_artifact(family, s) / "weights.safetensors")) for s in SOURCES)
    assert sorted(hf) == sorted(gg)
    for name in hf:
        if name.startswith("rope_") and family == "phi3_longrope":
            np.testing.assert_allclose(hf[name], gg[name], rtol=0, atol=1e-6, err_msg=name)
        else:
            assert hf[name].tobytes() == gg[name].tobytes(), name


def test_longrope_switches_per_position(family_artifact, hf_reference):
    """grokc rotates positions below original_max_position_embeddings (16) by the short factors and
    the rest by the long ones, which is what transformers computes token by token with its cache,
    and not what its one-call forward of a 24-token prompt computes (all positions long). Nor what
    its ``generate`` does for Phi-3: on reaching 17 tokens it drops its cache and recomputes every
    position with the long factors (``Phi3ForCausalLM.prepare_inputs_for_generation``); grokc keeps
    the keys it stored, so its greedy tokens are compared with transformers' cached loop."""
    runner = Runner(family_artifact("phi3_longrope", "hf"), device="cpu")
    ref = hf_reference("phi3_longrope")
    ids = prompt(24, seed=24)
    got = prefill_logits(runner, ids)
    assert rel_err(got, cached_logits(ref, ids)[-1]) < LOGIT_TOL
    with torch.no_grad():
        one_call = ref(torch.tensor([ids])).logits[0, -1].numpy()
    assert rel_err(got, one_call) > 10 * LOGIT_TOL
    # 12 prompt tokens (short), then at least 8 clear greedy ones: positions 12..19 and on cross 16
    ids, want = clear_greedy_prompt(ref, 12, 24, cached=True, min_new=8)
    assert runner.generate_ids([ids], SamplingParams(max_new_tokens=24))[0][:len(want)] == want
