"""The C runtime libedge_sdk (jetson/) through ctypes: the engine of the "cpu" and the "tensorrt" backend.

Both backends run a bundle as one edge_model and one edge_session of libedge_sdk and differ only in the engine the
library puts behind them (edge_options_set_backend): the whole decoder in C on the CPU kernels (cpu_engine.c), or the
TensorRT engine that `edge-sdk build` cached (trt_engine.cpp). Everything below the session -- the TensorRT engine's
cache key and lookup, its plugin loading, device buffers and KV cache, the sparsity level's index -- exists once, in
the library; Python asks it (probe_backend, tensorrt_engine_info) instead of knowing it.

The session tokenizes through the library's tokenizer too (`RuntimeEngine.tokenizer`) where it implements the
bundle's: no second vocabulary, and no parse of tokenizer.json, in the Python process.

On a small model most of a decode token's time is spent between the matrix products -- in Python and torch
dispatch when the step is driven from Python -- so one C call per token (embedding, attention, norms, predictor,
sparse FFN, LM head) is what the CPU backend uses whenever the package build made the library.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk.bundle import Bundle
from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import (
    MAX_TOKENIZER_JSON_BYTES,
    TOKENIZER_CONFIG_FILE,
    Tokenizer,
    chat_template_of,
    merged_eos_ids,
    not_unicode_error,
    parse_config,
    template_tokens_of,
)
from edge_sdk.native import NativeLibraryError, load_runtime
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions

# enum edge_status (edge_sdk.h)
EDGE_OK = 0
EDGE_ERROR_UNSUPPORTED = 4
EDGE_ERROR_UNAVAILABLE = 5

_handle = ctypes.c_void_p
_status = ctypes.c_int

# enum edge_log_level (edge_sdk.h)
EDGE_LOG_ERROR = 0
LOG = logging.getLogger("edge_sdk.runtime")


_LogCallback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p)


@_LogCallback
def _log_from_library(level: int, source: bytes, message: bytes, user_data: int) -> None:
    """edge_set_log_callback's receiver (TensorRT's warnings and errors): into Python's logging, whose last-resort
    handler writes them to stderr when the application configured none (as `edge-sdk run` does not)."""
    error = level == EDGE_LOG_ERROR
    LOG.log(
        logging.ERROR if error else logging.WARNING,
        "%s %s: %s",
        source.decode(errors="replace"),
        "error" if error else "warning",
        message.decode(errors="replace"),
    )


class RuntimeUnsupported(EdgeSdkError):
    """The bundle uses something the C runtime does not run (e.g. bf16 weights); the torch path does."""


def _library() -> ctypes.CDLL:
    library = load_runtime()
    if getattr(library, "_edge_sdk_prototypes", False):
        return library
    signatures = {
        "edge_last_error": (ctypes.c_char_p, []),
        "edge_free": (None, [ctypes.c_void_p]),
        "edge_backend_probe": (_status, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]),
        "edge_tensorrt_engine_info": (_status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]),
        "edge_options_create": (_status, [ctypes.POINTER(_handle)]),
        "edge_options_destroy": (None, [_handle]),
        "edge_options_set_backend": (_status, [_handle, ctypes.c_char_p]),
        "edge_options_set_threads": (_status, [_handle, ctypes.c_int]),
        "edge_options_set_sparsity": (_status, [_handle, ctypes.c_double]),
        "edge_options_set_dense": (_status, [_handle, ctypes.c_int]),
        "edge_options_set_verify_checksums": (_status, [_handle, ctypes.c_int]),
        "edge_model_open": (_status, [ctypes.c_char_p, _handle, ctypes.POINTER(_handle)]),
        "edge_model_close": (None, [_handle]),
        "edge_model_backend": (ctypes.c_char_p, [_handle]),
        "edge_session_create": (_status, [_handle, ctypes.POINTER(_handle)]),
        "edge_session_destroy": (None, [_handle]),
        "edge_session_last_error": (ctypes.c_char_p, [_handle]),
        "edge_session_prefill": (_status, [_handle, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t]),
        "edge_session_decode": (_status, [_handle, ctypes.c_int32]),
        "edge_session_logits": (
            _status,
            [_handle, ctypes.POINTER(ctypes.POINTER(ctypes.c_float)), ctypes.POINTER(ctypes.c_int32)],
        ),
        "edge_session_reset": (_status, [_handle]),
        "edge_tokenizer_create": (_status, [_handle, ctypes.POINTER(_handle)]),
        "edge_tokenizer_destroy": (None, [_handle]),
        "edge_tokenizer_last_error": (ctypes.c_char_p, [_handle]),
        "edge_tokenizer_encode": (
            _status,
            [
                _handle,
                ctypes.c_char_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)),
                ctypes.POINTER(ctypes.c_size_t),
            ],
        ),
        "edge_tokenizer_decode": (
            _status,
            [
                _handle,
                ctypes.POINTER(ctypes.c_int32),
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_size_t),
            ],
        ),
        "edge_tokenizer_token_bytes": (
            _status,
            [_handle, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)],
        ),
        "edge_tokenizer_vocab_size": (ctypes.c_int32, [_handle]),
        "edge_tokenizer_special_tokens": (
            _status,
            [_handle, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int)],
        ),
        "edge_session_position": (ctypes.c_int32, [_handle]),
        "edge_version": (ctypes.c_char_p, []),
        "edge_set_log_callback": (None, [_LogCallback, ctypes.c_void_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        try:
            function = getattr(library, name)
        except AttributeError:
            raise NativeLibraryError(
                f"{library._name} has no {name}: it is older than this edge-sdk; reinstall edge-sdk to rebuild it"
            ) from None
        function.restype = restype
        function.argtypes = argtypes
    library.edge_set_log_callback(_log_from_library, None)
    # a model closed while the interpreter shuts down may still log: not into a Python that is going away
    atexit.register(library.edge_set_log_callback, _LogCallback(), None)
    library._edge_sdk_prototypes = True
    return library


def _last_error(library: ctypes.CDLL) -> str:
    return (library.edge_last_error() or b"").decode(errors="replace")


def _backend_message(library: ctypes.CDLL, backend: str) -> str:
    """The thread's last error without the "backend 'NAME': " the C engine starts it with."""
    return _last_error(library).removeprefix(f"backend '{backend}': ")


def runtime_version() -> str:
    return _library().edge_version().decode()


def probe_backend(name: str) -> tuple[bool, str]:
    """(available, reason) of a libedge_sdk engine before any bundle (edge_backend_probe): for "tensorrt", whether this
    build has the TensorRT engine, TensorRT is 10.3 or later, there is a CUDA device and the plugins register."""
    try:
        library = _library()
    except (NativeLibraryError, OSError) as error:
        return False, f"backend '{name}' runs in the C runtime, and {error}"
    description = ctypes.c_char_p()
    if library.edge_backend_probe(name.encode(), ctypes.byref(description)) != EDGE_OK:
        return False, _backend_message(library, name)
    return True, description.value.decode(errors="replace")


def tensorrt_engine_info(bundle: Bundle, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """What libedge_sdk says about the TensorRT engine of an opened bundle on this device (edge_tensorrt_engine_info):
    the key, `directory`, `engine_file`, `metadata_file` and the `metadata` record engine.json holds, `cached` and the
    `reason` it is not, `description`, `backend`, `plugin_library`, `device_memory_free` / `_total` in bytes.
    cache_dir None: the cache backend "tensorrt" reads. BackendUnavailable when the probe fails."""
    library = _library()
    text = ctypes.c_void_p()
    chosen = None if cache_dir is None else str(cache_dir).encode()
    status = library.edge_tensorrt_engine_info(str(bundle.path).encode(), chosen, ctypes.byref(text))
    if status == EDGE_ERROR_UNAVAILABLE:
        raise BackendUnavailable(f"backend 'tensorrt' is not available here: {_backend_message(library, 'tensorrt')}")
    if status != EDGE_OK:
        raise EdgeSdkError(f"C runtime (edge_tensorrt_engine_info): {_last_error(library)}")
    try:
        return json.loads(ctypes.string_at(text).decode())
    finally:
        library.edge_free(text)


class RuntimeEngine:
    """Engine protocol over one edge_model and one edge_session of libedge_sdk, on its `backend` engine."""

    def __init__(self, bundle: Bundle, options: EngineOptions, backend: str = "cpu"):
        library = _library()
        self._library = library
        self._model = _handle()
        self._session = _handle()
        self._tokenizer: RuntimeTokenizer | None = None
        c_options = _handle()
        self._check(library.edge_options_create(ctypes.byref(c_options)), "edge_options_create")
        try:
            self._check(library.edge_options_set_backend(c_options, backend.encode()), "backend")
            self._check(library.edge_options_set_threads(c_options, options.threads), "threads")
            # the level already resolved (EngineOptions): the runtime finds the same row of its level tensors
            level = -1.0 if options.sparsity is None else float(options.sparsity)
            self._check(library.edge_options_set_sparsity(c_options, level), "sparsity")
            self._check(library.edge_options_set_dense(c_options, int(options.dense)), "dense")
            # Bundle.open already checked every file's sha256; the runtime still checks sizes and the manifest digest
            self._check(library.edge_options_set_verify_checksums(c_options, 0), "verify_checksums")
            status = library.edge_model_open(str(bundle.path).encode(), c_options, ctypes.byref(self._model))
        finally:
            library.edge_options_destroy(c_options)
        if status == EDGE_ERROR_UNSUPPORTED:
            raise RuntimeUnsupported(_last_error(library))
        if status == EDGE_ERROR_UNAVAILABLE:
            reason = _backend_message(library, backend)
            raise BackendUnavailable(f"backend '{backend}' is not available here: {reason}")
        self._check(status, "edge_model_open")
        self._check(library.edge_session_create(self._model, ctypes.byref(self._session)), "edge_session_create")
        self.backend = library.edge_model_backend(self._model).decode()
        self.vocab_size = bundle.config.vocab_size
        self.max_seq_len = bundle.max_seq_len
        self._logits = ctypes.POINTER(ctypes.c_float)()
        self._vocab = ctypes.c_int32()
        # bound once: a decode step of a small model takes ~100 us, so per-call lookups show in tokens/s
        self._decode = library.edge_session_decode
        self._session_logits = library.edge_session_logits
        self._logits_ref, self._vocab_ref = ctypes.byref(self._logits), ctypes.byref(self._vocab)

    def _check(self, status: int, what: str) -> None:
        if status == EDGE_OK:
            return
        session = getattr(self, "_session", None)
        message = self._library.edge_session_last_error(session) if session else None
        text = (message or self._library.edge_last_error() or b"").decode(errors="replace")
        raise EdgeSdkError(f"C runtime ({what}): {text}")

    @property
    def length(self) -> int:
        """Positions in the KV cache: prompt and decoded tokens."""
        return self._library.edge_session_position(self._session)

    def _current_logits(self) -> np.ndarray:
        status = self._session_logits(self._session, self._logits_ref, self._vocab_ref)
        if status != EDGE_OK:
            self._check(status, "edge_session_logits")
        logits = np.empty(self._vocab.value, dtype=np.float32)
        ctypes.memmove(logits.ctypes.data, self._logits, logits.nbytes)
        return logits

    def prefill(self, ids: list[int]) -> np.ndarray:
        array = (ctypes.c_int32 * len(ids))(*ids)
        self._check(self._library.edge_session_prefill(self._session, array, len(ids)), "prefill")
        return self._current_logits()

    def decode(self, token: int) -> np.ndarray:
        status = self._decode(self._session, token)
        if status != EDGE_OK:
            self._check(status, "decode")
        return self._current_logits()

    def reset(self) -> None:
        self._check(self._library.edge_session_reset(self._session), "reset")

    def tokenizer(self, bundle: Bundle) -> Tokenizer | None:
        """The bundle's tokenizer through libedge_sdk's C tokenizer (the same ids and text as the tokenizers library
        for the byte-level BPE files it takes), or None for a tokenizer it does not implement. Destroyed with the
        engine; the Tokenizer must not be used after close()."""
        if self._tokenizer is None:
            handle = _handle()
            status = self._library.edge_tokenizer_create(self._model, ctypes.byref(handle))
            if status == EDGE_ERROR_UNSUPPORTED:
                return None
            self._check(status, "edge_tokenizer_create")
            self._tokenizer = RuntimeTokenizer(self._library, handle)
        config_where = str(bundle.path / TOKENIZER_CONFIG_FILE)
        config_text = None
        if bundle.has_file(TOKENIZER_CONFIG_FILE):
            config_text = bundle.read_file(TOKENIZER_CONFIG_FILE, MAX_TOKENIZER_JSON_BYTES)
        bos, eos, adds_bos = self._tokenizer.special_tokens()
        config = parse_config(config_text, config_where)
        return Tokenizer(
            backend=self._tokenizer,
            bos_token_id=bos,
            eos_token_ids=merged_eos_ids(eos, bundle.config.eos_token_ids),
            add_bos=adds_bos,
            chat_template=chat_template_of(config, config_where),
            template_tokens=template_tokens_of(config, config_where),
        )

    def close(self) -> None:
        """Destroys the tokenizer, the session and the model: on TensorRT, frees every device buffer and the
        engine."""
        if self._tokenizer is not None:
            self._tokenizer.close()
            self._tokenizer = None
        if self._session:
            self._library.edge_session_destroy(self._session)
            self._session = _handle()
        if self._model:
            self._library.edge_model_close(self._model)
            self._model = _handle()

    def __del__(self) -> None:
        if getattr(self, "_library", None) is not None:
            self.close()


class RuntimeTokenizer:
    """TokenizerBackend (model/tokenizer.py) over one edge_tokenizer of libedge_sdk (jetson/src/tokenizer.c)."""

    def __init__(self, library: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
        self._library = library
        self._handle = handle
        self.vocab_size = library.edge_tokenizer_vocab_size(handle)

    def _check(self, status: int, what: str) -> None:
        if status != EDGE_OK:
            message = (self._library.edge_tokenizer_last_error(self._handle) or b"").decode(errors="replace")
            raise EdgeSdkError(f"C tokenizer ({what}): {message}")

    def special_tokens(self) -> tuple[int | None, int | None, bool]:
        """tokenizer_config.json's bos and eos ids (None: none) and whether a prompt starts with bos."""
        bos, eos, adds_bos = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int()
        status = self._library.edge_tokenizer_special_tokens(
            self._handle, ctypes.byref(bos), ctypes.byref(eos), ctypes.byref(adds_bos)
        )
        self._check(status, "edge_tokenizer_special_tokens")
        return (bos.value if bos.value >= 0 else None), (eos.value if eos.value >= 0 else None), bool(adds_bos.value)

    def encode(self, text: str) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise not_unicode_error(text) from None
        ids, count = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        status = self._library.edge_tokenizer_encode(
            self._handle, data, len(data), 0, ctypes.byref(ids), ctypes.byref(count)
        )
        self._check(status, "encode")
        try:
            return ids[: count.value]
        finally:
            self._library.edge_free(ids)

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        array = (ctypes.c_int32 * len(ids))(*ids)
        text, length = ctypes.c_void_p(), ctypes.c_size_t()
        status = self._library.edge_tokenizer_decode(
            self._handle, array, len(ids), int(skip_special_tokens), ctypes.byref(text), ctypes.byref(length)
        )
        self._check(status, "decode")
        try:
            return ctypes.string_at(text, length.value).decode("utf-8")
        finally:
            self._library.edge_free(text)

    def special_token_text(self, token: int) -> str:
        data, length = ctypes.c_void_p(), ctypes.c_size_t()
        status = self._library.edge_tokenizer_token_bytes(self._handle, token, ctypes.byref(data), ctypes.byref(length))
        self._check(status, "token_bytes")
        return ctypes.string_at(data, length.value).decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._handle:
            self._library.edge_tokenizer_destroy(self._handle)
            self._handle = _handle()
