"""A client that disconnects mid-stream frees its slot; SIGTERM drains (503 for new requests, what is
in flight finishes or times out, exit 0); ``--profile`` writes a Chrome trace named by the plan."""

from __future__ import annotations

import json
import re
import signal
import threading
import time

from serve_harness import read_all, stream_first_chunk
from test_serve_limits import MODEL, OK


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_a_disconnect_mid_stream_frees_the_slot(start_server, tiny_serving_artifact, reference):
    server = start_server(tiny_serving_artifact, "--model-name", MODEL)
    before = server.metric("grokc_generation_tokens_total")
    stream_first_chunk(server, {**OK, "max_tokens": 120}).close()
    assert wait_for(lambda: server.metric("grokc_slots_busy") == 0)
    assert server.metric("grokc_kv_blocks_in_use") == 0
    spent = server.metric("grokc_generation_tokens_total") - before
    assert spent < 60, f"{spent} of the 120 tokens were generated for a client that had left"
    status, body = server.post("/v1/completions", OK)
    assert status == 200 and body["choices"][0]["text"] == reference([5, 6, 7], 4)[0]


def test_sigterm_drains_what_is_in_flight_and_exits_0(start_server, tiny_serving_artifact, reference):
    server = start_server(tiny_serving_artifact, "--model-name", MODEL)
    stream = stream_first_chunk(server, {**OK, "max_tokens": 120})
    out: dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: out.setdefault("stream", read_all(stream)))
    reader.start()
    server.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: server.request("GET", "/health")[0] == 503, 5)
    status, body = server.post("/v1/completions", OK)
    assert status == 503 and body["error"]["code"] == "draining"
    reader.join(60)
    assert server.proc.wait(60) == 0
    events = [json.loads(line[6:]) for line in out["stream"].decode().split("\r\n")
              if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == reference([5, 6, 7], 120)[0]
    assert b"data: [DONE]" in out["stream"] and "drained; exiting" in server.stderr()


def test_sigterm_times_out_what_runs_past_the_drain_timeout(start_server, tiny_serving_artifact):
    server = start_server(tiny_serving_artifact, "--model-name", MODEL, "--drain-timeout", "0.001")
    stream = stream_first_chunk(server, {**OK, "max_tokens": 120})
    server.proc.send_signal(signal.SIGTERM)
    events = read_all(stream)
    assert b'"code": "shutting_down"' in events and b"[DONE]" not in events
    assert server.proc.wait(60) == 0


def test_profile_writes_a_chrome_trace_named_by_the_plan(start_server, tiny_serving_artifact, tmp_path):
    trace_file = tmp_path / "trace.json"
    server = start_server(tiny_serving_artifact, "--model-name", MODEL, "--profile", str(trace_file),
                          "--profile-steps", "3")
    assert server.post("/v1/completions", {**OK, "max_tokens": 12})[0] == 200
    assert server.stop() == 0
    plan = json.loads((tiny_serving_artifact / "sm90" / "plan.json").read_text())
    events = json.loads(trace_file.read_text())["traceEvents"]
    launches = [e for e in events if e["ph"] == "X" and e["cat"] != "replay"]
    replays = [e for e in events if e.get("cat") == "replay"]
    assert {e["name"] for e in replays} == {"prefill_16", "decode_1"}
    assert sum(e["name"] == "decode_1" for e in replays) == 3   # --profile-steps, then replays run untimed
    for e in launches:
        launch = plan["graphs"][e["args"]["graph"]]["launches"][e["args"]["launch"]]
        assert e["name"] == f"{launch['node']} {launch['kernel']}" and e["cat"] == launch["op"]
        assert e["dur"] >= 0
    for r in replays:   # each replay's launches lie inside it, in plan order, one after another
        inside = [e for e in launches if r["ts"] <= e["ts"] <= r["ts"] + r["dur"] and e["tid"] == r["tid"]]
        assert [e["args"]["launch"] for e in inside] == list(range(len(plan["graphs"][r["name"]]["launches"])))
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(inside, inside[1:]))
    table = server.stderr()
    assert re.search(r"total ms\s+share\s+calls", table) and "blk.0.attention attn" in table
