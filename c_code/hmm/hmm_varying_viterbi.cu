// The most likely state path of a dense K-state HMM with batched or time-varying transitions and batched initial
// weights (the parameters as hmm_varying.h takes them), and its log score: hmm_viterbi.cu's recursion
// (hmm_viterbi_steps.h) with the matrix of each frame.
//
// Ties go to the lowest state.  Padded frames get -1; a sequence with a NaN (on a valid frame, in log_final, or in
// a matrix or initial row it uses) or without a path gets -1 on every frame and the score NaN or -inf.  The
// matrices, in double and padded, are made once each when they do not vary over time (Ta = 1), else per frame.
#include "../dialect/kernel.h"

#include "hmm_varying.h"
#include "hmm_viterbi_steps.h"

// lAd (Ba, K, Kp): the Ta = 1 matrices padded (hmm_viterbi_pad).
DEF_KERNEL void hmm_var_viterbi_prep(HmmInferParams p, HmmVarying v, double* lAd) {
  const int64_t KKp = p.K * p.Kp;
  GRID_LOOP(i, v.Ba * KKp) hmm_viterbi_pad(v.lA + i / KKp * p.K * p.K, p.K, p.Kp, i % KKp, lAd + i / KKp * KKp);
}

// Per sequence: the recursion and the backtrace.  lAd: hmm_var_viterbi_prep's (Ta = 1), else per-sequence K Kp
// scratch filled per frame.
DEF_KERNEL void hmm_var_viterbi_kernel(HmmInferParams p, HmmVarying v, double* lAd, double* delta, int32_t* bp,
                                       int32_t* path, Float* score) {
  GRID_LOOP(b, p.B) {
    const int64_t K = p.K, KKp = K * p.Kp;
    const Float* lpi = v.lpi + hmm_var_initial(v, b) * K;
    for (int64_t t = 0; t < p.seq_len[b]; ++t) {
      const double* At = lAd;
      if (t > 0 && v.Ta == 1) {
        At = lAd + (v.Ba == 1 ? 0 : b) * KKp;
      } else if (t > 0 && p.status[b] != HMM_NAN) {
        double* mine = lAd + b * KKp;
        const Float* lA = v.lA + hmm_var_matrix(v, t, b) * K * K;
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < p.Kp; ++j) mine[i * p.Kp + j] = j < K ? (double)lA[i * K + j] : -INFINITY;
        At = mine;
      }
      hmm_viterbi_frame(p, At, lpi, t, b, delta, bp);
    }
    hmm_viterbi_finish(p, b, delta, bp, path, score);
  }
}

// inputs: log_emissions (T,B,K), log_transitions (Ta,Ba,K,K), log_initial (Bp,K), log_final (K), mask (T,B)
// outputs: path (T,B) int32, score (B)
static void hmm_varying_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmVarCall call("hmm_viterbi", inputs, n_inputs, 5, n_outputs, 2);
  const HmmInferParams& p = call.p;
  const HmmVarying& v = call.v;
  if (p.B == 0) return;
  double* delta = call.scratch.get<double>(p.B * 2 * p.K);
  int32_t* bp = call.scratch.get<int32_t>(p.T * p.B * p.K);
  double* lAd = call.scratch.get<double>((v.Ta == 1 ? v.Ba : p.B) * p.K * p.Kp);
  if (v.Ta == 1) start_dev_kernel(hmm_var_viterbi_prep, (p, v, lAd));
  start_dev_kernel(hmm_var_viterbi_kernel, (p, v, lAd, delta, bp, Ndarray_DEV_DATA_int32(*outputs[0]),
                                            Ndarray_DEV_DATA(*outputs[1])));
  HANDLE_LAST_ERROR();
}
