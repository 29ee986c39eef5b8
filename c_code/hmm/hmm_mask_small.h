// The length of a one-sequence (B = 1) 0/1 prefix mask on the CPU in one branch-free, vectorised pass: the mask is
// a prefix mask iff its values are 0 or 1 and never increase, and its length is then its number of ones.  Anything
// else goes to fsa_mask_length, which records the first bad frame for the caller's error.
#ifndef PTNATIVE_HMM_HMM_MASK_SMALL_H
#define PTNATIVE_HMM_HMM_MASK_SMALL_H

#include "../dialect/kernel.h"

#include "../common/input_checks.h"

#if !CUDA
static inline int32_t hmm_one_mask_length(int64_t n_time, const Float* mask, FsaCheck* check) {
  if (n_time == 0) return 0;
  int64_t ones = mask[0] == Float(1), bad = !(mask[0] == Float(0) || mask[0] == Float(1));
  for (int64_t t = 1; t < n_time; ++t) {  // from 1: mask[t - 1] is then a plain load (g++ gathered it before)
    const Float m = mask[t], prev = mask[t - 1];
    ones += m == Float(1);
    bad |= (int64_t)(!(m == Float(0) || m == Float(1))) | (int64_t)(m > prev);
  }
  if (!bad) return (int32_t)ones;
  return fsa_mask_length(n_time, 1, mask, 0, check);
}
#endif  // !CUDA

#endif  // PTNATIVE_HMM_HMM_MASK_SMALL_H
