"""The CPU plan of SmolLM2-135M against transformers (fp32, loaded from the same GGUF).

fp16 artifact: weights and activations in f16 through 30 layers; last-token logits must agree
with the fp32 reference to 3e-2 of their RMS, with the same argmax, and the first 16 greedy
tokens must be identical.
"""

import numpy as np
import pytest
import torch

from grokc.runner import Runner, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
]
LOGIT_TOL = 3e-2


@pytest.fixture(scope="module")
def fp16_runner(smollm2_artifacts):
    return Runner(smollm2_artifacts("fp16"), device="cpu")


def prefill_logits(runner: Runner, ids: list[int], bucket: int | None = None) -> np.ndarray:
    slot = runner.engine.add(ids, SamplingParams(max_new_tokens=1), bucket=bucket)
    bucket = bucket or runner.engine.bucket_for(len(ids))
    logits = runner.executor.read(runner.plan.graphs[f"prefill_{bucket}"].logits)[0].copy()
    runner.engine.release(slot)
    return logits


@pytest.mark.parametrize("prompt", PROMPTS)
def test_last_token_logits_match_transformers(fp16_runner, hf_reference, hf_tokenizer, prompt):
    ids = hf_tokenizer(prompt).input_ids
    assert fp16_runner.encode(prompt) == ids
    with torch.no_grad():
        want = hf_reference(torch.tensor([ids])).logits[0, -1].numpy()
    got = prefill_logits(fp16_runner, ids)
    err = np.abs(got - want).max() / np.sqrt((want ** 2).mean())
    assert err < LOGIT_TOL, f"max logit error {err:.3g} of the RMS"
    assert got.argmax() == want.argmax()


def test_first_16_greedy_tokens_match_transformers(fp16_runner, hf_reference, hf_tokenizer):
    for prompt in PROMPTS[:2]:
        ids = hf_tokenizer(prompt).input_ids
        with torch.no_grad():
            want = hf_reference.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                         eos_token_id=None)[0, len(ids):].tolist()
        got = fp16_runner.generate_ids([ids], SamplingParams(max_new_tokens=16))[0]
        assert got == want


def test_bucket_padding_gives_same_logits(fp16_runner):
    ids = fp16_runner.encode(PROMPTS[0])
    a, b = prefill_logits(fp16_runner, ids, 128), prefill_logits(fp16_runner, ids, 512)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(a).max())


def test_prompt_alone_equals_prompt_in_full_batch(smollm2_artifacts):
    runner = Runner(smollm2_artifacts("int4"), device="cpu")
    prompts = [runner.encode(p) for p in PROMPTS + ["Once upon a time"]]
    params = SamplingParams(max_new_tokens=12)
    together = runner.generate_ids(prompts, params)
    alone = [runner.generate_ids([p], params)[0] for p in prompts]
    assert together == alone
