"""The tokenizer of a session on libedge_sdk (backends cpu and tensorrt): the C runtime's own (jetson/src/tokenizer.c,
`RuntimeEngine.tokenizer`), so the process holds no second vocabulary and never parses tokenizer.json in Python (the
tokenizers library and the strict JSON check took some 30 MB of SmolLM2's `edge-sdk run`, benchmarks/README.md section
5). It must be the tokenizers library's Tokenizer in everything the runtime asks of it, and a tokenizer file the C
runtime does not implement falls back to that library."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from edge_sdk.backends.c_runtime import RuntimeEngine, RuntimeTokenizer

import edge_sdk
from edge_sdk.bundle import Bundle
from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import HFBackend, Tokenizer
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.runtime.chat import chat_prompt_ids

from .test_head_dtype import restamped_copy

TEXTS = [
    "def main():\n    return 42\n",
    "naïve café — 東京 🙂 ½ ² \u0660\u0661 'll 's  \t\n",
    "<s> and </s> inside the text, and 12345 digits",
]


@pytest.fixture(scope="module")
def engine(bundle_matrix):
    bundle = bundle_matrix["svd-fp32"]
    engine = RuntimeEngine(bundle, EngineOptions.of(bundle, None))
    yield engine
    engine.close()


def test_the_c_tokenizer_is_the_tokenizers_librarys(engine, bundle_matrix, tiny_model_dir):
    bundle = bundle_matrix["svd-fp32"]
    native, library = engine.tokenizer(bundle), Tokenizer.from_bundle(bundle)
    assert isinstance(native.backend, RuntimeTokenizer) and isinstance(library.backend, HFBackend)
    fields = ("bos_token_id", "eos_token_ids", "add_bos", "chat_template", "vocab_size")
    assert {field: getattr(native, field) for field in fields} == {field: getattr(library, field) for field in fields}
    texts = [*TEXTS, (tiny_model_dir / "held_out.txt").read_text(encoding="utf-8")[:6000]]
    for text in texts:
        for add_bos in (None, True, False):
            assert native.encode(text, add_bos=add_bos) == library.encode(text, add_bos=add_bos)
        ids = [*library.encode(text, add_bos=True), library.eos_token_ids[0]]
        for skip in (True, False):
            assert native.decode(ids, skip_special_tokens=skip) == library.decode(ids, skip_special_tokens=skip)
    for token in (native.bos_token_id, *native.eos_token_ids):
        assert native.special_token_text(token) == library.special_token_text(token)
    conversation = [{"role": "user", "content": "hi"}]
    assert chat_prompt_ids(native, conversation) == chat_prompt_ids(library, conversation)
    broken = "ab\udcffc"  # a lone surrogate, as from bytes that are not UTF-8
    with pytest.raises(EdgeSdkError) as from_native:
        native.encode(broken)
    with pytest.raises(EdgeSdkError) as from_library:
        library.encode(broken)
    assert (
        str(from_native.value)
        == str(from_library.value)
        == ("text: not valid Unicode at character 2 (bytes that are not UTF-8?); give UTF-8 text")
    )


def test_a_cpu_session_tokenizes_in_the_c_runtime_and_loads_no_tokenizers_library(bundle_matrix):
    """In a fresh process, as `edge-sdk run` is: the text is the same as the tokenizers library's session's."""
    path = bundle_matrix.path("svd-fp32")
    script = (
        "import json, sys, edge_sdk\n"
        f"session = edge_sdk.load({str(path)!r}, backend='cpu')\n"
        "text = ''.join(session.generate('def main():', max_new_tokens=12))\n"
        "print(json.dumps([text, type(session.tokenizer.backend).__name__, 'tokenizers' in sys.modules]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    session = edge_sdk.load(path, backend="cpu")
    session.tokenizer = Tokenizer.from_bundle(session.bundle)
    session.generator.tokenizer = session.tokenizer
    expected = "".join(session.generate("def main():", max_new_tokens=12))
    assert json.loads(result.stdout) == [expected, "RuntimeTokenizer", False]
    assert expected


def test_a_tokenizer_the_c_runtime_does_not_implement_is_the_tokenizers_librarys(bundle_matrix, tmp_path):
    source = bundle_matrix.path("svd-fp32")
    tokenizer_json = json.loads((source / "tokenizer.json").read_text())
    tokenizer_json["normalizer"] = {"type": "NFC"}  # the C tokenizer takes no normalizer
    data = json.dumps(tokenizer_json).encode()

    def with_normalizer(manifest):
        manifest["files"]["tokenizer.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    copy = tmp_path / "bundle"
    restamped_copy(source, copy, with_normalizer)
    (copy / "tokenizer.json").write_bytes(data)
    bundle = Bundle.open(copy)
    engine = RuntimeEngine(bundle, EngineOptions.of(bundle, None))
    try:
        assert engine.tokenizer(bundle) is None
    finally:
        engine.close()
    session = edge_sdk.load(copy, backend="cpu")
    assert isinstance(session.tokenizer.backend, HFBackend)
    assert "".join(session.generate("def main():", max_new_tokens=4))
