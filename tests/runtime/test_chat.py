"""Chat templates render as Hugging Face renders them, and chat prompts carry exactly one bos."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time

import pytest

import edge_sdk
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.chat import RENDER_SECONDS, chat_prompt_ids, render_chat
from edge_sdk.sparsity.settings import CalibrationSettings

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


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "longer than 2 s"),
        ("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "more than 1048576 characters"),
        ("{{ 'x' * 1000000000 }}", "asks for a size of 1000000000"),
        ("{{ [1] * 1000000000 }}", "asks for a size of 1000000000"),
        ("{{ 'x'.ljust(1000000000) }}", "asks for a size of 1000000000"),
        ("{{ 'x'|center(1000000000) }}", "asks for a size of 1000000000"),
        ("{{ 10 ** 100000000 }}", "power 100000000"),
        # widths and precisions in formats: each would build a 50 MB string before the output bound saw it
        ("{{ '%50000000d' % 1 }}", "asks for a size of 50000000,"),
        ("{{ '%((k))50000000s' % {'(k)': 1} }}", "asks for a size of 50000000,"),
        ("{{ '%*d' % (50000000, 1) }}", "asks for a size of 50000000,"),
        ("{{ '%.50000000f' % 1.0 }}", "asks for a size of 50000000,"),
        ("{{ '%50000000d'|format(1) }}", "asks for a size of 50000000,"),
        ("{{ '{:>50000000}'.format(1) }}", "asks for a size of 50000000,"),
        ("{{ '{k:>50000000}'.format_map({'k': 1}) }}", "asks for a size of 50000000,"),
        ("{{ ('%0' ~ '1' * 5000 ~ 'd') % 1 }}", "asks for a size of 111111111111111111111111..."),
        ("{{ range(200000)|list }}", "Range too big"),
        ("{{ 1/0 }}", "ZeroDivisionError: division by zero"),
        ("{{ messages.append(1) }}", "unsafe"),
        ("{{ ''.__class__.__mro__ }}", "unsafe"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursion too deep"),
    ],
)
def test_a_hostile_template_fails_in_one_line_within_its_bounds(tokenizer, template, fragment):
    started = time.monotonic()
    with pytest.raises(EdgeSdkError) as refused:
        render_chat(with_template(tokenizer, template), HI)
    message = str(refused.value)
    assert message.startswith("chat_template in tokenizer_config.json: ") and "\n" not in message
    assert fragment in message, message
    assert time.monotonic() - started < RENDER_SECONDS + 3
    assert sys.gettrace() is None  # the bound's trace function is removed again


def test_formats_within_the_bound_render_as_python_formats_them(tokenizer):
    template = (
        "{{ '%s|%5d|%-3s|%%|%.2f' % ('a', 42, 'b', 3.14159) }}{{ '|%(k)s' % {'k': 'v'} }}"
        "{{ '|%*d|' % (4, 7) }}{{ '%03d'|format(5) }}{{ '|{:>5}|{:0>8.3f}|{k:^5}'.format(1, 2.5, k='c') }}"
    )
    assert render_chat(with_template(tokenizer, template), HI) == "a|   42|b  |%|3.14|v|   7|005|    1|0002.500|  c  "


def test_the_bounds_leave_real_templates_alone(tokenizer):
    chatml = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
        " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    long_chat = [{"role": "user", "content": "x" * 100000}] * 5
    rendered = render_chat(with_template(tokenizer, chatml), long_chat)
    assert rendered.count("<|im_start|>user\n" + "x" * 100000 + "<|im_end|>\n") == 5
    assert rendered.endswith("<|im_start|>assistant\n")


def test_templates_see_what_transformers_passes_them(tokenizer):
    # tools and documents are None, not undefined: `tools is not none` was true, and `tools|tojson` failed
    tools = "{% if tools is not none %}TOOLS {% endif %}{{ tools|tojson }} {{ documents is defined }}|"
    # transformers' {% generation %} block (TRL writes it into the templates it trains with) renders its body
    generation = "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}|"
    # numbers are data, not sizes: a timestamp passed through a filter, printf or a namespace rendered as refused
    numbers = "{{ 1700000000|string }} {{ '%d'|format(1700000000) }} {% set ns = namespace(n=2000000) %}{{ ns.n }}"
    rendered = render_chat(with_template(tokenizer, tools + generation + numbers), HI)
    assert rendered == "null True|<hi>|1700000000 1700000000 2000000"


TEMPLATE_TOKENS = "{{ bos_token }}|{{ unk_token }}|{{ pad_token }}|{{ eos_token }}|{{ messages[0]['content'] }}"


def test_special_tokens_reach_the_template_as_transformers_reads_them(tiny_model_dir, tmp_path):
    """bos_token only in special_tokens_map.json (tokenizer files saved before transformers 4.34, no
    added_tokens_decoder: transformers reads that file, its entries winning) and unk_token / pad_token, which
    transformers passes a template too: rendered alike from the checkpoint, from the bundle's files and by the C
    runtime's tokenizer. The bos was dropped silently and the other two were undefined."""
    transformers = pytest.importorskip("transformers")
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    del config["bos_token"]
    config |= {"chat_template": TEMPLATE_TOKENS, "unk_token": "</s>", "pad_token": "</s>"}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<s>", "lstrip": False}}))
    expected = "<s>|</s>|</s>|</s>|hi"
    reference = transformers.AutoTokenizer.from_pretrained(model)
    assert reference.apply_chat_template(HI, tokenize=False, add_generation_prompt=True) == expected
    assert render_chat(Tokenizer.from_dir(model), HI) == expected
    bundle = export_bundle(
        model, tmp_path / "bundle", ExportSettings(calibration=CalibrationSettings(predictor="none"))
    )
    assert render_chat(Tokenizer.from_bundle(bundle), HI) == expected
    session = edge_sdk.load(bundle.path, backend="cpu")
    assert type(session.tokenizer.backend).__name__ != type(Tokenizer.from_bundle(bundle).backend).__name__
    assert render_chat(session.tokenizer, HI) == expected
    assert (
        chat_prompt_ids(session.tokenizer, HI)
        == reference.apply_chat_template(HI, add_generation_prompt=True)["input_ids"]
    )
    # with added_tokens_decoder (transformers >= 4.34 writes it) the map is not read, as in transformers
    (model / "tokenizer_config.json").write_text(json.dumps(config | {"added_tokens_decoder": {}}))
    assert render_chat(Tokenizer.from_dir(model), HI) == "|</s>|</s>|</s>|hi"


def test_run_chat_with_a_hanging_template_exits_2_in_one_line(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    bundle = tmp_path / "bundle"
    export_bundle(model, bundle, ExportSettings(max_seq_len=64, calibration=CalibrationSettings(predictor="none")))
    command = [
        sys.executable,
        "-m",
        "edge_sdk",
        "run",
        str(bundle),
        "--chat",
        "--prompt",
        "hi",
        "--max-new-tokens",
        "2",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("edge-sdk: error:")]
    assert errors == ["edge-sdk: error: chat_template in tokenizer_config.json: took longer than 2 s to render"]
    assert "Traceback" not in result.stderr


def test_jinja_is_loaded_only_for_a_chat_prompt(bundle_matrix):
    """A plain generation, as `edge-sdk run` without --chat, leaves jinja2 unloaded (2 MB resident, 40 ms to start)."""
    script = (
        "import json, sys, edge_sdk\n"
        f"session = edge_sdk.load({str(bundle_matrix.path('svd-fp32'))!r}, backend='cpu')\n"
        "plain = ''.join(session.generate('def main():', max_new_tokens=4))\n"
        "loaded_for_plain = 'jinja2' in sys.modules\n"
        "chat = ''.join(session.generate('hi', chat=True, max_new_tokens=4))\n"
        "print(json.dumps([loaded_for_plain, 'jinja2' in sys.modules, len(plain) > 0, len(chat) > 0]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [False, True, True, True]
