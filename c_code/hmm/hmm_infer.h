// Shared by the HMM inference ops (hmm_viterbi.cu, hmm_posteriors.cu, hmm_sample.cu): the input checks in the
// user's terms, and the scaled forward filter.
//
// Uses hmm_model.h (HmmModel, hmm_model_setup, hmm_checked_max, hmm_exp_row, hmm_check_shape, the CPU threads)
// and hmm_gemm.h (the CPU matvec).
//
// The filter keeps alpha_t (normalised to sum 1), its normaliser c_t and the emission shift m_t per (t, b):
// pred = alpha_{t-1} A (pi at t = 0, A and pi the shifted exps of hmm_prep), m_t = max log e_t(k) over the states
// with pred(k) > 0, E_t(k) = exp(min(log e_t(k) - m_t, 0)), alpha_t = pred * E_t / c_t.  Shifting by the largest
// emission among the reachable states keeps c_t >= pred(k*) > 0 whatever the gaps between log-densities, so the
// filter never needs a log-space fallback for emissions; a transition, initial or final weight below e^-708
// times the largest one of its array is 0 in double and counts as impossible.
#ifndef PTNATIVE_HMM_HMM_INFER_H
#define PTNATIVE_HMM_HMM_INFER_H

#include "../dialect/kernel.h"

#include "hmm_model.h"
#include "hmm_gemm.h"

enum { HMM_CHECK_UNIFORM = 100 };  // uniforms[i, j] = value is not in [0, 1) (an FsaCheck code of ours)

struct HmmInferParams : HmmModel {
  int64_t Kp;                // K rounded up to a multiple of 4 (the CPU matvec's row length)
  const double *Ap, *ATp;    // A and its transpose with rows padded to Kp
  int32_t* status;           // per sequence: HMM_SCALED, HMM_NO_PATH or HMM_NAN
};

static void hmm_infer_raise(const FsaCheck* check_dev, const FsaTerms& terms) {
  HANDLE_LAST_ERROR();
  FsaCheck c;
  Ndarray_copy_to_host(&c, check_dev, sizeof(FsaCheck));
  if (c.code == FSA_CHECK_OK) return;
  if (c.code != HMM_CHECK_UNIFORM) ptn::raise(PTN_STATUS_VALUE, fsa_check_message(c, terms));
  std::ostringstream s;
  s << terms.fn << ": uniforms[" << c.i << ", " << c.j << "] = " << c.value << " is not in [0, 1)";
  ptn::raise(PTN_STATUS_VALUE, s.str());
}

// Per sequence: NaN on a valid frame (or in the shared parameters, consts[3]) -> HMM_NAN; +inf is recorded.
DEF_KERNEL void hmm_infer_scan(HmmInferParams p) {
  GRID_LOOP(b, p.B) {
    const int64_t len = p.seq_len[b];
    bool has_nan = len > 0 && p.consts[3] != 0.0;
    for (int64_t t = 0; t < len; ++t) {
      const Float* et = p.le + (t * p.B + b) * p.K;
      int bad = 0;  // NaN or +inf in the frame (one branch-free pass; the details only if so)
      for (int64_t k = 0; k < p.K; ++k) bad |= !((double)et[k] < INFINITY);
      if (!bad) continue;
      for (int64_t k = 0; k < p.K; ++k) {
        double v = (double)et[k];
        has_nan |= v != v;
        if (v == INFINITY) fsa_fail(p.check, FSA_CHECK_SCORE_INFINITE, t, b, k, v);
      }
    }
    p.status[b] = has_nan ? HMM_NAN : HMM_SCALED;
  }
}

DEF_KERNEL void hmm_infer_pad(HmmInferParams p, double* Ap, double* ATp) {
  GRID_LOOP(i, p.K * p.Kp) {
    int64_t r = i / p.Kp, j = i % p.Kp;
    Ap[i] = j < p.K ? p.A[r * p.K + j] : 0.0;
    ATp[i] = j < p.K ? p.A[j * p.K + r] : 0.0;
  }
}

// The model of inputs 0-4 (hmm_model_setup), A padded, and the per-sequence status (NaN); failures (+inf
// emissions too) raise in the terms of `fn`.
static HmmInferParams hmm_infer_setup(HmmScratch& scratch, Ndarray** inputs, const char* fn) {
  HmmInferParams p;
  static_cast<HmmModel&>(p) = hmm_model_setup(scratch, inputs, fn);
  p.Kp = (p.K + 3) / 4 * 4;
  double* Ap = scratch.get<double>(p.K * p.Kp);
  double* ATp = scratch.get<double>(p.K * p.Kp);
  p.Ap = Ap;
  p.ATp = ATp;
  p.status = scratch.get<int32_t>(p.B);
  start_dev_kernel(hmm_infer_pad, (p, Ap, ATp));
  start_dev_kernel(hmm_infer_scan, (p));
  hmm_infer_raise(p.check, hmm_model_terms(fn, p.T, p.B, p.K));
  return p;
}

// The start of an inference op's entry point: the argument counts checked, then hmm_infer_setup in the terms of
// `fn`; the scratch lives as long as the call.
struct HmmInferCall {
  HmmScratch scratch;
  HmmInferParams p;
  HmmInferCall(const char* fn, Ndarray** inputs, int n_inputs, int want_inputs, int n_outputs, int want_outputs) {
    assert_cmp(n_inputs, ==, want_inputs);
    assert_cmp(n_outputs, ==, want_outputs);
    p = hmm_infer_setup(scratch, inputs, fn);
  }
};

// kernel(args..., b0, b1) over the sequences [b0, b1) of the batch: on CUDA one launch over all of it (a thread
// per sequence), on the CPU once per part (hmm_run_parts).
#if CUDA
#define HMM_OVER_BATCH(call, kernel, ...) start_dev_kernel(kernel, (__VA_ARGS__, (int64_t)0, (call).p.B))
#else
#define HMM_OVER_BATCH(call, kernel, ...)                                                                   \
  hmm_run_parts((call).scratch, hmm_cpu_parts((call).p.T, (call).p.B, (call).p.K), (call).p.B, (call).p.check, \
                [&](int, int64_t b0, int64_t b1, FsaCheck*) { kernel(__VA_ARGS__, b0, b1); })
#endif

#if !CUDA
// step(t, b) for the frames t of [0, T) (from T - 1 down if `backwards`), time outer and the sequences [b0, b1)
// inner: the CPU order of the inference kernels (the sequences' independent recursions overlap in the pipeline).
template <typename Step>
static inline void hmm_time_outer(int64_t T, int64_t b0, int64_t b1, bool backwards, Step&& step) {
  for (int64_t i = 0; i < T; ++i)
    for (int64_t b = b0; b < b1; ++b) step(backwards ? T - 1 - i : i, b);
}
#endif

// out (K entries; Kp writable) = x . A, or A x if `transposed`.
DEV_FUNC inline void hmm_infer_matvec(const HmmInferParams& p, const double* __restrict__ x, double* __restrict__ out,
                                      bool transposed = false) {
#if !CUDA
  if (p.Kp == 4)  // one vector of columns (known at compile time in the small-K kernels)
    hmm_gemm_tile<1, 1>(x, p.K, 1, p.K, transposed ? p.ATp : p.Ap, 4, out, 4, false);
  else
    hmm_matvec(x, p.K, transposed ? p.ATp : p.Ap, p.Kp, out);
#else
  for (int64_t j = 0; j < p.K; ++j) {
    double s = 0.0;
    for (int64_t i = 0; i < p.K; ++i) s += x[i] * (transposed ? p.A[j * p.K + i] : p.A[i * p.K + j]);
    out[j] = s;
  }
#endif
}

// min(x, 0) for x not NaN (fmin is a library call that keeps loops over it from vectorising)
DEV_FUNC inline double hmm_nonpositive(double x) { return x < 0.0 ? x : 0.0; }

// sum_k x[k] y[k] (y null: sum_k x[k]) with four partial sums (the sums of a step are latency-bound otherwise).
DEV_FUNC inline double hmm_dot(const double* __restrict__ x, const double* __restrict__ y, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4)
    for (int q = 0; q < 4; ++q) s[q] += x[k + q] * (y ? y[k + q] : 1.0);
  for (; k < n; ++k) s[0] += x[k] * (y ? y[k] : 1.0);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// E[k] = exp(min(x[k] - m, 0)) for k < K (m finite).
DEV_FUNC inline void hmm_exp_shifted(const Float* __restrict__ x, int64_t K, double m, double* __restrict__ E) {
#if !CUDA
#pragma GCC ivdep
#endif
  for (int64_t k = 0; k < K; ++k) E[k] = fsa_exp(hmm_nonpositive((double)x[k] - m));
}

// E (K) = exp(min(log e_t(k) - m, 0)), 0 everywhere if m = -inf.
DEV_FUNC inline void hmm_infer_emissions(const HmmInferParams& p, int64_t t, int64_t b, double m, double* E) {
  const Float* et = p.le + (t * p.B + b) * p.K;
  if (!(m > -INFINITY)) {
    for (int64_t k = 0; k < p.K; ++k) E[k] = 0.0;
    return;
  }
  hmm_exp_shifted(et, p.K, m, E);
}

// The transitions of the shared-parameter ops: pred = pi (t = 0) or x . A.
struct HmmSharedSteps {
  const HmmInferParams* p;
  DEV_FUNC void first(int64_t b, double* pred) const {
    for (int64_t k = 0; k < p->K; ++k) pred[k] = p->pi[k];
  }
  DEV_FUNC void next(int64_t t, int64_t b, const double* x, double* pred) const { hmm_infer_matvec(*p, x, pred); }
  DEV_FUNC const double* matrix(int64_t t, int64_t b) const { return p->A; }  // the shifted exps into frame t
};

// Step t of the scaled filter of sequence b (t < T_b): alpha_t (T, B, K), c_t and m_t (T, B); pred: Kp scratch;
// steps: first(b, pred) and next(t, b, alpha_{t-1}, pred) give pred (shifted weights).  Returns HMM_NO_PATH if the
// frame has no reachable state with a possible emission (or, at the last frame, the final weights none).
template <typename Steps>
DEV_FUNC int hmm_infer_filter_step(const HmmInferParams& p, int64_t t, int64_t b, double* alpha, double* c, double* m,
                                   double* pred, const double* f, const Steps& steps) {
  const int64_t B = p.B, K = p.K, tb = t * B + b;
  const Float* et = p.le + tb * K;
  double* at = alpha + tb * K;
  if (t == 0)
    steps.first(b, pred);
  else
    steps.next(t, b, alpha + (tb - B) * K, pred);
  double mt = -INFINITY;
  for (int64_t k = 0; k < K; ++k) {
    double v = (double)et[k];
    mt = pred[k] > 0.0 && v > mt ? v : mt;
  }
  if (!(mt > -INFINITY)) return HMM_NO_PATH;
  hmm_exp_shifted(et, K, mt, at);
  for (int64_t k = 0; k < K; ++k) at[k] *= pred[k];
  const double s = hmm_dot(at, (const double*)0, K);
  if (!(s > 0.0)) return HMM_NO_PATH;
  const double inv = 1.0 / s;
  for (int64_t k = 0; k < K; ++k) at[k] *= inv;
  c[tb] = s;
  m[tb] = mt;
  if (t == p.seq_len[b] - 1) {
    if (!(hmm_dot(at, f, K) > 0.0)) return HMM_NO_PATH;
  }
  return HMM_SCALED;
}

// The whole filter of sequence b (status HMM_SCALED on entry); returns its status.
template <typename Steps>
DEV_FUNC int hmm_infer_filter(const HmmInferParams& p, int64_t b, double* alpha, double* c, double* m, double* pred,
                              const double* f, const Steps& steps) {
  for (int64_t t = 0; t < p.seq_len[b]; ++t) {
    int st = hmm_infer_filter_step(p, t, b, alpha, c, m, pred, f, steps);
    if (st != HMM_SCALED) return st;
  }
  return HMM_SCALED;
}

// beta (K) /= its sum (s2, if given, by the same factor), and both 0 where alpha is 0 (states no path reaches:
// their beta does not matter, and zeroing keeps inf * 0 out of the sums).
DEV_FUNC inline void hmm_post_normalise(int64_t K, const double* alpha, double* beta, double* s2) {
  for (int64_t k = 0; k < K; ++k) beta[k] = alpha[k] > 0.0 ? beta[k] : 0.0;
  const double s = hmm_dot(beta, (const double*)0, K);
  const double inv = s > 0.0 ? 1.0 / s : 0.0;
  for (int64_t k = 0; k < K; ++k) beta[k] *= inv;
  if (s2)
    for (int64_t k = 0; k < K; ++k) s2[k] = alpha[k] > 0.0 ? s2[k] * inv : 0.0;
}

#endif  // PTNATIVE_HMM_HMM_INFER_H
