/* The protobuf wire walk of formats/onnx_wire.py and of bundle/graph_io.py read_interface (onnx_wire.h), without a
 * protobuf library. */
#include "onnx_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "json_strict.h"

enum wire_type { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LENGTH = 2, WIRE_FIXED32 = 5 };

/* Messages the walk enters, and the fields (onnx.proto3 numbers) that lead from one to another. */
enum message { MESSAGE_GRAPH, MESSAGE_NODE, MESSAGE_ATTRIBUTE, MESSAGE_FUNCTION, MESSAGE_TRAINING_INFO,
               MESSAGE_SPARSE_TENSOR, MESSAGE_TENSOR };

static const struct {
  enum message parent;
  uint64_t field;
  enum message child;
} message_fields[] = {
    {MESSAGE_GRAPH, 1, MESSAGE_NODE},            {MESSAGE_GRAPH, 5, MESSAGE_TENSOR},
    {MESSAGE_GRAPH, 15, MESSAGE_SPARSE_TENSOR},  {MESSAGE_NODE, 5, MESSAGE_ATTRIBUTE},
    {MESSAGE_ATTRIBUTE, 5, MESSAGE_TENSOR},      {MESSAGE_ATTRIBUTE, 10, MESSAGE_TENSOR},
    {MESSAGE_ATTRIBUTE, 6, MESSAGE_GRAPH},       {MESSAGE_ATTRIBUTE, 11, MESSAGE_GRAPH},
    {MESSAGE_ATTRIBUTE, 22, MESSAGE_SPARSE_TENSOR}, {MESSAGE_ATTRIBUTE, 23, MESSAGE_SPARSE_TENSOR},
    {MESSAGE_FUNCTION, 7, MESSAGE_NODE},         {MESSAGE_FUNCTION, 11, MESSAGE_ATTRIBUTE},
    {MESSAGE_TRAINING_INFO, 1, MESSAGE_GRAPH},   {MESSAGE_TRAINING_INFO, 2, MESSAGE_GRAPH},
    {MESSAGE_SPARSE_TENSOR, 1, MESSAGE_TENSOR},  {MESSAGE_SPARSE_TENSOR, 2, MESSAGE_TENSOR},
};

/* ModelProto fields */
#define MODEL_IR_VERSION 1
#define MODEL_GRAPH 7
#define MODEL_OPSET_IMPORT 8
#define MODEL_TRAINING_INFO 20
#define MODEL_FUNCTIONS 25
/* TensorProto fields */
#define TENSOR_DIMS 1
#define TENSOR_DATA_TYPE 2
#define TENSOR_NAME 8
#define TENSOR_EXTERNAL_DATA 13
#define TENSOR_DATA_LOCATION 14
/* StringStringEntryProto fields */
#define ENTRY_KEY 1
#define ENTRY_VALUE 2
/* GraphProto, ValueInfoProto, TypeProto, TypeProto.Tensor, TensorShapeProto and its Dimension fields */
#define GRAPH_INPUT 11
#define GRAPH_OUTPUT 12
#define VALUE_NAME 1
#define VALUE_TYPE 2
#define TYPE_TENSOR 1
#define TENSOR_TYPE_ELEM_TYPE 1
#define TENSOR_TYPE_SHAPE 2
#define SHAPE_DIM 1
#define DIM_VALUE 1
#define DIM_PARAM 2

static const char *const safetensors_dtypes[] = {
    [1] = "F32", [2] = "U8",   [3] = "I8",  [4] = "U16",  [5] = "I16",  [6] = "I32", [7] = "I64",
    [9] = "BOOL", [10] = "F16", [11] = "F64", [12] = "U32", [13] = "U64", [16] = "BF16",
};

const char *onnx_safetensors_dtype(uint64_t data_type) {
  return data_type < sizeof safetensors_dtypes / sizeof *safetensors_dtypes ? safetensors_dtypes[data_type] : NULL;
}

struct walker {
  const uint8_t *data;
  struct onnx_summary *summary;     /* onnx_wire_summarize */
  struct onnx_interface *interface; /* onnx_wire_interface */
  char problem[160];                /* set on the first failure */
};

/* One field of a message: number, wire type, and the varint value or the payload's byte range. */
struct wire_field {
  uint64_t number;
  int wire_type;
  uint64_t value;
  size_t start, end;
};

static int fail(struct walker *w, const char *format, ...) EDGE_PRINTF(2, 3);

static int fail(struct walker *w, const char *format, ...) {
  if (w->problem[0] == '\0') {
    va_list args;
    va_start(args, format);
    vsnprintf(w->problem, sizeof w->problem, format, args);
    va_end(args);
  }
  return 0;
}

static int out_of_memory(struct walker *w) { return fail(w, "out of memory"); }

/* A varint at *at of the message ending at end: at most 10 bytes, the 10th 0 or 1 (64 bits). */
static int read_varint(struct walker *w, size_t *at, size_t end, uint64_t *value) {
  uint64_t result = 0;
  for (int shift = 0;; shift += 7) {
    if (*at >= end) return fail(w, "a varint runs past the end of its message (byte %zu)", *at);
    uint8_t byte = w->data[(*at)++];
    if (shift == 63 && byte > 1) return fail(w, "a varint is longer than 64 bits (byte %zu)", *at - 1);
    result |= (uint64_t)(byte & 0x7f) << shift;
    if (byte < 0x80) {
      *value = result;
      return 1;
    }
  }
}

/* The field at *at of the message ending at end; *at moves past it. */
static int next_field(struct walker *w, size_t *at, size_t end, struct wire_field *field) {
  uint64_t key = 0, length = 0;
  if (!read_varint(w, at, end, &key)) return 0;
  field->number = key >> 3;
  field->wire_type = (int)(key & 7);
  if (field->number == 0) return fail(w, "field number 0 at byte %zu", *at);
  switch (field->wire_type) {
    case WIRE_VARINT:
      field->start = field->end = 0;
      return read_varint(w, at, end, &field->value);
    case WIRE_FIXED64:
    case WIRE_FIXED32: {
      size_t width = field->wire_type == WIRE_FIXED64 ? 8 : 4;
      if (width > end - *at) return fail(w, "a fixed-width field runs past the end of its message (byte %zu)", *at);
      field->start = *at, field->end = *at + width;
      *at += width;
      return 1;
    }
    case WIRE_LENGTH:
      if (!read_varint(w, at, end, &length)) return 0;
      if (length > end - *at) {
        return fail(w, "a field of %llu bytes runs past the end of its message (byte %zu)", (unsigned long long)length, *at);
      }
      field->start = *at, field->end = *at + (size_t)length;
      *at += (size_t)length;
      return 1;
    default:
      return fail(w, "wire type %d (groups are not used by ONNX) at byte %zu", field->wire_type, *at);
  }
}

/* ---- TensorProto ---------------------------------------------------------------------------------------------- */

static int read_text(struct walker *w, const struct wire_field *field, struct wire_text *text) {
  for (size_t at = field->start; at < field->end;) {
    uint32_t code;
    size_t length = utf8_sequence(w->data + at, field->end - at, &code);
    if (length == 0) return fail(w, "a string field is not UTF-8 (byte %zu)", field->start);
    at += length;
  }
  *text = (struct wire_text){w->data + field->start, field->end - field->start, 1};
  return 1;
}

static int text_is(const struct wire_text *text, const char *expected) {
  return text->length == strlen(expected) && memcmp(text->data, expected, text->length) == 0;
}

/* A varint as protobuf's int64 (two's complement). */
static int64_t as_int64(uint64_t value) {
  return value >= (UINT64_C(1) << 63) ? -(int64_t)(~value) - 1 : (int64_t)value;
}

static int push_dim(struct walker *w, uint64_t value) {
  struct onnx_summary *s = w->summary;
  if (s->n_dims == s->dims_capacity) {
    size_t capacity = s->dims_capacity ? 2 * s->dims_capacity : 64;
    int64_t *grown = realloc(s->dims, capacity * sizeof *grown);
    if (grown == NULL) return out_of_memory(w);
    s->dims = grown, s->dims_capacity = capacity;
  }
  s->dims[s->n_dims++] = as_int64(value);
  return 1;
}

static int read_packed_dims(struct walker *w, const struct wire_field *field) {
  for (size_t at = field->start; at < field->end;) {
    uint64_t value = 0;
    if (!read_varint(w, &at, field->end, &value) || !push_dim(w, value)) return 0;
  }
  return 1;
}

/* One StringStringEntryProto of external_data: its last key and value ("" when absent) into the tensor. */
static int read_external_entry(struct walker *w, const struct wire_field *entry, struct onnx_external_tensor *tensor) {
  struct wire_text key = {w->data, 0, 1}, value = {w->data, 0, 1};
  struct wire_field field;
  for (size_t at = entry->start; at < entry->end;) {
    if (!next_field(w, &at, entry->end, &field)) return 0;
    if (field.wire_type != WIRE_LENGTH) continue;
    if (field.number == ENTRY_KEY && !read_text(w, &field, &key)) return 0;
    if (field.number == ENTRY_VALUE && !read_text(w, &field, &value)) return 0;
  }
  if (text_is(&key, "location")) tensor->location = value;
  if (text_is(&key, "offset")) tensor->offset = value;
  if (text_is(&key, "length")) tensor->length = value;
  return 1;
}

static int tensor_field(struct walker *w, const struct wire_field *field, struct onnx_external_tensor *tensor,
                        uint64_t *location) {
  if (field->wire_type == WIRE_LENGTH) {
    if (field->number == TENSOR_NAME) return read_text(w, field, &tensor->name);
    if (field->number == TENSOR_DIMS) return read_packed_dims(w, field);
    if (field->number == TENSOR_EXTERNAL_DATA) return read_external_entry(w, field, tensor);
  } else if (field->wire_type == WIRE_VARINT) {
    if (field->number == TENSOR_DATA_TYPE) tensor->data_type = field->value;
    if (field->number == TENSOR_DATA_LOCATION) *location = field->value;
    if (field->number == TENSOR_DIMS) return push_dim(w, field->value);
  }
  return 1;
}

static int add_external(struct walker *w, const struct onnx_external_tensor *tensor) {
  struct onnx_summary *s = w->summary;
  if (s->n_tensors == s->tensors_capacity) {
    size_t capacity = s->tensors_capacity ? 2 * s->tensors_capacity : 16;
    struct onnx_external_tensor *grown = realloc(s->tensors, capacity * sizeof *grown);
    if (grown == NULL) return out_of_memory(w);
    s->tensors = grown, s->tensors_capacity = capacity;
  }
  s->tensors[s->n_tensors++] = *tensor;
  return 1;
}

static int walk_tensor(struct walker *w, size_t start, size_t end) {
  struct onnx_external_tensor tensor = {.name = {w->data, 0, 1}, .first_dim = w->summary->n_dims};
  uint64_t location = 0;
  struct wire_field field;
  for (size_t at = start; at < end;) {
    if (!next_field(w, &at, end, &field) || !tensor_field(w, &field, &tensor, &location)) return 0;
  }
  if (location != ONNX_DATA_LOCATION_EXTERNAL) {
    w->summary->n_dims = tensor.first_dim; /* only external tensors keep their dims */
    return 1;
  }
  tensor.n_dims = w->summary->n_dims - tensor.first_dim;
  return add_external(w, &tensor);
}

/* ---- Messages ------------------------------------------------------------------------------------------------- */

static int child_message(enum message parent, uint64_t field, enum message *child) {
  for (size_t i = 0; i < sizeof message_fields / sizeof *message_fields; i++) {
    if (message_fields[i].parent == parent && message_fields[i].field == field) {
      *child = message_fields[i].child;
      return 1;
    }
  }
  return 0;
}

static int walk(struct walker *w, enum message kind, size_t start, size_t end, int depth) {
  if (depth > ONNX_MAX_MESSAGE_DEPTH) return fail(w, "messages nested deeper than %d levels", ONNX_MAX_MESSAGE_DEPTH);
  if (kind == MESSAGE_TENSOR) return walk_tensor(w, start, end);
  struct wire_field field;
  enum message child;
  for (size_t at = start; at < end;) {
    if (!next_field(w, &at, end, &field)) return 0;
    if (field.wire_type == WIRE_LENGTH && child_message(kind, field.number, &child) &&
        !walk(w, child, field.start, field.end, depth + 1)) {
      return 0;
    }
  }
  return 1;
}

static int walk_model(struct walker *w, size_t size) {
  struct onnx_summary *s = w->summary;
  struct wire_field field;
  for (size_t at = 0; at < size;) {
    if (!next_field(w, &at, size, &field)) return 0;
    if (field.number == MODEL_IR_VERSION && field.wire_type == WIRE_VARINT) s->ir_version = field.value;
    if (field.number == MODEL_OPSET_IMPORT && field.wire_type == WIRE_LENGTH) s->opset_imports++;
    if (field.number == MODEL_GRAPH && field.wire_type == WIRE_LENGTH) s->graphs++;
  }
  for (size_t at = 0; at < size;) {
    if (!next_field(w, &at, size, &field)) return 0;
    if (field.wire_type != WIRE_LENGTH) continue;
    enum message kind;
    if (field.number == MODEL_GRAPH) {
      kind = MESSAGE_GRAPH;
    } else if (field.number == MODEL_FUNCTIONS) {
      kind = MESSAGE_FUNCTION;
    } else if (field.number == MODEL_TRAINING_INFO) {
      kind = MESSAGE_TRAINING_INFO;
    } else {
      continue;
    }
    if (!walk(w, kind, field.start, field.end, 1)) return 0;
  }
  return 1;
}

edge_status onnx_wire_summarize(const uint8_t *data, size_t size, const char *where, struct onnx_summary *summary) {
  memset(summary, 0, sizeof *summary);
  struct walker w = {data, summary, NULL, ""};
  if (walk_model(&w, size)) return EDGE_OK;
  edge_status status = strcmp(w.problem, "out of memory") == 0 ? EDGE_ERROR_OUT_OF_MEMORY : EDGE_ERROR_BUNDLE;
  return edge_fail(status, "%s: not an ONNX model (%s)", where, w.problem);
}

void onnx_summary_free(struct onnx_summary *summary) {
  free(summary->tensors);
  free(summary->dims);
  memset(summary, 0, sizeof *summary);
}

/* ---- Graph inputs and outputs (graph_io.py read_interface) ------------------------------------------------- */

/* Room for `more` items of `size` bytes in *items (holding n of capacity). */
static int reserve(struct walker *w, void **items, size_t *capacity, size_t n, size_t more, size_t size,
                   size_t first) {
  if (more <= *capacity - n) return 1;
  size_t grown_capacity = *capacity ? *capacity : first;
  while (more > grown_capacity - n) {
    if (grown_capacity > SIZE_MAX / 2 / size) return out_of_memory(w);
    grown_capacity *= 2;
  }
  void *grown = realloc(*items, grown_capacity * size);
  if (grown == NULL) return out_of_memory(w);
  *items = grown, *capacity = grown_capacity;
  return 1;
}

/* A copy of text into the interface's strings, at *offset (room for one byte more: the strings of an interface
 * that keeps a value are never NULL, even when every one is empty). */
static int keep_text(struct walker *w, const struct wire_text *text, size_t *offset) {
  struct onnx_interface *f = w->interface;
  void *strings = f->text;
  if (text->length == SIZE_MAX) return out_of_memory(w);
  if (!reserve(w, &strings, &f->text_capacity, f->text_length, text->length + 1, 1, 256)) return 0;
  f->text = strings;
  if (text->length > 0) memcpy(f->text + f->text_length, text->data, text->length);
  *offset = f->text_length;
  f->text_length += text->length;
  return 1;
}

/* The bytes of the first `characters` characters of UTF-8 text. */
static size_t character_prefix(const struct wire_text *text, size_t characters) {
  size_t at = 0;
  for (size_t seen = 0; at < text->length; at++) {
    if ((text->data[at] & 0xc0) != 0x80 && seen++ == characters) break;
  }
  return at;
}

/* One TensorShapeProto.Dimension: the last dim_value or dim_param, "?" when it has neither. */
static int walk_dimension(struct walker *w, size_t start, size_t end) {
  static const uint8_t unknown[] = "?";
  struct wire_text symbol = {unknown, 1, 1};
  struct onnx_dim dim = {.is_symbol = 1};
  struct wire_field field;
  for (size_t at = start; at < end;) {
    if (!next_field(w, &at, end, &field)) return 0;
    if (field.number == DIM_VALUE && field.wire_type == WIRE_VARINT) {
      dim.is_symbol = 0, dim.size = as_int64(field.value);
    } else if (field.number == DIM_PARAM && field.wire_type == WIRE_LENGTH) {
      if (!read_text(w, &field, &symbol)) return 0;
      dim.is_symbol = 1;
    }
  }
  struct onnx_interface *f = w->interface;
  if (dim.is_symbol) {
    symbol.length = character_prefix(&symbol, ONNX_MAX_SYMBOL_CHARACTERS);
    if (!keep_text(w, &symbol, &dim.symbol)) return 0;
    dim.symbol_length = symbol.length;
  }
  void *dims = f->dims;
  if (!reserve(w, &dims, &f->dims_capacity, f->n_dims, 1, sizeof *f->dims, 64)) return 0;
  f->dims = dims;
  f->dims[f->n_dims++] = dim;
  return 1;
}

/* One TypeProto.Tensor into value (whose dims start at value->first_dim): its last elem_type (0 when absent) and
 * its last shape. */
static int walk_tensor_type(struct walker *w, size_t start, size_t end, struct onnx_value *value) {
  struct wire_field field, dim;
  value->tensor = 1, value->elem_type = 0, value->has_shape = 0;
  w->interface->n_dims = value->first_dim;
  for (size_t at = start; at < end;) {
    if (!next_field(w, &at, end, &field)) return 0;
    if (field.number == TENSOR_TYPE_ELEM_TYPE && field.wire_type == WIRE_VARINT) {
      value->elem_type = field.value;
    } else if (field.number == TENSOR_TYPE_SHAPE && field.wire_type == WIRE_LENGTH) {
      value->has_shape = 1;
      w->interface->n_dims = value->first_dim;
      for (size_t in = field.start; in < field.end;) {
        if (!next_field(w, &in, field.end, &dim)) return 0;
        if (dim.number == SHAPE_DIM && dim.wire_type == WIRE_LENGTH && !walk_dimension(w, dim.start, dim.end)) return 0;
      }
    }
  }
  return 1;
}

/* One ValueInfoProto, appended to values: its last name ("" when absent) and the tensor type of its last type. */
static int walk_value_info(struct walker *w, size_t start, size_t end, struct onnx_values *values) {
  struct onnx_interface *f = w->interface;
  struct onnx_value value = {.first_dim = f->n_dims};
  struct wire_text name = {w->data, 0, 1};
  struct wire_field field, kind;
  for (size_t at = start; at < end;) {
    if (!next_field(w, &at, end, &field)) return 0;
    if (field.number == VALUE_NAME && field.wire_type == WIRE_LENGTH) {
      if (!read_text(w, &field, &name)) return 0;
    } else if (field.number == VALUE_TYPE && field.wire_type == WIRE_LENGTH) {
      value.tensor = 0, value.elem_type = 0, value.has_shape = 0;
      f->n_dims = value.first_dim;
      for (size_t in = field.start; in < field.end;) {
        if (!next_field(w, &in, field.end, &kind)) return 0;
        if (kind.number != TYPE_TENSOR || kind.wire_type != WIRE_LENGTH) continue;
        if (!walk_tensor_type(w, kind.start, kind.end, &value)) return 0;
      }
    }
  }
  if (!value.has_shape) f->n_dims = value.first_dim;
  value.rank = f->n_dims - value.first_dim;
  if (!keep_text(w, &name, &value.name)) return 0;
  value.name_length = name.length;
  void *items = values->items;
  if (!reserve(w, &items, &values->capacity, values->n, 1, sizeof *values->items, 16)) return 0;
  values->items = items;
  values->items[values->n++] = value;
  return 1;
}

static int walk_interface(struct walker *w, size_t size) {
  struct wire_field field, member;
  for (size_t at = 0; at < size;) {
    if (!next_field(w, &at, size, &field)) return 0;
    if (field.number != MODEL_GRAPH || field.wire_type != WIRE_LENGTH) continue;
    for (size_t in = field.start; in < field.end;) {
      if (!next_field(w, &in, field.end, &member)) return 0;
      if (member.wire_type != WIRE_LENGTH || (member.number != GRAPH_INPUT && member.number != GRAPH_OUTPUT)) continue;
      struct onnx_values *values = member.number == GRAPH_INPUT ? &w->interface->inputs : &w->interface->outputs;
      if (!walk_value_info(w, member.start, member.end, values)) return 0;
    }
  }
  return 1;
}

edge_status onnx_wire_interface(const uint8_t *data, size_t size, const char *where, struct onnx_interface *interface) {
  memset(interface, 0, sizeof *interface);
  struct walker w = {data, NULL, interface, ""};
  if (walk_interface(&w, size)) return EDGE_OK;
  edge_status status = strcmp(w.problem, "out of memory") == 0 ? EDGE_ERROR_OUT_OF_MEMORY : EDGE_ERROR_BUNDLE;
  return edge_fail(status, "%s: not an ONNX model (%s)", where, w.problem);
}

void onnx_interface_free(struct onnx_interface *interface) {
  free(interface->inputs.items);
  free(interface->outputs.items);
  free(interface->dims);
  free(interface->text);
  memset(interface, 0, sizeof *interface);
}
