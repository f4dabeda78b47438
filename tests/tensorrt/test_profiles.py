"""The engine's two optimization profiles cover every dynamic input of the graph it is built from (decode.onnx),
with the graph's static dimensions; prefill starts on an empty cache, decode follows one."""

from __future__ import annotations

import onnx
import pytest
from edge_sdk.backends.tensorrt.profiles import ENGINE_GRAPH, PREFILL_OPT_TOKENS, PROFILES, profile_shapes


def graph_inputs(path) -> dict[str, list[int | str]]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        value.name: [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]
        for value in model.graph.input
    }


@pytest.mark.parametrize("kind", ["svd", "core"])
@pytest.mark.parametrize("profile", PROFILES)
def test_profile_matches_the_graph_inputs(trt_bundles, kind, profile):
    bundle = trt_bundles[kind]
    shapes = profile_shapes(bundle.config, bundle.max_seq_len, profile, kind)
    inputs = graph_inputs(bundle.graph_path(ENGINE_GRAPH))
    dynamic = {name for name, dims in inputs.items() if any(isinstance(dim, str) for dim in dims)}
    assert set(shapes) == dynamic
    for name, shape in shapes.items():
        for bound in (shape.min, shape.opt, shape.max):
            assert len(bound) == len(inputs[name])
            for dim, value in zip(inputs[name], bound, strict=True):
                assert isinstance(dim, str) or dim == value, f"{name}: static dimension {dim}, profile {bound}"
        assert all(low <= opt <= high for low, opt, high in zip(shape.min, shape.opt, shape.max, strict=True))
        assert shape.min[0] == shape.max[0] == 1  # one sequence


def test_prefill_and_decode_ranges(trt_bundles):
    model, max_len = trt_bundles["svd"].config, trt_bundles["svd"].max_seq_len
    prefill = profile_shapes(model, max_len, "prefill", "svd")
    assert prefill["input_ids"].min == (1, 1) and prefill["input_ids"].max == (1, max_len)
    assert prefill["input_ids"].opt == (1, min(PREFILL_OPT_TOKENS, max_len))
    assert prefill["past_key_values.0.key"].max[2] == 0  # prefill starts a sequence: the graph's dense FFN
    decode = profile_shapes(model, max_len, "decode", "svd")
    assert decode["input_ids"].min == decode["input_ids"].max == (1, 1)
    key = decode["past_key_values.3.value"]
    # a decode step follows a prompt: past_seq >= 1 selects the predictor and SparseFFN
    assert (key.min[2], key.opt[2], key.max[2]) == (1, max_len // 2, max_len - 1)


def test_profile_rejects_bad_arguments(trt_bundles):
    model = trt_bundles["svd"].config
    with pytest.raises(ValueError, match="profile: expected one of prefill, decode"):
        profile_shapes(model, 64, "verify", "svd")
    with pytest.raises(ValueError, match="max_seq_len: expected >= 2"):
        profile_shapes(model, 1, "decode", "svd")
