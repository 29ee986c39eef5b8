// Register-only helpers of the one-sequence K <= 4 paths (hmm_loglik_small.h, hmm_posteriors.cu,
// hmm_viterbi.cu), beside hmm_gemm.h's vector of four doubles (hmm_v4d, hmm_lanes, hmm_vecmat).
#ifndef PTNATIVE_HMM_HMM_VECTORS_SMALL_H
#define PTNATIVE_HMM_HMM_VECTORS_SMALL_H

#include "../dialect/kernel.h"

#include "hmm_gemm.h"

#if !CUDA
typedef ptn_vec<int64_t, 4> hmm_v4l;  // what comparing two hmm_v4d gives

// The rows of a K x K matrix M as vectors (the others 0).
template <int K>
static inline void hmm_small_rows(const double* M, hmm_v4d* rows) {
  for (int i = 0; i < 4; ++i) rows[i] = i < K ? hmm_lanes<K>(M + i * K) : hmm_splat(0.0);
}
#endif  // !CUDA

#endif  // PTNATIVE_HMM_HMM_VECTORS_SMALL_H
