// get_ctc_fsa_fast_bw (ptnative.ops.fsa.GetCtcFsaFastBwOp): the CTC automaton of a batch of label sequences
// (ctc_fsa.h) as FastBaumWelch edges.
//
// ctc_fsa_fw: targets (B, N) int32, seq_lens (B,) int32 in [0, N], blank_idx () host int32, weights (E,) (only its
//   shape is used, E = B (5 (N - 1) + 10)), label_loop () host int32 -> edges (4, E) int32, start_end_states (2, B).
#include "../dialect/kernel.h"

#include "ctc_fsa.h"

// inputs: targets (B,N), seq_lens (B), blank_idx (host), weights (E) [shape only], label_loop (host)
// outputs: edges (4,E), start_end_states (2,B)
static void ctc_fsa_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *targets = inputs[0], *lens = inputs[1], *weights = inputs[3];
  int32_t blank = Ndarray_DEV_DATA_int32_scalar(inputs[2]);
  bool label_loop = Ndarray_DEV_DATA_int32_scalar(inputs[4]) != 0;
  int64_t B = Ndarray_DIMS(targets)[0], N = Ndarray_DIMS(targets)[1];
  FsaTerms terms = fsa_terms("get_ctc_fsa_fast_bw", "");
  terms.targets = "targets";
  terms.target_lens = "seq_lens";
  terms.B = B;
  terms.N = N;
  std::ostringstream s;
  s << "(B = " << B << ",)";
  fsa_check_shape(lens, "seq_lens", {B}, s.str().c_str(), terms);
  int64_t per_seq = 5 * (N - 1) + 10;
  s.str("");
  s << "(B * (5 * (N - 1) + 10) = " << B * per_seq << ",)";
  fsa_check_shape(weights, "weights", {B * per_seq}, s.str().c_str(), terms);
  ctc_fsa_check_size(B, N, terms);
  ctc_fsa_checked_build(terms, B, N, 0, -1, (const int32_t*)0, Ndarray_DEV_DATA_int32(targets),
                        Ndarray_DEV_DATA_int32(lens), blank, label_loop, Ndarray_DEV_DATA_int32(*outputs[0]),
                        Ndarray_DEV_DATA_int32(*outputs[1]));
}
