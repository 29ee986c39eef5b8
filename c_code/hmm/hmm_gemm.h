// Small dense products on the CPU for the HMM kernels: register-blocked GEMM tiles over AVX vectors of four
// doubles (GCC vector extensions), for the batch's K x K step products (alpha_{t-1} A of a block of sequences),
// the transposed accumulation of expected transitions (U += X^T V), and one sequence's vector-matrix product.
// Rows of M are padded to a multiple of 4 (hmm_pad); every output row's sums run in the same order whatever the
// number of rows (results do not depend on the batch split).  For K <= 4, one sequence's state vector is one such
// vector (hmm_lanes, hmm_vecmat: the register-only paths of the inference kernels).  CPU only: CUDA uses the
// dialect's cuBLAS GEMM.
#ifndef PTNATIVE_HMM_HMM_GEMM_H
#define PTNATIVE_HMM_HMM_GEMM_H

#include "../dialect/kernel.h"

#include "../common/input_checks.h"
#include "../common/simd.h"

#if !CUDA
typedef ptn_vec<double, 4> hmm_v4d;
typedef ptn_vec<double, 8> hmm_v8d;    // one AVX-512 register where the CPU has it, else two AVX (four SSE) ones
typedef ptn_vec<int64_t, 8> hmm_v8l;   // lane masks and integer lanes beside hmm_v8d
typedef ptn_vec<uint64_t, 8> hmm_v8u;  // for shifts of negative lanes

// out[r, j0 + 0..W*NB) (+)= sum_i X(r, i) M[i, j0 + ...] for r < R, with the R x NB accumulators (vectors V of W
// doubles) in registers.  X(r, i) = X[r * xr + i * xi] (xr = row stride, xi = 1: X . M; xr = 1, xi = row stride:
// X^T . M).  Each output's sum runs over i in order, whatever V.
template <typename V, int W, int R, int NB>
__attribute__((always_inline)) static inline void hmm_gemm_tile_v(const double* __restrict__ X, int64_t xr,
                                                                  int64_t xi, int64_t n, const double* __restrict__ M,
                                                                  int64_t ldm, double* __restrict__ out, int64_t ldo,
                                                                  bool add) {
  V acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < NB; ++q) {
      acc[r][q] = V{};
      if (add) memcpy(&acc[r][q], out + r * ldo + W * q, sizeof(V));
    }
  for (int64_t i = 0; i < n; ++i) {
    V m[NB];
    for (int q = 0; q < NB; ++q) memcpy(&m[q], M + i * ldm + W * q, sizeof(V));
    for (int r = 0; r < R; ++r) {
      const double x = X[r * xr + i * xi];
      const V xv = x - V{};  // x in every lane (x - 0 is x exactly, so no arithmetic is left)
      for (int q = 0; q < NB; ++q) acc[r][q] += xv * m[q];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < NB; ++q) memcpy(out + r * ldo + W * q, &acc[r][q], sizeof(V));
}

// The tile over AVX vectors of four doubles (NB of them per row).
template <int R, int NB>
__attribute__((always_inline)) static inline void hmm_gemm_tile(const double* __restrict__ X, int64_t xr,
                                                                int64_t xi, int64_t n, const double* __restrict__ M,
                                                                int64_t ldm, double* __restrict__ out, int64_t ldo,
                                                                bool add) {
  hmm_gemm_tile_v<hmm_v4d, 4, R, NB>(X, xr, xi, n, M, ldm, out, ldo, add);
}

// Rows [0, R) of the product, across the ld columns: tiles of 16 columns, then 8 (one vector of eight) and 4.
template <int R>
static inline void hmm_gemm_rows(const double* X, int64_t xr, int64_t xi, int64_t n, const double* M, int64_t ld,
                                 double* out, int64_t ldo, bool add) {
  int64_t j0 = 0;
  for (; j0 + 16 <= ld; j0 += 16) hmm_gemm_tile_v<hmm_v8d, 8, R, 2>(X, xr, xi, n, M + j0, ld, out + j0, ldo, add);
  if (j0 + 8 <= ld) {
    hmm_gemm_tile_v<hmm_v8d, 8, R, 1>(X, xr, xi, n, M + j0, ld, out + j0, ldo, add);
    j0 += 8;
  }
  if (j0 + 4 <= ld) hmm_gemm_tile<R, 1>(X, xr, xi, n, M + j0, ld, out + j0, ldo, add);
}

// out (rows x ld, row stride ldo) = X . M, or += X^T . M with `transposed_add` (X then n x rows); X (rows x n) has
// row stride ldx, M is n x ld row-major with ld a multiple of 4.  Four rows at a time: each loaded row of M serves
// four rows of X (sequences of the batch, or states), and their independent sums overlap in the pipeline.  Each
// output row's sums run in the same order whatever `rows` is.
static inline void hmm_gemm(const double* X, int64_t rows, int64_t ldx, int64_t n, const double* M, int64_t ld,
                            double* out, int64_t ldo, bool transposed_add = false) {
  const int64_t xr = transposed_add ? 1 : ldx, xi = transposed_add ? ldx : 1;
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) hmm_gemm_rows<4>(X + r * xr, xr, xi, n, M, ld, out + r * ldo, ldo, transposed_add);
  switch (rows - r) {
    case 3: hmm_gemm_rows<3>(X + r * xr, xr, xi, n, M, ld, out + r * ldo, ldo, transposed_add); break;
    case 2: hmm_gemm_rows<2>(X + r * xr, xr, xi, n, M, ld, out + r * ldo, ldo, transposed_add); break;
    case 1: hmm_gemm_rows<1>(X + r * xr, xr, xi, n, M, ld, out + r * ldo, ldo, transposed_add); break;
    default: break;
  }
}

// out (ld entries) = x (n entries) . M, M being n x ld row-major with ld a multiple of 4.
static inline void hmm_matvec(const double* __restrict__ x, int64_t n, const double* __restrict__ M, int64_t ld,
                              double* __restrict__ out) {
  hmm_gemm_rows<1>(x, n, 1, n, M, ld, out, ld, false);
}

// src (K x K) into dst (K x Kp), zero-padded columns.
static void hmm_pad(const double* src, int64_t K, int64_t Kp, double* dst) {
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < Kp; ++j) dst[i * Kp + j] = j < K ? src[i * K + j] : 0.0;
}

static inline hmm_v4d hmm_splat(double x) { return hmm_v4d{x, x, x, x}; }

static inline double hmm_hsum(hmm_v4d v) { return (v[0] + v[1]) + (v[2] + v[3]); }

// Lanes [0, K) from x[0..K), the others `fill`.
template <int K, typename T>
static inline hmm_v4d hmm_lanes(const T* x, double fill = 0.0) {
  hmm_v4d v = hmm_splat(fill);
  for (int k = 0; k < K; ++k) v[k] = (double)x[k];
  return v;
}

// x[0..K) from lanes [0, K) of a vector v.
template <int K, typename T, typename V>
static inline void hmm_store_lanes(T* x, V v) {
  for (int k = 0; k < K; ++k) x[k] = (T)v[k];
}

// The largest of lanes [0, K).
template <int K>
static inline double hmm_lane_max(hmm_v4d v) {
  double m = v[0];
  for (int k = 1; k < K; ++k) m = v[k] > m ? v[k] : m;
  return m;
}

// The K rows of M (K x 4, row-major) as vectors, the others 0.
template <int K>
static inline void hmm_rows(const double* M, hmm_v4d* rows) {
  for (int i = 0; i < 4; ++i) rows[i] = i < K ? hmm_lanes<4>(M + i * 4) : hmm_splat(0.0);
}

// sum_{i < K} x[i] rows[i], as a tree (the sums of a step are latency-bound).
template <int K>
static inline hmm_v4d hmm_vecmat(hmm_v4d x, const hmm_v4d* rows) {
  hmm_v4d s0 = hmm_splat(x[0]) * rows[0];
  if (K > 1) s0 += hmm_splat(x[1]) * rows[1];
  if (K < 3) return s0;
  hmm_v4d s1 = hmm_splat(x[2]) * rows[2];
  if (K > 3) s1 += hmm_splat(x[3]) * rows[3];
  return s0 + s1;
}

// fsa_exp in each lane (g++ -O3 turns the four calls into one vector computation).
static inline hmm_v4d hmm_exp4(hmm_v4d x) {
  hmm_v4d out;
  for (int k = 0; k < 4; ++k) out[k] = fsa_exp(x[k]);
  return out;
}

// exp(min(le - m, 0)) lane-wise (0 in lanes of -inf, and everywhere if m = -inf).
static inline hmm_v4d hmm_exp_below(hmm_v4d le, double m) {
  const hmm_v4d x = le - hmm_splat(m);
  return m > -INFINITY ? hmm_exp4(ptn_select(x < hmm_splat(0.0), x, hmm_splat(0.0))) : hmm_splat(0.0);
}

// max(a, b) lane-wise (b where either is NaN: callers pass no NaN).
static inline hmm_v4d hmm_max4(hmm_v4d a, hmm_v4d b) { return ptn_select(a > b, a, b); }

// body(std::integral_constant<int, K>()) for K = 1..4 (the caller checked K <= 4): K known at compile time.
template <typename Body>
static inline void hmm_with_k(int64_t K, Body&& body) {
  switch (K) {
    case 1: body(std::integral_constant<int, 1>()); break;
    case 2: body(std::integral_constant<int, 2>()); break;
    case 3: body(std::integral_constant<int, 3>()); break;
    default: body(std::integral_constant<int, 4>()); break;
  }
}
#endif  // !CUDA

#endif  // PTNATIVE_HMM_HMM_GEMM_H
