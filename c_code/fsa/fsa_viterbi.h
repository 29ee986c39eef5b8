// Viterbi over an edge-list automaton (fsa_automaton.h), max-plus in +log space: the core that FastViterbi
// (fsa_viterbi.cu) and the fused CTC Viterbi loss (ctc_loss_viterbi.cu) run, as vit_run(VitProblem).
//
// Shapes: scores x (T, B, D); edges (4, E), weights w (E,) +log; start and end state per sequence (B,); lengths
// (B,); outputs align (T, B) int32 and score (B,); for a loss, loss (B,) and grad (T, B, D).
//
// The scores of the path are lp = x (VIT_SCAN: +log scores; VIT_LOGPROBS: log-probabilities) or
// lp = log_softmax(x) over D (VIT_LOGITS), in Float (the scores' type):
//   val_0(start_b) = 0, val_{t+1}(q) = max over edges e = (p -> q, d) of sequence b, t < T_b:
//                                     val_t(p) + w_e + lp[t, b, d],
//   score_b = val_{T_b}(end_b); align[t, b] = the emission of the best path's edge at frame t (0 past T_b and
//   without a path, score -inf).  Ties go to the lowest edge index, at every frame of the backtrace.
// A loss (VIT_LOGITS / VIT_LOGPROBS): loss_b = -sum_t lp[t, b, align[t, b]] and its gradient w.r.t. x,
// softmax(x) - onehot(align) (-onehot for log-probabilities) on valid frames.  A NaN score on a valid frame of b
// (or a NaN weight of its edges, which the caller marks in nan) gives b the score (and loss) NaN, the alignment 0
// and a NaN gradient; a +inf score (an infinitely likely one) of a loss raises; no path: score -inf, loss inf,
// gradient 0.
#ifndef PTNATIVE_FSA_FSA_VITERBI_H
#define PTNATIVE_FSA_FSA_VITERBI_H

#include "../dialect/kernel.h"

#include "fsa_automaton.h"

enum { VIT_SCAN = 0, VIT_LOGITS = 1, VIT_LOGPROBS = 2 };

struct VitProblem {
  int mode;
  int64_t T, B, D, E, S;
  const Float* x;          // (T, B, D) scores, logits or log-probabilities (see mode)
  const int32_t *from, *to, *emis, *seq;
  const Float* w;
  const int32_t *start, *end;
  const int32_t* seq_len;  // checked lengths
  int32_t* nan;            // (B,) NaN sequences: set by the caller (weights) and by vit_run (scores)
  int32_t* align;          // (T, B)
  Float* score;            // (B,)
  Float *loss, *grad;      // (B,), (T, B, D): VIT_LOGITS / VIT_LOGPROBS only
  FsaTerms terms;          // the caller's names, for the messages of failed checks
};

DEF_KERNEL void fsa_mark_nan_weights(int64_t n_edges, const int32_t* seq, const Float* w, int32_t* nan) {
  GRID_LOOP(e, n_edges) if (w[e] != w[e]) nan[seq[e]] = 1;
}

// The passes (vit_run): on CUDA one launch per frame over the whole batch (fsa_viterbi_cuda.h); on the CPU one
// sequence per task, on all cores (fsa_viterbi_cpu.h).
#if CUDA
#include "fsa_viterbi_cuda.h"
#else
#include "fsa_viterbi_cpu.h"
#endif

#endif  // PTNATIVE_FSA_FSA_VITERBI_H
