"""The OpenAI-compatible request bodies: parsed and checked into a ``Job``, or refused.

``parse_completion`` and ``parse_chat`` read a decoded JSON body of ``/v1/completions`` and
``/v1/chat/completions``; every field is checked for type and range and anything grokc does not
do (``n`` > 1, ``logprobs``, ``echo``, tools, penalties) is refused by name rather than ignored.
Refusals are ``ApiError``: an HTTP status, a machine-readable ``code`` and one sentence, sent as
OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grokc.core.errors import RequestError, RequestTypeError
from grokc.runner import SamplingParams
from grokc.serve.limits import Limits

ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error",
               504: "timeout_error"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def bad(code: str, message: str, param: str | None = None) -> ApiError:
    return ApiError(400, code, message, param)


@dataclass(frozen=True)
class Job:
    """One generation as the scheduler runs it."""

    kind: str                   # "completion" or "chat"
    prompt: list[int]
    params: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    id: str = field(default_factory=lambda: secrets.token_hex(12))


@dataclass(frozen=True)
class Context:
    """What parsing needs of the served model."""

    model: str
    limits: Limits
    max_seq: int
    encode: Callable[[str, bool], list[int]]          # (text, add special tokens) -> ids
    render_chat: Callable[[list[dict[str, str]]], str] | None   # messages -> prompt text; None: no template


# -- field readers -------------------------------------------------------------------------------

def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise bad("invalid_type", f"{param} must be a string, not {_kind(value)}", param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("invalid_string", f"{param} holds a lone surrogate; send valid Unicode text", param) from None
    return value


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _optional(body: dict, name: str, kinds: tuple[type, ...], default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        want = " or ".join(_kind(k()) for k in kinds)
        raise bad("invalid_type", f"{name} must be {want}, not {_kind(value)}", name)
    return value


def _token_ids(value: list, param: str) -> list[int]:
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise bad("invalid_type", f"{param} must be a string or an array of token ids (integers)", param)
    return list(value)


def _common(body: Any, ctx: Context) -> None:
    if not isinstance(body, dict):
        raise bad("invalid_request", f"the request body must be a JSON object, not {_kind(body)}")
    model = body.get("model")
    if model is None:
        raise bad("missing_parameter", f"model is required; this server serves '{ctx.model}'", "model")
    if _text(model, "model") != ctx.model:
        raise bad("model_not_found", f"model '{model[:100]}' is not served here; this server serves '{ctx.model}'",
                  "model")
    if _optional(body, "n", (int,), 1) != 1:
        raise bad("unsupported_parameter", "n must be 1: one choice per request", "n")
    for name, off in (("logprobs", (False, None)), ("top_logprobs", (0, None)), ("echo", (False, None)),
                      ("best_of", (1, None)), ("suffix", (None,)), ("logit_bias", (None, {})),
                      ("presence_penalty", (0, None)), ("frequency_penalty", (0, None)),
                      ("tools", (None, [])), ("functions", (None, [])), ("tool_choice", (None, "none"))):
        if body.get(name) not in off:
            raise bad("unsupported_parameter", f"{name} is not supported by this server; leave it out", name)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise bad("unsupported_parameter", "response_format other than {\"type\": \"text\"} is not supported",
                  "response_format")


def _stop(body: dict, limits: Limits) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list):
        raise bad("invalid_type", f"stop must be a string or an array of strings, not {_kind(stop)}", "stop")
    if len(stops) > limits.max_stop:
        raise bad("too_many_stop_strings", f"stop has {len(stops)} strings; at most {limits.max_stop}", "stop")
    for s in stops:
        if not _text(s, "stop") or len(s) > limits.max_stop_chars:
            raise bad("invalid_stop", f"each stop string must have 1 to {limits.max_stop_chars} characters", "stop")
    return tuple(stops)


def _params(body: dict, ctx: Context, n_prompt: int, max_tokens_default: int) -> SamplingParams:
    names = ("max_completion_tokens", "max_tokens") if "max_completion_tokens" in body else ("max_tokens",)
    max_tokens = _optional(body, names[0], (int,), max_tokens_default)
    if max_tokens < 1:
        raise bad("invalid_parameter", f"{names[0]} = {max_tokens} must be at least 1", names[0])
    if max_tokens > ctx.limits.max_new_tokens:
        raise bad("max_tokens_too_large", f"{names[0]} = {max_tokens} exceeds this server's limit of "
                  f"{ctx.limits.max_new_tokens}", names[0])
    if n_prompt + max_tokens > ctx.max_seq:
        raise bad("context_length_exceeded", f"the prompt ({n_prompt} tokens) + {names[0]} ({max_tokens}) exceeds "
                  f"the model's context of {ctx.max_seq} tokens; lower {names[0]} or shorten the prompt", names[0])
    number = (int, float)
    params = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=_optional(body, "temperature", number, 1.0),
        top_k=_optional(body, "top_k", (int,), 0),
        top_p=_optional(body, "top_p", number, 1.0),
        seed=_optional(body, "seed", (int,), None),
    )
    if params.seed is None:   # OpenAI's contract: no seed, a different draw each time
        params = SamplingParams(params.max_new_tokens, params.temperature, params.top_k, params.top_p,
                                secrets.randbelow(2**32))
    return params


def _checked(prompt: list[int], ctx: Context, param: str) -> list[int]:
    if not prompt:
        raise bad("empty_prompt", f"{param} is empty; give at least one token", param)
    if len(prompt) > ctx.limits.max_prompt_tokens:
        raise bad("prompt_too_long", f"the prompt has {len(prompt)} tokens; this server takes at most "
                  f"{ctx.limits.max_prompt_tokens} (the largest compiled bucket)", param)
    return prompt


def _job(kind: str, prompt: list[int], body: dict, ctx: Context, max_tokens_default: int) -> Job:
    stream = _optional(body, "stream", (bool,), False)
    options = _optional(body, "stream_options", (dict,), {})
    if options and not stream:
        raise bad("invalid_parameter", "stream_options needs stream: true", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad("invalid_type", "stream_options.include_usage must be a boolean", "stream_options")
    return Job(kind, prompt, _params(body, ctx, len(prompt), max_tokens_default), _stop(body, ctx.limits),
               stream, include_usage)


def parse_completion(body: Any, ctx: Context) -> Job:
    _common(body, ctx)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]   # a batch of one
    if isinstance(prompt, str):
        ids = ctx.encode(_text(prompt, "prompt"), True)
    elif isinstance(prompt, list):
        ids = _token_ids(prompt, "prompt")
    elif prompt is None:
        raise bad("missing_parameter", "prompt is required", "prompt")
    else:
        raise bad("invalid_type", f"prompt must be a string or an array of token ids, not {_kind(prompt)}", "prompt")
    return _job("completion", _checked(ids, ctx, "prompt"), body, ctx, 16)


def parse_chat(body: Any, ctx: Context) -> Job:
    _common(body, ctx)
    if ctx.render_chat is None:
        raise bad("no_chat_template", f"model '{ctx.model}' has no chat template; use /v1/completions")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("invalid_type", "messages must be a non-empty array of {role, content} objects", "messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content", "name"}:
            raise bad("invalid_message", f"messages[{i}] must be an object with role and content", "messages")
        content = m.get("content")
        if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise bad("unsupported_content", f"messages[{i}].content may hold only text parts", "messages")
            content = "".join(_text(p.get("text"), f"messages[{i}].content") for p in content)
        role = _text(m.get("role"), f"messages[{i}].role")
        if role not in ("system", "user", "assistant", "developer"):
            raise bad("invalid_message", f"messages[{i}].role '{role[:40]}' must be system, user or assistant",
                      "messages")
        turns.append({"role": role, "content": _text(content, f"messages[{i}].content")})
    ids = _checked(ctx.encode(ctx.render_chat(turns), False), ctx, "messages")
    return _job("chat", ids, body, ctx, min(ctx.limits.max_new_tokens, max(1, ctx.max_seq - len(ids))))


def engine_refusal(err: RequestError) -> ApiError:
    """The engine's own check of a request (it repeats ours and adds the vocabulary's bounds)."""
    code = "out_of_kv_slots" if str(err).startswith("out_of_kv_slots") else (
        "invalid_type" if isinstance(err, RequestTypeError) else "invalid_parameter")
    return bad(code, str(err))
