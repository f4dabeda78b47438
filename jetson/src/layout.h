/* Which tensors a bundle holds (edge_sdk/bundle/layout.py with the predictor tensors of edge_sdk/predictors), and
 * the check that manifest.json declares exactly those:
 * - model tensors under their Hugging Face names without "model.", W_down stored as mlp.down_proj.weight_t [D, d];
 *   matrices in the bundle's weight dtype, vectors (norms, biases) in F32, rope.cos / rope.sin [max_seq_len,
 *   head_dim] in F32;
 * - per layer i the predictor's layers.{i}.{kind}.{name}: svd a [D, rank], b [rank, d] (the factors: F16 or F32,
 *   below), biases [levels, D],
 *   capacity I32 [levels]; signbit packed I32 [D, ceil(d / 32)], alpha [1], capacity I32 [1]; core capacity I32
 *   [1]; threshold thresholds [levels, D], capacity I32 [levels]; none nothing. An svd layer's rank is read from
 *   its declared svd.a, 1 <= rank <= min(d, D). */
#ifndef EDGE_LAYOUT_H
#define EDGE_LAYOUT_H

#include <cjson/cJSON.h>

#include "config.h"
#include "edge_sdk.h"
#include "safetensors.h"

/* manifest "tensors" (name -> {dtype, shape}) must be exactly the tensors above; where: "BUNDLE/manifest.json:
 * tensors". weight_dtype I8 / U8 with group_size > 0: an int8 / int4 bundle (edge_sdk/bundle/layout.py): every
 * matrix holds its codes, I8 [rows, cols] or U8 [rows, cols / 2], under its name and F16 scales
 * [rows, cols / group_size] as <name>.scales, except embed_tokens.weight of an untied model (F16); the LM head
 * (lm_head.weight, or a tied embed_tokens.weight) holds codes of head_dtype (weight_dtype, or I8 in an int4 bundle
 * whose manifest says head_dtype int8), each layer's mlp.down_proj.weight_t codes of down_dtype (weight_dtype, or I8
 * in an int4 bundle whose manifest says down_dtype int8); asymmetric: every int4 (U8) matrix also holds F16 group
 * minimums [rows, cols / group_size] as <name>.mins. The predictor's low-rank factors (svd a, b) are factor_dtype (F16
 * or F32); a factor of the right shape declared in the other dtype is refused naming factor_rule (why the factors have
 * their dtype). */
edge_status layout_check_tensors(const cJSON *tensors, const struct model_config *config, enum tensor_dtype weight_dtype,
                                 enum tensor_dtype head_dtype, enum tensor_dtype down_dtype, int group_size,
                                 int asymmetric, int max_seq_len, const struct sparsity_settings *sparsity,
                                 enum tensor_dtype factor_dtype, const char *factor_rule, const char *where);

#endif
