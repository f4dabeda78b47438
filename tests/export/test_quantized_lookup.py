"""The row lookup of a quantized matrix in decode.onnx (GraphBuilder.dequantized_rows: a tied embedding's codes read
as INT32 words and unpacked in standard integer ops, an asymmetric int4 matrix's minimums added) against
edge_sdk.quant.dequantize, on every code value."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from edge_sdk.backends.tensorrt.compatibility import check_graph
from onnx import TensorProto, helper, numpy_helper

from edge_sdk import quant
from edge_sdk.bundle.layout import MINS_SUFFIX, SCALES_SUFFIX
from edge_sdk.export import graph, ops
from edge_sdk.model.config import parse_config

ROWS, COLS, GROUP = 24, 128, 32
# the matrices looked up: (format, asymmetric)
LAYOUTS = [("int8", False), ("int4", False), ("int4", True)]
LAYOUT_IDS = ["int8", "int4", "int4-asymmetric"]


def _matrix(fmt: str, asymmetric: bool) -> quant.QuantizedMatrix:
    """Codes covering every value of the format, the extremes of int8 (-128, which quantize never writes, included)
    at the first and last position of a word, and fp16 scales of both signs and of every magnitude class; asymmetric
    int4's minimums of both signs, far from zero (a lookup that dropped them, or the codes' + 8, would differ), and
    +-0.0."""
    generator = np.random.default_rng(0)
    low, high = (-128, 127) if fmt == "int8" else (quant.INT4_MIN, quant.INT4_MAX)
    codes = generator.integers(low, high + 1, size=(ROWS, COLS), dtype=np.int64).astype(np.int8)
    codes[0] = np.resize(np.arange(low, high + 1), COLS)
    codes[1, ::4], codes[1, 3::4] = low, high
    codes[2] = low  # every word of the row negative
    data = codes if fmt == "int8" else quant.pack_int4(codes)
    scales = generator.standard_normal((ROWS, COLS // GROUP)).astype(np.float16)
    scales[3] = np.array([6e-8, -6e-5, 65504, 0], dtype=np.float16)  # subnormal, small normal, largest, zero
    if not asymmetric:
        return quant.QuantizedMatrix(fmt, GROUP, data, scales)
    mins = (8 * generator.standard_normal((ROWS, COLS // GROUP))).astype(np.float16)
    mins[4] = np.array([0.0, -0.0, 0.0, -0.0], dtype=np.float16)
    mins[3, 3] = 1.0  # a zero scale: every value of the group its minimum
    return quant.QuantizedMatrix(fmt, GROUP, data, scales, mins)


def _lookup_model(matrix: quant.QuantizedMatrix):
    """A graph [T] int64 row ids -> [T, COLS] float32 through dequantized_rows, the matrix as inline initializers."""
    config = parse_config(
        {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": ROWS,
            "hidden_size": COLS,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "hidden_act": "relu",
            "max_position_embeddings": 16,
        },
        "config.json",
    )
    name = "embed_tokens.weight"
    # the codes' bytes as the decode graph's INT32 view
    arrays = {name: np.ascontiguousarray(matrix.data).view(np.int32), name + SCALES_SUFFIX: matrix.scales}
    tensors = {
        name: graph.ExternalTensor(name, "U8" if matrix.format == "int4" else "I8", matrix.data.shape, 0, 0),
        name + SCALES_SUFFIX: graph.ExternalTensor(name + SCALES_SUFFIX, "F16", matrix.scales.shape, 0, 0),
    }
    if matrix.asymmetric:
        arrays[name + MINS_SUFFIX] = matrix.mins
        tensors[name + MINS_SUFFIX] = graph.ExternalTensor(name + MINS_SUFFIX, "F16", matrix.mins.shape, 0, 0)
    spec = graph.GraphSpec(config, "weights.safetensors", tensors, "none", quant_format=matrix.format, group_size=GROUP)
    builder = graph.GraphBuilder(spec, quantized_ops=True)
    values = builder.dequantized_rows(name, "ids")
    initializers = [numpy_helper.from_array(array, key) for key, array in arrays.items()]
    model = helper.make_model(
        helper.make_graph(
            builder.nodes,
            "lookup",
            [helper.make_tensor_value_info("ids", TensorProto.INT64, ["tokens"])],
            [helper.make_tensor_value_info(values, TensorProto.FLOAT, ["tokens", COLS])],
            initializer=initializers + builder.initializers,
        ),
        opset_imports=[helper.make_opsetid("", ops.QUANTIZED_OPSET_VERSION)],
    )
    model.ir_version = ops.IR_VERSION
    assert builder.code_words == {name}  # one INT32 view of the codes, the one QuantizedMatMul reads
    assert builder.used_weights == set(arrays)
    return model


@pytest.mark.parametrize(("fmt", "asymmetric"), LAYOUTS, ids=LAYOUT_IDS)
def test_rows_unpacked_from_words_equal_dequantize_bit_for_bit(fmt, asymmetric):
    matrix = _matrix(fmt, asymmetric)
    session = ort.InferenceSession(_lookup_model(matrix).SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([0, 1, 2, 3, 23, 5, 2, 17], dtype=np.int64)
    (values,) = session.run(None, {"ids": ids})
    expected = quant.dequantize(matrix)[ids]
    np.testing.assert_array_equal(values, expected)
    assert np.array_equal(np.signbit(values), np.signbit(expected))  # -0.0 where a code times a scale is -0.0


@pytest.mark.parametrize(("fmt", "asymmetric"), LAYOUTS, ids=LAYOUT_IDS)
def test_the_lookup_uses_only_ops_tensorrt_parses(fmt, asymmetric):
    assert check_graph(_lookup_model(_matrix(fmt, asymmetric)), "lookup.onnx") == []
