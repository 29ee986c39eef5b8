// The posteriors' per-sequence state and steps, shared by every path of hmm_posteriors.cu: the hidden filter's
// outputs (HmmPostState), the forward op's work memory (HmmPostWork), one step of the filter and of the backward
// recursion and the sequence's counts (see hmm_posteriors.cu for the math).
#ifndef PTNATIVE_HMM_HMM_POSTERIORS_STEPS_H
#define PTNATIVE_HMM_HMM_POSTERIORS_STEPS_H

#include "../dialect/kernel.h"

#include "hmm_exp8.h"
#include "hmm_infer.h"
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

#endif  // PTNATIVE_HMM_HMM_POSTERIORS_STEPS_H
