"""OpenAI's response bodies: a completion or chat completion whole, or as server-sent-event chunks."""

from __future__ import annotations

import json
import time

from grokc.serve.api import Job


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)}\n\n"


class Shape:
    """The bodies of one job (ids and timestamps shared by all its chunks)."""

    def __init__(self, job: Job, model: str):
        self.job, self.model, self.created = job, model, int(time.time())
        self.chat = job.kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + job.id

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False) -> dict:
        if self.chat:
            delta = {**({"role": "assistant"} if role else {}), **({"content": text} if text is not None else {})}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        return {**body, "usage": None} if self.job.include_usage else body

    def opening(self) -> list[dict]:
        """The chunks before any text: a chat stream names the role first."""
        return [self.chunk("", role=True)] if self.chat else []

    def closing(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> list[str]:
        out = [sse(self.chunk(None if self.chat else "", finish_reason))]
        if self.job.include_usage:
            out.append(sse({**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                            "usage": usage(prompt_tokens, completion_tokens)}))
        return out + [sse("[DONE]")]
