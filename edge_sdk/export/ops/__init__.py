"""The custom ONNX ops of an edge-sdk bundle: their schemas and reference decompositions (DESIGN 3.3).

Every implementation of an op -- the reference ONNX function here, which ONNX Runtime runs, the TensorRT
plugins, the C kernels -- implements the contract declared in this package: inputs, outputs and attributes
with their types and shapes (schemas.SCHEMAS) and the error each implementation may have (schemas.ERROR_BOUNDS),
and the exact semantics, written once as a model-local ONNX function in standard ops (functions.py). The exporter
builds custom nodes with make_node (nodes.py, which validates every node against its schema; check_inputs checks a
node's inputs, types included, for the TensorRT compatibility check), attaches
reference_functions() to the model and imports function_opset_imports(); the TensorRT backend removes the
functions again (formats/onnx_wire.without_functions, no onnx needed on a device). OPS.md, the plugin authors'
documentation, embeds schema_markdown() (markdown.py), so this package is the source of truth:
`python -m edge_sdk.export.ops` regenerates it.

The semantics are those of edge_sdk.sparsity: svd.SvdPredictor.scores + bias > 0, signbit.signbit_mask,
and ffn.sparse_ffn with the sequential pipeline; the quantized ops' on the matrices edge_sdk.quant.dequantize gives.
"""

from edge_sdk.bundle.graph_ops import DOMAIN, OPSET_VERSION, PLUGIN_NAMESPACE, PLUGIN_VERSION
from edge_sdk.export.ops.functions import (
    IR_VERSION,
    QUANTIZED_OPS,
    QUANTIZED_OPSET_VERSION,
    STANDARD_OPSET_VERSION,
    function_opset_imports,
    reference_functions,
)
from edge_sdk.export.ops.markdown import schema_markdown
from edge_sdk.export.ops.nodes import check_attributes, check_inputs, make_node, validate_node
from edge_sdk.export.ops.schemas import (
    ACTIVATIONS,
    ASYMMETRIC_WEIGHT_FORMAT,
    ERROR_BOUNDS,
    FLOAT_TYPES,
    SCHEMAS,
    AttributeSpec,
    OpSchema,
    TensorSpec,
    error_bound,
)

__all__ = [
    "ACTIVATIONS",
    "ASYMMETRIC_WEIGHT_FORMAT",
    "DOMAIN",
    "ERROR_BOUNDS",
    "FLOAT_TYPES",
    "IR_VERSION",
    "OPSET_VERSION",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "QUANTIZED_OPS",
    "QUANTIZED_OPSET_VERSION",
    "SCHEMAS",
    "STANDARD_OPSET_VERSION",
    "AttributeSpec",
    "OpSchema",
    "TensorSpec",
    "check_attributes",
    "check_inputs",
    "error_bound",
    "function_opset_imports",
    "make_node",
    "reference_functions",
    "schema_markdown",
    "validate_node",
]
