/* edge_sdk.h: the C API of the edge-sdk runtime (libedge_sdk).
 *
 * Runs an edge-sdk bundle (the directory `edge-sdk export` writes: manifest.json, weights.safetensors,
 * tokenizer.json, ...) from C: open the bundle once as an edge_model, create one edge_session per
 * concurrent sequence, prefill a prompt, then decode one token at a time or call edge_session_generate.
 *
 *   edge_model *model;
 *   if (edge_model_open("bundle", NULL, &model) != EDGE_OK) { fprintf(stderr, "%s\n", edge_last_error()); ... }
 *   edge_session *session;
 *   edge_session_create(model, &session);
 *   edge_session_generate(session, prompt_ids, n_prompt, 64, on_token, user_data, &n_generated, &reason);
 *   edge_session_destroy(session);
 *   edge_model_close(model);
 *
 * Conventions
 * - Every call that can fail returns an edge_status; EDGE_OK (0) is success. Results come back through
 *   out-parameters, which are written only on success unless a function says otherwise.
 * - The message of a failure names the file, field or argument and the expected and found values. It is
 *   kept per thread (edge_last_error: every failing call on this thread, including edge_model_open, which has
 *   no handle yet) and per handle (edge_model_last_error, edge_session_last_error, edge_tokenizer_last_error).
 * - The library never calls exit() or abort() and never prints; bad input is an error status. What TensorRT logs
 *   (the tensorrt backend) goes to the callback of edge_set_log_callback, if one is set.
 * - Token ids are int32_t and must lie in [0, vocab_size).
 * - Memory the library allocates for the caller (edge_tokenizer_encode / decode) is freed with edge_free.
 *
 * Thread safety
 * - An edge_model is read-only after edge_model_open: any number of threads may create and use sessions and
 *   tokenizers of one model concurrently. Close the model only after every session of it is destroyed.
 * - An edge_session is not thread-safe: use each session from one thread at a time (one session per thread).
 * - An edge_tokenizer is read-only after creation and may be shared by threads. A handle's last-error message
 *   (model, tokenizer) is the last failure of any thread on it; edge_last_error() is the calling thread's own.
 * - Within one call the CPU engine runs its kernels on `threads` OpenMP threads.
 *
 * This header is plain C99 and C++-compatible.
 */
#ifndef EDGE_SDK_H
#define EDGE_SDK_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define EDGE_API
#elif defined(__GNUC__)
#define EDGE_API __attribute__((visibility("default")))
#else
#define EDGE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define EDGE_SDK_VERSION_MAJOR 0
#define EDGE_SDK_VERSION_MINOR 1
#define EDGE_SDK_VERSION_PATCH 0

/** Result of every fallible call. */
typedef enum edge_status {
  EDGE_OK = 0,
  EDGE_ERROR_INVALID_ARGUMENT = 1, /**< a NULL pointer, a size or token id out of range, an unknown option value */
  EDGE_ERROR_IO = 2,               /**< a file or directory is missing or unreadable */
  EDGE_ERROR_BUNDLE = 3,           /**< the bundle is corrupt or inconsistent (JSON, checksum, size, shape, dtype) */
  EDGE_ERROR_UNSUPPORTED = 4,      /**< a valid bundle uses something this library cannot run (bf16, tokenizer kind) */
  EDGE_ERROR_UNAVAILABLE = 5,      /**< the requested backend is not part of this build or not usable here */
  EDGE_ERROR_OUT_OF_MEMORY = 6,    /**< an allocation or memory map failed */
  EDGE_ERROR_SEQUENCE_FULL = 7,    /**< the KV cache holds max_seq_len positions already */
  EDGE_ERROR_STATE = 8,            /**< wrong call order, e.g. decode or sample before prefill */
  EDGE_ERROR_INTERNAL = 9          /**< a bug in the library; the message says where */
} edge_status;

/** Why edge_session_generate stopped. */
typedef enum edge_stop_reason {
  EDGE_STOP_MAX_TOKENS = 0,   /**< max_new_tokens tokens were generated */
  EDGE_STOP_EOS = 1,          /**< the model produced an eos token (not passed to the callback) */
  EDGE_STOP_CALLBACK = 2,     /**< the callback returned nonzero */
  EDGE_STOP_SEQUENCE_FULL = 3 /**< prompt + generated tokens reached max_seq_len */
} edge_stop_reason;

typedef struct edge_options edge_options;
typedef struct edge_model edge_model;
typedef struct edge_session edge_session;
typedef struct edge_tokenizer edge_tokenizer;

/** Version of edge-sdk this library was built from, e.g. "0.1.0". Never NULL. */
EDGE_API const char *edge_version(void);

/** Static name of a status, e.g. "EDGE_ERROR_BUNDLE"; "EDGE_UNKNOWN_STATUS" for values outside the enum. */
EDGE_API const char *edge_status_name(edge_status status);

/** Message of the last failed call on the calling thread ("" when none failed yet, or when the last call on this
 * thread succeeded: every call clears it first). Valid until the next call into the library on this thread. */
EDGE_API const char *edge_last_error(void);

/** Frees memory the library returned to the caller (encode / decode results). NULL is a no-op. */
EDGE_API void edge_free(void *memory);

/** Severity of a logged message. */
typedef enum edge_log_level {
  EDGE_LOG_ERROR = 0,  /**< the failing call's message quotes the last one too */
  EDGE_LOG_WARNING = 1 /**< e.g. TensorRT on an engine that runs, but slower than it could */
} edge_log_level;

/** Receives one logged message: `source` names who wrote it ("TensorRT"); `source` and `message` are valid during
 * the call only. It may be called from several threads at once, and from threads TensorRT starts. */
typedef void (*edge_log_callback)(edge_log_level level, const char *source, const char *message, void *user_data);

/** Sets the process-wide receiver of the log of what the library runs on (TensorRT's warnings and errors), with
 * user_data passed back to it; NULL (the default) drops the messages. Takes effect for messages logged after it
 * returns; a callback that was replaced may still be running on another thread. */
EDGE_API void edge_set_log_callback(edge_log_callback callback, void *user_data);

/* ---- Options ------------------------------------------------------------------------------------------ */

/** Creates options with the defaults: backend "cpu", threads 0 (all cores), the bundle's default sparsity
 * level, sparse decoding (dense 0), checksums verified, KV cache of the bundle's max_seq_len. */
EDGE_API edge_status edge_options_create(edge_options **out);
EDGE_API void edge_options_destroy(edge_options *options);

/** "cpu" (the C engine) or "tensorrt". A build without TensorRT refuses "tensorrt" at edge_model_open
 * with EDGE_ERROR_UNAVAILABLE; there is no silent fallback to another backend. */
EDGE_API edge_status edge_options_set_backend(edge_options *options, const char *backend);
/** Threads for the kernels, 1 to 4096; 0 uses OpenMP's maximum (all cores unless OMP_NUM_THREADS says otherwise).
 * A negative count is EDGE_ERROR_INVALID_ARGUMENT. */
EDGE_API edge_status edge_options_set_threads(edge_options *options, int threads);
/** A sparsity level the bundle calibrated (manifest sparsity.levels, e.g. 0.5); a negative level means the
 * bundle's default_level. Bundles without levels (signbit, core, none) accept only a negative level. */
EDGE_API edge_status edge_options_set_sparsity(edge_options *options, double level);
/** Nonzero: decode the dense model: every FFN neuron's gate, up and down rows read and multiplied, zeros included
 * (what a runtime without activation sparsity computes: the baseline of the speedups); predictors are unused. */
EDGE_API edge_status edge_options_set_dense(edge_options *options, int dense);
/** Zero: skip the sha256 checks of the bundle's files (sizes and the manifest digest are still checked). */
EDGE_API edge_status edge_options_set_verify_checksums(edge_options *options, int verify);
/** KV cache length of each session, 1 <= max_seq_len <= the bundle's max_seq_len; 0 = the bundle's. */
EDGE_API edge_status edge_options_set_max_seq_len(edge_options *options, int max_seq_len);

/* ---- Backends ------------------------------------------------------------------------------------------- */

/** Whether `backend` ("cpu" or "tensorrt") can run here, before any bundle: EDGE_OK with *description (a static or
 * thread-local text, valid until the next probe on this thread) saying what runs, or EDGE_ERROR_UNAVAILABLE with
 * edge_last_error() saying why not. "cpu" says which instruction set its kernels run (a package's library holds one
 * build of them per instruction set and chooses the best this CPU has; the environment variable EDGE_SDK_CPU_ISA, e.g.
 * "avx2" or "neon", chooses another) and is unavailable only when EDGE_SDK_CPU_ISA names kernels this library or this
 * CPU does not have, as edge_model_open with backend "cpu" then is. "tensorrt" is unavailable, in this order, when
 * this build has no TensorRT engine, TensorRT is older than 10.3, there is no CUDA device, TensorRT cannot load
 * libedge_trt_plugins.so. "tensorrt" registers the plugin library with
 * the process's TensorRT plugin registry (once per process, as edge_model_open does), so a program that builds
 * engines through TensorRT's own API in this process finds the plugins there. */
EDGE_API edge_status edge_backend_probe(const char *backend, const char **description);

/** The TensorRT engine of a bundle on this device, for the program that builds it (`edge-sdk build`): *json (free
 * with edge_free) is one JSON object with the engine's key (tensorrt_version, gpu_name, compute_capability,
 * bundle_sha256), `directory`, `engine_file` and `metadata_file` (where backend "tensorrt" looks for model.engine and
 * engine.json), `metadata` (the object engine.json must hold), `cached` (true when both are there for this key) and
 * `reason` (why not, as edge_model_open would say; null when cached), `description` (the key in words), `backend`
 * and `plugin_library` (as edge_backend_probe), `device_memory_free` and `device_memory_total` (cudaMemGetInfo, in
 * bytes). cache_dir NULL means the cache backend "tensorrt" reads: $EDGE_SDK_ENGINE_CACHE, else
 * $XDG_CACHE_HOME/edge-sdk/tensorrt, else ~/.cache/edge-sdk/tensorrt. The bundle is opened as edge_model_open does
 * without the sha256 checks (sizes and manifest_sha256 are checked). Fails as edge_backend_probe("tensorrt") does,
 * or with the bundle's error. */
EDGE_API edge_status edge_tensorrt_engine_info(const char *bundle_dir, const char *cache_dir, char **json);

/* ---- Model --------------------------------------------------------------------------------------------- */

/** Opens and verifies a bundle directory with the rules of edge_sdk/bundle/README.md, the Python readers' rules:
 * manifest.json (strict JSON, every field, manifest_sha256, exactly the model's tensors), every listed file (a
 * regular file, no symbolic link, its size and sha256), the safetensors header against the manifest, and both
 * graphs' external data against the safetensors header. Weights are memory-mapped read-only and used in place.
 * options may be NULL (defaults). On failure *out is set to NULL and edge_last_error() says why (EDGE_ERROR_BUNDLE
 * for a bundle that breaks a rule, EDGE_ERROR_UNSUPPORTED for a newer format_version or an int4 bundle of format
 * version 1, whose codes are code + 8 rather than signed nibbles: re-export it). */
EDGE_API edge_status edge_model_open(const char *bundle_dir, const edge_options *options, edge_model **out);
/** Unmaps and frees the model. Every session of the model must be destroyed first. NULL is a no-op. */
EDGE_API void edge_model_close(edge_model *model);
/** Message of the last failed call on this model ("" when none), from whichever thread made it: a copy in a buffer of
 * the calling thread, valid until the next edge_model_last_error call on this thread. */
EDGE_API const char *edge_model_last_error(const edge_model *model);

EDGE_API int32_t edge_model_vocab_size(const edge_model *model);
/** KV cache length of the model's sessions (the option, or the bundle's max_seq_len). */
EDGE_API int32_t edge_model_max_seq_len(const edge_model *model);
/** The bos token id, or -1 when the model has none. */
EDGE_API int32_t edge_model_bos_token(const edge_model *model);
/** The eos token ids: *ids points into the model (valid until it is closed), *count may be 0. */
EDGE_API edge_status edge_model_eos_tokens(const edge_model *model, const int32_t **ids, size_t *count);
/** "cpu" or "tensorrt": the engine that runs this model. */
EDGE_API const char *edge_model_backend(const edge_model *model);
/** The bundle's predictor: "svd", "signbit", "core", "threshold" or "none". */
EDGE_API const char *edge_model_predictor(const edge_model *model);
/** The sparsity level in use, or -1 when decoding dense or the predictor has no levels. */
EDGE_API double edge_model_sparsity_level(const edge_model *model);

/* ---- Session -------------------------------------------------------------------------------------------- */

/** Creates a session with its own KV cache (preallocated: layers x max_seq_len x kv_heads x head_dim x 2
 * floats) and buffers. Sampling starts greedy. On failure *out is NULL and edge_last_error() says why. */
EDGE_API edge_status edge_session_create(edge_model *model, edge_session **out);
EDGE_API void edge_session_destroy(edge_session *session);
EDGE_API const char *edge_session_last_error(const edge_session *session);

/** Starts a new sequence with the n_ids >= 1 prompt tokens (dense FFNs; the core predictor picks its neurons
 * here) and keeps the logits of the last prompt position. Fails with EDGE_ERROR_SEQUENCE_FULL when
 * n_ids > max_seq_len. */
EDGE_API edge_status edge_session_prefill(edge_session *session, const int32_t *ids, size_t n_ids);
/** Feeds one token at the next position (predictor + sparse FFN) and keeps its logits. */
EDGE_API edge_status edge_session_decode(edge_session *session, int32_t token);
/** The logits [vocab_size] fp32 of the last prefill / decode, valid until the next prefill, decode, reset or
 * destroy of this session. EDGE_ERROR_STATE before the first prefill. */
EDGE_API edge_status edge_session_logits(const edge_session *session, const float **logits, int32_t *vocab_size);
/** Forgets the sequence; the next call must be edge_session_prefill. The sampling settings and RNG stay. */
EDGE_API edge_status edge_session_reset(edge_session *session);
/** Positions filled in the KV cache (prompt + decoded tokens). */
EDGE_API int32_t edge_session_position(const edge_session *session);

/** How edge_session_sample picks tokens. temperature 0 = greedy (argmax, ties to the lowest id); otherwise
 * logits / temperature, then top-k (0 = off), then top-p in (0, 1] (1 = off; smallest set of most probable
 * tokens with mass >= top_p, ties by lowest id), sampled with a PCG32 generator seeded with `seed`. The same
 * seed gives the same tokens on every platform; the stream is not numpy's, so sampled ids differ from the
 * Python runtime's (greedy ids are the same). Resets the RNG. */
EDGE_API edge_status edge_session_set_sampling(edge_session *session, float temperature, float top_p, int top_k,
                                               uint64_t seed);
/** Picks a token from the current logits with the session's sampling settings. */
EDGE_API edge_status edge_session_sample(edge_session *session, int32_t *token);

/** Called once per generated token; return nonzero to stop generating. */
typedef int (*edge_token_callback)(int32_t token, void *user_data);

/** Prefills the prompt, then samples and decodes until max_new_tokens tokens, an eos token of the model (not
 * passed to the callback), the callback returning nonzero, or a full sequence. The last token is not fed to
 * the model, so prompt + generated tokens fill at most max_seq_len positions. n_generated (tokens passed to
 * the callback, also written on failure) and reason may be NULL; callback may be NULL. The prompt must leave
 * room for one new token (n_prompt < max_seq_len, else EDGE_ERROR_SEQUENCE_FULL). */
EDGE_API edge_status edge_session_generate(edge_session *session, const int32_t *prompt, size_t n_prompt,
                                           int max_new_tokens, edge_token_callback callback, void *user_data,
                                           int32_t *n_generated, edge_stop_reason *reason);

/* ---- Tokenizer ----------------------------------------------------------------------------------------- */

/** Loads the bundle's tokenizer.json and, when the manifest lists it, tokenizer_config.json, whose bos_token /
 * eos_token (in the vocabulary), add_bos_token and chat_template must have their documented types. Supported:
 * byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer with its regex, BPE merges, no normalizer, special
 * added tokens matched in the text). Anything else is EDGE_ERROR_UNSUPPORTED; the id-level API above works
 * for every bundle regardless. On failure *out is NULL and edge_last_error() says why. */
EDGE_API edge_status edge_tokenizer_create(const edge_model *model, edge_tokenizer **out);
EDGE_API void edge_tokenizer_destroy(edge_tokenizer *tokenizer);
/** Message of the last failed call on this tokenizer ("" when none), from whichever thread made it: a copy in a
 * buffer of the calling thread, valid until the next edge_tokenizer_last_error call on this thread. */
EDGE_API const char *edge_tokenizer_last_error(const edge_tokenizer *tokenizer);

/** Encodes UTF-8 text (text_len bytes) to ids, exactly as the `tokenizers` library encodes it without
 * special-token templates. add_bos: 1 prepend bos, 0 do not, -1 as the tokenizer says: tokenizer_config.json's
 * add_bos_token, and without it whether tokenizer.json's post-processor puts bos first (transformers' rule).
 * *ids is allocated (free with edge_free; NULL when *n_ids is 0). Invalid UTF-8 and text_len above INT_MAX
 * (2^31 - 1) bytes are EDGE_ERROR_INVALID_ARGUMENT. */
EDGE_API edge_status edge_tokenizer_encode(const edge_tokenizer *tokenizer, const char *text, size_t text_len,
                                           int add_bos, int32_t **ids, size_t *n_ids);
/** Decodes ids to UTF-8 text as `tokenizers` decode does (invalid byte sequences become U+FFFD).
 * skip_special: nonzero leaves out special tokens (bos, eos). *text is allocated and NUL-terminated (free with
 * edge_free); *text_len (may be NULL) excludes the NUL. */
EDGE_API edge_status edge_tokenizer_decode(const edge_tokenizer *tokenizer, const int32_t *ids, size_t n_ids,
                                           int skip_special, char **text, size_t *text_len);
/** The raw bytes of one token (byte-level decoded, not necessarily a whole UTF-8 character), for streaming:
 * writing the bytes of consecutive tokens reproduces the text. Special tokens give their text. *bytes points
 * into the tokenizer, valid until it is destroyed. */
EDGE_API edge_status edge_tokenizer_token_bytes(const edge_tokenizer *tokenizer, int32_t token,
                                                const char **bytes, size_t *n_bytes);
/** Ids the tokenizer knows: [0, vocab size), its vocabulary and added tokens (0 for NULL). */
EDGE_API int32_t edge_tokenizer_vocab_size(const edge_tokenizer *tokenizer);
/** tokenizer_config.json's bos and eos tokens (-1: none; the model's own eos ids, config.json's, are
 * edge_model_eos_tokens) and whether encode with add_bos -1 prepends bos (*adds_bos 1 or 0). */
EDGE_API edge_status edge_tokenizer_special_tokens(const edge_tokenizer *tokenizer, int32_t *bos, int32_t *eos,
                                                   int *adds_bos);
/** Nonzero when token is a special (added) token such as bos or eos. */
EDGE_API int edge_tokenizer_is_special(const edge_tokenizer *tokenizer, int32_t token);

#ifdef __cplusplus
}
#endif

#endif
