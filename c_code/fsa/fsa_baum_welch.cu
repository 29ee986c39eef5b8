// FastBaumWelch and MultiEndFastBaumWelch (ptnative.ops.fsa.fast_baum_welch, MultiEndFastBaumWelchOp): the
// -log posteriors of the emissions per frame and -log p(x) of an edge-list automaton, by fbw_run (fsa_baum_welch.h)
// in FBW_NEGLOG mode.
//
// fast_bw_fw: am_scores (T, B, D) -log scores, edges (4, E), weights (E,) -log, start_end_states (2, B), index
//   (T, B) 0/1 prefix mask, state_buffer (2, S) (its shape gives S) -> output (T, B, D) -log posteriors (inf where
//   0 and on padded frames), sums (T, B) -log p(x_b) on valid frames of sequences with a path (else 0).
// multi_end_fast_bw_fw: as fast_bw_fw with start_states (B,) and weighted end states: end_states (N, 2) rows
//   (sequence, state), end_state_weights (N,) -log.
#include "../dialect/kernel.h"

#include "fsa_baum_welch.h"

// The fields every Baum-Welch entry point shares: scores (T,B,D), edges (4,E) and weights (E);
// the start / end / length fields are left empty for the caller.
static FbwProblem fbw_problem(int mode, Ndarray* am, Ndarray* edges, Ndarray* weights, const FsaTerms& terms) {
  FbwProblem p;
  p.mode = mode;
  p.terms = terms;
  p.T = Ndarray_DIMS(am)[0];
  p.B = Ndarray_DIMS(am)[1];
  p.D = Ndarray_DIMS(am)[2];
  p.terms.T = p.T;
  p.terms.B = p.B;
  p.terms.D = p.D;
  fsa_check_edges_shape(edges, weights, 4, terms);
  p.E = Ndarray_DIMS(edges)[1];
  p.S = 0;
  const int32_t* e = Ndarray_DEV_DATA_int32(edges);
  p.am = Ndarray_DEV_DATA(am);
  p.from = e;
  p.to = e + p.E;
  p.emis = e + 2 * p.E;
  p.seq = e + 3 * p.E;
  p.w = Ndarray_DEV_DATA(weights);
  p.start = 0;
  p.n_end = 0;
  p.end_pairs = 0;
  p.end_simple = 0;
  p.end_w = 0;
  p.index = 0;
  p.lens = 0;
  p.out = 0;
  p.sums = 0;
  p.loss = 0;
  return p;
}

// The (T, B) index mask and the (2, S) state buffer of the FastBaumWelch ops; outputs (T,B,D), (T,B).
static void fbw_set_index_and_buffer(FbwProblem& p, Ndarray* index, Ndarray* state_buffer, Ndarray*** outputs) {
  std::ostringstream s;
  s << "(T, B) = (" << p.T << ", " << p.B << ")";
  fsa_check_shape(index, p.terms.mask, {p.T, p.B}, s.str().c_str(), p.terms);
  fsa_check_shape(state_buffer, "state_buffer", {2, -1}, "(2, S)", p.terms);
  p.S = Ndarray_DIMS(state_buffer)[1];
  p.index = Ndarray_DEV_DATA(index);
  p.out = Ndarray_DEV_DATA(*outputs[0]);
  p.sums = Ndarray_DEV_DATA(*outputs[1]);
}

// inputs: am_scores (T,B,D), edges (4,E), weights (E), start_end_states (2,B), index (T,B), state_buffer (2,S)
// outputs: output (T,B,D), sums (T,B)
static void fast_bw_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 2);
  Ndarray* se = inputs[3];
  FsaTerms terms = fsa_terms("fast_baum_welch", "am_scores");
  terms.mask = "float_idx";
  terms.n_states = "S = state_buffer.shape[1]";
  FbwProblem p = fbw_problem(FBW_NEGLOG, inputs[0], inputs[1], inputs[2], terms);
  std::ostringstream s;
  s << "(2, B = " << p.B << ")";
  fsa_check_shape(se, "start_end_states", {2, p.B}, s.str().c_str(), p.terms);
  fbw_set_index_and_buffer(p, inputs[4], inputs[5], outputs);
  p.start = Ndarray_DEV_DATA_int32(se);
  p.n_end = p.B;
  p.end_simple = Ndarray_DEV_DATA_int32(se) + p.B;
  fbw_run(p);
}

// inputs: am_scores, edges (4,E), weights, start_states (B), end_states (N,2), end_state_weights (N),
//         index (T,B), state_buffer (2,S); outputs: output (T,B,D), sums (T,B)
static void multi_end_fast_bw_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 8);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *starts = inputs[3], *ends = inputs[4], *end_w = inputs[5];
  FsaTerms terms = fsa_terms("MultiEndFastBaumWelchOp", "am_scores");
  terms.start = "start_states";
  terms.start_index = "";
  terms.end = "end_states";
  terms.mask = "index";
  terms.n_states = "S = state_buffer.shape[1]";
  FbwProblem p = fbw_problem(FBW_NEGLOG, inputs[0], inputs[1], inputs[2], terms);
  std::ostringstream s;
  s << "(B = " << p.B << ",)";
  fsa_check_shape(starts, "start_states", {p.B}, s.str().c_str(), p.terms);
  fsa_check_shape(ends, "end_states", {-1, 2}, "(N, 2)", p.terms);
  s.str("");
  s << "(N = " << Ndarray_DIMS(ends)[0] << ",) (one per row of end_states)";
  fsa_check_shape(end_w, "end_state_weights", {Ndarray_DIMS(ends)[0]}, s.str().c_str(), p.terms);
  fbw_set_index_and_buffer(p, inputs[6], inputs[7], outputs);
  p.start = Ndarray_DEV_DATA_int32(starts);
  p.n_end = Ndarray_DIMS(ends)[0];
  p.end_pairs = Ndarray_DEV_DATA_int32(ends);
  p.end_w = Ndarray_DEV_DATA(end_w);
  fbw_run(p);
}
