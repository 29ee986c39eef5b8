// Sequences in vector lanes on the CPU: the helpers of the HMM kernels that run the batch in groups of HMM_W = 8
// sequences, one hmm_v8d per state holding that state's value for the group's eight sequences (AVX-512: one
// register; elsewhere two AVX ones).  A step is then K^2 lane-wise multiply-adds with the transition weight broadcast
// (no horizontal sum, no transpose on the chain), sums over the states lane-wise, and scalings by a power of two per
// lane.  Each lane runs exactly the arithmetic of its own sequence (lanes never mix), so a sequence's results do not
// depend on its group, its lane or the number of threads.  Used by hmm_log_likelihood (hmm_lanes.h) and
// hmm_posteriors (hmm_posteriors.cu).
//
// Uses hmm_model.h (HmmModel, hmm_checked_max), hmm_gemm.h (the vector types) and hmm_exp8.h.
#ifndef PTNATIVE_HMM_HMM_LANES_BASE_H
#define PTNATIVE_HMM_HMM_LANES_BASE_H

#include "../dialect/kernel.h"

#include "hmm_model.h"
#include "hmm_gemm.h"
#include "hmm_exp8.h"

#define HMM_W 8              // sequences per group: the lanes of hmm_v8d
#define HMM_LANE_STEPS 32    // backward steps whose rows are buffered for U += X^T V

#if !CUDA
// Whether a batch of B sequences of K states runs in lanes rather than time outer and batch inner
// (hmm_forward_cpu / hmm_backward_cpu).  A group costs the same whatever number of its lanes hold a sequence, so
// the lanes win when the batch fills its groups well enough: when the batch rounded up to groups of 8 is at most
// r(K) B, with r(K) the measured cost of a sequence in the batch-inner path over its cost in a full group (value
// and gradient, T = 1000, same-process A/B at load ~6: 3.2 at K = 4, 1.6 at K = 8, 1.2 at K = 16, 1.05 at
// K = 32, 1.1 at K = 64, 0.87 at K = 128).  One sequence never: its padding costs 8 times its work.
static inline bool hmm_use_lanes(int64_t B, int64_t K) {
  const double r = K <= 4 ? 4.0 : K <= 8 ? 1.5 : K <= 16 ? 1.2 : K <= 64 ? 1.05 : 0.0;
  return B >= 2 && (double)((B + HMM_W - 1) / HMM_W * HMM_W) <= r * (double)B;
}

static inline hmm_v8d hmm_bc8(double x) { return x - hmm_v8d{}; }  // x in every lane (x - 0 is x exactly)

// 2^-e lane-wise for x = m 2^e, m in [1, 2), x normal; 0 in lanes of 0, subnormal, infinite or NaN x
// (hmm_inverse_power_of_two in eight lanes).
static inline hmm_v8d hmm_inverse_power_of_two8(hmm_v8d x) {
  const hmm_v8l e = ((hmm_v8l)x >> 52) & 0x7ff;
  const hmm_v8l ok = (e != 0) & (e != 0x7ff);
  return (hmm_v8d)((hmm_v8l)((hmm_v8u)(2046 - e) << 52) & ok);  // unsigned: 2046 - e is -1 for e = 0x7ff
}

// e lane-wise for x = m 2^e (x > 0 normal), as doubles.
static inline hmm_v8d hmm_exponent8(hmm_v8d x) {
  return ptn_convert<hmm_v8d>((((hmm_v8l)x >> 52) & 0x7ff) - 1023);
}

// out[j] (+)= sum_{i < n} x[i] M[i * ldm + j] for j < J, lane-wise (x[i] a vector, M's entries broadcast), each sum
// over i in order.
template <int J>
__attribute__((always_inline)) static inline void hmm_lane_tile(const hmm_v8d* __restrict__ x, int64_t n,
                                                                const double* __restrict__ M, int64_t ldm,
                                                                hmm_v8d* __restrict__ out) {
  hmm_v8d acc[J];
  for (int j = 0; j < J; ++j) acc[j] = x[0] * M[j];
  for (int64_t i = 1; i < n; ++i) {
    const hmm_v8d xi = x[i];
    for (int j = 0; j < J; ++j) acc[j] += xi * M[i * ldm + j];
  }
  for (int j = 0; j < J; ++j) out[j] = acc[j];
}

// out[j] = sum_{i < K} x[i] M[i K + j] for j < K (M K x K row-major), lane-wise; K >= 1.
static inline void hmm_lane_matvec(const hmm_v8d* __restrict__ x, int64_t K, const double* __restrict__ M,
                                   hmm_v8d* __restrict__ out) {
  int64_t j = 0;
  for (; j + 8 <= K; j += 8) hmm_lane_tile<8>(x, K, M + j, K, out + j);
  switch (K - j) {
    case 7: hmm_lane_tile<7>(x, K, M + j, K, out + j); break;
    case 6: hmm_lane_tile<6>(x, K, M + j, K, out + j); break;
    case 5: hmm_lane_tile<5>(x, K, M + j, K, out + j); break;
    case 4: hmm_lane_tile<4>(x, K, M + j, K, out + j); break;
    case 3: hmm_lane_tile<3>(x, K, M + j, K, out + j); break;
    case 2: hmm_lane_tile<2>(x, K, M + j, K, out + j); break;
    case 1: hmm_lane_tile<1>(x, K, M + j, K, out + j); break;
    default: break;
  }
}

// The sum of x[0..K) lane-wise (of x[k] y[k] if y is given) in four interleaved partial sums ((s0 + s1) + (s2 + s3)):
// a short chain.
static inline hmm_v8d hmm_lane_sum(const hmm_v8d* __restrict__ x, int64_t K, const hmm_v8d* __restrict__ y = nullptr) {
  hmm_v8d s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t k = 0;
  if (y) {
    for (; k + 4 <= K; k += 4) {
      s0 += x[k] * y[k];
      s1 += x[k + 1] * y[k + 1];
      s2 += x[k + 2] * y[k + 2];
      s3 += x[k + 3] * y[k + 3];
    }
    if (k < K) s0 += x[k] * y[k];
    if (k + 1 < K) s1 += x[k + 1] * y[k + 1];
    if (k + 2 < K) s2 += x[k + 2] * y[k + 2];
  } else {
    for (; k + 4 <= K; k += 4) {
      s0 += x[k];
      s1 += x[k + 1];
      s2 += x[k + 2];
      s3 += x[k + 3];
    }
    if (k < K) s0 += x[k];
    if (k + 1 < K) s1 += x[k + 1];
    if (k + 2 < K) s2 += x[k + 2];
  }
  return (s0 + s1) + (s2 + s3);
}

// Whether any lane of m is nonzero (a tree of shuffles: no lane goes through memory).
static inline bool hmm_any8(hmm_v8l m) {
  const hmm_v8l half = {4, 5, 6, 7, 0, 1, 2, 3}, quarter = {2, 3, 0, 1, 6, 7, 4, 5}, pair = {1, 0, 3, 2, 5, 4, 7, 6};
  m |= ptn_shuffle(m, half);
  m |= ptn_shuffle(m, quarter);
  m |= ptn_shuffle(m, pair);
  return m[0] != 0;
}

// out[c] lane l = rows[l] lane c for c < 8: an 8 x 8 transpose in three rounds of two-vector shuffles.
static inline void hmm_transpose8(const hmm_v8d* __restrict__ r, hmm_v8d* __restrict__ out) {
  const hmm_v8l lo1 = {0, 8, 2, 10, 4, 12, 6, 14}, hi1 = {1, 9, 3, 11, 5, 13, 7, 15};
  const hmm_v8l lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
  const hmm_v8l lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
  hmm_v8d a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = ptn_shuffle2(r[2 * i], r[2 * i + 1], lo1);      // columns 0, 2, 4, 6 of rows 2i, 2i + 1
    a[2 * i + 1] = ptn_shuffle2(r[2 * i], r[2 * i + 1], hi1);  // columns 1, 3, 5, 7
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
    b[4 * h + 0] = ptn_shuffle2(a[4 * h], a[4 * h + 2], lo2);      // columns 0, 4
    b[4 * h + 1] = ptn_shuffle2(a[4 * h], a[4 * h + 2], hi2);      // columns 2, 6
    b[4 * h + 2] = ptn_shuffle2(a[4 * h + 1], a[4 * h + 3], lo2);  // columns 1, 5
    b[4 * h + 3] = ptn_shuffle2(a[4 * h + 1], a[4 * h + 3], hi2);  // columns 3, 7
  }
  out[0] = ptn_shuffle2(b[0], b[4], lo4);
  out[4] = ptn_shuffle2(b[0], b[4], hi4);
  out[2] = ptn_shuffle2(b[1], b[5], lo4);
  out[6] = ptn_shuffle2(b[1], b[5], hi4);
  out[1] = ptn_shuffle2(b[2], b[6], lo4);
  out[5] = ptn_shuffle2(b[2], b[6], hi4);
  out[3] = ptn_shuffle2(b[3], b[7], lo4);
  out[7] = ptn_shuffle2(b[3], b[7], hi4);
}

// x[0..8) of a row of Float as doubles, and back.
static inline void hmm_store8(double* x, hmm_v8d v) { memcpy(x, &v, sizeof(v)); }
static inline void hmm_store8(float* x, hmm_v8d v) {
  typedef ptn_vec<float, 8> hmm_v8f;
  const hmm_v8f f = ptn_convert<hmm_v8f>(v);
  memcpy(x, &f, sizeof(f));
}

// A group of up to HMM_W sequences [b0, b0 + n): their lengths and statuses per lane (padding lanes: length 0).
struct HmmGroup {
  int64_t b0, n, t_end;
  hmm_v8l len;
};

static inline HmmGroup hmm_group(const HmmModel& p, int64_t g) {
  HmmGroup G;
  G.b0 = g * HMM_W;
  G.n = std::min<int64_t>(HMM_W, p.B - G.b0);
  G.t_end = 0;
  G.len = hmm_v8l{};
  for (int64_t l = 0; l < G.n; ++l) {
    G.len[l] = p.seq_len[G.b0 + l];
    G.t_end = std::max<int64_t>(G.t_end, G.len[l]);
  }
  return G;
}

// The smaller (frame, sequence) of two failed checks into *into (a group's first failure into its part's).
static inline void hmm_keep_first_failure(FsaCheck* into, const FsaCheck& c) {
  if (c.code == FSA_CHECK_OK) return;
  if (into->code == FSA_CHECK_OK || c.i < into->i || (c.i == into->i && c.j < into->j)) *into = c;
}

// The emission rows of frames [t0, t1) of group G, lane-wise: E[(t - t0) K + k] = exp(log e_t(k) - m_t) and
// shift[t - t0] = m_t, the row's largest log-density (NaN for a row with a NaN, after which the lane is dead and its
// rows are not read; -inf with a +inf, recorded in `check`, or when every entry is -inf).  Lanes not on a valid
// frame, and lanes of rows with m_t = -inf, get E = 0.  raw: K vectors of scratch.
static void hmm_lane_emissions(const HmmModel& p, const HmmGroup& G, int64_t t0, int64_t t1, char* dead,
                               double* __restrict__ raw, hmm_v8d* __restrict__ E, hmm_v8d* __restrict__ shift,
                               FsaCheck* check) {
  const int64_t B = p.B, K = p.K;
  hmm_v8l live = {};  // lanes of the group's sequences, not dead
  bool all_live = G.n == HMM_W;
  int64_t shortest = G.n == HMM_W ? G.len[0] : 0;  // while t < shortest, every live lane is on a valid frame
  for (int64_t l = 0; l < G.n; ++l) {
    live[l] = dead[l] ? 0 : -1;
    all_live &= !dead[l];
    shortest = std::min<int64_t>(shortest, G.len[l]);
  }
  for (int64_t t = t0; t < t1; ++t) {
    const hmm_v8l active = live & (t < G.len);
    const Float* rows = p.le + (t * B + G.b0) * K;  // the group's rows of frame t, one after the other
    int64_t k0 = 0;
    if (all_live && t < shortest)  // every lane active: eight rows of eight entries at a time, transposed
      for (; k0 + 8 <= K; k0 += 8) {
        hmm_v8d r[8];
        for (int l = 0; l < 8; ++l) r[l] = hmm_load8(rows + l * K + k0);
        hmm_transpose8(r, (hmm_v8d*)raw + k0);
      }
    if (k0 < K)
      for (int64_t l = 0; l < HMM_W; ++l)
        for (int64_t k = k0; k < K; ++k) raw[k * HMM_W + l] = active[l] ? (double)rows[l * K + k] : 0.0;
    // poison: sum of x * 0, NaN in lanes with a NaN or an infinity
    hmm_v8d mx = hmm_bc8(-INFINITY), mx1 = mx, poison = {}, poison1 = {};
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
      const hmm_v8d x = hmm_load8(raw + k * HMM_W), y = hmm_load8(raw + (k + 1) * HMM_W);
      mx = ptn_select(x > mx, x, mx);
      mx1 = ptn_select(y > mx1, y, mx1);
      poison += x * 0.0;
      poison1 += y * 0.0;
    }
    if (k < K) {
      const hmm_v8d x = hmm_load8(raw + k * HMM_W);
      mx = ptn_select(x > mx, x, mx);
      poison += x * 0.0;
    }
    mx = ptn_select(mx1 > mx, mx1, mx);
    poison += poison1;
    if (hmm_any8(active & (poison != 0.0)))
      for (int64_t l = 0; l < HMM_W; ++l) {
        if (!active[l] || poison[l] == 0.0) continue;
        double m;
        const int64_t b = G.b0 + l;
        auto report = [&](FsaCheck* c, int64_t k) { fsa_fail(c, FSA_CHECK_SCORE_INFINITE, t, b, k, INFINITY); };
        if (hmm_checked_max(p.le + (t * B + b) * K, K, &m, check, report)) {
          dead[l] = 1;
          live[l] = 0;
          all_live = false;
          m = NAN;
        }
        mx[l] = m;
      }
    const hmm_v8l keep = (mx > -INFINITY) & active;  // false for NaN and -inf
    hmm_v8d* __restrict__ Et = E + (t - t0) * K;
    for (int64_t k = 0; k < K; ++k)
      Et[k] = (hmm_v8d)((hmm_v8l)hmm_exp8(hmm_load8(raw + k * HMM_W) - mx) & keep);
    shift[t - t0] = mx;
  }
}

// sink(i, j, sum over the n buffered steps of X[i][s] * V[j][s]) lane-wise for i, j < K (X, V: K rows of n vectors,
// row stride ld vectors), 4 x 4 outputs at a time, each sum over s in order.
template <int RI, int RJ, typename Sink>
__attribute__((always_inline)) static inline void hmm_lane_outer_tile(const hmm_v8d* __restrict__ X,
                                                                      const hmm_v8d* __restrict__ V, int64_t ld,
                                                                      int64_t n, int64_t i0, int64_t j0, Sink& sink) {
  hmm_v8d acc[RI][RJ] = {};
  for (int64_t s = 0; s < n; ++s) {
    hmm_v8d v[RJ];
    for (int j = 0; j < RJ; ++j) v[j] = V[j * ld + s];
    for (int i = 0; i < RI; ++i) {
      const hmm_v8d x = X[i * ld + s];
      for (int j = 0; j < RJ; ++j) acc[i][j] += x * v[j];
    }
  }
  for (int i = 0; i < RI; ++i)
    for (int j = 0; j < RJ; ++j) sink(i0 + i, j0 + j, acc[i][j]);
}

template <int RI, typename Sink>
static inline void hmm_lane_outer_row(const hmm_v8d* X, const hmm_v8d* V, int64_t ld, int64_t n, int64_t i0, int64_t K,
                                      Sink& sink) {
  int64_t j = 0;
  for (; j + 4 <= K; j += 4) hmm_lane_outer_tile<RI, 4>(X, V + j * ld, ld, n, i0, j, sink);
  switch (K - j) {
    case 3: hmm_lane_outer_tile<RI, 3>(X, V + j * ld, ld, n, i0, j, sink); break;
    case 2: hmm_lane_outer_tile<RI, 2>(X, V + j * ld, ld, n, i0, j, sink); break;
    case 1: hmm_lane_outer_tile<RI, 1>(X, V + j * ld, ld, n, i0, j, sink); break;
    default: break;
  }
}

template <typename Sink>
static void hmm_lane_outer(const hmm_v8d* X, const hmm_v8d* V, int64_t ld, int64_t n, int64_t K, Sink&& sink) {
  int64_t i = 0;
  for (; i + 4 <= K; i += 4) hmm_lane_outer_row<4>(X + i * ld, V, ld, n, i, K, sink);
  switch (K - i) {
    case 3: hmm_lane_outer_row<3>(X + i * ld, V, ld, n, i, K, sink); break;
    case 2: hmm_lane_outer_row<2>(X + i * ld, V, ld, n, i, K, sink); break;
    case 1: hmm_lane_outer_row<1>(X + i * ld, V, ld, n, i, K, sink); break;
    default: break;
  }
}

// The lanes `act` of x[0..K) as the rows of frame t of group G's sequences: rows[l K + k] = x[k] lane l, with
// rows = out + (t B + b0) K (K entries per sequence, the group's sequences one after the other; R: Float or double);
// eight states of all eight lanes at a time through hmm_transpose8 when every lane is in `act`.
template <typename R>
static inline void hmm_lane_store_rows(const HmmGroup& G, hmm_v8l act, const hmm_v8d* __restrict__ x, int64_t K,
                                       R* rows) {
  bool all = true;
  for (int64_t l = 0; l < HMM_W; ++l) all &= act[l] != 0;
  int64_t k0 = 0;
  if (all)
    for (; k0 + 8 <= K; k0 += 8) {
      hmm_v8d r8[8];
      hmm_transpose8(x + k0, r8);
      for (int l = 0; l < 8; ++l) hmm_store8(rows + l * K + k0, r8[l]);
    }
  if (k0 < K)
    for (int64_t l = 0; l < G.n; ++l)
      if (act[l])
        for (int64_t k = k0; k < K; ++k) rows[l * K + k] = (R)x[k][l];
}
#endif  // !CUDA

#endif  // PTNATIVE_HMM_HMM_LANES_BASE_H
