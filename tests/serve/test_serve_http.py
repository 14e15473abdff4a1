"""``grokc serve`` over real HTTP with the official ``openai`` client: every answer is compared token
for token with the same request run alone in a fresh in-process Runner (the CPU plan is
batch-invariant, so concurrency must change nothing)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")

MODEL = "tiny"

# More concurrent clients than the 4 slots, and together more KV blocks than the 10 of the pool, so
# requests wait for a slot and for blocks; greedy and seeded sampling, streamed and not.
REQUESTS = [dict(prompt=[3 + i, 40 + 7 * i, 100 + i], max_tokens=6 + 3 * i,
                 temperature=0.0 if i % 3 == 0 else 1.0 + 0.1 * i, top_p=0.9 if i % 2 else 1.0,
                 top_k=0 if i % 4 else 40, seed=1000 + i, stream=i % 2 == 0) for i in range(10)]


def words(ids: list[int]) -> str:
    return " ".join(f"t{t}" for t in ids)   # the tiny tokenizer's words: t<id>


@pytest.fixture(scope="module")
def server(start_server, tiny_serving_artifact):
    return start_server(tiny_serving_artifact, "--model-name", MODEL)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(client, prompt, max_tokens, temperature, top_p, top_k, seed, stream, **extra):
    """(text, finish_reason, usage) through the openai client, streamed or not."""
    args = dict(model=MODEL, prompt=words(prompt), max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                seed=seed, extra_body={"top_k": top_k}, **extra)
    if not stream:
        r = client.completions.create(**args)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    text, reason, usage = [], None, None
    for chunk in client.completions.create(**args, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            text.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
        if chunk.usage is not None:
            usage = chunk.usage
    return "".join(text), reason, usage


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert server.request("GET", "/health")[:1] == (200,)


def test_concurrent_clients_get_the_continuations_of_single_runs(client, reference, server):
    barrier = threading.Barrier(len(REQUESTS))

    def one(req):
        barrier.wait()
        return complete(client, **req)

    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        results = list(pool.map(one, REQUESTS))
    for req, (text, reason, usage) in zip(REQUESTS, results):
        want = reference(req["prompt"], req["max_tokens"], req["temperature"], req["top_p"], req["top_k"], req["seed"])
        assert (text, usage.completion_tokens, reason) == want, req
        assert usage.prompt_tokens == 3
    assert server.metric("grokc_slots_busy") == 0 and server.metric("grokc_kv_blocks_in_use") == 0


def test_streaming_and_not_agree(client):
    req = dict(prompt=[9, 8, 7, 6], max_tokens=20, temperature=1.5, top_p=0.95, top_k=0, seed=77)
    assert complete(client, **req, stream=True) == complete(client, **req, stream=False)


def test_a_seed_reproduces_and_another_differs(client):
    req = dict(prompt=[11, 12], max_tokens=16, temperature=2.0, top_p=1.0, top_k=0, stream=False)
    a, b, c = (complete(client, **req, seed=s)[0] for s in (5, 5, 6))
    assert a == b and a != c


def test_stop_strings_end_the_text_before_them(client, reference):
    want, _, _ = reference([21, 22, 23], 30, 1.0, 1.0, 0, 3)
    stop = want.split()[3]
    text, reason, usage = complete(client, [21, 22, 23], 30, 1.0, 1.0, 0, 3, stream=True, stop=[stop, "t999"])
    assert text == want[:want.index(stop)] and reason == "stop"
    text2, reason2, _ = complete(client, [21, 22, 23], 30, 1.0, 1.0, 0, 3, stream=False, stop=stop)
    assert (text2, reason2) == (text, reason)


def test_chat_uses_the_artifact_template(client, reference, tiny_runner):
    # TINY_CHAT_TEMPLATE (tests/conftest.py) renders one user turn as "t10 <content> t12"
    want, count, _ = reference(tiny_runner.encode("t10 t5 t6 t12"), 10)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "t5 t6"}], max_tokens=10,
                                       temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (4, count)
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "t5 t6"}],
                                                 max_tokens=10, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want


def test_openai_client_sees_refusals_as_its_errors(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="t5", max_tokens=10_000)
    assert err.value.code == "max_tokens_too_large"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="other", prompt="t5")
    assert err.value.code == "model_not_found"


def test_metrics_are_prometheus_text(server, client):
    complete(client, [5, 6], 4, 0.0, 1.0, 0, 1, stream=False)
    status, headers, raw = server.request("GET", "/metrics")
    text = raw.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("grokc_queue_length", "grokc_slots_busy", "grokc_kv_blocks_in_use", "grokc_generation_tokens_per_second",
                 "grokc_time_to_first_token_seconds_count", "grokc_time_per_output_token_seconds_bucket",
                 'grokc_refusals_total{reason="model_not_found"}', 'grokc_responses_total{status="200"}'):
        assert f"\n{name}" in text, name
    assert server.metric("grokc_slots_total") == 4 and server.metric("grokc_kv_blocks_total") == 10
    assert server.metric("grokc_time_to_first_token_seconds_count") >= 1
    assert server.metric("grokc_generation_tokens_total") >= 4


def test_error_bodies_are_json_with_a_code(server):
    for method, path, body, status, code in (("GET", "/nowhere", None, 404, "not_found"),
                                             ("GET", "/v1/completions", None, 405, "method_not_allowed"),
                                             ("POST", "/v1/completions", b"{", 400, "invalid_json")):
        got, _, raw = server.request(method, path, body)
        assert (got, json.loads(raw)["error"]["code"]) == (status, code)
