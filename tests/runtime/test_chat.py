"""Chat templates render as Hugging Face renders them, and chat prompts carry exactly one bos."""

from __future__ import annotations

import dataclasses

import pytest

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.chat import chat_prompt_ids, render_chat

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


def with_template(tokenizer: Tokenizer, template: str | None) -> Tokenizer:
    return dataclasses.replace(tokenizer, chat_template=template)


def test_the_fixture_template_renders_exactly(tokenizer):
    assert render_chat(tokenizer, HI) == "<s># user:\nhi\n# assistant:\n"
    conversation = [*HI, {"role": "assistant", "content": "hello"}]
    assert render_chat(tokenizer, conversation, add_generation_prompt=False) == "<s># user:\nhi\n# assistant:\nhello\n"


def test_chat_prompt_ids_have_exactly_one_bos(tokenizer):
    assert tokenizer.add_bos  # encode would add a second bos if chat_prompt_ids did not prevent it
    ids = chat_prompt_ids(tokenizer, HI)
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<s># user:\nhi\n# assistant:\n"


def test_templates_see_eos_and_hugging_face_whitespace_control(tokenizer):
    template = (
        "{% for m in messages %}\n  {% if loop.last %}{% break %}{% endif %}{{ m['content'] }}{{ eos_token }}\n"
        "{% endfor %}"
    )
    conversation = [*HI, {"role": "user", "content": "dropped"}]
    # trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one; loopcontrols: break
    assert render_chat(with_template(tokenizer, template), conversation) == "hi</s>\n"


def test_a_missing_template_says_to_run_without_chat(tokenizer):
    with pytest.raises(EdgeSdkError, match="no chat_template; run without --chat"):
        render_chat(with_template(tokenizer, None), HI)


def test_template_errors_carry_the_jinja_message(tokenizer):
    rejecting = with_template(tokenizer, "{{ raise_exception('roles must alternate user/assistant') }}")
    with pytest.raises(EdgeSdkError, match="roles must alternate user/assistant"):
        render_chat(rejecting, HI)
    with pytest.raises(EdgeSdkError, match=r"chat_template.*endfor"):
        render_chat(with_template(tokenizer, "{% for m in messages %}"), HI)


def test_messages_without_role_or_content_are_refused(tokenizer):
    with pytest.raises(EdgeSdkError, match=r"messages\[1\]"):
        render_chat(tokenizer, [*HI, {"text": "no role"}])
