/* errors.c - the last-error messages (gyre_last_error, gyre_error_message) and status names.
 *
 * A failure's message is kept twice: in the failing thread's own buffer, which gyre_last_error
 * reads, so failures on different threads never overwrite each other's; and in a small ring of
 * recent failures under a lock, numbered, its number left in errno, so a caller that ran the
 * call on a worker thread (the binding's async calls: koffi carries the worker's errno to the
 * completion) reads that call's message with gyre_error_message from any thread. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"

#define MESSAGE_CAP 1024
#define RING 64
#define CODE_SPAN (1 << 24) /* failure numbers cycle in [1, CODE_SPAN) */
#define GYRE_ERRNO_BASE 0x47000000 /* errno = base + number: far above any errno value libc sets */

static _Thread_local char thread_message[MESSAGE_CAP];

static struct {
  int32_t code;
  char text[MESSAGE_CAP];
} ring[RING];
static int32_t last_code;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;

gyre_status gyre_fail(gyre_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(thread_message, sizeof thread_message, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&ring_lock);
  last_code = last_code + 1 < CODE_SPAN ? last_code + 1 : 1;
  int32_t code = last_code;
  ring[code % RING].code = code;
  memcpy(ring[code % RING].text, thread_message, sizeof thread_message);
  pthread_mutex_unlock(&ring_lock);
  errno = GYRE_ERRNO_BASE + code;
  return status;
}

static size_t copy_out(const char *message, char *buf, size_t cap) {
  size_t n = strlen(message);
  if (buf != NULL && cap > 0) {
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, message, k);
    buf[k] = '\0';
  }
  return n;
}

size_t gyre_last_error(char *buf, size_t cap) { return copy_out(thread_message, buf, cap); }

size_t gyre_error_message(int32_t code, char *buf, size_t cap) {
  int32_t n = code - GYRE_ERRNO_BASE;
  pthread_mutex_lock(&ring_lock);
  int found = n > 0 && n < CODE_SPAN && ring[n % RING].code == n;
  size_t len = copy_out(found ? ring[n % RING].text : "", buf, cap);
  pthread_mutex_unlock(&ring_lock);
  return len;
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
