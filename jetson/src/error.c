/* Thread-local error messages, status names, and the log callback. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char thread_message[EDGE_MESSAGE_SIZE];

edge_status edge_fail(edge_status status, const char *format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(thread_message, sizeof thread_message, format, args);
  va_end(args);
  return status;
}

void edge_clear_error(void) { thread_message[0] = '\0'; }

const char *edge_last_error(void) { return thread_message; }

void edge_record_shared_message(pthread_mutex_t *lock, char *message) {
  pthread_mutex_lock(lock);
  memcpy(message, thread_message, EDGE_MESSAGE_SIZE);
  pthread_mutex_unlock(lock);
}

const char *edge_read_shared_message(pthread_mutex_t *lock, const char *message, char *copy) {
  pthread_mutex_lock(lock);
  memcpy(copy, message, EDGE_MESSAGE_SIZE);
  pthread_mutex_unlock(lock);
  return copy;
}

const char *edge_status_name(edge_status status) {
  switch (status) {
    case EDGE_OK:
      return "EDGE_OK";
    case EDGE_ERROR_INVALID_ARGUMENT:
      return "EDGE_ERROR_INVALID_ARGUMENT";
    case EDGE_ERROR_IO:
      return "EDGE_ERROR_IO";
    case EDGE_ERROR_BUNDLE:
      return "EDGE_ERROR_BUNDLE";
    case EDGE_ERROR_UNSUPPORTED:
      return "EDGE_ERROR_UNSUPPORTED";
    case EDGE_ERROR_UNAVAILABLE:
      return "EDGE_ERROR_UNAVAILABLE";
    case EDGE_ERROR_OUT_OF_MEMORY:
      return "EDGE_ERROR_OUT_OF_MEMORY";
    case EDGE_ERROR_SEQUENCE_FULL:
      return "EDGE_ERROR_SEQUENCE_FULL";
    case EDGE_ERROR_STATE:
      return "EDGE_ERROR_STATE";
    case EDGE_ERROR_INTERNAL:
      return "EDGE_ERROR_INTERNAL";
  }
  return "EDGE_UNKNOWN_STATUS";
}

void edge_free(void *memory) { free(memory); }

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static edge_log_callback log_callback;
static void *log_user_data;

void edge_set_log_callback(edge_log_callback callback, void *user_data) {
  edge_clear_error();
  pthread_mutex_lock(&log_lock);
  log_callback = callback;
  log_user_data = user_data;
  pthread_mutex_unlock(&log_lock);
}

void edge_log(edge_log_level level, const char *source, const char *message) {
  pthread_mutex_lock(&log_lock);
  edge_log_callback callback = log_callback;
  void *user_data = log_user_data;
  pthread_mutex_unlock(&log_lock);
  /* called outside the lock: a callback may log through another library call, or set the callback */
  if (callback != NULL) callback(level, source, message, user_data);
}
