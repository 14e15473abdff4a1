"""Servers for the HTTP tests: ``grokc serve`` in a subprocess on a free loopback port, driven over
real HTTP (``openai`` client, ``http.client`` for what a polite client would never send).

- ``start_server(artifact, *flags, prefix=None)``: starts one, waits for ``/health`` 200, returns a
  ``Server`` (``url``, ``port``, ``proc``, ``stderr()``); stopped with SIGTERM at the end of the test
  module that started it. ``prefix``: Python run before the CLI in the server's interpreter.
- ``reference``: ``reference(prompt_ids, max_tokens, temperature, top_p, top_k, seed)`` -> (text,
  completion token count, finish reason) of the request run alone in an in-process ``Runner`` of
  the tiny serving artifact (EOS ends it: "stop", and is not in the text).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from grokc.runner import Runner, SamplingParams

READY_TIMEOUT_S = 120


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.log.read_text()

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict | None = None, timeout: float = 60) -> tuple[int, dict, bytes]:
        """One raw HTTP request; (status, headers, body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if isinstance(body, dict) else body
            conn.request(method, path, body=data, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def post(self, path: str, body, **kw) -> tuple[int, dict]:
        status, _, raw = self.request("POST", path, body, **kw)
        return status, json.loads(raw)

    def metric(self, name: str) -> float:
        _, _, raw = self.request("GET", "/metrics")
        m = re.search(rf"^{re.escape(name)} (\S+)$", raw.decode(), re.M)
        assert m, f"{name} not in /metrics"
        return float(m.group(1))

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def launch(artifact: Path, *flags: str, log: Path, prefix: str | None = None) -> Server:
    cli = "import sys; from grokc.cli.app import main; sys.argv = ['grokc'] + sys.argv[1:]; main()"
    code = cli if prefix is None else prefix + "\n" + cli
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(artifact), "--port", "0", "--device", "cpu",
                                 *flags], stdout=subprocess.DEVNULL, stderr=err, env=env)
    deadline = time.monotonic() + READY_TIMEOUT_S
    port = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"grokc serve exited with {proc.returncode}:\n{log.read_text()}")
        if port is None and (m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())):
            port = int(m.group(1))
        if port is not None:
            server = Server(proc, port, log)
            try:
                if server.request("GET", "/health", timeout=5)[0] == 200:
                    return server
            except OSError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"grokc serve was not ready within {READY_TIMEOUT_S} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def start_server(tmp_path_factory):
    started: list[Server] = []

    def start(artifact: Path, *flags: str, prefix: str | None = None) -> Server:
        log = tmp_path_factory.mktemp("serve") / "stderr.log"
        server = launch(artifact, *flags, log=log, prefix=prefix)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.stop()


@pytest.fixture(scope="session")
def tiny_runner(tiny_serving_artifact) -> Runner:
    return Runner(tiny_serving_artifact, device="cpu")


@pytest.fixture(scope="session")
def reference(tiny_runner):
    eos = set(tiny_runner.artifact.manifest.tokenizer.eos_token_ids)

    def run(prompt: list[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
            seed: int = 0) -> tuple[str, int, str]:
        ids = tiny_runner.generate_ids([prompt], SamplingParams(max_tokens, temperature, top_k, top_p, seed))[0]
        hit_eos = bool(ids) and ids[-1] in eos
        return tiny_runner.decode(ids[:-1] if hit_eos else ids), len(ids), "stop" if hit_eos else "length"

    return run
