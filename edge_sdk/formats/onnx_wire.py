"""What a bundle reader must know of an ONNX file, read from the protobuf wire format without the onnx package.

A device install has no onnx, and the C runtime has no protobuf library, yet both must refuse the same graphs: a
truncated or empty file, and any tensor whose data lives outside the graph somewhere other than exactly its bytes
in weights.safetensors (ONNX external data names a file, an offset and a length, and runtimes read what it names).
So both sides walk the wire format the same way (jetson/src/onnx_wire.c is this module in C):

- the file is one well-formed ModelProto: every field's key, varint and length inside the file, no groups, and
  messages nested at most MAX_MESSAGE_DEPTH deep;
- the model has an ir_version >= 1, at least one opset_import and exactly one graph;
- every TensorProto anywhere (graph initializers, sparse initializers, node attributes, subgraphs, functions)
  whose data_location is EXTERNAL names location `weights.safetensors` with decimal `offset` and `length`, and its
  name, ONNX data type, dims, offset and length are exactly those of the safetensors tensor with that name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from edge_sdk.errors import EdgeSdkError

MAX_MESSAGE_DEPTH = 64
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# TensorProto.DataType -> safetensors dtype, for the types a bundle stores
ONNX_INT4 = 22  # TensorProto.INT4: two signed 4-bit values per byte, element 2k in the low nibble of byte k
ONNX_INT32 = 6
ONNX_TO_SAFETENSORS = {
    1: "F32",
    2: "U8",
    3: "I8",
    4: "U16",
    5: "I16",
    6: "I32",
    7: "I64",
    9: "BOOL",
    10: "F16",
    11: "F64",
    12: "U32",
    13: "U64",
    16: "BF16",
}

# field numbers (onnx.proto3), by message
_MODEL_IR_VERSION, _MODEL_OPSET_IMPORT, MODEL_GRAPH, _MODEL_TRAINING_INFO, _MODEL_FUNCTIONS = 1, 8, 7, 20, 25
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_SPARSE_INITIALIZER = 1, 5, 15
_NODE_OP_TYPE, _NODE_ATTRIBUTE, _NODE_DOMAIN = 4, 5, 7
_ATTRIBUTE_T, _ATTRIBUTE_G, _ATTRIBUTE_TENSORS, _ATTRIBUTE_GRAPHS = 5, 6, 10, 11
_ATTRIBUTE_SPARSE_TENSOR, _ATTRIBUTE_SPARSE_TENSORS = 22, 23
_FUNCTION_NAME, _FUNCTION_NODE, _FUNCTION_DOMAIN, _FUNCTION_ATTRIBUTE_PROTO = 1, 7, 10, 11
_TRAINING_INITIALIZATION, _TRAINING_ALGORITHM = 1, 2
_SPARSE_VALUES, _SPARSE_INDICES = 1, 2
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 1, 2, 8, 13, 14
_ENTRY_KEY, _ENTRY_VALUE = 1, 2

VARINT, _FIXED64, LENGTH, _FIXED32 = 0, 1, 2, 5


class WireError(EdgeSdkError):
    """The bytes are not a well-formed protobuf message."""


@dataclass
class ExternalTensor:
    """A TensorProto whose data lives in another file."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    location: str | None
    offset: str | None
    length: str | None


@dataclass
class ModelSummary:
    ir_version: int = 0
    opset_imports: int = 0
    graphs: int = 0
    external_tensors: list[ExternalTensor] = field(default_factory=list)


def _varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= end:
            raise WireError(f"a varint runs past the end of its message (byte {at})")
        byte = data[at]
        at += 1
        if shift == 63 and byte > 1:
            raise WireError(f"a varint is longer than 64 bits (byte {at - 1})")
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise WireError(f"a varint is longer than 10 bytes (byte {at - 1})")


def fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or payload start, payload end) of each field of the message in data[start:end];
    for varints the third item is the value and the fourth is 0."""
    for number, wire_type, _, first, second in _fields_with_offsets(data, start, end):
        yield number, wire_type, first, second


def _fields_with_offsets(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, range, int, int]]:
    """fields(), each with the byte range of the whole field (key included) third."""
    at = start
    while at < end:
        field_start = at
        key, at = _varint(data, at, end)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {at}")
        if wire_type == VARINT:
            value, at = _varint(data, at, end)
            yield number, wire_type, range(field_start, at), value, 0
        elif wire_type in (_FIXED64, _FIXED32):
            width = 8 if wire_type == _FIXED64 else 4
            if at + width > end:
                raise WireError(f"a fixed-width field runs past the end of its message (byte {at})")
            yield number, wire_type, range(field_start, at + width), at, at + width
            at += width
        elif wire_type == LENGTH:
            length, at = _varint(data, at, end)
            if length > end - at:
                raise WireError(f"a field of {length} bytes runs past the end of its message (byte {at})")
            yield number, wire_type, range(field_start, at + length), at, at + length
            at += length
        else:
            raise WireError(f"wire type {wire_type} (groups are not used by ONNX) at byte {at}")


class _Walker:
    def __init__(self, data: bytes):
        self.data = data
        self.summary = ModelSummary()

    def _messages(self, start: int, end: int, depth: int, handlers: dict[int, Callable[[int, int, int], None]]) -> None:
        if depth > MAX_MESSAGE_DEPTH:
            raise WireError(f"messages nested deeper than {MAX_MESSAGE_DEPTH} levels")
        for number, wire_type, first, second in fields(self.data, start, end):
            handler = handlers.get(number)
            if handler is not None and wire_type == LENGTH:
                handler(first, second, depth + 1)

    def model(self, start: int, end: int) -> None:
        for number, wire_type, first, _ in fields(self.data, start, end):
            if number == _MODEL_IR_VERSION and wire_type == VARINT:
                self.summary.ir_version = first
            elif number == _MODEL_OPSET_IMPORT and wire_type == LENGTH:
                self.summary.opset_imports += 1
            elif number == MODEL_GRAPH and wire_type == LENGTH:
                self.summary.graphs += 1
        self._messages(
            start,
            end,
            0,
            {MODEL_GRAPH: self.graph, _MODEL_FUNCTIONS: self.function, _MODEL_TRAINING_INFO: self.training_info},
        )

    def graph(self, start: int, end: int, depth: int) -> None:
        self._messages(
            start,
            end,
            depth,
            {_GRAPH_NODE: self.node, _GRAPH_INITIALIZER: self.tensor, _GRAPH_SPARSE_INITIALIZER: self.sparse_tensor},
        )

    def node(self, start: int, end: int, depth: int) -> None:
        self._messages(start, end, depth, {_NODE_ATTRIBUTE: self.attribute})

    def attribute(self, start: int, end: int, depth: int) -> None:
        self._messages(
            start,
            end,
            depth,
            {
                _ATTRIBUTE_T: self.tensor,
                _ATTRIBUTE_TENSORS: self.tensor,
                _ATTRIBUTE_G: self.graph,
                _ATTRIBUTE_GRAPHS: self.graph,
                _ATTRIBUTE_SPARSE_TENSOR: self.sparse_tensor,
                _ATTRIBUTE_SPARSE_TENSORS: self.sparse_tensor,
            },
        )

    def function(self, start: int, end: int, depth: int) -> None:
        self._messages(start, end, depth, {_FUNCTION_NODE: self.node, _FUNCTION_ATTRIBUTE_PROTO: self.attribute})

    def training_info(self, start: int, end: int, depth: int) -> None:
        self._messages(start, end, depth, {_TRAINING_INITIALIZATION: self.graph, _TRAINING_ALGORITHM: self.graph})

    def sparse_tensor(self, start: int, end: int, depth: int) -> None:
        self._messages(start, end, depth, {_SPARSE_VALUES: self.tensor, _SPARSE_INDICES: self.tensor})

    def _text(self, start: int, end: int) -> str:
        return utf8_text(self.data, start, end)

    def tensor(self, start: int, end: int, depth: int) -> None:
        if depth > MAX_MESSAGE_DEPTH:
            raise WireError(f"messages nested deeper than {MAX_MESSAGE_DEPTH} levels")
        name, data_type, location, dims, external = "", 0, 0, [], {}
        for number, wire_type, first, second in fields(self.data, start, end):
            if number == _TENSOR_NAME and wire_type == LENGTH:
                name = self._text(first, second)
            elif number == _TENSOR_DATA_TYPE and wire_type == VARINT:
                data_type = first
            elif number == _TENSOR_DATA_LOCATION and wire_type == VARINT:
                location = first
            elif number == _TENSOR_DIMS and wire_type == VARINT:
                dims.append(first)
            elif number == _TENSOR_DIMS and wire_type == LENGTH:  # packed repeated int64
                at = first
                while at < second:
                    value, at = _varint(self.data, at, second)
                    dims.append(value)
            elif number == _TENSOR_EXTERNAL_DATA and wire_type == LENGTH:
                key = value = ""
                for entry_number, entry_type, entry_first, entry_second in fields(self.data, first, second):
                    if entry_type == LENGTH and entry_number == _ENTRY_KEY:
                        key = self._text(entry_first, entry_second)
                    elif entry_type == LENGTH and entry_number == _ENTRY_VALUE:
                        value = self._text(entry_first, entry_second)
                external[key] = value
        if location == EXTERNAL:
            self.summary.external_tensors.append(
                ExternalTensor(
                    name,
                    data_type,
                    tuple(dim - (1 << 64) if dim >= 1 << 63 else dim for dim in dims),
                    external.get("location"),
                    external.get("offset"),
                    external.get("length"),
                )
            )


def utf8_text(data: bytes, start: int, end: int) -> str:
    """The string field data[start:end]; WireError when it is not UTF-8."""
    try:
        return data[start:end].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"a string field is not UTF-8 (byte {start})") from None


def _strings(data: bytes, first: int, second: int, numbers: tuple[int, ...]) -> list[str]:
    """The string fields `numbers` of the message in data[first:second] (the last of each, "" where absent)."""
    found = dict.fromkeys(numbers, "")
    for number, wire_type, value_first, value_second in fields(data, first, second):
        if wire_type == LENGTH and number in found:
            found[number] = data[value_first:value_second].decode("utf-8", "replace")
    return [found[number] for number in numbers]


def without_functions(data: bytes, domain: str, names: set[str]) -> bytes:
    """The serialized ModelProto without its model-local functions of `domain` named in `names`; every other byte
    as it was. (The TensorRT backend parses graphs without our ops' reference functions, and a device has no onnx
    package to edit them with.)"""
    kept = []
    for number, wire_type, span, first, second in _fields_with_offsets(data, 0, len(data)):
        if number == _MODEL_FUNCTIONS and wire_type == LENGTH:
            name, function_domain = _strings(data, first, second, (_FUNCTION_NAME, _FUNCTION_DOMAIN))
            if function_domain == domain and name in names:
                continue
        kept.append(data[span.start : span.stop])
    return b"".join(kept)


def graph_op_types(data: bytes) -> set[tuple[str, str]]:
    """(domain, op type) of every node of the serialized ModelProto's main graph (not of its subgraphs or functions),
    "" for the standard domain; WireError when the bytes are not a well-formed message."""
    found = set()
    for number, wire_type, first, second in fields(data, 0, len(data)):
        if number != MODEL_GRAPH or wire_type != LENGTH:
            continue
        for graph_number, graph_type, node_first, node_second in fields(data, first, second):
            if graph_number == _GRAPH_NODE and graph_type == LENGTH:
                domain, op_type = _strings(data, node_first, node_second, (_NODE_DOMAIN, _NODE_OP_TYPE))
                found.add((domain, op_type))
    return found


def summarize(data: bytes) -> ModelSummary:
    """The structure of a serialized ModelProto; WireError when the bytes are not a well-formed one."""
    walker = _Walker(data)
    walker.model(0, len(data))
    return walker.summary
