/* edge_generate: generate text from an edge-sdk bundle with libedge_sdk.
 *
 *   edge_generate BUNDLE "prompt" [-n N] [--backend cpu|tensorrt] [--temperature T] [--top-k K] [--top-p P]
 *                 [--seed S] [--threads N] [--sparsity LEVEL] [--dense] [--no-verify] [--ids]
 *
 * --top-k, --top-p and --seed need a --temperature above 0 (greedy decoding reads none of them), as `edge-sdk run`.
 *
 * Streams the generated text to stdout as tokens arrive; with --ids prints the generated token ids instead
 * (one line, space-separated). Timing goes to stderr: prompt tokens, prefill time, decode tokens/s.
 * Exit status: 0 on success, 1 on a library error (its message on stderr), 2 on bad usage. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edge_sdk.h"

struct stream {
  const edge_tokenizer *tokenizer;
  int print_ids;
  int32_t count;
  double first_token_time; /* when the first token arrived (after prefill) */
  double last_token_time;
};

static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int on_token(int32_t token, void *user_data) {
  struct stream *stream = user_data;
  double now = now_seconds();
  if (stream->count++ == 0) stream->first_token_time = now;
  stream->last_token_time = now;
  if (stream->print_ids) {
    printf(stream->count == 1 ? "%d" : " %d", token);
  } else if (!edge_tokenizer_is_special(stream->tokenizer, token)) {
    const char *bytes;
    size_t n;
    if (edge_tokenizer_token_bytes(stream->tokenizer, token, &bytes, &n) == EDGE_OK) fwrite(bytes, 1, n, stdout);
    fflush(stdout);
  }
  return 0;
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: edge_generate BUNDLE PROMPT [-n N] [--backend cpu|tensorrt] [--temperature T] [--top-k K]\n"
          "                     [--top-p P] [--seed S] [--threads N] [--sparsity LEVEL] [--dense] [--no-verify]\n"
          "                     [--ids]\n");
}

static int parse_number(const char *flag, const char *text, double min, double max, double *value) {
  char *end;
  errno = 0;
  double parsed = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(parsed >= min && parsed <= max)) {
    fprintf(stderr, "edge_generate: %s expects a number in [%g, %g], found '%s'\n", flag, min, max, text);
    return 0;
  }
  *value = parsed;
  return 1;
}

/* A count or seed: decimal digits only, so "1.5", "-1", "+3", " 7" and "0x10" are refused rather than truncated,
 * wrapped or read in another base. */
static int parse_integer(const char *flag, const char *text, uint64_t max, uint64_t *value) {
  char *end;
  errno = 0;
  unsigned long long parsed = strtoull(text, &end, 10);
  int digits_only = text[0] >= '0' && text[0] <= '9' && *end == '\0';
  if (!digits_only || errno != 0 || parsed > max) {
    fprintf(stderr, "edge_generate: %s expects an integer in [0, %" PRIu64 "], found '%s'\n", flag, max, text);
    return 0;
  }
  *value = parsed;
  return 1;
}

/* TensorRT's warnings and errors (the tensorrt backend), as a command-line tool shows them. */
static void print_log(edge_log_level level, const char *source, const char *message, void *user_data) {
  (void)user_data;
  fprintf(stderr, "%s %s: %s\n", source, level == EDGE_LOG_ERROR ? "error" : "warning", message);
}

static int fail(const char *what, edge_status status, const char *message) {
  fprintf(stderr, "edge_generate: %s failed: %s: %s\n", what, edge_status_name(status), message);
  return 1;
}

int main(int argc, char **argv) {
  const char *bundle = NULL, *prompt = NULL, *backend = "cpu";
  double temperature = 0.0, top_p = 1.0, sparsity = -1.0;
  uint64_t max_new_tokens = 64, seed = 0, threads = 0, top_k = 0;
  int dense = 0, verify = 1, print_ids = 0;
  const char *sampling_flag = NULL; /* the first of --top-k, --top-p, --seed given: only sampling reads them */
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    int has_value = i + 1 < argc;
    int ok = 1;
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(arg, "-n") == 0 && has_value) {
      ok = parse_integer(arg, argv[++i], 1 << 24, &max_new_tokens);
    } else if (strcmp(arg, "--backend") == 0 && has_value) {
      backend = argv[++i];
    } else if (strcmp(arg, "--temperature") == 0 && has_value) {
      ok = parse_number(arg, argv[++i], 0, 1e6, &temperature);
      if (ok && temperature > 0 && temperature < FLT_MIN) { /* the API's float would round it to 0: greedy */
        fprintf(stderr, "edge_generate: %s expects 0 (greedy) or a number in [%g, %g], found '%s'\n", arg, FLT_MIN,
                1e6, argv[i]);
        ok = 0;
      }
    } else if (strcmp(arg, "--top-k") == 0 && has_value) {
      ok = parse_integer(arg, argv[++i], INT32_MAX, &top_k);
      sampling_flag = sampling_flag != NULL ? sampling_flag : arg;
    } else if (strcmp(arg, "--top-p") == 0 && has_value) {
      ok = parse_number(arg, argv[++i], 1e-9, 1, &top_p);
      sampling_flag = sampling_flag != NULL ? sampling_flag : arg;
    } else if (strcmp(arg, "--seed") == 0 && has_value) {
      ok = parse_integer(arg, argv[++i], UINT64_MAX, &seed);
      sampling_flag = sampling_flag != NULL ? sampling_flag : arg;
    } else if (strcmp(arg, "--threads") == 0 && has_value) {
      ok = parse_integer(arg, argv[++i], 4096, &threads);
    } else if (strcmp(arg, "--sparsity") == 0 && has_value) {
      ok = parse_number(arg, argv[++i], 0, 1, &sparsity);
    } else if (strcmp(arg, "--dense") == 0) {
      dense = 1;
    } else if (strcmp(arg, "--no-verify") == 0) {
      verify = 0;
    } else if (strcmp(arg, "--ids") == 0) {
      print_ids = 1;
    } else if (arg[0] == '-' && arg[1] != '\0') {
      fprintf(stderr, "edge_generate: unknown option or missing value: %s\n", arg);
      usage(stderr);
      return 2;
    } else if (bundle == NULL) {
      bundle = arg;
    } else if (prompt == NULL) {
      prompt = arg;
    } else {
      fprintf(stderr, "edge_generate: unexpected argument '%s' after BUNDLE and PROMPT (quote a prompt of several "
              "words)\n", arg);
      usage(stderr);
      return 2;
    }
    if (!ok) return 2;
  }
  if (bundle == NULL || prompt == NULL) {
    fprintf(stderr, "edge_generate: expected BUNDLE and PROMPT, found %s\n", bundle == NULL ? "neither" : "no PROMPT");
    usage(stderr);
    return 2;
  }
  if (sampling_flag != NULL && temperature == 0.0) { /* ignored silently otherwise */
    fprintf(stderr, "edge_generate: %s: only sampling reads it, and --temperature 0 (the default) decodes greedily; "
            "give a --temperature above 0\n", sampling_flag);
    return 2;
  }
  if (dense && sparsity >= 0.0) { /* what `edge-sdk run --dense --sparsity` says */
    fprintf(stderr, "edge_generate: dense and sparsity %g: the dense model has no sparsity level; give either\n",
            sparsity);
    return 2;
  }

  edge_set_log_callback(print_log, NULL);
  edge_options *options = NULL;
  edge_model *model = NULL;
  edge_tokenizer *tokenizer = NULL;
  edge_session *session = NULL;
  int32_t *prompt_ids = NULL;
  size_t n_prompt = 0;
  int exit_code = 1;
  edge_status status;
  if ((status = edge_options_create(&options)) != EDGE_OK ||
      (status = edge_options_set_backend(options, backend)) != EDGE_OK ||
      (status = edge_options_set_threads(options, (int)threads)) != EDGE_OK ||
      (status = edge_options_set_sparsity(options, sparsity)) != EDGE_OK ||
      (status = edge_options_set_dense(options, dense)) != EDGE_OK ||
      (status = edge_options_set_verify_checksums(options, verify)) != EDGE_OK) {
    exit_code = fail("options", status, edge_last_error());
    goto done;
  }
  double open_start = now_seconds();
  if ((status = edge_model_open(bundle, options, &model)) != EDGE_OK) {
    exit_code = fail("opening the bundle", status, edge_last_error());
    goto done;
  }
  double open_seconds = now_seconds() - open_start;
  if ((status = edge_tokenizer_create(model, &tokenizer)) != EDGE_OK) {
    exit_code = fail("loading the tokenizer", status, edge_last_error());
    goto done;
  }
  if ((status = edge_tokenizer_encode(tokenizer, prompt, strlen(prompt), -1, &prompt_ids, &n_prompt)) != EDGE_OK) {
    exit_code = fail("encoding the prompt", status, edge_tokenizer_last_error(tokenizer));
    goto done;
  }
  if ((status = edge_session_create(model, &session)) != EDGE_OK) {
    exit_code = fail("creating a session", status, edge_last_error());
    goto done;
  }
  if ((status = edge_session_set_sampling(session, (float)temperature, (float)top_p, (int)top_k, seed)) != EDGE_OK) {
    exit_code = fail("sampling settings", status, edge_session_last_error(session));
    goto done;
  }
  struct stream stream = {tokenizer, print_ids, 0, 0.0, 0.0};
  int32_t n_generated = 0;
  edge_stop_reason reason;
  double start = now_seconds();
  status = edge_session_generate(session, prompt_ids, n_prompt, (int)max_new_tokens, on_token, &stream, &n_generated,
                                 &reason);
  double end = now_seconds();
  /* end the generated line; a failed generation leaves stdout holding only what it generated */
  if (status == EDGE_OK || stream.count > 0) printf("\n");
  fflush(stdout);
  if (status != EDGE_OK) {
    exit_code = fail("generation", status, edge_session_last_error(session));
    goto done;
  }
  static const char *reasons[] = {"max_new_tokens", "eos", "callback", "max_seq_len"};
  double prefill_seconds = (n_generated > 0 ? stream.first_token_time : end) - start;
  double decode_seconds = stream.last_token_time - stream.first_token_time;
  fprintf(stderr, "edge_generate: backend %s, predictor %s, bundle opened in %.3f s\n", edge_model_backend(model),
          edge_model_predictor(model), open_seconds);
  fprintf(stderr, "edge_generate: prompt %zu tokens, prefill %.3f s (%.1f tokens/s)\n", n_prompt, prefill_seconds,
          prefill_seconds > 0 ? (double)n_prompt / prefill_seconds : 0.0);
  fprintf(stderr, "edge_generate: generated %d tokens (stop: %s), decode %.1f tokens/s\n", n_generated,
          reasons[reason], n_generated > 1 && decode_seconds > 0 ? (n_generated - 1) / decode_seconds : 0.0);
  exit_code = 0;
done:
  edge_free(prompt_ids);
  edge_session_destroy(session);
  edge_tokenizer_destroy(tokenizer);
  edge_model_close(model);
  edge_options_destroy(options);
  return exit_code;
}
