// Explicit-duration HMM: state paths drawn from p(z | x_b) by backward filtering (hsmm_backward_seq: bend_e(k), the
// log weight of everything after a segment of k ending at frame e), forward sampling of the segments, driven by
// uniforms (T, B) in [0, 1) that the caller draws (the op itself is deterministic).
//
// The segment starting at frame s (the first one: s = 0, after a segment of state j: j's end + 1) is the pair
// (k, d) drawn with uniform uniforms[s, b] from the weights, over k = 0..K-1 and then d = 1..min(D, L - s),
//   log pi(k) or log A(j, k)  +  sum_{t=s..s+d-1} log e_t(k)  +  [s + d < L] (log p_k(d) + bend_{s+d-1}(k))
//                                                             +  [s + d = L] log W_k(d)   (W: L_k or p_k, the last)
// (weights relative to the largest): the first pair whose cumulative weight exceeds u times the total (the last of
// positive weight if rounding leaves none).  Frames of a segment after its first leave their uniforms unused.
// Padded frames get -1, as do all frames of a sequence with a NaN input or without a path.  A uniform outside
// [0, 1) on a valid frame raises.
#include "../dialect/kernel.h"

#include "hsmm_grad.h"
#include "hsmm_model.h"

// The index drawn with uniform u from the weights exp(x[i] - max x) (x is overwritten); -1 if every x is -inf.
DEV_FUNC inline int64_t hsmm_pick(double* x, int64_t n, double u) {
  double unused;
  if (!(hsmm_exps(x, n, &unused) > -INFINITY)) return -1;
  double total = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    total += x[i];
    if (x[i] > 0.0) last = i;
  }
  const double target = u * total;
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    acc += x[i];
    if (acc > target && x[i] > 0.0) return i;
  }
  return last;
}

DEF_KERNEL void hsmm_sample_check(HsmmModel m, const Float* uniforms) {
  GRID_LOOP(b, m.B) {
    for (int64_t t = 0; t < m.seq_len[b]; ++t) {
      const double u = (double)uniforms[t * m.B + b];
      if (!(u >= 0.0 && u < 1.0)) fsa_fail(m.check, HSMM_CHECK_UNIFORM, t, b, 0, u);
    }
  }
}

// Sequences [b0, b1): the backward pass, then the segments in time order.  pick: K * D doubles per sequence.
DEF_KERNEL void hsmm_sample_kernel(HsmmModel m, const Float* uniforms, double* work, double* gwork, double* pick,
                                   int32_t* path, int64_t b0, int64_t b1) {
  GRID_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i, T = m.T, B = m.B, K = m.K, D = m.D, L = m.seq_len[b];
    for (int64_t t = 0; t < T; ++t) path[t * B + b] = -1;
    if (L == 0 || m.status[b] != HSMM_OK) continue;
    const HsmmSeqWork w = hsmm_seq_work(m, work, b);
    const HsmmGradWork g = hsmm_grad_work(m, gwork, b);
    hsmm_load_emissions(m, b, w);
    hsmm_backward_seq<false>(m, b, 0.0, w, g);
    const double* ld = m.ld + (m.Bd == 1 ? 0 : b) * K * D;
    const double* lW = m.lW + (m.Bd == 1 ? 0 : b) * K * D;
    const double* lpi = m.lpi + (m.Bp == 1 ? 0 : b) * K;
    double* x = pick + b * K * D;
    int64_t prev = -1;
    for (int64_t s = 0; s < L;) {
      const int64_t n = D < L - s ? D : L - s;
      for (int64_t k = 0; k < K; ++k) {
        const double enter = prev < 0 ? lpi[k] : m.lA[prev * K + k];
        const double* em = w.em + k * T + s;
        const double* be = g.bend + k * T + s;
        double seg = 0.0;
        for (int64_t d = 0; d < n; ++d) {
          seg += em[d];
          x[k * n + d] = enter + seg + (s + d == L - 1 ? lW[k * D + d] : ld[k * D + d] + be[d]);
        }
      }
      const int64_t idx = hsmm_pick(x, K * n, (double)uniforms[s * B + b]);
      if (idx < 0) {  // no path (only possible at s = 0)
        for (int64_t t = 0; t < s; ++t) path[t * B + b] = -1;
        break;
      }
      prev = idx / n;
      const int64_t e = s + idx % n + 1;
      for (; s < e; ++s) path[s * B + b] = (int32_t)prev;
    }
  }
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_durations (Bd,K,D), log_initial (Bp,K), mask (T,B),
// right_censored (host int32), uniforms (T,B); output: path (T,B) int32, every element written
static void hsmm_sample_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 1);
  ptn::Scratch scratch;
  const char* fn = "hsmm_sample_states";
  const HsmmModel m = hsmm_model_setup(scratch, inputs, fn);
  std::ostringstream s;
  s << "uniforms must have shape (T, B), got (" << Ndarray_DIMS(inputs[6])[0] << ", " << Ndarray_DIMS(inputs[6])[1]
    << ") (log_emissions has shape (" << m.T << ", " << m.B << ", " << m.K << "))";
  hsmm_require(Ndarray_DIMS(inputs[6])[0] == m.T && Ndarray_DIMS(inputs[6])[1] == m.B, fn, s.str());
  if (m.B == 0) return;
  const Float* u = Ndarray_DEV_DATA(inputs[6]);
  start_dev_kernel(hsmm_sample_check, (m, u));
  HANDLE_LAST_ERROR();
  hsmm_raise_check(m, fn);
  double* work = hsmm_work_alloc(scratch, m);
  double* gwork = hsmm_grad_work_alloc(scratch, m);
  double* pick = scratch.get<double>(m.B * m.K * m.D);
  HSMM_OVER_BATCH(m, hsmm_sample_kernel, m, u, work, gwork, pick, Ndarray_DEV_DATA_int32(*outputs[0]));
  HANDLE_LAST_ERROR();
}
