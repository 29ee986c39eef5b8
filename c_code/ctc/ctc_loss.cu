// ctc_loss (ptnative.ops.fsa.CtcFsaLossOp): the CTC loss -log p(targets | logits), summed over every alignment,
// and its gradient, in one op: Baum-Welch (fsa_baum_welch.h) over the CTC automaton (ctc_fsa.h).
//
// ctc_loss_fw: the inputs of ctc_loss.h -> loss (B,) = -log p(y_b | x_b) (inf without an alignment, NaN for a NaN
//   sequence), grad (T, B, D) = softmax(logits) - gamma (-gamma when logits_normalized) on valid frames, with
//   gamma_t(d) the posterior that frame t emits d; 0 on padded frames.
#include "../dialect/kernel.h"

#include "ctc_loss.h"
#include "ctc_loss_cuda.h"
#include "../fsa/fsa_baum_welch.h"

static void ctc_loss_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  ptn::Scratch scratch;
  const CtcLoss c = ctc_loss_setup("ctc_loss", scratch, n_inputs, inputs, n_outputs, outputs);
#if CUDA
  ctc_run_pass(false, ctc_pass_of(c), c.terms);
#else
  FbwProblem p;
  p.mode = c.normalized ? FBW_LOGPROBS : FBW_LOGITS;
  ctc_set_automaton(p, c);
  p.am = c.logits;
  p.n_end = c.B;
  p.end_pairs = 0;
  p.end_simple = c.start_end + c.B;
  p.end_w = 0;
  p.index = 0;
  p.lens = c.lens;
  p.out = c.grad;
  p.sums = 0;
  p.loss = c.loss;
  p.terms = c.terms;
  fbw_run(p);
  start_dev_kernel(ctc_empty_loss, (c.B, c.lens, c.tlens, c.loss));
  HANDLE_LAST_ERROR();
#endif
}
