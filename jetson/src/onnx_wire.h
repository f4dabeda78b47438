/* What a bundle reader must know of an ONNX file, read from the protobuf wire format (edge_sdk/formats/onnx_wire.py,
 * walked the same way, so that both refuse the same graphs):
 * - the file is one well-formed ModelProto: every field's key, varint (at most 10 bytes) and length inside its
 *   message, no groups (wire types 3, 4) or unknown wire types, messages nested at most ONNX_MAX_MESSAGE_DEPTH deep;
 * - the walk enters the messages that can hold tensors: model graph (7), functions (25) and training_info (20);
 *   graph node (1), initializer (5), sparse_initializer (15); node attribute (5); attribute t (5), tensors (10),
 *   g (6), graphs (11), sparse_tensor (22), sparse_tensors (23); function node (7), attribute_proto (11);
 *   training_info initialization (1), algorithm (2); sparse tensor values (1), indices (2);
 * - every TensorProto reached whose data_location (14) is EXTERNAL (1) is listed with its name (8, UTF-8),
 *   data_type (2), dims (1, packed or not, int64) and its external_data (13) location, offset and length (the
 *   last entry of each key; keys and values UTF-8).
 * onnx_wire_interface reads what edge_sdk/bundle/graph_io.py read_interface reads, in a second walk: the main
 * graph's (7) inputs (11) and outputs (12), each ValueInfoProto's name (1, UTF-8) and type (2); a TypeProto's
 * tensor_type (1) with its elem_type (1) and shape (2), whose dims (1) each hold a dim_value (2's complement
 * int64) or a dim_param (UTF-8). The last of a repeated field wins, as in protobuf; every message on the way is
 * walked as a whole (well-formed fields), the others (sequence types, metadata, ...) are skipped. */
#ifndef EDGE_ONNX_WIRE_H
#define EDGE_ONNX_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "edge_sdk.h"

#define ONNX_MAX_MESSAGE_DEPTH 64
#define ONNX_DATA_LOCATION_EXTERNAL 1

/* A string field: bytes inside the file, or absent. */
struct wire_text {
  const uint8_t *data;
  size_t length;
  int present;
};

struct onnx_external_tensor {
  struct wire_text name, location, offset, length;
  uint64_t data_type;
  size_t first_dim, n_dims; /* dims[first_dim : first_dim + n_dims] of the summary */
};

struct onnx_summary {
  uint64_t ir_version;
  uint64_t opset_imports;
  uint64_t graphs;
  struct onnx_external_tensor *tensors;
  size_t n_tensors, tensors_capacity;
  int64_t *dims;
  size_t n_dims, dims_capacity;
};

/* The structure of the serialized ModelProto data[0:size] (free it with onnx_summary_free, on failure too).
 * EDGE_ERROR_BUNDLE "<where>: not an ONNX model (<problem>)" when it is not a well-formed one. */
edge_status onnx_wire_summarize(const uint8_t *data, size_t size, const char *where, struct onnx_summary *summary);
void onnx_summary_free(struct onnx_summary *summary);

/* A dimension of a value's shape: a size, or a symbol: the dim_param's first ONNX_MAX_SYMBOL_CHARACTERS
 * characters (graph_io.py MAX_NAME_SHOWN), "?" for a dimension with neither. */
#define ONNX_MAX_SYMBOL_CHARACTERS 200

struct onnx_dim {
  int is_symbol;
  int64_t size;                 /* !is_symbol */
  size_t symbol, symbol_length; /* is_symbol: text[symbol : symbol + symbol_length] of the interface */
};

/* A graph input or output. tensor: its type has a tensor_type (else elem_type and shape are unset); has_shape: that
 * tensor_type has a shape, dims[first_dim : first_dim + rank] of the interface. */
struct onnx_value {
  size_t name, name_length; /* text[name : name + name_length] of the interface */
  int tensor;
  uint64_t elem_type;
  int has_shape;
  size_t first_dim, rank;
};

struct onnx_values {
  struct onnx_value *items;
  size_t n, capacity;
};

/* The inputs and outputs of a model's graph, in file order; it owns its strings (text), so it outlives the file's
 * bytes. Its memory grows with the file's inputs and outputs only (each at least 2 bytes of the file). */
struct onnx_interface {
  struct onnx_values inputs, outputs;
  struct onnx_dim *dims;
  size_t n_dims, dims_capacity;
  char *text;
  size_t text_length, text_capacity;
};

/* The inputs and outputs of the graph of the serialized ModelProto data[0:size] (free it with
 * onnx_interface_free, on failure too). EDGE_ERROR_BUNDLE "<where>: not an ONNX model (<problem>)" when a message
 * on the way is not well-formed or a name is not UTF-8. */
edge_status onnx_wire_interface(const uint8_t *data, size_t size, const char *where, struct onnx_interface *interface);
void onnx_interface_free(struct onnx_interface *interface);

/* The safetensors dtype name of an ONNX TensorProto.DataType a bundle stores, or NULL. */
const char *onnx_safetensors_dtype(uint64_t data_type);

#endif
