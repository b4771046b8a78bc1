/*
 * gemm.cu - SGEMM kernels of the CUDA backend.
 *
 * gemm_tiled: a BM x BN tile of C per block of 256 threads (16 x 16), each thread holding a
 * (BM/16) x (BN/16) register tile in 4-wide chunks 64 rows / columns apart (conflict-free
 * float4 shared-memory reads); K advances in steps of 8 through two shared-memory buffers,
 * the next step's global loads in flight while the current one is multiplied. 128 x 128
 * tiles for large products, 64 x 64 when that leaves SMs idle, and a deterministic split-K
 * (partial sums in scratch, added in a fixed order) when even that is too few blocks, as
 * for weight gradients (small M x N, K = tokens).
 *
 * gemm_skinny: C = A . B^T for M <= 16 rows (decode): each warp streams two rows of B once
 * with float4 loads while A stays in L1; the lanes' partial sums meet in shared memory in a
 * fixed order. This keeps decode's weight reads at memory bandwidth.
 */
#include "gemm.cuh"

namespace {

constexpr int BK = 8;
constexpr int THREADS = 256;

/* One BROWS x BK tile of an operand, global -> registers -> shared memory (stored k-major,
 * s[k][row], rows padded by 4 to keep float4 alignment and avoid bank conflicts).
 * KCONTIG: element (row, k) at src[row * ld + k]; else at src[k * ld + row]. Elements
 * outside rows x [k0, kend) read as 0. */
template <int BROWS, bool KCONTIG>
struct tile_io {
  static constexpr int E = BROWS * BK / THREADS; /* elements per thread */
  static constexpr int PER_K = BK / E;           /* KCONTIG: threads per row */
  static constexpr int PER_ROW = BROWS / E;      /* !KCONTIG: threads per k */

  __device__ static void load(const float *__restrict__ src, int ld, int rows, int kend, int row0, int k0,
                              float (&r)[E]) {
    const int t = threadIdx.x;
    if (KCONTIG) {
      const int row = row0 + t / PER_K, k = k0 + (t % PER_K) * E;
#pragma unroll
      for (int e = 0; e < E; e++) r[e] = (row < rows && k + e < kend) ? src[(size_t)row * ld + k + e] : 0.0f;
    } else {
      const int k = k0 + t / PER_ROW, row = row0 + (t % PER_ROW) * E;
#pragma unroll
      for (int e = 0; e < E; e++) r[e] = (k < kend && row + e < rows) ? src[(size_t)k * ld + row + e] : 0.0f;
    }
  }

  __device__ static void store(float (*s)[BROWS + 4], const float (&r)[E]) {
    const int t = threadIdx.x;
    if (KCONTIG) {
      const int row = t / PER_K, k = (t % PER_K) * E;
#pragma unroll
      for (int e = 0; e < E; e++) s[k + e][row] = r[e];
    } else {
      const int k = t / PER_ROW, row = (t % PER_ROW) * E;
#pragma unroll
      for (int e = 0; e < E; e++) s[k][row + e] = r[e];
    }
  }
};

/* C tile of block (blockIdx.x: N, blockIdx.y: M) over k in [z * k_split, (z+1) * k_split),
 * z = blockIdx.z. With partial != NULL the result goes to partial[z][M][N] instead of C. */
template <int BM, int BN, bool TA, bool TB>
__global__ void __launch_bounds__(THREADS)
    gemm_tiled(int M, int N, int K, const float *__restrict__ a, int lda, const float *__restrict__ b, int ldb,
               float *__restrict__ c, int ldc, int accumulate, int k_split, float *__restrict__ partial) {
  constexpr int TM = BM / 16, TN = BN / 16;
  using LA = tile_io<BM, !TA>;
  using LB = tile_io<BN, TB>;
  __shared__ __align__(16) float as[2][BK][BM + 4];
  __shared__ __align__(16) float bs[2][BK][BN + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int kbeg = blockIdx.z * k_split, kend = min(K, kbeg + k_split);
  const int ntiles = (kend - kbeg + BK - 1) / BK;

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;

  float ra[LA::E], rb[LB::E];
  LA::load(a, lda, M, kend, m0, kbeg, ra);
  LB::load(b, ldb, N, kend, n0, kbeg, rb);
  LA::store(as[0], ra);
  LB::store(bs[0], rb);
  __syncthreads();

  for (int kt = 0; kt < ntiles; kt++) {
    const int cur = kt & 1;
    const bool more = kt + 1 < ntiles;
    if (more) {
      LA::load(a, lda, M, kend, m0, kbeg + (kt + 1) * BK, ra);
      LB::load(b, ldb, N, kend, n0, kbeg + (kt + 1) * BK, rb);
    }
#pragma unroll
    for (int k = 0; k < BK; k++) {
      float av[TM], bv[TN];
#pragma unroll
      for (int q = 0; q < TM / 4; q++) {
        const float4 v = *reinterpret_cast<const float4 *>(&as[cur][k][q * 64 + ty * 4]);
        av[4 * q] = v.x, av[4 * q + 1] = v.y, av[4 * q + 2] = v.z, av[4 * q + 3] = v.w;
      }
#pragma unroll
      for (int q = 0; q < TN / 4; q++) {
        const float4 v = *reinterpret_cast<const float4 *>(&bs[cur][k][q * 64 + tx * 4]);
        bv[4 * q] = v.x, bv[4 * q + 1] = v.y, bv[4 * q + 2] = v.z, bv[4 * q + 3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    if (more) {
      /* buffer cur ^ 1 was last read in step kt - 1, before the barrier that ended it */
      LA::store(as[cur ^ 1], ra);
      LB::store(bs[cur ^ 1], rb);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TM; i++) {
    const int m = m0 + (i / 4) * 64 + ty * 4 + i % 4;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < TN; j++) {
      const int n = n0 + (j / 4) * 64 + tx * 4 + j % 4;
      if (n >= N) continue;
      if (partial != nullptr) {
        partial[((size_t)blockIdx.z * M + m) * N + n] = acc[i][j];
      } else {
        float *out = c + (size_t)m * ldc + n;
        *out = accumulate ? *out + acc[i][j] : acc[i][j];
      }
    }
  }
}

/* C[m][n] = (accumulate ? C : 0) + sum over z (ascending) of partial[z][m][n]. */
__global__ void splitk_reduce(int M, int N, int splits, const float *__restrict__ partial, float *__restrict__ c,
                              int ldc, int accumulate) {
  const size_t mn = (size_t)M * N;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < mn; idx += (size_t)gridDim.x * blockDim.x) {
    const size_t m = idx / N, n = idx % N;
    float *out = c + m * ldc + n;
    float s = accumulate ? *out : 0.0f;
    for (int z = 0; z < splits; z++) s += partial[z * mn + idx];
    *out = s;
  }
}

constexpr int SKINNY_WARPS = 4;
constexpr int SKINNY_ROWS = 2; /* rows of B per warp */

/* C[m][n] = (accumulate ? C : 0) + sum_k A[m][k] B[n][k] for m < M <= MT. */
template <int MT, bool VEC>
__global__ void __launch_bounds__(SKINNY_WARPS * 32)
    gemm_skinny(int M, int N, int K, const float *__restrict__ a, int lda, const float *__restrict__ b, int ldb,
                float *__restrict__ c, int ldc, int accumulate) {
  __shared__ float red[SKINNY_WARPS][SKINNY_ROWS * MT][33];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * SKINNY_WARPS + warp) * SKINNY_ROWS;
  float acc[SKINNY_ROWS][MT];
#pragma unroll
  for (int r = 0; r < SKINNY_ROWS; r++)
#pragma unroll
    for (int m = 0; m < MT; m++) acc[r][m] = 0.0f;

  if (n0 < N) {
    if (VEC) {
      for (int k = lane * 4; k < K; k += 128) {
        float4 w[SKINNY_ROWS];
#pragma unroll
        for (int r = 0; r < SKINNY_ROWS; r++)
          w[r] = n0 + r < N ? __ldg(reinterpret_cast<const float4 *>(b + (size_t)(n0 + r) * ldb + k))
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int m = 0; m < MT; m++) {
          if (m >= M) break;
          const float4 x = __ldg(reinterpret_cast<const float4 *>(a + (size_t)m * lda + k));
#pragma unroll
          for (int r = 0; r < SKINNY_ROWS; r++) {
            float s = acc[r][m];
            s = fmaf(x.x, w[r].x, s);
            s = fmaf(x.y, w[r].y, s);
            s = fmaf(x.z, w[r].z, s);
            acc[r][m] = fmaf(x.w, w[r].w, s);
          }
        }
      }
    } else {
      for (int k = lane; k < K; k += 32) {
        float w[SKINNY_ROWS];
#pragma unroll
        for (int r = 0; r < SKINNY_ROWS; r++) w[r] = n0 + r < N ? __ldg(b + (size_t)(n0 + r) * ldb + k) : 0.0f;
#pragma unroll
        for (int m = 0; m < MT; m++) {
          if (m >= M) break;
          const float x = __ldg(a + (size_t)m * lda + k);
#pragma unroll
          for (int r = 0; r < SKINNY_ROWS; r++) acc[r][m] = fmaf(x, w[r], acc[r][m]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < SKINNY_ROWS; r++)
#pragma unroll
    for (int m = 0; m < MT; m++) red[warp][r * MT + m][lane] = acc[r][m];
  __syncwarp();
  if (lane < SKINNY_ROWS * MT) {
    const int r = lane / MT, m = lane % MT;
    float s = 0.0f;
    for (int l = 0; l < 32; l++) s += red[warp][lane][l];
    if (n0 + r < N && m < M) {
      float *out = c + (size_t)m * ldc + n0 + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

template <int MT>
void launch_skinny(cudaStream_t stream, bool vec, int M, int N, int K, const float *a, int lda, const float *b,
                   int ldb, float *c, int ldc, int accumulate) {
  const unsigned blocks = cdiv(N, SKINNY_WARPS * SKINNY_ROWS);
  if (vec)
    LAUNCH(blocks, SKINNY_WARPS * 32, 0, stream, gemm_skinny<MT, true>)(M, N, K, a, lda, b, ldb, c, ldc, accumulate);
  else
    LAUNCH(blocks, SKINNY_WARPS * 32, 0, stream, gemm_skinny<MT, false>)(M, N, K, a, lda, b, ldb, c, ldc, accumulate);
}

template <int BM, int BN>
void launch_tiled(cudaStream_t stream, dim3 grid, int ta, int tb, int M, int N, int K, const float *a, int lda,
                  const float *b, int ldb, float *c, int ldc, int accumulate, int k_split, float *partial) {
#define GYRE_TILED(TA, TB)                                                                                  \
  LAUNCH(grid, THREADS, 0, stream, gemm_tiled<BM, BN, TA, TB>)(M, N, K, a, lda, b, ldb, c, ldc, accumulate, k_split, \
                                                              partial)
  if (!ta && !tb) GYRE_TILED(false, false);
  else if (!ta && tb) GYRE_TILED(false, true);
  else if (ta && !tb) GYRE_TILED(true, false);
  else GYRE_TILED(true, true);
#undef GYRE_TILED
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} // namespace

gyre_status gemm(exec_ctx *ctx, int M, int N, int K, const float *a, int lda, int trans_a, const float *b, int ldb,
                 int trans_b, float *c, int ldc, int accumulate) {
  if (M <= 0 || N <= 0) return GYRE_OK;
  cudaStream_t stream = ctx->stream;
  if (K <= 0) {
    if (!accumulate) CU(cudaMemset2DAsync(c, (size_t)ldc * sizeof(float), 0, (size_t)N * sizeof(float), M, stream));
    return GYRE_OK;
  }
  if (M <= 16 && !trans_a && trans_b) {
    const bool vec = K % 4 == 0 && lda % 4 == 0 && ldb % 4 == 0 && aligned16(a) && aligned16(b);
    if (M <= 1) launch_skinny<1>(stream, vec, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
    else if (M <= 2) launch_skinny<2>(stream, vec, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
    else if (M <= 4) launch_skinny<4>(stream, vec, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
    else if (M <= 8) launch_skinny<8>(stream, vec, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
    else launch_skinny<16>(stream, vec, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
    CU_LAUNCHED();
    return GYRE_OK;
  }
  const int64_t big_tiles = (int64_t)cdiv(M, 128) * cdiv(N, 128);
  if (big_tiles >= ctx->num_sms) {
    launch_tiled<128, 128>(stream, dim3(cdiv(N, 128), cdiv(M, 128), 1), trans_a, trans_b, M, N, K, a, lda, b, ldb, c,
                           ldc, accumulate, K, nullptr);
    CU_LAUNCHED();
    return GYRE_OK;
  }
  /* 64 x 64 tiles; split K while that still leaves the SMs short of two blocks each */
  const int64_t tiles = (int64_t)cdiv(M, 64) * cdiv(N, 64);
  int splits = 1;
  if (tiles < ctx->num_sms) {
    int64_t want = (2 * (int64_t)ctx->num_sms + tiles - 1) / tiles, most = K / 128;
    if (want > most) want = most;
    if (want > 32) want = 32;
    if (want > 1) splits = (int)want;
  }
  int k_split = K;
  if (splits > 1) {
    k_split = (int)cdiv(cdiv(K, splits), BK) * BK;
    splits = (int)cdiv(K, k_split);
  }
  const dim3 grid(cdiv(N, 64), cdiv(M, 64), splits);
  if (splits == 1) {
    launch_tiled<64, 64>(stream, grid, trans_a, trans_b, M, N, K, a, lda, b, ldb, c, ldc, accumulate, K, nullptr);
    CU_LAUNCHED();
    return GYRE_OK;
  }
  void *scratch;
  GYRE_CHECK(ctx_scratch(ctx, (size_t)splits * M * N * sizeof(float), &scratch));
  float *partial = (float *)scratch;
  launch_tiled<64, 64>(stream, grid, trans_a, trans_b, M, N, K, a, lda, b, ldb, c, ldc, accumulate, k_split, partial);
  CU_LAUNCHED();
  LAUNCH(grid_for((int64_t)M * N), 256, 0, stream, splitk_reduce)(M, N, splits, partial, c, ldc, accumulate);
  CU_LAUNCHED();
  return GYRE_OK;
}
