// The length of a one-sequence (B = 1) 0/1 prefix mask on the CPU in one branch-free, vectorised pass: the mask is
// a prefix mask iff its values are 0 or 1 and never increase, and its length is then its number of ones.  Anything
// else goes to fsa_mask_length, which records the first bad frame for the caller's error.

#include "fsa_common.h"

#if !CUDA
static inline int32_t hmm_one_mask_length(int64_t n_time, const Float* mask, FsaCheck* check) {
  int64_t ones = 0, bad = 0;
  for (int64_t t = 0; t < n_time; ++t) {
    const Float m = mask[t], prev = mask[t > 0 ? t - 1 : 0];
    ones += m == Float(1);
    bad |= (int64_t)(!(m == Float(0) || m == Float(1))) | (int64_t)(m > prev);
  }
  if (!bad) return (int32_t)ones;
  return fsa_mask_length(n_time, 1, mask, 0, check);
}
#endif  // !CUDA
