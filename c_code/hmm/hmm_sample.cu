// Dense K-state HMM: state paths drawn from p(z | x) by forward filtering, backward sampling, driven by uniforms
// (T, B) in [0, 1) that the caller draws (the op itself is deterministic).
//
// z_{T_b-1} has weights alpha_{T_b-1}(k) f(k), z_t given z_{t+1} the weights alpha_t(i) A(i, z_{t+1}); the state
// drawn with uniform u is the first k whose cumulative weight exceeds u times the total (the last state of
// positive weight if rounding leaves none).  Padded frames get -1, as do all frames of a sequence with a NaN input
// or without a path.  A uniform outside [0, 1) on a valid frame raises.
#include "../dialect/kernel.h"

#include "hmm_sample.h"

DEF_KERNEL void hmm_sample_kernel(HmmInferParams p, const Float* uniforms, double* alpha, double* c, double* m,
                                  double* work, int32_t* path) {
  GRID_LOOP(b, p.B) {
    hmm_sample_seq(p, HmmSharedSteps{&p}, uniforms, alpha, c, m, work + b * p.Kp, path, b);
  }
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B), uniforms (T,B)
// outputs: path (T,B) int32
static void hmm_sample_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmInferCall call("hmm_sample_states", inputs, n_inputs, 6, n_outputs, 1);
  const HmmInferParams& p = call.p;
  HmmScratch& scratch = call.scratch;
  const Float* u = hmm_sample_uniforms(p, inputs[5], "hmm_sample_states");
  if (p.B == 0) return;
  const int64_t n = p.T * p.B;
  start_dev_kernel(hmm_sample_kernel, (p, u, scratch.get<double>(n * p.K), scratch.get<double>(n),
                                       scratch.get<double>(n), scratch.get<double>(p.B * p.Kp),
                                       Ndarray_DEV_DATA_int32(*outputs[0])));
  HANDLE_LAST_ERROR();
}
