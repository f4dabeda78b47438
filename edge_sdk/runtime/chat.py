"""Chat prompts: a checkpoint's chat_template rendered as Hugging Face's apply_chat_template renders it.

Templates usually write the bos token themselves, so the rendered text is encoded without adding another bos:
use chat_prompt_ids, or tokenizer.encode(render_chat(...), add_bos=False).

A chat template comes with the model, so it is untrusted code. It renders in jinja's immutable sandbox (no
attribute access to Python internals, no mutation of the messages) with two more bounds: RENDER_SECONDS of
time (a trace function checks the clock on every line the compiled template runs, so loops without output stop
too) and MAX_RENDERED_CHARS of text, checked before an operation could build a larger string or list (`*`, a
method or filter given a size beyond the bound, a width or precision beyond it in a `%` format, the format
filter or str.format / format_map) and on the output as it streams. Any failure, jinja's or Python's
(`{{ 1/0 }}`), is one EdgeSdkError naming the template.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.filters import do_format
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from markupsafe import Markup

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import Tokenizer

NO_TEMPLATE_MESSAGE = "this bundle's tokenizer_config.json has no chat_template; run without --chat"
TEMPLATE_SOURCE = "chat_template in tokenizer_config.json"
RENDER_SECONDS = 2.0  # real templates render in about a millisecond
MAX_RENDERED_CHARS = 1 << 20  # far more prompt text than any context window holds
MAX_EXPONENT = 1024  # `**` with larger exponents builds huge integers in one step


class TemplateBoundExceeded(Exception):
    """A template ran longer or built more text than the bounds allow."""


def _raise_exception(message: str) -> None:
    """Templates call raise_exception('...') to reject a conversation (e.g. roles not alternating)."""
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    """Hugging Face's tojson: unlike jinja's, it does not HTML-escape, so tool schemas render as written."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(date_format: str) -> str:
    """Llama 3.x templates write today's date with strftime_now."""
    return datetime.now().strftime(date_format)


def _check_size(value: Any) -> None:
    """Refuse an integer argument that asks for more than MAX_RENDERED_CHARS (a width, a count, a repeat)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_RENDERED_CHARS:
        raise TemplateBoundExceeded(f"asks for a size of {value}, more than the {MAX_RENDERED_CHARS} allowed")


def _check_digits(digits: str) -> None:
    """_check_size of a width or precision as written, without converting a huge run of digits to int."""
    significant = digits.lstrip("0")
    if len(significant) > len(str(MAX_RENDERED_CHARS)):
        shown = significant if len(significant) <= 24 else significant[:24] + "..."
        raise TemplateBoundExceeded(f"asks for a size of {shown}, more than the {MAX_RENDERED_CHARS} allowed")
    if significant:
        _check_size(int(significant))


def _check_printf_sizes(text: str, values: Any) -> None:
    """_check_size of every width and precision `text % values` asks for, written in text or taken by `*` from
    values. Scans the conversions as Python's printf-style formatting reads them (a mapping key may nest
    parentheses), so none is skipped."""
    positional = values if isinstance(values, tuple) else (values,)
    next_value = 0
    position = text.find("%")
    while position != -1:
        position += 1
        if text.startswith("(", position):
            depth = 0
            while position < len(text):
                depth += {"(": 1, ")": -1}.get(text[position], 0)
                position += 1
                if depth == 0:
                    break
        while position < len(text) and text[position] in "-+ #0":
            position += 1
        for part in ("width", "precision"):
            if part == "precision":
                if not text.startswith(".", position):
                    break
                position += 1
            if text.startswith("*", position):
                if next_value < len(positional):
                    _check_size(positional[next_value])
                next_value += 1
                position += 1
            else:
                start = position
                while position < len(text) and text[position] in "0123456789":
                    position += 1
                _check_digits(text[start:position])
        if text.startswith(("h", "l", "L"), position):
            position += 1
        if not text.startswith("%", position):
            next_value += 1
        position = text.find("%", position + 1)


def _bounded_printf(value: Any, *args: Any, **kwargs: Any) -> str:
    """jinja's format filter (`value % args`), its widths and precisions bounded like the `%` operator's."""
    _check_printf_sizes(str(value), kwargs or args)
    return do_format(value, *args, **kwargs)


class _SizeBoundedFields:
    """A str.format formatter that checks each field's final format spec (nested `{}` fields already filled in)
    for a width or precision beyond MAX_RENDERED_CHARS before formatting the field."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        for digits in re.findall(r"[0-9]+", format_spec):
            _check_digits(digits)
        return super().format_field(value, format_spec)


class _BoundedFormatter(_SizeBoundedFields, SandboxedFormatter):
    pass


class _BoundedEscapeFormatter(_SizeBoundedFields, SandboxedEscapeFormatter):
    pass


def _bounded_filter(function):
    # the value a filter is applied to (after the context or environment jinja passes to some) is data, not a size:
    # `{{ 1700000000 | string }}` renders as in transformers; the filter's own arguments (widths, lengths) are sizes
    skipped = 2 if hasattr(function, "jinja_pass_arg") else 1

    def bounded(*args, **kwargs):
        for value in (*args[skipped:], *kwargs.values()):
            _check_size(value)
        return function(*args, **kwargs)

    bounded.__dict__.update(getattr(function, "__dict__", {}))  # keeps jinja's pass_context / pass_environment marks
    return bounded


_STORING_CALLS = (jinja2.utils.Namespace, dict)  # the namespace and dict globals


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, refusing operations whose result would exceed MAX_RENDERED_CHARS."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def call_binop(self, context, operator, left, right):
        if operator == "**":
            if isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT:
                raise TemplateBoundExceeded(f"raises to the power {right}, beyond the {MAX_EXPONENT} allowed")
        elif operator == "%":
            if isinstance(left, str):
                _check_printf_sizes(left, right)
        else:
            for sequence, count in ((left, right), (right, left)):
                if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
                    _check_size(len(sequence) * count)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value):
        """str.format and str.format_map as jinja's sandbox wraps them, through a formatter that bounds each
        field's width and precision (jinja >= 3.1.5 wraps them here, on attribute access)."""
        if super().wrap_str_format(value) is None:
            return None
        text = value.__self__
        formatter = (
            _BoundedEscapeFormatter(self, escape=text.escape) if isinstance(text, Markup) else _BoundedFormatter(self)
        )

        def bounded_format(*args, **kwargs):
            if value.__name__ == "format_map":
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument, a mapping")
                args, kwargs = (), args[0]
            return type(text)(formatter.vformat(text, args, kwargs))

        return bounded_format

    def call(__self, __context, __obj, *args, **kwargs):
        # namespace(n=2000000) and dict(...) store their values; they build nothing of that size
        if not any(__obj is storing for storing in _STORING_CALLS):
            for value in (*args, *kwargs.values()):
                _check_size(value)
        return super().call(__context, __obj, *args, **kwargs)


class _GenerationBlock(Extension):
    """transformers' {% generation %}...{% endgeneration %} block (it marks the assistant's tokens for training
    masks, and TRL writes it into the templates of the models it trains): the body renders as it is."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationBlock])
    environment.filters = {name: _bounded_filter(function) for name, function in environment.filters.items()}
    environment.filters["tojson"] = _bounded_filter(_tojson)
    environment.filters["format"] = _bounded_printf  # checks the widths and precisions it is asked for itself
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


def _check_messages(messages: list[dict[str, str]]) -> None:
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise EdgeSdkError(f"messages[{index}]: expected a dict with 'role' and 'content', found {message!r}")


def render_chat(tokenizer: Tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The conversation as prompt text, rendered with the tokenizer's chat_template.

    The template sees messages, add_generation_prompt, tools and documents (None, as transformers passes them
    without tools), bos_token and eos_token (strings from the vocabulary; left undefined when the tokenizer has
    none), unk_token, pad_token, sep_token, cls_token and mask_token where tokenizer_config.json names them (as in
    transformers' special_tokens_map), plus raise_exception, strftime_now and Hugging Face's tojson.
    The text may already start with the bos token: encode it with add_bos=False (see chat_prompt_ids).
    """
    if not tokenizer.chat_template:
        raise EdgeSdkError(NO_TEMPLATE_MESSAGE)
    _check_messages(messages)
    special_tokens = dict(tokenizer.template_tokens)
    if tokenizer.bos_token_id is not None:
        special_tokens["bos_token"] = tokenizer.special_token_text(tokenizer.bos_token_id)
    if tokenizer.eos_token_ids:
        special_tokens["eos_token"] = tokenizer.special_token_text(tokenizer.eos_token_ids[0])
    try:
        template = _environment().from_string(tokenizer.chat_template)
        # transformers always passes tools and documents (None without them): `tools is not none` is false and
        # `tools is defined` true there, so templates must see the same
        return _render_bounded(
            template,
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **special_tokens,
        )
    except (jinja2.TemplateError, TemplateBoundExceeded) as error:
        raise EdgeSdkError(f"{TEMPLATE_SOURCE}: {error}") from None
    except RecursionError:
        raise EdgeSdkError(f"{TEMPLATE_SOURCE}: recursion too deep") from None
    except Exception as error:  # the template is untrusted code: whatever it raises is its failure
        raise EdgeSdkError(f"{TEMPLATE_SOURCE}: {type(error).__name__}: {error}") from None


def _render_bounded(template: jinja2.Template, **variables: Any) -> str:
    """template.render(**variables) within RENDER_SECONDS and MAX_RENDERED_CHARS."""
    deadline = time.monotonic() + RENDER_SECONDS

    def trace(frame, event, arg):
        if time.monotonic() > deadline:
            raise TemplateBoundExceeded(f"took longer than {RENDER_SECONDS:g} s to render")
        return trace

    pieces, length = [], 0
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        for piece in template.generate(**variables):
            length += len(piece)
            if length > MAX_RENDERED_CHARS:
                raise TemplateBoundExceeded(f"rendered more than {MAX_RENDERED_CHARS} characters")
            pieces.append(piece)
    finally:
        sys.settrace(previous)
    return "".join(pieces)


def chat_prompt_ids(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Prompt ids for the assistant's next turn: the rendered template encoded without adding a second bos."""
    return tokenizer.encode(render_chat(tokenizer, messages, add_generation_prompt=True), add_bos=False)
