"""The hard limits, probed one by one over HTTP, and 200 malformed or hostile requests: each gets
its status and a JSON body with its code, and the server stays healthy and right afterwards."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_harness import read_all, stream_first_chunk

MODEL = "tiny"
OK = {"model": MODEL, "prompt": "t5 t6 t7", "max_tokens": 4, "temperature": 0}


def test_full_queue_gets_429_and_a_request_that_fits_later_waits(start_server, tiny_serving_artifact, reference):
    server = start_server(tiny_serving_artifact, "--model-name", MODEL, "--max-queue", "2")
    # 3 + 120 tokens hold 8 of the 10 KV blocks: the next requests (3 blocks each) must wait
    long = stream_first_chunk(server, {"model": MODEL, "prompt": "t5 t6 t7", "max_tokens": 120, "temperature": 0})
    bodies = [{"model": MODEL, "prompt": f"t{30 + i} t31 t32", "max_tokens": 40, "temperature": 0} for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda b: server.request("POST", "/v1/completions", b), bodies))
    assert sorted(status for status, _, _ in results) == [200, 200, 429]
    for body, (status, headers, raw) in zip(bodies, results):
        answer = json.loads(raw)
        if status == 429:
            assert answer["error"]["code"] == "queue_full" and int(headers["retry-after"]) >= 1
        else:
            want = reference([30 + bodies.index(body), 31, 32], 40)
            assert (answer["choices"][0]["text"], answer["usage"]["completion_tokens"]) == want[:2]
    assert b"data: [DONE]" in read_all(long)
    assert server.metric('grokc_refusals_total{reason="queue_full"}') == 1


def _seconds(run) -> float:
    """The fastest of three runs of ``run()``."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def test_deadline_gives_504_frees_the_slot_and_the_next_request_is_served(start_server, tiny_serving_artifact,
                                                                           reference):
    # The deadline sits between one prefill and 120 decode steps as this machine runs them (a geometric
    # mean: several times either), so the test means the same on a fast machine and a slow one.
    short, long = _seconds(lambda: reference([5, 6, 7], 1)), _seconds(lambda: reference([5, 6, 7], 120))
    assert reference([5, 6, 7], 120)[1] == 120 and long > 16 * short, (short, long)
    timeout = (short * long) ** 0.5
    server = start_server(tiny_serving_artifact, "--model-name", MODEL, "--request-timeout", f"{timeout:.4f}")
    status, body = server.post("/v1/completions", {**OK, "max_tokens": 120})
    assert status == 504 and body["error"]["code"] == "deadline_exceeded"
    assert server.metric("grokc_slots_busy") == 0 and server.metric("grokc_kv_blocks_in_use") == 0
    events = read_all(stream_first_chunk(server, {**OK, "max_tokens": 120}))   # past it mid-stream: an error event
    assert b'"code": "deadline_exceeded"' in events and b"[DONE]" not in events
    status, body = server.post("/v1/completions", {**OK, "max_tokens": 1})   # a prefill: well inside it
    assert status == 200 and body["choices"][0]["text"] == reference([5, 6, 7], 1)[0]


def test_config_file_sets_limits_and_flags_win(start_server, tiny_serving_artifact, tmp_path):
    config = tmp_path / "limits.toml"
    config.write_text("[limits]\nmax_new_tokens = 20\nmax_prompt_tokens = 8\nmax_body_bytes = 4096\n")
    server = start_server(tiny_serving_artifact, "--model-name", MODEL, "--config", str(config),
                          "--max-new-tokens", "30")
    assert server.post("/v1/completions", {**OK, "max_tokens": 30})[0] == 200
    status, body = server.post("/v1/completions", {**OK, "max_tokens": 31})
    assert status == 400 and body["error"]["code"] == "max_tokens_too_large" and "30" in body["error"]["message"]
    status, body = server.post("/v1/completions", {**OK, "prompt": list(range(3, 12))})
    assert status == 400 and body["error"]["code"] == "prompt_too_long" and "at most 8" in body["error"]["message"]
    status, body = server.post("/v1/completions", {**OK, "prompt": "t3 " * 1500})
    assert status == 413 and body["error"]["code"] == "body_too_large"


def hostile_cases() -> list[tuple[str, str, bytes, dict, int, str]]:
    """(method, path, body, headers, status, code): each a distinct way to be wrong."""
    j = lambda **kw: json.dumps({**OK, **kw}).encode()   # noqa: E731
    post = lambda body, status, code, path="/v1/completions": ("POST", path, body, {}, status, code)  # noqa: E731
    chat = "/v1/chat/completions"
    msg = lambda *m: json.dumps({"model": MODEL, "messages": list(m)}).encode()   # noqa: E731
    cases = [
        post(b"", 400, "invalid_json"), post(b"{", 400, "invalid_json"), post(b"null", 400, "invalid_request"),
        post(b"[1, 2]", 400, "invalid_request"), post(b'"text"', 400, "invalid_request"),
        post(b'{"model": "tiny", "prompt": "\xff\xfe t5"}', 400, "invalid_json"),     # invalid UTF-8
        post(b"\xc3\x28" * 50, 400, "invalid_json"),
        post(b'{"model": "tiny", "prompt": "\\ud800 t5"}', 400, "invalid_string"),      # a lone surrogate
        post(b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),                     # nesting past the stack
        post(j(max_tokens=10**30), 400, "max_tokens_too_large"), post(j(max_tokens=0), 400, "invalid_parameter"),
        post(j(max_tokens=-5), 400, "invalid_parameter"), post(j(max_tokens="many"), 400, "invalid_type"),
        post(j(max_tokens=4.5), 400, "invalid_type"), post(j(max_tokens=True), 400, "invalid_type"),
        post(j(max_tokens=100, prompt=" ".join(["t4"] * 40)), 400, "context_length_exceeded"),
        post(j(temperature=-1), 400, "invalid_parameter"), post(j(temperature="hot"), 400, "invalid_type"),
        post(b'{"model": "tiny", "prompt": "t5", "temperature": NaN}', 400, "invalid_parameter"),
        post(b'{"model": "tiny", "prompt": "t5", "temperature": Infinity}', 400, "invalid_parameter"),
        post(j(temperature=1e39), 400, "invalid_parameter"), post(j(temperature=10**400), 400, "invalid_parameter"),
        post(j(top_p=0), 400, "invalid_parameter"), post(j(top_p=1.01), 400, "invalid_parameter"),
        post(j(top_k=-1), 400, "invalid_parameter"), post(j(top_k=100_000), 400, "invalid_parameter"),
        post(j(seed=-1), 400, "invalid_parameter"), post(j(seed=2**64), 400, "invalid_parameter"),
        post(j(seed="x"), 400, "invalid_type"), post(j(n=2), 400, "unsupported_parameter"),
        post(j(logprobs=3), 400, "unsupported_parameter"), post(j(echo=True), 400, "unsupported_parameter"),
        post(j(best_of=3), 400, "unsupported_parameter"), post(j(presence_penalty=0.5), 400, "unsupported_parameter"),
        post(j(stop=["a"] * 5), 400, "too_many_stop_strings"), post(j(stop=""), 400, "invalid_stop"),
        post(j(stop=["x" * 1000]), 400, "invalid_stop"), post(j(stop=5), 400, "invalid_type"),
        post(j(stop=[None]), 400, "invalid_type"),
        post(j(stream="yes"), 400, "invalid_type"), post(j(stream_options={"include_usage": True}), 400,
                                                         "invalid_parameter"),
        post(j(prompt=""), 400, "empty_prompt"), post(j(prompt=[]), 400, "empty_prompt"),
        post(j(prompt=[999_999]), 400, "invalid_parameter"), post(j(prompt=[-1]), 400, "invalid_parameter"),
        post(j(prompt=[1.5]), 400, "invalid_type"), post(j(prompt={"a": 1}), 400, "invalid_type"),
        post(j(prompt=None), 400, "missing_parameter"), post(j(prompt=" ".join(["t7"] * 65)), 400, "prompt_too_long"),
        post(j(prompt=list(range(3, 70))), 400, "prompt_too_long"), post(j(prompt=["a", "b"]), 400, "invalid_type"),
        post(j(model=None), 400, "missing_parameter"), post(j(model="gpt-4"), 400, "model_not_found"),
        post(j(model=["tiny"]), 400, "invalid_type"),
        post(msg(), 400, "invalid_type", chat), post(json.dumps({"model": MODEL, "messages": "hi"}).encode(), 400,
                                                     "invalid_type", chat),
        post(msg({"role": "wizard", "content": "t5"}), 400, "invalid_message", chat),
        post(msg({"role": "user"}), 400, "invalid_type", chat), post(msg("t5"), 400, "invalid_message", chat),
        post(msg({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}), 400,
             "unsupported_content", chat),
        post(msg({"role": "user", "content": "t5", "extra": 1}), 400, "invalid_message", chat),
        ("GET", "/v1/completions", b"", {}, 405, "method_not_allowed"), ("DELETE", "/health", b"", {}, 405,
                                                                         "method_not_allowed"),
        ("POST", "/v1/nothing", b"{}", {}, 404, "not_found"), ("GET", "/../../etc/passwd", b"", {}, 404, "not_found"),
    ]
    big = json.dumps({**OK, "prompt": "t5 " * (10 * 2**20 // 3)}).encode()     # a 10 MB body, three times
    cases += [post(big, 413, "body_too_large")] * 3
    return cases


def test_200_hostile_requests_leave_the_server_healthy_and_right(start_server, tiny_serving_artifact, reference):
    server = start_server(tiny_serving_artifact, "--model-name", MODEL)
    cases = hostile_cases()
    rng = random.Random(0)
    valid = json.dumps({**OK, "max_tokens": 3, "stop": ["t9"], "seed": 4}).encode()
    while len(cases) < 200:   # byte-level mutations of a valid body: anything may come of them but a 5xx
        body = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        cases.append(("POST", "/v1/completions", bytes(body), {}, 0, ""))
    for method, path, body, headers, status, code in cases:
        got, _, raw = server.request(method, path, body, headers)
        answer = json.loads(raw)
        if status:
            assert (got, answer.get("error", {}).get("code")) == (status, code), (body[:120], answer)
        else:
            assert got in (200, 400, 404, 413) and (got == 200) == ("error" not in answer), (body, answer)
        if got >= 400:
            assert isinstance(answer["error"]["message"], str) and "\n" not in answer["error"]["message"]
    assert server.request("GET", "/health")[0] == 200
    assert server.metric("grokc_slots_busy") == 0 and server.metric("grokc_kv_blocks_in_use") == 0
    status, body = server.post("/v1/completions", OK)
    assert status == 200 and body["choices"][0]["text"] == reference([5, 6, 7], 4)[0]


def test_hostile_requests_in_parallel_with_good_ones(start_server, tiny_serving_artifact, reference):
    """Refusals racing admissions: the good answers are still those of single runs."""
    server = start_server(tiny_serving_artifact, "--model-name", MODEL)
    bad = [c for c in hostile_cases() if c[4] == 400][:40]
    good = [{**OK, "prompt": [5 + i, 6, 7], "max_tokens": 5 + i} for i in range(8)]
    barrier = threading.Barrier(len(bad) + len(good))

    def send(item):
        barrier.wait()
        if isinstance(item, dict):
            return server.post("/v1/completions", item)
        return server.request(item[0], item[1], item[2])[0], None

    with ThreadPoolExecutor(len(bad) + len(good)) as pool:
        results = list(pool.map(send, good + bad))
    for body, (status, answer) in zip(good, results):
        assert status == 200 and answer["choices"][0]["text"] == reference(body["prompt"], body["max_tokens"])[0]
    assert all(status == 400 for status, _ in results[len(good):])


@pytest.mark.parametrize("drop_after", [b"", b"{\"model\": \"ti"])
def test_a_client_that_vanishes_mid_body_costs_nothing(start_server, tiny_serving_artifact, drop_after):
    server = start_server(tiny_serving_artifact, "--model-name", MODEL)
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + drop_after)
    sock.close()
    assert server.post("/v1/completions", OK)[0] == 200
