// The default log_final (zeros, (K,)) and mask (ones, (T, B)) of the HMM ops' "Defaults" variants
// (HmmPosteriorsDefaultsOp, HmmViterbiDefaultsOp: inputs log_emissions, log_transitions, log_initial only), made
// here for the kernels that read them as arrays: contiguous, like the inputs they stand for.
#ifndef PTNATIVE_HMM_HMM_DEFAULTS_H
#define PTNATIVE_HMM_HMM_DEFAULTS_H

#include "../dialect/kernel.h"

#include "hmm_kept.h"

DEF_KERNEL void hmm_fill(Float* x, int64_t n, Float value) {
  GRID_LOOP(i, n) x[i] = value;
}

// n copies of value.  On the CPU in the library's memory (slot Slot of hmm_kept_doubles, which nothing else
// writes), filled only where the calling thread's previous call did not leave them (a T = 500 mask: 0.15 us a call).
template <int Slot>
static Float* hmm_filled(ptn::Scratch& scratch, int64_t n, Float value) {
#if !CUDA
  thread_local const Float* at = nullptr;  // the memory the last call filled, and how much of it
  thread_local int64_t count = 0;
  const int64_t n_doubles = (n * (int64_t)sizeof(Float) + 7) / 8;
  Float* x = (Float*)hmm_kept_doubles<Slot>(scratch, n_doubles);
  if (x == at && n <= count) return x;
  start_dev_kernel(hmm_fill, (x, n, value));
  const bool kept = n_doubles <= HMM_KEEP_DOUBLES;  // else per-call scratch, never reused
  at = kept ? x : nullptr;
  count = kept ? n : 0;
  return x;
#else
  Float* x = scratch.get<Float>(n);
  start_dev_kernel(hmm_fill, (x, n, value));
  return x;
#endif
}

// inputs (log_emissions (T, B, K), log_transitions, log_initial) with the defaults log_final = 0 and mask = 1 as
// all[3] and all[4] (slots 2 and 3 of hmm_kept_doubles): the five inputs of the op the Defaults variant stands for.
struct HmmWithDefaults {
  Ndarray lf, mask;
  Ndarray* all[5];
  HmmWithDefaults(ptn::Scratch& scratch, Ndarray** inputs) : lf(*inputs[2]), mask(*inputs[0]) {
    const int64_t T = Ndarray_DIMS(inputs[0])[0], B = Ndarray_DIMS(inputs[0])[1], K = Ndarray_DIMS(inputs[0])[2];
    lf.data = hmm_filled<2>(scratch, K, (Float)0.0);
    lf.dims[0] = K;
    lf.strides[0] = sizeof(Float);
    mask.data = hmm_filled<3>(scratch, T * B, (Float)1.0);
    mask.ndim = 2;
    mask.strides[1] = sizeof(Float);
    mask.strides[0] = B * (int64_t)sizeof(Float);
    Ndarray* five[5] = {inputs[0], inputs[1], inputs[2], &lf, &mask};
    for (int i = 0; i < 5; ++i) all[i] = five[i];
  }
};

#endif  // PTNATIVE_HMM_HMM_DEFAULTS_H
