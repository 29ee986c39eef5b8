// Explicit-duration HMM: the most likely state path and its log score (max instead of logsumexp in the forward
// recursion of hsmm_model.h, with backpointers: the best duration of every segment end, the best previous state of
// every segment start).  Ties: the lowest state for the last segment, then going backwards the shortest duration of
// each segment and the lowest state of the segment before it.  Padded frames get -1; a sequence with a NaN input or
// without a path gets -1 on every frame and the score NaN or -inf; the empty series the score 0.  One thread per
// sequence on CUDA, the batch split in parts over CPU threads.
#include "../dialect/kernel.h"

#include "hsmm_model.h"

DEF_KERNEL void hsmm_viterbi_kernel(HsmmModel m, double* work, int32_t* bp, int32_t* path, Float* score, int64_t b0,
                                    int64_t b1) {
  GRID_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i, T = m.T, B = m.B, K = m.K, L = m.seq_len[b];
    for (int64_t t = 0; t < T; ++t) path[t * B + b] = -1;
    if (L == 0) {
      score[b] = (Float)0.0;
      continue;
    }
    if (m.status[b] == HSMM_NAN) {
      score[b] = (Float)NAN_F;
      continue;
    }
    const HsmmSeqWork w = hsmm_seq_work(m, work, b);
    int32_t* bp_d = bp + b * 2 * K * T;
    int32_t* bp_j = bp_d + K * T;
    const double best = hsmm_forward_seq<true>(m, b, w, bp_d, bp_j);
    if (!(best > -INFINITY)) {
      score[b] = (Float)-INFINITY;
      continue;
    }
    score[b] = (Float)best;
    int64_t k = 0;
    while (!(w.alpha[k * T + L - 1] == best)) ++k;  // the lowest state reaching the maximum
    for (int64_t t = L - 1; t >= 0;) {
      const int64_t s = t - bp_d[k * T + t] + 1;
      for (int64_t u = s; u <= t; ++u) path[u * B + b] = (int32_t)k;
      if (s == 0) break;
      k = bp_j[k * T + s];
      t = s - 1;
    }
  }
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_durations (Bd,K,D), log_initial (Bp,K), mask (T,B),
// right_censored (host int32); outputs: path (T,B) int32, score (B)
static void hsmm_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 2);
  ptn::Scratch scratch;
  const HsmmModel m = hsmm_model_setup(scratch, inputs, "hsmm_viterbi");
  if (m.B == 0) return;
  double* work = hsmm_work_alloc(scratch, m);
  int32_t* bp = scratch.get<int32_t>(m.B * 2 * m.K * m.T);
  HSMM_OVER_BATCH(m, hsmm_viterbi_kernel, m, work, bp, Ndarray_DEV_DATA_int32(*outputs[0]),
                  Ndarray_DEV_DATA(*outputs[1]));
  HANDLE_LAST_ERROR();
}
