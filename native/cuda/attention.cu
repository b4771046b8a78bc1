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
 * head) for dk and dv, so there are no atomics and every sum has a fixed order. Which keys a
 * query sees comes from its ancestor ranges (struct forest's, O(T) in all; no T x T mask):
 * a block's warp 0 binary-searches its rows' ranges for the next key tile any of them sees
 * and the rows' 64-bit masks over it, so a forest costs about its ancestor pairs. A chunk's
 * queries read the keys of earlier chunks from the batch's K/V store (forest_keys), and the
 * key tiles before the chunk send their dk, dv back into it.
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

constexpr int FT = 256;              /* threads: a 16 x 16 grid */
constexpr int NONE = 0x7fffffff;     /* no key */

/* What every forest kernel needs to know of the chunk and the model: T = e - s query rows. */
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

/* max / sum over the 16 lanes of a half-warp (the tx of one ty); all 32 lanes call it */
__device__ __forceinline__ float row_max16(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum16(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct min_op {
  __device__ __forceinline__ int operator()(int a, int b) const { return min(a, b); }
};

/* The first of token i's ranges that reaches key j (its end >= j), or range_off[i + 1]:
 * a binary search, the ranges being ascending and disjoint. */
__device__ __forceinline__ int first_range(const forest_keys &fk, int i, int j) {
  int lo = fk.range_off[i], hi = fk.range_off[i + 1];
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (fk.ranges[2 * mid + 1] < j) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Token i's first ancestor at or after key j (NONE when it has none there). */
__device__ __forceinline__ int next_seen(const forest_keys &fk, int i, int j) {
  const int k = first_range(fk, i, j);
  return k < fk.range_off[i + 1] ? max(fk.ranges[2 * k], j) : NONE;
}

/* Bit u set when token i sees key j0 + u, u < 64. */
__device__ __forceinline__ uint64_t seen_bits(const forest_keys &fk, int i, int j0) {
  uint64_t bits = 0;
  for (int k = first_range(fk, i, j0); k < fk.range_off[i + 1] && fk.ranges[2 * k] < j0 + 64; k++) {
    const int a = max(fk.ranges[2 * k], j0) - j0, b = min(fk.ranges[2 * k + 1], j0 + 63) - j0;
    bits |= (b == 63 ? ~0ull : (1ull << (b + 1)) - 1ull) & ~((1ull << a) - 1ull);
  }
  return bits;
}

/* The first tile of kw keys (kw <= 64), from key j on, that any query row i0 .. i0 + 63 (< T)
 * of the block sees, or -1; bits[r] receives row i0 + r's seen keys from the tile's first on
 * (shared memory, as tile_at). The warp-0 lanes search the rows' ranges, so a block visits
 * only the key tiles its rows see and no ancestor matrix exists. Every thread calls it; its
 * first barrier also orders the previous tile's shared memory before the next loads. */
__device__ int next_key_tile(const forest_keys &fk, int i0, int T, int j, int kw, uint64_t *bits, int *tile_at) {
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int next = NONE;
    for (int r = lane; r < 64; r += 32)
      if (i0 + r < T) next = min(next, next_seen(fk, fk.s + i0 + r, j));
    next = warp_reduce(next, min_op());
    const int tile = next == NONE ? -1 : next / kw;
    for (int r = lane; r < 64; r += 32) bits[r] = tile >= 0 && i0 + r < T ? seen_bits(fk, fk.s + i0 + r, tile * kw) : 0;
    if (lane == 0) *tile_at = tile;
  }
  __syncthreads();
  return *tile_at;
}

/* Block (query tile of 64 rows, head h): att rows and lse, over the key tiles its rows see. */
template <int HDP>
__global__ void __launch_bounds__(FT)
    forest_forward_k(float *__restrict__ att, float *__restrict__ lse, const float *__restrict__ qkv,
                     const forest_keys fk, const forest_dims fd) {
  constexpr int LD = HDP + 1, CD = HDP / 16;
  const int T = fd.T, H = fd.H, hd = fd.hd, q_dim = fd.q_dim, qkv_dim = fd.qkv_dim;
  const float scale = fd.scale;
  DYNAMIC_SMEM(smem);
  float *qs = smem, *ks = qs + 64 * LD, *vs = ks + 64 * LD, *ps = vs + 64 * LD; /* ps: [64][65] */
  uint64_t *bits = reinterpret_cast<uint64_t *>(ps + 64 * 65);
  int *tile_at = reinterpret_cast<int *>(bits + 64);
  const int qt = blockIdx.x, h = blockIdx.y, g = h / fd.G, i0 = qt * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  load_rows<HDP>(qs, qkv + (size_t)h * hd, qkv_dim, i0, 64, T, hd);
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o[4][CD];
  tile_zero(o);
  for (int kt = next_key_tile(fk, i0, T, 0, 64, bits, tile_at); kt >= 0;
       kt = next_key_tile(fk, i0, T, 64 * (kt + 1), 64, bits, tile_at)) {
    load_rows<HDP>(ks, fk.k + (size_t)g * hd, fk.ld, kt * 64, 64, fk.e, hd);
    load_rows<HDP>(vs, fk.v + (size_t)g * hd, fk.ld, kt * 64, 64, fk.e, hd);
    __syncthreads();
    float s[4][4];
    tile_zero(s);
    tile_mma<4, 4>(s, qs, LD, 1, ks, LD, 1, HDP);
#pragma unroll
    for (int a = 0; a < 4; a++) {
      const uint64_t row_bits = bits[ty + 16 * a];
      bool valid[4];
      float mx = -INFINITY;
#pragma unroll
      for (int b = 0; b < 4; b++) {
        valid[b] = ((row_bits >> (tx + 16 * b)) & 1u) != 0;
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

/* Block (query tile of 64 rows, head h): dq = scale * sum_j ds_ij k_j over the 32-key tiles
 * its rows see. */
template <int HDP>
__global__ void __launch_bounds__(FT)
    forest_dq_k(float *__restrict__ dqkv, const float *__restrict__ datt, const float *__restrict__ qkv,
                const float *__restrict__ lse, const float *__restrict__ dsum, const forest_keys fk,
                const forest_dims fd) {
  constexpr int LD = HDP + 1, CD = HDP / 16;
  const int T = fd.T, H = fd.H, hd = fd.hd, q_dim = fd.q_dim, qkv_dim = fd.qkv_dim;
  const float scale = fd.scale;
  DYNAMIC_SMEM(smem);
  float *qs = smem, *dos = qs + 64 * LD, *ks = dos + 64 * LD, *vs = ks + 32 * LD, *ss = vs + 32 * LD; /* ss: [64][33] */
  uint64_t *bits = reinterpret_cast<uint64_t *>(ss + 64 * 33);
  int *tile_at = reinterpret_cast<int *>(bits + 64);
  const int qt = blockIdx.x, h = blockIdx.y, g = h / fd.G, i0 = qt * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
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
  for (int kb = next_key_tile(fk, i0, T, 0, 32, bits, tile_at); kb >= 0;
       kb = next_key_tile(fk, i0, T, 32 * (kb + 1), 32, bits, tile_at)) {
    load_rows<HDP>(ks, fk.k + (size_t)g * hd, fk.ld, kb * 32, 32, fk.e, hd);
    load_rows<HDP>(vs, fk.v + (size_t)g * hd, fk.ld, kb * 32, 32, fk.e, hd);
    __syncthreads();
    float s[4][2], dp[4][2];
    tile_zero(s);
    tile_zero(dp);
    tile_mma<4, 2>(s, qs, LD, 1, ks, LD, 1, HDP);
    tile_mma<4, 2>(dp, dos, LD, 1, vs, LD, 1, HDP);
#pragma unroll
    for (int a = 0; a < 4; a++) {
      const uint32_t word = (uint32_t)bits[ty + 16 * a];
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

/* The gradients acc * factor of keys j0 + ty + 16a (< e), kind 0 (K) or 1 (V) of kv head g: a
 * token of the chunk gets it in its dqkv row, plus what later chunks carried in dkv; an
 * earlier token adds it into dkv. */
template <int CD>
__device__ __forceinline__ void store_key_grads(float *dqkv, const forest_keys &fk, const forest_dims &fd, int j0, int g,
                                                int kind, const float (&acc)[4][CD], float factor) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, kv_dim = fd.kv_dim, hd = fd.hd;
#pragma unroll
  for (int a = 0; a < 4; a++) {
    const int j = j0 + ty + 16 * a;
    if (j >= fk.e) continue;
    float *carried = fk.dkv != NULL ? fk.dkv + (size_t)j * 2 * kv_dim + (size_t)kind * kv_dim + (size_t)g * hd : NULL;
    float *own = j >= fk.s ? dqkv + (size_t)(j - fk.s) * fd.qkv_dim + fd.q_dim + (size_t)kind * kv_dim + (size_t)g * hd : NULL;
#pragma unroll
    for (int c = 0; c < CD; c++) {
      const int col = tx + 16 * c;
      if (col >= hd) continue;
      const float v = acc[a][c] * factor;
      if (own == NULL) carried[col] += v;
      else own[col] = carried != NULL ? v + carried[col] : v;
    }
  }
}

/* Block (key tile of 64 tokens from j0 = 64 blockIdx.x, any of [0, e); kv head g): dk = scale
 * * sum_i ds_ij q_i and dv = sum_i p_ij do_i over the query heads of g and the chunk's 32-row
 * query tiles that see a key of the tile, in order. */
template <int HDP>
__global__ void __launch_bounds__(FT)
    forest_dkv_k(float *__restrict__ dqkv, const float *__restrict__ datt, const float *__restrict__ qkv,
                 const float *__restrict__ lse, const float *__restrict__ dsum, const forest_keys fk,
                 const forest_dims fd) {
  constexpr int LD = HDP + 1, CD = HDP / 16;
  const int T = fd.T, H = fd.H, G = fd.G, hd = fd.hd, q_dim = fd.q_dim, qkv_dim = fd.qkv_dim;
  const float scale = fd.scale;
  DYNAMIC_SMEM(smem);
  float *ks = smem, *vs = ks + 64 * LD, *qs = vs + 64 * LD, *dos = qs + 32 * LD;
  float *ps = dos + 32 * LD, *ds = ps + 64 * 33; /* [64 keys][33] */
  float *q_lse = ds + 64 * 33, *q_dsum = q_lse + 32;
  uint64_t *q_bits = reinterpret_cast<uint64_t *>(q_dsum + 32); /* [32]: each query row's seen keys of the tile */
  int *any_seen = reinterpret_cast<int *>(q_bits + 32);
  const int kt = blockIdx.x, g = blockIdx.y, j0 = kt * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  load_rows<HDP>(ks, fk.k + (size_t)g * hd, fk.ld, j0, 64, fk.e, hd);
  load_rows<HDP>(vs, fk.v + (size_t)g * hd, fk.ld, j0, 64, fk.e, hd);
  float dk[4][CD], dv[4][CD];
  tile_zero(dk);
  tile_zero(dv);
  for (int h = g * G; h < (g + 1) * G; h++) {
    for (int qa = max(0, j0 - fk.s) / 32; qa * 32 < T; qa++) { /* ancestors come first: queries from j0 on */
      __syncthreads(); /* ks, vs written / the previous qs, dos, ps, ds, q_*, any_seen consumed */
      if (threadIdx.x < 32) {
        const int q = qa * 32 + threadIdx.x;
        const uint64_t b = q < T ? seen_bits(fk, fk.s + q, j0) : 0;
        q_bits[threadIdx.x] = b;
        const int any = warp_sum(b != 0 ? 1 : 0);
        if (threadIdx.x == 0) *any_seen = any;
      }
      __syncthreads();
      if (*any_seen == 0) continue; /* block-uniform */
      load_rows<HDP>(qs, qkv + (size_t)h * hd, qkv_dim, qa * 32, 32, T, hd);
      load_rows<HDP>(dos, datt + (size_t)h * hd, q_dim, qa * 32, 32, T, hd);
      if (threadIdx.x < 32) {
        const int i = qa * 32 + threadIdx.x;
        q_lse[threadIdx.x] = i < T ? lse[(size_t)i * H + h] : 0.0f;
        q_dsum[threadIdx.x] = i < T ? dsum[(size_t)i * H + h] : 0.0f;
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
          const bool seen = (q_bits[q] >> jj) & 1u;
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
  store_key_grads(dqkv, fk, fd, j0, g, 0, dk, scale);
  store_key_grads(dqkv, fk, fd, j0, g, 1, dv, 1.0f);
}

/* store[s + r][K | V] = the K and V columns of qkv row r, r < T */
__global__ void forest_keys_put_k(float *__restrict__ store, const float *__restrict__ qkv, int s, int T, int q_dim,
                                  int kv_dim, int qkv_dim) {
  const int64_t total = (int64_t)T * 2 * kv_dim;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    const int r = (int)(idx / (2 * kv_dim)), c = (int)(idx % (2 * kv_dim));
    store[(size_t)(s + r) * 2 * kv_dim + c] = qkv[(size_t)r * qkv_dim + q_dim + c];
  }
}

/* Dynamic shared memory of each kernel (with the 64 rows' seen-key bits and the tile index). */
size_t forward_smem(int hdp) { return sizeof(float) * (3 * 64 * (hdp + 1) + 64 * 65) + 64 * 8 + 16; }
size_t dq_smem(int hdp) { return sizeof(float) * (2 * 64 * (hdp + 1) + 2 * 32 * (hdp + 1) + 64 * 33) + 64 * 8 + 16; }
size_t dkv_smem(int hdp) {
  return sizeof(float) * (2 * 64 * (hdp + 1) + 2 * 32 * (hdp + 1) + 2 * 64 * 33 + 2 * 32) + 32 * 8 + 16;
}

int padded_head_dim(int hd) { return hd <= 32 ? 32 : hd <= 64 ? 64 : 128; }

forest_dims forest_dims_of(const forest_keys *fk, const dims *d) {
  return forest_dims{fk->e - fk->s, d->H, d->H / d->KV, d->hd, d->q_dim, d->kv_dim, d->qkv_dim, 1.0f / sqrtf((float)d->hd)};
}

template <int HDP>
gyre_status forest_forward_hdp(exec_ctx *ctx, float *att, float *lse, const float *qkv, const forest_keys &fk,
                               const forest_dims &fd) {
  const size_t smem = forward_smem(HDP);
  CU(cudaFuncSetAttribute(forest_forward_k<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  LAUNCH(dim3(cdiv(fd.T, 64), fd.H), FT, smem, ctx->stream, forest_forward_k<HDP>)(att, lse, qkv, fk, fd);
  CU_LAUNCHED();
  return GYRE_OK;
}

template <int HDP>
gyre_status forest_backward_hdp(exec_ctx *ctx, float *dqkv, const float *datt, const float *qkv, const float *lse,
                                const float *dsum, const forest_keys &fk, const forest_dims &fd) {
  const size_t smem_q = dq_smem(HDP), smem_kv = dkv_smem(HDP);
  CU(cudaFuncSetAttribute(forest_dq_k<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
  CU(cudaFuncSetAttribute(forest_dkv_k<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
  LAUNCH(dim3(cdiv(fd.T, 64), fd.H), FT, smem_q, ctx->stream, forest_dq_k<HDP>)(dqkv, datt, qkv, lse, dsum, fk, fd);
  CU_LAUNCHED();
  LAUNCH(dim3(cdiv(fk.e, 64), fd.H / fd.G), FT, smem_kv, ctx->stream, forest_dkv_k<HDP>)(dqkv, datt, qkv, lse, dsum, fk,
                                                                                          fd);
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

gyre_status forest_keys_put(exec_ctx *ctx, float *store, const float *qkv, int s, int e, const dims *d) {
  if (e <= s) return GYRE_OK;
  LAUNCH(grid_for((int64_t)(e - s) * 2 * d->kv_dim), 256, 0, ctx->stream, forest_keys_put_k)(store, qkv, s, e - s, d->q_dim,
                                                                                          d->kv_dim, d->qkv_dim);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status forest_attention_forward(exec_ctx *ctx, float *att, float *lse, const float *qkv, const forest_keys *keys,
                                     const dims *d) {
  const forest_dims fd = forest_dims_of(keys, d);
  switch (padded_head_dim(d->hd)) {
    case 32: return forest_forward_hdp<32>(ctx, att, lse, qkv, *keys, fd);
    case 64: return forest_forward_hdp<64>(ctx, att, lse, qkv, *keys, fd);
    default: return forest_forward_hdp<128>(ctx, att, lse, qkv, *keys, fd);
  }
}

gyre_status forest_attention_backward(exec_ctx *ctx, float *dqkv, const float *datt, const float *qkv,
                                      const float *att, const float *lse, float *dsum, const forest_keys *keys,
                                      const dims *d) {
  const forest_dims fd = forest_dims_of(keys, d);
  LAUNCH(grid_for((int64_t)fd.T * d->H * 32), 256, 0, ctx->stream, forest_dsum_k)(dsum, att, datt, fd.T, d->H, d->hd,
                                                                                  d->q_dim);
  CU_LAUNCHED();
  switch (padded_head_dim(d->hd)) {
    case 32: return forest_backward_hdp<32>(ctx, dqkv, datt, qkv, lse, dsum, *keys, fd);
    case 64: return forest_backward_hdp<64>(ctx, dqkv, datt, qkv, lse, dsum, *keys, fd);
    default: return forest_backward_hdp<128>(ctx, dqkv, datt, qkv, lse, dsum, *keys, fd);
  }
}
