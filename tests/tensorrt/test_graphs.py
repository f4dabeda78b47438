"""The graphs as the TensorRT backend hands them to the parser, on real exported bundles."""

from __future__ import annotations

import onnx
import pytest
from edge_sdk.backends.tensorrt.graphs import tensorrt_model

from edge_sdk.export import ops


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes TensorRT must map to our plugins."""
    return [node for node in model.graph.node if node.domain == ops.DOMAIN]


def external_data(model: onnx.ModelProto) -> dict[str, dict[str, str]]:
    return {
        tensor.name: {entry.key: entry.value for entry in tensor.external_data}
        for tensor in model.graph.initializer
        if tensor.data_location == onnx.TensorProto.EXTERNAL
    }


@pytest.mark.parametrize("kind", ["svd", "core"])
def test_decode_graph_loses_only_the_reference_functions(trt_bundles, kind):
    bundle = trt_bundles[kind]
    path = bundle.graph_path("decode")
    original = onnx.load(str(path), load_external_data=False)
    float_ops = set(ops.SCHEMAS) - set(ops.QUANTIZED_OPS)  # fp16 bundles
    assert {(f.domain, f.name) for f in original.functions} == {(ops.DOMAIN, name) for name in float_ops}

    stripped = onnx.load_from_string(tensorrt_model(path))
    assert not any(function.domain == ops.DOMAIN for function in stripped.functions)
    assert [node.op_type for node in stripped.graph.node] == [node.op_type for node in original.graph.node]
    nodes = custom_nodes(stripped)
    expected_ops = {"SparseFFN", "SvdPredictor"} if kind == "svd" else {"SparseFFN"}
    assert {node.op_type for node in nodes} == expected_ops
    assert len([node for node in nodes if node.op_type == "SparseFFN"]) == bundle.config.num_layers
    for node in nodes:
        ops.validate_node(node)  # the plugin attributes TensorRT looks the creator up by are still there
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["plugin_version"] == b"1" and attributes["plugin_namespace"] == b"edge_sdk"
    # weights stay in weights.safetensors at the same offsets; the parser reads them next to the graph
    assert external_data(stripped) == external_data(original)
    assert {entry["location"] for entry in external_data(stripped).values()} == {"weights.safetensors"}
    assert stripped.opset_import == original.opset_import
    # everything but the functions is byte for byte what the exporter wrote
    without = onnx.ModelProto()
    without.CopyFrom(original)
    del without.functions[:]
    assert tensorrt_model(path) == without.SerializeToString()


def test_prefill_graph_has_no_custom_op(trt_bundles):
    bundle = trt_bundles["svd"]
    model = onnx.load_from_string(tensorrt_model(bundle.graph_path("prefill")))
    assert custom_nodes(model) == [] and len(model.functions) == 0


def test_an_asymmetric_decode_graph_gives_the_plugins_every_input(bundle_matrix):
    """An asymmetric int4 bundle's graph as the parser gets it: every quantized node "int4_asymmetric", with its
    minimums after its other inputs and no empty name, QuantizedSparseFFN's thresholds the one zeros initializer the
    graph holds inline (the SVD predictor has none), the minimums external, in weights.safetensors."""
    bundle = bundle_matrix["svd-int4-asym"]
    stripped = onnx.load_from_string(tensorrt_model(bundle.graph_path("decode")))
    assert not any(function.domain == ops.DOMAIN for function in stripped.functions)
    initializers = {tensor.name: tensor for tensor in stripped.graph.initializer}
    counts = {"QuantizedSparseFFN": 12, "QuantizedMatMul": 4, "SvdPredictor": 4}
    nodes = custom_nodes(stripped)
    assert {node.op_type for node in nodes} == set(counts)
    for node in nodes:
        ops.validate_node(node)
        assert len(node.input) == counts[node.op_type] and all(node.input), node.name
        if node.op_type in ops.QUANTIZED_OPS:
            weight_format = next(a.s for a in node.attribute if a.name == "weight_format")
            assert weight_format == b"int4_asymmetric"
            minimums = node.input[9:] if node.op_type == "QuantizedSparseFFN" else node.input[3:]
            assert all(initializers[name].data_location == onnx.TensorProto.EXTERNAL for name in minimums)
    thresholds = {node.input[8] for node in nodes if node.op_type == "QuantizedSparseFFN"}
    assert len(thresholds) == 1 and initializers[thresholds.pop()].data_location == onnx.TensorProto.DEFAULT
