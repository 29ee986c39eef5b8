// Dense K-state HMM: log-likelihood and its gradients by scaled forward-backward.
//
// Scaled pass (double): emissions E_t = exp(log e_t - max_k log e_t) per (t, b),
// transitions A = exp(log A - max log A), initial / final likewise; the forward vector is
// renormalised every step (alpha_t = (alpha_{t-1} A) * E_t / c_t) and the log-scales summed.
// The forward op keeps alpha and c as hidden outputs, so the gradient op runs only the
// backward recursion (recomputing E_t, which is cheaper than storing it).  A sequence whose step mass c_t (or final mass) falls below
// HMM_TINY (the product underflowed: log-density gaps beyond double's ~700 nats within
// one step) is recomputed in log space (status 1); one with no path at all gets -inf and a
// zero gradient (status 2).
//
// CPU: one fused loop per sequence (small K-length vector loops, exp vectorised by hand).
// CUDA: one launch per step with a cuBLAS GEMM over the batch; the log-space fallback runs
// one thread per sequence on both.
//
// A sequence with no frame has probability 1 (log-likelihood 0, gradient 0).  A NaN log-emission on a valid
// frame of sequence b makes its log-likelihood NaN (status 3) and its emission gradient NaN on its valid frames;
// a NaN in the shared parameters does so for every sequence with a frame.  The gradients of the shared
// parameters are NaN when any sequence is.  +inf log-probabilities raise.
//
// fsa_exp, FsaCheck, fsa_mask_lengths, FsaTerms: fsa_common.h.

#include "fsa_common.h"

// The dialect's scratch memory, under the name the HMM kernels of other files use.
typedef ptn::Scratch HmmScratch;

#define HMM_TINY 1e-280
enum { HMM_SCALED = 0, HMM_LOG_SPACE = 1, HMM_NO_PATH = 2, HMM_NAN = 3 };

// *out = max of x[0..n) over the non-NaN entries (-inf if none); returns whether x has a NaN.  A +inf
// entry i is recorded in `check` (if given) by report(i), and *out is then -inf.
template <typename Report>
DEV_FUNC inline bool hmm_checked_max(const Float* x, int64_t n, double* out, FsaCheck* check, Report report) {
  double m = -INFINITY;
  bool has_nan = false;
  for (int64_t i = 0; i < n; ++i) {
    double v = (double)x[i];
    has_nan |= v != v;
    m = v > m ? v : m;
  }
  if (m == INFINITY) {
    int64_t i = 0;
    while (i + 1 < n && !((double)x[i] == INFINITY)) ++i;
    if (check) report(check, i);
    m = -INFINITY;
  }
  *out = m;
  return has_nan;
}

// out[i] = exp(x[i] - m) (0 everywhere if m = -inf).
DEV_FUNC inline void hmm_exp_row(const Float* __restrict__ x, int64_t n, double m, double* __restrict__ out) {
  if (!(m > -INFINITY)) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.0;
    return;
  }
#if !CUDA
#pragma GCC ivdep
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = fsa_exp((double)x[i] - m);
}

// log sum_i exp(x[i] + y[i]) (y may be null); -inf if empty.
template <typename X, typename Y>
DEV_FUNC inline double hmm_lse2(const X* x, const Y* y, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    double v = (double)x[i] + (y ? (double)y[i] : 0.0);
    m = v > m ? v : m;
  }
  if (!(m > -INFINITY)) return -INFINITY;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += exp((double)x[i] + (y ? (double)y[i] : 0.0) - m);
  return m + log(s);
}

struct HmmParamReport {
  int q;
  DEV_FUNC void operator()(FsaCheck* c, int64_t i) const { fsa_fail(c, FSA_CHECK_PARAM_PLUS_INF, q, i, 0, INFINITY); }
};

// A, pi, f: shifted exps; consts = [log-shift of A, of pi, of f, 1 if any of them has a NaN].  AT = A transposed.
DEF_KERNEL void hmm_prep(int64_t K, const Float* lA, const Float* lpi, const Float* lf, double* A, double* AT,
                         double* pi, double* f, double* consts, FsaCheck* check) {
  GRID_LOOP(i, 1) {
    const Float* src[3] = {lA, lpi, lf};
    double* dst[3] = {A, pi, f};
    int64_t n[3] = {K * K, K, K};
    consts[3] = 0.0;
    for (int q = 0; q < 3; ++q) {
      double m;
      if (hmm_checked_max(src[q], n[q], &m, check, HmmParamReport{q})) consts[3] = 1.0;
      hmm_exp_row(src[q], n[q], m, dst[q]);
      consts[q] = m > -INFINITY ? m : 0.0;
    }
    for (int64_t a = 0; a < K; ++a)
      for (int64_t b = 0; b < K; ++b) AT[b * K + a] = A[a * K + b];
  }
}

struct HmmParams {
  int64_t T, B, K;
  const Float *le, *lA, *lpi, *lf;
  const int32_t* seq_len;
  const double *A, *AT, *pi, *f, *consts;
  double *alpha, *c, *status;
  FsaCheck* check;
};

struct HmmEmissionReport {
  int64_t t, b;
  DEV_FUNC void operator()(FsaCheck* c, int64_t k) const {
    fsa_fail(c, FSA_CHECK_SCORE_INFINITE, t, b, k, INFINITY);
  }
};

// ---------------------------------------------------------------- log-space fallback
// Forward for sequence b, writing log alpha_t into alpha[t, b, :]; returns log p.
DEV_FUNC double hmm_log_forward_seq(const HmmParams& p, int64_t b) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b];
  for (int64_t t = 0; t < len; ++t) {
    const Float* et = p.le + (t * B + b) * K;
    double* la = p.alpha + (t * B + b) * K;
    const double* prev = p.alpha + ((t > 0 ? t - 1 : 0) * B + b) * K;
    for (int64_t j = 0; j < K; ++j) {
      double v;
      if (t == 0) {
        v = (double)p.lpi[j];
      } else {
        double m = -INFINITY;
        for (int64_t i = 0; i < K; ++i) m = fmax(m, prev[i] + (double)p.lA[i * K + j]);
        double s = 0.0;
        if (m > -INFINITY)
          for (int64_t i = 0; i < K; ++i) s += exp(prev[i] + (double)p.lA[i * K + j] - m);
        v = m > -INFINITY ? m + log(s) : -INFINITY;
      }
      la[j] = v + (double)et[j];
    }
  }
  return hmm_lse2(p.alpha + ((len - 1) * B + b) * K, p.lf, K);
}

DEF_KERNEL void hmm_log_forward(HmmParams p, double* ll) {
  GRID_LOOP(b, p.B) {
    if (p.status[b] != HMM_LOG_SPACE) continue;
    // the scaled pass stopped early: the frames after it may hold a NaN
    const Float* le_b = p.le + b * p.K;
    bool has_nan = false;
    for (int64_t t = 0; t < p.seq_len[b] && !has_nan; ++t) {
      for (int64_t k = 0; k < p.K; ++k) {
        double v = (double)le_b[t * p.B * p.K + k];
        has_nan |= v != v;
        if (v == INFINITY) fsa_fail(p.check, FSA_CHECK_SCORE_INFINITE, t, b, k, v);
      }
    }
    if (has_nan) {
      p.status[b] = HMM_NAN;
      continue;
    }
    double v = hmm_log_forward_seq(p, b);
    ll[b] = v;
    if (!(v > -INFINITY)) p.status[b] = HMM_NO_PATH;
  }
}

// Backward for sequence b in log space; adds the gradients (scaled by g) to dle, dA (direct,
// not multiplied by A), dpi, df.  lb: 2K scratch.
DEV_FUNC void hmm_log_backward_seq(const HmmParams& p, int64_t b, double g, double* lb, Float* dle, double* dA,
                                   double* dpi, double* df) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b];
  double* cur = lb;
  double* nxt = lb + K;
  for (int64_t k = 0; k < K; ++k) cur[k] = (double)p.lf[k];
  for (int64_t t = len - 1; t >= 0; --t) {
    const double* la = p.alpha + (t * B + b) * K;
    double z = hmm_lse2(la, cur, K);
    Float* d = dle + (t * B + b) * K;
    for (int64_t k = 0; k < K; ++k) {
      double gam = g * exp(la[k] + cur[k] - z);
      d[k] = (Float)gam;
      if (t == 0) elem_atomic_add(dpi + k, gam);
      if (t == len - 1) elem_atomic_add(df + k, gam);
    }
    if (t == 0) break;
    const Float* et = p.le + (t * B + b) * K;
    const double* lap = p.alpha + ((t - 1) * B + b) * K;
    for (int64_t j = 0; j < K; ++j) nxt[j] = (double)et[j] + cur[j];  // w_j
    for (int64_t i = 0; i < K; ++i) {
      double m = -INFINITY;
      for (int64_t j = 0; j < K; ++j) m = fmax(m, (double)p.lA[i * K + j] + nxt[j]);
      double s = 0.0;
      for (int64_t j = 0; j < K; ++j) {
        double v = (double)p.lA[i * K + j] + nxt[j];
        if (m > -INFINITY) s += exp(v - m);
        double xi = lap[i] + v - z;
        if (xi > -INFINITY) elem_atomic_add(dA + i * K + j, g * exp(xi));
      }
      cur[i] = m > -INFINITY ? m + log(s) : -INFINITY;  // cur is free again: becomes lb_{t-1}
    }
  }
}

DEF_KERNEL void hmm_log_backward(HmmParams p, const Float* g, double* lb, Float* dle, double* dA, double* dpi,
                                 double* df) {
  GRID_LOOP(b, p.B) {
    if (p.status[b] != HMM_LOG_SPACE || p.seq_len[b] == 0) continue;
    hmm_log_backward_seq(p, b, (double)g[b], lb + b * 2 * p.K, dle, dA, dpi, df);
  }
}

// Sequences of length 0: the empty series has probability 1 (no state, so neither pi nor f applies); NaN in the
// shared parameters makes every other sequence NaN.
DEF_KERNEL void hmm_init_status(HmmParams p, double* ll) {
  GRID_LOOP(b, p.B) {
    ll[b] = 0.0;
    p.status[b] = p.seq_len[b] > 0 && p.consts[3] != 0.0 ? HMM_NAN : HMM_SCALED;
  }
}

// ---------------------------------------------------------------- scaled forward
// Step t of sequence b given pred = alpha_{t-1} A (or pi): E_t, alpha_t, c_t.  Returns the sequence's new
// status: HMM_SCALED, HMM_LOG_SPACE if the step mass underflowed, HMM_NAN for a NaN emission.
// Et: K scratch for E_t.
DEV_FUNC inline int hmm_fwd_step(const HmmParams& p, int64_t t, int64_t b, const double* __restrict__ pred,
                                 double* __restrict__ Et, double* ll) {
  const int64_t B = p.B, K = p.K, tb = t * B + b;
  const Float* et = p.le + tb * K;
  double* __restrict__ at = p.alpha + tb * K;
  double m;
  if (hmm_checked_max(et, K, &m, p.check, HmmEmissionReport{t, b})) return HMM_NAN;
  hmm_exp_row(et, K, m, Et);
  double s0 = 0.0, s1 = 0.0;
  int64_t k = 0;
  for (; k + 1 < K; k += 2) {
    at[k] = pred[k] * Et[k];
    at[k + 1] = pred[k + 1] * Et[k + 1];
    s0 += at[k];
    s1 += at[k + 1];
  }
  if (k < K) {
    at[k] = pred[k] * Et[k];
    s0 += at[k];
  }
  double s = s0 + s1;
  p.c[tb] = s;
  if (!(s >= HMM_TINY)) return HMM_LOG_SPACE;
  double inv = 1.0 / s;
#if !CUDA
#pragma GCC ivdep
#endif
  for (k = 0; k < K; ++k) at[k] *= inv;
  *ll += log(s) + m + (t == 0 ? p.consts[1] : p.consts[0]);
  return HMM_SCALED;
}

DEV_FUNC inline void hmm_fwd_final(const HmmParams& p, int64_t b, double* ll) {
  const int64_t K = p.K, len = p.seq_len[b];
  const double* a = p.alpha + ((len - 1) * p.B + b) * K;
  double s = 0.0;
  for (int64_t k = 0; k < K; ++k) s += a[k] * p.f[k];
  if (s >= HMM_TINY)
    ll[b] += log(s) + p.consts[2];
  else
    p.status[b] = HMM_LOG_SPACE;
}

#if !CUDA
typedef double hmm_v4d __attribute__((vector_size(32)));

// out[j0 + 0..4*NB) = sum_i x[i] M[i, j0 + ...] with the 4*NB accumulators in registers.
template <int NB>
static inline void hmm_matvec_block(const double* __restrict__ x, int64_t n, const double* __restrict__ M, int64_t ld,
                                    double* __restrict__ out) {
  hmm_v4d acc[NB];
  for (int q = 0; q < NB; ++q) acc[q] = hmm_v4d{0.0, 0.0, 0.0, 0.0};
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[i];
    const hmm_v4d xv = {xi, xi, xi, xi};
    const double* row = M + i * ld;
    for (int q = 0; q < NB; ++q) {
      hmm_v4d r;
      memcpy(&r, row + 4 * q, sizeof(r));
      acc[q] += xv * r;
    }
  }
  for (int q = 0; q < NB; ++q) memcpy(out + 4 * q, &acc[q], sizeof(hmm_v4d));
}

// out (ld entries) = x (n entries) . M, M being n x ld row-major with ld a multiple of 4.
static inline void hmm_matvec(const double* __restrict__ x, int64_t n, const double* __restrict__ M, int64_t ld,
                              double* __restrict__ out) {
  int64_t j0 = 0;
  for (; j0 + 16 <= ld; j0 += 16) hmm_matvec_block<4>(x, n, M + j0, ld, out + j0);
  switch ((ld - j0) / 4) {
    case 3: hmm_matvec_block<3>(x, n, M + j0, ld, out + j0); break;
    case 2: hmm_matvec_block<2>(x, n, M + j0, ld, out + j0); break;
    case 1: hmm_matvec_block<1>(x, n, M + j0, ld, out + j0); break;
    default: break;
  }
}

// src (K x K) into dst (K x Kp), zero-padded columns.
static void hmm_pad(const double* src, int64_t K, int64_t Kp, double* dst) {
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < Kp; ++j) dst[i * Kp + j] = j < K ? src[i * K + j] : 0.0;
}

// The scaled forward on the CPU: time outer, batch inner (the (T, B, K) arrays are streamed
// in order); per (t, b) one register-blocked K x K matrix-vector product.
static void hmm_forward_cpu(ptn::Scratch& scratch, const HmmParams& p, double* ll) {
  const int64_t T = p.T, B = p.B, K = p.K, Kp = (K + 3) / 4 * 4;
  double* Ap = scratch.get<double>(K * Kp);
  double* pred = scratch.get<double>(Kp);
  double* Et = scratch.get<double>(K);
  hmm_pad(p.A, K, Kp, Ap);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      if (t >= p.seq_len[b] || p.status[b] != HMM_SCALED) continue;
      if (t > 0) hmm_matvec(p.alpha + ((t - 1) * B + b) * K, K, Ap, Kp, pred);
      p.status[b] = hmm_fwd_step(p, t, b, t == 0 ? p.pi : pred, Et, ll + b);
    }
  }
  for (int64_t b = 0; b < B; ++b)
    if (p.seq_len[b] > 0 && p.status[b] == HMM_SCALED) hmm_fwd_final(p, b, ll);
}
#else
DEF_KERNEL void hmm_fwd_step_kernel(HmmParams p, int64_t t, const double* pred, double* E, double* ll) {
  GRID_LOOP(b, p.B) {
    if (t >= p.seq_len[b] || p.status[b] != HMM_SCALED) continue;
    p.status[b] = hmm_fwd_step(p, t, b, t == 0 ? p.pi : pred + b * p.K, E + b * p.K, ll + b);
  }
}

DEF_KERNEL void hmm_fwd_final_kernel(HmmParams p, double* ll) {
  GRID_LOOP(b, p.B) {
    if (p.seq_len[b] > 0 && p.status[b] == HMM_SCALED) hmm_fwd_final(p, b, ll);
  }
}

// Rows of sequences that are done or have left the scaled pass are zero (the GEMM then adds
// nothing for them; their alpha_{t} slot is not read by the scaled pass).
static void hmm_forward_cuda(ptn::Scratch& scratch, const HmmParams& p, double* ll) {
  double* pred = scratch.get<double>(p.B * p.K);
  double* E = scratch.get<double>(p.B * p.K);
  for (int64_t t = 0; t < p.T; ++t) {
    if (t > 0) affine_raw(p.alpha + (t - 1) * p.B * p.K, p.B, p.K, p.A, p.K, p.K, pred, p.B, p.K, false, false, 0.0);
    start_dev_kernel(hmm_fwd_step_kernel, (p, t, pred, E, ll));
  }
  start_dev_kernel(hmm_fwd_final_kernel, (p, ll));
}
#endif

static FsaTerms hmm_terms(const HmmParams& p) {
  FsaTerms t;
  memset(&t, 0, sizeof(t));
  t.fn = "hmm_log_likelihood";
  t.scores = "log_emissions";
  t.mask = "mask";
  t.T = p.T;
  t.B = p.B;
  t.D = p.K;
  return t;
}

// `a` has shape `want`, else a ValueError in the user's terms.
static void hmm_check_shape(const FsaTerms& terms, const Ndarray* a, const char* name, int64_t d0, int64_t d1,
                            const char* want) {
  bool ok = a->dims[0] == d0 && (a->ndim < 2 || a->dims[1] == d1);
  if (ok) return;
  std::ostringstream s;
  s << name << " must have shape " << want << ", got (" << a->dims[0];
  if (a->ndim > 1) s << ", " << a->dims[1];
  s << (a->ndim == 1 ? ",)" : ")") << " (log_emissions has shape (" << terms.T << ", " << terms.B << ", " << terms.D
    << "))";
  fsa_require(false, terms, s.str());
}

static HmmParams hmm_setup(ptn::Scratch& scratch, Ndarray** inputs) {
  Ndarray *le = inputs[0], *lA = inputs[1], *lpi = inputs[2], *lf = inputs[3], *mask = inputs[4];
  HmmParams p;
  p.T = Ndarray_DIMS(le)[0];
  p.B = Ndarray_DIMS(le)[1];
  p.K = Ndarray_DIMS(le)[2];
  const FsaTerms terms = hmm_terms(p);
  hmm_check_shape(terms, lA, "log_transitions", p.K, p.K, "(K, K)");
  hmm_check_shape(terms, lpi, "log_initial", p.K, 0, "(K,)");
  hmm_check_shape(terms, lf, "log_final", p.K, 0, "(K,)");
  hmm_check_shape(terms, mask, "mask", p.T, p.B, "(T, B)");
  p.le = Ndarray_DEV_DATA(le);
  p.lA = Ndarray_DEV_DATA(lA);
  p.lpi = Ndarray_DEV_DATA(lpi);
  p.lf = Ndarray_DEV_DATA(lf);
  int32_t* seq_len = scratch.get<int32_t>(p.B);
  double* A = scratch.get<double>(p.K * p.K);
  double* AT = scratch.get<double>(p.K * p.K);
  double* pi = scratch.get<double>(p.K);
  double* f = scratch.get<double>(p.K);
  double* consts = scratch.get<double>(4);
  p.check = scratch.get<FsaCheck>(1);
  Ndarray_memset(p.check, 0, sizeof(FsaCheck));
  start_dev_kernel(fsa_mask_lengths, (p.T, p.B, Ndarray_DEV_DATA(mask), seq_len, p.check));
  start_dev_kernel(hmm_prep, (p.K, p.lA, p.lpi, p.lf, A, AT, pi, f, consts, p.check));
  fsa_raise_check(p.check, terms);
  p.seq_len = seq_len;
  p.A = A;
  p.AT = AT;
  p.pi = pi;
  p.f = f;
  p.consts = consts;
  return p;
}

DEF_KERNEL void hmm_store_ll(int64_t n_batch, const double* ll, const double* status, Float* out) {
  GRID_LOOP(b, n_batch) {
    out[b] = status[b] == HMM_NO_PATH ? (Float)-INFINITY : status[b] == HMM_NAN ? (Float)NAN_F : (Float)ll[b];
  }
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B)
// outputs: log_likelihood (B); hidden: alpha (T,B,K), c (T,B), status (B), all double
static void hmm_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 4);
  ptn::Scratch scratch;
  HmmParams p = hmm_setup(scratch, inputs);
  if (p.B == 0) return;
  p.alpha = (double*)(*outputs[1])->data;
  p.c = (double*)(*outputs[2])->data;
  p.status = (double*)(*outputs[3])->data;  // zero-filled: HMM_SCALED
  double* ll = scratch.get<double>(p.B);
  start_dev_kernel(hmm_init_status, (p, ll));
#if CUDA
  hmm_forward_cuda(scratch, p, ll);
#else
  hmm_forward_cpu(scratch, p, ll);
#endif
  fsa_raise_check(p.check, hmm_terms(p));  // +inf log-emissions
  start_dev_kernel(hmm_log_forward, (p, ll));
  fsa_raise_check(p.check, hmm_terms(p));
  start_dev_kernel(hmm_store_ll, (p.B, ll, p.status, Ndarray_DEV_DATA(*outputs[0])));
  HANDLE_LAST_ERROR();
}

// ---------------------------------------------------------------- scaled backward
// Per sequence, from t = len-1 down: beta_t (renormalised; starts as f), z = alpha_t . beta_t,
// gamma_t = alpha_t beta_t / z -> d log e_t (and d log pi at t = 0, d log f at len-1);
// with v = E_t beta_t: U += alpha_{t-1}^T v g / (c_t z) (expected transitions / A) and
// beta_{t-1} = A v.
#if !CUDA
static void hmm_backward_cpu(ptn::Scratch& scratch, const HmmParams& p, const Float* g, Float* dle,
                             double* __restrict__ U, double* dpi, double* df) {
  const int64_t T = p.T, B = p.B, K = p.K, Kp = (K + 3) / 4 * 4;
  double* __restrict__ beta_all = scratch.get<double>(B * Kp);
  double* __restrict__ Et = scratch.get<double>(K);
  // U += X^T V over buffered rows (one small GEMM per HMM_ROWS steps instead of K rank-1 updates)
  const int64_t HMM_ROWS = 256;
  double* Xbuf = scratch.get<double>(HMM_ROWS * K);
  double* Vbuf = scratch.get<double>(HMM_ROWS * K);
  int64_t n_rows = 0;
  double* ATp = scratch.get<double>(K * Kp);
  hmm_pad(p.AT, K, Kp, ATp);
  const int64_t step = B * K;
  for (int64_t t = T - 1; t >= 0; --t) {
    if (t >= 3) {  // the backward streams run downwards: prefetch a few steps ahead
      const char* le_ahead = (const char*)(p.le + (t - 2) * step);
      const char* a_ahead = (const char*)(p.alpha + (t - 3) * step);
      const char* d_ahead = (const char*)(dle + (t - 2) * step);
      for (int64_t off = 0; off < step * (int64_t)sizeof(Float); off += 64) {
        __builtin_prefetch(le_ahead + off);
        __builtin_prefetch(d_ahead + off, 1);
      }
      for (int64_t off = 0; off < step * (int64_t)sizeof(double); off += 64) __builtin_prefetch(a_ahead + off);
    }
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = p.seq_len[b];
      const double gb = (double)g[b];
      if (t >= len || p.status[b] != HMM_SCALED || gb == 0.0) continue;
      double* __restrict__ beta = beta_all + b * Kp;
      if (t == len - 1)
        for (int64_t k = 0; k < K; ++k) beta[k] = p.f[k];
      const int64_t tb = t * B + b;
      const double* __restrict__ at = p.alpha + tb * K;
      double z = 0.0;
      for (int64_t k = 0; k < K; ++k) z += at[k] * beta[k];
      if (!(z > 0.0)) continue;  // cannot happen after a successful forward pass
      const double r = gb / z;
      Float* __restrict__ d = dle + tb * K;
      for (int64_t k = 0; k < K; ++k) d[k] = (Float)(at[k] * beta[k] * r);
      if (t == len - 1)
        for (int64_t k = 0; k < K; ++k) df[k] += at[k] * beta[k] * r;
      if (t == 0) {
        for (int64_t k = 0; k < K; ++k) dpi[k] += at[k] * beta[k] * r;
        continue;
      }
      double m;
      hmm_checked_max(p.le + tb * K, K, &m, (FsaCheck*)0, HmmEmissionReport{t, b});
      hmm_exp_row(p.le + tb * K, K, m, Et);
      double* __restrict__ v = Vbuf + n_rows * K;
      double* __restrict__ X = Xbuf + n_rows * K;
#pragma GCC ivdep
      for (int64_t k = 0; k < K; ++k) v[k] = Et[k] * beta[k];
      const double* __restrict__ ap = p.alpha + (tb - B) * K;
      const double x = r / p.c[tb];
#pragma GCC ivdep
      for (int64_t k = 0; k < K; ++k) X[k] = ap[k] * x;
      hmm_matvec(v, K, ATp, Kp, beta);  // beta_{t-1} = A v
      if (++n_rows == HMM_ROWS) {
        affine_raw(Xbuf, n_rows, K, Vbuf, n_rows, K, U, K, K, true, false, 1.0);
        n_rows = 0;
      }
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) s += beta[k];
      const double inv = s > 0.0 ? 1.0 / s : 0.0;
#pragma GCC ivdep
      for (int64_t k = 0; k < K; ++k) beta[k] *= inv;
    }
  }
  if (n_rows > 0) affine_raw(Xbuf, n_rows, K, Vbuf, n_rows, K, U, K, K, true, false, 1.0);
}
#else
DEF_KERNEL void hmm_bw_gamma(HmmParams p, int64_t t, const Float* g, double* beta, double* z, Float* dle, double* dpi,
                             double* df) {
  GRID_LOOP(b, p.B) {
    const int64_t K = p.K, len = p.seq_len[b], tb = t * p.B + b;
    double* bb = beta + b * K;
    z[b] = 0.0;
    if (t >= len || p.status[b] != HMM_SCALED) continue;
    if (t == len - 1)
      for (int64_t k = 0; k < K; ++k) bb[k] = p.f[k];
    const double* at = p.alpha + tb * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += at[k] * bb[k];
    z[b] = s;
    double r = s > 0.0 ? (double)g[b] / s : 0.0;
    for (int64_t k = 0; k < K; ++k) {
      double gam = at[k] * bb[k] * r;
      dle[tb * K + k] = (Float)gam;
      if (t == 0) elem_atomic_add(dpi + k, gam);
      if (t == len - 1) elem_atomic_add(df + k, gam);
    }
  }
}

// v = E_t beta_t; X = alpha_{t-1} g / (c_t z_t) (both 0 for rows not in the scaled pass at t).
DEF_KERNEL void hmm_bw_rows(HmmParams p, int64_t t, const Float* g, const double* beta, const double* z, double* v,
                            double* X) {
  GRID_LOOP(b, p.B) {
    const int64_t K = p.K, tb = t * p.B + b;
    bool ok = t < p.seq_len[b] && p.status[b] == HMM_SCALED && z[b] > 0.0;
    double r = ok ? (double)g[b] / (p.c[tb] * z[b]) : 0.0;
    double m = -INFINITY;
    if (ok) hmm_checked_max(p.le + tb * K, K, &m, (FsaCheck*)0, HmmEmissionReport{t, b});
    for (int64_t k = 0; k < K; ++k) {
      v[b * K + k] = ok ? fsa_exp((double)p.le[tb * K + k] - m) * beta[b * K + k] : 0.0;
      X[b * K + k] = ok ? p.alpha[(tb - p.B) * K + k] * r : 0.0;
    }
  }
}

DEF_KERNEL void hmm_bw_norm(int64_t n_batch, int64_t K, double* beta) {
  GRID_LOOP(b, n_batch) {
    double* bb = beta + b * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += bb[k];
    double inv = s > 0.0 ? 1.0 / s : 0.0;
    for (int64_t k = 0; k < K; ++k) bb[k] *= inv;
  }
}

static void hmm_backward_cuda(ptn::Scratch& scratch, const HmmParams& p, const Float* g, Float* dle, double* U,
                              double* dpi, double* df) {
  const int64_t B = p.B, K = p.K;
  double* beta = scratch.get<double>(B * K);
  double* v = scratch.get<double>(B * K);
  double* X = scratch.get<double>(B * K);
  double* z = scratch.get<double>(B);
  Ndarray_memset(beta, 0, B * K * sizeof(double));
  for (int64_t t = p.T - 1; t >= 0; --t) {
    start_dev_kernel(hmm_bw_gamma, (p, t, g, beta, z, dle, dpi, df));
    if (t == 0) break;
    start_dev_kernel(hmm_bw_rows, (p, t, g, beta, z, v, X));
    affine_raw(X, B, K, v, B, K, U, K, K, true, false, 1.0);          // U += X^T v
    affine_raw(v, B, K, p.A, K, K, beta, B, K, false, true, 0.0);     // beta_{t-1} = v A^T
    start_dev_kernel(hmm_bw_norm, (B, K, beta));
  }
}
#endif

// NaN sequences: NaN emission gradient on their valid frames; any_nan[0] = 1 if there is one.
DEF_KERNEL void hmm_bw_nan(HmmParams p, Float* dle, int32_t* any_nan) {
  const int64_t n = p.T * p.B * p.K;
  GRID_LOOP(i, n + 1) {
    if (i == n) {
      any_nan[0] = 0;
      for (int64_t b = 0; b < p.B; ++b) any_nan[0] |= p.status[b] == HMM_NAN;
      continue;
    }
    int64_t b = (i / p.K) % p.B, t = i / (p.K * p.B);
    if (p.status[b] == HMM_NAN && t < p.seq_len[b]) dle[i] = (Float)NAN_F;
  }
}

DEF_KERNEL void hmm_bw_store(int64_t K, const double* U, const double* A, const double* dA_log, const double* dpi,
                             const double* df, const int32_t* any_nan, Float* dA, Float* dpi_out, Float* df_out) {
  GRID_LOOP(i, K * K) {
    const Float nan = (Float)NAN_F;
    dA[i] = any_nan[0] ? nan : (Float)(U[i] * A[i] + dA_log[i]);
    if (i < K) {
      dpi_out[i] = any_nan[0] ? nan : (Float)dpi[i];
      df_out[i] = any_nan[0] ? nan : (Float)df[i];
    }
  }
}

// inputs: log_emissions, log_transitions, log_initial, log_final, mask, alpha, c, status (the
// forward op's hidden outputs), D_log_likelihood (B)
// outputs: d log_emissions (T,B,K), d log_transitions (K,K), d log_initial (K), d log_final (K)
static void hmm_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 9);
  assert_cmp(n_outputs, ==, 4);
  ptn::Scratch scratch;
  HmmParams p = hmm_setup(scratch, inputs);
  const int64_t T = p.T, B = p.B, K = p.K;
  assert_cmp(Ndarray_DIMS(inputs[8])[0], ==, B);
  if (B == 0) return;
  assert_cmp(Ndarray_DIMS(inputs[5])[0], ==, T);
  assert_cmp(Ndarray_DIMS(inputs[5])[1], ==, B);
  assert_cmp(Ndarray_DIMS(inputs[5])[2], ==, K);
  assert_cmp(Ndarray_DIMS(inputs[6])[0], ==, T);
  assert_cmp(Ndarray_DIMS(inputs[6])[1], ==, B);
  assert_cmp(Ndarray_DIMS(inputs[7])[0], ==, B);
  p.alpha = (double*)inputs[5]->data;
  p.c = (double*)inputs[6]->data;
  p.status = (double*)inputs[7]->data;
  const Float* g = Ndarray_DEV_DATA(inputs[8]);
  double* U = scratch.get<double>(K * K);
  double* dA_log = scratch.get<double>(K * K);
  double* dpi = scratch.get<double>(K);
  double* df = scratch.get<double>(K);
  Ndarray_memset(U, 0, K * K * sizeof(double));
  Ndarray_memset(dA_log, 0, K * K * sizeof(double));
  Ndarray_memset(dpi, 0, K * sizeof(double));
  Ndarray_memset(df, 0, K * sizeof(double));
  Float* dle = Ndarray_DEV_DATA(*outputs[0]);
#if CUDA
  hmm_backward_cuda(scratch, p, g, dle, U, dpi, df);
#else
  hmm_backward_cpu(scratch, p, g, dle, U, dpi, df);
#endif
  HANDLE_LAST_ERROR();
  start_dev_kernel(hmm_log_backward, (p, g, scratch.get<double>(B * 2 * K), dle, dA_log, dpi, df));
  int32_t* any_nan = scratch.get<int32_t>(1);
  start_dev_kernel(hmm_bw_nan, (p, dle, any_nan));
  start_dev_kernel(hmm_bw_store, (K, U, p.A, dA_log, dpi, df, any_nan, Ndarray_DEV_DATA(*outputs[1]),
                                  Ndarray_DEV_DATA(*outputs[2]), Ndarray_DEV_DATA(*outputs[3])));
  HANDLE_LAST_ERROR();
}
