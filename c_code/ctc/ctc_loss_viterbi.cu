// ctc_loss_viterbi (ptnative.ops.fsa.CtcViterbiLossOp): the CTC loss of the best alignment only and its gradient,
// in one op: Viterbi (fsa_viterbi.h) over the CTC automaton (ctc_fsa.h) on the log-softmax of the logits.
//
// ctc_loss_viterbi_fw: the inputs of ctc_loss.h -> loss (B,) = -max over alignments of log p(alignment | x_b)
//   (inf without one, NaN for a NaN sequence), grad (T, B, D) = softmax(logits) - onehot(best alignment)
//   (-onehot when logits_normalized) on valid frames of sequences with an alignment, NaN on valid frames of NaN
//   sequences, else 0.  Ties: the alignment fast_viterbi picks (the lowest edge index per frame).
#include "../dialect/kernel.h"

#include "ctc_loss.h"
#include "ctc_loss_cuda.h"
#include "../fsa/fsa_viterbi.h"

static void ctc_loss_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  ptn::Scratch scratch;
  const CtcLoss c = ctc_loss_setup("ctc_loss_viterbi", scratch, n_inputs, inputs, n_outputs, outputs);
#if CUDA
  ctc_run_pass(true, ctc_pass_of(c), c.terms);
#else
  const int64_t B = c.B;
  if (B == 0) return;
  int32_t* nan = scratch.get<int32_t>(B);
  Ndarray_memset(nan, 0, B * sizeof(int32_t));
  VitProblem v;
  v.mode = c.normalized ? VIT_LOGPROBS : VIT_LOGITS;
  ctc_set_automaton(v, c);
  v.x = c.logits;
  v.end = c.start_end + B;
  v.seq_len = c.lens;
  v.nan = nan;
  v.align = scratch.get<int32_t>(c.T * B);
  v.score = scratch.get<Float>(B);
  v.loss = c.loss;
  v.grad = c.grad;
  v.terms = c.terms;
  vit_run(scratch, v);
  start_dev_kernel(ctc_empty_loss, (B, c.lens, c.tlens, c.loss));
  HANDLE_LAST_ERROR();
#endif
}
