// Dense K-state HMM: smoothed state marginals gamma_t(k) = p(z_t = k | x) and expected transition counts
// xi(i, j) = sum_{t >= 1} p(z_{t-1} = i, z_t = j | x), and their vector-Jacobian product.
//
// Forward: the scaled filter of hmm_infer.cu (kept as hidden outputs alpha, c, m, status for the gradient op).
// Backward: beta_{T_b-1} = f, beta_{t-1} = A (E_t * beta_t), each renormalised to sum 1 and set to 0 where
// alpha is 0 (states no path reaches: their beta does not matter, and zeroing keeps inf * 0 out);
// gamma_t = alpha_t beta_t / z_t with z_t = alpha_t . beta_t, and
// xi += alpha_{t-1}(i) A(i, j) E_t(j) beta_t(j) / (c_t z_t).
//
// Gradient: with upstream G (T, B, K) for gamma and H (B, K, K) for xi, the vector-Jacobian product is a
// covariance under the posterior: d/d log e_t(k) = E[F 1{z_t = k}] - E[F] gamma_t(k), with the path functional
// F = sum_t G_t(z_t) + sum_{t >= 1} H(z_{t-1}, z_t) (log e, log pi and log f enter log p(path) through state
// indicators, log A through transition indicators).  E[F 1{...}] comes from a tangent forward r (r_0 = alpha_0 G_0,
// r_t = ((r_{t-1} A + (alpha_{t-1} (A o H))) E_t / c_t + alpha_t G_t) and a tangent backward s (s_{T_b-1} = 0,
// s_{t-1}(i) = sum_j A(i, j) E_t(j) (s_t(j) + beta_t(j) (G_t(j) + H(i, j))), scaled like beta), so that
// E[F 1{z_t = k}] = (r_t(k) beta_t(k) + alpha_t(k) s_t(k)) / z_t.
//
// A sequence without a path gets all-zero marginals, counts and gradients; one with a NaN input NaN marginals and
// counts (and NaN gradients; the shared parameters' gradients are then NaN).  The empty series: zeros.

#include "hmm_exp8.h"
#include "hmm_infer.cu"
#include "hmm_kept.h"
#include "hmm_lanes_base.h"
#include "hmm_vectors_small.h"

struct HmmPostState {
  double *alpha, *c, *m;  // hidden outputs of the forward op (HmmPosteriorsValuesOp: the library's memory)
  double* status;         // the same: the sequence's status (double, like hmm.cu's)
  bool filter_read;       // whether alpha, c and m are read after the call (by the gradient op), or only status
};

// The forward op's work per sequence b: pred, beta, v (Kp each) in work + b * 3 Kp; xi (K x K, double) after the
// B * 3 Kp of those.  small: 16 T per sequence for the CPU's one-sequence path (null where no part is one sequence).
struct HmmPostWork {
  double* work;
  int64_t B, Kp, K;
  double* small;
  DEV_FUNC double* pred(int64_t b) const { return work + b * 3 * Kp; }
  DEV_FUNC double* beta(int64_t b) const { return work + b * 3 * Kp + Kp; }
  DEV_FUNC double* v(int64_t b) const { return work + b * 3 * Kp + 2 * Kp; }
  DEV_FUNC double* xi(int64_t b) const { return work + B * 3 * Kp + b * K * K; }
};

DEV_FUNC void hmm_post_fwd_step(const HmmInferParams& p, const HmmPostState& st, const HmmPostWork& w, int64_t t,
                                int64_t b) {
  if (t >= p.seq_len[b] || st.status[b] != HMM_SCALED) return;
  st.status[b] = hmm_infer_filter_step(p, t, b, st.alpha, st.c, st.m, w.pred(b), p.f, HmmSharedSteps{&p});
}

// gamma_t, and for t > 0 the pair marginals of (t-1, t) (divided by A: U += alpha_{t-1} v^T / (c_t z_t)) and
// beta_{t-1}.
DEV_FUNC void hmm_post_bwd_step(const HmmInferParams& p, const HmmPostState& st, const HmmPostWork& w, int64_t t,
                                int64_t b, Float* gamma) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b], tb = t * B + b;
  if (t >= len || st.status[b] != HMM_SCALED) return;
  double* beta = w.beta(b);
  double* v = w.v(b);
  const double* at = st.alpha + tb * K;
  if (t == len - 1) {
    for (int64_t k = 0; k < K; ++k) beta[k] = p.f[k];
    hmm_post_normalise(K, at, beta, (double*)0);
  }
  const double rz = 1.0 / hmm_dot(at, beta, K);
  for (int64_t k = 0; k < K; ++k) gamma[tb * K + k] = (Float)(at[k] * beta[k] * rz);
  if (t == 0) return;
  hmm_infer_emissions(p, t, b, st.m[tb], v);
  for (int64_t k = 0; k < K; ++k) v[k] *= beta[k];
  const double* ap = st.alpha + (tb - B) * K;
  const double x = rz / st.c[tb];
  double* U = w.xi(b);  // xi / A, multiplied by A in hmm_post_finish
  for (int64_t i = 0; i < K; ++i) {
    const double ai = ap[i] * x;
    if (ai == 0.0) continue;
    double* Ur = U + i * K;
#if !CUDA
#pragma GCC ivdep
#endif
    for (int64_t j = 0; j < K; ++j) Ur[j] += ai * v[j];
  }
  hmm_infer_matvec(p, v, beta, true);  // beta_{t-1} = A v
  hmm_post_normalise(K, ap, beta, (double*)0);
}

// Sequence b's counts; a sequence without a path gets zeros, one with a NaN NaN on its valid frames.
DEV_FUNC void hmm_post_finish(const HmmInferParams& p, const HmmPostState& st, const HmmPostWork& w, int64_t b,
                              Float* gamma, Float* xi_out) {
  const int64_t K = p.K, len = p.seq_len[b];
  Float* xo = xi_out + b * K * K;
  const double* xi = w.xi(b);
  if (len > 0 && st.status[b] != HMM_SCALED) {
    const Float fill = st.status[b] == HMM_NAN ? (Float)NAN_F : (Float)0.0;
    for (int64_t t = 0; t < len; ++t)
      for (int64_t k = 0; k < K; ++k) gamma[(t * p.B + b) * K + k] = fill;
    for (int64_t i = 0; i < K * K; ++i) xo[i] = fill;
    return;
  }
  for (int64_t i = 0; i < K * K; ++i) xo[i] = (Float)(xi[i] * p.A[i]);
}

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
  if (K == 1) return __builtin_shuffle(x, hmm_v4l{0, 0, 0, 0});
  const hmm_v4d a = x + __builtin_shuffle(x, hmm_v4l{1, 0, 3, 2});
  if (K == 2) return __builtin_shuffle(a, hmm_v4l{0, 0, 0, 0});
  return a + __builtin_shuffle(a, hmm_v4l{2, 3, 0, 1});
}

// 1 / (p 2^ex(s)) lane-wise, p a power of two, s >= 0 (2^ex(s): the exponent bits of s alone; 0 for s = 0 and
// subnormal s): exact (an inverse power of two by its exponent bits) where p 2^ex(s) is within 2^-1022..2^1023, and
// finite beyond, which only sequences that fail hmm_post_small's checks reach.
static inline hmm_v4d hmm_small_rescale(hmm_v4d p, hmm_v4d s) {
  const hmm_v4d q = p * (hmm_v4d)((hmm_v4l)s & 0x7ff0000000000000LL);
  return (hmm_v4d)(0x7fe0000000000000LL - (hmm_v4l)q);
}

static inline hmm_v4d hmm_min4(hmm_v4d a, hmm_v4d b) { return a < b ? a : b; }

// x[0..K) from lanes [0, K) of v: one masked store where the CPU has them for four doubles.
template <int K, typename T>
static inline void hmm_small_store(T* x, hmm_v4d v) {
#ifdef __AVX512VL__
  if constexpr (sizeof(T) == sizeof(double) && K < 4) {
    __builtin_ia32_storeupd256_mask((double*)x, v, (unsigned char)((1 << K) - 1));
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
    return K < 4 ? __builtin_shuffle(x, hmm_v4l{3, 3, 3, 3}) : hmm_small_sum_all<4>(x);
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
    else if constexpr (K == 2) L[k] = __builtin_shuffle(X[0], X[1], lo);
    else if constexpr (K == 3) L[k] = __builtin_shuffle(__builtin_shuffle(X[0], X[1], lo), X[2], hi);
    else L[k] = __builtin_shuffle(__builtin_shuffle(X[0], X[1], lo), __builtin_shuffle(X[2], X[3], lo), hi);
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
    else if constexpr (K == 2) X[j] = __builtin_shuffle(L[0], L[1], lo);
    else if constexpr (K == 3) X[j] = __builtin_shuffle(__builtin_shuffle(L[0], L[1], lo), L[2], hi);
    else X[j] = __builtin_shuffle(__builtin_shuffle(L[0], L[1], lo), __builtin_shuffle(L[2], L[3], lo), hi);
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
      M = L[k] > M ? L[k] : M;
    }
    if (st.filter_read) memcpy(st.m + 8 * j + b, &M, sizeof(M));
    M = M > low8 ? M : low8;
    for (int k = 0; k < K; ++k) L[k] = hmm_exp8(L[k] - M);
    hmm_small_by_frame<K>(L, X);
    memcpy(E + 8 * K * j, X, sizeof(X));
  };
  const int64_t last_full = p.T * B * K - 4;
  for (int64_t t = t8; t < len; ++t) {
    const int64_t tb = t * B + b;
    const Float* lt = p.le + tb * K;
    const hmm_v4d le = tb * K <= last_full ? (first_k ? hmm_small_load(lt) : minf) : hmm_lanes<K>(lt, -INFINITY);
    ok &= le < inf;
    // M, the frame's largest, in every lane (those past K are -inf); le - M is <= 0, and -inf where le is (where
    // M = -inf too: le minus the lowest finite double)
    const hmm_v4d m1 = hmm_max4(le, __builtin_shuffle(le, hmm_v4l{1, 0, 3, 2}));
    const hmm_v4d M = hmm_max4(m1, __builtin_shuffle(m1, hmm_v4l{2, 3, 0, 1}));
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

#if !CUDA
// ---------------------------------------------------------------- sequences in vector lanes, on the CPU
// Where the batch has enough sequences (hmm_post_use_lanes), each group of 8 runs with one vector of eight
// doubles per state, lane l holding sequence b0 + l (hmm_lanes_base.h).  Forward: u_t = (u_{t-1} A) E_t sigma_t
// (u_0 = pi E_0 sigma_0), with E_t = exp(log e_t - M_t), M_t the largest log-density of the frame, and sigma_t the
// power of two that brings the sum s_t of (u_{t-1} A) E_t into [1, 2); u_t and E_t kept (T, K, 8) per group.
// Backward, from each lane's last frame (v = f there): z_t = u_t . v_t, gamma_t = u_t v_t / z_t, and for t > 0 the
// pair marginals u_{t-1}(i) A(i, j) w_t(j) sigma_t / z_t with w_t = E_t v_t, buffered for HMM_LANE_STEPS steps and
// added lane-wise into U = xi / A; then v_{t-1} = A w_t scaled by the power of two that brings its sum into [1, 2).
// The scalings cancel (gamma and the pair marginals are normalised per frame), so these are the sequential pass's
// values to rounding, unless something underflows here that it keeps (nothing overflows: sums stay below 2 K):
// a lane whose s_t or sum of A w_t falls below 2^-200, or z_t below 2^-400 (possible where an unreachable state
// holds the frame's largest log-density, or the final weights), is recomputed by the sequential pass.  For the
// gradient op the forward also writes the filter in hmm_infer.cu's terms: alpha_t = u_t / s'_t, s'_t = s_t sigma_t
// its sum, c_t = s_t / s'_{t-1} (c_0 = s_0), m_t = M_t.

#define HMM_POST_CHUNK 16  // frames whose emission rows are computed ahead of the forward recursion

// A group's memory: u, E (T, K, 8), sigma, M (T, 8), the emissions' scratch (K, 8), the buffered steps X, V
// (K, HMM_LANE_STEPS, 8 each), U (K, K, 8) and v, w, gamma (K, 8 each).
static inline int64_t hmm_post_lane_doubles(int64_t T, int64_t K) {
  return (T * (2 * K + 2) + K + 2 * K * HMM_LANE_STEPS + K * K + 3 * K) * HMM_W;
}

// Group g's marginals into gamma, counts into xi_out and the filter into st (if st.filter_read), for the lanes whose
// sequences have the status HMM_SCALED; a sequence with a NaN on a valid frame gets p.status[b] = HMM_NAN (its
// lane stops there), those to recompute by the sequential pass redo[b] = 1.
// mem: hmm_post_lane_doubles(T, K) doubles on a cache line.
static void hmm_post_lane_group(const HmmInferParams& p, const HmmPostState& st, int64_t g, double* mem, Float* gamma,
                                Float* xi_out, char* redo, FsaCheck* check) {
  const int64_t T = p.T, B = p.B, K = p.K;
  const HmmGroup G = hmm_group(p, g);
  hmm_v8d* uL = (hmm_v8d*)mem;
  hmm_v8d* EL = uL + T * K;
  hmm_v8d* sigma = EL + T * K;
  hmm_v8d* M = sigma + T;
  double* raw = (double*)(M + T);
  hmm_v8d* Xb = (hmm_v8d*)raw + K;  // K rows of HMM_LANE_STEPS vectors
  hmm_v8d* Vb = Xb + K * HMM_LANE_STEPS;
  hmm_v8d* U = Vb + K * HMM_LANE_STEPS;
  hmm_v8d* v = U + K * K;
  hmm_v8d* w = v + K;
  hmm_v8d* gam = w + K;
  hmm_v8l on = {};  // lanes of sequences with a frame and, so far, the status HMM_SCALED
  char dead[HMM_W];
  for (int64_t l = 0; l < HMM_W; ++l) {
    on[l] = l < G.n && p.status[G.b0 + l] == HMM_SCALED && G.len[l] > 0 ? -1 : 0;
    dead[l] = !on[l];
  }
  hmm_v8l good = on;  // lanes computed here so far
  const hmm_v8d lo = hmm_bc8(0x1p-200), zlo = hmm_bc8(0x1p-400);
  hmm_v8d s_prev = {};  // s'_{t-1}
  for (int64_t t0 = 0; t0 < G.t_end; t0 += HMM_POST_CHUNK) {
    const int64_t t1 = std::min<int64_t>(t0 + HMM_POST_CHUNK, G.t_end);
    hmm_lane_emissions(p, G, t0, t1, dead, raw, EL + t0 * K, M + t0, check);
    for (int64_t t = t0; t < t1; ++t) {
      hmm_v8d* __restrict__ ut = uL + t * K;
      const hmm_v8d* __restrict__ Et = EL + t * K;
      if (t == 0)
        for (int64_t k = 0; k < K; ++k) ut[k] = hmm_bc8(p.pi[k]);
      else
        hmm_lane_matvec(uL + (t - 1) * K, K, p.A, ut);
      for (int64_t k = 0; k < K; ++k) ut[k] *= Et[k];
      const hmm_v8d s = hmm_lane_sum(ut, K);
      const hmm_v8l act = good & (t < G.len), ok = act & (s >= lo);
      good &= ~act | ok;
      const hmm_v8d scale = (hmm_v8d)((hmm_v8l)hmm_inverse_power_of_two8(s) & ok);
      for (int64_t k = 0; k < K; ++k) ut[k] *= scale;
      sigma[t] = scale;
      if (st.filter_read) {
        const hmm_v8d s_now = s * scale, inv = (hmm_v8d)((hmm_v8l)(1.0 / s_now) & ok), c = t == 0 ? s : s / s_prev;
        s_prev = s_now;
        for (int64_t k = 0; k < K; ++k) gam[k] = ut[k] * inv;
        hmm_lane_store_rows(G, ok, gam, K, st.alpha + (t * B + G.b0) * K);
        for (int64_t l = 0; l < G.n; ++l)
          if (ok[l]) {
            st.c[t * B + G.b0 + l] = c[l];
            st.m[t * B + G.b0 + l] = M[t][l];
          }
      }
    }
  }
  for (int64_t k = 0; k < K * K; ++k) U[k] = hmm_v8d{};
  int64_t n_steps = 0;
  auto add_steps = [&]() {
    hmm_lane_outer(Xb, Vb, HMM_LANE_STEPS, n_steps, K, [&](int64_t i, int64_t j, hmm_v8d acc) { U[i * K + j] += acc; });
    n_steps = 0;
  };
  for (int64_t k = 0; k < K; ++k) v[k] = hmm_v8d{};
  for (int64_t t = G.t_end - 1; t >= 0; --t) {
    const hmm_v8l start = good & (t == G.len - 1);
    for (int64_t k = 0; k < K; ++k) v[k] = start ? hmm_bc8(p.f[k]) : v[k];
    const hmm_v8d* __restrict__ ut = uL + t * K;
    const hmm_v8d z = hmm_lane_sum(ut, K, v);
    hmm_v8l act = good & (t < G.len);
    good &= ~act | (z >= zlo);
    act &= z >= zlo;
    const hmm_v8d r = (hmm_v8d)((hmm_v8l)(1.0 / z) & act);
    for (int64_t k = 0; k < K; ++k) gam[k] = ut[k] * v[k] * r;
    hmm_lane_store_rows(G, act, gam, K, gamma + (t * B + G.b0) * K);
    if (t == 0) break;
    const hmm_v8d* __restrict__ Et = EL + t * K;
    const hmm_v8d* __restrict__ up = uL + (t - 1) * K;
    const hmm_v8d x = r * sigma[t];
    for (int64_t k = 0; k < K; ++k) {
      w[k] = Et[k] * v[k];
      Vb[k * HMM_LANE_STEPS + n_steps] = w[k];
      Xb[k * HMM_LANE_STEPS + n_steps] = up[k] * x;
    }
    if (++n_steps == HMM_LANE_STEPS) add_steps();
    hmm_lane_matvec(w, K, p.AT, v);
    const hmm_v8d sv = hmm_lane_sum(v, K);
    good &= ~act | (sv >= lo);
    const hmm_v8d scale = hmm_inverse_power_of_two8(sv);
    for (int64_t k = 0; k < K; ++k) v[k] *= scale;
  }
  if (n_steps > 0) add_steps();
  for (int64_t l = 0; l < G.n; ++l) {
    const int64_t b = G.b0 + l;
    if (!on[l]) continue;
    if (dead[l]) {  // hmm_lane_emissions met a NaN on a valid frame
      p.status[b] = HMM_NAN;
    } else if (good[l]) {
      Float* xo = xi_out + b * K * K;
      for (int64_t i = 0; i < K * K; ++i) xo[i] = (Float)(U[i][l] * p.A[i]);
    } else {
      redo[b] = 1;
    }
  }
}
#endif

#if !CUDA
// The sequential pass over the sequences [b0, b1) (status set, xi zeroed): time outer, batch inner (the sequences'
// independent recursions overlap in the pipeline), then the counts.
static void hmm_post_sequential(const HmmInferParams& p, const HmmPostState& st, const HmmPostWork& w, Float* gamma,
                                Float* xi_out, int64_t b0, int64_t b1) {
  hmm_time_outer(p.T, b0, b1, false, [&](int64_t t, int64_t b) { hmm_post_fwd_step(p, st, w, t, b); });
  hmm_time_outer(p.T, b0, b1, true, [&](int64_t t, int64_t b) { hmm_post_bwd_step(p, st, w, t, b, gamma); });
  for (int64_t b = b0; b < b1; ++b) hmm_post_finish(p, st, w, b, gamma, xi_out);
}
#endif

// Forward op: the filter, then the backward pass writing gamma and xi.  The CPU runs time outer and batch inner
// (the sequences' independent recursions overlap in the pipeline) over the sequences [b0, b1) of one part of the
// batch (hmm_run_parts: one per CPU thread for large problems); CUDA one thread per sequence.
DEF_KERNEL void hmm_post_kernel(HmmInferParams p, HmmPostState st, HmmPostWork w, Float* gamma, Float* xi_out,
                                int64_t b0, int64_t b1) {
#if CUDA
  GRID_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i;
    st.status[b] = p.status[b];
    for (int64_t j = 0; j < p.K * p.K; ++j) w.xi(b)[j] = 0.0;
    for (int64_t t = 0; t < p.seq_len[b]; ++t) hmm_post_fwd_step(p, st, w, t, b);
    for (int64_t t = p.seq_len[b] - 1; t >= 0; --t) hmm_post_bwd_step(p, st, w, t, b, gamma);
    hmm_post_finish(p, st, w, b, gamma, xi_out);
  }
#else
  for (int64_t b = b0; b < b1; ++b) {
    st.status[b] = p.status[b];
    for (int64_t j = 0; j < p.K * p.K; ++j) w.xi(b)[j] = 0.0;
  }
  if (w.small && b1 - b0 == 1 && p.seq_len[b0] > 0 && st.status[b0] == HMM_SCALED) {  // one sequence, few states
    bool done = false;
    hmm_with_k(p.K, [&](auto k) {
      done = hmm_post_small<decltype(k)::value>(p, st, b0, gamma, w.xi(b0), w.small + 16 * p.T * b0);
    });
    if (done) {
      hmm_post_finish(p, st, w, b0, gamma, xi_out);
      return;
    }
  }
  hmm_post_sequential(p, st, w, gamma, xi_out, b0, b1);
#endif
}

#if !CUDA
// Whether the posteriors of a batch of B sequences run in lanes.  A group costs the same whatever number of its lanes
// hold a sequence; a sequence in the sequential pass (time outer, batch inner) costs r times its share of a full
// group, measured (T = 1000, B = 8, one thread, CPU time, same process, load ~7) r = 3.3, 3.4, 2.8, 3.7, 3.6, 3.2,
// 3.1, 2.4, 2.7 at K = 2, 3, 4, 6, 8, 12, 16, 24, 32, and 2.4 - 3.4 up to K = 256 (shorter T): the lanes win when
// the batch rounded up to groups of 8 is at most 2.4 B, for every B >= 4, and measured also for B = 3 (1.06 - 1.21x
// faster at K = 4, 16, 32), not for B = 2 (1.11x faster at K = 4, 0.79x at K = 16).
static inline bool hmm_post_use_lanes(int64_t B) { return B >= 3; }

// hmm_posteriors_run on the CPU with the sequences in lanes, where hmm_post_use_lanes(B) and no parameter is NaN
// (returns false otherwise, having done nothing but the checks of hmm_model_setup).  Without hmm_infer_setup's scan
// of the emissions: hmm_lane_emissions finds NaN and +inf on the valid frames beside its own pass (the rest of a
// sequence after a NaN is searched for +inf separately), and +inf raises after the pass.  The groups split over the
// parts; the sequences a group leaves to the sequential pass run right after it, on the same thread.
static bool hmm_posteriors_lanes(Ndarray** inputs, const HmmPostState& st, Float* gamma, Float* xi_out) {
  const int64_t B = Ndarray_DIMS(inputs[0])[1], K = Ndarray_DIMS(inputs[0])[2];
  if (!hmm_post_use_lanes(B)) return false;
  HmmScratch scratch;
  HmmInferParams p;
  static_cast<HmmModel&>(p) = hmm_model_setup(scratch, inputs, "hmm_posteriors");
  if (p.consts[3] != 0.0) return false;
  p.Kp = (K + 3) / 4 * 4;  // the sequential pass's padded matrices (hmm_infer_setup's)
  double* Ap = scratch.get<double>(K * p.Kp);
  double* ATp = scratch.get<double>(K * p.Kp);
  start_dev_kernel(hmm_infer_pad, (p, Ap, ATp));
  p.Ap = Ap;
  p.ATp = ATp;
  p.status = scratch.get<int32_t>(B);
  for (int64_t b = 0; b < B; ++b) p.status[b] = HMM_SCALED;
  const HmmPostWork w = {scratch.get<double>(B * (3 * p.Kp + K * K)), B, p.Kp, K, (double*)0};
  const int64_t groups = (B + HMM_W - 1) / HMM_W;
  const int parts = (int)std::min<int64_t>(hmm_cpu_parts(p.T, B, K), groups);
  const int64_t per_part = (hmm_post_lane_doubles(p.T, K) + 7) / 8 * 8;
  double* mem = hmm_kept_doubles<1>(scratch, parts * per_part);
  char* redo = scratch.get<char>(B);
  memset(redo, 0, B);
  hmm_run_parts(scratch, parts, groups, p.check, [&](int q, int64_t g0, int64_t g1, FsaCheck* check) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * HMM_W, b1 = std::min<int64_t>(b0 + HMM_W, B);
      FsaCheck first;
      memset(&first, 0, sizeof(first));
      hmm_post_lane_group(p, st, g, mem + q * per_part, gamma, xi_out, redo, &first);
      for (int64_t b = b0; b < b1; ++b) {
        st.status[b] = p.status[b];
        if (redo[b]) {
          for (int64_t j = 0; j < K * K; ++j) w.xi(b)[j] = 0.0;
          hmm_post_sequential(p, st, w, gamma, xi_out, b, b + 1);
        } else if (st.status[b] == HMM_NAN) {
          hmm_post_finish(p, st, w, b, gamma, xi_out);
          for (int64_t t = 0; t < p.seq_len[b]; ++t)  // a +inf after the NaN still raises
            for (int64_t k = 0; k < K; ++k)
              if ((double)p.le[(t * B + b) * K + k] == INFINITY)
                fsa_fail(&first, FSA_CHECK_SCORE_INFINITE, t, b, k, INFINITY);
        }
      }
      hmm_keep_first_failure(check, first);
    }
  });
  hmm_infer_raise(p.check, hmm_model_terms("hmm_posteriors", p.T, B, K));
  return true;
}
#endif

// The marginals' padded frames (t >= T_b, T_b from the 0/1 prefix mask (T, B)) and the counts of sequences without
// a frame, zeroed before the passes run, which write every other element (the outputs are fully_written).
DEF_KERNEL void hmm_post_unwritten(const Float* mask, int64_t T, int64_t B, int64_t K, Float* gamma, Float* xi) {
  GRID_LOOP(b, B) {
    const int64_t len = hmm_mask_length(mask, T, B, b);
    hmm_zero_frames(gamma, len, T, B, K, b);
    if (len == 0)
      for (int64_t i = 0; i < K * K; ++i) xi[b * K * K + i] = (Float)0.0;
  }
}

// The forward pass of both forward ops: the marginals gamma (T,B,K) and the counts xi (B,K,K) from the inputs
// log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B); st: the hidden arrays
// (double) alpha (T,B,K), c (T,B), m (T,B), status (B).
static void hmm_posteriors_run(int n_inputs, Ndarray** inputs, const HmmPostState& st, Float* gamma, Float* xi) {
  const int64_t T = Ndarray_DIMS(inputs[0])[0], B = Ndarray_DIMS(inputs[0])[1];
  const bool mask_fits = Ndarray_NDIM(inputs[4]) == 2 && Ndarray_DIMS(inputs[4])[0] == T &&
                         Ndarray_DIMS(inputs[4])[1] == B;  // else the setup below raises
  if (B > 0 && mask_fits)
    start_dev_kernel(hmm_post_unwritten, (Ndarray_DEV_DATA(inputs[4]), T, B, Ndarray_DIMS(inputs[0])[2], gamma, xi));
#if !CUDA
  if (hmm_posteriors_small(inputs, st, gamma, xi) || hmm_posteriors_lanes(inputs, st, gamma, xi)) return;
#endif
  HmmInferCall call("hmm_posteriors", inputs, n_inputs, 5, 0, 0);
  const HmmInferParams& p = call.p;
  if (p.B == 0) return;
  HmmPostWork w = {call.scratch.get<double>(p.B * (3 * p.Kp + p.K * p.K)), p.B, p.Kp, p.K, (double*)0};
#if !CUDA
  if (p.Kp == 4 && hmm_cpu_parts(p.T, p.B, p.K) == p.B) w.small = hmm_kept_doubles<1>(call.scratch, 16 * p.T * p.B);
#endif
  HMM_OVER_BATCH(call, hmm_post_kernel, p, st, w, gamma, xi);
  HANDLE_LAST_ERROR();
}

// The hidden filter's rows that the gradient op does not read, zeroed after the passes (the outputs are
// fully_written): frames t >= T_b, and every frame of a sequence that did not end HMM_SCALED (its filter stopped
// at a NaN or where the path ended).  The mask as in hmm_post_unwritten.
DEF_KERNEL void hmm_post_filter_unwritten(const Float* mask, int64_t T, int64_t B, int64_t K, HmmPostState st) {
  GRID_LOOP(b, B) {
    const int64_t t0 = (int)st.status[b] == HMM_SCALED ? hmm_mask_length(mask, T, B, b) : 0;
    hmm_zero_frames(st.alpha, t0, T, B, K, b);
    hmm_zero_frames(st.c, t0, T, B, 1, b);
    hmm_zero_frames(st.m, t0, T, B, 1, b);
  }
}

// HmmPosteriorsOp: outputs marginals, counts, then the hidden arrays.
static void hmm_posteriors_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 6);
  const HmmPostState st = {(double*)(*outputs[2])->data, (double*)(*outputs[3])->data, (double*)(*outputs[4])->data,
                           (double*)(*outputs[5])->data, true};
  hmm_posteriors_run(n_inputs, inputs, st, Ndarray_DEV_DATA(*outputs[0]), Ndarray_DEV_DATA(*outputs[1]));
  const int64_t T = Ndarray_DIMS(inputs[0])[0], B = Ndarray_DIMS(inputs[0])[1];  // the inputs passed the checks
  if (B > 0)
    start_dev_kernel(hmm_post_filter_unwritten, (Ndarray_DEV_DATA(inputs[4]), T, B, Ndarray_DIMS(inputs[0])[2], st));
  HANDLE_LAST_ERROR();
}

// HmmPosteriorsValuesOp (no gradient): outputs marginals and counts; the hidden arrays in the library's memory.
static void hmm_posteriors_values_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 2);
  const int64_t TB = Ndarray_DIMS(inputs[0])[0] * Ndarray_DIMS(inputs[0])[1], K = Ndarray_DIMS(inputs[0])[2];
  ptn::Scratch scratch;
  double* mem = hmm_kept_doubles<0>(scratch, TB * (K + 2) + Ndarray_DIMS(inputs[0])[1]);
  const HmmPostState st = {mem, mem + TB * K, mem + TB * (K + 1), mem + TB * (K + 2), false};
  hmm_posteriors_run(n_inputs, inputs, st, Ndarray_DEV_DATA(*outputs[0]), Ndarray_DEV_DATA(*outputs[1]));
}

DEF_KERNEL void hmm_post_fill(Float* x, int64_t n, Float value) {
  GRID_LOOP(i, n) x[i] = value;
}

// n copies of value.  On the CPU in the library's memory (slot Slot of hmm_kept_doubles, which nothing else
// writes), filled only where the calling thread's previous call did not leave them (a T = 500 mask: 0.15 us a call).
template <int Slot>
static Float* hmm_post_filled(ptn::Scratch& scratch, int64_t n, Float value) {
#if !CUDA
  thread_local const Float* at = nullptr;  // the memory the last call filled, and how much of it
  thread_local int64_t count = 0;
  const int64_t n_doubles = (n * (int64_t)sizeof(Float) + 7) / 8;
  Float* x = (Float*)hmm_kept_doubles<Slot>(scratch, n_doubles);
  if (x == at && n <= count) return x;
  start_dev_kernel(hmm_post_fill, (x, n, value));
  const bool kept = n_doubles <= HMM_KEEP_DOUBLES;  // else per-call scratch, never reused
  at = kept ? x : nullptr;
  count = kept ? n : 0;
  return x;
#else
  Float* x = scratch.get<Float>(n);
  start_dev_kernel(hmm_post_fill, (x, n, value));
  return x;
#endif
}

// HmmPosteriorsDefaultsOp: HmmPosteriorsValuesOp on log_emissions (T,B,K), log_transitions, log_initial with the
// defaults log_final = 0 (K) and mask = 1 (T,B), made here (contiguous, like the inputs they stand for).
static void hmm_posteriors_defaults_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 3);
  const int64_t T = Ndarray_DIMS(inputs[0])[0], B = Ndarray_DIMS(inputs[0])[1], K = Ndarray_DIMS(inputs[0])[2];
  ptn::Scratch scratch;
  Ndarray lf = *inputs[2], mask = *inputs[0];
  lf.data = hmm_post_filled<2>(scratch, K, (Float)0.0);
  lf.dims[0] = K;
  lf.strides[0] = sizeof(Float);
  mask.data = hmm_post_filled<3>(scratch, T * B, (Float)1.0);
  mask.ndim = 2;
  mask.strides[1] = sizeof(Float);
  mask.strides[0] = B * (int64_t)sizeof(Float);
  Ndarray* all[5] = {inputs[0], inputs[1], inputs[2], &lf, &mask};
  hmm_posteriors_values_fw(5, all, n_outputs, outputs);
}

// ---------------------------------------------------------------- gradient
// Per sequence: the tangent forward r (T, B, K scratch), then beta, s backwards with the products.
// dA_acc (K x K), dpi_acc, df_acc (K): double accumulators shared by the batch (atomics on CUDA).
DEF_KERNEL void hmm_post_grad_kernel(HmmInferParams p, HmmPostState st, const Float* G, const Float* H, double* r,
                                     double* work, Float* dle, double* dA_acc, double* dpi_acc, double* df_acc,
                                     int32_t* any_nan) {
  GRID_LOOP(b, p.B) {
    const int64_t B = p.B, K = p.K, len = p.seq_len[b];
    const int status = (int)st.status[b];
    hmm_zero_frames(dle, len == 0 || status == HMM_NO_PATH ? 0 : len, p.T, B, K, b);  // padded frames too
    if (len == 0 || status == HMM_NO_PATH) continue;
    if (status == HMM_NAN) {
      for (int64_t t = 0; t < len; ++t)
        for (int64_t k = 0; k < K; ++k) dle[(t * B + b) * K + k] = (Float)NAN_F;
      elem_atomic_add(any_nan, 1);
      continue;
    }
    double* E = work + b * 5 * p.Kp;
    double* beta = E + p.Kp;
    double* s = beta + p.Kp;
    double* u = s + p.Kp;
    double* sn = u + p.Kp;
    const Float* Hb = H + b * K * K;
    // tangent forward
    for (int64_t t = 0; t < len; ++t) {
      const int64_t tb = t * B + b;
      const double* at = st.alpha + tb * K;
      double* rt = r + tb * K;
      const Float* Gt = G + tb * K;
      if (t == 0) {
        for (int64_t k = 0; k < K; ++k) rt[k] = at[k] * (double)Gt[k];
        continue;
      }
      const double* ap = st.alpha + (tb - B) * K;
      const double* rp = r + (tb - B) * K;
      for (int64_t j = 0; j < K; ++j) u[j] = 0.0;
      for (int64_t i = 0; i < K; ++i) {
        const double ri = rp[i], ai = ap[i];
        const double* Ai = p.A + i * K;
        const Float* Hi = Hb + i * K;
        for (int64_t j = 0; j < K; ++j) u[j] += Ai[j] * (ri + ai * (double)Hi[j]);
      }
      hmm_infer_emissions(p, t, b, st.m[tb], E);
      const double ic = 1.0 / st.c[tb];
      for (int64_t k = 0; k < K; ++k) rt[k] = u[k] * E[k] * ic + at[k] * (double)Gt[k];
    }
    // backward: beta, s, and the products
    const int64_t last = (len - 1) * B + b;
    for (int64_t k = 0; k < K; ++k) {
      beta[k] = p.f[k];
      s[k] = 0.0;
    }
    hmm_post_normalise(K, st.alpha + last * K, beta, s);
    for (int64_t t = len - 1; t >= 0; --t) {
      const int64_t tb = t * B + b;
      const double* at = st.alpha + tb * K;
      const double* rt = r + tb * K;
      double z = 0.0, ef = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        z += at[k] * beta[k];
        ef += rt[k] * beta[k] + at[k] * s[k];
      }
      const double rz = 1.0 / z;
      ef *= rz;  // E[F]
      Float* d = dle + tb * K;
      for (int64_t k = 0; k < K; ++k) {
        const double gk = ((rt[k] * beta[k] + at[k] * s[k]) - ef * at[k] * beta[k]) * rz;
        d[k] = (Float)gk;
        if (t == 0) elem_atomic_add(dpi_acc + k, gk);
        if (tb == last) elem_atomic_add(df_acc + k, gk);
      }
      if (t == 0) break;
      const Float* Gt = G + tb * K;
      hmm_infer_emissions(p, t, b, st.m[tb], E);
      const double* ap = st.alpha + (tb - B) * K;
      const double* rp = r + (tb - B) * K;
      const double x = rz / st.c[tb];
      for (int64_t i = 0; i < K; ++i) {
        const double* Ai = p.A + i * K;
        const Float* Hi = Hb + i * K;
        double bi = 0.0, si = 0.0;
        for (int64_t j = 0; j < K; ++j) {
          const double w = Ai[j] * E[j];
          const double gh = (double)Gt[j] + (double)Hi[j];
          bi += w * beta[j];
          si += w * (s[j] + beta[j] * gh);
          const double dij = w * x * (rp[i] * beta[j] + ap[i] * (beta[j] * (gh - ef) + s[j]));
          if (dij != 0.0) elem_atomic_add(dA_acc + i * K + j, dij);
        }
        u[i] = bi;
        sn[i] = si;
      }
      for (int64_t i = 0; i < K; ++i) {
        beta[i] = u[i];
        s[i] = sn[i];
      }
      hmm_post_normalise(K, ap, beta, s);
    }
  }
}

DEF_KERNEL void hmm_post_grad_store(int64_t K, const double* dA_acc, const double* dpi_acc, const double* df_acc,
                                    const int32_t* any_nan, Float* dA, Float* dpi, Float* df) {
  GRID_LOOP(i, K * K) {
    const bool nan = any_nan[0] != 0;
    dA[i] = nan ? (Float)NAN_F : (Float)dA_acc[i];
    if (i < K) {
      dpi[i] = nan ? (Float)NAN_F : (Float)dpi_acc[i];
      df[i] = nan ? (Float)NAN_F : (Float)df_acc[i];
    }
  }
}

// inputs: the five inputs, alpha, c, m, status (hidden outputs), D_marginals (T,B,K), D_counts (B,K,K)
// outputs: d log_emissions (T,B,K), d log_transitions (K,K), d log_initial (K), d log_final (K)
static void hmm_posteriors_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmInferCall call("hmm_posteriors", inputs, n_inputs, 11, n_outputs, 4);
  const HmmInferParams& p = call.p;
  HmmScratch& scratch = call.scratch;
  const int64_t T = p.T, B = p.B, K = p.K;
  if (B == 0) return;
  assert_cmp(Ndarray_DIMS(inputs[9])[0], ==, T);
  assert_cmp(Ndarray_DIMS(inputs[10])[0], ==, B);
  HmmPostState st;
  st.alpha = (double*)inputs[5]->data;
  st.c = (double*)inputs[6]->data;
  st.m = (double*)inputs[7]->data;
  st.status = (double*)inputs[8]->data;
  st.filter_read = true;
  double* acc = scratch.get<double>(K * K + 2 * K);
  Ndarray_memset(acc, 0, (K * K + 2 * K) * sizeof(double));
  int32_t* any_nan = scratch.get<int32_t>(1);
  Ndarray_memset(any_nan, 0, sizeof(int32_t));
  double* r = scratch.get<double>(T * B * K);
  double* work = scratch.get<double>(B * 5 * p.Kp);
  start_dev_kernel(hmm_post_grad_kernel, (p, st, Ndarray_DEV_DATA(inputs[9]), Ndarray_DEV_DATA(inputs[10]), r, work,
                                          Ndarray_DEV_DATA(*outputs[0]), acc, acc + K * K, acc + K * K + K, any_nan));
  start_dev_kernel(hmm_post_grad_store, (K, acc, acc + K * K, acc + K * K + K, any_nan, Ndarray_DEV_DATA(*outputs[1]),
                                         Ndarray_DEV_DATA(*outputs[2]), Ndarray_DEV_DATA(*outputs[3])));
  HANDLE_LAST_ERROR();
}
