/* Driver for benchmarks/aarch64_instruction_count.py: calls one quantized kernel of libedge_cpu_kernels CALLS times
 * on fixed pseudo-random data (no timing: qemu counts the instructions). d = D = 1024, group size 32, one thread.
 *
 *   aarch64_instruction_count KIND CALLS
 *   KIND: matvec4 | matvec8 | ffn4 | ffn8 | matmul4 | matmul8, with a trailing "a" for asymmetric int4 rows
 *   (matvec4a, ffn4a, matmul4a), or matvec16 | ffn16 for fp16 rows; ffn: the sparse FFN (SiLU, a mask of about 10% of
 *   the neurons), matvec: edge_cpu_matvec_q (edge_cpu_matvec for fp16), matmul: edge_cpu_matmuls on a block of
 *   TOKENS tokens (a prompt's projection); or svd16: the SVD predictor with fp16 factors of rank 64. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_cpu_kernels.h"

enum { D_MODEL = 1024, NEURONS = 1024, GROUP = 32, RANK = 64, TOKENS = 8 };

static uint32_t state = 1;
static uint32_t next_random(void) { /* xorshift32: cheap, so the setup adds few instructions to the count */
  state ^= state << 13;
  state ^= state >> 17;
  state ^= state << 5;
  return state;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s matvec4|matvec8|ffn4|ffn8|matmul4|matmul8[a]|matvec16|ffn16|svd16 CALLS\n", argv[0]);
    return 2;
  }
  const char *kind = argv[1];
  int calls = atoi(argv[2]);
  int fp16 = strstr(kind, "16") != NULL, int4 = !fp16 && strchr(kind, '4') != NULL;
  int asymmetric = kind[strlen(kind) - 1] == 'a', ffn = strncmp(kind, "ffn", 3) == 0;
  int matmul = strncmp(kind, "matmul", 6) == 0;
  size_t row_bytes = fp16 ? 2 * D_MODEL : int4 ? D_MODEL / 2 : D_MODEL, groups = (size_t)NEURONS * D_MODEL / GROUP;
  uint8_t *codes[3];
  uint16_t *scales[3], *mins[3];
  for (int m = 0; m < 3; m++) {
    codes[m] = malloc(row_bytes * NEURONS);
    scales[m] = malloc(groups * sizeof(uint16_t));
    mins[m] = malloc(groups * sizeof(uint16_t));
    for (size_t i = 0; i < row_bytes * NEURONS; i++) codes[m][i] = (uint8_t)next_random();
    for (size_t i = 0; fp16 && i < (size_t)D_MODEL * NEURONS; i++) { /* finite halves of magnitude below 2 */
      ((uint16_t *)codes[m])[i] = (uint16_t)(next_random() % 0x4000) | (uint16_t)(next_random() & 0x8000);
    }
    for (size_t i = 0; i < groups; i++) {
      scales[m][i] = (uint16_t)(0x2000 + next_random() % 0x400); /* small positive halves */
      mins[m][i] = (uint16_t)(0xa000 + next_random() % 0x400);   /* small negative ones */
    }
  }
  float *x = malloc(TOKENS * D_MODEL * sizeof(float)), *y = malloc(TOKENS * NEURONS * sizeof(float));
  uint8_t *mask = malloc(NEURONS);
  for (int i = 0; i < TOKENS * D_MODEL; i++) x[i] = (float)((int)(next_random() % 2001) - 1000) / 1000.0f;
  for (int i = 0; i < NEURONS; i++) mask[i] = next_random() % 10 == 0;
  void *workspace = malloc(edge_cpu_sparse_ffn_workspace_size(D_MODEL, NEURONS, 1));
  int format = int4 ? EDGE_Q4 : EDGE_Q8;
#define MINS(m) (asymmetric ? mins[m] : NULL)
  for (int c = 0; c < calls; c++) {
    int status;
    if (strcmp(kind, "svd16") == 0) { /* the first RANK rows of two fp16 matrices as a_t [RANK, D] and b [RANK, d] */
      status = edge_cpu_svd_predictor_f16(x, D_MODEL, NEURONS, RANK, (const uint16_t *)codes[0],
                                          (const uint16_t *)codes[1], NULL, mask, y);
    } else if (fp16) {
      status = ffn ? edge_cpu_sparse_ffn(x, D_MODEL, NEURONS, codes[0], codes[1], codes[2], EDGE_F16, mask, NULL,
                                         EDGE_ACT_SILU, 0.0f, y, workspace, 1, NULL)
                   : edge_cpu_matvec(x, D_MODEL, NEURONS, codes[0], EDGE_F16, NULL, y, 1);
    } else if (matmul) {
      struct edge_cpu_matrix matrix = {codes[0], scales[0], MINS(0), format, GROUP, NEURONS, NULL, y};
      status = edge_cpu_matmuls(x, TOKENS, D_MODEL, &matrix, 1, 1);
    } else {
      status = ffn ? edge_cpu_sparse_ffn_q(x, D_MODEL, NEURONS, codes[0], scales[0], MINS(0), codes[1], scales[1],
                                           MINS(1), codes[2], scales[2], MINS(2), format, format, GROUP, mask, NULL,
                                           EDGE_ACT_SILU, 0.0f, y, workspace, 1, NULL)
                   : edge_cpu_matvec_q(x, D_MODEL, NEURONS, codes[0], scales[0], MINS(0), format, GROUP, NULL, y, 1);
    }
    if (status != EDGE_CPU_OK) {
      fprintf(stderr, "kernel call failed: %d\n", status);
      return 1;
    }
  }
#undef MINS
  printf("%a\n", y[0]); /* the result is used */
  return 0;
}
