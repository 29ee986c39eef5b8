// Explicit-duration HMM: the log-likelihood (hsmm_fw) and its gradients with respect to log_emissions,
// log_transitions, log_durations and log_initial (hsmm_bw: the forward recursion again, then the backward one), and
// both in one call (hsmm_fw_bw, HsmmLikelihoodWithGradOp: one forward recursion).
// Log space in double, O(T K (D + K)) per sequence; one thread per sequence on CUDA, the batch split in parts over
// CPU threads (hsmm_cpu_parts).  The model, the recursions and the gradients: hsmm_model.h, hsmm_grad.h.
#include "../dialect/kernel.h"

#include "hsmm_grad.h"
#include "hsmm_model.h"

// The log-likelihood of the sequences [b0, b1): 0 for the empty series, NaN for a NaN status.
DEF_KERNEL void hsmm_ll_kernel(HsmmModel m, double* work, Float* ll, int64_t b0, int64_t b1) {
  GRID_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i;
    if (m.seq_len[b] == 0) {
      ll[b] = (Float)0.0;
    } else if (m.status[b] == HSMM_NAN) {
      ll[b] = (Float)NAN_F;
    } else {
      ll[b] = (Float)hsmm_forward_seq<false>(m, b, hsmm_seq_work(m, work, b), nullptr, nullptr);
    }
  }
}

// Forward and backward passes of the sequences [b0, b1): their emission gradients (weighted by g_ll) and
// accumulators (hsmm_grad.h), and their log-likelihoods in ll unless it is null.
DEF_KERNEL void hsmm_grad_kernel(HsmmModel m, double* work, double* gwork, const Float* g_ll, Float* gle, Float* ll,
                                 int64_t b0, int64_t b1) {
  GRID_LOOP(i, b1 - b0) {
    const double v = hsmm_seq_posteriors(m, b0 + i, work, gwork, g_ll[b0 + i], gle);
    if (ll) ll[b0 + i] = (Float)v;
  }
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_durations (Bd,K,D), log_initial (Bp,K), mask (T,B),
// right_censored (host int32); output: log_likelihood (B)
static void hsmm_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 1);
  ptn::Scratch scratch;
  const HsmmModel m = hsmm_model_setup(scratch, inputs, "hsmm_log_likelihood");
  if (m.B == 0) return;
  double* work = hsmm_work_alloc(scratch, m);
  HSMM_OVER_BATCH(m, hsmm_ll_kernel, m, work, Ndarray_DEV_DATA(*outputs[0]));
  HANDLE_LAST_ERROR();
}

// The gradients (grads: log_emissions (T,B,K), log_transitions (K,K), log_durations (Bd,K,D), log_initial (Bp,K),
// every element written) of sum_b g_b log p(x_b), g = inputs[6] (B); the log-likelihoods in ll (B) unless null.
static void hsmm_gradients(Ndarray** inputs, Ndarray** grads, Ndarray* ll) {
  ptn::Scratch scratch;
  const HsmmModel m = hsmm_model_setup(scratch, inputs, "hsmm_log_likelihood");
  const bool censored = Ndarray_DEV_DATA_int32_scalar(inputs[5]) != 0;
  ptn::require_dim(inputs[6], "D_log_likelihood", 0, m.B, "B");
  const Float* g_ll = Ndarray_DEV_DATA(inputs[6]);
  if (m.B > 0) {
    double* work = hsmm_work_alloc(scratch, m);
    double* gwork = hsmm_grad_work_alloc(scratch, m);
    HSMM_OVER_BATCH(m, hsmm_grad_kernel, m, work, gwork, g_ll, Ndarray_DEV_DATA(grads[0]),
                    ll ? Ndarray_DEV_DATA(ll) : (Float*)nullptr);
    double* GLw = scratch.get<double>(m.Bd * m.K * m.D);
    start_dev_kernel(hsmm_grad_last, (m, gwork, g_ll, GLw));
    start_dev_kernel(hsmm_grad_reduce, (m, censored, gwork, g_ll, GLw, Ndarray_DEV_DATA(grads[1]),
                                        Ndarray_DEV_DATA(grads[2]), Ndarray_DEV_DATA(grads[3])));
  } else {
    // no sequence: every gradient is zero (the emission gradient has no element)
    Ndarray_set_zero(grads[1]);
    Ndarray_set_zero(grads[2]);
    Ndarray_set_zero(grads[3]);
  }
  HANDLE_LAST_ERROR();
}

// inputs: the six of hsmm_fw and D_log_likelihood (B); outputs: the gradients of log_emissions (T,B,K),
// log_transitions (K,K), log_durations (Bd,K,D), log_initial (Bp,K), every element written.
static void hsmm_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 4);
  Ndarray* grads[4] = {*outputs[0], *outputs[1], *outputs[2], *outputs[3]};
  hsmm_gradients(inputs, grads, nullptr);
}

// inputs: those of hsmm_bw; outputs: log_likelihood (B), then the four gradients of hsmm_bw.
static void hsmm_fw_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 5);
  Ndarray* grads[4] = {*outputs[1], *outputs[2], *outputs[3], *outputs[4]};
  hsmm_gradients(inputs, grads, *outputs[0]);
}
