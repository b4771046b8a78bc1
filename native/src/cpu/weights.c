/* weights.c - the CPU model's weights: F32, or 16-bit matrices (BF16 / F16) kept as stored.
 *
 * A model's vectors (norms, biases) are always F32, in the flat layout `w`. Its matrices are F32
 * in `w` too, or, for a model made with 16-bit weights, 16-bit: in `w16` (the flat layout in 16
 * bits, an anonymous mapping whose pages are used only where written), or mapped read-only
 * from a checkpoint file (be_model_map_tensor) and used as they are there. `tensor[i]` says
 * where tensor i's values are. Products read 16-bit matrices through gemm_wt, which widens each
 * element exactly as it is read. A trainer needs F32 master weights: be_model_widen turns a
 * 16-bit model into an F32 one for good.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gemm.h"
#include "kernels.h"
#include "transformer.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older kernels refuse it and the pages fault in on first read */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Maps in the pages of [p, p + bytes) ahead of their first use (advice MADV_POPULATE_READ or
 * _WRITE), the threads each taking one part: in the kernel's batched path, not one fault per
 * 4 KiB page as the accesses go (a loaded 2 GB model: 0.9 s instead of 1.0-1.3 s on 2 cores). */
static void populate(void *p, size_t bytes, int advice) {
  const size_t page = 4096, pages = (bytes + page - 1) / page;
#pragma omp parallel num_threads(cpu_threads_for((double)bytes))
  {
    size_t T = (size_t)omp_get_num_threads(), part = (pages + T - 1) / T * page, from = (size_t)omp_get_thread_num() * part;
    if (from < bytes) madvise((char *)p + from, from + part > bytes ? bytes - from : part, advice);
  }
}

static void *map_anonymous(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static int64_t numel(const param_tensor *p) { return p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1]; }

/* Whether tensor t is held in the weight dtype (a 16-bit model's matrix) rather than F32 in w. */
static int is_w16(const be_model *m, int32_t t) { return m->wdtype != GYRE_F32 && m->lay->tensors[t].rank == 2; }

/* Points every tensor at its place in w (F32, and every vector) or w16 (a 16-bit model's matrices). */
static void point_tensors(be_model *m) {
  for (int32_t t = 0; t < m->lay->n_tensors; t++) {
    int64_t off = m->lay->tensors[t].offset;
    m->tensor[t] = is_w16(m, t) ? (const void *)(m->w16 + off) : (const void *)(m->w + off);
  }
}

static void unmap_tensor(be_model *m, int32_t t) {
  if (m->maps[t].addr != NULL) munmap(m->maps[t].addr, m->maps[t].bytes);
  m->maps[t] = (file_map){NULL, 0};
}

gyre_status be_model_create(const param_layout *lay, int32_t wdtype, be_model **out) {
  be_model *m = calloc(1, sizeof *m);
  if (m == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory");
  m->lay = lay;
  m->d = lay->d;
  m->wdtype = wdtype;
  size_t n = (size_t)(lay->n_params > 0 ? lay->n_params : 1);
  /* Mapped, not memset: pages are zero until first written. F32: populated at once, in parallel
   * (a loaded model writes each page once); 16-bit: w holds only the vectors and w16 only what is
   * not mapped from a file, so neither is populated. */
  m->w_bytes = sizeof(float) * n;
  m->w = map_anonymous(m->w_bytes);
  if (m->w != NULL && wdtype == GYRE_F32) populate(m->w, m->w_bytes, MADV_POPULATE_WRITE);
  m->w16_bytes = wdtype == GYRE_F32 ? 0 : sizeof(uint16_t) * n;
  m->w16 = wdtype == GYRE_F32 ? NULL : map_anonymous(m->w16_bytes);
  m->tensor = calloc((size_t)lay->n_tensors, sizeof *m->tensor);
  m->maps = calloc((size_t)lay->n_tensors, sizeof *m->maps);
  m->inv_freq = aligned_calloc(sizeof(float) * (size_t)(m->d.hd / 2 > 0 ? m->d.hd / 2 : 1));
  if (m->w == NULL || (wdtype != GYRE_F32 && m->w16 == NULL) || m->tensor == NULL || m->maps == NULL || m->inv_freq == NULL) {
    be_model_free(m);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory for %lld parameters", (long long)lay->n_params);
  }
  point_tensors(m);
  rope_inv_freq(m->inv_freq, &m->d);
  m->rope_scale = rope_attention_scaling(&m->d);
  *out = m;
  return GYRE_OK;
}

void be_model_free(be_model *m) {
  if (m == NULL) return;
  for (int32_t t = 0; m->maps != NULL && t < m->lay->n_tensors; t++) unmap_tensor(m, t);
  if (m->w != NULL) munmap(m->w, m->w_bytes);
  if (m->w16 != NULL) munmap(m->w16, m->w16_bytes);
  free(m->tensor);
  free(m->maps);
  free(m->inv_freq);
  free(m);
}

int32_t be_model_weight_dtype(const be_model *m) { return m->wdtype; }

float *be_model_host_weights(be_model *m) { return m->wdtype == GYRE_F32 ? m->w : NULL; }

/* Makes tensor t's values the model's own (w16), copying them out of a file mapping. */
static void own_tensor(be_model *m, int32_t t) {
  if (m->maps[t].addr == NULL) return;
  uint16_t *dst = m->w16 + m->lay->tensors[t].offset;
  memcpy(dst, m->tensor[t], sizeof(uint16_t) * (size_t)numel(&m->lay->tensors[t]));
  unmap_tensor(m, t);
  m->tensor[t] = dst;
}

/* The first tensor whose range ends after flat offset `at` (tensors are in offset order). */
static int32_t tensor_from(const param_layout *lay, int64_t at) {
  int32_t lo = 0, hi = lay->n_tensors;
  while (lo < hi) {
    int32_t mid = (lo + hi) / 2;
    if (lay->tensors[mid].offset + numel(&lay->tensors[mid]) <= at) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Copies n floats of the flat vector at `offset` in (to_model) or out, tensor by tensor. */
static void transfer_range(be_model *m, int64_t offset, int64_t n, float *host, int to_model) {
  for (int32_t t = tensor_from(m->lay, offset); t < m->lay->n_tensors; t++) {
    const param_tensor *p = &m->lay->tensors[t];
    int64_t from = p->offset > offset ? p->offset : offset, end = p->offset + numel(p);
    if (end > offset + n) end = offset + n;
    if (from >= end) break;
    float *h = host + (from - offset);
    if (!is_w16(m, t)) {
      if (to_model) memcpy(m->w + from, h, sizeof(float) * (size_t)(end - from));
      else memcpy(h, m->w + from, sizeof(float) * (size_t)(end - from));
      continue;
    }
    if (to_model) own_tensor(m, t);
    const uint16_t *base = (const uint16_t *)m->tensor[t] + (from - p->offset);
    if (to_model) values_from_f32(m->wdtype, h, end - from, (uint16_t *)base);
    else values_to_f32(m->wdtype, base, end - from, h);
  }
}

gyre_status be_model_set_range(be_model *m, int64_t offset, int64_t n, const float *host) {
  transfer_range(m, offset, n, (float *)host, 1);
  return GYRE_OK;
}

gyre_status be_model_get_range(const be_model *m, int64_t offset, int64_t n, float *host) {
  transfer_range((be_model *)m, offset, n, host, 0);
  return GYRE_OK;
}

gyre_status be_model_set_weights(be_model *m, const float *host) { return be_model_set_range(m, 0, m->lay->n_params, host); }

gyre_status be_model_get_weights(const be_model *m, float *host) { return be_model_get_range(m, 0, m->lay->n_params, host); }

gyre_status be_model_map_tensor(be_model *m, int32_t index, int fd, int64_t offset, int64_t nbytes) {
  if (!is_w16(m, index)) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "cpu: tensor %d is not a 16-bit matrix of this model", (int)index);
  const int64_t page = sysconf(_SC_PAGESIZE), base = offset / page * page;
  size_t span = (size_t)(offset - base + nbytes);
  void *map = mmap(NULL, span, PROT_READ, MAP_PRIVATE, fd, (off_t)base);
  if (map == MAP_FAILED) return gyre_fail(GYRE_ERR_BAD_CHECKPOINT, "cpu: cannot map tensor '%s'", m->lay->tensors[index].name);
  populate(map, span, MADV_POPULATE_READ); /* read now, in parallel, not at the first forward */
  unmap_tensor(m, index);
  m->maps[index] = (file_map){map, span};
  m->tensor[index] = (const char *)map + (offset - base);
  return GYRE_OK;
}

gyre_status be_model_widen(be_model *m) {
  if (m->wdtype == GYRE_F32) return GYRE_OK;
  for (int32_t t = 0; t < m->lay->n_tensors; t++)
    if (is_w16(m, t)) values_to_f32(m->wdtype, m->tensor[t], numel(&m->lay->tensors[t]), m->w + m->lay->tensors[t].offset);
  for (int32_t t = 0; t < m->lay->n_tensors; t++) unmap_tensor(m, t);
  munmap(m->w16, m->w16_bytes);
  m->w16 = NULL;
  m->w16_bytes = 0;
  m->wdtype = GYRE_F32;
  point_tensors(m);
  return GYRE_OK;
}

void linear(const be_model *m, int T, int64_t offset, int N, int K, const float *x, float *out, int accumulate) {
  const param_layout *lay = m->lay;
  const size_t es = m->wdtype == GYRE_F32 ? sizeof(float) : sizeof(uint16_t);
  int32_t t = tensor_from(lay, offset);
  w_parts wp = {.n = 0, .dtype = m->wdtype};
  int from = 0; /* the first output column of wp's parts */
  for (int done = 0; done < N;) {
    const char *p = m->tensor[t];
    int rows = (int)lay->tensors[t].shape[0];
    for (t++; done + rows < N && (const char *)m->tensor[t] == p + (size_t)rows * K * es; t++) rows += (int)lay->tensors[t].shape[0];
    if (wp.n == GEMM_MAX_PARTS) {
      gemm_wt_parts(T, K, x, K, &wp, K, out + from, N, accumulate);
      wp.n = 0;
      from = done;
    }
    wp.w[wp.n] = p;
    wp.rows[wp.n++] = rows;
    done += rows;
  }
  gemm_wt_parts(T, K, x, K, &wp, K, out + from, N, accumulate);
}

void embed_rows(const be_model *m, const int32_t *tokens, int T, float *x) {
  const int D = m->d.D;
  const void *table = m->tensor[tensor_from(m->lay, m->lay->embed)];
  if (m->wdtype == GYRE_F32) {
    embed_forward(x, tokens, table, T, D);
    return;
  }
  for (int t = 0; t < T; t++) values_to_f32(m->wdtype, (const uint16_t *)table + (size_t)tokens[t] * D, D, x + (size_t)t * D);
}
