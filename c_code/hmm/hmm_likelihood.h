// The dense HMM likelihood's parameters (HmmParams) and the per-sequence steps both targets share: the log-space
// fallback (forward and backward of one sequence) and the scaled forward's step and final mass (hmm_fwd_step,
// hmm_fwd_final).  hmm.cu (the passes and the ops' bodies) and hmm_loglik_small.h build on them.
#ifndef PTNATIVE_HMM_HMM_LIKELIHOOD_H
#define PTNATIVE_HMM_HMM_LIKELIHOOD_H

#include "../dialect/kernel.h"

#include "hmm_model.h"
#include "hmm_gemm.h"
#include "hmm_exp8.h"
#include "hmm_kept.h"

#define HMM_TINY 1e-280  // a step mass below it underflowed: the sequence is recomputed in log space

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

struct HmmParams : HmmModel {
  double *alpha, *c, *status;
  double* E;  // CPU: the shifted emissions exp(log e_t - max_k log e_t(k)) (T, B, K), kept for the backward pass
  // CPU, sequences in lanes (hmm_lanes.h): alpha, E (groups, T, K, 8) and the step scalings (groups, T, 8) kept by
  // the gradient op's forward pass
  double *aL, *EL, *sL;
  bool lanes;
};

struct HmmEmissionReport {
  int64_t t, b;
  DEV_FUNC void operator()(FsaCheck* c, int64_t k) const {
    fsa_fail(c, FSA_CHECK_SCORE_INFINITE, t, b, k, INFINITY);
  }
};

// ---------------------------------------------------------------- log-space fallback
// The running maximum of the log-space loops below: fmax, except on aarch64, where GCC 12 vectorises an fmax
// reduction over floats widened to double (Float = float) as an FMAX reduction and then stops with an internal
// compiler error (in vect_transform_reduction, at tree-vect-loop.cc:7457).  The comparison gives the same value:
// m never holds a NaN, and a NaN v keeps m, as fmax does.
DEV_FUNC inline double hmm_running_max(double m, double v) {
#if defined(__aarch64__)
  return v > m ? v : m;
#else
  return fmax(m, v);
#endif
}

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
        for (int64_t i = 0; i < K; ++i) m = hmm_running_max(m, prev[i] + (double)p.lA[i * K + j]);
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
      for (int64_t j = 0; j < K; ++j) m = hmm_running_max(m, (double)p.lA[i * K + j] + nxt[j]);
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
// Step t of sequence b given pred = alpha_{t-1} A (or pi): E_t, alpha_t, c_t (into *ct).  Returns the sequence's
// new status: HMM_SCALED, HMM_LOG_SPACE if the step mass underflowed, HMM_NAN for a NaN emission.
// Et: K scratch for E_t.
DEV_FUNC inline int hmm_fwd_step(const HmmParams& p, int64_t t, int64_t b, const double* __restrict__ pred,
                                 double* __restrict__ Et, double* ll, double* ct) {
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
  *ct = s;
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

#endif  // PTNATIVE_HMM_HMM_LIKELIHOOD_H
