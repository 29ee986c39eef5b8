// Baum-Welch (forward-backward) over an edge-list automaton (fsa_automaton.h): the core that FastBaumWelch,
// MultiEndFastBaumWelch (fsa_baum_welch.cu) and the fused CTC loss (ctc_loss.cu) run, as fbw_run(FbwProblem).
//
// Shapes: scores am (T, B, D); edges (4, E) and weights w (E,); start states (B,); end states as (B,) or as
// (n_end, 2) rows (sequence, state) with -log weights (n_end,); lengths from a (T, B) 0/1 prefix mask or (B,)
// lengths; outputs out (T, B, D), sums (T, B) or loss (B,) (FbwProblem says which are given).
//
// Emission scores a_t(d) per mode: FBW_NEGLOG am = -log scores; FBW_LOGITS am = logits, a = -log softmax(am);
// FBW_LOGPROBS am = log-probabilities, a = -am.  With alpha_0 = 1 at the start state,
//   alpha_{t+1}(q) = sum over edges e = (p -> q, d) of sequence b, t < T_b: alpha_t(p) exp(-w_e) exp(-a_t(d)),
//   p(x_b) = sum over end states n of b: alpha_{T_b}(n) exp(-w_end(n)),
// and beta likewise backwards from the end states; the posterior of emission d at frame t is
//   gamma_t(d) = sum over edges e emitting d of alpha_t(p) exp(-w_e - a_t(d)) beta_{t+1}(q) / p(x_b).
// Outputs: FBW_NEGLOG out = -log gamma (inf where 0), sums = -log p(x_b) on valid frames; FBW_LOGITS
// out = d(-log p)/d logits = softmax - gamma; FBW_LOGPROBS out = -gamma; loss = -log p(x_b).
//
// Runs in probability space with per-frame scaling, in double: emissions are exp(-(a - min a of the frame)),
// edge weights exp(-(w - min w of the sequence)); the forward and backward vectors are renormalised per sequence
// and frame and the log-scales accumulated.  This is exact (no log-add approximations), and its dynamic range per
// frame is that of double (~700 nats between the best and a competing path at one frame), while -log p itself may
// take any magnitude; sequences for which the scaled pass finds no path are recomputed in log space (so extreme
// score ranges stay exact).
#ifndef PTNATIVE_FSA_FSA_BAUM_WELCH_H
#define PTNATIVE_FSA_FSA_BAUM_WELCH_H

#include "../dialect/kernel.h"

#include "fsa_automaton.h"

enum { FBW_NEGLOG = 0, FBW_LOGITS = 1, FBW_LOGPROBS = 2 };

struct FbwProblem {
  int mode;
  int64_t T, B, D, E, S;
  const Float* am;
  const int32_t *from, *to, *emis, *seq;
  const Float* w;
  const int32_t* start;
  int64_t n_end;
  const int32_t* end_pairs;   // (n_end, 2) or null
  const int32_t* end_simple;  // (B,) when end_pairs is null
  const Float* end_w;         // (n_end,) or null (all 0)
  const Float* index;         // (T, B) prefix mask, or null
  const int32_t* lens;        // (B,) lengths when index is null
  Float* out;                 // (T, B, D)
  Float* sums;                // (T, B) or null
  Float* loss;                // (B,) or null
  FsaTerms terms;             // the caller's names, for the messages of failed checks
};

// What fbw_run's checks leave for the passes: every state's sequence (-1: none), the lengths, the NaN sequences,
// the check record, and per sequence the smallest finite weight wmin, per edge W = exp(-(w - wmin)).
struct FbwChecked {
  const int32_t *state_seq, *seq_len;
  int32_t* nan;
  FsaCheck* check;
  const double *wmin, *W;
};

// wmin[s] = the smallest finite weight of sequence s; NaN weights mark their sequence in `nan`.
DEF_KERNEL void fbw_init_weights(int64_t n_edges, const int32_t* seq, const Float* w, double* wmin, int32_t* nan,
                                 FsaCheck* check) {
  GRID_LOOP(e, n_edges) {
    double v = (double)w[e];
    if (v == -INFINITY) fsa_fail(check, FSA_CHECK_WEIGHT_MINUS_INF, 0, e, 0, v);
    if (v != v) nan[seq[e]] = 1;
    if (v < INFINITY) fsa_atomic_min(wmin + seq[e], v);
  }
}

DEF_KERNEL void fbw_weights(int64_t n_edges, const int32_t* seq, const Float* w, const double* wmin, double* W) {
  GRID_LOOP(e, n_edges) {
    double v = (double)w[e];
    W[e] = v < INFINITY ? exp(-(v - wmin[seq[e]])) : 0.0;
  }
}

// The log-space pass's emissions of one row (D scores): Q[d] = -log emission probability of class d.
DEV_FUNC inline void fbl_emission_row(int mode, int64_t n_classes, const Float* row, double* Q) {
  double sign = mode == FBW_NEGLOG ? 1.0 : -1.0;
  double m = INFINITY, lse = 0.0;
  for (int64_t d = 0; d < n_classes; ++d) {
    double a = sign * (double)row[d];
    if (a < m) m = a;
  }
  if (mode == FBW_LOGITS && m < INFINITY) {
    double sum = 0.0;
    for (int64_t d = 0; d < n_classes; ++d) {
      double a = sign * (double)row[d];
      if (a < INFINITY) sum += exp(-(a - m));
    }
    lse = m - log(sum);  // -log sum exp(-a)
  }
  for (int64_t d = 0; d < n_classes; ++d) {
    double a = sign * (double)row[d];
    Q[d] = a < INFINITY ? a - lse : INFINITY;
  }
}

// The passes, defined per target at the end of this file: on CUDA one launch per frame and step over the whole
// batch (fsa_baum_welch_cuda.h); on the CPU one sequence per task, on all cores (fsa_baum_welch_cpu.h).
static void fbw_passes(const FbwProblem& p, ptn::Scratch& scratch, const FbwChecked& ck);


static void fbw_run(FbwProblem p) {
  ptn::Scratch scratch;
  const int64_t T = p.T, B = p.B, D = p.D, E = p.E, S = p.S;
  p.terms.T = T;
  p.terms.B = B;
  p.terms.D = D;
  p.terms.S = S;
  int32_t* state_seq = scratch.get<int32_t>(S);
  int32_t* seq_len = scratch.get<int32_t>(B);
  int32_t* nan = scratch.get<int32_t>(B);
  FsaCheck* check = scratch.get<FsaCheck>(1);
  Ndarray_memset(state_seq, 255, S * sizeof(int32_t));
  Ndarray_memset(nan, 0, B * sizeof(int32_t));
  Ndarray_memset(check, 0, sizeof(FsaCheck));
  start_dev_kernel(fsa_check_edges, (E, p.from, p.to, p.emis, p.seq, S, D, B, state_seq, check));
  start_dev_kernel(fsa_check_seqs, (T, B, p.start, S, p.index, p.lens, seq_len, state_seq, check));
  start_dev_kernel(fsa_check_ends, (p.n_end, p.end_pairs, p.end_simple, S, B, state_seq, check));
  fsa_raise_check(check, p.terms);
  if (B == 0) return;

  double* wmin = scratch.get<double>(B);
  double* W = scratch.get<double>(E);
  start_dev_kernel(fsa_fill, (B, wmin, (double)INFINITY));
  start_dev_kernel(fbw_init_weights, (E, p.seq, p.w, wmin, nan, check));
  fsa_raise_check(check, p.terms);
  start_dev_kernel(fbw_weights, (E, p.seq, p.w, wmin, W));
  const FbwChecked checked = {state_seq, seq_len, nan, check, wmin, W};
  fbw_passes(p, scratch, checked);
}


#if CUDA
#include "fsa_baum_welch_cuda.h"
#else
#include "fsa_baum_welch_cpu.h"
#endif

#endif  // PTNATIVE_FSA_FSA_BAUM_WELCH_H
