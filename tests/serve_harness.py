"""``grokc serve`` in a subprocess on a free loopback port, for the server tests (CPU and GPU).

``launch(artifact, *flags, log=PATH, device="cpu", prefix=None)`` starts one and waits for
``/health`` 200; ``Server`` sends raw HTTP (``http.client``), reads ``/metrics`` and stops it with
SIGTERM. ``prefix``: Python run before the CLI in the server's interpreter.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

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


def launch(artifact: Path, *flags: str, log: Path, device: str = "cpu", prefix: str | None = None) -> Server:
    cli = "import sys; from grokc.cli.app import main; sys.argv = ['grokc'] + sys.argv[1:]; main()"
    code = cli if prefix is None else prefix + "\n" + cli
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(artifact), "--port", "0", "--device", device,
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


class Stream:
    """A streaming request on a raw socket (``seen``: what has arrived so far)."""

    def __init__(self, sock: socket.socket, seen: bytes):
        self.sock, self.seen = sock, seen

    def close(self) -> None:
        self.sock.close()


def stream_first_chunk(server, body: dict) -> Stream:
    """Send a streaming request on a raw socket and return it once the first event has arrived."""
    raw = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
    seen = b""
    while b"data:" not in seen:
        seen += sock.recv(65536)
    return Stream(sock, seen)


def read_all(stream: Stream) -> bytes:
    """Everything the stream sends, from its first byte, up to [DONE] or an error event."""
    out = stream.seen
    while b"data: [DONE]" not in out and b'"error"' not in out and (chunk := stream.sock.recv(65536)):
        out += chunk
    stream.close()
    return out
