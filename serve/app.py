"""The HTTP routes, on Starlette: OpenAI's ``/v1/completions``, ``/v1/chat/completions`` and
``/v1/models``, plus ``/health`` (200 only once ready: graphs built, warm-up done, not draining)
and ``/metrics`` (Prometheus text).

Every error is a JSON body with a machine-readable ``code`` (``serve/api.py``), also for unknown
routes (404), wrong methods (405) and bugs (500). A request body is read up to the limit and
parsed only then; a larger one is read to the end (to a hard cap) and refused with 413, so the
client sees the answer instead of a reset connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from grokc.serve.api import ApiError, parse_chat, parse_completion
from grokc.serve.metrics import Metrics
from grokc.serve.responses import Shape, sse
from grokc.serve.scheduler import Delta, Done, Failed, Scheduler, Ticket

log = logging.getLogger("grokc.serve")
DISCARD_CAP = 64 << 20   # a body past the limit is still read (and dropped) up to this many bytes


def error_response(err: ApiError, metrics: Metrics) -> JSONResponse:
    metrics.refused(err.code)
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def read_json(request: Request, limit: int) -> object:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > DISCARD_CAP:
        raise ApiError(413, "body_too_large", f"the request body has more than {limit} bytes (Content-Length: "
                       f"{declared[:20]}), the most this server takes")
    body, size = bytearray(), 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            body += chunk
        elif size > DISCARD_CAP:
            break
    if size > limit:
        raise ApiError(413, "body_too_large", f"the request body has more than {limit} bytes, the most this "
                       "server takes")
    try:
        return json.loads(bytes(body))
    except (ValueError, RecursionError) as exc:   # UnicodeDecodeError is a ValueError
        raise ApiError(400, "invalid_json", f"the request body is not valid JSON in UTF-8 ({str(exc)[:200]})") from None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def next_event(request: Request, ticket: Ticket) -> Delta | Done | Failed | None:
    """The ticket's next event, or None when the client disconnects first (the ticket is then cancelled)."""
    get = asyncio.ensure_future(ticket.events.get())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if get.done():
        return get.result()
    get.cancel()
    ticket.cancel()
    return None


def build_app(scheduler: Scheduler, metrics: Metrics, model: str) -> Starlette:
    async def generate(request: Request, parse) -> Response:
        if scheduler.state != "ready":
            raise scheduler.unavailable()
        job = parse(await read_json(request, scheduler.limits.max_body_bytes), scheduler.context)
        ticket = scheduler.submit(job, asyncio.get_running_loop())
        first = await next_event(request, ticket)
        if first is None:
            return Response(status_code=499)   # nobody is left to read it
        if isinstance(first, Failed):
            raise first.error
        shape = Shape(job, model)
        if not job.stream:
            metrics.responded(200)
            return JSONResponse(shape.whole(first.text, first.finish_reason, first.prompt_tokens,
                                            first.completion_tokens))
        return StreamingResponse(stream(ticket, shape, first), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def stream(ticket: Ticket, shape: Shape, event: Delta | Done | Failed):
        try:
            for chunk in shape.opening():
                yield sse(chunk)
            while True:
                if isinstance(event, Delta):
                    yield sse(shape.chunk(event.text))
                elif isinstance(event, Done):
                    for chunk in shape.closing(event.finish_reason, event.prompt_tokens, event.completion_tokens):
                        yield chunk
                    metrics.responded(200)
                    return
                else:   # failed mid-stream: the status is sent already, the error goes in the stream
                    metrics.refused(event.error.code)
                    yield sse(event.error.body())
                    return
                event = await ticket.events.get()
        finally:
            ticket.cancel()   # the client left mid-stream: free the slot (a no-op once finished)

    async def completions(request: Request) -> Response:
        return await generate(request, parse_completion)

    async def chat(request: Request) -> Response:
        return await generate(request, parse_chat)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                                         "owned_by": "grokc"}]})

    async def health(request: Request) -> Response:
        if scheduler.state == "ready":
            return JSONResponse({"status": "ok"})
        err = scheduler.unavailable()
        return JSONResponse({"status": scheduler.state, **err.body()}, status_code=503, headers=err.headers)

    async def metrics_page(request: Request) -> Response:
        return PlainTextResponse(metrics.render(scheduler.gauges), media_type="text/plain; version=0.0.4")

    async def api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc, metrics)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(ApiError(exc.status_code, code, f"{request.method} {request.url.path}: {exc.detail}"),
                              metrics)

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("bug while serving %s:\n%s", request.url.path, traceback.format_exc())
        return error_response(ApiError(500, "internal_error", "the server failed on this request"), metrics)

    return Starlette(
        routes=[Route("/v1/completions", completions, methods=["POST"]),
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/health", health, methods=["GET"]),
                Route("/metrics", metrics_page, methods=["GET"])],
        exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: internal_error},
    )
