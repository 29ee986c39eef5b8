// FastViterbi (ptnative.ops.fsa.fast_viterbi): the best path of an edge-list automaton per sequence and its
// score, by vit_run (fsa_viterbi.h).
//
// fast_viterbi_fw: am_scores (T, B, D) +log, am_seq_len (B,) int32 in [0, T], edges (4, E), weights (E,) +log,
//   start_end_states (2, B), n_states () host int32 -> output (T, B) int32 emissions of the best path, scores
//   (B,) (-inf without a path, NaN for a NaN sequence).
#include "../dialect/kernel.h"

#include "fsa_viterbi.h"

// inputs: am_scores (T,B,D) +log, am_seq_len (B), edges (4,E), weights (E), start_end_states (2,B), n_states
// outputs: output (T,B) int32, scores (B)
static void fast_viterbi_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *am = inputs[0], *lens = inputs[1], *edges = inputs[2], *weights = inputs[3], *se = inputs[4];
  FsaTerms terms = fsa_terms("fast_viterbi", "am_scores");
  terms.lens = "am_seq_len";
  terms.n_states = "the largest state index + 1";
  VitProblem p;
  p.mode = VIT_SCAN;
  p.T = Ndarray_DIMS(am)[0];
  p.B = Ndarray_DIMS(am)[1];
  p.D = Ndarray_DIMS(am)[2];
  p.S = Ndarray_DEV_DATA_int32_scalar(inputs[5]);
  terms.T = p.T;
  terms.B = p.B;
  terms.D = p.D;
  terms.S = p.S;
  fsa_require(p.S >= 0, terms, "n_states must be >= 0");
  fsa_check_edges_shape(edges, weights, 4, terms);
  p.E = Ndarray_DIMS(edges)[1];
  std::ostringstream s;
  s << "(B = " << p.B << ",)";
  fsa_check_shape(lens, "am_seq_len", {p.B}, s.str().c_str(), terms);
  s.str("");
  s << "(2, B = " << p.B << ")";
  fsa_check_shape(se, "start_end_states", {2, p.B}, s.str().c_str(), terms);
  const int32_t* e = Ndarray_DEV_DATA_int32(edges);
  p.from = e;
  p.to = e + p.E;
  p.emis = e + 2 * p.E;
  p.seq = e + 3 * p.E;
  p.start = Ndarray_DEV_DATA_int32(se);
  p.end = p.start + p.B;
  p.w = Ndarray_DEV_DATA(weights);
  p.x = Ndarray_DEV_DATA(am);
  p.terms = terms;
  ptn::Scratch scratch;
  int32_t* seq_len = scratch.get<int32_t>(p.B);
  int32_t* nan = scratch.get<int32_t>(p.B);
  FsaCheck* check = scratch.get<FsaCheck>(1);
  Ndarray_memset(nan, 0, p.B * sizeof(int32_t));
  Ndarray_memset(check, 0, sizeof(FsaCheck));
  start_dev_kernel(fsa_check_edges, (p.E, p.from, p.to, p.emis, p.seq, p.S, p.D, p.B, (int32_t*)0, check));
  start_dev_kernel(fsa_check_seqs, (p.T, p.B, p.start, p.S, (const Float*)0, Ndarray_DEV_DATA_int32(lens), seq_len,
                                    (int32_t*)0, check));
  start_dev_kernel(fsa_check_ends, (p.B, (const int32_t*)0, p.end, p.S, p.B, (int32_t*)0, check));
  fsa_raise_check(check, terms);
  if (p.B == 0) return;
  start_dev_kernel(fsa_mark_nan_weights, (p.E, p.seq, p.w, nan));
  p.seq_len = seq_len;
  p.nan = nan;
  p.align = Ndarray_DEV_DATA_int32(*outputs[0]);
  p.score = Ndarray_DEV_DATA(*outputs[1]);
  p.loss = 0;
  p.grad = 0;
  vit_run(scratch, p);
}
