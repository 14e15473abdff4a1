"""Load on a ``grokc serve`` over loopback: throughput, time to first token, time per output token
(p50 / p99) and refusals at several concurrency levels, as JSON.

    python bench/serve_load.py --artifact dist/smollm2 --device cpu --concurrency 1,4,8 --requests 16
    python bench/serve_load.py --url http://127.0.0.1:8000 --concurrency 1,8,32 --requests 256

With ``--artifact`` it starts the server itself (``grokc serve --port 0``), waits for ``/health`` and
stops it with SIGTERM at the end; with ``--url`` it drives one already running, which must be on a
loopback address (127.0.0.0/8 or ::1: nothing else is ever sent a request). Each level sends at
most ``--requests`` streaming completions from ``concurrency`` clients and stops issuing new ones
after ``--max-seconds``; every request has a timeout. The stream's events give the times: the first
event with text is the first token, and the tokens after it (``usage.completion_tokens`` - 1) share
the time until the last. Refusals (429 ``queue_full``, 503, ...) are counted by their error code.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls watch from the old oak".split()


@dataclass
class Outcome:
    status: int = 0
    code: str | None = None        # the error code of a refusal
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens: int = 0
    events: list[float] = field(default_factory=list)


def loopback(host: str) -> bool:
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (socket.gaierror, ValueError):
        return False


def one_request(host: str, port: int, body: dict, timeout: float) -> Outcome:
    out = Outcome()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out.status = resp.status
        if resp.status != 200:
            out.code = json.loads(resp.read() or b"{}").get("error", {}).get("code", f"http_{resp.status}")
            return out
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out.code = event["error"]["code"]
                return out
            if event.get("choices") and event["choices"][0]["text"]:
                out.events.append(time.perf_counter() - t0)
            if event.get("usage"):
                out.tokens = event["usage"]["completion_tokens"]
    except (OSError, http.client.HTTPException) as exc:
        out.code = f"connection_{type(exc).__name__}"
        return out
    finally:
        conn.close()
    if out.events:
        out.ttft_s = out.events[0]
        if out.tokens > 1:
            out.tpot_s = (out.events[-1] - out.events[0]) / (out.tokens - 1)
    return out


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]   # noqa: E731  (nearest rank)
    return {"p50": pick(0.50) * 1e3, "p99": pick(0.99) * 1e3}


def run_level(host: str, port: int, model: str, concurrency: int, requests: int, max_seconds: float,
              prompt_words: int, max_tokens: int, timeout: float) -> dict:
    issued, lock = [0], threading.Lock()
    stop_at = time.monotonic() + max_seconds
    results: list[Outcome] = []

    def client(worker: int) -> None:
        while True:
            with lock:
                if issued[0] >= requests or time.monotonic() > stop_at:
                    return
                n = issued[0]
                issued[0] += 1
            prompt = " ".join(WORDS[(n + i) % len(WORDS)] for i in range(prompt_words))
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "seed": n,
                    "stream": True, "stream_options": {"include_usage": True}}
            outcome = one_request(host, port, body, timeout)
            with lock:
                results.append(outcome)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(client, range(concurrency)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if r.status == 200 and r.code is None]
    refused: dict[str, int] = {}
    for r in results:
        if r not in ok:
            refused[r.code or "unknown"] = refused.get(r.code or "unknown", 0) + 1
    tokens = sum(r.tokens for r in ok)
    return {"concurrency": concurrency, "requests": len(results), "ok": len(ok), "refused": refused,
            "wall_s": wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall if wall else 0.0,
            "requests_per_s": len(ok) / wall if wall else 0.0,
            "ttft_ms": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
            "tpot_ms": percentiles([r.tpot_s for r in ok if r.tpot_s is not None])}


def start_server(artifact: str, device: str, extra: list[str]) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "grokc.cli", "serve", artifact, "--port", "0", "--device", device,
                             "--model-name", "bench", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    for line in proc.stderr:   # "[grokc] listening on http://127.0.0.1:PORT ..." then "... ready: ..."
        sys.stderr.write(line)
        if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
            port = int(m.group(1))
        if "ready:" in line:
            threading.Thread(target=lambda: [sys.stderr.write(x) for x in proc.stderr], daemon=True).start()
            return proc, port
    raise SystemExit(f"grokc serve exited with {proc.wait()} before it was ready")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server on a loopback address, e.g. http://127.0.0.1:8000")
    where.add_argument("--artifact", help="start `grokc serve ARTIFACT` on a free loopback port for the run")
    ap.add_argument("--device", default="auto", help="with --artifact: auto, cuda or cpu")
    ap.add_argument("--server-arg", action="append", default=[], help="with --artifact: one more grokc serve flag")
    ap.add_argument("--model", default=None, help="the model id (default: the server's only one)")
    ap.add_argument("--concurrency", default="1,4,8", help="comma-separated client counts, one level each")
    ap.add_argument("--requests", type=int, default=32, help="requests per level (at most)")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="per level: no new request after this")
    ap.add_argument("--prompt-words", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    a = ap.parse_args(argv)
    proc = None
    if a.artifact:
        proc, port = start_server(a.artifact, a.device, a.server_arg)
        host = "127.0.0.1"
    else:
        parts = urlsplit(a.url)
        host, port = parts.hostname or "", parts.port or 80
        if not loopback(host):
            raise SystemExit(f"{a.url}: serve_load sends requests only to loopback addresses (127.0.0.0/8, ::1)")
    try:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/v1/models")
        model = a.model or json.loads(conn.getresponse().read())["data"][0]["id"]
        conn.close()
        levels = [run_level(host, port, model, int(c), a.requests, a.max_seconds, a.prompt_words, a.max_tokens,
                            a.timeout) for c in a.concurrency.split(",") if c.strip()]
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    print(json.dumps({"server": f"http://{host}:{port}", "model": model, "max_tokens": a.max_tokens,
                      "prompt_words": a.prompt_words, "levels": levels}, indent=1))


if __name__ == "__main__":
    main()
