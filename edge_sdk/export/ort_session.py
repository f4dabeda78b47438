"""Run a bundle's graphs in ONNX Runtime (CPU, no custom-op library: the reference functions run).

Used by `edge-sdk verify` and the parity tests; keeps the KV cache as numpy arrays between steps.
"""

from __future__ import annotations

import numpy as np

from edge_sdk import predictors
from edge_sdk.bundle import Bundle
from edge_sdk.errors import EdgeSdkError


class OrtBundleSession:
    """prefill(ids) / decode(ids) over a bundle's prefill.onnx and decode.onnx, batch 1."""

    def __init__(self, bundle: Bundle, level: float | None = None, dense: bool = False, threads: int = 0):
        import onnxruntime as ort

        if bundle.dtype == "bf16":
            # The graphs multiply by bf16 matrices as stored (no fp32 copies, OPS.md / graph.py); onnxruntime's CPU
            # provider has no bf16 MatMul, Gemm, Mul or Add ("NOT_IMPLEMENTED: Could not find an implementation").
            raise EdgeSdkError(
                f"{bundle.path / 'manifest.json'}: field dtype: expected fp16 or fp32 for ONNX Runtime on the CPU, "
                "found bf16 (its CPU provider has no bf16 MatMul); run the bundle on TensorRT, or export it with "
                "--dtype fp16"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        providers = ["CPUExecutionProvider"]
        self.bundle = bundle
        self.prefill_session = ort.InferenceSession(str(bundle.graph_path("prefill")), options, providers=providers)
        self.decode_session = ort.InferenceSession(str(bundle.graph_path("decode")), options, providers=providers)
        choice = bundle.sparsity.resolve(level, dense)
        self.level_index = choice.index or 0
        self.dense = choice.dense
        self.reset()

    def reset(self) -> None:
        config = self.bundle.config
        empty = np.zeros((1, config.num_kv_heads, 0, config.head_dim), dtype=np.float32)
        self.cache = {
            f"past_key_values.{layer}.{part}": empty for layer in range(config.num_layers) for part in ("key", "value")
        }
        self.position = 0
        self.prompt_feed: dict[str, np.ndarray] = {}  # the decode inputs the predictor kind takes from the prompt

    def _feed(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        seq = ids.shape[1]
        positions = np.arange(self.position, self.position + seq, dtype=np.int64)[None, :]
        return {"input_ids": ids.astype(np.int64), "position_ids": positions, **self.cache}

    def _advance(self, outputs: list[np.ndarray], names: list[str], seq: int) -> np.ndarray:
        values = dict(zip(names, outputs, strict=True))
        for name in self.cache:
            self.cache[name] = values[name.replace("past_key_values", "present")]
        self.position += seq
        return values["logits"]

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        """ids [1, S] -> logits [1, S, V]; starts a new sequence."""
        self.reset()
        names = [output.name for output in self.prefill_session.get_outputs()]
        outputs = self.prefill_session.run(names, self._feed(ids))
        sparsity = self.bundle.sparsity
        values = dict(zip(names, outputs, strict=True))
        self.prompt_feed = predictors.kind(sparsity.predictor).decode_feed(values, sparsity)
        return self._advance(outputs, names, ids.shape[1])

    def decode(self, ids: np.ndarray) -> np.ndarray:
        """ids [1, 1] -> logits [1, 1, V] through the predictors and SparseFFN."""
        names = [output.name for output in self.decode_session.get_outputs()]
        feed = self._feed(ids) | self.prompt_feed
        feed["sparsity_level"] = np.array(self.level_index, dtype=np.int64)
        feed["dense"] = np.array(self.dense)
        outputs = self.decode_session.run(names, feed)
        return self._advance(outputs, names, ids.shape[1])
