// Explicit-duration HMM: the state marginals p(z_t = k | x_b), the posteriors of the segments covering each frame
// (the gradient of log p(x_b) with respect to log_emissions: hsmm_seq_posteriors of hsmm_grad.h with the upstream
// gradient 1).  0 on padded frames and for a sequence without a path, NaN on the valid frames of a sequence with a
// NaN input.  One thread per sequence on CUDA, the batch split in parts over CPU threads.
#include "../dialect/kernel.h"

#include "hsmm_grad.h"
#include "hsmm_model.h"

DEF_KERNEL void hsmm_posteriors_kernel(HsmmModel m, double* work, double* gwork, Float* marginals, int64_t b0,
                                       int64_t b1) {
  GRID_LOOP(i, b1 - b0) hsmm_seq_posteriors(m, b0 + i, work, gwork, (Float)1.0, marginals);
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_durations (Bd,K,D), log_initial (Bp,K), mask (T,B),
// right_censored (host int32); output: marginals (T,B,K), every element written
static void hsmm_posteriors_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 1);
  ptn::Scratch scratch;
  const HsmmModel m = hsmm_model_setup(scratch, inputs, "hsmm_posteriors");
  if (m.B == 0) return;
  double* work = hsmm_work_alloc(scratch, m);
  double* gwork = hsmm_grad_work_alloc(scratch, m);
  HSMM_OVER_BATCH(m, hsmm_posteriors_kernel, m, work, gwork, Ndarray_DEV_DATA(*outputs[0]));
  HANDLE_LAST_ERROR();
}
