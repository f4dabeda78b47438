/* Test driver for tests/jetson: the public API's contracts, error statuses and messages on a fixture bundle.
 *   edge_api_check SVD_BUNDLE SIGNBIT_BUNDLE
 * Prints one line per failed check and "checks: N passed, M failed"; exit status 1 when any failed. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_cpu_kernels.h"
#include "edge_sdk.h"

static int passed, failed;

#define CHECK(condition)                                                  \
  do {                                                                    \
    if (condition) {                                                      \
      passed++;                                                           \
    } else {                                                              \
      failed++;                                                           \
      printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #condition);       \
    }                                                                     \
  } while (0)

#define CHECK_STATUS(call, expected)                                                                   \
  do {                                                                                                 \
    edge_status got_ = (call);                                                                         \
    if (got_ == (expected)) {                                                                          \
      passed++;                                                                                        \
    } else {                                                                                           \
      failed++;                                                                                        \
      printf("FAILED %s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__, #call,           \
             edge_status_name(got_), edge_status_name(expected), edge_last_error());                    \
    }                                                                                                  \
  } while (0)

#define PROMPT_LENGTH 10
#define STEPS 16

static const int32_t prompt[PROMPT_LENGTH] = {0, 87, 290, 405, 13, 300, 27, 18, 100, 12};

struct collected {
  int32_t tokens[256];
  int count;
  int stop_after; /* 0: never */
};

static int collect(int32_t token, void *user_data) {
  struct collected *c = user_data;
  if (c->count < 256) c->tokens[c->count] = token;
  c->count++;
  return c->stop_after > 0 && c->count >= c->stop_after;
}

static edge_model *open_model(const char *bundle, const char *backend, double sparsity, int dense, int max_seq_len,
                              edge_status *status) {
  edge_options *options;
  edge_model *model = NULL;
  *status = edge_options_create(&options);
  if (*status != EDGE_OK) return NULL;
  if (backend != NULL) edge_options_set_backend(options, backend);
  edge_options_set_sparsity(options, sparsity);
  edge_options_set_dense(options, dense);
  edge_options_set_max_seq_len(options, max_seq_len);
  edge_options_set_threads(options, 1);
  *status = edge_model_open(bundle, options, &model);
  edge_options_destroy(options);
  return model;
}

/* Greedy tokens by prefill + decode, the way a caller without edge_session_generate does it. */
static int greedy_manual(edge_session *session, int32_t *tokens, int steps) {
  if (edge_session_prefill(session, prompt, PROMPT_LENGTH) != EDGE_OK) return 0;
  for (int i = 0; i < steps; i++) {
    const float *logits;
    int32_t vocab;
    if (edge_session_logits(session, &logits, &vocab) != EDGE_OK) return 0;
    int best = 0;
    for (int v = 1; v < vocab; v++) best = logits[v] > logits[best] ? v : best;
    tokens[i] = best;
    if (i + 1 < steps && edge_session_decode(session, best) != EDGE_OK) return 0;
  }
  return 1;
}

struct thread_job {
  edge_model *model;
  struct collected result;
  edge_status status;
};

static void *generate_on_thread(void *argument) {
  struct thread_job *job = argument;
  edge_session *session;
  job->status = edge_session_create(job->model, &session);
  if (job->status != EDGE_OK) return NULL;
  job->status = edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &job->result, NULL, NULL);
  edge_session_destroy(session);
  return NULL;
}

static void check_basics(void) {
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", EDGE_SDK_VERSION_MAJOR, EDGE_SDK_VERSION_MINOR, EDGE_SDK_VERSION_PATCH);
  CHECK(strcmp(edge_version(), expected) == 0);
  CHECK(strcmp(edge_status_name(EDGE_ERROR_BUNDLE), "EDGE_ERROR_BUNDLE") == 0);
  CHECK(strcmp(edge_status_name((edge_status)77), "EDGE_UNKNOWN_STATUS") == 0);
  edge_options *options;
  CHECK_STATUS(edge_options_create(NULL), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_options_create(&options), EDGE_OK);
  CHECK_STATUS(edge_options_set_backend(options, "gpu"), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_last_error(), "'gpu'") != NULL);
  CHECK_STATUS(edge_options_set_backend(options, NULL), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_options_set_sparsity(options, NAN), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_options_set_sparsity(options, 1.5), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_options_set_max_seq_len(options, -1), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_options_set_threads(NULL, 1), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_options_set_threads(options, -1), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_last_error(), "threads: expected 0 (every core) to 4096, found -1") != NULL);
  CHECK_STATUS(edge_options_set_threads(options, 4097), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_options_set_threads(options, 0), EDGE_OK);
  CHECK_STATUS(edge_options_set_backend(options, "cpu"), EDGE_OK);
  edge_options_destroy(options);
  edge_options_destroy(NULL);
  edge_model *model = (edge_model *)&model;
  CHECK_STATUS(edge_model_open(NULL, NULL, &model), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(model == NULL);
  CHECK_STATUS(edge_model_open("/nonexistent/bundle", NULL, NULL), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_model_open("/nonexistent/bundle", NULL, &model), EDGE_ERROR_IO);
  CHECK(strstr(edge_last_error(), "/nonexistent/bundle") != NULL);
  edge_model_close(NULL);
  edge_session_destroy(NULL);
  edge_tokenizer_destroy(NULL);
}

/* The test drivers are built without TensorRT (tests/tensorrt covers the engine on a fake TensorRT). */
static void check_backends(const char *bundle) {
  const char *description = NULL;
  CHECK_STATUS(edge_backend_probe("cpu", &description), EDGE_OK);
  CHECK(description != NULL && strstr(description, "CPU") != NULL);
  CHECK(strstr(description, edge_cpu_isa()) != NULL && strstr(description, edge_cpu_isas()) != NULL);
  CHECK_STATUS(edge_backend_probe("tensorrt", &description), EDGE_ERROR_UNAVAILABLE);
  CHECK(strstr(edge_last_error(), "this build of libedge_sdk has no TensorRT engine (TensorRT not found at build time)"));
  CHECK_STATUS(edge_backend_probe("gpu", &description), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_last_error(), "expected 'cpu' or 'tensorrt', found 'gpu'") != NULL);
  CHECK_STATUS(edge_backend_probe(NULL, &description), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_backend_probe("cpu", NULL), EDGE_ERROR_INVALID_ARGUMENT);
  char *json = (char *)&json;
  CHECK_STATUS(edge_tensorrt_engine_info(bundle, NULL, &json), EDGE_ERROR_UNAVAILABLE);
  CHECK(json == NULL);
  CHECK(strstr(edge_last_error(), "this build of libedge_sdk has no TensorRT engine") != NULL);
  CHECK_STATUS(edge_tensorrt_engine_info(NULL, NULL, &json), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_tensorrt_engine_info(bundle, NULL, NULL), EDGE_ERROR_INVALID_ARGUMENT);
}

static void check_open_options(const char *bundle, const char *signbit_bundle) {
  edge_status status;
  edge_model *model = open_model(bundle, "tensorrt", -1.0, 0, 0, &status);
  CHECK(model == NULL && status == EDGE_ERROR_UNAVAILABLE);
  CHECK(strstr(edge_last_error(), "this build of libedge_sdk has no TensorRT engine (TensorRT not found at build time)"));
  model = open_model(bundle, NULL, 0.55, 0, 0, &status);
  CHECK(model == NULL && status == EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_last_error(), "sparsity level 0.55 was not calibrated") != NULL);
  model = open_model(bundle, NULL, -1.0, 0, 1 << 20, &status);
  CHECK(model == NULL && status == EDGE_ERROR_INVALID_ARGUMENT);
  model = open_model(bundle, NULL, 0.8, 0, 16, &status);
  CHECK(model != NULL && status == EDGE_OK);
  CHECK(fabs(edge_model_sparsity_level(model) - 0.8) < 1e-12);
  CHECK(edge_model_max_seq_len(model) == 16);
  edge_model_close(model);
  model = open_model(bundle, NULL, -1.0, 1, 0, &status);
  CHECK(model != NULL && edge_model_sparsity_level(model) == -1.0);
  edge_model_close(model);
  model = open_model(signbit_bundle, NULL, 0.5, 0, 0, &status);
  CHECK(model == NULL && status == EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_last_error(), "this predictor has no levels") != NULL);
  model = open_model(signbit_bundle, NULL, -1.0, 0, 0, &status);
  CHECK(model != NULL && strcmp(edge_model_predictor(model), "signbit") == 0 && edge_model_sparsity_level(model) == -1.0);
  edge_model_close(model);
}

static void check_session(edge_model *model) {
  CHECK(edge_model_vocab_size(model) == 2048);
  CHECK(edge_model_bos_token(model) == 0);
  CHECK(strcmp(edge_model_backend(model), "cpu") == 0 && strcmp(edge_model_predictor(model), "svd") == 0);
  CHECK(fabs(edge_model_sparsity_level(model) - 0.5) < 1e-12);
  const int32_t *eos;
  size_t n_eos;
  CHECK_STATUS(edge_model_eos_tokens(model, &eos, &n_eos), EDGE_OK);
  CHECK(n_eos == 1 && eos[0] == 1);
  CHECK_STATUS(edge_model_eos_tokens(model, NULL, &n_eos), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_model_last_error(model), "NULL argument") != NULL);

  edge_session *session = (edge_session *)&session;
  CHECK_STATUS(edge_session_create(NULL, &session), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(session == NULL);
  CHECK_STATUS(edge_session_create(model, &session), EDGE_OK);
  const float *logits;
  int32_t token, vocab;
  CHECK_STATUS(edge_session_decode(session, 5), EDGE_ERROR_STATE);
  CHECK(strstr(edge_session_last_error(session), "prefill first") != NULL);
  CHECK_STATUS(edge_session_logits(session, &logits, &vocab), EDGE_ERROR_STATE);
  CHECK_STATUS(edge_session_sample(session, &token), EDGE_ERROR_STATE);
  CHECK_STATUS(edge_session_prefill(session, NULL, 3), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_prefill(session, prompt, 0), EDGE_ERROR_INVALID_ARGUMENT);
  int32_t bad[2] = {5, 2048};
  CHECK_STATUS(edge_session_prefill(session, bad, 2), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_session_last_error(session), "expected token ids in [0, 2048), found 2048") != NULL);
  bad[1] = -1;
  CHECK_STATUS(edge_session_prefill(session, bad, 2), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_prefill(session, prompt, PROMPT_LENGTH), EDGE_OK);
  CHECK(edge_session_position(session) == PROMPT_LENGTH);
  /* a NULL out-parameter is this session's failure too: its message replaces the one of the bad prefill above */
  CHECK_STATUS(edge_session_logits(session, NULL, &vocab), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(edge_session_last_error(session), "edge_session_logits: logits is NULL") == 0);
  CHECK_STATUS(edge_session_sample(session, NULL), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(edge_session_last_error(session), "edge_session_sample: token is NULL") == 0);
  CHECK_STATUS(edge_session_logits(session, &logits, &vocab), EDGE_OK);
  CHECK(vocab == 2048);
  int argmax = 0;
  for (int v = 1; v < vocab; v++) argmax = logits[v] > logits[argmax] ? v : argmax;
  CHECK_STATUS(edge_session_sample(session, &token), EDGE_OK);
  CHECK(token == argmax);
  CHECK_STATUS(edge_session_decode(session, 2048), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_decode(session, token), EDGE_OK);
  CHECK(edge_session_position(session) == PROMPT_LENGTH + 1);
  CHECK_STATUS(edge_session_reset(session), EDGE_OK);
  CHECK(edge_session_position(session) == 0);
  CHECK_STATUS(edge_session_decode(session, token), EDGE_ERROR_STATE);

  /* generate == manual prefill/decode, greedy */
  int32_t manual[STEPS];
  CHECK(greedy_manual(session, manual, STEPS));
  struct collected generated = {0};
  int32_t n_generated = -1;
  edge_stop_reason reason = EDGE_STOP_EOS;
  CHECK_STATUS(edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &generated, &n_generated, &reason),
               EDGE_OK);
  CHECK(n_generated == STEPS && generated.count == STEPS && reason == EDGE_STOP_MAX_TOKENS);
  CHECK(memcmp(manual, generated.tokens, sizeof manual) == 0);
  CHECK(edge_session_position(session) == PROMPT_LENGTH + STEPS - 1); /* the last token is not fed */

  struct collected stopped = {.stop_after = 3};
  CHECK_STATUS(edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &stopped, &n_generated, &reason),
               EDGE_OK);
  CHECK(n_generated == 3 && reason == EDGE_STOP_CALLBACK && memcmp(stopped.tokens, manual, 3 * sizeof(int32_t)) == 0);
  CHECK_STATUS(edge_session_generate(session, prompt, PROMPT_LENGTH, -1, NULL, NULL, NULL, NULL),
               EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_generate(session, prompt, PROMPT_LENGTH, 0, NULL, NULL, &n_generated, &reason), EDGE_OK);
  CHECK(n_generated == 0 && reason == EDGE_STOP_MAX_TOKENS);
  /* a prompt that encoded to nothing: the message names generate's prompt, as the Python Generator does */
  CHECK_STATUS(edge_session_generate(session, prompt, 0, STEPS, NULL, NULL, &n_generated, &reason),
               EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(edge_session_last_error(session), "prompt: expected at least one token, found an empty prompt") == 0);
  CHECK(n_generated == 0);
  CHECK_STATUS(edge_session_generate(session, NULL, 3, STEPS, NULL, NULL, NULL, NULL), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(edge_session_last_error(session), "prompt: expected at least one token, found prompt = NULL") == 0);
  /* stopped by the callback at the first token: nothing is decoded, so the cache holds the prompt only */
  struct collected stop_first = {.stop_after = 1};
  CHECK_STATUS(edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &stop_first, &n_generated,
                                     &reason), EDGE_OK);
  CHECK(n_generated == 1 && stop_first.count == 1 && reason == EDGE_STOP_CALLBACK && stop_first.tokens[0] == manual[0]);
  CHECK(edge_session_position(session) == PROMPT_LENGTH);

  /* sampling */
  CHECK_STATUS(edge_session_set_sampling(session, -1.0f, 1.0f, 0, 0), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, 0.0f, 0, 0), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, 1.0f, -1, 0), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_set_sampling(session, NAN, 1.0f, 0, 0), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_session_last_error(session), "temperature: expected a finite number >= 0") != NULL);
  CHECK_STATUS(edge_session_set_sampling(session, INFINITY, 1.0f, 0, 0), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, NAN, 0, 0), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, 1.0001f, 0, 0), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_session_last_error(session), "top_p: expected a number in (0, 1] (1 = off), found 1.0001") != NULL);
  struct collected wide_k = {0}; /* top-k beyond the vocabulary keeps every token, as top-k off */
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, 1.0f, 1 << 30, 7), EDGE_OK);
  edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &wide_k, NULL, NULL);
  struct collected first = {0}, again = {0}, other = {0}, nucleus = {0}, top1 = {0};
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, 1.0f, 0, 7), EDGE_OK);
  edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &first, NULL, NULL);
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, 1.0f, 0, 7), EDGE_OK);
  edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &again, NULL, NULL);
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, 1.0f, 0, 8), EDGE_OK);
  edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &other, NULL, NULL);
  CHECK(first.count == again.count && memcmp(first.tokens, again.tokens, (size_t)first.count * sizeof(int32_t)) == 0);
  CHECK(first.count == wide_k.count && memcmp(first.tokens, wide_k.tokens, (size_t)first.count * sizeof(int32_t)) == 0);
  CHECK(first.count != other.count || memcmp(first.tokens, other.tokens, (size_t)first.count * sizeof(int32_t)) != 0);
  CHECK(first.count != STEPS || memcmp(first.tokens, manual, sizeof manual) != 0); /* sampling is not greedy */
  CHECK_STATUS(edge_session_set_sampling(session, 1.0f, 1e-6f, 0, 3), EDGE_OK); /* top-p keeps only the top token */
  edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &nucleus, NULL, NULL);
  CHECK(nucleus.count == STEPS && memcmp(nucleus.tokens, manual, sizeof manual) == 0);
  CHECK_STATUS(edge_session_set_sampling(session, 0.7f, 1.0f, 1, 3), EDGE_OK); /* top-k 1 is greedy */
  edge_session_generate(session, prompt, PROMPT_LENGTH, STEPS, collect, &top1, NULL, NULL);
  CHECK(top1.count == STEPS && memcmp(top1.tokens, manual, sizeof manual) == 0);
  edge_session_destroy(session);

  /* one model, two sessions generating concurrently on two threads: the same tokens as alone */
  struct thread_job jobs[2] = {{.model = model}, {.model = model}};
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, generate_on_thread, &jobs[i]);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < 2; i++) {
    CHECK(jobs[i].status == EDGE_OK && jobs[i].result.count == STEPS);
    CHECK(memcmp(jobs[i].result.tokens, manual, sizeof manual) == 0);
  }
}

static void check_sequence_full(const char *bundle) {
  edge_status status;
  edge_model *model = open_model(bundle, NULL, -1.0, 0, 16, &status);
  CHECK(model != NULL);
  if (model == NULL) return;
  edge_session *session;
  CHECK_STATUS(edge_session_create(model, &session), EDGE_OK);
  int32_t long_prompt[17] = {0};
  CHECK_STATUS(edge_session_prefill(session, long_prompt, 17), EDGE_ERROR_SEQUENCE_FULL);
  CHECK_STATUS(edge_session_generate(session, long_prompt, 16, 4, NULL, NULL, NULL, NULL), EDGE_ERROR_SEQUENCE_FULL);
  int32_t n_generated;
  edge_stop_reason reason;
  CHECK_STATUS(edge_session_generate(session, prompt, PROMPT_LENGTH, 100, NULL, NULL, &n_generated, &reason), EDGE_OK);
  CHECK(n_generated == 16 - PROMPT_LENGTH && reason == EDGE_STOP_SEQUENCE_FULL);
  CHECK_STATUS(edge_session_prefill(session, long_prompt, 16), EDGE_OK);
  CHECK_STATUS(edge_session_decode(session, 3), EDGE_ERROR_SEQUENCE_FULL);
  const float *logits;
  int32_t token;
  CHECK_STATUS(edge_session_logits(session, &logits, NULL), EDGE_OK); /* the refused decode kept the full prompt's */
  CHECK_STATUS(edge_session_sample(session, &token), EDGE_OK);
  CHECK_STATUS(edge_session_reset(session), EDGE_OK);
  CHECK_STATUS(edge_session_sample(session, &token), EDGE_ERROR_STATE);
  edge_session_destroy(session);
  edge_model_close(model);
}

static void check_tokenizer(edge_model *model) {
  edge_tokenizer *tokenizer;
  CHECK_STATUS(edge_tokenizer_create(NULL, &tokenizer), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_tokenizer_create(model, &tokenizer), EDGE_OK);
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK_STATUS(edge_tokenizer_encode(tokenizer, NULL, 4, 0, &ids, &n), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_tokenizer_encode(tokenizer, "a\xff", 2, 0, &ids, &n), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(edge_tokenizer_last_error(tokenizer), "not valid UTF-8 at byte 1") != NULL);
  CHECK_STATUS(edge_tokenizer_encode(tokenizer, "x", 1, 2, &ids, &n), EDGE_ERROR_INVALID_ARGUMENT);
  /* refused before a byte is read: a text of 2^31 bytes and more would overflow the int positions of a word */
  CHECK_STATUS(edge_tokenizer_encode(tokenizer, "x", (size_t)INT_MAX + 1, 0, &ids, &n), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(edge_tokenizer_last_error(tokenizer), "text_len: expected at most 2147483647 bytes, found 2147483648") == 0);
  CHECK_STATUS(edge_tokenizer_encode(tokenizer, "", 0, 0, &ids, &n), EDGE_OK);
  CHECK(n == 0);
  edge_free(ids);
  CHECK_STATUS(edge_tokenizer_encode(tokenizer, "def f():", 8, -1, &ids, &n), EDGE_OK);
  CHECK(n >= 2 && ids[0] == 0); /* tokenizer_config.json: add_bos_token true, bos <s> = 0 */
  char *text = NULL;
  size_t length = 0;
  CHECK_STATUS(edge_tokenizer_decode(tokenizer, ids, n, 1, &text, &length), EDGE_OK);
  CHECK(text != NULL && length == 8 && strcmp(text, "def f():") == 0);
  edge_free(text);
  CHECK_STATUS(edge_tokenizer_decode(tokenizer, ids, n, 0, &text, &length), EDGE_OK);
  CHECK(text != NULL && strcmp(text, "<s>def f():") == 0);
  edge_free(text);
  edge_free(ids);
  static const char with_nul[] = "a\0b<s>\0"; /* NUL bytes are text when the length says so */
  CHECK_STATUS(edge_tokenizer_encode(tokenizer, with_nul, sizeof with_nul - 1, 0, &ids, &n), EDGE_OK);
  CHECK_STATUS(edge_tokenizer_decode(tokenizer, ids, n, 0, &text, &length), EDGE_OK);
  CHECK(text != NULL && length == sizeof with_nul - 1 && memcmp(text, with_nul, length) == 0);
  edge_free(text);
  edge_free(ids);
  int32_t negative = -3;
  CHECK_STATUS(edge_tokenizer_decode(tokenizer, &negative, 1, 0, &text, &length), EDGE_ERROR_INVALID_ARGUMENT);
  const char *bytes;
  CHECK_STATUS(edge_tokenizer_token_bytes(tokenizer, -1, &bytes, &length), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_tokenizer_token_bytes(tokenizer, 2048, &bytes, &length), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(edge_tokenizer_is_special(tokenizer, 0) && edge_tokenizer_is_special(tokenizer, 1));
  int32_t bos = -2, eos = -2;
  int adds_bos = -1;
  CHECK_STATUS(edge_tokenizer_special_tokens(tokenizer, &bos, &eos, &adds_bos), EDGE_OK);
  CHECK(bos == 0 && eos == 1 && adds_bos == 1); /* <s>, </s>, add_bos_token true */
  CHECK(edge_tokenizer_vocab_size(tokenizer) == 2048 && edge_tokenizer_vocab_size(NULL) == 0);
  CHECK_STATUS(edge_tokenizer_special_tokens(tokenizer, &bos, NULL, &adds_bos), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(edge_tokenizer_last_error(tokenizer), "edge_tokenizer_special_tokens: NULL argument") == 0);
  CHECK_STATUS(edge_tokenizer_special_tokens(NULL, &bos, &eos, &adds_bos), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK(!edge_tokenizer_is_special(tokenizer, 100) && !edge_tokenizer_is_special(tokenizer, -5));
  edge_tokenizer_destroy(tokenizer);
}

struct failing_job {
  edge_model *model;
  edge_tokenizer *tokenizer;
  const char *model_message; /* what edge_model_last_error gave this thread */
};

/* Fails once on the model and once on the tokenizer (with a message other than the main thread's). */
static void *fail_on_thread(void *argument) {
  struct failing_job *job = argument;
  edge_model_eos_tokens(job->model, NULL, NULL);
  job->model_message = edge_model_last_error(job->model);
  int32_t *ids = NULL;
  size_t n = 0;
  edge_tokenizer_encode(job->tokenizer, "x", 1, 7, &ids, &n);
  return NULL;
}

/* A handle's message is the last failure of any thread on it, read as a copy of the reading thread's: a message
 * already read stays whole while another thread fails on the same handle (the handle's own buffer, read without its
 * lock, could be seen half-written). */
static void check_handle_messages_across_threads(edge_model *model) {
  edge_tokenizer *tokenizer;
  CHECK_STATUS(edge_tokenizer_create(model, &tokenizer), EDGE_OK);
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK_STATUS(edge_tokenizer_encode(tokenizer, "a\xff", 2, 0, &ids, &n), EDGE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(edge_model_eos_tokens(model, NULL, &n), EDGE_ERROR_INVALID_ARGUMENT);
  const char *model_message = edge_model_last_error(model);
  const char *tokenizer_message = edge_tokenizer_last_error(tokenizer);
  char model_before[1024], tokenizer_before[1024];
  snprintf(model_before, sizeof model_before, "%s", model_message);
  snprintf(tokenizer_before, sizeof tokenizer_before, "%s", tokenizer_message);
  struct failing_job job = {model, tokenizer, NULL};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, fail_on_thread, &job) == 0);
  pthread_join(thread, NULL);
  CHECK(job.model_message != NULL && job.model_message != model_message); /* each thread reads its own copy */
  CHECK(strcmp(model_message, model_before) == 0 && strstr(model_before, "NULL argument") != NULL);
  CHECK(strcmp(tokenizer_message, tokenizer_before) == 0 && strstr(tokenizer_before, "not valid UTF-8") != NULL);
  /* read again, the handles give the other thread's failures */
  CHECK(strstr(edge_tokenizer_last_error(tokenizer), "add_bos: expected -1, 0 or 1, found 7") != NULL);
  CHECK(strstr(edge_model_last_error(model), "edge_model_eos_tokens: NULL argument") != NULL);
  edge_tokenizer_destroy(tokenizer);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: edge_api_check SVD_BUNDLE SIGNBIT_BUNDLE\n");
    return 2;
  }
  check_basics();
  check_backends(argv[1]);
  check_open_options(argv[1], argv[2]);
  edge_status status;
  edge_model *model = open_model(argv[1], "cpu", -1.0, 0, 0, &status);
  CHECK(model != NULL);
  if (model != NULL) {
    check_session(model);
    check_tokenizer(model);
    check_handle_messages_across_threads(model);
    edge_model_close(model);
  }
  check_sequence_full(argv[1]);
  printf("checks: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
