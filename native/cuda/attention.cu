/*
 * attention.cu - scaled dot-product attention over the paged cache and over forests.
 *
 * Paged (inference): a block of 128 threads takes one item - up to 16 query vectors (rows
 * of one sequence x query heads sharing a kv head) against one chunk of up to 256 cached
 * keys - and streams the chunk through shared memory 32 keys at a time with an online
 * softmax (one key per lane, one query vector per warp at a time). Long contexts thus
 * spread over many blocks (flash-decoding); a second kernel merges a unit's chunks in order.
 *
 * Forest (training): 256 threads as a 16 x 16 grid multiply shared-memory tiles, each thread
 * owning rows ty + 16a and columns tx + 16b (odd row strides keep every access pattern free
 * of bank conflicts). The forward streams 64-key tiles past a 64-query tile with an online
 * softmax and saves the log-sum-exp; the backward recomputes probabilities from it, once per
 * query tile for dq and once per key tile (over the queries of every head sharing the kv
 * head) for dk and dv, so there are no atomics and every sum has a fixed order. Tiles whose
 * queries see none of the keys (from the 32 x 32 tile summary of the ancestor mask) are
 * skipped, so a forest costs about its ancestor pairs.
 */
#include <math.h>

#include "attention.cuh"
#include "../src/half.h"
#ifndef GYRE_CUDA_EMU /* defined by the emulator's cuda_runtime.h, which attention.cuh includes */
#include <cuda_fp16.h>
#endif

namespace {

/* KV elements as F32: F32 as is, F16 from its bits (exact). */
__device__ __forceinline__ float kv_get(float x) { return x; }
__device__ __forceinline__ float kv_get(uint16_t h) {
#ifdef GYRE_CUDA_EMU
  return half_to_float(h);
#else
  return __half2float(__ushort_as_half(h));
#endif
}
/* Stores x as a KV element: F16 rounded to nearest even and saturated at +-65504 (NaN kept). */
__device__ __forceinline__ void kv_put(float *p, float x) { *p = x; }
__device__ __forceinline__ void kv_put(uint16_t *p, float x) {
#ifdef GYRE_CUDA_EMU
  *p = half_from_float(x);
#else
  x = x > HALF_MAX ? HALF_MAX : (x < -HALF_MAX ? -HALF_MAX : x);
  *p = __half_as_ushort(__float2half_rn(x));
#endif
}
/* Four consecutive elements (p 16-byte aligned for F32, 8-byte for F16). */
__device__ __forceinline__ float4 kv_get4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ float4 kv_get4(const uint16_t *p) {
  const uint64_t bits = *reinterpret_cast<const uint64_t *>(p);
  return make_float4(kv_get((uint16_t)bits), kv_get((uint16_t)(bits >> 16)), kv_get((uint16_t)(bits >> 32)),
                     kv_get((uint16_t)(bits >> 48)));
}

/* ---- paged attention ---- */

constexpr int PQ = 16;  /* query vectors per item */
constexpr int PK = 32;  /* keys per shared-memory tile */
constexpr int PAGED_THREADS = 128;

template <typename T>
__global__ void kv_store_k(T *__restrict__ pool, const float *__restrict__ qkv, const int32_t *__restrict__ positions,
                           const int32_t *__restrict__ row_seq, const int32_t *__restrict__ block_off,
                           const int32_t *__restrict__ blocks, int n_rows, int L, int KV, int hd, int q_dim, int kv_dim,
                           int qkv_dim, int B, int layer) {
  const int64_t total = (int64_t)n_rows * kv_dim;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int r = (int)(idx / kv_dim), e = (int)(idx % kv_dim), g = e / hd, c = e % hd;
    const int pos = positions[r];
    const int32_t block = blocks[block_off[row_seq[r]] + pos / B];
    const size_t at = ((((size_t)block * L + layer) * 2) * KV + g) * (size_t)B * hd + (size_t)(pos % B) * hd + c;
    const float *k = qkv + (size_t)r * qkv_dim + q_dim;
    kv_put(&pool[at], k[e]);
    kv_put(&pool[at + (size_t)KV * B * hd], k[kv_dim + e]); /* V: kind 1 of the same block and layer */
  }
}

template <typename T>
__global__ void kv_transfer_k(T *__restrict__ pool, T *__restrict__ payload, const int32_t *__restrict__ blocks,
                              int length, int L, int KV, int hd, int B, int to_payload) {
  const int64_t row = (int64_t)KV * hd, total = (int64_t)L * 2 * length * row;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int e = (int)(idx % row);
    const int64_t lkt = idx / row; /* (layer * 2 + kind) * length + t */
    const int t = (int)(lkt % length);
    const int lk = (int)(lkt / length), g = e / hd, c = e % hd;
    const size_t at = (((size_t)blocks[t / B] * L * 2 + lk) * KV + g) * (size_t)B * hd + (size_t)(t % B) * hd + c;
    if (to_payload) payload[idx] = pool[at];
    else pool[at] = payload[idx];
  }
}

/* One item: query vectors qi = rr * HG + hh (row r0 + rr, head g*G + slice*HG + hh) against
 * keys [chunk * PAGED_CHUNK, ...) of the unit's sequence, keys beyond a row's position
 * masked. Writes the unnormalised output, running max and sum per query vector to
 * partial[(item * gridDim.y + blockIdx.y) * PQ + qi][HDP + 2]. */
template <int HDP, typename T>
__global__ void __launch_bounds__(PAGED_THREADS)
    paged_attention_k(float *__restrict__ partial, const float *__restrict__ qkv, const T *__restrict__ pool,
                      const int32_t *__restrict__ positions, const int32_t *__restrict__ row_seq,
                      const int32_t *__restrict__ block_off, const int32_t *__restrict__ blocks,
                      const int32_t *__restrict__ unit_row0, const int32_t *__restrict__ unit_rows,
                      const int32_t *__restrict__ item_unit, const int32_t *__restrict__ item_chunk, int layer, int L,
                      int KV, int hd, int G, int HG, int slices, int qkv_dim, int B, float scale) {
  constexpr int QW = PQ / (PAGED_THREADS / 32); /* query vectors per warp: qi = warp + 4 i */
  constexpr int DC = HDP / 32;                  /* output dims per lane: lane + 32 c */
  __shared__ float qs[PQ][HDP];
  __shared__ float ks[PK][HDP + 1];
  __shared__ float vs[PK][HDP];
  const int item = blockIdx.x, g = blockIdx.y / slices, slice = blockIdx.y % slices;
  const int u = item_unit[item], r0 = unit_row0[u], nr = unit_rows[u];
  const int pos0 = positions[r0], nq = nr * HG;
  const int kbeg = item_chunk[item] * PAGED_CHUNK, kend = min(kbeg + PAGED_CHUNK, pos0 + nr);
  const int32_t *table = blocks + block_off[row_seq[r0]];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int idx = threadIdx.x; idx < PQ * HDP; idx += PAGED_THREADS) {
    const int qi = idx / HDP, c = idx % HDP;
    float v = 0.0f;
    if (qi < nq && c < hd) {
      const int rr = qi / HG, h = g * G + slice * HG + qi % HG;
      v = qkv[(size_t)(r0 + rr) * qkv_dim + (size_t)h * hd + c];
    }
    qs[qi][c] = v;
  }
  float m[QW], l[QW], acc[QW][DC];
#pragma unroll
  for (int i = 0; i < QW; i++) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; c++) acc[i][c] = 0.0f;
  }
  const size_t v_from_k = (size_t)KV * B * hd;
  const bool vec = hd % 4 == 0; /* then every key row starts 16-byte aligned */
  for (int k0 = kbeg; k0 < kend; k0 += PK) {
    __syncthreads(); /* qs written (first tile) / the previous tile consumed */
    for (int idx = threadIdx.x; idx < PK * HDP / 4; idx += PAGED_THREADS) { /* 4 dims per step */
      const int jj = idx / (HDP / 4), c = idx % (HDP / 4) * 4, j = k0 + jj;
      float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
      if (j < kend && c < hd) {
        const T *at = pool + ((((size_t)table[j / B] * L + layer) * 2) * KV + g) * (size_t)B * hd +
                      (size_t)(j % B) * hd + c;
        if (vec) {
          kv = kv_get4(at);
          vv = kv_get4(at + v_from_k);
        } else { /* hd is even: c + 1 < hd; c + 2 < hd iff c + 3 < hd */
          kv.x = kv_get(at[0]), kv.y = kv_get(at[1]), vv.x = kv_get(at[v_from_k]), vv.y = kv_get(at[v_from_k + 1]);
          if (c + 2 < hd)
            kv.z = kv_get(at[2]), kv.w = kv_get(at[3]), vv.z = kv_get(at[v_from_k + 2]), vv.w = kv_get(at[v_from_k + 3]);
        }
      }
      ks[jj][c] = kv.x, ks[jj][c + 1] = kv.y, ks[jj][c + 2] = kv.z, ks[jj][c + 3] = kv.w;
      vs[jj][c] = vv.x, vs[jj][c + 1] = vv.y, vs[jj][c + 2] = vv.z, vs[jj][c + 3] = vv.w;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < QW; i++) {
      const int qi = warp + 4 * i;
      if (qi >= nq) break; /* warp-uniform */
      const int j = k0 + lane, pos = pos0 + qi / HG;
      float s = 0.0f;
#pragma unroll 8
      for (int c = 0; c < HDP; c++) s = fmaf(qs[qi][c], ks[lane][c], s);
      const bool valid = j < kend && j <= pos;
      s = valid ? s * scale : -INFINITY;
      const float mnew = fmaxf(m[i], warp_max(s));
      const float base = mnew == -INFINITY ? 0.0f : mnew; /* nothing visible yet: keep zeros */
      const float p = valid ? expf(s - base) : 0.0f;
      const float corr = expf(m[i] - base);
      l[i] = l[i] * corr + warp_sum(p);
#pragma unroll
      for (int c = 0; c < DC; c++) acc[i][c] *= corr;
      for (int jj = 0; jj < PK; jj++) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int c = 0; c < DC; c++) acc[i][c] = fmaf(pj, vs[jj][lane + 32 * c], acc[i][c]);
      }
      m[i] = mnew;
    }
  }
#pragma unroll
  for (int i = 0; i < QW; i++) {
    const int qi = warp + 4 * i;
    if (qi >= nq) break;
    float *out = partial + (((size_t)item * gridDim.y + blockIdx.y) * PQ + qi) * (HDP + 2);
#pragma unroll
    for (int c = 0; c < DC; c++) out[lane + 32 * c] = acc[i][c];
    if (lane == 0) {
      out[HDP] = m[i];
      out[HDP + 1] = l[i];
    }
  }
}

/* att[r][h*hd + c] from the partial results of row r's unit, merged over its items in order. */
template <int HDP>
__global__ void paged_merge_k(float *__restrict__ att, const float *__restrict__ partial,
                              const int32_t *__restrict__ row_unit, const int32_t *__restrict__ unit_row0,
                              const int32_t *__restrict__ unit_item0, const int32_t *__restrict__ unit_items, int hd,
                              int G, int HG, int slices, int q_dim) {
  const int r = blockIdx.x, h = blockIdx.y, c = threadIdx.x, ys = (int)gridDim.y / G * slices; /* KV * slices */
  const int g = h / G, slice = (h % G) / HG, hh = (h % G) % HG, y = g * slices + slice;
  const int u = row_unit[r], qi = (r - unit_row0[u]) * HG + hh;
  const int first = unit_item0[u], count = unit_items[u];
  float mmax = -INFINITY;
  for (int k = 0; k < count; k++)
    mmax = fmaxf(mmax, partial[(((size_t)(first + k) * ys + y) * PQ + qi) * (HDP + 2) + HDP]);
  float sum = 0.0f, out = 0.0f;
  for (int k = 0; k < count; k++) {
    const float *p = partial + (((size_t)(first + k) * ys + y) * PQ + qi) * (HDP + 2);
    const float w = expf(p[HDP] - mmax);
    sum += p[HDP + 1] * w;
    out += p[c] * w;
  }
  if (c < hd) att[(size_t)r * q_dim + (size_t)h * hd + c] = out / sum;
}

/* ---- forest attention ---- */

constexpr int FT = 256; /* threads: a 16 x 16 grid */

/* What every forest kernel needs to know of the batch and the model. */
struct forest_dims {
  int T, H, G, hd, q_dim, kv_dim, qkv_dim;
  float scale;
};

/* acc[a][b] += sum_{k < K} X[(ty + 16a) * xr + k * xk] * Y[(tx + 16b) * yc + k * yk] */
template <int RA, int CB>
__device__ __forceinline__ void tile_mma(float (&acc)[RA][CB], const float *X, int xr, int xk, const float *Y, int yc,
                                         int yk, int K) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll 4
  for (int k = 0; k < K; k++) {
    float xa[RA], yb[CB];
#pragma unroll
    for (int a = 0; a < RA; a++) xa[a] = X[(ty + 16 * a) * xr + k * xk];
#pragma unroll
    for (int b = 0; b < CB; b++) yb[b] = Y[(tx + 16 * b) * yc + k * yk];
#pragma unroll
    for (int a = 0; a < RA; a++)
#pragma unroll
      for (int b = 0; b < CB; b++) acc[a][b] = fmaf(xa[a], yb[b], acc[a][b]);
  }
}

template <int RA, int CB>
__device__ __forceinline__ void tile_zero(float (&acc)[RA][CB]) {
#pragma unroll
  for (int a = 0; a < RA; a++)
#pragma unroll
    for (int b = 0; b < CB; b++) acc[a][b] = 0.0f;
}

/* dst[(row0 + ty + 16a) * ld + tx + 16c] = acc[a][c] * factor[a] for rows < T, columns < hd */
template <int CD>
__device__ __forceinline__ void tile_store(float *dst, size_t ld, int row0, int T, int hd, const float (&acc)[4][CD],
                                           const float (&factor)[4]) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int a = 0; a < 4; a++) {
    const int row = row0 + ty + 16 * a;
    if (row >= T) continue;
#pragma unroll
    for (int c = 0; c < CD; c++)
      if (tx + 16 * c < hd) dst[(size_t)row * ld + tx + 16 * c] = acc[a][c] * factor[a];
  }
}

/* dst[r][c] (row stride HDP + 1) = src[(row0 + r) * ld + c] for r < n, c < hd; 0 elsewhere */
template <int HDP>
__device__ __forceinline__ void load_rows(float *dst, const float *src, int ld, int row0, int n, int T, int hd) {
  for (int idx = threadIdx.x; idx < n * HDP; idx += FT) {
    const int r = idx / HDP, c = idx % HDP;
    dst[r * (HDP + 1) + c] = row0 + r < T && c < hd ? src[(size_t)(row0 + r) * ld + c] : 0.0f;
  }
}

/* Whether any query of 32-row tile qa sees any key of 32-key tile kb. */
__device__ __forceinline__ bool tile_seen(const uint8_t *tiles, int t32, int qa, int kb) {
  return qa < t32 && kb < t32 && tiles[(size_t)qa * t32 + kb] != 0;
}

/* max / sum over the 16 lanes of a half-warp (the tx of one ty); all 32 lanes call it */
__device__ __forceinline__ float row_max16(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum16(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void forest_mask_k(uint32_t *__restrict__ mask, const int32_t *__restrict__ range_off,
                              const int32_t *__restrict__ ranges, int words) {
  const int i = blockIdx.x;
  for (int k = range_off[i] + threadIdx.x; k < range_off[i + 1]; k += blockDim.x) {
    const int a = ranges[2 * k], b = ranges[2 * k + 1];
    for (int w = a >> 5; w <= b >> 5; w++) {
      const int lo = max(a, w * 32) - w * 32, hi = min(b, w * 32 + 31) - w * 32;
      const uint32_t upto = hi == 31 ? 0xffffffffu : (1u << (hi + 1)) - 1u;
      atomicOr(&mask[(size_t)i * words + w], upto & ~((1u << lo) - 1u));
    }
  }
}

__global__ void forest_tiles_k(uint8_t *__restrict__ tiles, const uint32_t *__restrict__ mask, int T, int words) {
  const int qa = blockIdx.x;
  for (int w = threadIdx.x; w < words; w += blockDim.x) {
    uint32_t any = 0;
    for (int i = qa * 32; i < min(T, qa * 32 + 32); i++) any |= mask[(size_t)i * words + w];
    tiles[(size_t)qa * words + w] = any != 0;
  }
}

/* Block (query tile of 64 rows, head h): att rows and lse. */
template <int HDP>
__global__ void __launch_bounds__(FT)
    forest_forward_k(float *__restrict__ att, float *__restrict__ lse, const float *__restrict__ qkv,
                     const uint32_t *__restrict__ mask, const uint8_t *__restrict__ tiles, const forest_dims fd) {
  constexpr int LD = HDP + 1, CD = HDP / 16;
  const int T = fd.T, H = fd.H, hd = fd.hd, q_dim = fd.q_dim, kv_dim = fd.kv_dim, qkv_dim = fd.qkv_dim;
  const float scale = fd.scale;
  DYNAMIC_SMEM(smem);
  float *qs = smem, *ks = qs + 64 * LD, *vs = ks + 64 * LD, *ps = vs + 64 * LD; /* ps: [64][65] */
  const int qt = blockIdx.x, h = blockIdx.y, g = h / fd.G, i0 = qt * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int words = (T + 31) / 32;
  load_rows<HDP>(qs, qkv + (size_t)h * hd, qkv_dim, i0, 64, T, hd);
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o[4][CD];
  tile_zero(o);
  const int kt_last = (min(T, i0 + 64) - 1) / 64;
  for (int kt = 0; kt <= kt_last; kt++) {
    if (!(tile_seen(tiles, words, 2 * qt, 2 * kt) || tile_seen(tiles, words, 2 * qt, 2 * kt + 1) ||
          tile_seen(tiles, words, 2 * qt + 1, 2 * kt) || tile_seen(tiles, words, 2 * qt + 1, 2 * kt + 1)))
      continue; /* block-uniform */
    __syncthreads(); /* qs written / the previous tile's ks, vs, ps consumed */
    load_rows<HDP>(ks, qkv + q_dim + (size_t)g * hd, qkv_dim, kt * 64, 64, T, hd);
    load_rows<HDP>(vs, qkv + q_dim + kv_dim + (size_t)g * hd, qkv_dim, kt * 64, 64, T, hd);
    __syncthreads();
    float s[4][4];
    tile_zero(s);
    tile_mma<4, 4>(s, qs, LD, 1, ks, LD, 1, HDP);
#pragma unroll
    for (int a = 0; a < 4; a++) {
      const int i = i0 + ty + 16 * a;
      const uint32_t w0 = i < T ? mask[(size_t)i * words + 2 * kt] : 0u;
      const uint32_t w1 = i < T && 2 * kt + 1 < words ? mask[(size_t)i * words + 2 * kt + 1] : 0u;
      bool valid[4];
      float mx = -INFINITY;
#pragma unroll
      for (int b = 0; b < 4; b++) {
        const int jj = tx + 16 * b;
        valid[b] = ((jj < 32 ? w0 >> jj : w1 >> (jj - 32)) & 1u) != 0;
        s[a][b] = valid[b] ? s[a][b] * scale : -INFINITY;
        mx = fmaxf(mx, s[a][b]);
      }
      const float mnew = fmaxf(m[a], row_max16(mx));
      const float base = mnew == -INFINITY ? 0.0f : mnew;
      const float corr = expf(m[a] - base);
      float rs = 0.0f;
#pragma unroll
      for (int b = 0; b < 4; b++) {
        const float p = valid[b] ? expf(s[a][b] - base) : 0.0f;
        ps[(ty + 16 * a) * 65 + tx + 16 * b] = p;
        rs += p;
      }
      l[a] = l[a] * corr + row_sum16(rs);
      m[a] = mnew;
#pragma unroll
      for (int c = 0; c < CD; c++) o[a][c] *= corr;
    }
    __syncthreads();
    tile_mma<4, CD>(o, ps, 65, 1, vs, 1, LD, 64);
  }
  float inv_l[4];
#pragma unroll
  for (int a = 0; a < 4; a++) {
    inv_l[a] = 1.0f / l[a];
    if (tx == 0 && i0 + ty + 16 * a < T) lse[(size_t)(i0 + ty + 16 * a) * H + h] = m[a] + logf(l[a]);
  }
  tile_store(att + (size_t)h * hd, q_dim, i0, T, hd, o, inv_l);
}

/* dsum[i][h] = sum_c att[i][h*hd + c] * datt[i][h*hd + c]   (one warp per (i, h)) */
__global__ void forest_dsum_k(float *__restrict__ dsum, const float *__restrict__ att, const float *__restrict__ datt,
                              int T, int H, int hd, int q_dim) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * blockDim.x / 32;
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < (int64_t)T * H; w += warps) {
    const int i = (int)(w / H), h = (int)(w % H); /* warp-uniform */
    const float *o = att + (size_t)i * q_dim + (size_t)h * hd, *dg = datt + (size_t)i * q_dim + (size_t)h * hd;
    float s = 0.0f;
    for (int c = lane; c < hd; c += 32) s += o[c] * dg[c];
    s = warp_sum(s);
    if (lane == 0) dsum[w] = s;
  }
}

/* Block (query tile of 64 rows, head h): dq = scale * sum_j ds_ij k_j over 32-key tiles. */
template <int HDP>
__global__ void __launch_bounds__(FT)
    forest_dq_k(float *__restrict__ dqkv, const float *__restrict__ datt, const float *__restrict__ qkv,
                const float *__restrict__ lse, const float *__restrict__ dsum, const uint32_t *__restrict__ mask,
                const uint8_t *__restrict__ tiles, const forest_dims fd) {
  constexpr int LD = HDP + 1, CD = HDP / 16;
  const int T = fd.T, H = fd.H, hd = fd.hd, q_dim = fd.q_dim, kv_dim = fd.kv_dim, qkv_dim = fd.qkv_dim;
  const float scale = fd.scale;
  DYNAMIC_SMEM(smem);
  float *qs = smem, *dos = qs + 64 * LD, *ks = dos + 64 * LD, *vs = ks + 32 * LD, *ss = vs + 32 * LD; /* ss: [64][33] */
  const int qt = blockIdx.x, h = blockIdx.y, g = h / fd.G, i0 = qt * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int words = (T + 31) / 32;
  load_rows<HDP>(qs, qkv + (size_t)h * hd, qkv_dim, i0, 64, T, hd);
  load_rows<HDP>(dos, datt + (size_t)h * hd, q_dim, i0, 64, T, hd);
  float li[4], di[4], dq[4][CD];
#pragma unroll
  for (int a = 0; a < 4; a++) {
    const int i = i0 + ty + 16 * a;
    li[a] = i < T ? lse[(size_t)i * H + h] : 0.0f;
    di[a] = i < T ? dsum[(size_t)i * H + h] : 0.0f;
  }
  tile_zero(dq);
  const int kb_last = (min(T, i0 + 64) - 1) / 32;
  for (int kb = 0; kb <= kb_last; kb++) {
    if (!(tile_seen(tiles, words, 2 * qt, kb) || tile_seen(tiles, words, 2 * qt + 1, kb))) continue;
    __syncthreads(); /* qs, dos written / the previous ks, vs, ss consumed */
    load_rows<HDP>(ks, qkv + q_dim + (size_t)g * hd, qkv_dim, kb * 32, 32, T, hd);
    load_rows<HDP>(vs, qkv + q_dim + kv_dim + (size_t)g * hd, qkv_dim, kb * 32, 32, T, hd);
    __syncthreads();
    float s[4][2], dp[4][2];
    tile_zero(s);
    tile_zero(dp);
    tile_mma<4, 2>(s, qs, LD, 1, ks, LD, 1, HDP);
    tile_mma<4, 2>(dp, dos, LD, 1, vs, LD, 1, HDP);
#pragma unroll
    for (int a = 0; a < 4; a++) {
      const int i = i0 + ty + 16 * a;
      const uint32_t word = i < T ? mask[(size_t)i * words + kb] : 0u;
#pragma unroll
      for (int b = 0; b < 2; b++) {
        const int jj = tx + 16 * b;
        const float p = (word >> jj) & 1u ? expf(s[a][b] * scale - li[a]) : 0.0f;
        ss[(ty + 16 * a) * 33 + jj] = p * (dp[a][b] - di[a]);
      }
    }
    __syncthreads();
    tile_mma<4, CD>(dq, ss, 33, 1, ks, 1, LD, 32);
  }
  const float scaled[4] = {scale, scale, scale, scale};
  tile_store(dqkv + (size_t)h * hd, qkv_dim, i0, T, hd, dq, scaled);
}

/* Block (key tile of 64 rows, kv head g): dk = scale * sum_i ds_ij q_i and dv = sum_i p_ij do_i
 * over the query heads of g and 32-query tiles, in order. */
template <int HDP>
__global__ void __launch_bounds__(FT)
    forest_dkv_k(float *__restrict__ dqkv, const float *__restrict__ datt, const float *__restrict__ qkv,
                 const float *__restrict__ lse, const float *__restrict__ dsum, const uint32_t *__restrict__ mask,
                 const uint8_t *__restrict__ tiles, const forest_dims fd) {
  constexpr int LD = HDP + 1, CD = HDP / 16;
  const int T = fd.T, H = fd.H, G = fd.G, hd = fd.hd, q_dim = fd.q_dim, kv_dim = fd.kv_dim, qkv_dim = fd.qkv_dim;
  const float scale = fd.scale;
  DYNAMIC_SMEM(smem);
  float *ks = smem, *vs = ks + 64 * LD, *qs = vs + 64 * LD, *dos = qs + 32 * LD;
  float *ps = dos + 32 * LD, *ds = ps + 64 * 33; /* [64 keys][33] */
  float *q_lse = ds + 64 * 33, *q_dsum = q_lse + 32;
  uint32_t *q_mask = reinterpret_cast<uint32_t *>(q_dsum + 32); /* [32][2]: the tile's two mask words */
  const int kt = blockIdx.x, g = blockIdx.y, j0 = kt * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int words = (T + 31) / 32;
  load_rows<HDP>(ks, qkv + q_dim + (size_t)g * hd, qkv_dim, j0, 64, T, hd);
  load_rows<HDP>(vs, qkv + q_dim + kv_dim + (size_t)g * hd, qkv_dim, j0, 64, T, hd);
  float dk[4][CD], dv[4][CD];
  tile_zero(dk);
  tile_zero(dv);
  for (int h = g * G; h < (g + 1) * G; h++) {
    for (int qa = 2 * kt; qa < words; qa++) { /* ancestors come first: queries from j0 on */
      if (!(tile_seen(tiles, words, qa, 2 * kt) || tile_seen(tiles, words, qa, 2 * kt + 1))) continue;
      __syncthreads(); /* ks, vs written / the previous qs, dos, ps, ds, q_* consumed */
      load_rows<HDP>(qs, qkv + (size_t)h * hd, qkv_dim, qa * 32, 32, T, hd);
      load_rows<HDP>(dos, datt + (size_t)h * hd, q_dim, qa * 32, 32, T, hd);
      if (threadIdx.x < 32) {
        const int i = qa * 32 + threadIdx.x;
        q_lse[threadIdx.x] = i < T ? lse[(size_t)i * H + h] : 0.0f;
        q_dsum[threadIdx.x] = i < T ? dsum[(size_t)i * H + h] : 0.0f;
        q_mask[2 * threadIdx.x] = i < T ? mask[(size_t)i * words + 2 * kt] : 0u;
        q_mask[2 * threadIdx.x + 1] = i < T && 2 * kt + 1 < words ? mask[(size_t)i * words + 2 * kt + 1] : 0u;
      }
      __syncthreads();
      float s[4][2], dp[4][2];
      tile_zero(s);
      tile_zero(dp);
      tile_mma<4, 2>(s, ks, LD, 1, qs, LD, 1, HDP);
      tile_mma<4, 2>(dp, vs, LD, 1, dos, LD, 1, HDP);
#pragma unroll
      for (int a = 0; a < 4; a++) {
        const int jj = ty + 16 * a;
#pragma unroll
        for (int b = 0; b < 2; b++) {
          const int q = tx + 16 * b;
          const bool seen = (q_mask[2 * q + (jj >> 5)] >> (jj & 31)) & 1u;
          const float p = seen ? expf(s[a][b] * scale - q_lse[q]) : 0.0f;
          ps[jj * 33 + q] = p;
          ds[jj * 33 + q] = p * (dp[a][b] - q_dsum[q]);
        }
      }
      __syncthreads();
      tile_mma<4, CD>(dv, ps, 33, 1, dos, 1, LD, 32);
      tile_mma<4, CD>(dk, ds, 33, 1, qs, 1, LD, 32);
    }
  }
  const float scaled[4] = {scale, scale, scale, scale}, ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  tile_store(dqkv + q_dim + (size_t)g * hd, qkv_dim, j0, T, hd, dk, scaled);
  tile_store(dqkv + q_dim + kv_dim + (size_t)g * hd, qkv_dim, j0, T, hd, dv, ones);
}

size_t forward_smem(int hdp) { return sizeof(float) * (3 * 64 * (hdp + 1) + 64 * 65); }
size_t dq_smem(int hdp) { return sizeof(float) * (2 * 64 * (hdp + 1) + 2 * 32 * (hdp + 1) + 64 * 33); }
size_t dkv_smem(int hdp) { return sizeof(float) * (2 * 64 * (hdp + 1) + 2 * 32 * (hdp + 1) + 2 * 64 * 33 + 4 * 32); }

int padded_head_dim(int hd) { return hd <= 32 ? 32 : hd <= 64 ? 64 : 128; }

forest_dims forest_dims_of(int T, const dims *d) {
  return forest_dims{T, d->H, d->H / d->KV, d->hd, d->q_dim, d->kv_dim, d->qkv_dim, 1.0f / sqrtf((float)d->hd)};
}

template <int HDP>
gyre_status forest_forward_hdp(exec_ctx *ctx, float *att, float *lse, const float *qkv, const uint32_t *mask,
                               const uint8_t *tiles, const forest_dims &fd) {
  const size_t smem = forward_smem(HDP);
  CU(cudaFuncSetAttribute(forest_forward_k<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  LAUNCH(dim3(cdiv(fd.T, 64), fd.H), FT, smem, ctx->stream, forest_forward_k<HDP>)(att, lse, qkv, mask, tiles, fd);
  CU_LAUNCHED();
  return GYRE_OK;
}

template <int HDP>
gyre_status forest_backward_hdp(exec_ctx *ctx, float *dqkv, const float *datt, const float *qkv, const float *lse,
                                const float *dsum, const uint32_t *mask, const uint8_t *tiles, const forest_dims &fd) {
  const size_t smem_q = dq_smem(HDP), smem_kv = dkv_smem(HDP);
  CU(cudaFuncSetAttribute(forest_dq_k<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
  CU(cudaFuncSetAttribute(forest_dkv_k<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
  LAUNCH(dim3(cdiv(fd.T, 64), fd.H), FT, smem_q, ctx->stream, forest_dq_k<HDP>)(dqkv, datt, qkv, lse, dsum, mask,
                                                                                  tiles, fd);
  CU_LAUNCHED();
  LAUNCH(dim3(cdiv(fd.T, 64), fd.H / fd.G), FT, smem_kv, ctx->stream, forest_dkv_k<HDP>)(dqkv, datt, qkv, lse, dsum,
                                                                                          mask, tiles, fd);
  CU_LAUNCHED();
  return GYRE_OK;
}

template <int HDP, typename T>
gyre_status paged_attention_hdp(exec_ctx *ctx, float *att, const float *qkv, const T *pool, const dims *d, int B,
                                int layer, const dev_rows *rows, const paged_plan *plan, float *partial, float scale) {
  const paged_shape s = paged_shape_of(d);
  const int G = d->H / d->KV, ys = d->KV * s.slices;
  LAUNCH(dim3(plan->n_items, ys), PAGED_THREADS, 0, ctx->stream, paged_attention_k<HDP, T>)(
      partial, qkv, pool, rows->positions, rows->row_seq, rows->block_off, rows->blocks, plan->unit_row0,
      plan->unit_rows, plan->item_unit, plan->item_chunk, layer, d->L, d->KV, d->hd, G, s.heads_per_slice, s.slices,
      d->qkv_dim, B, scale);
  CU_LAUNCHED();
  LAUNCH(dim3(rows->n_rows, d->H), HDP, 0, ctx->stream, paged_merge_k<HDP>)(
      att, partial, plan->row_unit, plan->unit_row0, plan->unit_item0, plan->unit_items, d->hd, G, s.heads_per_slice,
      s.slices, d->q_dim);
  CU_LAUNCHED();
  return GYRE_OK;
}

template <typename T>
gyre_status kv_store_t(exec_ctx *ctx, T *pool, const dims *d, int B, int layer, const dev_rows *rows, const float *qkv) {
  LAUNCH(grid_for((int64_t)rows->n_rows * d->kv_dim), 256, 0, ctx->stream, kv_store_k<T>)(
      pool, qkv, rows->positions, rows->row_seq, rows->block_off, rows->blocks, rows->n_rows, d->L, d->KV, d->hd,
      d->q_dim, d->kv_dim, d->qkv_dim, B, layer);
  CU_LAUNCHED();
  return GYRE_OK;
}

template <typename T>
gyre_status kv_transfer_t(exec_ctx *ctx, T *pool, const dims *d, int B, const int32_t *blocks, int32_t length,
                          T *payload, int to_payload) {
  if (length <= 0) return GYRE_OK;
  LAUNCH(grid_for((int64_t)d->L * 2 * length * d->kv_dim), 256, 0, ctx->stream, kv_transfer_k<T>)(
      pool, payload, blocks, length, d->L, d->KV, d->hd, B, to_payload);
  CU_LAUNCHED();
  return GYRE_OK;
}

template <typename T>
gyre_status paged_attention_t(exec_ctx *ctx, float *att, const float *qkv, const T *pool, const dims *d, int B,
                              int layer, const dev_rows *rows, const paged_plan *plan, float *partial) {
  const float scale = 1.0f / sqrtf((float)d->hd);
  switch (padded_head_dim(d->hd)) {
    case 32: return paged_attention_hdp<32>(ctx, att, qkv, pool, d, B, layer, rows, plan, partial, scale);
    case 64: return paged_attention_hdp<64>(ctx, att, qkv, pool, d, B, layer, rows, plan, partial, scale);
    default: return paged_attention_hdp<128>(ctx, att, qkv, pool, d, B, layer, rows, plan, partial, scale);
  }
}

} // namespace

gyre_status kv_store(exec_ctx *ctx, void *pool, int elem, const dims *d, int B, int layer, const dev_rows *rows,
                     const float *qkv) {
  return elem == 2 ? kv_store_t(ctx, (uint16_t *)pool, d, B, layer, rows, qkv) : kv_store_t(ctx, (float *)pool, d, B, layer, rows, qkv);
}

gyre_status kv_transfer(exec_ctx *ctx, void *pool, int elem, const dims *d, int B, const int32_t *blocks, int32_t length,
                        void *payload, int to_payload) {
  return elem == 2 ? kv_transfer_t(ctx, (uint16_t *)pool, d, B, blocks, length, (uint16_t *)payload, to_payload)
                   : kv_transfer_t(ctx, (float *)pool, d, B, blocks, length, (float *)payload, to_payload);
}

paged_shape paged_shape_of(const dims *d) {
  const int G = d->H / d->KV;
  paged_shape s;
  s.heads_per_slice = 1;
  for (int k = PQ < G ? PQ : G; k >= 1; k--)
    if (G % k == 0) {
      s.heads_per_slice = k;
      break;
    }
  s.slices = G / s.heads_per_slice;
  s.rows_per_unit = PQ / s.heads_per_slice;
  return s;
}

/* Rows in the unit starting at row r0: consecutive rows of one sequence, rows_per_unit at most. */
static int32_t unit_rows_from(const paged_shape *s, const fwd_batch *b, int32_t r0) {
  int32_t nr = 1;
  while (nr < s->rows_per_unit && r0 + nr < b->n_rows && b->row_seq[r0 + nr] == b->row_seq[r0]) nr++;
  return nr;
}

void paged_plan_count(const paged_shape *s, const fwd_batch *b, int32_t *n_units, int32_t *n_items) {
  *n_units = 0;
  *n_items = 0;
  for (int32_t r0 = 0, nr; r0 < b->n_rows; r0 += nr) {
    nr = unit_rows_from(s, b, r0);
    (*n_units)++;
    *n_items += (int32_t)cdiv(b->positions[r0 + nr - 1] + 1, PAGED_CHUNK);
  }
}

void paged_plan_fill(const paged_shape *s, const fwd_batch *b, paged_plan *p) {
  int32_t u = 0, item = 0;
  for (int32_t r0 = 0, nr; r0 < b->n_rows; r0 += nr) {
    nr = unit_rows_from(s, b, r0);
    const int32_t chunks = (int32_t)cdiv(b->positions[r0 + nr - 1] + 1, PAGED_CHUNK);
    p->unit_row0[u] = r0;
    p->unit_rows[u] = nr;
    p->unit_item0[u] = item;
    p->unit_items[u] = chunks;
    for (int32_t k = 0; k < chunks; k++, item++) {
      p->item_unit[item] = u;
      p->item_chunk[item] = k;
    }
    for (int32_t r = r0; r < r0 + nr; r++) p->row_unit[r] = u;
    u++;
  }
  p->n_units = u;
  p->n_items = item;
}

size_t paged_partial_floats(const dims *d, const paged_shape *s, int32_t n_items) {
  return (size_t)n_items * d->KV * s->slices * PQ * (padded_head_dim(d->hd) + 2);
}

gyre_status paged_attention(exec_ctx *ctx, float *att, const float *qkv, const void *pool, int elem, const dims *d, int B,
                            int layer, const dev_rows *rows, const paged_plan *plan, float *partial) {
  return elem == 2 ? paged_attention_t(ctx, att, qkv, (const uint16_t *)pool, d, B, layer, rows, plan, partial)
                   : paged_attention_t(ctx, att, qkv, (const float *)pool, d, B, layer, rows, plan, partial);
}

gyre_status forest_mask(exec_ctx *ctx, uint32_t *mask, uint8_t *tiles, const int32_t *range_off,
                        const int32_t *ranges, int T) {
  const int words = (T + 31) / 32;
  CU(cudaMemsetAsync(mask, 0, sizeof(uint32_t) * (size_t)T * words, ctx->stream));
  LAUNCH(T, 32, 0, ctx->stream, forest_mask_k)(mask, range_off, ranges, words);
  CU_LAUNCHED();
  LAUNCH(words, 128, 0, ctx->stream, forest_tiles_k)(tiles, mask, T, words);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status forest_attention_forward(exec_ctx *ctx, float *att, float *lse, const float *qkv, const uint32_t *mask,
                                     const uint8_t *tiles, int T, const dims *d) {
  const forest_dims fd = forest_dims_of(T, d);
  switch (padded_head_dim(d->hd)) {
    case 32: return forest_forward_hdp<32>(ctx, att, lse, qkv, mask, tiles, fd);
    case 64: return forest_forward_hdp<64>(ctx, att, lse, qkv, mask, tiles, fd);
    default: return forest_forward_hdp<128>(ctx, att, lse, qkv, mask, tiles, fd);
  }
}

gyre_status forest_attention_backward(exec_ctx *ctx, float *dqkv, const float *datt, const float *qkv,
                                      const float *att, const float *lse, float *dsum, const uint32_t *mask,
                                      const uint8_t *tiles, int T, const dims *d) {
  const forest_dims fd = forest_dims_of(T, d);
  LAUNCH(grid_for((int64_t)T * d->H * 32), 256, 0, ctx->stream, forest_dsum_k)(dsum, att, datt, T, d->H, d->hd,
                                                                               d->q_dim);
  CU_LAUNCHED();
  switch (padded_head_dim(d->hd)) {
    case 32: return forest_backward_hdp<32>(ctx, dqkv, datt, qkv, lse, dsum, mask, tiles, fd);
    case 64: return forest_backward_hdp<64>(ctx, dqkv, datt, qkv, lse, dsum, mask, tiles, fd);
    default: return forest_backward_hdp<128>(ctx, dqkv, datt, qkv, lse, dsum, mask, tiles, fd);
  }
}
