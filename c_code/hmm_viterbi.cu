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
  GRID_LOOP(i, p.K * p.Kp) {
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
// The recursion of sequence b alone for K <= 4 (one vector of states, K known at compile time): delta stays in a
// register from frame to frame and the rows of log A too.  A frame's chain is an add, a tree of maxima and the
// emission's add; the lowest argmax (the backpointer, off that chain) is found by strict compares in state order,
// so ties go to the lowest state as in hmm_viterbi_frame, with the same values.  delta_{T_b-1} goes to `last`.
template <int K>
static void hmm_viterbi_small(const HmmInferParams& p, const double* lAd, int64_t b, double* last, int32_t* bp) {
  typedef int32_t hmm_v4i __attribute__((vector_size(16)));
  const int64_t B = p.B, len = p.seq_len[b];
  hmm_v4d rows[4];
  hmm_rows<K>(lAd, rows);
  hmm_v4d d = hmm_lanes<K>(p.lpi, -INFINITY) + hmm_lanes<K>(p.le + b * K);
  for (int64_t t = 1; t < len; ++t) {
    const int64_t tb = t * B + b;
    const hmm_v4d e = hmm_lanes<K>(p.le + tb * K);
    hmm_v4d v[4] = {};
    for (int i = 0; i < K; ++i) v[i] = hmm_splat(d[i]) + rows[i];
    // the argmax: strict compares against the maximum so far, in state order
    hmm_v4d run = v[0], arg = hmm_splat(0.0);
    for (int i = 1; i < K; ++i) {
      arg = v[i] > run ? hmm_splat((double)i) : arg;
      run = hmm_max4(v[i], run);
    }
    hmm_store_lanes<K>(bp + tb * K, __builtin_convertvector(arg, hmm_v4i));
    // the maximum itself as a tree (the same value): the chain to the next frame
    const hmm_v4d low = K > 1 ? hmm_max4(v[1], v[0]) : v[0];
    d = (K > 2 ? hmm_max4(K > 3 ? hmm_max4(v[3], v[2]) : v[2], low) : low) + e;
  }
  hmm_store_lanes<K>(last, d);
}
#endif

// The CPU runs time outer and batch inner (independent recursions overlap) over the sequences [b0, b1) of one
// part of the batch (hmm_run_parts: one per CPU thread for large problems); CUDA one thread per sequence.
DEF_KERNEL void hmm_viterbi_kernel(HmmInferParams p, const double* lAd, double* delta, int32_t* bp, int32_t* path,
                                   Float* score,
                                   int64_t b0, int64_t b1) {
#if CUDA
  GRID_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i;
    for (int64_t t = 0; t < p.seq_len[b]; ++t) hmm_viterbi_frame(p, lAd, t, b, delta, bp);
    hmm_viterbi_finish(p, b, delta, bp, path, score);
  }
#else
  if (p.Kp == 4 && b1 - b0 == 1) {  // one sequence of few states: its chain is the whole work
    const int64_t len = p.seq_len[b0];
    if (len > 0 && p.status[b0] != HMM_NAN)
      hmm_with_k(p.K, [&](auto k) {
        hmm_viterbi_small<decltype(k)::value>(p, lAd, b0, delta + b0 * 2 * p.K + ((len - 1) % 2) * p.K, bp);
      });
  } else {
    hmm_time_outer(p.T, b0, b1, false, [&](int64_t t, int64_t b) { hmm_viterbi_frame(p, lAd, t, b, delta, bp); });
  }
  for (int64_t b = b0; b < b1; ++b) hmm_viterbi_finish(p, b, delta, bp, path, score);
#endif
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B)
// outputs: path (T,B) int32, score (B)
static void hmm_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmInferCall call("hmm_viterbi", inputs, n_inputs, 5, n_outputs, 2);
  const HmmInferParams& p = call.p;
  if (p.B == 0) return;
  double* delta = call.scratch.get<double>(p.B * 2 * p.K);
  int32_t* bp = call.scratch.get<int32_t>(p.T * p.B * p.K);
  double* lAd = call.scratch.get<double>(p.K * p.Kp);
  start_dev_kernel(hmm_viterbi_prep, (p, lAd));
  HMM_OVER_BATCH(call, hmm_viterbi_kernel, p, lAd, delta, bp, Ndarray_DEV_DATA_int32(*outputs[0]),
                 Ndarray_DEV_DATA(*outputs[1]));
  HANDLE_LAST_ERROR();
}
