/* Generated from edge_sdk/predictors by `python -m edge_sdk.predictors.c_table jetson/src`; do not edit. */
#include "predictor_kinds.h"

const struct predictor_kind_spec predictor_kind_specs[PREDICTOR_KINDS] = {
    [PREDICTOR_SVD] = {"svd", 1, 4,
        {{"a", DTYPE_F32, 1, 2, {{DIM_INTERMEDIATE, 0}, {DIM_RANK, 0}}},
         {"b", DTYPE_F32, 1, 2, {{DIM_RANK, 0}, {DIM_HIDDEN, 0}}},
         {"biases", DTYPE_F32, 0, 2, {{DIM_LEVELS, 0}, {DIM_INTERMEDIATE, 0}}},
         {"capacity", DTYPE_I32, 0, 1, {{DIM_LEVELS, 0}}}}},
    [PREDICTOR_SIGNBIT] = {"signbit", 0, 3,
        {{"packed", DTYPE_I32, 0, 2, {{DIM_INTERMEDIATE, 0}, {DIM_WORDS, 0}}},
         {"alpha", DTYPE_F32, 0, 1, {{DIM_FIXED, 1}}},
         {"capacity", DTYPE_I32, 0, 1, {{DIM_FIXED, 1}}}}},
    [PREDICTOR_CORE] = {"core", 0, 1,
        {{"capacity", DTYPE_I32, 0, 1, {{DIM_FIXED, 1}}}}},
    [PREDICTOR_THRESHOLD] = {"threshold", 1, 2,
        {{"thresholds", DTYPE_F32, 0, 2, {{DIM_LEVELS, 0}, {DIM_INTERMEDIATE, 0}}},
         {"capacity", DTYPE_I32, 0, 1, {{DIM_LEVELS, 0}}}}},
    [PREDICTOR_NONE] = {"none", 0, 0},
};
