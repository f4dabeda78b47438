/* How fast one core reads the rows a sparse FFN step reads, with no arithmetic: the ceiling for the kernel's
 * "read fraction" (edge-sdk bench ffn) on this machine. Rows of a LLaMA-2-7B INT4 FFN matrix (4096 values: 2048
 * bytes of codes, and 256 bytes of fp16 scales in a second array), a random 8% of its 11008 rows in increasing
 * order (a 92% sparse mask), read ROWS_AT_ONCE rows at a time a cache line each in turn, with the rows AHEAD rows
 * later prefetched by one of these strategies (the kernel's is the first):
 *
 *   lines   every line of the later rows into L2 (prefetcht1), one line per line read: the kernel's pattern
 *   t0      the same into L1 (prefetcht0)
 *   nta     the same, non-temporal (prefetchnta)
 *   first   only the later rows' first two code lines and first scale line, leaving the rest to the hardware
 *           prefetchers' stream detection
 *   burst   every line of the later rows at once when a group of rows starts
 *   none    no software prefetch (ROWS_AT_ONCE demand streams only; AHEAD ignored)
 *
 * and, for comparison, one contiguous read of the same bytes. Caches are flushed (256 MiB read) before every pass;
 * best and mean of 40 passes. HUGE=1 backs the matrices with 2 MiB pages (madvise), as a bundle's mapping is on
 * kernels that map files with large folios.
 *
 *   gcc -O2 -march=native -o /tmp/row_read_ceiling benchmarks/row_read_ceiling.c
 *   [HUGE=1] /tmp/row_read_ceiling ROWS_AT_ONCE AHEAD [lines|t0|nta|first|burst|none]
 */
#define _DEFAULT_SOURCE /* madvise */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { D_FFN = 11008, CODE_BYTES = 2048, SCALE_BYTES = 256, LINE = 64, PASSES = 40, PERCENT_ACTIVE = 8 };
#define FLUSH_BYTES ((size_t)256 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

enum strategy { LINES, T0, NTA, FIRST, BURST, NONE };
static const char *const STRATEGY_NAMES[] = {"lines", "t0", "nta", "first", "burst", "none"};

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint8_t *allocate(size_t bytes, int huge) {
  size_t rounded = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
  uint8_t *memory = aligned_alloc(HUGE_PAGE, rounded);
  if (memory == NULL) exit(1);
  if (huge) madvise(memory, rounded, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes; i++) memory[i] = (uint8_t)i;
  return memory;
}

/* Prefetch `line` of row `row` (its code line, and its scale line while there is one) with a line strategy's hint. */
static void prefetch_line(const uint8_t *codes, const uint8_t *scales, size_t row, size_t line, enum strategy how) {
  const char *code = (const char *)codes + row * CODE_BYTES + line;
  const char *scale = (const char *)scales + row * SCALE_BYTES + line;
  if (how == T0) {
    _mm_prefetch(code, _MM_HINT_T0);
    if (line < SCALE_BYTES) _mm_prefetch(scale, _MM_HINT_T0);
  } else if (how == NTA) {
    _mm_prefetch(code, _MM_HINT_NTA);
    if (line < SCALE_BYTES) _mm_prefetch(scale, _MM_HINT_NTA);
  } else {
    _mm_prefetch(code, _MM_HINT_T1);
    if (line < SCALE_BYTES) _mm_prefetch(scale, _MM_HINT_T1);
  }
}

/* Prefetch the first `code_lines` code lines and `scale_lines` scale lines of row `row` into L2 at once. */
static void prefetch_lines(const uint8_t *codes, const uint8_t *scales, size_t row, size_t code_lines,
                           size_t scale_lines) {
  for (size_t line = 0; line < code_lines; line++) {
    _mm_prefetch((const char *)codes + row * CODE_BYTES + line * LINE, _MM_HINT_T1);
  }
  for (size_t line = 0; line < scale_lines; line++) {
    _mm_prefetch((const char *)scales + row * SCALE_BYTES + line * LINE, _MM_HINT_T1);
  }
}

int main(int argc, char **argv) {
  int at_once = argc >= 3 ? atoi(argv[1]) : 0, ahead = argc >= 3 ? atoi(argv[2]) : -1, how = LINES;
  if (argc == 4) {
    how = -1;
    for (int s = LINES; s <= NONE; s++) how = strcmp(argv[3], STRATEGY_NAMES[s]) == 0 ? s : how;
  }
  if (at_once < 1 || ahead < 0 || how < 0 || argc > 4) {
    fprintf(stderr, "usage: [HUGE=1] %s ROWS_AT_ONCE AHEAD [lines|t0|nta|first|burst|none]\n", argv[0]);
    return 2;
  }
  int huge = getenv("HUGE") != NULL && strcmp(getenv("HUGE"), "1") == 0;
  uint8_t *codes = allocate((size_t)CODE_BYTES * D_FFN, huge), *scales = allocate((size_t)SCALE_BYTES * D_FFN, huge);
  int rows[D_FFN], n = 0;
  srand(3);
  for (int i = 0; i < D_FFN; i++) {
    if (rand() % 100 < PERCENT_ACTIVE) rows[n++] = i;
  }
  float *flush = malloc(FLUSH_BYTES);
  for (size_t i = 0; i < FLUSH_BYTES / sizeof(float); i++) flush[i] = 1.0f;
  volatile int sink = 0;
  double bytes = (double)n * (CODE_BYTES + SCALE_BYTES), best[2] = {1e9, 1e9}, total[2] = {0, 0};
  for (int pass = 0; pass < 2 * PASSES; pass++) {
    int contiguous = pass % 2;
    float sum = 0.0f;
    for (size_t i = 0; i < FLUSH_BYTES / sizeof(float); i += 16) sum += flush[i];
    sink += (int)sum;
    double start = seconds();
    __m512i acc = _mm512_setzero_si512();
    if (contiguous) {
      for (size_t byte = 0; byte + LINE <= (size_t)bytes; byte += LINE) {
        acc = _mm512_add_epi32(acc, _mm512_load_si512(codes + byte));
      }
    } else {
      for (int k = 0; k < n; k += at_once) {
        int group = n - k < at_once ? n - k : at_once;
        for (int t = 0; t < group && (how == FIRST || how == BURST) && k + t + ahead < n && ahead > 0; t++) {
          if (how == FIRST) {
            prefetch_lines(codes, scales, (size_t)rows[k + t + ahead], 2, 1);
          } else {
            prefetch_lines(codes, scales, (size_t)rows[k + t + ahead], CODE_BYTES / LINE, SCALE_BYTES / LINE);
          }
        }
        for (size_t line = 0; line < CODE_BYTES; line += LINE) {
          for (int t = 0; t < group; t++) {
            if (how <= NTA && k + t + ahead < n && ahead > 0) {
              prefetch_line(codes, scales, (size_t)rows[k + t + ahead], line, how);
            }
            size_t row = (size_t)rows[k + t];
            acc = _mm512_add_epi32(acc, _mm512_load_si512(codes + row * CODE_BYTES + line));
            if (line < SCALE_BYTES) acc = _mm512_add_epi32(acc, _mm512_load_si512(scales + row * SCALE_BYTES + line));
          }
        }
      }
    }
    sink += _mm512_reduce_add_epi32(acc);
    double elapsed = seconds() - start;
    best[contiguous] = elapsed < best[contiguous] ? elapsed : best[contiguous];
    total[contiguous] += elapsed;
  }
  printf("%d rows of %d (%.1f MB), %d at once, %d ahead, prefetch %s, %s pages\n", n, D_FFN, bytes / 1e6, at_once,
         ahead, STRATEGY_NAMES[how], huge ? "2 MiB" : "4 KiB");
  const char *names[2] = {"scattered rows", "contiguous"};
  for (int c = 0; c < 2; c++) {
    printf("%-15s best %.3f ms %6.2f GB/s, mean %6.2f GB/s\n", names[c], best[c] * 1e3, bytes / best[c] / 1e9,
           bytes / (total[c] / PASSES) / 1e9);
  }
  return 0;
}
