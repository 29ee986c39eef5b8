// The Viterbi recursion's steps (see hmm_viterbi.cu), shared by the shared-parameter op (hmm_viterbi.cu) and the
// batched / time-varying one (hmm_varying_viterbi.cu): one frame of a sequence given its matrix and initial weights,
// and the score and backtrace.
#ifndef PTNATIVE_HMM_HMM_VITERBI_STEPS_H
#define PTNATIVE_HMM_HMM_VITERBI_STEPS_H

#include "../dialect/kernel.h"

#include "hmm_infer.h"

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
      best = ptn_select(better, v, best);
      arg = ptn_select(better, hmm_v4d{fi, fi, fi, fi}, arg);
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

// Entry i of lAd (K x Kp): log A (K x K) in double, padded with -inf.
DEV_FUNC inline void hmm_viterbi_pad(const Float* lA, int64_t K, int64_t Kp, int64_t i, double* lAd) {
  const int64_t r = i / Kp, j = i % Kp;
  lAd[i] = j < K ? (double)lA[r * K + j] : -INFINITY;
}

// lAd (K x Kp) = log A in double, padded with -inf.
DEF_KERNEL void hmm_viterbi_prep(HmmInferParams p, double* lAd) {
  GRID_LOOP(i, p.K * p.Kp) hmm_viterbi_pad(p.lA, p.K, p.Kp, i, lAd);
}

// Frame t of sequence b: delta_t into slot t % 2 of the sequence's two K-slots; lAd: the padded log A (as
// hmm_viterbi_prep's) of the frame (t >= 1), lpi: the sequence's log pi (K).
DEV_FUNC inline void hmm_viterbi_frame(const HmmInferParams& p, const double* lAd, const Float* lpi, int64_t t,
                                       int64_t b, double* delta, int32_t* bp) {
  const int64_t B = p.B, K = p.K, tb = t * B + b;
  if (t >= p.seq_len[b] || p.status[b] == HMM_NAN) return;
  double* cur = delta + b * 2 * K + (t % 2) * K;
  const Float* et = p.le + tb * K;
  if (t == 0) {
    for (int64_t k = 0; k < K; ++k) cur[k] = (double)lpi[k] + (double)et[k];
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

#endif  // PTNATIVE_HMM_HMM_VITERBI_STEPS_H
