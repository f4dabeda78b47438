/* Error messages: every failing internal call formats its message into the calling thread's buffer
 * (edge_last_error); the public API then copies it into the handle the call was made on. */
#ifndef EDGE_ERROR_H
#define EDGE_ERROR_H

#include <pthread.h>

#include "edge_sdk.h"

#define EDGE_MESSAGE_SIZE 1024

#if defined(__GNUC__)
#define EDGE_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define EDGE_PRINTF(fmt, args)
#endif

/* Formats the thread's message and returns status, so callers write `return edge_fail(STATUS, ...);`. */
edge_status edge_fail(edge_status status, const char *format, ...) EDGE_PRINTF(2, 3);

/* Clears the thread's message (at the start of a public call, so a message always belongs to its failure). */
void edge_clear_error(void);

/* The message of a handle several threads may fail on and read (a model, a tokenizer), guarded by its lock:
 * record copies the calling thread's message into it; read copies it into `copy` (EDGE_MESSAGE_SIZE bytes, a buffer
 * of the reading thread) and returns `copy`, so a reader never sees a message another thread is writing. */
void edge_record_shared_message(pthread_mutex_t *lock, char *message);
const char *edge_read_shared_message(pthread_mutex_t *lock, const char *message, char *copy);

/* Passes one message to the callback of edge_set_log_callback, if one is set. */
void edge_log(edge_log_level level, const char *source, const char *message);

#endif
