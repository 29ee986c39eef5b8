// Forward filtering, backward sampling (see hmm_sample.cu), shared by the shared-parameter op (hmm_sample.cu) and the
// batched / time-varying one (hmm_varying_sample.cu): the draw from a vector of weights, the uniforms' checks, and
// one sequence's path given the filter's steps.
#ifndef PTNATIVE_HMM_HMM_SAMPLE_H
#define PTNATIVE_HMM_HMM_SAMPLE_H

#include "../dialect/kernel.h"

#include "hmm_infer.h"

// The state drawn from weights w (K) with uniform u; -1 if no weight is positive.
DEV_FUNC inline int32_t hmm_sample_pick(const double* w, int64_t K, double u) {
  double total = 0.0;
  int32_t last = -1;
  for (int64_t k = 0; k < K; ++k) {
    total += w[k];
    if (w[k] > 0.0) last = (int32_t)k;
  }
  if (last < 0) return -1;
  const double target = u * total;
  double acc = 0.0;
  for (int64_t k = 0; k < K; ++k) {
    acc += w[k];
    if (acc > target && w[k] > 0.0) return (int32_t)k;
  }
  return last;
}

DEF_KERNEL void hmm_sample_check(HmmInferParams p, const Float* uniforms) {
  GRID_LOOP(b, p.B) {
    for (int64_t t = 0; t < p.seq_len[b]; ++t) {
      double u = (double)uniforms[t * p.B + b];
      if (!(u >= 0.0 && u < 1.0)) fsa_fail(p.check, HMM_CHECK_UNIFORM, t, b, 0, u);
    }
  }
}

// Sequence b: its path (T, B) int32, -1 on padded frames and everywhere without a path or with a NaN; the filter
// with `steps` (first, next, and matrix(t, b): the shifted exps (K x K) of the matrix into frame t) into alpha, c, m;
// w: Kp doubles.
template <typename Steps>
DEV_FUNC void hmm_sample_seq(const HmmInferParams& p, const Steps& steps, const Float* uniforms, double* alpha,
                             double* c, double* m, double* w, int32_t* path, int64_t b) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b];
  for (int64_t t = 0; t < p.T; ++t) path[t * B + b] = -1;
  if (len == 0 || p.status[b] != HMM_SCALED) return;
  if (hmm_infer_filter(p, b, alpha, c, m, w, p.f, steps) != HMM_SCALED) return;
  const double* al = alpha + ((len - 1) * B + b) * K;
  for (int64_t k = 0; k < K; ++k) w[k] = al[k] * p.f[k];
  int32_t z = hmm_sample_pick(w, K, (double)uniforms[(len - 1) * B + b]);
  path[(len - 1) * B + b] = z;
  for (int64_t t = len - 2; t >= 0 && z >= 0; --t) {
    const double* at = alpha + (t * B + b) * K;
    const double* A = steps.matrix(t + 1, b);
    for (int64_t i = 0; i < K; ++i) w[i] = at[i] * A[i * K + z];
    z = hmm_sample_pick(w, K, (double)uniforms[t * B + b]);
    path[t * B + b] = z;
  }
}

// Input `u` of `fn`, the uniforms (T, B): its shape and its values on the valid frames checked (ValueError).
static const Float* hmm_sample_uniforms(const HmmInferParams& p, Ndarray* u, const char* fn) {
  const FsaTerms terms = hmm_model_terms(fn, p.T, p.B, p.K);
  hmm_check_shape(terms, u, "uniforms", p.T, p.B, "(T, B)");
  if (p.B == 0) return Ndarray_DEV_DATA(u);
  start_dev_kernel(hmm_sample_check, (p, Ndarray_DEV_DATA(u)));
  hmm_infer_raise(p.check, terms);
  return Ndarray_DEV_DATA(u);
}

#endif  // PTNATIVE_HMM_HMM_SAMPLE_H
