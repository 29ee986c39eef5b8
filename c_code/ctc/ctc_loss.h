// What the fused CTC losses (ctc_loss.cu: all alignments, ctc_loss_viterbi.cu: the best one) share: their
// arguments, checked in the user's terms, and the CTC automaton of their targets (ctc_fsa.h) in scratch memory.
//
// Inputs: logits (T, B, D), logits_seq_lens (B,) int32 in [0, T], targets (B, N) int32 with labels in [0, D),
// targets_seq_lens (B,) int32 in [0, N], blank_index () host int32 in [-D, D) (negative counts from the end),
// label_loop () host int32 (CTC or RNA), logits_normalized () host int32 (logits are log-probabilities).
// Outputs: loss (B,), grad (T, B, D) = d loss / d logits.
//
// A sequence with an empty target over zero frames has the empty alignment, of probability 1: loss 0 (its
// gradient is 0: it has no valid frame).
#ifndef PTNATIVE_CTC_CTC_LOSS_H
#define PTNATIVE_CTC_CTC_LOSS_H

#include "../dialect/kernel.h"

#include "ctc_fsa.h"

struct CtcLoss {
  int64_t T, B, D, N, E, S;
  bool normalized, label_loop;
  int32_t blank;
  const Float* logits;
  const int32_t *lens, *tlens;  // (B,) frames, labels
  const int32_t* targets;       // (B, N)
  int32_t *edges, *start_end;   // the automaton on the CPU: (4, E), (2, B)
  Float* weights;               // (E,) zeros
  Float *loss, *grad;           // the outputs
  FsaTerms terms;
};

// Checks the arguments of `fn` and, on the CPU, builds the automaton in `scratch` (CUDA checks the lengths and
// labels in its pass, ctc_loss_cuda.h).
static CtcLoss ctc_loss_setup(const char* fn, ptn::Scratch& scratch, int n_inputs, Ndarray** inputs, int n_outputs,
                              Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *logits = inputs[0], *lens = inputs[1], *targets = inputs[2], *tlens = inputs[3];
  const int64_t blank_index = Ndarray_DEV_DATA_int32_scalar(inputs[4]);
  const bool label_loop = Ndarray_DEV_DATA_int32_scalar(inputs[5]) != 0;
  CtcLoss c;
  c.normalized = Ndarray_DEV_DATA_int32_scalar(inputs[6]) != 0;
  const int64_t T = Ndarray_DIMS(logits)[0], B = Ndarray_DIMS(logits)[1], D = Ndarray_DIMS(logits)[2];
  const int64_t N = Ndarray_DIMS(targets)[1];
  FsaTerms terms = fsa_terms(fn, "logits");
  terms.lens = "logits_seq_lens";
  terms.targets = "targets";
  terms.target_lens = "targets_seq_lens";
  terms.T = T;
  terms.B = B;
  terms.D = D;
  terms.N = N;
  std::ostringstream s;
  s << "(B = " << B << ",) (B = logits.shape[1])";
  fsa_check_shape(lens, "logits_seq_lens", {B}, s.str().c_str(), terms);
  fsa_check_shape(tlens, "targets_seq_lens", {B}, s.str().c_str(), terms);
  s.str("");
  s << "(B = " << B << ", N) (B = logits.shape[1])";
  fsa_check_shape(targets, "targets", {B, -1}, s.str().c_str(), terms);
  s.str("");
  s << "blank_index = " << blank_index << " is out of range [-D, D) for D = " << D << " classes (logits.shape[2])";
  fsa_require(B == 0 || (blank_index >= -D && blank_index < D), terms, s.str());
  const int32_t blank = (int32_t)(blank_index < 0 ? blank_index + D : blank_index);
  ctc_fsa_check_size(B, N, terms);

  c.T = T;
  c.B = B;
  c.D = D;
  c.N = N;
  c.E = B * (5 * (N - 1) + 10);
  c.S = B * (2 * N + 3);
  c.logits = Ndarray_DEV_DATA(logits);
  c.lens = Ndarray_DEV_DATA_int32(lens);
  c.tlens = Ndarray_DEV_DATA_int32(tlens);
  c.targets = Ndarray_DEV_DATA_int32(targets);
  c.blank = blank;
  c.label_loop = label_loop;
#if CUDA
  c.edges = c.start_end = 0;
  c.weights = 0;
  (void)scratch;
#else
  c.edges = scratch.get<int32_t>(4 * c.E);
  c.start_end = scratch.get<int32_t>(2 * B);
  c.weights = scratch.get<Float>(c.E);
  Ndarray_memset(c.weights, 0, c.E * sizeof(Float));
  ctc_fsa_checked_build(terms, B, N, T, D, c.lens, c.targets, c.tlens, blank, label_loop, c.edges, c.start_end);
#endif
  c.loss = Ndarray_DEV_DATA(*outputs[0]);
  c.grad = Ndarray_DEV_DATA(*outputs[1]);
  c.terms = terms;
  return c;
}

// Points a Baum-Welch or Viterbi problem (FbwProblem, VitProblem) at the CTC automaton of `c`: its sizes, the rows
// of c.edges (from state, to state, emission, sequence), the weights and the start states.
template <typename Problem> static void ctc_set_automaton(Problem& p, const CtcLoss& c) {
  p.T = c.T;
  p.B = c.B;
  p.D = c.D;
  p.E = c.E;
  p.S = c.S;
  p.from = c.edges;
  p.to = c.edges + c.E;
  p.emis = c.edges + 2 * c.E;
  p.seq = c.edges + 3 * c.E;
  p.w = c.weights;
  p.start = c.start_end;
}

DEF_KERNEL void ctc_empty_loss(int64_t n_batch, const int32_t* lens, const int32_t* tlens, Float* loss) {
  GRID_LOOP(b, n_batch) if (lens[b] == 0 && tlens[b] == 0) loss[b] = Float(0);
}

#endif  // PTNATIVE_CTC_CTC_LOSS_H
