/* The public C API (edge_sdk.h): argument checks, handles and their error messages, the engine choice and
 * the generation loop. The math lives in the engines (cpu_engine.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_cpu_kernels.h"
#include "edge_sdk.h"
#include "model.h"
#ifdef EDGE_SDK_HAVE_TENSORRT
#include "trt_engine.h"
#endif

#ifndef EDGE_SDK_VERSION
#define EDGE_SDK_VERSION "unknown"
#endif

#define TENSORRT_UNAVAILABLE                                                                                     \
  "backend 'tensorrt': this build of libedge_sdk has no TensorRT engine (TensorRT not found at build time): rebuild " \
  "it where TensorRT 10.3 or later (NvInfer.h, libnvinfer) and the CUDA runtime are installed "                      \
  "(plugins/tensorrt/JETSON.md)"

const char *edge_version(void) { return EDGE_SDK_VERSION; }

static void copy_message(char *destination) {
  snprintf(destination, EDGE_MESSAGE_SIZE, "%s", edge_last_error());
}

/* Records the thread's message on the model (the model may be shared, so under its lock). */
static edge_status model_failed(const edge_model *model, edge_status status) {
  edge_model *mutable_model = (edge_model *)model;
  edge_record_shared_message(&mutable_model->error_lock, mutable_model->error);
  return status;
}

static edge_status session_failed(edge_session *session, edge_status status) {
  copy_message(session->error);
  return status;
}

/* ---- Options -------------------------------------------------------------------------------------------- */

edge_status edge_options_create(edge_options **out) {
  edge_clear_error();
  if (out == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_options_create: out is NULL");
  edge_options *options = calloc(1, sizeof *options);
  if (options == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "edge_options_create: out of memory");
  snprintf(options->backend, sizeof options->backend, "cpu");
  options->sparsity = -1.0;
  options->verify_checksums = 1;
  *out = options;
  return EDGE_OK;
}

void edge_options_destroy(edge_options *options) { free(options); }

edge_status edge_options_set_backend(edge_options *options, const char *backend) {
  edge_clear_error();
  if (options == NULL || backend == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_options_set_backend: NULL argument");
  if (strcmp(backend, "cpu") != 0 && strcmp(backend, "tensorrt") != 0) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "backend: expected 'cpu' or 'tensorrt', found '%.64s'", backend);
  }
  snprintf(options->backend, sizeof options->backend, "%s", backend);
  return EDGE_OK;
}

edge_status edge_options_set_threads(edge_options *options, int threads) {
  edge_clear_error();
  if (options == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_options_set_threads: options is NULL");
  if (threads < 0 || threads > 4096) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "threads: expected 0 (every core) to 4096, found %d", threads);
  }
  options->threads = threads;
  return EDGE_OK;
}

edge_status edge_options_set_sparsity(edge_options *options, double level) {
  edge_clear_error();
  if (options == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_options_set_sparsity: options is NULL");
  if (isnan(level) || level > 1.0) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "sparsity: expected a level in [0, 1] or negative for the bundle's "
                     "default, found %g", level);
  }
  options->sparsity = level < 0.0 ? -1.0 : level;
  return EDGE_OK;
}

edge_status edge_options_set_dense(edge_options *options, int dense) {
  edge_clear_error();
  if (options == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_options_set_dense: options is NULL");
  options->dense = dense != 0;
  return EDGE_OK;
}

edge_status edge_options_set_verify_checksums(edge_options *options, int verify) {
  edge_clear_error();
  if (options == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_options_set_verify_checksums: options is NULL");
  options->verify_checksums = verify != 0;
  return EDGE_OK;
}

edge_status edge_options_set_max_seq_len(edge_options *options, int max_seq_len) {
  edge_clear_error();
  if (options == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_options_set_max_seq_len: options is NULL");
  if (max_seq_len < 0) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "max_seq_len: expected >= 1, or 0 for the bundle's, found %d", max_seq_len);
  }
  options->max_seq_len = max_seq_len;
  return EDGE_OK;
}

/* ---- Backends ------------------------------------------------------------------------------------------- */

/* The CPU engine runs wherever the library does; what can stop it is $EDGE_SDK_CPU_ISA naming kernels this library
 * or this CPU does not have (edge_cpu_kernels.h), which the kernels themselves cannot refuse. */
static edge_status cpu_probe(const char **description) {
  static _Thread_local char text[256];
  const char *problem = edge_cpu_isa_error();
  if (problem != NULL) return edge_fail(EDGE_ERROR_UNAVAILABLE, "%s", problem);
  snprintf(text, sizeof text, "the C engine on the CPU kernels (%s; this library holds: %s)", edge_cpu_isa(),
           edge_cpu_isas());
  *description = text;
  return EDGE_OK;
}

edge_status edge_backend_probe(const char *backend, const char **description) {
  edge_clear_error();
  if (backend == NULL || description == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_backend_probe: NULL argument");
  if (strcmp(backend, "cpu") == 0) return cpu_probe(description);
  if (strcmp(backend, "tensorrt") != 0) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "backend: expected 'cpu' or 'tensorrt', found '%.64s'", backend);
  }
#ifdef EDGE_SDK_HAVE_TENSORRT
  return trt_probe(description);
#else
  return edge_fail(EDGE_ERROR_UNAVAILABLE, TENSORRT_UNAVAILABLE);
#endif
}

edge_status edge_tensorrt_engine_info(const char *bundle_dir, const char *cache_dir, char **json) {
  edge_clear_error();
  if (bundle_dir == NULL || json == NULL) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_tensorrt_engine_info: NULL argument");
  }
  *json = NULL;
#ifdef EDGE_SDK_HAVE_TENSORRT
  struct bundle bundle;
  edge_status status = bundle_open(bundle_dir, 0, &bundle);
  if (status != EDGE_OK) return status;
  status = trt_engine_info(&bundle, cache_dir, json);
  bundle_close(&bundle);
  return status;
#else
  (void)cache_dir;
  return edge_fail(EDGE_ERROR_UNAVAILABLE, TENSORRT_UNAVAILABLE);
#endif
}

/* ---- Model ---------------------------------------------------------------------------------------------- */

edge_status edge_model_open(const char *bundle_dir, const edge_options *options, edge_model **out) {
  edge_clear_error();
  if (out == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_model_open: out is NULL");
  *out = NULL;
  if (bundle_dir == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_model_open: bundle_dir is NULL");
  edge_options defaults = {.backend = "cpu", .sparsity = -1.0, .verify_checksums = 1};
  if (options == NULL) options = &defaults;
  const struct engine_ops *ops = NULL;
  if (strcmp(options->backend, "cpu") == 0) {
    const char *description;
    edge_status usable = cpu_probe(&description);
    if (usable != EDGE_OK) return usable;
    ops = &cpu_engine_ops;
  } else if (strcmp(options->backend, "tensorrt") == 0) {
#ifdef EDGE_SDK_HAVE_TENSORRT
    ops = &trt_engine_ops;
#else
    return edge_fail(EDGE_ERROR_UNAVAILABLE, TENSORRT_UNAVAILABLE);
#endif
  } else {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "backend: expected 'cpu' or 'tensorrt', found '%s'", options->backend);
  }
  edge_model *model = calloc(1, sizeof *model);
  if (model == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "edge_model_open: out of memory");
  model->options = *options;
  model->ops = ops;
  pthread_mutex_init(&model->error_lock, NULL);
  edge_status status = bundle_open(bundle_dir, options->verify_checksums, &model->bundle);
  if (status == EDGE_OK) status = model_read_config(&model->bundle, options, &model->config, &model->sparsity);
  if (status == EDGE_OK) status = ops->load(model, &model->engine);
  if (status != EDGE_OK) {
    bundle_close(&model->bundle);
    pthread_mutex_destroy(&model->error_lock);
    free(model);
    return status;
  }
  *out = model;
  return EDGE_OK;
}

void edge_model_close(edge_model *model) {
  if (model == NULL) return;
  model->ops->unload(model->engine);
  bundle_close(&model->bundle);
  pthread_mutex_destroy(&model->error_lock);
  free(model);
}

const char *edge_model_last_error(const edge_model *model) {
  static _Thread_local char copy[EDGE_MESSAGE_SIZE]; /* its own: reading a tokenizer's message leaves it */
  if (model == NULL) return "model is NULL";
  edge_model *mutable_model = (edge_model *)model;
  return edge_read_shared_message(&mutable_model->error_lock, mutable_model->error, copy);
}

int32_t edge_model_vocab_size(const edge_model *model) { return model == NULL ? 0 : model->config.vocab_size; }

int32_t edge_model_max_seq_len(const edge_model *model) { return model == NULL ? 0 : model->config.max_seq_len; }

int32_t edge_model_bos_token(const edge_model *model) { return model == NULL ? -1 : model->config.bos_token_id; }

edge_status edge_model_eos_tokens(const edge_model *model, const int32_t **ids, size_t *count) {
  edge_clear_error();
  if (model == NULL || ids == NULL || count == NULL) {
    edge_status status = edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_model_eos_tokens: NULL argument");
    return model == NULL ? status : model_failed(model, status);
  }
  *ids = model->config.eos_token_ids;
  *count = (size_t)model->config.n_eos_tokens;
  return EDGE_OK;
}

const char *edge_model_backend(const edge_model *model) { return model == NULL ? "" : model->ops->name; }

const char *edge_model_predictor(const edge_model *model) {
  return model == NULL ? "" : predictor_name(model->sparsity.predictor);
}

double edge_model_sparsity_level(const edge_model *model) {
  if (model == NULL || model->sparsity.dense || model->sparsity.level_index < 0) return -1.0;
  return model->sparsity.levels[model->sparsity.level_index];
}

/* ---- Session -------------------------------------------------------------------------------------------- */

edge_status edge_session_create(edge_model *model, edge_session **out) {
  edge_clear_error();
  if (out == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_create: out is NULL");
  *out = NULL;
  if (model == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_create: model is NULL");
  edge_session *session = calloc(1, sizeof *session);
  float *logits = calloc((size_t)model->config.vocab_size, sizeof(float));
  if (session == NULL || logits == NULL) {
    free(session);
    free(logits);
    return model_failed(model, edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "edge_session_create: out of memory"));
  }
  edge_status status = model->ops->session_create(model, &session->state);
  if (status != EDGE_OK) {
    free(session);
    free(logits);
    return model_failed(model, status);
  }
  session->model = model;
  session->logits = logits;
  sampler_init(&session->sampler);
  *out = session;
  return EDGE_OK;
}

void edge_session_destroy(edge_session *session) {
  if (session == NULL) return;
  session->model->ops->session_destroy(session->state);
  sampler_free(&session->sampler);
  free(session->logits);
  free(session);
}

const char *edge_session_last_error(const edge_session *session) {
  return session == NULL ? "session is NULL" : session->error;
}

static edge_status check_token(const edge_session *session, int32_t token, const char *what) {
  int32_t vocab = session->model->config.vocab_size;
  if (token < 0 || token >= vocab) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "%s: expected token ids in [0, %d), found %d", what, vocab, token);
  }
  return EDGE_OK;
}

static edge_status prefill(edge_session *session, const int32_t *ids, size_t n_ids) {
  if (ids == NULL || n_ids == 0) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "prefill: expected at least one token, found %s",
                     ids == NULL ? "ids = NULL" : "n_ids = 0");
  }
  int max_seq_len = session->model->config.max_seq_len;
  if (n_ids > (size_t)max_seq_len) {
    return edge_fail(EDGE_ERROR_SEQUENCE_FULL, "prefill: %zu tokens do not fit the KV cache of %d positions", n_ids,
                     max_seq_len);
  }
  for (size_t i = 0; i < n_ids; i++) {
    edge_status status = check_token(session, ids[i], "prefill");
    if (status != EDGE_OK) return status;
  }
  session->position = 0;
  session->has_logits = 0;
  edge_status status = session->model->ops->prefill(session->state, ids, (int)n_ids, session->logits);
  if (status != EDGE_OK) return status;
  session->position = (int)n_ids;
  session->has_logits = 1;
  return EDGE_OK;
}

static edge_status decode(edge_session *session, int32_t token) {
  if (!session->has_logits) return edge_fail(EDGE_ERROR_STATE, "decode: call edge_session_prefill first");
  edge_status status = check_token(session, token, "decode");
  if (status != EDGE_OK) return status;
  if (session->position >= session->model->config.max_seq_len) {
    return edge_fail(EDGE_ERROR_SEQUENCE_FULL, "decode: the sequence fills all %d positions of the KV cache",
                     session->model->config.max_seq_len);
  }
  status = session->model->ops->decode(session->state, token, session->position, session->logits);
  if (status != EDGE_OK) {
    session->has_logits = 0; /* the cache at this position is partly written: start over with a prefill */
    return status;
  }
  session->position++;
  return EDGE_OK;
}

edge_status edge_session_prefill(edge_session *session, const int32_t *ids, size_t n_ids) {
  edge_clear_error();
  if (session == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_prefill: session is NULL");
  edge_status status = prefill(session, ids, n_ids);
  return status == EDGE_OK ? EDGE_OK : session_failed(session, status);
}

edge_status edge_session_decode(edge_session *session, int32_t token) {
  edge_clear_error();
  if (session == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_decode: session is NULL");
  edge_status status = decode(session, token);
  return status == EDGE_OK ? EDGE_OK : session_failed(session, status);
}

edge_status edge_session_logits(const edge_session *session, const float **logits, int32_t *vocab_size) {
  edge_clear_error();
  if (session == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_logits: session is NULL");
  if (logits == NULL) {
    return session_failed((edge_session *)session,
                          edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_logits: logits is NULL"));
  }
  if (!session->has_logits) {
    return session_failed((edge_session *)session,
                          edge_fail(EDGE_ERROR_STATE, "logits: call edge_session_prefill first"));
  }
  *logits = session->logits;
  if (vocab_size != NULL) *vocab_size = session->model->config.vocab_size;
  return EDGE_OK;
}

edge_status edge_session_reset(edge_session *session) {
  edge_clear_error();
  if (session == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_reset: session is NULL");
  session->position = 0;
  session->has_logits = 0;
  return EDGE_OK;
}

int32_t edge_session_position(const edge_session *session) { return session == NULL ? 0 : session->position; }

edge_status edge_session_set_sampling(edge_session *session, float temperature, float top_p, int top_k,
                                      uint64_t seed) {
  edge_clear_error();
  if (session == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_set_sampling: session is NULL");
  edge_status status = sampler_configure(&session->sampler, temperature, top_p, top_k, seed);
  return status == EDGE_OK ? EDGE_OK : session_failed(session, status);
}

static edge_status sample(edge_session *session, int32_t *token) {
  if (!session->has_logits) return edge_fail(EDGE_ERROR_STATE, "sample: call edge_session_prefill first");
  return sampler_sample(&session->sampler, session->logits, session->model->config.vocab_size, token);
}

edge_status edge_session_sample(edge_session *session, int32_t *token) {
  edge_clear_error();
  if (session == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_sample: session is NULL");
  if (token == NULL) {
    return session_failed(session, edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_sample: token is NULL"));
  }
  edge_status status = sample(session, token);
  return status == EDGE_OK ? EDGE_OK : session_failed(session, status);
}

static int is_eos(const struct model_config *config, int32_t token) {
  for (int i = 0; i < config->n_eos_tokens; i++) {
    if (config->eos_token_ids[i] == token) return 1;
  }
  return 0;
}

/* The loop of edge_sdk/runtime/generator.py Generator._sample. */
static edge_status generate(edge_session *session, const int32_t *prompt, size_t n_prompt, int max_new_tokens,
                            edge_token_callback callback, void *user_data, int32_t *n_generated,
                            edge_stop_reason *reason) {
  const struct model_config *config = &session->model->config;
  *n_generated = 0;
  *reason = EDGE_STOP_MAX_TOKENS;
  if (max_new_tokens < 0) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "max_new_tokens: expected an integer >= 0, found %d", max_new_tokens);
  }
  /* named as generate's own argument, in the words of the Python Generator (_check_prompt), not as the prefill */
  if (n_prompt == 0 || prompt == NULL) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "prompt: expected at least one token, found %s",
                     n_prompt == 0 ? "an empty prompt" : "prompt = NULL");
  }
  if (n_prompt >= (size_t)config->max_seq_len) {
    return edge_fail(EDGE_ERROR_SEQUENCE_FULL, "prompt: %zu tokens, but max_seq_len is %d and must leave room for at "
                     "least one new token; shorten the prompt", n_prompt, config->max_seq_len);
  }
  edge_status status = prefill(session, prompt, n_prompt);
  if (status != EDGE_OK || max_new_tokens == 0) return status;
  for (;;) {
    int32_t token;
    if ((status = sample(session, &token)) != EDGE_OK) return status;
    if (is_eos(config, token)) {
      *reason = EDGE_STOP_EOS;
      return EDGE_OK;
    }
    ++*n_generated;
    if (callback != NULL && callback(token, user_data) != 0) {
      *reason = EDGE_STOP_CALLBACK;
      return EDGE_OK;
    }
    if (*n_generated == max_new_tokens) return EDGE_OK;
    if ((int64_t)n_prompt + *n_generated >= config->max_seq_len) {
      *reason = EDGE_STOP_SEQUENCE_FULL;
      return EDGE_OK;
    }
    if ((status = decode(session, token)) != EDGE_OK) return status;
  }
}

edge_status edge_session_generate(edge_session *session, const int32_t *prompt, size_t n_prompt,
                                  int max_new_tokens, edge_token_callback callback, void *user_data,
                                  int32_t *n_generated, edge_stop_reason *reason) {
  edge_clear_error();
  if (session == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_session_generate: session is NULL");
  int32_t generated;
  edge_stop_reason stop;
  edge_status status = generate(session, prompt, n_prompt, max_new_tokens, callback, user_data, &generated, &stop);
  if (n_generated != NULL) *n_generated = generated;
  if (reason != NULL) *reason = stop;
  return status == EDGE_OK ? EDGE_OK : session_failed(session, status);
}
