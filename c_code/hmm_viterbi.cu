// Dense K-state HMM: the most likely state path (max-plus in log space, double) and its log score.
//
// delta_0 = log pi + log e_0, delta_t(j) = max_i (delta_{t-1}(i) + log A(i, j)) + log e_t(j), the score is
// max_k delta_{T_b-1}(k) + log f(k).  Ties go to the lowest state, at the end and at every step of the backtrace.
// Padded frames get -1; a sequence with a NaN input or without a path gets -1 on every frame and the score NaN
// or -inf.  One thread per sequence (CUDA), or per block of sequences (CPU); the backpointers live in a (T, B, K)
// int32 scratch.

#include "hmm_infer.cu"

// One step: cur(j) = max_i prev(i) + log A(i, j), bp(j) = its lowest argmax.  lAd: log A in double, rows padded
// to Kp with -inf.  CPU: four columns at a time in vector registers.
DEV_FUNC inline void hmm_viterbi_step(const HmmInferParams& p, const double* __restrict__ lAd,
                                      const double* __restrict__ prev, double* __restrict__ cur,
                                      int32_t* __restrict__ bp) {
  const int64_t K = p.K, Kp = p.Kp;
#if !CUDA
  for (int64_t j0 = 0; j0 < Kp; j0 += 4) {
    hmm_v4d best = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, arg = {0.0, 0.0, 0.0, 0.0};
    for (int64_t i = 0; i < K; ++i) {
      hmm_v4d row;
      memcpy(&row, lAd + i * Kp + j0, sizeof(row));
      const double di = prev[i], fi = (double)i;
      const hmm_v4d v = row + hmm_v4d{di, di, di, di};
      const auto better = v > best;
      best = better ? v : best;
      arg = better ? hmm_v4d{fi, fi, fi, fi} : arg;
    }
    for (int q = 0; q < 4 && j0 + q < K; ++q) {
      cur[j0 + q] = best[q];
      bp[j0 + q] = (int32_t)arg[q];
    }
  }
#else
  for (int64_t j = 0; j < K; ++j) {
    double best = -INFINITY;
    int32_t arg = 0;
    for (int64_t i = 0; i < K; ++i) {
      const double v = prev[i] + lAd[i * Kp + j];
      if (v > best) {
        best = v;
        arg = (int32_t)i;
      }
    }
    cur[j] = best;
    bp[j] = arg;
  }
#endif
}

// lAd (K x Kp) = log A in double, padded with -inf.
DEF_KERNEL void hmm_viterbi_prep(HmmInferParams p, double* lAd) {
  FSA_LOOP(i, p.K * p.Kp) {
    const int64_t r = i / p.Kp, j = i % p.Kp;
    lAd[i] = j < p.K ? (double)p.lA[r * p.K + j] : -INFINITY;
  }
}

// Frame t of sequence b: delta_t into slot t % 2 of the sequence's two K-slots.
DEV_FUNC inline void hmm_viterbi_frame(const HmmInferParams& p, const double* lAd, int64_t t, int64_t b, double* delta,
                                       int32_t* bp) {
  const int64_t B = p.B, K = p.K, tb = t * B + b;
  if (t >= p.seq_len[b] || p.status[b] == HMM_NAN) return;
  double* cur = delta + b * 2 * K + (t % 2) * K;
  const Float* et = p.le + tb * K;
  if (t == 0) {
    for (int64_t k = 0; k < K; ++k) cur[k] = (double)p.lpi[k] + (double)et[k];
    return;
  }
  hmm_viterbi_step(p, lAd, delta + b * 2 * K + ((t - 1) % 2) * K, cur, bp + tb * K);
  for (int64_t k = 0; k < K; ++k) cur[k] += (double)et[k];
}

// The score and the backtrace of sequence b.
DEV_FUNC void hmm_viterbi_finish(const HmmInferParams& p, int64_t b, const double* delta, const int32_t* bp,
                                 int32_t* path, Float* score) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b];
  for (int64_t t = 0; t < p.T; ++t) path[t * B + b] = -1;
  if (len == 0 || p.status[b] == HMM_NAN) {
    score[b] = len == 0 ? (Float)0.0 : (Float)NAN_F;
    return;
  }
  const double* last = delta + b * 2 * K + ((len - 1) % 2) * K;
  double best = -INFINITY;
  int32_t arg = 0;
  for (int64_t k = 0; k < K; ++k) {
    double v = last[k] + (double)p.lf[k];
    if (v > best) {
      best = v;
      arg = (int32_t)k;
    }
  }
  if (!(best > -INFINITY)) {
    score[b] = (Float)-INFINITY;
    return;
  }
  score[b] = (Float)best;
  for (int64_t t = len - 1; t >= 0; --t) {
    path[t * B + b] = arg;
    if (t > 0) arg = bp[(t * B + b) * K + arg];
  }
}

#if !CUDA
// The recursion of sequence b alone for K <= 4 (one vector of states): delta stays in a register from frame to
// frame and the rows of log A too, so that a frame costs one short chain (add, K-1 compare-selects, add) instead
// of stores and loads of delta.  The same operations in the same order as hmm_viterbi_frame (ties to the lowest
// state); delta_{T_b-1} goes to `last`.
static void hmm_viterbi_small(const HmmInferParams& p, const double* lAd, int64_t b, double* last, int32_t* bp) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b];
  hmm_v4d rows[4];
  for (int64_t i = 0; i < 4; ++i) memcpy(&rows[i], lAd + (i < K ? i : 0) * 4, sizeof(hmm_v4d));
  hmm_v4d d = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  for (int64_t k = 0; k < K; ++k) d[k] = (double)p.lpi[k] + (double)p.le[b * K + k];
  for (int64_t t = 1; t < len; ++t) {
    const Float* et = p.le + (t * B + b) * K;
    hmm_v4d e = {0.0, 0.0, 0.0, 0.0};
    for (int64_t k = 0; k < K; ++k) e[k] = (double)et[k];
    hmm_v4d best = hmm_v4d{d[0], d[0], d[0], d[0]} + rows[0], arg = {0.0, 0.0, 0.0, 0.0};
    for (int64_t i = 1; i < K; ++i) {
      const double di = d[i], fi = (double)i;
      const hmm_v4d v = hmm_v4d{di, di, di, di} + rows[i];
      const auto better = v > best;
      best = better ? v : best;
      arg = better ? hmm_v4d{fi, fi, fi, fi} : arg;
    }
    int32_t* bpt = bp + (t * B + b) * K;
    for (int64_t k = 0; k < K; ++k) bpt[k] = (int32_t)arg[k];
    d = best + e;
  }
  for (int64_t k = 0; k < K; ++k) last[k] = d[k];
}
#endif

// The CPU runs time outer and batch inner (independent recursions overlap) over the sequences [b0, b1) of one
// part of the batch (hmm_run_parts: one per CPU thread for large problems); CUDA one thread per sequence.
DEF_KERNEL void hmm_viterbi_kernel(HmmInferParams p, const double* lAd, double* delta, int32_t* bp, int32_t* path,
                                   Float* score,
                                   int64_t b0, int64_t b1) {
#if CUDA
  FSA_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i;
    for (int64_t t = 0; t < p.seq_len[b]; ++t) hmm_viterbi_frame(p, lAd, t, b, delta, bp);
    hmm_viterbi_finish(p, b, delta, bp, path, score);
  }
#else
  if (p.Kp == 4 && b1 - b0 == 1) {  // one sequence of few states: its chain is the whole work
    const int64_t len = p.seq_len[b0];
    if (len > 0 && p.status[b0] != HMM_NAN)
      hmm_viterbi_small(p, lAd, b0, delta + b0 * 2 * p.K + ((len - 1) % 2) * p.K, bp);
  } else {
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t b = b0; b < b1; ++b) hmm_viterbi_frame(p, lAd, t, b, delta, bp);
  }
  for (int64_t b = b0; b < b1; ++b) hmm_viterbi_finish(p, b, delta, bp, path, score);
#endif
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B)
// outputs: path (T,B) int32, score (B)
static void hmm_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 2);
  HmmScratch scratch;
  HmmInferParams p = hmm_infer_setup(scratch, inputs, "hmm_viterbi");
  if (p.B == 0) return;
  double* delta = scratch.get<double>(p.B * 2 * p.K);
  int32_t* bp = scratch.get<int32_t>(p.T * p.B * p.K);
  int32_t* path = Ndarray_DEV_DATA_int32(*outputs[0]);
  Float* score = Ndarray_DEV_DATA(*outputs[1]);
  double* lAd = scratch.get<double>(p.K * p.Kp);
  start_dev_kernel(hmm_viterbi_prep, (p, lAd));
#if CUDA
  start_dev_kernel(hmm_viterbi_kernel, (p, lAd, delta, bp, path, score, (int64_t)0, p.B));
#else
  hmm_run_parts(scratch, hmm_cpu_parts(p.T, p.B, p.K), p.B, p.check, [&](int, int64_t b0, int64_t b1, FsaCheck*) {
    hmm_viterbi_kernel(p, lAd, delta, bp, path, score, b0, b1);
  });
#endif
  HANDLE_LAST_ERROR();
}
