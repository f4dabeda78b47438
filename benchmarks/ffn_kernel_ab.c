/* A/B of builds of the CPU kernel library (libedge_cpu_kernels.so) on the sparse FFN over quantized rows, call by
 * call in one process: each round calls every library once, in turn, each call after the caches are flushed by
 * reading 256 MiB, so that load from other processes falls on all of them alike (alternating whole `edge-sdk bench
 * ffn` runs between builds left ratios that moved 3x between runs on the shared machine). LLaMA-2-7B FFN shape (d
 * 4096, D 11008) unless SHAPE=dxD gives another (576x1536: SmolLM2-135M's), group size 32, random codes and fp16
 * scales, SiLU so that every neuron of the mask is active; the mask has the given sparsity. With MATVEC=1 each call
 * is instead the dense matvec (edge_cpu_matvec_q) of the first matrix, D rows of d values, as a decode step's
 * projections and LM head call it (SPARSITY must be 0); with SVD=RANK, the SVD predictor (edge_cpu_svd_predictor) of
 * rank RANK over the shape, fp32 factors (fp16 with SVD_F16=1: edge_cpu_svd_predictor_f16), OMP_NUM_THREADS threads
 * (SPARSITY must be 0). MASK=hot-first | hot-shuffled draws the mask from per-neuron firing rates that fall as a
 * power law of the neuron's rank (rank^-0.8, capped at 0.9, mean 1 - SPARSITY: make_synthetic_checkpoint.py's),
 * the same draws for both, the ranks in neuron order (PowerInfer's hot neurons first) or shuffled; without it every
 * neuron is active with probability 1 - SPARSITY. ASYMMETRIC=1 (int4 only) gives the rows random fp16 group
 * minimums too (asymmetric int4, QUANT.md); DOWN_INT8=1 (int4 only) stores the down rows as int8 codes, without
 * minimums (an int4 bundle of down_dtype int8). Prints per library the median and minimum time and the rate at which
 * it reads the active rows' codes and scales (gate, up and down; the matrix's for MATVEC), and says when a
 * library's output differs in any bit from the first library's.
 *
 *   gcc -O2 -fopenmp -o /tmp/ffn_kernel_ab benchmarks/ffn_kernel_ab.c -ldl -lm
 *   [THREADS=2] [SHAPE=576x1536] [MATVEC=1 | SVD=224 [SVD_F16=1]] [MASK=hot-first|hot-shuffled] \
 *       [ASYMMETRIC=1] [DOWN_INT8=1] \
 *       /tmp/ffn_kernel_ab int4|int8 \
 *       SPARSITY ROUNDS \
 *       LIB.so [LIB.so ...]
 *
 * Libraries of other commits: build them from `git archive COMMIT kernels/cpu` (`plugins/kernels/cpu` before the
 * folder moved) with the package's flags
 * (gcc -std=c11 -O3 -march=native -fopenmp -shared -fPIC ... -lm); those from before edge_cpu_sparse_ffn_q took
 * down_format need this file of their commit (one argument fewer). */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*sparse_ffn_q_fn)(const float *, int, int, const void *, const uint16_t *, const uint16_t *,
                               const void *, const uint16_t *, const uint16_t *, const void *, const uint16_t *,
                               const uint16_t *, int, int, int, const uint8_t *, const float *, int, float,
                               float *, void *, int, uint8_t *);
typedef size_t (*workspace_size_fn)(int, int, int);
typedef int (*svd_predictor_fn)(const float *, int, int, int, const float *, const float *, const float *, uint8_t *,
                                float *);
typedef int (*svd_predictor_f16_fn)(const float *, int, int, int, const uint16_t *, const uint16_t *, const float *,
                                    uint8_t *, float *);
typedef int (*matvec_q_fn)(const float *, int, int, const void *, const uint16_t *, const uint16_t *, int, int,
                           const float *, float *, int);

enum { GROUP = 32, MAX_LIBRARIES = 8, Q8 = 2, Q4 = 3, ACT_SILU = 3 };
#define FLUSH_BYTES ((size_t)256 << 20)

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { POWER_LAW_ITERATIONS = 100 };
#define FIRING_RATE_EXPONENT 0.8
#define MAX_FIRING_RATE 0.9

/* mask[i] for MASK=hot-first (hot_first 1) or hot-shuffled: rank k fires with c (k + 1)^-exponent, capped, c
 * bisected so that the rates' mean is 1 - sparsity; rank k is neuron k, or neuron order[k] of a shuffle drawn first
 * in both modes, so that the two masks differ only in where the ranks sit. Returns the active count. */
static int power_law_mask(int D, double sparsity, int hot_first, uint8_t *mask) {
  int *order = malloc(sizeof(int) * (size_t)D);
  for (int k = 0; k < D; k++) order[k] = k;
  for (int k = D - 1; k > 0; k--) {
    int j = rand() % (k + 1), swap = order[k];
    order[k] = order[j];
    order[j] = swap;
  }
  double low = 0.0, high = 1e6;
  for (int iteration = 0; iteration < POWER_LAW_ITERATIONS; iteration++) {
    double c = (low + high) / 2, total = 0.0;
    for (int k = 0; k < D; k++) total += fmin(c * pow(k + 1, -FIRING_RATE_EXPONENT), MAX_FIRING_RATE);
    if (total / D < 1.0 - sparsity) low = c;
    else high = c;
  }
  int active = 0;
  for (int k = 0; k < D; k++) {
    int fires = (double)rand() / RAND_MAX < fmin(low * pow(k + 1, -FIRING_RATE_EXPONENT), MAX_FIRING_RATE);
    mask[hot_first ? k : order[k]] = (uint8_t)fires;
    active += fires;
  }
  free(order);
  return active;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 5 || argc - 4 > MAX_LIBRARIES || (strcmp(argv[1], "int4") != 0 && strcmp(argv[1], "int8") != 0)) {
    fprintf(stderr, "usage: [THREADS=n] %s int4|int8 SPARSITY ROUNDS LIB.so [LIB.so ...] (at most %d libraries)\n",
            argv[0], MAX_LIBRARIES);
    return 2;
  }
  int n_libraries = argc - 4, format = strcmp(argv[1], "int4") == 0 ? Q4 : Q8, rounds = atoi(argv[3]);
  double sparsity = atof(argv[2]);
  int threads = getenv("THREADS") != NULL ? atoi(getenv("THREADS")) : 1;
  int D_MODEL = 4096, D_FFN = 11008;
  if (getenv("SHAPE") != NULL && (sscanf(getenv("SHAPE"), "%dx%d", &D_MODEL, &D_FFN) != 2 || D_MODEL <= 0 ||
                                  D_MODEL % GROUP != 0 || D_FFN <= 0)) {
    fprintf(stderr, "SHAPE: expected dxD (d a multiple of %d), found %s\n", GROUP, getenv("SHAPE"));
    return 2;
  }
  if (rounds < 1 || threads < 1 || !(sparsity >= 0.0 && sparsity < 1.0)) {
    fprintf(stderr, "expected ROUNDS >= 1, THREADS >= 1 and 0 <= SPARSITY < 1\n");
    return 2;
  }
  const char *mask_kind = getenv("MASK");
  if (mask_kind != NULL && strcmp(mask_kind, "hot-first") != 0 && strcmp(mask_kind, "hot-shuffled") != 0) {
    fprintf(stderr, "MASK: expected hot-first or hot-shuffled, found %s\n", mask_kind);
    return 2;
  }
  int matvec = getenv("MATVEC") != NULL && strcmp(getenv("MATVEC"), "1") == 0;
  int svd_rank = getenv("SVD") != NULL ? atoi(getenv("SVD")) : 0;
  int svd_half = getenv("SVD_F16") != NULL && strcmp(getenv("SVD_F16"), "1") == 0;
  int asymmetric = getenv("ASYMMETRIC") != NULL && strcmp(getenv("ASYMMETRIC"), "1") == 0;
  if (asymmetric && format != Q4) {
    fprintf(stderr, "ASYMMETRIC=1: only int4 has group minimums\n");
    return 2;
  }
  int down_int8 = getenv("DOWN_INT8") != NULL && strcmp(getenv("DOWN_INT8"), "1") == 0;
  if (down_int8 && format != Q4) {
    fprintf(stderr, "DOWN_INT8=1: only int4 gate and up take int8 down rows\n");
    return 2;
  }
  int down_format = down_int8 ? Q8 : format;
  if ((matvec || svd_rank > 0) && sparsity != 0.0) {
    fprintf(stderr, "MATVEC=1 and SVD=RANK time dense calls: SPARSITY must be 0\n");
    return 2;
  }
  if (getenv("SVD") != NULL && (svd_rank <= 0 || matvec)) {
    fprintf(stderr, "SVD: expected a positive rank, without MATVEC, found %s\n", getenv("SVD"));
    return 2;
  }
  sparse_ffn_q_fn ffn[MAX_LIBRARIES];
  matvec_q_fn matvec_q[MAX_LIBRARIES];
  svd_predictor_fn svd_predictor[MAX_LIBRARIES];
  svd_predictor_f16_fn svd_predictor_f16[MAX_LIBRARIES];
  size_t workspace_bytes = 0;
  for (int l = 0; l < n_libraries; l++) {
    void *library = dlopen(argv[4 + l], RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
      fprintf(stderr, "%s\n", dlerror());
      return 1;
    }
    ffn[l] = (sparse_ffn_q_fn)dlsym(library, "edge_cpu_sparse_ffn_q");
    matvec_q[l] = (matvec_q_fn)dlsym(library, "edge_cpu_matvec_q");
    svd_predictor[l] = (svd_predictor_fn)dlsym(library, "edge_cpu_svd_predictor");
    svd_predictor_f16[l] = (svd_predictor_f16_fn)dlsym(library, "edge_cpu_svd_predictor_f16");
    workspace_size_fn size = (workspace_size_fn)dlsym(library, "edge_cpu_sparse_ffn_workspace_size");
    if (ffn[l] == NULL || size == NULL || matvec_q[l] == NULL || svd_predictor[l] == NULL ||
        (svd_half && svd_predictor_f16[l] == NULL)) {
      fprintf(stderr, "%s: no edge_cpu_sparse_ffn_q / edge_cpu_matvec_q / edge_cpu_sparse_ffn_workspace_size / the SVD "
              "predictor\n", argv[4 + l]);
      return 1;
    }
    size_t bytes = size(D_MODEL, D_FFN, threads);
    workspace_bytes = bytes > workspace_bytes ? bytes : workspace_bytes;
  }
  size_t row_bytes = format == Q4 ? D_MODEL / 2 : D_MODEL, row_scales = D_MODEL / GROUP;
  srand(1);
  char *codes[3];
  uint16_t *scales[3], *mins[3] = {NULL, NULL, NULL};
  for (int m = 0; m < 3; m++) {
    size_t bytes = m == 2 && down_int8 ? (size_t)D_MODEL : row_bytes;
    codes[m] = malloc(bytes * D_FFN);
    scales[m] = malloc(row_scales * D_FFN * sizeof(uint16_t));
    for (size_t i = 0; i < bytes * D_FFN; i++) codes[m][i] = (char)rand();
    for (size_t i = 0; i < row_scales * D_FFN; i++) scales[m][i] = (uint16_t)(0x1c00 + (rand() & 0x3ff));
    if (asymmetric && !(m == 2 && down_int8)) { /* negative minimums of 8 to 16 scales' magnitude, without rand(): the same data otherwise */
      mins[m] = malloc(row_scales * D_FFN * sizeof(uint16_t));
      for (size_t i = 0; i < row_scales * D_FFN; i++) mins[m][i] = (uint16_t)(0xa800 + (i * 2654435761u >> 7 & 0x3ff));
    }
  }
  int n_out = matvec ? D_FFN : D_MODEL;
  /* the SVD predictor's factors A^T [rank, D] and B [rank, d], biases [D], its mask and scratch */
  size_t rank = svd_rank > 0 ? (size_t)svd_rank : 1;
  float *a_t = malloc(rank * D_FFN * sizeof(float)), *b = malloc(rank * D_MODEL * sizeof(float));
  float *svd_bias = malloc(D_FFN * sizeof(float)), *svd_scratch = malloc(rank * sizeof(float));
  uint8_t *svd_mask = malloc(D_FFN), *first_mask = malloc(D_FFN);
  for (size_t i = 0; i < rank * D_FFN; i++) a_t[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  for (size_t i = 0; i < rank * D_MODEL; i++) b[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  for (int i = 0; i < D_FFN; i++) svd_bias[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  /* fp16 factors: halves of magnitude 0.125 to 0.25, either sign */
  uint16_t *a_t_half = malloc(rank * D_FFN * sizeof(uint16_t)), *b_half = malloc(rank * D_MODEL * sizeof(uint16_t));
  for (size_t i = 0; i < rank * D_FFN; i++) a_t_half[i] = (uint16_t)(0x3000 | (rand() & 0x3ff) | (rand() & 1) << 15);
  for (size_t i = 0; i < rank * D_MODEL; i++) b_half[i] = (uint16_t)(0x3000 | (rand() & 0x3ff) | (rand() & 1) << 15);
  float *x = malloc(D_MODEL * sizeof(float)), *y = malloc((size_t)n_out * sizeof(float));
  float *first_y = malloc((size_t)n_out * sizeof(float));
  for (int i = 0; i < D_MODEL; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  uint8_t *mask = malloc(D_FFN);
  int n_active = 0;
  if (mask_kind != NULL) {
    n_active = power_law_mask(D_FFN, sparsity, strcmp(mask_kind, "hot-first") == 0, mask);
  } else {
    for (int i = 0; i < D_FFN; i++) n_active += mask[i] = (double)rand() / RAND_MAX >= sparsity;
  }
  void *workspace = malloc(workspace_bytes);
  float *flush = malloc(FLUSH_BYTES);
  for (size_t i = 0; i < FLUSH_BYTES / sizeof(float); i++) flush[i] = 1.0f;
  double *times = malloc(sizeof(double) * (size_t)rounds * (size_t)n_libraries);
  volatile float sink = 0.0f;
  for (int r = 0; r < rounds; r++) {
    for (int l = 0; l < n_libraries; l++) {
      float sum = 0.0f;
      for (size_t i = 0; i < FLUSH_BYTES / sizeof(float); i += 16) sum += flush[i]; /* a line at a time */
      sink += sum;
      double start = seconds();
      if (svd_rank > 0 && svd_half) {
        svd_predictor_f16[l](x, D_MODEL, D_FFN, svd_rank, a_t_half, b_half, svd_bias, svd_mask, svd_scratch);
      } else if (svd_rank > 0) {
        svd_predictor[l](x, D_MODEL, D_FFN, svd_rank, a_t, b, svd_bias, svd_mask, svd_scratch);
      } else if (matvec) {
        matvec_q[l](x, D_MODEL, D_FFN, codes[0], scales[0], mins[0], format, GROUP, NULL, y, threads);
      } else {
        ffn[l](x, D_MODEL, D_FFN, codes[0], scales[0], mins[0], codes[1], scales[1], mins[1], codes[2], scales[2],
               mins[2], format, down_format, GROUP, mask, NULL, ACT_SILU, 0.0f, y, workspace, threads, NULL);
      }
      times[(size_t)l * rounds + r] = seconds() - start;
      if (r == 0 && l == 0) memcpy(first_y, y, (size_t)n_out * sizeof(float));
      if (r == 0 && l == 0) memcpy(first_mask, svd_mask, D_FFN);
      int differs = svd_rank > 0 ? memcmp(first_mask, svd_mask, D_FFN) != 0
                                 : memcmp(first_y, y, (size_t)n_out * sizeof(float)) != 0;
      if (r == 0 && l > 0 && differs) {
        printf("%s: output differs from %s's\n", argv[4 + l], argv[4]);
      }
    }
  }
  double read_bytes = (matvec ? 1.0 : 3.0) * n_active *
                      (double)(row_bytes + (asymmetric ? 2 : 1) * row_scales * sizeof(uint16_t));
  if (down_int8 && !matvec) { /* the down rows: int8 codes, no minimums */
    read_bytes += n_active * ((double)D_MODEL - (double)row_bytes - (asymmetric ? 1.0 : 0.0) * row_scales * 2);
  }
  if (svd_rank > 0) {
    read_bytes = (double)rank * (D_FFN + D_MODEL) * (double)(svd_half ? sizeof(uint16_t) : sizeof(float));
  }
  const char *call = svd_rank > 0 ? (svd_half ? "SVD predictor (fp16 factors)" : "SVD predictor")
                                  : matvec ? "matvec" : "FFN";
  printf("%s%s%s %s %dx%d, sparsity %.2f (%d active rows, %.1f MB), %d thread(s), %d rounds\n", argv[1],
         asymmetric ? " (asymmetric)" : "", down_int8 ? " (int8 down)" : "", call, D_MODEL, D_FFN, sparsity, n_active, read_bytes / 1e6, threads, rounds);
  for (int l = 0; l < n_libraries; l++) {
    double *t = times + (size_t)l * rounds;
    qsort(t, (size_t)rounds, sizeof(double), by_value);
    double median = t[rounds / 2];
    printf("%-40s median %8.3f ms  min %8.3f ms  %6.2f GB/s at the median\n", argv[4 + l], median * 1e3, t[0] * 1e3,
           read_bytes / median / 1e9);
  }
  return 0;
}
