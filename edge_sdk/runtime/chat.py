"""Chat prompts: a checkpoint's chat_template rendered as Hugging Face's apply_chat_template renders it.

Templates usually write the bos token themselves, so the rendered text is encoded without adding another bos:
use chat_prompt_ids, or tokenizer.encode(render_chat(...), add_bos=False).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import Tokenizer

NO_TEMPLATE_MESSAGE = "this bundle's tokenizer_config.json has no chat_template; run without --chat"


def _raise_exception(message: str) -> None:
    """Templates call raise_exception('...') to reject a conversation (e.g. roles not alternating)."""
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    """Hugging Face's tojson: unlike jinja's, it does not HTML-escape, so tool schemas render as written."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(date_format: str) -> str:
    """Llama 3.x templates write today's date with strftime_now."""
    return datetime.now().strftime(date_format)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


def _check_messages(messages: list[dict[str, str]]) -> None:
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise EdgeSdkError(f"messages[{index}]: expected a dict with 'role' and 'content', found {message!r}")


def render_chat(tokenizer: Tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The conversation as prompt text, rendered with the tokenizer's chat_template.

    The template sees messages, add_generation_prompt, bos_token and eos_token (strings from the vocabulary;
    left undefined when the tokenizer has none), plus raise_exception, strftime_now and Hugging Face's tojson.
    The text may already start with the bos token: encode it with add_bos=False (see chat_prompt_ids).
    """
    if not tokenizer.chat_template:
        raise EdgeSdkError(NO_TEMPLATE_MESSAGE)
    _check_messages(messages)
    special_tokens = {}
    if tokenizer.bos_token_id is not None:
        special_tokens["bos_token"] = tokenizer.backend.id_to_token(tokenizer.bos_token_id)
    if tokenizer.eos_token_ids:
        special_tokens["eos_token"] = tokenizer.backend.id_to_token(tokenizer.eos_token_ids[0])
    try:
        template = _environment().from_string(tokenizer.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **special_tokens)
    except jinja2.TemplateError as error:
        raise EdgeSdkError(f"chat_template in tokenizer_config.json: {error}") from None


def chat_prompt_ids(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Prompt ids for the assistant's next turn: the rendered template encoded without adding a second bos."""
    return tokenizer.encode(render_chat(tokenizer, messages, add_generation_prompt=True), add_bos=False)
