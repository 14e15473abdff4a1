"""Servers for the HTTP tests: ``grokc serve`` in a subprocess on a free loopback port, driven over
real HTTP (``openai`` client, ``http.client`` for what a polite client would never send).

- ``start_server(artifact, *flags, prefix=None)``: starts one on the CPU (``tests/serve_harness.py``),
  waits for ``/health`` 200, returns a ``Server``; stopped with SIGTERM at the end of the test module
  that started it.
- ``reference``: ``reference(prompt_ids, max_tokens, temperature, top_p, top_k, seed)`` -> (text,
  completion token count, finish reason) of the request run alone in an in-process ``Runner`` of
  the tiny serving artifact (EOS ends it: "stop", and is not in the text).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_harness import Server, launch

from grokc.runner import Runner, SamplingParams


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
