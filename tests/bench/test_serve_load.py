"""bench/serve_load.py against a tiny ``grokc serve``: its counts agree with the server's own
/metrics, refusals are counted by code, and it sends nothing to an address off the loopback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from serve_harness import launch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import serve_load  # noqa: E402  (bench/ is a folder of scripts, not a package)


def test_levels_agree_with_the_server_metrics(tiny_serving_artifact, tmp_path, capsys):
    server = launch(tiny_serving_artifact, "--max-queue", "1", log=tmp_path / "serve.log")
    try:
        tokens_before = server.metric("grokc_generation_tokens_total")
        serve_load.main(["--url", server.url, "--concurrency", "1,8", "--requests", "12", "--max-tokens", "12",
                         "--prompt-words", "6"])
        report = json.loads(capsys.readouterr().out)
        levels = report["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 8] and report["model"] == "tiny"
        for lv in levels:
            assert lv["requests"] == 12 == lv["ok"] + sum(lv["refused"].values())
            if lv["ok"]:
                assert lv["ttft_ms"]["p50"] <= lv["ttft_ms"]["p99"] and lv["tpot_ms"]["p50"] <= lv["tpot_ms"]["p99"]
        assert levels[0]["refused"] == {}   # one client never finds the queue full
        assert sum(lv["output_tokens"] for lv in levels) == server.metric("grokc_generation_tokens_total") - tokens_before
        refused = sum(lv["refused"].get("queue_full", 0) for lv in levels)
        if refused:
            assert server.metric('grokc_refusals_total{reason="queue_full"}') == refused
    finally:
        server.stop()


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://192.168.1.1", "http://[2001:db8::1]:80"])
def test_refuses_addresses_off_the_loopback(url):
    with pytest.raises(SystemExit, match="loopback"):
        serve_load.main(["--url", url])
