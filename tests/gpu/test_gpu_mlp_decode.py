"""The batch-1 decode with ``mlp_decode`` launches end to end on the GPU, against the CPU executor.

A 3-layer model with Llama-3.2-1B's hidden size (2048; 32 / 8 heads of 64, intermediate 512, vocab
256, random weights, int4 with zero points) built for sm90: its ``decode_1`` graph runs one
``mlp_decode`` a layer, whose f32 sums the next layer and the head read, three sum buffers (an odd
layer count) cleared from launch to launch and from step to step. Both executors load the same plan
and are driven in lock step: the same prompt prefilled, then 24 greedy decode steps, after each of
which the GPU's token is written into the CPU's slot so both continue from the same text. Checked:

- the logits of every step: ``||gpu - cpu|| / ||cpu|| <= 1e-2`` (int4 with zeros through three
  layers and the f16 head; each kernel alone is within 5e-3, ``tests/gpu``);
- the greedy token of every step where the CPU's best logit leads the second by more than 1 % of
  the logits' spread (closer calls may flip on rounding) is the same;
- a second generation reproduces the first's tokens (the sums start from zero again each step).
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_llama import tiny_config, tiny_loaded

from grokc.artifacts.plan import IO
from grokc.artifacts.store import open_artifact
from grokc.compiler.build import BuildOptions, build_loaded
from grokc.runner.engine import Engine, SamplingParams
from grokc.runner.session import Backend, make_executor
from grokc.targets import get_target, rules_mlp

SHAPES = dict(hidden_size=2048, intermediate_size=512, num_layers=3, num_heads=32, num_kv_heads=8, head_dim=64,
              vocab_size=256)
PROMPT = [5, 17, 99, 3, 42, 7, 7, 201]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, sm):
    if not all(get_target(f"sm{sm}").has(f) for f in rules_mlp.NEEDS):
        pytest.skip("mlp_decode needs bulk copies and vector reductions (sm_90 and newer)")
    out = tmp_path_factory.mktemp("mlp_decode") / "a"
    build_loaded(tiny_loaded(tiny_config(**SHAPES), seed=3), out,
                 BuildOptions(archs=("sm90",), quant="int4-rtn", symmetric=False, batch=2, buckets=(16,), max_seq=256))
    a = open_artifact(out)
    assert [l.op for l in a.plan("sm90").graphs["decode_1"].launches].count("mlp_decode") == 3
    return a


def engine(artifact, device: str):
    plan = artifact.plan("sm90")
    executor = make_executor(artifact, Backend(device, "sm90"))
    return Engine(executor, plan, artifact.manifest.shapes), executor, plan


def test_gpu_decode_follows_the_cpu_executor(artifact):
    gpu, gx, plan = engine(artifact, "cuda")
    cpu, cx, _ = engine(artifact, "cpu")
    params = SamplingParams(max_new_tokens=64)
    slot = gpu.add(PROMPT, params)
    assert cpu.add(PROMPT, params) == slot
    cx.write(IO.TOKENS.value, gx.read(IO.TOKENS.value)[slot], slot)  # the same first token on both
    logits_buf = plan.graphs["decode_1"].logits
    compared = 0
    for step in range(24):
        gx.replay("decode_1")
        cx.replay("decode_1")
        g, c = gx.read(logits_buf)[slot].astype(np.float64), cx.read(logits_buf)[slot].astype(np.float64)
        err = np.linalg.norm(g - c) / np.linalg.norm(c)
        assert err <= 1e-2, f"step {step}: logits relative error {err:.2e}"
        top2 = np.sort(c)[-2:]
        if top2[1] - top2[0] > 0.01 * (c.max() - c.min()):
            assert g.argmax() == c.argmax(), f"step {step}: GPU picked {g.argmax()}, CPU {c.argmax()}"
            compared += 1
        cx.write(IO.TOKENS.value, gx.read(IO.TOKENS.value)[slot], slot)
    assert compared >= 12, f"only {compared} of 24 steps had a clear greedy choice"


def test_replays_reproduce(artifact):
    gpu, _, _ = engine(artifact, "cuda")
    first = gpu.generate([PROMPT], SamplingParams(max_new_tokens=20))
    second = gpu.generate([PROMPT], SamplingParams(max_new_tokens=20))
    assert first == second and len(first[0]) == 20
