// hmm_posteriors for a part of the batch that is one sequence with K <= 4, on the CPU (hmm_posteriors.cu's
// one-sequence path; the math and layout below).
#ifndef PTNATIVE_HMM_HMM_POSTERIORS_SMALL_H
#define PTNATIVE_HMM_HMM_POSTERIORS_SMALL_H

#include "../dialect/kernel.h"

#include "hmm_posteriors_steps.h"

#if !CUDA
// ---------------------------------------------------------------- one sequence, K <= 4, on the CPU
// The same quantities for a part of the batch that is one sequence, whose chains of steps are then the whole work.
// With the state vectors in registers (K known at compile time), the filter and the backward recursion run as two
// independent chains that the processor overlaps, and each chain is one vector-matrix product per frame:
//   u_t = sigma_t (u_{t-1} A) * E_t,   v_{t-1} = rho_t A (E_t * v_t)   (u_0 = pi * E_0, v_{T_b-1} = f),
// with E_t = exp(log e_t - M_t), M_t = max_k log e_t(k), computed once per frame beforehand, and E_t sigma_t one
// vector off the chain (folding it into the matrix's rows measured slower).  sigma_t and rho_t are powers of two
// chosen from sums two frames back (exact scalings; no division and no normalisation on the chain): with
// sigma_t = 1 / (sigma_{t-1} 2^ex(s_{t-2})), s_t = sum u_t stays within a factor 2 of c_t c_{t-1} (the filter's
// normalisers), and likewise for v.  The outputs of frame t come beside the chains' second half, once both have
// passed t: u_t and v_t are alpha_t and beta_t up to factors, so gamma_t = u_t v_t / (u_t . v_t),
// alpha_t = u_t / s_t, c_t = s_t / (sigma_t s_{t-1}), m_t = M_t, and xi += u_{t-1} (sigma_t / z_t) (A o (E_t v_t)^T)
// with z_t = u_t . v_t (the pair marginals' normaliser is z_t / sigma_t).
//
// These are the sequential pass's values to rounding (the scalings cancel: the pair marginals and gamma are
// normalised per frame, and the hidden outputs alpha_t, c_t and m_t are one consistent scaled filter, for the
// gradient op) unless something underflows here that the sequential pass keeps (nothing can overflow: s_t is at
// most 2 K^2): so s_t and sum v_t must stay above 2^-200 (their smallest is tracked beside the chains)
// and z_t within 2^-400..2^400 (checked with the outputs); else the caller runs the sequential pass, as also for a
// NaN or +inf log-emission, which the first pass detects.

// Four lanes from x[0..4).
template <typename T>
static inline hmm_v4d hmm_small_load(const T* x) {
  if constexpr (sizeof(T) == sizeof(double)) {
    hmm_v4d v;
    memcpy(&v, x, sizeof(v));
    return v;
  }
  return hmm_lanes<4>(x);
}

// The sum of lanes [0, K) in every lane, for x whose lanes past K are 0: (x0 + x1) + (x2 + x3), the value of
// hmm_hsum (for K = 3 that of (x0 + x1) + x2).  In every lane, so that what is computed from it (the scalings, the
// checks) stays in vector registers: no moves to general registers and back, no broadcasts.
template <int K>
static inline hmm_v4d hmm_small_sum_all(hmm_v4d x) {
  if (K == 1) return ptn_shuffle(x, hmm_v4l{0, 0, 0, 0});
  const hmm_v4d a = x + ptn_shuffle(x, hmm_v4l{1, 0, 3, 2});
  if (K == 2) return ptn_shuffle(a, hmm_v4l{0, 0, 0, 0});
  return a + ptn_shuffle(a, hmm_v4l{2, 3, 0, 1});
}

// 1 / (p 2^ex(s)) lane-wise, p a power of two, s >= 0 (2^ex(s): the exponent bits of s alone; 0 for s = 0 and
// subnormal s): exact (an inverse power of two by its exponent bits) where p 2^ex(s) is within 2^-1022..2^1023, and
// finite beyond, which only sequences that fail hmm_post_small's checks reach.
static inline hmm_v4d hmm_small_rescale(hmm_v4d p, hmm_v4d s) {
  const hmm_v4d q = p * (hmm_v4d)((hmm_v4l)s & 0x7ff0000000000000LL);
  return (hmm_v4d)(0x7fe0000000000000LL - (hmm_v4l)q);
}

static inline hmm_v4d hmm_min4(hmm_v4d a, hmm_v4d b) { return ptn_select(a < b, a, b); }

// x[0..K) from lanes [0, K) of v: one masked store where the CPU has them for four doubles.
template <int K, typename T>
static inline void hmm_small_store(T* x, hmm_v4d v) {
#ifdef __AVX512VL__
  if constexpr (sizeof(T) == sizeof(double) && K < 4) {
#ifdef __clang__
    __builtin_ia32_storeupd256_mask((hmm_v4d*)x, v, (unsigned char)((1 << K) - 1));
#else
    __builtin_ia32_storeupd256_mask((double*)x, v, (unsigned char)((1 << K) - 1));
#endif
    return;
  }
#endif
  hmm_store_lanes<K>(x, v);
}

// One state vector of the chains, x (lanes [0, K) of four), with its steps x = x . (A o e) (forward: column j of
// A times e_j) and x = (A o e) x (backward), hmm_vecmat over the rows of A o e or A^T o e.  (States in scalar
// registers, without the broadcasts of lanes on the chain, measured no faster: the loop is not latency-bound.)
// For K < 4 the backward step also gives its sum, in lane 3 (the column sums of A there), and the lanes past K
// of the e given to the steps may hold any finite value: the forward's lanes past K stay 0 (those of A's rows
// are), the backward's past K are its sum or 0 and never feed the next step.
template <int K>
struct HmmSmallChain {
  hmm_v4d A[4], AT[4], x;
  HmmSmallChain(const HmmModel& p, hmm_v4d x0) : x(x0) {
    hmm_small_rows<K>(p.A, A);
    hmm_small_rows<K>(p.AT, AT);
    if (K < 4)
      for (int j = 0; j < K; ++j) AT[j][3] = hmm_hsum(AT[j]);
  }
  void forward(hmm_v4d e) { x = hmm_vecmat<K>(x, A) * e; }
  void backward(hmm_v4d e) { x = hmm_vecmat<K>(x * e, AT); }
  hmm_v4d backward_sum() const {  // in every lane
    return K < 4 ? ptn_shuffle(x, hmm_v4l{3, 3, 3, 3}) : hmm_small_sum_all<4>(x);
  }
  void store(double* out) const { hmm_store_lanes<4>(out, x); }
};

// Lane f of L[k] = element f K + k of X[0..K), the K doubles of each of eight frames in a row (K <= 4): the frames'
// entries by state, two-vector permutes only.
template <int K>
static inline void hmm_small_by_state(const hmm_v8d* X, hmm_v8d* L) {
  for (int k = 0; k < K; ++k) {
    hmm_v8l lo = {}, hi = {};
    for (int f = 0; f < 8; ++f) {
      const int g = f * K + k;
      lo[f] = g % 16;  // from X[0], X[1] (g < 16), or X[2], X[3]
      hi[f] = K == 3 ? (g < 16 ? f : g - 8) : f + 8 * (g >= 16);
    }
    if constexpr (K == 1) L[k] = X[0];
    else if constexpr (K == 2) L[k] = ptn_shuffle2(X[0], X[1], lo);
    else if constexpr (K == 3) L[k] = ptn_shuffle2(ptn_shuffle2(X[0], X[1], lo), X[2], hi);
    else L[k] = ptn_shuffle2(ptn_shuffle2(X[0], X[1], lo), ptn_shuffle2(X[2], X[3], lo), hi);
  }
}

// The inverse of hmm_small_by_state: X[j] = elements 8 j .. 8 j + 7 of the eight frames' K doubles each.
template <int K>
static inline void hmm_small_by_frame(const hmm_v8d* L, hmm_v8d* X) {
  for (int j = 0; j < K; ++j) {
    hmm_v8l lo = {}, hi = {};
    for (int q = 0; q < 8; ++q) {
      const int g = 8 * j + q, f = g / K, k = g % K;
      lo[q] = f + 8 * (k & 1);  // lane f of L[k] from L[0], L[1] (k < 2), or L[2], L[3]
      hi[q] = K == 3 ? (k < 2 ? q : 8 + f) : q + 8 * (k >= 2);
    }
    if constexpr (K == 1) X[j] = L[0];
    else if constexpr (K == 2) X[j] = ptn_shuffle2(L[0], L[1], lo);
    else if constexpr (K == 3) X[j] = ptn_shuffle2(ptn_shuffle2(L[0], L[1], lo), L[2], hi);
    else X[j] = ptn_shuffle2(ptn_shuffle2(L[0], L[1], lo), ptn_shuffle2(L[2], L[3], lo), hi);
  }
}

// What the chains keep of frame t: u_t, v_t (four lanes each), s_t = sum u_t and sigma_t.
struct HmmSmallFrame {
  double u[4], v[4], s, sigma, pad[2];
};

// Sequence b of a model without NaN parameters (T_b > 0): gamma, the filter alpha, c, m (st, if st.filter_read)
// and U = xi / A into xi (K x K), returning true; false if the checks above fail (what it wrote is then to be
// overwritten).  buf: 16 T_b doubles.
// Frame t's outputs need u_t and v_t, which the chains reach at steps t and T_b - 1 - t: the second half of the
// steps writes the outputs of the frames both chains have passed (two per step), beside the chains.
template <int K>
static bool hmm_post_small(const HmmModel& p, const HmmPostState& st, int64_t b, Float* gamma, double* xi,
                           double* buf) {
  const int64_t B = p.B, len = p.seq_len[b];
  double* E = buf;
  HmmSmallFrame* R = (HmmSmallFrame*)(buf + 4 * len);
  const hmm_v4d inf = hmm_splat(INFINITY), minf = hmm_splat(-INFINITY);
  const hmm_v4l first_k = hmm_v4l{0, 1, 2, 3} < K;
  hmm_v4l ok = hmm_v4l{} == 0;
  // E_t = exp(log e_t - max(M_t, lowest double)), K a frame.  B = 1: blocks of eight frames, by state (their
  // entries in a row), block(j) for frames 8 j .. 8 j + 7 < t8; for K < 4 beside the chains' first half (blocks
  // lo .. hi - 1 are still to do, taken from both ends ahead of the chains: two from each end before them), so
  // that their work fills the chains' latency shadow.  The other frames: the exponents (four lanes stored, the
  // next frame's store overwriting those past K), then their exps in one vectorised loop; the emissions read four
  // lanes at a time where the array has them.  A NaN or +inf log-emission fails the check after the chains (their
  // values then are NaN and overwritten).
  const int64_t t8 = B == 1 ? len & ~(int64_t)7 : 0;
  int64_t lo = 0, hi = t8 / 8;
  hmm_v8l ok8 = hmm_v8l{} == 0;
  // inlined with everything it calls: a call beside the chains would move their vectors through memory
  auto block = [&](int64_t j) __attribute__((always_inline, flatten)) {
    const hmm_v8d inf8 = hmm_bc8(INFINITY), low8 = hmm_bc8(-0x1.fffffffffffffp1023);
    hmm_v8d X[K], L[K];
    for (int i = 0; i < K; ++i) X[i] = hmm_load8(p.le + (8 * j + b) * K + 8 * i);
    hmm_small_by_state<K>(X, L);
    hmm_v8d M = L[0];
    for (int k = 0; k < K; ++k) {
      ok8 &= L[k] < inf8;
      M = ptn_select(L[k] > M, L[k], M);
    }
    if (st.filter_read) memcpy(st.m + 8 * j + b, &M, sizeof(M));
    M = ptn_select(M > low8, M, low8);
    for (int k = 0; k < K; ++k) L[k] = hmm_exp8(L[k] - M);
    hmm_small_by_frame<K>(L, X);
    memcpy(E + 8 * K * j, X, sizeof(X));
  };
  const int64_t last_full = p.T * B * K - 4;
  for (int64_t t = t8; t < len; ++t) {
    const int64_t tb = t * B + b;
    const Float* lt = p.le + tb * K;
    const hmm_v4d le = tb * K <= last_full ? ptn_select(first_k, hmm_small_load(lt), minf) : hmm_lanes<K>(lt, -INFINITY);
    ok &= le < inf;
    // M, the frame's largest, in every lane (those past K are -inf); le - M is <= 0, and -inf where le is (where
    // M = -inf too: le minus the lowest finite double)
    const hmm_v4d m1 = hmm_max4(le, ptn_shuffle(le, hmm_v4l{1, 0, 3, 2}));
    const hmm_v4d M = hmm_max4(m1, ptn_shuffle(m1, hmm_v4l{2, 3, 0, 1}));
    if (st.filter_read) st.m[tb] = M[0];
    const hmm_v4d y = le - hmm_max4(M, hmm_splat(-0x1.fffffffffffffp1023));
    memcpy(E + K * t, &y, sizeof(y));
  }
  for (int k = 0; k < 4; ++k)
    if (!ok[k]) return false;
  const int64_t n = K * len, n8 = K * t8 + ((n - K * t8) & ~(int64_t)7);
  for (int64_t i = K * t8; i < n8; i += 8) {
    const hmm_v8d x = hmm_exp8(hmm_load8(E + i));
    memcpy(E + i, &x, sizeof(x));
  }
  if (n8 < n) {
    hmm_v8d x = hmm_v8d{} - INFINITY;  // -inf: 0 in the lanes past the end
    memcpy(&x, E + n8, (n - n8) * sizeof(double));
    x = hmm_exp8(x);
    memcpy(E + n8, &x, (n - n8) * sizeof(double));
  }
  if (K < 4) E[n] = 0.0;  // read by the last frame's four lanes
  const int64_t ahead = K < 4 ? 2 : hi;  // blocks from each end before the chains (K = 4: all; beside, slower)
  for (int64_t q = 0; q < ahead && lo < hi; ++q) {
    block(lo++);
    if (lo < hi) block(--hi);
  }
  // the two chains: forward frame i, backward frame len - 1 - i
  HmmSmallChain<K> u(p, hmm_lanes<K>(p.pi) * hmm_small_load(E)), v(p, hmm_lanes<K>(p.f));
  u.store(R[0].u);
  v.store(R[len - 1].v);
  R[0].sigma = 1.0;
  hmm_v4d su = hmm_small_sum_all<K>(u.x), sv = hmm_small_sum_all<K>(v.x), su2 = su, sv2 = sv;  // frames i-1, i-2
  R[0].s = su[0];
  hmm_v4d lowest = hmm_min4(su, sv);  // of the sums s_t and sum v_t
  hmm_v4d sg = hmm_small_rescale(hmm_splat(1.0), su), sr = hmm_small_rescale(hmm_splat(1.0), sv);  // sigma_1, rho_1
  auto step = [&](int64_t i) __attribute__((always_inline)) {
    if (i > 1) {
      sg = hmm_small_rescale(sg, su2);
      sr = hmm_small_rescale(sr, sv2);
    }
    const int64_t t = len - 1 - i;
    u.forward(hmm_small_load(E + K * i) * sg);
    v.backward(hmm_small_load(E + K * (t + 1)) * sr);
    u.store(R[i].u);
    v.store(R[t].v);
    R[i].sigma = sg[0];
    su2 = su;
    sv2 = sv;
    su = hmm_small_sum_all<K>(u.x);
    sv = v.backward_sum();
    R[i].s = su[0];
    lowest = hmm_min4(lowest, hmm_min4(su, sv));
  };
  // frame t's outputs (u_t . v_t, finite and >= 0, within 2^-400..2^400, else the last check fails)
  hmm_v4d zmin = hmm_splat(0x1p400), zmax = hmm_splat(0x1p-400);
  hmm_v4d Ur[4] = {};
  auto output = [&](int64_t t) {
    const int64_t tb = t * B + b;
    const HmmSmallFrame& f = R[t];
    const hmm_v4d ut = hmm_small_load(f.u), vt = hmm_small_load(f.v), ab = ut * vt, zs = hmm_small_sum_all<K>(ab);
    const double s = f.s, z = zs[0];
    zmin = hmm_min4(zs, zmin);
    zmax = hmm_max4(zs, zmax);
    const double rz = 1.0 / z;
    hmm_small_store<K>(gamma + tb * K, ab * rz);
    if (st.filter_read) {
      hmm_small_store<K>(st.alpha + tb * K, ut * (1.0 / s));
      st.c[tb] = t == 0 ? s : s * (1.0 / f.sigma) / R[t - 1].s;
    }
    if (t == 0) return;
    const double* up = R[t - 1].u;  // its lanes broadcast from memory
    const hmm_v4d w = hmm_small_load(E + K * t) * vt * hmm_splat(rz * f.sigma);
    for (int k = 0; k < K; ++k) Ur[k] += hmm_splat(up[k]) * w;
  };
  int64_t i = 1;
  for (; 2 * i < len - 1; ++i) {
    if (lo < hi && (i & 3) == 0) block((i & 4) ? --hi : lo++);
    step(i);
  }
  while (lo < hi) block(lo++);
  for (; i < len; ++i) {  // frames i and len - 1 - i are ready
    step(i);
    output(i);
    if (2 * i != len - 1) output(len - 1 - i);
  }
  if (len == 1) output(0);
  if (!(zmin[0] >= 0x1p-400 && zmax[0] <= 0x1p400) || !(lowest[0] >= 0x1p-200)) return false;
  for (int l = 0; l < 8; ++l)
    if (!ok8[l]) return false;
  for (int k = 0; k < K; ++k) hmm_store_lanes<K>(xi + k * K, Ur[k]);
  return true;
}

// hmm_posteriors_run for one sequence of at most 4 states (B = 1), without hmm_infer_setup's scan of the
// emissions (hmm_post_small checks them).  Returns false where the general path must run: other sizes, a NaN in
// the parameters, and where hmm_post_small's checks fail.
static bool hmm_posteriors_small(Ndarray** inputs, const HmmPostState& st, Float* gamma, Float* xo) {
  if (Ndarray_DIMS(inputs[0])[1] != 1 || Ndarray_DIMS(inputs[0])[2] > 4 || Ndarray_DIMS(inputs[0])[2] == 0)
    return false;
  HmmScratch scratch;
  const HmmModel p = hmm_model_setup(scratch, inputs, "hmm_posteriors");
  if (p.consts[3] != 0.0) return false;
  const int64_t len = p.seq_len[0], K = p.K;
  st.status[0] = HMM_SCALED;
  if (len == 0) return true;  // zeros
  double* buf = hmm_kept_doubles<1>(scratch, 16 * len);
  double xi[16];
  bool done = false;
  hmm_with_k(K, [&](auto k) { done = hmm_post_small<decltype(k)::value>(p, st, 0, gamma, xi, buf); });
  if (!done) return false;
  for (int64_t i = 0; i < K * K; ++i) xo[i] = (Float)(xi[i] * p.A[i]);
  return true;
}
#endif

#endif  // PTNATIVE_HMM_HMM_POSTERIORS_SMALL_H
