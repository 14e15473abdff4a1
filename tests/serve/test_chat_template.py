"""The artifact's chat template rendered by the server (serve/chat.py) as transformers renders it:
SmolLM2's own template (from its GGUF) against ``apply_chat_template``."""

from __future__ import annotations

import pytest

from grokc.serve.api import ApiError
from grokc.serve.chat import ChatTemplate

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour, ünïcödé ok"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_smollm2_template_renders_as_transformers_does(hf_tokenizer, messages):
    ours = ChatTemplate(hf_tokenizer.chat_template, hf_tokenizer.bos_token, hf_tokenizer.eos_token).render(messages)
    assert ours == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_a_template_that_refuses_a_conversation_is_a_400():
    template = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}x",
                            "<s>", "</s>")
    assert template.render([{"role": "user", "content": "a"}]) == "x"
    with pytest.raises(ApiError) as err:
        template.render([{"role": "assistant", "content": "a"}])
    assert (err.value.status, err.value.code) == (400, "invalid_conversation") and "user first" in err.value.message


def test_the_sandbox_keeps_templates_from_python_internals():
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", "", "")
    with pytest.raises(ApiError) as err:
        template.render([{"role": "user", "content": "a"}])
    assert err.value.code == "chat_template_error"
