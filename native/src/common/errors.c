/* errors.c - the last-error message and status names (gyre_last_error, gyre_status_name). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"

/* One message for the process: calls may finish on worker threads (the binding runs long
 * calls off its event loop) and the caller reads the message from another thread. */
static char last_message[1024];
static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;

gyre_status gyre_fail(gyre_status status, const char *fmt, ...) {
  char buf[sizeof last_message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&last_lock);
  memcpy(last_message, buf, sizeof buf);
  pthread_mutex_unlock(&last_lock);
  return status;
}

size_t gyre_last_error(char *buf, size_t cap) {
  pthread_mutex_lock(&last_lock);
  size_t n = strlen(last_message);
  if (buf != NULL && cap > 0) {
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, last_message, k);
    buf[k] = '\0';
  }
  pthread_mutex_unlock(&last_lock);
  return n;
}

const char *gyre_status_name(int32_t status) {
  switch (status) {
    case GYRE_OK: return "GYRE_OK";
    case GYRE_ERR_INVALID_ARGUMENT: return "GYRE_ERR_INVALID_ARGUMENT";
    case GYRE_ERR_OUT_OF_MEMORY: return "GYRE_ERR_OUT_OF_MEMORY";
    case GYRE_ERR_OUT_OF_BLOCKS: return "GYRE_ERR_OUT_OF_BLOCKS";
    case GYRE_ERR_BAD_CHECKPOINT: return "GYRE_ERR_BAD_CHECKPOINT";
    case GYRE_ERR_BAD_HANDOFF: return "GYRE_ERR_BAD_HANDOFF";
    case GYRE_ERR_STATE: return "GYRE_ERR_STATE";
    case GYRE_ERR_DEVICE: return "GYRE_ERR_DEVICE";
    case GYRE_ERR_UNSUPPORTED: return "GYRE_ERR_UNSUPPORTED";
    default: return "GYRE_ERR_UNKNOWN";
  }
}

void *aligned_calloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void *p = aligned_alloc(64, rounded);
  if (p != NULL) memset(p, 0, rounded);
  return p;
}
