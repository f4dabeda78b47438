"""The CPU backend's decode through the C runtime (libedge_sdk, jetson/): the whole decoder step in C.

On a small model most of a decode token's time is spent between the matrix products -- in Python and torch
dispatch when the step is driven from Python -- so the runtime library, which runs embedding, attention,
norms, the predictor, the sparse FFN and the LM head in one C call per token on the same kernels, is what
the CPU backend uses whenever the package build made it. Greedy ids are the same as the Python path's
(tests/jetson); logits agree to float32 rounding.
"""

from __future__ import annotations

import ctypes

import numpy as np

from edge_sdk.bundle import Bundle
from edge_sdk.errors import EdgeSdkError
from edge_sdk.native import load_runtime
from edge_sdk.runtime.backends import EngineOptions

EDGE_OK = 0
EDGE_ERROR_UNSUPPORTED = 4

_handle = ctypes.c_void_p
_status = ctypes.c_int


class RuntimeUnsupported(EdgeSdkError):
    """The bundle uses something the C runtime does not run (e.g. bf16 weights); the torch path does."""


def _library() -> ctypes.CDLL:
    library = load_runtime()
    if getattr(library, "_edge_sdk_prototypes", False):
        return library
    signatures = {
        "edge_last_error": (ctypes.c_char_p, []),
        "edge_options_create": (_status, [ctypes.POINTER(_handle)]),
        "edge_options_destroy": (None, [_handle]),
        "edge_options_set_threads": (_status, [_handle, ctypes.c_int]),
        "edge_options_set_sparsity": (_status, [_handle, ctypes.c_double]),
        "edge_options_set_dense": (_status, [_handle, ctypes.c_int]),
        "edge_options_set_verify_checksums": (_status, [_handle, ctypes.c_int]),
        "edge_model_open": (_status, [ctypes.c_char_p, _handle, ctypes.POINTER(_handle)]),
        "edge_model_close": (None, [_handle]),
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
        "edge_version": (ctypes.c_char_p, []),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(library, name)
        function.restype = restype
        function.argtypes = argtypes
    library._edge_sdk_prototypes = True
    return library


def runtime_version() -> str:
    return _library().edge_version().decode()


class RuntimeEngine:
    """Engine protocol over one edge_model and one edge_session of libedge_sdk."""

    def __init__(self, bundle: Bundle, options: EngineOptions):
        library = _library()
        self._library = library
        self._model = _handle()
        self._session = _handle()
        c_options = _handle()
        self._check(library.edge_options_create(ctypes.byref(c_options)), "edge_options_create")
        try:
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
            raise RuntimeUnsupported(library.edge_last_error().decode())
        self._check(status, "edge_model_open")
        self._check(library.edge_session_create(self._model, ctypes.byref(self._session)), "edge_session_create")
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
        text = (message or self._library.edge_last_error() or b"").decode()
        raise EdgeSdkError(f"C runtime ({what}): {text}")

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

    def close(self) -> None:
        if self._session:
            self._library.edge_session_destroy(self._session)
            self._session = _handle()
        if self._model:
            self._library.edge_model_close(self._model)
            self._model = _handle()

    def __del__(self) -> None:
        if getattr(self, "_library", None) is not None:
            self.close()
