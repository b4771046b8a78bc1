/* tensors.c - one parameter tensor in or out in a stored dtype (F32, F16, BF16): reading a
 * memory-mapped file range into the model (a matrix in the model's own 16-bit weight dtype is
 * mapped and kept as it is), and writing the model's values rounded to 16 bits. Conversions
 * are exact into F32 and round to nearest even out of it. */
#define _DEFAULT_SOURCE /* mmap, sysconf */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../backend.h"

#define CHUNK (1 << 20)        /* floats converted per backend copy */
#define WINDOW ((int64_t)64 << 20) /* bytes of the file mapped at once */

static uint32_t bits_of(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

static float float_of(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 31) return float_of(sign | 0x7f800000u | m << 13);
  if (e == 0) {
    if (m == 0) return float_of(sign);
    int32_t exp = 1; /* subnormal: normalise */
    while (!(m & 0x400)) {
      m <<= 1;
      exp--;
    }
    return float_of(sign | (uint32_t)(exp + 112) << 23 | (m & 0x3ff) << 13);
  }
  return float_of(sign | (e + 112) << 23 | m << 13);
}

static uint16_t f32_to_f16(float f) {
  uint32_t x = bits_of(f), sign = (x >> 16) & 0x8000;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00));
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds above 65504: infinity */
  if (x < 0x38800000u) {                                  /* a subnormal half (or zero) */
    if (x <= 0x33000000u) return (uint16_t)sign;          /* at most 2^-25: ties to 0 */
    uint32_t e = x >> 23, m = (x & 0x7fffff) | 0x800000, shift = 126 - e;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = (x - 0x38000000u) >> 13, rem = x & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* NaN stays quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

static int64_t dtype_size(int32_t dtype) { return dtype == GYRE_F32 ? 4 : 2; }

static const char *dtype_name(int32_t dtype) { return dtype == GYRE_F32 ? "F32" : dtype == GYRE_F16 ? "F16" : "BF16"; }

void values_to_f32(int32_t dtype, const void *srcv, int64_t n, float *dst) {
  const uint8_t *src = srcv;
  if (dtype == GYRE_F32) {
    memcpy(dst, src, (size_t)n * 4);
    return;
  }
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t k = 0; k < n; k++) {
    uint16_t h;
    memcpy(&h, src + 2 * k, 2);
    dst[k] = dtype == GYRE_F16 ? f16_to_f32(h) : float_of((uint32_t)h << 16);
  }
}

void values_from_f32(int32_t dtype, const float *src, int64_t n, void *dstv) {
  uint8_t *dst = dstv;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t k = 0; k < n; k++) {
    if (dtype == GYRE_F32) {
      memcpy(dst + 4 * k, &src[k], 4);
      continue;
    }
    uint16_t h = dtype == GYRE_F16 ? f32_to_f16(src[k]) : f32_to_bf16(src[k]);
    memcpy(dst + 2 * k, &h, 2);
  }
}

/* The layout's tensor `index` and its element count, after checking the arguments. */
static gyre_status tensor_of(const gyre_model *m, int32_t index, int32_t dtype, const char *fn,
                             const param_tensor **p, int64_t *numel) {
  if (m == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
  if (index < 0 || index >= m->layout.n_tensors)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: tensor index %d not in [0, %d)", fn, (int)index,
                     (int)m->layout.n_tensors);
  if (dtype != GYRE_F32 && dtype != GYRE_F16 && dtype != GYRE_BF16)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: dtype %d is not F32 (0), F16 (1) or BF16 (2)", fn, (int)dtype);
  *p = &m->layout.tensors[index];
  *numel = (*p)->rank == 1 ? (*p)->shape[0] : (*p)->shape[0] * (*p)->shape[1];
  return GYRE_OK;
}

gyre_status gyre_model_read_tensor(gyre_model *m, int32_t index, int32_t dtype, const char *path,
                                   int64_t offset, int64_t nbytes) {
  const param_tensor *p = NULL;
  int64_t numel = 0;
  GYRE_CHECK(tensor_of(m, index, dtype, "gyre_model_read_tensor", &p, &numel));
  const int64_t width = dtype_size(dtype);
  if (path == NULL || offset < 0 || nbytes != numel * width)
    return gyre_fail(GYRE_ERR_BAD_CHECKPOINT, "gyre_model_read_tensor: tensor '%s' spans %lld bytes, expected %lld (%s)",
                     p->name, (long long)nbytes, (long long)(numel * width), dtype_name(dtype));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return gyre_fail(GYRE_ERR_BAD_CHECKPOINT, "gyre_model_read_tensor: %s: %s", path, strerror(errno));
  off_t size = lseek(fd, 0, SEEK_END);
  if (size >= 0 && offset + nbytes <= (int64_t)size && p->rank == 2 && dtype != GYRE_F32 && dtype == be_model_weight_dtype(m->be)) {
    gyre_status mapped = be_model_map_tensor(m->be, index, fd, offset, nbytes); /* kept as stored: mapped, not converted */
    close(fd);
    return mapped;
  }
  float *host = be_model_host_weights(m->be);
  float *chunk = host != NULL ? NULL : malloc(sizeof(float) * CHUNK);
  gyre_status st = host == NULL && chunk == NULL ? gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_model_read_tensor: out of host memory") : GYRE_OK;
  if (st == GYRE_OK && (size < 0 || offset + nbytes > (int64_t)size))
    st = gyre_fail(GYRE_ERR_BAD_CHECKPOINT, "gyre_model_read_tensor: %s is truncated: tensor '%s' needs bytes [%lld, %lld) of %lld",
                   path, p->name, (long long)offset, (long long)(offset + nbytes), (long long)size);
  const int64_t page = sysconf(_SC_PAGESIZE), per_window = WINDOW / width;
  for (int64_t done = 0; st == GYRE_OK && done < numel; done += per_window) {
    int64_t count = numel - done < per_window ? numel - done : per_window;
    int64_t start = offset + done * width, base = start / page * page, span = start - base + count * width;
    /* not MAP_POPULATE: the converting threads fault the pages in, in parallel */
    uint8_t *map = mmap(NULL, (size_t)span, PROT_READ, MAP_PRIVATE, fd, (off_t)base);
    if (map == MAP_FAILED) {
      st = gyre_fail(GYRE_ERR_BAD_CHECKPOINT, "gyre_model_read_tensor: mmap %s: %s", path, strerror(errno));
      break;
    }
    const uint8_t *src = map + (start - base);
    if (host != NULL) { /* host weights: converted in place */
      values_to_f32(dtype, src, count, host + p->offset + done);
    } else {
      for (int64_t k = 0; st == GYRE_OK && k < count; k += CHUNK) {
        int64_t n = count - k < CHUNK ? count - k : CHUNK;
        values_to_f32(dtype, src + k * width, n, chunk);
        st = be_model_set_range(m->be, p->offset + done + k, n, chunk);
      }
    }
    munmap(map, (size_t)span);
  }
  free(chunk);
  close(fd);
  return st;
}

gyre_status gyre_model_write_tensor(const gyre_model *m, int32_t index, int32_t dtype, uint8_t *out, size_t cap) {
  const param_tensor *p = NULL;
  int64_t numel = 0;
  GYRE_CHECK(tensor_of(m, index, dtype, "gyre_model_write_tensor", &p, &numel));
  if (out == NULL || (int64_t)cap != numel * dtype_size(dtype))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_write_tensor: tensor '%s' needs %lld bytes, got %zu", p->name,
                     (long long)(numel * dtype_size(dtype)), cap);
  float *chunk = malloc(sizeof(float) * CHUNK);
  if (chunk == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_model_write_tensor: out of host memory");
  gyre_status st = GYRE_OK;
  for (int64_t k = 0; st == GYRE_OK && k < numel; k += CHUNK) {
    int64_t n = numel - k < CHUNK ? numel - k : CHUNK;
    st = be_model_get_range(m->be, p->offset + k, n, chunk);
    if (st == GYRE_OK) values_from_f32(dtype, chunk, n, out + k * dtype_size(dtype));
  }
  free(chunk);
  return st;
}
