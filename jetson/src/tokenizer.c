/* Byte-level BPE tokenizer (GPT-2 style) read from a Hugging Face tokenizer.json, encoding and decoding exactly
 * as the `tokenizers` library does for that kind of file:
 *   1. added tokens (e.g. <s>, </s>) are found in the text first, leftmost-longest, and become their ids: those
 *      with normalized false in the whole text, then the others in the pieces between (tokenizers' two passes);
 *   2. the text between them is split by the ByteLevel pre-tokenizer's regex (with SmolLM2's pre-tokenizer, a
 *      Split isolating \p{N} before ByteLevel, within each piece between numbers, every number alone)
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (matched by hand below; \s is Unicode White_Space, \p{L} / \p{N} the categories of unicode_tables.h);
 *   3. each piece's UTF-8 bytes become byte-level symbols, merged by BPE: repeatedly the adjacent pair of lowest
 *      merge rank, the leftmost on ties (the priority queue of tokenizers' Word::merge_all);
 *   decode maps every token's characters back to bytes (ByteLevel decoder) and replaces invalid UTF-8 with
 *   U+FFFD per maximal invalid subsequence (Rust's String::from_utf8_lossy).
 * Anything else in tokenizer.json (normalizers, other pre-tokenizers or models, byte fallback, added tokens with
 * lstrip / rstrip / single_word) is refused with EDGE_ERROR_UNSUPPORTED rather than encoded differently. */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "json_strict.h"
#include "model.h"
#include "unicode_tables.h"

#define MAX_TOKENS (1 << 24)
#define MAX_TOKENIZER_JSON_BYTES ((size_t)64 << 20) /* tokenizer.json and tokenizer_config.json (model/tokenizer.py) */

/* 16 bytes each, as vocab_entry: a 49k vocabulary's two tables are 1.6 MB (at 24 bytes, 2.4 MB). A token's bytes
 * fit 32 bits (tokenizer.json is at most MAX_TOKENIZER_JSON_BYTES). */
struct token_entry {
  char *bytes;      /* decoded bytes (ByteLevel decoder), NUL-terminated */
  uint32_t n_bytes;
  uint8_t present;  /* the id is in the vocabulary or the added tokens */
  uint8_t special;
};

struct vocab_entry {
  const char *text; /* the token as written in tokenizer.json (byte-level alphabet) */
  uint32_t length;
  int32_t id;
};

struct merge_slot {
  uint64_t pair; /* left id << 32 | right id; UINT64_MAX = empty */
  int32_t rank, merged;
};

struct added_token {
  char *content; /* its bytes (U+0000 a NUL byte) */
  size_t length;
  int32_t id;
  int normalized; /* tokenizers matches it in the pieces between the other added tokens, after those */
};

struct edge_tokenizer {
  struct token_entry *tokens; /* [n_tokens] by id */
  int32_t n_tokens;
  char *token_bytes;          /* storage of every token's bytes once the vocabulary is read (pack_token_bytes) */
  struct vocab_entry *vocab;  /* sorted by text */
  size_t n_vocab;
  char *vocab_text;           /* storage of the vocab texts */
  struct merge_slot *merges;  /* open addressing, capacity a power of two */
  size_t merge_capacity;
  struct added_token *added;
  size_t n_added;
  /* The added tokens by the pass of tokenizers' AddedVocabulary that matches them, each pass's sorted by content:
   * [0] those with normalized false, found in the whole text first, [1] the others, found in the pieces between. */
  const struct added_token **added_by_pass[2];
  size_t n_added_by_pass[2];
  int32_t byte_ids[256];      /* symbol of each byte, -1 when the vocabulary lacks it */
  int ignore_merges;
  int isolate_numbers;        /* every \p{N} code point is a piece of its own before the ByteLevel regex */
  int32_t bos_id, eos_id;     /* tokenizer_config.json's, -1: none */
  int add_bos;
  pthread_mutex_t error_lock; /* the tokenizer is shared by threads: its message is written and read under it */
  char error[EDGE_MESSAGE_SIZE];
};

/* ---- Unicode ----------------------------------------------------------------------------------------- */

static int in_ranges(uint32_t code, const struct code_range *ranges, size_t n) {
  size_t low = 0, high = n;
  while (low < high) {
    size_t mid = (low + high) / 2;
    if (code < ranges[mid].low) {
      high = mid;
    } else if (code > ranges[mid].high) {
      low = mid + 1;
    } else {
      return 1;
    }
  }
  return 0;
}

static int is_letter(uint32_t c) { return in_ranges(c, letter_ranges, sizeof letter_ranges / sizeof *letter_ranges); }

static int is_number(uint32_t c) { return in_ranges(c, number_ranges, sizeof number_ranges / sizeof *number_ranges); }

/* Unicode White_Space (what \s matches in the tokenizers library's regex engine). */
static int is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Length of the valid UTF-8 sequence at s[0:n] and its code point, or 0 when invalid (strict: no overlong
 * forms, no surrogates, at most U+10FFFF). */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *code) {
  unsigned char b = s[0];
  if (b < 0x80) {
    *code = b;
    return 1;
  }
  size_t length;
  uint32_t value, low = 0x80, high = 0xbf; /* allowed range of the second byte */
  if (b >= 0xc2 && b <= 0xdf) {
    length = 2, value = b & 0x1f;
  } else if (b >= 0xe0 && b <= 0xef) {
    length = 3, value = b & 0x0f;
    if (b == 0xe0) low = 0xa0;
    if (b == 0xed) high = 0x9f;
  } else if (b >= 0xf0 && b <= 0xf4) {
    length = 4, value = b & 0x07;
    if (b == 0xf0) low = 0x90;
    if (b == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  for (size_t i = 1; i < length; i++) {
    if (i >= n) return 0;
    unsigned char c = s[i];
    if (c < (i == 1 ? low : 0x80) || c > (i == 1 ? high : 0xbf)) return 0;
    value = value << 6 | (c & 0x3f);
  }
  *code = value;
  return length;
}

/* Bytes of the maximal prefix of a valid sequence at s (>= 1), for from_utf8_lossy's replacement. */
static size_t utf8_invalid_length(const unsigned char *s, size_t n) {
  unsigned char b = s[0];
  size_t length;
  unsigned char low = 0x80, high = 0xbf;
  if (b >= 0xc2 && b <= 0xdf) {
    length = 2;
  } else if (b >= 0xe0 && b <= 0xef) {
    length = 3, low = b == 0xe0 ? 0xa0 : 0x80, high = b == 0xed ? 0x9f : 0xbf;
  } else if (b >= 0xf0 && b <= 0xf4) {
    length = 4, low = b == 0xf0 ? 0x90 : 0x80, high = b == 0xf4 ? 0x8f : 0xbf;
  } else {
    return 1;
  }
  size_t i = 1;
  for (; i < length && i < n; i++) {
    unsigned char c = s[i];
    if (c < (i == 1 ? low : 0x80) || c > (i == 1 ? high : 0xbf)) break;
  }
  return i;
}

static size_t utf8_encode(uint32_t code, char *out) {
  if (code < 0x80) {
    out[0] = (char)code;
    return 1;
  }
  if (code < 0x800) {
    out[0] = (char)(0xc0 | code >> 6), out[1] = (char)(0x80 | (code & 0x3f));
    return 2;
  }
  if (code < 0x10000) {
    out[0] = (char)(0xe0 | code >> 12), out[1] = (char)(0x80 | ((code >> 6) & 0x3f)), out[2] = (char)(0x80 | (code & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | code >> 18), out[1] = (char)(0x80 | ((code >> 12) & 0x3f));
  out[2] = (char)(0x80 | ((code >> 6) & 0x3f)), out[3] = (char)(0x80 | (code & 0x3f));
  return 4;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 and up in byte order. */
static void byte_alphabet(uint32_t byte_to_code[256]) {
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byte_to_code[b] = printable ? b : next++;
  }
}

/* ---- Growable byte buffer ---------------------------------------------------------------------------- */

struct bytes {
  char *data;
  size_t size, capacity;
  int failed;
};

static void bytes_append(struct bytes *b, const void *data, size_t n) {
  if (b->failed) return;
  if (b->size + n + 1 > b->capacity) {
    size_t capacity = b->capacity ? b->capacity : 64;
    while (capacity < b->size + n + 1) capacity *= 2;
    char *grown = realloc(b->data, capacity);
    if (grown == NULL) {
      b->failed = 1;
      return;
    }
    b->data = grown, b->capacity = capacity;
  }
  memcpy(b->data + b->size, data, n);
  b->size += n;
  b->data[b->size] = '\0';
}

/* ---- Loading ------------------------------------------------------------------------------------------ */

static int compare_vocab(const void *a, const void *b) {
  const struct vocab_entry *x = a, *y = b;
  size_t n = x->length < y->length ? x->length : y->length;
  int order = memcmp(x->text, y->text, n);
  return order != 0 ? order : (x->length > y->length) - (x->length < y->length);
}

static int32_t vocab_lookup(const struct edge_tokenizer *t, const char *text, size_t length) {
  if (length > UINT32_MAX) return -1; /* longer than any token */
  struct vocab_entry key = {text, (uint32_t)length, 0};
  const struct vocab_entry *found = bsearch(&key, t->vocab, t->n_vocab, sizeof key, compare_vocab);
  return found != NULL ? found->id : -1;
}

static uint64_t hash_pair(uint64_t pair) {
  pair ^= pair >> 33;
  pair *= 0xff51afd7ed558ccdULL;
  pair ^= pair >> 33;
  return pair;
}

static struct merge_slot *merge_find(const struct edge_tokenizer *t, int32_t left, int32_t right) {
  uint64_t pair = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
  size_t mask = t->merge_capacity - 1;
  for (size_t i = hash_pair(pair) & mask;; i = (i + 1) & mask) {
    struct merge_slot *slot = &t->merges[i];
    if (slot->pair == pair || slot->pair == UINT64_MAX) return slot;
  }
}

static edge_status unsupported(const char *where, const char *what) {
  return edge_fail(EDGE_ERROR_UNSUPPORTED, "%s: %s; the C runtime supports byte-level BPE tokenizers (GPT-2 style) "
                   "only; use the id-level API with another tokenizer", where, what);
}

/* The top level of a tokenizers file as the tokenizers library reads it (Python's verdict on the same file): its
 * known fields only, and version "1.0" when given. */
static edge_status check_top_level(const cJSON *root, const char *where) {
  static const char *const fields[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "post_processor", "decoder", "model"};
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    size_t i = 0;
    while (i < sizeof fields / sizeof *fields && strcmp(item->string, fields[i]) != 0) i++;
    if (i == sizeof fields / sizeof *fields) {
      char shown[80];
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: not a valid tokenizers file (unknown field '%s')", where,
                       json_shown(item->string, shown, sizeof shown));
    }
  }
  const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
  if (version != NULL && !(cJSON_IsString(version) && strcmp(version->valuestring, "1.0") == 0)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: not a valid tokenizers file (version must be \"1.0\")", where);
  }
  return EDGE_OK;
}

/* The ByteLevel pre-tokenizer with the settings implemented here: no prefix space, the GPT-2 regex. */
static edge_status check_byte_level(const cJSON *pre, const char *where) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "ByteLevel") != 0) {
    return unsupported(where, "the pre_tokenizer is not ByteLevel (nor a Split of \\p{N} then ByteLevel)");
  }
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space"))) {
    return unsupported(where, "the ByteLevel pre_tokenizer has add_prefix_space true");
  }
  if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(pre, "use_regex"))) {
    return unsupported(where, "the ByteLevel pre_tokenizer has use_regex false");
  }
  return EDGE_OK;
}

/* A Split pre-tokenizer that isolates every \p{N} code point (SmolLM2's "smollm" pre-tokenizer puts one before
 * ByteLevel, so that numbers are encoded digit by digit). */
static int isolates_numbers(const cJSON *split) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(split, "type");
  const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(split, "pattern");
  const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
  const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(split, "behavior");
  return cJSON_IsString(type) && strcmp(type->valuestring, "Split") == 0 && cJSON_IsObject(pattern) &&
         cJSON_GetArraySize(pattern) == 1 && cJSON_IsString(regex) && strcmp(regex->valuestring, "\\p{N}") == 0 &&
         cJSON_IsString(behavior) && strcmp(behavior->valuestring, "Isolated") == 0 &&
         !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(split, "invert"));
}

/* The settings this tokenizer implements exactly; anything else is refused. The pre-tokenizer is ByteLevel, or a
 * Sequence of a Split isolating \p{N} and ByteLevel (*isolate_numbers set). */
static edge_status check_kind(const cJSON *root, const char *where, int *isolate_numbers) {
  const cJSON *normalizer = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
  if (normalizer != NULL && !cJSON_IsNull(normalizer)) return unsupported(where, "a normalizer is set");
  const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
  *isolate_numbers = 0;
  if (cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0) {
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    if (!cJSON_IsArray(steps) || cJSON_GetArraySize(steps) != 2 || !isolates_numbers(cJSON_GetArrayItem(steps, 0))) {
      return unsupported(where, "the pre_tokenizer Sequence is not a Split isolating \\p{N} followed by ByteLevel");
    }
    *isolate_numbers = 1;
    pre = cJSON_GetArrayItem(steps, 1);
  }
  edge_status status = check_byte_level(pre, where);
  if (status != EDGE_OK) return status;
  const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  type = cJSON_GetObjectItemCaseSensitive(decoder, "type");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "ByteLevel") != 0) {
    return unsupported(where, "the decoder is not ByteLevel");
  }
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  type = cJSON_GetObjectItemCaseSensitive(model, "type");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0) return unsupported(where, "the model is not BPE");
  static const char *must_be_null[] = {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"};
  for (size_t i = 0; i < sizeof must_be_null / sizeof *must_be_null; i++) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(model, must_be_null[i]);
    int empty_string = cJSON_IsString(item) && item->valuestring[0] == '\0';
    if (item != NULL && !cJSON_IsNull(item) && !empty_string) {
      char what[96];
      snprintf(what, sizeof what, "the BPE model sets '%s'", must_be_null[i]);
      return unsupported(where, what);
    }
  }
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"))) {
    return unsupported(where, "the BPE model uses byte_fallback");
  }
  return EDGE_OK;
}

static edge_status set_token(struct edge_tokenizer *t, int32_t id, const char *text, int special,
                             const int16_t code_to_byte[512], const char *where) {
  if (id < 0 || id >= t->n_tokens) return edge_fail(EDGE_ERROR_BUNDLE, "%s: token id %d out of range", where, id);
  struct token_entry *entry = &t->tokens[id];
  struct bytes decoded = {0};
  char *raw = strdup(text); /* the token's own bytes: json_strict.h spells U+0000 as C0 80 */
  if (raw == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  const unsigned char *s = (const unsigned char *)raw;
  size_t n = json_string_bytes(raw), i = 0;
  int mapped = 1;
  bytes_append(&decoded, "", 0);
  while (i < n && mapped) {
    uint32_t code;
    size_t length = utf8_decode(s + i, n - i, &code);
    if (length == 0) {
      free(decoded.data);
      free(raw);
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: token %d is not valid UTF-8", where, id);
    }
    if (code < 512 && code_to_byte[code] >= 0) {
      uint8_t byte = (uint8_t)code_to_byte[code];
      bytes_append(&decoded, &byte, 1);
    } else {
      mapped = 0; /* not in the byte-level alphabet: the ByteLevel decoder keeps the token's own UTF-8 */
    }
    i += length;
  }
  if (!mapped) {
    decoded.size = 0;
    bytes_append(&decoded, raw, n);
  }
  free(raw);
  if (decoded.failed) {
    free(decoded.data);
    return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  }
  free(entry->bytes);
  entry->bytes = decoded.data;
  entry->n_bytes = (uint32_t)decoded.size;
  entry->present = 1;
  entry->special = entry->special || special;
  return EDGE_OK;
}

/* Moves every token's bytes into one block, t->token_bytes: a block per token (49k of them in SmolLM2's vocabulary)
 * took about 64 bytes each, and, interleaved with the parse of tokenizer.json, kept its pages in the process once
 * the parse was freed. */
static edge_status pack_token_bytes(struct edge_tokenizer *t, const char *where) {
  size_t total = 0;
  for (int32_t i = 0; i < t->n_tokens; i++) total += t->tokens[i].bytes != NULL ? t->tokens[i].n_bytes + 1 : 0;
  t->token_bytes = malloc(total + 1);
  if (t->token_bytes == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  size_t at = 0;
  for (int32_t i = 0; i < t->n_tokens; i++) {
    struct token_entry *entry = &t->tokens[i];
    if (entry->bytes == NULL) continue;
    memcpy(t->token_bytes + at, entry->bytes, entry->n_bytes + 1);
    free(entry->bytes);
    entry->bytes = t->token_bytes + at;
    at += entry->n_bytes + 1;
  }
  return EDGE_OK;
}

/* spelled (a string of json_strict_parse) stands for bytes[0:length]. */
static int spells(const char *spelled, const char *bytes, size_t length) {
  size_t at = 0;
  for (const unsigned char *c = (const unsigned char *)spelled; *c != '\0'; c++, at++) {
    int nul = c[0] == 0xc0 && c[1] == 0x80;
    if (at >= length || bytes[at] != (nul ? '\0' : (char)*c)) return 0;
    c += nul;
  }
  return at == length;
}

/* The id tokenizers gives an added token, whatever id tokenizer.json writes (AddedVocabulary::add_tokens): its id in
 * the vocabulary, else the next one after the vocabulary (numbered by its size) and the added tokens before it
 * (max_added_id the largest of their ids, -1: none). */
static int32_t added_token_id(const struct edge_tokenizer *t, const char *content, int32_t max_added_id) {
  int32_t vocab_id = vocab_lookup(t, content, strlen(content));
  if (vocab_id >= 0) return vocab_id;
  int64_t vocab_size = (int64_t)t->n_vocab;
  if (max_added_id < 0) return vocab_size < MAX_TOKENS ? (int32_t)vocab_size : -1;
  return max_added_id >= vocab_size || vocab_size == 0 ? max_added_id + 1 : (int32_t)vocab_size;
}

static int compare_added(const void *a, const void *b) {
  const struct added_token *x = *(const struct added_token *const *)a, *y = *(const struct added_token *const *)b;
  size_t n = x->length < y->length ? x->length : y->length;
  int order = memcmp(x->content, y->content, n);
  return order != 0 ? order : (x->length > y->length) - (x->length < y->length);
}

/* t->added_by_pass from t->added; a token listed twice is refused (tokenizers would keep one of them by rules of its
 * own: the flags of the last, the id of the first). */
static edge_status sort_added_tokens(struct edge_tokenizer *t, const char *where) {
  const struct added_token **sorted = malloc((t->n_added + 1) * sizeof *sorted);
  const struct added_token **by_pass = malloc((t->n_added + 1) * sizeof *by_pass);
  if (sorted == NULL || by_pass == NULL) {
    free(sorted);
    free(by_pass);
    return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  }
  for (size_t i = 0; i < t->n_added; i++) sorted[i] = &t->added[i];
  qsort(sorted, t->n_added, sizeof *sorted, compare_added);
  for (size_t i = 1; i < t->n_added; i++) {
    if (compare_added(&sorted[i - 1], &sorted[i]) == 0) {
      char *spelled = json_string_from_bytes(sorted[i]->content, sorted[i]->length), shown[80];
      edge_status status = edge_fail(EDGE_ERROR_BUNDLE, "%s: added token '%s' is listed twice in added_tokens", where,
                                     spelled != NULL ? json_shown(spelled, shown, sizeof shown) : "?");
      free(spelled);
      free(sorted);
      free(by_pass);
      return status;
    }
  }
  size_t n = 0;
  for (int pass = 0; pass < 2; pass++) {
    t->added_by_pass[pass] = by_pass + n;
    for (size_t i = 0; i < t->n_added; i++) {
      if (sorted[i]->normalized == pass) by_pass[n++] = sorted[i];
    }
    t->n_added_by_pass[pass] = (size_t)(by_pass + n - t->added_by_pass[pass]);
  }
  free(sorted);
  return EDGE_OK;
}

static edge_status load_vocab(struct edge_tokenizer *t, const cJSON *vocab, const cJSON *added, const char *where,
                              const int16_t code_to_byte[512]) {
  const cJSON *item;
  int32_t max_id = -1;
  size_t text_bytes = 0;
  cJSON_ArrayForEach(item, vocab) {
    int64_t id;
    if (!json_integer(item, 0, MAX_TOKENS - 1, &id)) return edge_fail(EDGE_ERROR_BUNDLE, "%s: vocab ids must be integers in [0, 2^24)", where);
    max_id = (int32_t)id > max_id ? (int32_t)id : max_id;
    text_bytes += strlen(item->string) + 1;
  }
  cJSON_ArrayForEach(item, added) {
    int64_t id;
    if (json_int_field(item, "id", where, 0, MAX_TOKENS - 1, &id) != EDGE_OK) return EDGE_ERROR_BUNDLE;
    max_id = (int32_t)id > max_id ? (int32_t)id : max_id;
  }
  t->n_tokens = max_id + 1;
  t->n_vocab = (size_t)cJSON_GetArraySize(vocab);
  t->tokens = calloc((size_t)t->n_tokens + 1, sizeof *t->tokens);
  t->vocab = calloc(t->n_vocab + 1, sizeof *t->vocab);
  t->vocab_text = malloc(text_bytes + 1);
  if (t->tokens == NULL || t->vocab == NULL || t->vocab_text == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  size_t at = 0, index = 0;
  cJSON_ArrayForEach(item, vocab) {
    size_t length = strlen(item->string);
    memcpy(t->vocab_text + at, item->string, length + 1);
    t->vocab[index++] = (struct vocab_entry){t->vocab_text + at, (uint32_t)length, (int32_t)item->valuedouble};
    at += length + 1;
    /* tokenizers would decode such an id to either token, whichever its hash map happens to keep */
    int32_t id = (int32_t)item->valuedouble;
    if (t->tokens[id].present) return edge_fail(EDGE_ERROR_BUNDLE, "%s: vocab id %d is given to two tokens", where, id);
    edge_status status = set_token(t, id, item->string, 0, code_to_byte, where);
    if (status != EDGE_OK) return status;
  }
  qsort(t->vocab, t->n_vocab, sizeof *t->vocab, compare_vocab);
  for (size_t i = 1; i < t->n_vocab; i++) {
    if (compare_vocab(&t->vocab[i - 1], &t->vocab[i]) == 0) return edge_fail(EDGE_ERROR_BUNDLE, "%s: a vocab entry appears twice", where);
  }
  size_t n_added = (size_t)cJSON_GetArraySize(added);
  t->added = calloc(n_added + 1, sizeof *t->added);
  if (t->added == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  int32_t max_added_id = -1;
  cJSON_ArrayForEach(item, added) {
    const char *content = NULL;
    int special = 0;
    if (json_string_field(item, "content", where, &content) != EDGE_OK) return EDGE_ERROR_BUNDLE;
    if (content[0] == '\0') return edge_fail(EDGE_ERROR_BUNDLE, "%s: an added token has empty content", where);
    static const char *flags[] = {"single_word", "lstrip", "rstrip"};
    for (size_t i = 0; i < 3; i++) {
      if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(item, flags[i]))) {
        char what[160];
        snprintf(what, sizeof what, "added token '%.64s' sets %s", content, flags[i]);
        return unsupported(where, what);
      }
    }
    special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(item, "special"));
    const cJSON *normalized = cJSON_GetObjectItemCaseSensitive(item, "normalized");
    int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(item, "id")->valuedouble;
    int32_t expected = added_token_id(t, content, max_added_id);
    if (id != expected) {
      char shown[80];
      for (size_t k = 0; k < t->n_added; k++) {
        if (spells(content, t->added[k].content, t->added[k].length)) {
          return edge_fail(EDGE_ERROR_BUNDLE, "%s: added token '%s' is listed twice in added_tokens", where,
                           json_shown(content, shown, sizeof shown));
        }
      }
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: added token '%s' has id %d, but the tokenizers library gives it id %d "
                       "(%s)", where, json_shown(content, shown, sizeof shown), id, expected,
                       vocab_lookup(t, content, strlen(content)) >= 0
                           ? "its id in model.vocab"
                           : "the next id after model.vocab and the added tokens before it");
    }
    max_added_id = id > max_added_id ? id : max_added_id;
    edge_status status = set_token(t, id, content, special, code_to_byte, where);
    if (status != EDGE_OK) return status;
    struct added_token *token = &t->added[t->n_added++];
    token->content = strdup(content);
    if (token->content == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
    token->length = json_string_bytes(token->content); /* matched against the text's bytes */
    token->id = id;
    /* tokenizers' default (AddedToken::from(content, special)) when the file leaves it out */
    token->normalized = normalized != NULL ? cJSON_IsTrue(normalized) : !special;
  }
  edge_status status = sort_added_tokens(t, where);
  return status == EDGE_OK ? pack_token_bytes(t, where) : status;
}

/* One merge "a b" or ["a", "b"]: its two parts. */
static int merge_parts(const cJSON *merge, const char **left, size_t *left_length, const char **right,
                       size_t *right_length) {
  if (cJSON_IsString(merge)) {
    const char *space = strchr(merge->valuestring, ' ');
    if (space == NULL || strchr(space + 1, ' ') != NULL) return 0;
    *left = merge->valuestring, *left_length = (size_t)(space - merge->valuestring);
    *right = space + 1, *right_length = strlen(space + 1);
    return 1;
  }
  if (cJSON_IsArray(merge) && cJSON_GetArraySize(merge) == 2 && cJSON_IsString(cJSON_GetArrayItem(merge, 0)) &&
      cJSON_IsString(cJSON_GetArrayItem(merge, 1))) {
    *left = cJSON_GetArrayItem(merge, 0)->valuestring, *left_length = strlen(*left);
    *right = cJSON_GetArrayItem(merge, 1)->valuestring, *right_length = strlen(*right);
    return 1;
  }
  return 0;
}

static edge_status load_merges(struct edge_tokenizer *t, const cJSON *merges, const char *where) {
  size_t n = (size_t)cJSON_GetArraySize(merges);
  t->merge_capacity = 16;
  while (t->merge_capacity < 2 * n + 2) t->merge_capacity *= 2;
  t->merges = malloc(t->merge_capacity * sizeof *t->merges);
  if (t->merges == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  for (size_t i = 0; i < t->merge_capacity; i++) t->merges[i].pair = UINT64_MAX;
  char *joined = NULL;
  size_t joined_capacity = 0;
  const cJSON *merge;
  int32_t rank = 0;
  edge_status status = EDGE_OK;
  cJSON_ArrayForEach(merge, merges) {
    const char *left, *right;
    size_t left_length, right_length;
    if (!merge_parts(merge, &left, &left_length, &right, &right_length)) {
      status = edge_fail(EDGE_ERROR_BUNDLE, "%s: merge %d is not \"a b\" or [\"a\", \"b\"]", where, rank);
      break;
    }
    if (left_length + right_length >= joined_capacity) { /* never NULL, even for the merge of two empty tokens */
      joined_capacity = 2 * (left_length + right_length) + 1;
      char *grown = realloc(joined, joined_capacity);
      if (grown == NULL) {
        status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
        break;
      }
      joined = grown;
    }
    memcpy(joined, left, left_length);
    memcpy(joined + left_length, right, right_length);
    int32_t a = vocab_lookup(t, left, left_length), b = vocab_lookup(t, right, right_length);
    int32_t merged = vocab_lookup(t, joined, left_length + right_length);
    if (a < 0 || b < 0 || merged < 0) {
      status = edge_fail(EDGE_ERROR_BUNDLE, "%s: merge %d refers to a token that is not in the vocab", where, rank);
      break;
    }
    struct merge_slot *slot = merge_find(t, a, b);
    slot->pair = (uint64_t)(uint32_t)a << 32 | (uint32_t)b; /* a repeated pair keeps the last rank, as tokenizers */
    slot->rank = rank++;
    slot->merged = merged;
  }
  free(joined);
  return status;
}

/* ---- tokenizer_config.json ------------------------------------------------------------------------------- */

/* The id of a token's text, as tokenizers' token_to_id finds it: among the added tokens, then the vocabulary. */
static int32_t token_id(const struct edge_tokenizer *t, const char *text) {
  for (size_t i = 0; i < t->n_added; i++) {
    if (spells(text, t->added[i].content, t->added[i].length)) return t->added[i].id;
  }
  return vocab_lookup(t, text, strlen(text));
}

/* The text of a special-token field: a string or {"content": string}; NULL for anything else. */
static const char *token_content(const cJSON *config, const char *field) {
  const cJSON *value = cJSON_GetObjectItemCaseSensitive(config, field);
  const cJSON *content = cJSON_IsObject(value) ? cJSON_GetObjectItemCaseSensitive(value, "content") : value;
  return cJSON_IsString(content) ? content->valuestring : NULL;
}

/* bos_token / eos_token: absent, null, a string or {"content": string}, and then in the vocabulary. *id: -1 when
 * none is given. */
static edge_status special_token(const struct edge_tokenizer *t, const cJSON *config, const char *field,
                                 const char *where, const char *tokenizer_where, int32_t *id) {
  const cJSON *value = cJSON_GetObjectItemCaseSensitive(config, field);
  *id = -1;
  if (value == NULL || cJSON_IsNull(value)) return EDGE_OK;
  const char *content = token_content(config, field);
  if (content == NULL) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' must be a string or an object with a string 'content'", where,
                     field);
  }
  *id = token_id(t, content);
  if (*id >= 0) return EDGE_OK;
  char shown[80];
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: %s '%s' is not in the vocabulary of %s", where, field,
                   json_shown(content, shown, sizeof shown), tokenizer_where);
}

/* A chat template entry's name as a key of a Python dict: None (absent or null), a string, or a number (booleans
 * are the numbers 0 and 1 there). Lists and objects are no keys at all. */
struct template_name {
  int kind; /* 0 None, 1 number, 2 string */
  double number;
  const char *text;
};

static int compare_template_names(const void *a, const void *b) {
  const struct template_name *x = a, *y = b;
  if (x->kind != y->kind) return x->kind - y->kind;
  if (x->kind == 2) return strcmp(x->text, y->text);
  return (x->number > y->number) - (x->number < y->number);
}

static int template_name(const cJSON *entry, struct template_name *name) {
  const cJSON *value = cJSON_GetObjectItemCaseSensitive(entry, "name");
  *name = (struct template_name){0, 0.0, NULL};
  if (value == NULL || cJSON_IsNull(value)) return 1;
  if (cJSON_IsString(value)) *name = (struct template_name){2, 0.0, value->valuestring};
  if (cJSON_IsNumber(value)) *name = (struct template_name){1, value->valuedouble, NULL};
  if (cJSON_IsBool(value)) *name = (struct template_name){1, cJSON_IsTrue(value) ? 1.0 : 0.0, NULL};
  return name->kind != 0;
}

/* A list of {"name", "template"} objects with distinct names, one of them "default" with a string template. */
static int template_list_ok(const cJSON *list) {
  size_t count = (size_t)cJSON_GetArraySize(list), n = 0;
  struct template_name *names = calloc(count + 1, sizeof *names);
  int ok = names != NULL, has_default = 0;
  const cJSON *entry;
  cJSON_ArrayForEach(entry, list) {
    ok = ok && cJSON_IsObject(entry) && template_name(entry, &names[n++]);
    if (ok && names[n - 1].kind == 2 && strcmp(names[n - 1].text, "default") == 0) {
      has_default = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(entry, "template"));
    }
  }
  if (ok) qsort(names, n, sizeof *names, compare_template_names);
  for (size_t i = 1; ok && i < n; i++) ok = compare_template_names(&names[i - 1], &names[i]) != 0;
  free(names);
  return ok && has_default;
}

/* chat_template: absent, null, a string, or a list of templates (model/tokenizer.py _chat_template). */
static edge_status check_chat_template(const cJSON *config, const char *where) {
  const cJSON *value = cJSON_GetObjectItemCaseSensitive(config, "chat_template");
  if (value == NULL || cJSON_IsNull(value) || cJSON_IsString(value)) return EDGE_OK;
  if (cJSON_IsArray(value) && template_list_ok(value)) return EDGE_OK;
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: field 'chat_template' must be a string or a list of {\"name\", "
                   "\"template\"} objects with one named 'default'", where);
}

/* Whether a tokenizer.json post-processor puts the token spelled `token` first in a single sequence
 * (model/tokenizer.py _post_processor_adds): a TemplateProcessing whose "single" starts with that SpecialToken, or a
 * Sequence holding one. */
static int post_processor_adds(const cJSON *processor, const char *token) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(processor, "type");
  if (!cJSON_IsObject(processor) || !cJSON_IsString(type)) return 0;
  if (strcmp(type->valuestring, "Sequence") == 0) {
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(processor, "processors"), *step;
    if (!cJSON_IsArray(steps)) return 0;
    cJSON_ArrayForEach(step, steps) {
      if (post_processor_adds(step, token)) return 1;
    }
    return 0;
  }
  if (strcmp(type->valuestring, "TemplateProcessing") != 0) return 0;
  const cJSON *single = cJSON_GetObjectItemCaseSensitive(processor, "single");
  const cJSON *first = cJSON_IsArray(single) ? cJSON_GetArrayItem(single, 0) : NULL;
  const cJSON *special = cJSON_IsObject(first) ? cJSON_GetObjectItemCaseSensitive(first, "SpecialToken") : NULL;
  const cJSON *id = cJSON_IsObject(special) ? cJSON_GetObjectItemCaseSensitive(special, "id") : NULL;
  return cJSON_IsString(id) && strcmp(id->valuestring, token) == 0;
}

/* The fields of tokenizer_config.json edge-sdk reads must have their documented types (model/tokenizer.py). Without
 * add_bos_token, bos is prepended when tokenizer.json's post-processor puts it first, as transformers' AutoTokenizer
 * decides (the module docstring of model/tokenizer.py): byte-level BPE files name a bos token they do not add. */
static edge_status read_config_fields(struct edge_tokenizer *t, const cJSON *config, const cJSON *post_processor,
                                      const char *where, const char *tokenizer_where) {
  edge_status status = special_token(t, config, "bos_token", where, tokenizer_where, &t->bos_id);
  if (status == EDGE_OK) status = special_token(t, config, "eos_token", where, tokenizer_where, &t->eos_id);
  if (status != EDGE_OK) return status;
  const cJSON *add_bos = cJSON_GetObjectItemCaseSensitive(config, "add_bos_token");
  if (add_bos != NULL && !cJSON_IsBool(add_bos)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field 'add_bos_token' must be true or false, found %s", where,
                     json_type_name(add_bos));
  }
  if (add_bos != NULL) {
    t->add_bos = cJSON_IsTrue(add_bos);
  } else {
    t->add_bos = t->bos_id >= 0 && post_processor_adds(post_processor, token_content(config, "bos_token"));
  }
  return check_chat_template(config, where);
}

/* tokenizer_config.json, when the manifest lists it: bos_token, eos_token, add_bos_token and chat_template;
 * post_processor: tokenizer.json's (NULL when it has none). */
static edge_status load_config(struct edge_tokenizer *t, const struct bundle *bundle, const cJSON *post_processor,
                               const char *tokenizer_where) {
  t->bos_id = t->eos_id = -1;
  t->add_bos = 0;
  if (!bundle_lists(bundle, BUNDLE_TOKENIZER_CONFIG_FILE)) return EDGE_OK;
  char where[4096 + 32], *text;
  size_t size;
  snprintf(where, sizeof where, "%s/%s", bundle->root, BUNDLE_TOKENIZER_CONFIG_FILE);
  cJSON *config = NULL;
  edge_status status = bundle_read_file(bundle, BUNDLE_TOKENIZER_CONFIG_FILE, MAX_TOKENIZER_JSON_BYTES, &text, &size);
  if (status != EDGE_OK) return status;
  status = json_strict_parse_object(text, size, JSON_ANY_NUMBERS, where, &config);
  free(text);
  if (status == EDGE_OK) status = read_config_fields(t, config, post_processor, where, tokenizer_where);
  cJSON_Delete(config);
  return status;
}

void edge_tokenizer_destroy(edge_tokenizer *t) {
  if (t == NULL) return;
  if (t->tokens != NULL && t->token_bytes == NULL) { /* a vocabulary read only in part */
    for (int32_t i = 0; i < t->n_tokens; i++) free(t->tokens[i].bytes);
  }
  free(t->token_bytes);
  for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
  free(t->tokens);
  free(t->vocab);
  free(t->vocab_text);
  free(t->merges);
  free(t->added);
  free(t->added_by_pass[0]); /* the block of both passes */
  pthread_mutex_destroy(&t->error_lock);
  free(t);
}

static edge_status build_tokenizer(const struct bundle *bundle, edge_tokenizer *t) {
  char where[4096 + 32];
  snprintf(where, sizeof where, "%s/%s", bundle->root, BUNDLE_TOKENIZER_FILE);
  char *text;
  size_t size;
  cJSON *root;
  edge_status status = bundle_read_file(bundle, BUNDLE_TOKENIZER_FILE, MAX_TOKENIZER_JSON_BYTES, &text, &size);
  if (status != EDGE_OK) return status;
  status = json_strict_parse_object(text, size, JSON_ANY_NUMBERS, where, &root);
  free(text);
  if (status != EDGE_OK) return status;
  status = check_top_level(root, where);
  if (status == EDGE_OK) status = check_kind(root, where, &t->isolate_numbers);
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  if (status == EDGE_OK && (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges) || (added != NULL && !cJSON_IsArray(added)))) {
    status = edge_fail(EDGE_ERROR_BUNDLE, "%s: model.vocab must be an object, model.merges and added_tokens lists", where);
  }
  uint32_t byte_to_code[256];
  int16_t code_to_byte[512]; /* -1: not in the byte-level alphabet */
  byte_alphabet(byte_to_code);
  for (int code = 0; code < 512; code++) code_to_byte[code] = -1;
  for (int b = 0; b < 256; b++) code_to_byte[byte_to_code[b]] = (int16_t)b;
  if (status == EDGE_OK) status = load_vocab(t, vocab, added, where, code_to_byte);
  if (status == EDGE_OK) status = load_merges(t, merges, where);
  if (status == EDGE_OK) {
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    for (int b = 0; b < 256; b++) {
      char symbol[4];
      size_t length = utf8_encode(byte_to_code[b], symbol);
      t->byte_ids[b] = vocab_lookup(t, symbol, length);
    }
  }
  if (status == EDGE_OK) status = load_config(t, bundle, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), where);
  cJSON_Delete(root);
  return status;
}

/* ---- Encoding ------------------------------------------------------------------------------------------- */

struct id_list {
  int32_t *ids;
  size_t n, capacity;
  int failed;
};

static void push_id(struct id_list *list, int32_t id) {
  if (list->failed) return;
  if (list->n == list->capacity) {
    size_t capacity = list->capacity ? 2 * list->capacity : 256;
    int32_t *grown = realloc(list->ids, capacity * sizeof *grown);
    if (grown == NULL) {
      list->failed = 1;
      return;
    }
    list->ids = grown, list->capacity = capacity;
  }
  list->ids[list->n++] = id;
}

struct symbol {
  int32_t id;
  int prev, next; /* neighbours in the word, -1 at the ends */
  int merged_away;
};

struct merge_candidate {
  int32_t rank, pos, merged;
};

/* Scratch reused across the words of one encode call. */
struct bpe_scratch {
  struct symbol *symbols;
  struct merge_candidate *heap;
  size_t capacity; /* symbols; the heap holds at most 2 * capacity entries */
  struct bytes word; /* byte-level text of the word (ignore_merges lookups) */
};

static int candidate_before(const struct merge_candidate *a, const struct merge_candidate *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct merge_candidate *heap, size_t *n, struct merge_candidate entry) {
  size_t i = (*n)++;
  while (i > 0 && candidate_before(&entry, &heap[(i - 1) / 2])) {
    heap[i] = heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  heap[i] = entry;
}

static struct merge_candidate heap_pop(struct merge_candidate *heap, size_t *n) {
  struct merge_candidate top = heap[0], last = heap[--*n];
  size_t i = 0;
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= *n) break;
    if (child + 1 < *n && candidate_before(&heap[child + 1], &heap[child])) child++;
    if (!candidate_before(&heap[child], &last)) break;
    heap[i] = heap[child];
    i = child;
  }
  if (*n > 0) heap[i] = last;
  return top;
}

static void push_pair(const edge_tokenizer *t, struct bpe_scratch *scratch, size_t *n_heap, int pos) {
  const struct symbol *left = &scratch->symbols[pos];
  if (left->next < 0) return;
  const struct merge_slot *slot = merge_find(t, left->id, scratch->symbols[left->next].id);
  if (slot->pair == UINT64_MAX) return;
  heap_push(scratch->heap, n_heap, (struct merge_candidate){slot->rank, pos, slot->merged});
}

/* BPE of one pre-tokenized piece (its UTF-8 bytes), as tokenizers' Word::merge_all. */
static int encode_word(const edge_tokenizer *t, const unsigned char *bytes, size_t n, struct bpe_scratch *scratch,
                       struct id_list *out) {
  if (n > scratch->capacity) {
    struct symbol *symbols = realloc(scratch->symbols, n * sizeof *symbols);
    if (symbols != NULL) scratch->symbols = symbols;
    struct merge_candidate *heap = realloc(scratch->heap, 2 * n * sizeof *heap);
    if (heap != NULL) scratch->heap = heap;
    if (symbols == NULL || heap == NULL) return 0;
    scratch->capacity = n;
  }
  if (t->ignore_merges) {
    uint32_t byte_to_code[256];
    byte_alphabet(byte_to_code);
    scratch->word.size = 0;
    for (size_t i = 0; i < n; i++) {
      char symbol[4];
      bytes_append(&scratch->word, symbol, utf8_encode(byte_to_code[bytes[i]], symbol));
    }
    if (scratch->word.failed) return 0;
    int32_t whole = vocab_lookup(t, scratch->word.data, scratch->word.size);
    if (whole >= 0) {
      push_id(out, whole);
      return !out->failed;
    }
  }
  int count = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = t->byte_ids[bytes[i]];
    if (id < 0) continue; /* a byte missing from the vocabulary is dropped (no unk token) */
    scratch->symbols[count] = (struct symbol){id, count - 1, -1, 0};
    if (count > 0) scratch->symbols[count - 1].next = count;
    count++;
  }
  size_t n_heap = 0;
  for (int pos = 0; pos + 1 < count; pos++) push_pair(t, scratch, &n_heap, pos);
  while (n_heap > 0) {
    struct merge_candidate top = heap_pop(scratch->heap, &n_heap);
    struct symbol *left = &scratch->symbols[top.pos];
    if (left->merged_away || left->next < 0) continue;
    struct symbol *right = &scratch->symbols[left->next];
    const struct merge_slot *slot = merge_find(t, left->id, right->id);
    if (slot->pair == UINT64_MAX || slot->merged != top.merged) continue; /* stale: a neighbour changed */
    left->id = top.merged;
    right->merged_away = 1;
    left->next = right->next;
    if (right->next >= 0) scratch->symbols[right->next].prev = top.pos;
    if (left->prev >= 0) push_pair(t, scratch, &n_heap, left->prev);
    push_pair(t, scratch, &n_heap, top.pos);
  }
  for (int pos = 0; pos >= 0 && pos < count; pos = scratch->symbols[pos].next) push_id(out, scratch->symbols[pos].id);
  return !out->failed;
}

enum char_class { CLASS_SPACE, CLASS_LETTER, CLASS_NUMBER, CLASS_OTHER };

static enum char_class classify(uint32_t c) {
  if (is_space(c)) return CLASS_SPACE;
  if (is_letter(c)) return CLASS_LETTER;
  if (is_number(c)) return CLASS_NUMBER;
  return CLASS_OTHER;
}

/* End (code point index) of the regex match starting at i of the n code points. */
static size_t match_piece(const uint32_t *codes, const uint8_t *classes, size_t n, size_t i) {
  if (codes[i] == '\'' && i + 1 < n) {
    uint32_t a = codes[i + 1], b = i + 2 < n ? codes[i + 2] : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  }
  /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' */
  size_t start = codes[i] == ' ' && i + 1 < n && classes[i + 1] != CLASS_SPACE ? i + 1 : i;
  if (classes[start] != CLASS_SPACE) {
    size_t j = start + 1;
    while (j < n && classes[j] == classes[start]) j++;
    return j;
  }
  /* '\s+(?!\S)' then '\s+' */
  size_t j = i + 1;
  while (j < n && classes[j] == CLASS_SPACE) j++;
  if (j < n && j - i >= 2) return j - 1;
  return j;
}

/* Pre-tokenizes one segment (no added tokens inside) and encodes every piece. */
static edge_status encode_segment(const edge_tokenizer *t, const unsigned char *text, size_t size,
                                  struct bpe_scratch *scratch, struct id_list *out) {
  uint32_t *codes = malloc((size + 1) * sizeof *codes);
  size_t *offsets = malloc((size + 1) * sizeof *offsets);
  uint8_t *classes = malloc(size + 1);
  edge_status status = EDGE_OK;
  if (codes == NULL || offsets == NULL || classes == NULL) {
    status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "encode: out of memory");
  } else {
    size_t n = 0;
    for (size_t at = 0; at < size; n++) {
      size_t length = utf8_decode(text + at, size - at, &codes[n]); /* validated by the caller */
      offsets[n] = at;
      classes[n] = (uint8_t)classify(codes[n]);
      at += length;
    }
    offsets[n] = size;
    size_t split_end = t->isolate_numbers ? 0 : n; /* the regex runs within each split (found once per split) */
    for (size_t i = 0; i < n && status == EDGE_OK;) {
      if (i >= split_end) { /* the next split: a number alone, or the text up to the next number */
        split_end = i + 1;
        if (classes[i] != CLASS_NUMBER) {
          while (split_end < n && classes[split_end] != CLASS_NUMBER) split_end++;
        }
      }
      size_t j = match_piece(codes, classes, split_end, i);
      if (!encode_word(t, text + offsets[i], offsets[j] - offsets[i], scratch, out)) {
        status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "encode: out of memory");
      }
      i = j;
    }
  }
  free(codes);
  free(offsets);
  free(classes);
  return status;
}

/* The longest of sorted[0:n] (sorted by content) that text[0:size] starts with, or NULL. [low, high) narrows to
 * the tokens whose first `depth` bytes are the text's, so a position costs a binary search per byte matched rather
 * than a comparison with every added token. */
static const struct added_token *longest_added_token(const struct added_token *const *sorted, size_t n,
                                                     const unsigned char *text, size_t size) {
  const struct added_token *longest = NULL;
  size_t low = 0, high = n;
  for (size_t depth = 0; low < high; depth++) {
    if (sorted[low]->length == depth) longest = sorted[low++]; /* sorts before the longer tokens it starts */
    if (depth == size) break;
    size_t first = low, end = high; /* the first token whose byte at depth is not below the text's */
    while (first < end) {
      size_t mid = first + (end - first) / 2;
      if ((unsigned char)sorted[mid]->content[depth] < text[depth]) {
        first = mid + 1;
      } else {
        end = mid;
      }
    }
    end = high; /* and the first one above it */
    for (size_t above = first; above < end;) {
      size_t mid = above + (end - above) / 2;
      if ((unsigned char)sorted[mid]->content[depth] <= text[depth]) {
        above = mid + 1;
      } else {
        end = mid;
      }
    }
    low = first, high = end;
  }
  return longest;
}

/* Encodes text[0:size] as tokenizers' AddedVocabulary splits it: pass 0 finds the added tokens that are not
 * normalized, leftmost-longest, in the whole text; pass 1 the normalized ones in each piece between (the text as
 * the absent normalizer leaves it); pass 2 pre-tokenizes and encodes each piece left. */
static edge_status encode_pass(const edge_tokenizer *t, const unsigned char *text, size_t size, int pass,
                               struct bpe_scratch *scratch, struct id_list *out) {
  if (pass == 2) return size > 0 ? encode_segment(t, text, size, scratch, out) : EDGE_OK;
  const struct added_token *const *sorted = t->added_by_pass[pass];
  size_t n = t->n_added_by_pass[pass], segment = 0;
  edge_status status = EDGE_OK;
  for (size_t at = 0; n > 0 && at < size && status == EDGE_OK;) {
    const struct added_token *token = longest_added_token(sorted, n, text + at, size - at);
    if (token == NULL) {
      at++;
      continue;
    }
    status = encode_pass(t, text + segment, at - segment, pass + 1, scratch, out);
    push_id(out, token->id);
    at += token->length;
    segment = at;
  }
  if (status == EDGE_OK) status = encode_pass(t, text + segment, size - segment, pass + 1, scratch, out);
  return status;
}

static edge_status encode(const edge_tokenizer *t, const char *text, size_t size, int add_bos, struct id_list *out) {
  const unsigned char *bytes = (const unsigned char *)text;
  for (size_t at = 0; at < size;) {
    uint32_t code;
    size_t length = utf8_decode(bytes + at, size - at, &code);
    if (length == 0) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "encode: text is not valid UTF-8 at byte %zu", at);
    at += length;
  }
  if (add_bos < 0) add_bos = t->add_bos;
  if (add_bos) {
    if (t->bos_id < 0) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "encode: add_bos is set but the tokenizer has no bos token");
    push_id(out, t->bos_id);
  }
  struct bpe_scratch scratch = {0};
  edge_status status = encode_pass(t, bytes, size, 0, &scratch, out);
  free(scratch.symbols);
  free(scratch.heap);
  free(scratch.word.data);
  if (status == EDGE_OK && out->failed) status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "encode: out of memory");
  return status;
}

/* ---- Public API ------------------------------------------------------------------------------------------ */

static edge_status tokenizer_failed(const edge_tokenizer *t, edge_status status) {
  edge_tokenizer *mutable_t = (edge_tokenizer *)t;
  edge_record_shared_message(&mutable_t->error_lock, mutable_t->error);
  return status;
}

edge_status edge_tokenizer_create(const edge_model *model, edge_tokenizer **out) {
  edge_clear_error();
  if (out == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_tokenizer_create: out is NULL");
  *out = NULL;
  if (model == NULL) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_tokenizer_create: model is NULL");
  edge_tokenizer *t = calloc(1, sizeof *t);
  if (t == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "edge_tokenizer_create: out of memory");
  pthread_mutex_init(&t->error_lock, NULL);
  edge_status status = build_tokenizer(&model->bundle, t);
  if (status != EDGE_OK) {
    edge_tokenizer_destroy(t);
    return status;
  }
#ifdef __GLIBC__
  /* The parse of tokenizer.json (about 28 MB of small blocks at its peak for SmolLM2's 2.2 MB file) is freed by now,
   * but glibc would keep those heap pages in the process (benchmarks/README.md, section 5, "A session's memory"). */
  malloc_trim(0);
#endif
  *out = t;
  return EDGE_OK;
}

const char *edge_tokenizer_last_error(const edge_tokenizer *t) {
  static _Thread_local char copy[EDGE_MESSAGE_SIZE]; /* its own: reading a model's message leaves it */
  if (t == NULL) return "tokenizer is NULL";
  edge_tokenizer *mutable_t = (edge_tokenizer *)t;
  return edge_read_shared_message(&mutable_t->error_lock, mutable_t->error, copy);
}

edge_status edge_tokenizer_encode(const edge_tokenizer *t, const char *text, size_t text_len, int add_bos,
                                  int32_t **ids, size_t *n_ids) {
  edge_clear_error();
  if (t == NULL || ids == NULL || n_ids == NULL || (text == NULL && text_len > 0)) {
    edge_status status = edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_tokenizer_encode: NULL argument");
    return t == NULL ? status : tokenizer_failed(t, status);
  }
  if (add_bos < -1 || add_bos > 1) {
    return tokenizer_failed(t, edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "add_bos: expected -1, 0 or 1, found %d", add_bos));
  }
  /* BPE numbers the symbols of a word with int (encode_word), and one word may be the whole text */
  if (text_len > INT_MAX) {
    return tokenizer_failed(t, edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "text_len: expected at most %d bytes, found %zu",
                                         INT_MAX, text_len));
  }
  struct id_list list = {0};
  edge_status status = encode(t, text, text_len, add_bos, &list);
  if (status != EDGE_OK) {
    free(list.ids);
    return tokenizer_failed(t, status);
  }
  *ids = list.ids;
  *n_ids = list.n;
  return EDGE_OK;
}

edge_status edge_tokenizer_decode(const edge_tokenizer *t, const int32_t *ids, size_t n_ids, int skip_special,
                                  char **text, size_t *text_len) {
  edge_clear_error();
  if (t == NULL || text == NULL || (ids == NULL && n_ids > 0)) {
    edge_status status = edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_tokenizer_decode: NULL argument");
    return t == NULL ? status : tokenizer_failed(t, status);
  }
  struct bytes raw = {0}, decoded = {0};
  bytes_append(&raw, "", 0);
  for (size_t i = 0; i < n_ids; i++) {
    if (ids[i] < 0) {
      free(raw.data);
      return tokenizer_failed(t, edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "decode: token id %d is negative", ids[i]));
    }
    if (ids[i] >= t->n_tokens || !t->tokens[ids[i]].present) continue; /* unknown ids decode to nothing */
    const struct token_entry *token = &t->tokens[ids[i]];
    if (skip_special && token->special) continue;
    bytes_append(&raw, token->bytes, token->n_bytes);
  }
  bytes_append(&decoded, "", 0);
  const unsigned char *s = (const unsigned char *)raw.data;
  for (size_t at = 0; at < raw.size && !raw.failed;) {
    uint32_t code;
    size_t length = utf8_decode(s + at, raw.size - at, &code);
    if (length > 0) {
      bytes_append(&decoded, s + at, length);
      at += length;
    } else {
      bytes_append(&decoded, "\xef\xbf\xbd", 3); /* U+FFFD */
      at += utf8_invalid_length(s + at, raw.size - at);
    }
  }
  int failed = raw.failed || decoded.failed;
  free(raw.data);
  if (failed) {
    free(decoded.data);
    return tokenizer_failed(t, edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "decode: out of memory"));
  }
  *text = decoded.data;
  if (text_len != NULL) *text_len = decoded.size;
  return EDGE_OK;
}

edge_status edge_tokenizer_token_bytes(const edge_tokenizer *t, int32_t token, const char **bytes, size_t *n_bytes) {
  edge_clear_error();
  if (t == NULL || bytes == NULL || n_bytes == NULL) {
    edge_status status = edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_tokenizer_token_bytes: NULL argument");
    return t == NULL ? status : tokenizer_failed(t, status);
  }
  if (token < 0 || token >= t->n_tokens || !t->tokens[token].present) {
    return tokenizer_failed(t, edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "token_bytes: token id %d is not in the vocabulary "
                                         "of %d tokens", token, t->n_tokens));
  }
  *bytes = t->tokens[token].bytes;
  *n_bytes = t->tokens[token].n_bytes;
  return EDGE_OK;
}

int32_t edge_tokenizer_vocab_size(const edge_tokenizer *t) { return t == NULL ? 0 : t->n_tokens; }

edge_status edge_tokenizer_special_tokens(const edge_tokenizer *t, int32_t *bos, int32_t *eos, int *adds_bos) {
  edge_clear_error();
  if (t == NULL || bos == NULL || eos == NULL || adds_bos == NULL) {
    edge_status status = edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "edge_tokenizer_special_tokens: NULL argument");
    return t == NULL ? status : tokenizer_failed(t, status);
  }
  *bos = t->bos_id;
  *eos = t->eos_id;
  *adds_bos = t->add_bos;
  return EDGE_OK;
}

int edge_tokenizer_is_special(const edge_tokenizer *t, int32_t token) {
  return t != NULL && token >= 0 && token < t->n_tokens && t->tokens[token].special;
}
