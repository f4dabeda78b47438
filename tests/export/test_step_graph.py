"""decode.onnx runs a prompt too (graph.py `_step_ffn`), as TensorRT's one engine does in its prefill profile: on an
empty cache it must give prefill.onnx's logits, KV cache and core activations exactly, for every predictor kind and
weight format (asymmetric int4 too: QuantizedMatMul's reference function against prefill.onnx's standard-op
dequantization), and a decode step after it the same as after prefill.onnx."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.export.ort_session import OrtBundleSession

from ..conftest import ASYMMETRIC_BUNDLES, BUNDLE_MATRIX

PROMPT = np.array([[5, 17, 300, 42, 7, 99, 1000]])


def _prompt_through_the_decode_graph(session: OrtBundleSession) -> dict[str, np.ndarray]:
    """decode.onnx's outputs for PROMPT on an empty cache; the decode-only inputs hold values the prompt must not
    read (an all-zero core mask, the last level)."""
    config = session.bundle.config
    session.reset()
    feed = session._feed(PROMPT) | {
        f"core_mask.{layer}": np.zeros((1, config.intermediate_size), dtype=np.int32)
        for layer in range(config.num_layers)
    }
    feed["sparsity_level"] = np.array(max(len(session.bundle.sparsity.levels) - 1, 0), dtype=np.int64)
    feed["dense"] = np.array(False)
    names = [output.name for output in session.decode_session.get_outputs()]
    inputs = {value.name for value in session.decode_session.get_inputs()}
    feed = {name: value for name, value in feed.items() if name in inputs}
    return dict(zip(names, session.decode_session.run(names, feed), strict=True))


@pytest.mark.parametrize("name", [*BUNDLE_MATRIX, *ASYMMETRIC_BUNDLES])
def test_the_decode_graph_runs_a_prompt_as_the_prefill_graph(bundle_matrix, name):
    session = OrtBundleSession(bundle_matrix[name])
    prefill_names = [output.name for output in session.prefill_session.get_outputs()]
    session.reset()
    expected = dict(zip(prefill_names, session.prefill_session.run(prefill_names, session._feed(PROMPT)), strict=True))
    found = _prompt_through_the_decode_graph(session)
    assert set(found) == set(expected)  # logits, the KV cache, and core bundles' activations
    for output, value in expected.items():
        np.testing.assert_array_equal(found[output], value, err_msg=output)
