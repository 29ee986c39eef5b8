// State paths of a dense K-state HMM with batched or time-varying transitions and batched initial weights (the
// parameters as hmm_varying.h takes them) drawn from p(z | x) by forward filtering, backward sampling, driven by
// uniforms (T, B) in [0, 1): hmm_sample.cu's draws (hmm_sample.h) with the matrix of each frame.
//
// Padded frames get -1, as do all frames of a sequence with a NaN (on a valid frame, in log_final, or in a matrix
// or initial row it uses) or without a path.  A uniform outside [0, 1) on a valid frame raises.
#include "../dialect/kernel.h"

#include "hmm_varying.h"
#include "hmm_sample.h"

DEF_KERNEL void hmm_var_sample_kernel(HmmInferParams p, HmmVarying v, const Float* uniforms, double* alpha,
                                      double* c, double* m, double* work, int32_t* path) {
  GRID_LOOP(b, p.B) {
    hmm_sample_seq(p, HmmVaryingSteps{&p, &v}, uniforms, alpha, c, m, work + b * p.Kp, path, b);
  }
}

// inputs: log_emissions (T,B,K), log_transitions (Ta,Ba,K,K), log_initial (Bp,K), log_final (K), mask (T,B),
// uniforms (T,B); outputs: path (T,B) int32
static void hmm_varying_sample_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmVarCall call("hmm_sample_states", inputs, n_inputs, 6, n_outputs, 1);
  const HmmInferParams& p = call.p;
  HmmScratch& scratch = call.scratch;
  const Float* u = hmm_sample_uniforms(p, inputs[5], "hmm_sample_states");
  if (p.B == 0) return;
  const int64_t n = p.T * p.B;
  start_dev_kernel(hmm_var_sample_kernel, (p, call.v, u, scratch.get<double>(n * p.K), scratch.get<double>(n),
                                           scratch.get<double>(n), scratch.get<double>(p.B * p.Kp),
                                           Ndarray_DEV_DATA_int32(*outputs[0])));
  HANDLE_LAST_ERROR();
}
