"""The artifact's chat template (a Jinja template, as Hugging Face tokenizers carry it) rendered in
a sandbox: ``ChatTemplate(text, bos, eos).render(messages)`` -> the prompt text, generation prompt
included. Templates see what ``transformers``' ``apply_chat_template`` gives them: ``messages``,
``bos_token``, ``eos_token``, ``add_generation_prompt``, ``raise_exception`` and ``strftime_now``.
"""

from __future__ import annotations

import datetime
import json

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from grokc.core.errors import GrokcError
from grokc.serve.api import bad


class TemplateRefusal(Exception):
    """The template itself refused the conversation (``raise_exception``)."""


def _raise(message: str) -> None:
    raise TemplateRefusal(message)


class ChatTemplate:
    def __init__(self, text: str, bos_token: str, eos_token: str):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals.update(raise_exception=_raise,
                           strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
        try:
            self.template = env.from_string(text)
        except jinja2.TemplateError as exc:
            raise GrokcError(f"the artifact's chat template does not compile ({exc}); serve it without "
                             "/v1/chat/completions or rebuild from a model with a valid template") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return self.template.render(messages=messages, bos_token=self.bos_token, eos_token=self.eos_token,
                                        add_generation_prompt=True)
        except TemplateRefusal as exc:
            raise bad("invalid_conversation", f"the chat template refuses this conversation: {exc}",
                      "messages") from None
        except (jinja2.TemplateError, TypeError, ValueError) as exc:
            raise bad("chat_template_error", f"the chat template failed on these messages: {exc}",
                      "messages") from None
