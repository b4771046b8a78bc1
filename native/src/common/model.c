/* model.c - device queries and the model handle: create, load, save, weights, free. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"

int32_t gyre_abi_version(void) { return GYRE_ABI_VERSION; }
const char *gyre_backend(void) { return be_name(); }
int32_t gyre_device_count(void) { return be_device_count(); }
void gyre_set_num_threads(int32_t n) { be_set_num_threads(n); }
int32_t gyre_num_threads(void) { return be_num_threads(); }

/* Device indices are below the backend's device count (the CPU has one, the host). */
static gyre_status device_check(int32_t device, const char *fn) {
  int32_t n = be_device_count();
  if (device < 0 || device >= n)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: device %d not in [0, %d) (the %s backend's devices)", fn, device, n,
                     be_name());
  return GYRE_OK;
}

gyre_status gyre_set_device(int32_t device) {
  GYRE_CHECK(device_check(device, "gyre_set_device"));
  return be_set_device(device);
}

gyre_status gyre_device_name(int32_t device, char *buf, size_t cap) {
  if (buf == NULL || cap == 0) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_device_name: empty buffer");
  GYRE_CHECK(device_check(device, "gyre_device_name"));
  return be_device_name(device, buf, cap);
}

void model_use_threads(const gyre_model *m) { be_use_threads(__atomic_load_n(&m->threads, __ATOMIC_RELAXED)); }

gyre_status gyre_model_set_threads(gyre_model *m, int32_t n) {
  if (m == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_set_threads: model is NULL");
  if (n < 0) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_set_threads: n = %d, must be >= 0", n);
  __atomic_store_n(&m->threads, n, __ATOMIC_RELAXED);
  return GYRE_OK;
}

gyre_status gyre_model_threads(const gyre_model *m, int32_t *n) {
  if (m == NULL || n == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_threads: NULL argument");
  *n = be_threads_for(__atomic_load_n(&m->threads, __ATOMIC_RELAXED));
  return GYRE_OK;
}

void model_retain(gyre_model *m) { __atomic_fetch_add(&m->refs, 1, __ATOMIC_RELAXED); }

/* The last release frees; acquire-release so every other holder's writes happen before. */
void model_release(gyre_model *m) {
  if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  be_model_free(m->be);
  layout_free(&m->layout);
  free(m);
}

/* A model with zeroed device weights whose matrices are kept as wdtype. */
static gyre_status model_new(const gyre_config *cfg, int32_t wdtype, gyre_model **out) {
  if (out == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "model: out is NULL");
  gyre_model *m = calloc(1, sizeof *m);
  if (m == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "model: out of host memory");
  gyre_status st = layout_build(cfg, &m->layout);
  if (st == GYRE_OK) st = be_model_create(&m->layout, wdtype, &m->be);
  if (st != GYRE_OK) {
    layout_free(&m->layout);
    free(m);
    return st;
  }
  m->cfg = *cfg;
  m->refs = 1;
  *out = m;
  return GYRE_OK;
}

/* Creates a model whose weights come from fill(flat) on the host. */
static gyre_status model_from_host(const gyre_config *cfg, gyre_model **out,
                                   gyre_status (*fill)(const param_layout *, float *, const void *),
                                   const void *arg) {
  gyre_model *m = NULL;
  GYRE_CHECK(model_new(cfg, GYRE_F32, &m));
  float *flat = malloc(sizeof(float) * (size_t)m->layout.n_params);
  gyre_status st = flat == NULL ? gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "model: out of host memory") : GYRE_OK;
  if (st == GYRE_OK) st = fill(&m->layout, flat, arg);
  if (st == GYRE_OK) st = be_model_set_weights(m->be, flat);
  free(flat);
  if (st != GYRE_OK) {
    model_release(m);
    return st;
  }
  *out = m;
  return GYRE_OK;
}

typedef struct init_args {
  uint64_t seed;
  float std;
} init_args;

static gyre_status fill_random(const param_layout *lay, float *flat, const void *arg) {
  const init_args *a = arg;
  init_weights(lay, a->seed, a->std, flat);
  return GYRE_OK;
}

gyre_status gyre_model_create(const gyre_config *cfg, uint64_t seed, float init_std, gyre_model **out) {
  if (!(init_std >= 0.0f))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_create: init_std must be >= 0, got %g", init_std);
  init_args a = {seed, init_std};
  return model_from_host(cfg, out, fill_random, &a);
}

typedef struct buffer_args {
  const uint8_t *buf;
  size_t len;
} buffer_args;

static gyre_status fill_safetensors(const param_layout *lay, float *flat, const void *arg) {
  const buffer_args *a = arg;
  const char *prefix = "";
  return st_decode(lay, 1, &prefix, &flat, a->buf, a->len, NULL, NULL, 0);
}

gyre_status gyre_model_load(const gyre_config *cfg, const uint8_t *safetensors, size_t len,
                            gyre_model **out) {
  buffer_args a = {safetensors, len};
  return model_from_host(cfg, out, fill_safetensors, &a);
}

gyre_status gyre_model_create_zero(const gyre_config *cfg, int32_t weight_dtype, gyre_model **out) {
  if (weight_dtype != GYRE_F32 && weight_dtype != GYRE_F16 && weight_dtype != GYRE_BF16)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_create_zero: weight_dtype %d is not F32 (0), F16 (1) or BF16 (2)",
                     (int)weight_dtype);
  return model_new(cfg, weight_dtype, out); /* backends create zeroed weights */
}

gyre_status gyre_model_weight_dtype(const gyre_model *m, int32_t *dtype) {
  if (m == NULL || dtype == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_weight_dtype: NULL argument");
  *dtype = be_model_weight_dtype(m->be);
  return GYRE_OK;
}

gyre_status gyre_model_save(const gyre_model *m, uint8_t *out, size_t cap, size_t *len) {
  if (m == NULL || len == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_save: NULL argument");
  float *flat = malloc(sizeof(float) * (size_t)m->layout.n_params);
  if (flat == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_model_save: out of host memory");
  gyre_status st = out == NULL ? GYRE_OK : be_model_get_weights(m->be, flat);
  const char *prefix = "";
  const float *flats[1] = {flat};
  if (st == GYRE_OK) st = st_encode(&m->layout, 1, &prefix, flats, "{\"format\":\"pt\"}", out, cap, len);
  free(flat);
  return st;
}

gyre_status gyre_model_config(const gyre_model *m, gyre_config *cfg) {
  if (m == NULL || cfg == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_model_config: NULL argument");
  *cfg = m->cfg;
  return GYRE_OK;
}

gyre_status gyre_model_get_weights(const gyre_model *m, float *out, int64_t n) {
  GYRE_CHECK(flat_check(m ? &m->layout : NULL, m, out, n, "gyre_model_get_weights"));
  return be_model_get_weights(m->be, out);
}

gyre_status gyre_model_set_weights(gyre_model *m, const float *in, int64_t n) {
  GYRE_CHECK(flat_check(m ? &m->layout : NULL, m, in, n, "gyre_model_set_weights"));
  return be_model_set_weights(m->be, in);
}

void gyre_model_free(gyre_model *m) {
  if (m != NULL) model_release(m);
}
