/* Runs the quantized CPU kernels (or, for format EDGE_F16, the fp16 ones) on one case read from a file and writes
 * their outputs, so that a cross-built (aarch64) kernel library can be checked under qemu against the Python
 * reference (test_cpu_kernel_builds.py).
 *
 * input:  int32 d, D, format, group_size, activation, asymmetric, down_format; float act_threshold; float x[d]; for
 *         gate, up, down_t: the codes [D, row bytes] (down_t's in down_format: format, or EDGE_Q8 under EDGE_Q4),
 *         the fp16 scales [D, d / group_size], and with asymmetric != 0 the fp16 minimums [D, d / group_size] of each
 *         int4 matrix (format EDGE_F16: the fp16 values [D, d] alone); uint8 mask[D]
 * output: for threads 1, 2, 4: float y[d] of edge_cpu_sparse_ffn_q (edge_cpu_sparse_ffn), uint8 active[D];
 *         for threads 1, 4: float gate_x[D] of edge_cpu_matvec_q (edge_cpu_matvec) on the gate matrix;
 *         format EDGE_F16 only: float z[SVD_RANK] = x B^T and uint8 mask[D] of edge_cpu_svd_predictor_f16, with the
 *         gate matrix's first SVD_RANK * D halves as A^T [SVD_RANK, D] and up's first SVD_RANK rows as B;
 *         quantized formats only, for a block of TOKEN_BLOCK tokens (token t's x: x rotated by 7 t values, times
 *         (-1/2)^t): float y[TOKEN_BLOCK, d] of edge_cpu_ffn_tokens (2 threads), then each token's y[d] of
 *         edge_cpu_sparse_ffn_q without a mask (1 thread), float y[TOKEN_BLOCK, D] of edge_cpu_matmuls on the gate
 *         matrix (2 threads), then each token's y[D] of edge_cpu_matvec_q (1 thread): a block's kernels and the
 *         one-token kernels, which must give the same bytes
 * stdout: the instruction set the kernels ran (edge_cpu_isa); with EDGE_SDK_CPU_ISA naming kernels the library or the
 *         CPU does not have, the reason on stderr and exit status 4, before anything runs
 *
 * With INPUT "--attention", edge_cpu_attention on the ATTENTION_CASES below, inputs from a fixed xorshift generator:
 * for each case its int32 n_heads, n_kv_heads, head_dim, first, pos, key_tiles, then float q [n_heads * head_dim],
 * keys [n_kv_heads, key_tiles, head_dim, 16] (NaN past pos: read, never used), values [pos + 1, n_kv_heads * head_dim],
 * then for threads 1 and 4: out [n_heads * head_dim] and the weights [n_heads, pos + 1 - first]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_cpu_kernels.h"

/* Not a multiple of the predictor's 4 or 8 factor rows per step: its remainder loops run too. */
#define SVD_RANK 37
/* Tokens of the block kernels' check: AVX-512 dots a row with 4 tokens at once, NEON with 2, then one at a time. */
#define TOKEN_BLOCK 5

/* The block kernels on TOKEN_BLOCK tokens derived from x, then the one-token kernels on each (see the top). */
static int check_token_block(FILE *output, const float *x, int d, int D, void *const *codes, uint16_t *const *scales,
                             uint16_t *const *mins, int format, int down_format, int group_size, int activation,
                             float act_threshold, void *workspace) {
  int width = d > D ? d : D;
  float *xs = malloc((size_t)TOKEN_BLOCK * (size_t)d * sizeof(float));
  float *ys = malloc((size_t)TOKEN_BLOCK * (size_t)width * sizeof(float));
  uint8_t *active = malloc((size_t)D);
  void *block_workspace = malloc(edge_cpu_ffn_tokens_workspace_size(d, D, TOKEN_BLOCK));
  if (xs == NULL || ys == NULL || active == NULL || block_workspace == NULL) return 3;
  float factor = 1.0f;
  for (int t = 0; t < TOKEN_BLOCK; t++, factor *= -0.5f) {
    for (int j = 0; j < d; j++) xs[(size_t)t * (size_t)d + (size_t)j] = x[(j + 7 * t) % d] * factor;
  }
  if (edge_cpu_ffn_tokens(xs, TOKEN_BLOCK, d, D, codes[0], scales[0], mins[0], codes[1], scales[1], mins[1], codes[2],
                          scales[2], mins[2], format, down_format, group_size, activation, act_threshold, ys,
                          block_workspace, 2) != EDGE_CPU_OK) {
    return 3;
  }
  fwrite(ys, sizeof(float), (size_t)TOKEN_BLOCK * (size_t)d, output);
  for (int t = 0; t < TOKEN_BLOCK; t++) {
    if (edge_cpu_sparse_ffn_q(xs + (size_t)t * (size_t)d, d, D, codes[0], scales[0], mins[0], codes[1], scales[1],
                              mins[1], codes[2], scales[2], mins[2], format, down_format, group_size, NULL, NULL,
                              activation, act_threshold, ys, workspace, 1, active) != EDGE_CPU_OK) {
      return 3;
    }
    fwrite(ys, sizeof(float), (size_t)d, output);
  }
  struct edge_cpu_matrix gate = {codes[0], scales[0], mins[0], format, group_size, D, NULL, ys};
  if (edge_cpu_matmuls(xs, TOKEN_BLOCK, d, &gate, 1, 2) != EDGE_CPU_OK) return 3;
  fwrite(ys, sizeof(float), (size_t)TOKEN_BLOCK * (size_t)D, output);
  for (int t = 0; t < TOKEN_BLOCK; t++) {
    if (edge_cpu_matvec_q(xs + (size_t)t * (size_t)d, d, D, codes[0], scales[0], mins[0], format, group_size, NULL,
                          ys, 1) != EDGE_CPU_OK) {
      return 3;
    }
    fwrite(ys, sizeof(float), (size_t)D, output);
  }
  free(xs);
  free(ys);
  free(active);
  free(block_workspace);
  return 0;
}

static void *read_array(FILE *file, size_t bytes) {
  void *data = malloc(bytes);
  if (data == NULL || fread(data, 1, bytes, file) != bytes) {
    fprintf(stderr, "input ended before %zu more bytes\n", bytes);
    exit(2);
  }
  return data;
}

/* n_heads, n_kv_heads, head_dim, first, pos: AVX-512's blocks of four heads with a pair left over, a ragged head
 * dimension (72 = 64 + 8, 40 = 32 + 8), a sliding window's first position, enough work for several threads. */
static const int ATTENTION_CASES[][5] = {{8, 2, 72, 0, 199}, {6, 3, 40, 37, 100}, {5, 5, 16, 0, 3}};

static float next_value(uint32_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return (float)(*state >> 8) / 8388608.0f - 1.0f; /* [-1, 1) in steps of 2^-23 */
}

static int check_attention(const char *path) {
  FILE *output = fopen(path, "wb");
  if (output == NULL) return 2;
  uint32_t state = 2463534242u;
  for (size_t c = 0; c < sizeof ATTENTION_CASES / sizeof ATTENTION_CASES[0]; c++) {
    int n_heads = ATTENTION_CASES[c][0], n_kv = ATTENTION_CASES[c][1], hd = ATTENTION_CASES[c][2];
    int first = ATTENTION_CASES[c][3], pos = ATTENTION_CASES[c][4];
    int key_tiles = pos / 16 + 2, positions = pos + 1;
    size_t kv_dim = (size_t)n_kv * (size_t)hd, key_floats = kv_dim * (size_t)key_tiles * 16;
    float *q = malloc((size_t)n_heads * (size_t)hd * sizeof(float));
    float *keys = malloc(key_floats * sizeof(float));
    float *values = malloc((size_t)positions * kv_dim * sizeof(float));
    float *out = malloc((size_t)n_heads * (size_t)hd * sizeof(float));
    float *scores = malloc((size_t)n_heads * (size_t)positions * sizeof(float));
    for (int i = 0; i < n_heads * hd; i++) q[i] = next_value(&state);
    for (size_t i = 0; i < key_floats; i++) { /* position (tile) * 16 + (lane): tile i / (16 hd) % key_tiles */
      int position = (int)(i / (16 * (size_t)hd) % (size_t)key_tiles) * 16 + (int)(i % 16);
      keys[i] = position <= pos ? next_value(&state) : NAN;
    }
    for (size_t i = 0; i < (size_t)positions * kv_dim; i++) values[i] = next_value(&state);
    int32_t header[6] = {n_heads, n_kv, hd, first, pos, key_tiles};
    fwrite(header, sizeof header[0], 6, output);
    fwrite(q, sizeof(float), (size_t)n_heads * (size_t)hd, output);
    fwrite(keys, sizeof(float), key_floats, output);
    fwrite(values, sizeof(float), (size_t)positions * kv_dim, output);
    const int threads[] = {1, 4};
    for (int t = 0; t < 2; t++) {
      if (edge_cpu_attention(q, n_heads, n_kv, hd, keys, (size_t)key_tiles, values, first, pos, scores,
                             (size_t)positions, out, threads[t]) != EDGE_CPU_OK) {
        return 3;
      }
      fwrite(out, sizeof(float), (size_t)n_heads * (size_t)hd, output);
      for (int h = 0; h < n_heads; h++) {
        fwrite(scores + (size_t)h * (size_t)positions + first, sizeof(float), (size_t)(positions - first), output);
      }
    }
    free(q);
    free(keys);
    free(values);
    free(out);
    free(scores);
  }
  printf("%s\n", edge_cpu_isa());
  return fclose(output) == 0 ? 0 : 2;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s INPUT OUTPUT\n", argv[0]);
    return 2;
  }
  if (edge_cpu_isa_error() != NULL) {
    fprintf(stderr, "%s\n", edge_cpu_isa_error());
    return 4;
  }
  if (strcmp(argv[1], "--attention") == 0) return check_attention(argv[2]);
  FILE *input = fopen(argv[1], "rb");
  if (input == NULL) return 2;
  int32_t *header = read_array(input, 7 * sizeof(int32_t));
  int d = header[0], D = header[1], format = header[2], group_size = header[3], activation = header[4];
  int asymmetric = header[5], down_format = header[6];
  float *act_threshold = read_array(input, sizeof(float));
  float *x = read_array(input, (size_t)d * sizeof(float));
  int fp16 = format == EDGE_F16;
  size_t scale_count = fp16 ? 0 : (size_t)D * (size_t)(d / group_size);
  void *codes[3];
  uint16_t *scales[3] = {NULL, NULL, NULL}, *mins[3] = {NULL, NULL, NULL};
  for (int m = 0; m < 3; m++) {
    int matrix_format = m == 2 ? down_format : format;
    size_t row_bytes = fp16 ? 2 * (size_t)d : matrix_format == EDGE_Q8 ? (size_t)d : (size_t)d / 2;
    codes[m] = read_array(input, (size_t)D * row_bytes);
    if (!fp16) scales[m] = read_array(input, scale_count * sizeof(uint16_t));
    if (asymmetric && matrix_format == EDGE_Q4) mins[m] = read_array(input, scale_count * sizeof(uint16_t));
  }
  uint8_t *mask = read_array(input, (size_t)D);
  fclose(input);

  FILE *output = fopen(argv[2], "wb");
  if (output == NULL) return 2;
  void *workspace = malloc(edge_cpu_sparse_ffn_workspace_size(d, D, 4));
  float *y = malloc((size_t)(d > D ? d : D) * sizeof(float));
  uint8_t *active = malloc((size_t)D);
  const int ffn_threads[] = {1, 2, 4}, matvec_threads[] = {1, 4};
  for (int t = 0; t < 3; t++) {
    int status = fp16 ? edge_cpu_sparse_ffn(x, d, D, codes[0], codes[1], codes[2], EDGE_F16, mask, NULL, activation,
                                            *act_threshold, y, workspace, ffn_threads[t], active)
                      : edge_cpu_sparse_ffn_q(x, d, D, codes[0], scales[0], mins[0], codes[1], scales[1], mins[1],
                                              codes[2], scales[2], mins[2], format, down_format, group_size, mask,
                                              NULL, activation, *act_threshold, y, workspace, ffn_threads[t], active);
    if (status != EDGE_CPU_OK) return 3;
    fwrite(y, sizeof(float), (size_t)d, output);
    fwrite(active, 1, (size_t)D, output);
  }
  for (int t = 0; t < 2; t++) {
    int status = fp16 ? edge_cpu_matvec(x, d, D, codes[0], EDGE_F16, NULL, y, matvec_threads[t])
                      : edge_cpu_matvec_q(x, d, D, codes[0], scales[0], mins[0], format, group_size, NULL, y,
                                          matvec_threads[t]);
    if (status != EDGE_CPU_OK) return 3;
    fwrite(y, sizeof(float), (size_t)D, output);
  }
  if (!fp16) {
    int status = check_token_block(output, x, d, D, codes, scales, mins, format, down_format, group_size, activation,
                                   *act_threshold, workspace);
    if (status != 0) return status;
  }
  if (fp16) {
    float z[SVD_RANK];
    if (edge_cpu_svd_predictor_f16(x, d, D, SVD_RANK, codes[0], codes[1], NULL, active, z) != EDGE_CPU_OK) return 3;
    fwrite(z, sizeof(float), SVD_RANK, output);
    fwrite(active, 1, (size_t)D, output);
  }
  printf("%s\n", edge_cpu_isa());
  return fclose(output) == 0 ? 0 : 2;
}
