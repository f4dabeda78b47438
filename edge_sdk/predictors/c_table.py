"""The C runtime's predictor kind table, generated from the registry (edge_sdk.predictors.KINDS).

    python -m edge_sdk.predictors.c_table jetson/src

writes jetson/src/predictor_kinds.h and predictor_kinds.c; tests/bundle/test_predictor_kinds.py fails when the
committed files differ from what this writes, so a kind, a tensor or a shape changed here reaches the C reader's
manifest and layout checks (config.c, layout.c) by regenerating, never by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

from edge_sdk.predictors import KINDS

HEADER_NAME = "predictor_kinds.h"
SOURCE_NAME = "predictor_kinds.c"
# symbols of StoredTensor.shape -> the C enum predictor_dim
DIMENSIONS = {
    "d": "DIM_HIDDEN",
    "D": "DIM_INTERMEDIATE",
    "levels": "DIM_LEVELS",
    "rank": "DIM_RANK",
    "words": "DIM_WORDS",
}
DTYPES = {"F32": "DTYPE_F32", "I32": "DTYPE_I32"}
GENERATED = (
    "/* Generated from edge_sdk/predictors by `python -m edge_sdk.predictors.c_table jetson/src`; do not edit. */"
)


def _enum_name(kind: str) -> str:
    return f"PREDICTOR_{kind.upper()}"


def _max_tensors() -> int:
    return max(len(kind.tensors) for kind in KINDS.values())


def header() -> str:
    kinds = ", ".join(_enum_name(name) for name in KINDS)
    return f"""{GENERATED}
#ifndef EDGE_SDK_PREDICTOR_KINDS_H
#define EDGE_SDK_PREDICTOR_KINDS_H

#include <stdint.h>

#include "safetensors.h"

enum predictor_kind {{ {kinds} }};
#define PREDICTOR_KINDS {len(KINDS)}
#define PREDICTOR_MAX_TENSORS {_max_tensors()}

/* A stored tensor's dimension: a fixed size, or one of the bundle's sizes (d, D, levels, the layer's svd rank,
 * words = ceil(d / 32)). */
enum predictor_dim {{ DIM_FIXED, {", ".join(DIMENSIONS.values())} }};

struct predictor_dim_spec {{
  enum predictor_dim symbol;
  int64_t size; /* DIM_FIXED only */
}};

/* One tensor a kind stores per layer, as "layers.{{i}}.{{kind}}.{{name}}". factor: a low-rank factor, stored in the
 * bundle's predictor factor dtype (F16 in bundles of format version 5 on whose weights are not fp32) instead of
 * dtype. */
struct predictor_tensor_spec {{
  const char *name;
  enum tensor_dtype dtype;
  int factor;
  int rank;
  struct predictor_dim_spec shape[2];
}};

struct predictor_kind_spec {{
  const char *name;
  int has_levels; /* calibrated at several model-wide sparsity levels, one row per level */
  int n_tensors;
  struct predictor_tensor_spec tensors[PREDICTOR_MAX_TENSORS];
}};

extern const struct predictor_kind_spec predictor_kind_specs[PREDICTOR_KINDS];

#endif
"""


def _dimension(symbol: str | int) -> str:
    if isinstance(symbol, int):
        return f"{{DIM_FIXED, {symbol}}}"
    return f"{{{DIMENSIONS[symbol]}, 0}}"


def source() -> str:
    entries = []
    for name, kind in KINDS.items():
        tensors = []
        for tensor in kind.tensors:
            if not 1 <= len(tensor.shape) <= 2:
                raise ValueError(f"predictor {name}: tensor {tensor.name} has rank {len(tensor.shape)}; C reads 1 or 2")
            shape = ", ".join(_dimension(symbol) for symbol in tensor.shape)
            tensors.append(
                f'{{"{tensor.name}", {DTYPES[tensor.dtype]}, {int(tensor.factor)}, {len(tensor.shape)}, {{{shape}}}}}'
            )
        listed = ",\n         ".join(tensors)
        body = f",\n        {{{listed}}}" if tensors else ""
        entries.append(f'    [{_enum_name(name)}] = {{"{name}", {int(kind.has_levels)}, {len(tensors)}{body}}},')
    table = "\n".join(entries)
    return f"""{GENERATED}
#include "{HEADER_NAME}"

const struct predictor_kind_spec predictor_kind_specs[PREDICTOR_KINDS] = {{
{table}
}};
"""


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 1 or not Path(arguments[0]).is_dir():
        print("usage: python -m edge_sdk.predictors.c_table DIRECTORY (jetson/src)", file=sys.stderr)
        return 2
    directory = Path(arguments[0])
    (directory / HEADER_NAME).write_text(header())
    (directory / SOURCE_NAME).write_text(source())
    return 0


if __name__ == "__main__":
    sys.exit(main())
