"""``grokc serve``: uvicorn around the app, readiness, and the SIGTERM drain a rolling update needs.

The socket is bound before anything loads (a taken port is one line, not a traceback; port 0 picks
a free one, printed). The scheduler thread then loads the artifact and warms it up while ``/health``
answers 503 ``loading``. The first SIGTERM (or SIGINT) starts the drain: new requests get 503
``draining`` and ``/health`` 503, requests in flight run to their end or until ``drain_timeout_s``
(then they fail with 503 ``shutting_down``), and the process exits 0. A second signal ends it at once.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from grokc.core.errors import GrokcError
from grokc.runner import Runner
from grokc.serve.app import build_app
from grokc.serve.limits import Limits
from grokc.serve.metrics import Metrics
from grokc.serve.scheduler import Scheduler


@dataclass(frozen=True)
class ServeOptions:
    artifact: Path
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"
    model_name: str | None = None      # default: the artifact folder's name
    limits: Limits = Limits()
    profile: Path | None = None        # write a Chrome trace of the first profile_steps replays per graph
    profile_steps: int = 20


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise GrokcError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --host/--port") from None
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn whose first exit signal drains the scheduler before the server stops."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler, drain_timeout_s: float):
        super().__init__(config)
        self.scheduler, self.drain_timeout_s = scheduler, drain_timeout_s
        self.draining = False

    def handle_exit(self, sig: int, frame: object) -> None:
        if not self.draining:
            self.draining = True
            self.scheduler.drain(self.drain_timeout_s)   # past the timeout it fails what still runs
        else:                       # a second signal: stop now
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        s = self.scheduler
        if s.load_error is not None or (self.draining and s.idle()):
            s.stop(wait=False)      # uvicorn sends what the handlers still hold (503 shutting_down), then exits
            self.should_exit = True
        return await super().on_tick(counter)


def serve(opts: ServeOptions, progress: Callable[[str], None]) -> None:
    """Serve until drained; raises the loading error (bad artifact, bad limits) as a ``GrokcError``."""
    model = opts.model_name or Path(opts.artifact).resolve().name
    sock = bind(opts.host, opts.port)
    host, port = sock.getsockname()[:2]
    metrics = Metrics()
    scheduler = Scheduler(lambda: Runner(opts.artifact, device=opts.device), opts.limits, metrics, model,
                          opts.profile, opts.profile_steps, progress)
    config = uvicorn.Config(build_app(scheduler, metrics, model), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=5)
    server = DrainingServer(config, scheduler, opts.limits.drain_timeout_s)
    progress(f"listening on http://{host if ':' not in host else f'[{host}]'}:{port} ({model}); loading")
    scheduler.start()
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.stop()
        sock.close()
    if scheduler.load_error is not None:
        raise scheduler.load_error
    progress("drained; exiting")
