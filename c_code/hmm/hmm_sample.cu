// Dense K-state HMM: state paths drawn from p(z | x) by forward filtering, backward sampling, driven by uniforms
// (T, B) in [0, 1) that the caller draws (the op itself is deterministic).
//
// z_{T_b-1} has weights alpha_{T_b-1}(k) f(k), z_t given z_{t+1} the weights alpha_t(i) A(i, z_{t+1}); the state
// drawn with uniform u is the first k whose cumulative weight exceeds u times the total (the last state of
// positive weight if rounding leaves none).  Padded frames get -1, as do all frames of a sequence with a NaN input
// or without a path.  A uniform outside [0, 1) on a valid frame raises.
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

DEF_KERNEL void hmm_sample_kernel(HmmInferParams p, const Float* uniforms, double* alpha, double* c, double* m,
                                  double* work, int32_t* path) {
  GRID_LOOP(b, p.B) {
    const int64_t B = p.B, K = p.K, len = p.seq_len[b];
    double* w = work + b * p.Kp;
    for (int64_t t = 0; t < p.T; ++t) path[t * B + b] = -1;
    if (len == 0 || p.status[b] != HMM_SCALED) continue;
    if (hmm_infer_filter(p, b, alpha, c, m, w, p.f, HmmSharedSteps{&p}) != HMM_SCALED) continue;
    const double* al = alpha + ((len - 1) * B + b) * K;
    for (int64_t k = 0; k < K; ++k) w[k] = al[k] * p.f[k];
    int32_t z = hmm_sample_pick(w, K, (double)uniforms[(len - 1) * B + b]);
    path[(len - 1) * B + b] = z;
    for (int64_t t = len - 2; t >= 0 && z >= 0; --t) {
      const double* at = alpha + (t * B + b) * K;
      for (int64_t i = 0; i < K; ++i) w[i] = at[i] * p.A[i * K + z];
      z = hmm_sample_pick(w, K, (double)uniforms[t * B + b]);
      path[t * B + b] = z;
    }
  }
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B), uniforms (T,B)
// outputs: path (T,B) int32
static void hmm_sample_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmInferCall call("hmm_sample_states", inputs, n_inputs, 6, n_outputs, 1);
  const HmmInferParams& p = call.p;
  HmmScratch& scratch = call.scratch;
  const FsaTerms terms = hmm_model_terms("hmm_sample_states", p.T, p.B, p.K);
  hmm_check_shape(terms, inputs[5], "uniforms", p.T, p.B, "(T, B)");
  if (p.B == 0) return;
  const Float* u = Ndarray_DEV_DATA(inputs[5]);
  start_dev_kernel(hmm_sample_check, (p, u));
  hmm_infer_raise(p.check, terms);
  const int64_t n = p.T * p.B;
  start_dev_kernel(hmm_sample_kernel, (p, u, scratch.get<double>(n * p.K), scratch.get<double>(n),
                                       scratch.get<double>(n), scratch.get<double>(p.B * p.Kp),
                                       Ndarray_DEV_DATA_int32(*outputs[0])));
  HANDLE_LAST_ERROR();
}
