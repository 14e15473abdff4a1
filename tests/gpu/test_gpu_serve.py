"""``grokc serve --device cuda`` and the runner's batch invariance on the GPU (run with ``-m gpu``).

The GPU kernels are not batch-invariant yet (their f32 sums depend on the batch; the GPU issue's
item 8): the tests that need it are marked xfail (not strict) until they are. The rest, readiness,
refusals, the drain and the CUDA-event profile, must pass on a GPU now.
"""

from __future__ import annotations

import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from serve_harness import launch, read_all, stream_first_chunk

from grokc.runner import Runner, SamplingParams

NOT_INVARIANT = pytest.mark.xfail(reason="GPU kernels are not batch-invariant yet (the GPU issue, item 8)",
                                  strict=False)
MODEL = "tiny"


@pytest.fixture(scope="module")
def gpu_artifact(tiny_serving_artifact, sm):
    if sm != 90:
        pytest.skip(f"the tiny serving artifact is built for sm90; this GPU is sm{sm}")
    return tiny_serving_artifact


@pytest.fixture(scope="module")
def server(gpu_artifact, tmp_path_factory):
    trace = tmp_path_factory.mktemp("gpu-serve") / "trace.json"
    s = launch(gpu_artifact, "--model-name", MODEL, "--profile", str(trace), "--profile-steps", "3",
               log=trace.with_suffix(".log"), device="cuda")
    s.trace = trace
    yield s
    if s.proc.poll() is None:
        s.stop()


def completion(server, prompt: list[int], max_tokens: int, **sampling) -> dict:
    status, body = server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                   "temperature": 0, **sampling})
    assert status == 200, body
    return body


def logits_alone_and_batched(path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    r = Runner(path, device="cuda")
    e, request, params = r.engine, [5, 6, 7, 8], SamplingParams(max_new_tokens=10)

    def steps(fillers: int) -> list[np.ndarray]:
        busy = [e.add([40 + i, 41, 42], SamplingParams(max_new_tokens=12, temperature=1.0, seed=i))
                for i in range(fillers)]
        slot = e.add(request, params)
        out = []
        for _ in range(params.max_new_tokens - 1):
            e.decode(1)
            out.append(e.ex.read(r.plan.graphs[e.decode_graph()].logits)[slot].copy())
        for s in [*busy, slot]:
            e.release(s)
        return out

    return steps(0), steps(3)


@NOT_INVARIANT
def test_gpu_logits_do_not_depend_on_the_batch(gpu_artifact):
    alone, batched = logits_alone_and_batched(gpu_artifact)
    assert all(np.array_equal(a, b) for a, b in zip(alone, batched))


@NOT_INVARIANT
def test_gpu_concurrent_requests_match_single_runs(server):
    reqs = [dict(prompt=[3 + i, 40 + 7 * i, 100 + i], max_tokens=8 + 3 * i, temperature=1.0, seed=i)
            for i in range(10)]
    single = [completion(server, **r)["choices"][0]["text"] for r in reqs]
    barrier = threading.Barrier(len(reqs))

    def one(r):
        barrier.wait()
        return completion(server, **r)["choices"][0]["text"]

    with ThreadPoolExecutor(len(reqs)) as pool:
        assert list(pool.map(one, reqs)) == single


def test_gpu_server_refuses_and_stays_healthy(server):
    for body, code in (({"model": MODEL, "prompt": "t5", "temperature": -1}, "invalid_parameter"),
                       ({"model": MODEL, "prompt": "t5", "max_tokens": 10_000}, "max_tokens_too_large"),
                       ({"model": MODEL, "prompt": list(range(3, 80))}, "prompt_too_long")):
        status, answer = server.post("/v1/completions", body)
        assert (status, answer["error"]["code"]) == (400, code)
    assert server.request("GET", "/health")[0] == 200
    assert completion(server, [5, 6, 7], 6)["usage"]["completion_tokens"] >= 1


def test_gpu_drain_writes_a_profile_of_cuda_event_times(server, gpu_artifact):
    stream = stream_first_chunk(server, {"model": MODEL, "prompt": [9, 8, 7], "max_tokens": 40, "temperature": 0})
    server.proc.send_signal(signal.SIGTERM)   # the request is in flight: the drain must finish it
    assert b"data: [DONE]" in read_all(stream)
    assert server.proc.wait(60) == 0
    plan = json.loads((gpu_artifact / "sm90" / "plan.json").read_text())
    launches = [e for e in json.loads(server.trace.read_text())["traceEvents"]
                if e["ph"] == "X" and e["cat"] != "replay"]
    assert launches
    for e in launches:
        launch_ = plan["graphs"][e["args"]["graph"]]["launches"][e["args"]["launch"]]
        assert e["name"] == f"{launch_['node']} {launch_['kernel']}" and e["dur"] > 0
