// ctc_loss_viterbi (ptnative.ops.fsa.CtcViterbiLossOp): the CTC loss of the best alignment only and its gradient,
// in one op: Viterbi (fsa_viterbi.h) over the CTC automaton (ctc_fsa.h) on the log-softmax of the logits.
//
// ctc_loss_viterbi_fw: the inputs of ctc_loss.h -> loss (B,) = -max over alignments of log p(alignment | x_b)
//   (inf without one, NaN for a NaN sequence), grad (T, B, D) = softmax(logits) - onehot(best alignment)
//   (-onehot when logits_normalized) on valid frames of sequences with an alignment, NaN on valid frames of NaN
//   sequences, else 0.  Ties: the alignment fast_viterbi picks (the lowest edge index per frame).

#include "ctc_loss.h"
#include "fsa_viterbi.h"

// Viterbi: the loss is minus the best alignment's log-probability (inf without an alignment, NaN for NaN
// sequences); the gradient w.r.t. the logits is softmax - onehot(alignment) (-onehot for log-probabilities) on
// valid frames of sequences with an alignment, NaN on valid frames of NaN sequences, else 0.
DEF_KERNEL void ctc_vit_loss(int64_t n_batch, int64_t n_classes, const int32_t* lens, const int32_t* nan,
                             const int32_t* align, const Float* score, const Float* lp, Float* loss) {
  GRID_LOOP(b, n_batch) {
    if (nan[b]) {
      loss[b] = (Float)NAN_F;
      continue;
    }
    if (!(score[b] > -(Float)INFINITY)) {
      loss[b] = (Float)INFINITY;
      continue;
    }
    double s = 0.0;
    for (int64_t t = 0; t < lens[b]; ++t) s += (double)lp[(t * n_batch + b) * n_classes + align[t * n_batch + b]];
    loss[b] = (Float)(-s);
  }
}

DEF_KERNEL void ctc_vit_grad(int mode, int64_t n_time, int64_t n_batch, int64_t n_classes, const int32_t* lens,
                             const int32_t* nan, const int32_t* align, const Float* score, const Float* lp,
                             Float* grad) {
  GRID_LOOP(i, n_time * n_batch * n_classes) {
    int64_t d = i % n_classes, b = (i / n_classes) % n_batch, t = i / (n_classes * n_batch);
    Float g = Float(0);
    if (t < lens[b]) {
      if (nan[b])
        g = (Float)NAN_F;
      else if (score[b] > -(Float)INFINITY)
        g = (mode == VIT_LOGITS ? (Float)exp((double)lp[i]) : Float(0)) - (d == align[t * n_batch + b] ? 1 : 0);
    }
    grad[i] = g;
  }
}

static void ctc_loss_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  ptn::Scratch scratch;
  const CtcLoss c = ctc_loss_setup("ctc_loss_viterbi", scratch, n_inputs, inputs, n_outputs, outputs);
  const int64_t T = c.T, B = c.B, D = c.D;
  if (B == 0) return;
  int32_t* nan = scratch.get<int32_t>(B);
  FsaCheck* check = scratch.get<FsaCheck>(1);
  Ndarray_memset(nan, 0, B * sizeof(int32_t));
  Ndarray_memset(check, 0, sizeof(FsaCheck));
  const int mode = c.normalized ? VIT_LOGPROBS : VIT_LOGITS;
  const Float* lp = c.normalized ? c.logits : scratch.get<Float>(T * B * D);
  vit_row_pass(mode, T, B, D, c.logits, c.lens, (Float*)lp, nan, check);
  fsa_raise_check(check, c.terms);
  int32_t* align = scratch.get<int32_t>(T * B);
  Float* score = scratch.get<Float>(B);
  VitProblem v;
  v.T = T;
  v.B = B;
  v.D = D;
  v.E = c.E;
  v.S = c.S;
  v.am = lp;
  v.from = c.edges;
  v.to = c.edges + c.E;
  v.emis = c.edges + 2 * c.E;
  v.seq = c.edges + 3 * c.E;
  v.w = c.weights;
  v.start = c.start_end;
  v.end = c.start_end + B;
  v.seq_len = c.lens;
  v.nan = nan;
  v.align = align;
  v.score = score;
  vit_run(scratch, v);
  start_dev_kernel(ctc_vit_loss, (B, D, c.lens, nan, align, score, lp, c.loss));
  start_dev_kernel(ctc_vit_grad, (mode, T, B, D, c.lens, nan, align, score, lp, c.grad));
  start_dev_kernel(ctc_empty_loss, (B, c.lens, c.tlens, c.loss));
  HANDLE_LAST_ERROR();
}
