// Batched or time-varying HMM parameters, shared by the ops that take them (hmm_varying*.cu): the model's checks in
// the user's terms, each matrix's shift and NaN flag, the filter's steps, and the backward smoothing pass.
//
// log_transitions arrives as (Ta, Ba, K, K), broadcast over time (Ta = 1) and / or the batch (Ba = 1): frame t >= 1
// of sequence b uses matrix [Ta == 1 ? 0 : t - 1, Ba == 1 ? 0 : b]; log_initial as (Bp, K), Bp = 1 or B.  Nothing
// is materialised: each matrix is shifted by its own maximum (one prep pass) and exponentiated when a step needs
// it (once per matrix if Ta = 1).  A weight below e^-708 times the largest of its matrix counts as impossible.  A
// sequence that uses a matrix or initial row with a NaN has the status HMM_NAN.
#ifndef PTNATIVE_HMM_HMM_VARYING_H
#define PTNATIVE_HMM_HMM_VARYING_H

#include "../dialect/kernel.h"

#include "hmm_infer.h"

struct HmmVarying {
  int64_t Ta, Ba, Bp;
  const Float *lA, *lpi;
  const double *Ashift, *pishift;  // per matrix / initial row: the maximum (0 if all -inf)
  const int32_t *A_nan, *pi_nan;   // per matrix / initial row: has a NaN
  const double* expA;              // (Ba, K, K) shifted exps when Ta == 1, else null
  double* work;                    // K * K per sequence (Ta > 1)
};

struct HmmMatrixReport {
  int q;
  int64_t offset;
  DEV_FUNC void operator()(FsaCheck* c, int64_t i) const {
    fsa_fail(c, FSA_CHECK_PARAM_PLUS_INF, q, offset + i, 0, INFINITY);
  }
};

// Shift and NaN flag of every transition matrix, initial row and log_final; +inf recorded.  The NaN flag of
// log_final goes to consts[3] (read by hmm_infer_scan), its shift to consts[2] and its exps to f.
DEF_KERNEL void hmm_var_prep(HmmInferParams p, HmmVarying v, double* Ashift, double* pishift, int32_t* A_nan,
                             int32_t* pi_nan, double* expA, double* f, double* consts) {
  const int64_t K = p.K, KK = K * K, nA = v.Ta * v.Ba;
  GRID_LOOP(i, nA + v.Bp + 1) {
    double mx;
    if (i < nA) {
      A_nan[i] = hmm_checked_max(v.lA + i * KK, KK, &mx, p.check, HmmMatrixReport{0, i * KK});
      Ashift[i] = mx > -INFINITY ? mx : 0.0;
      if (expA) hmm_exp_row(v.lA + i * KK, KK, mx, expA + i * KK);
    } else if (i < nA + v.Bp) {
      const int64_t r = i - nA;
      pi_nan[r] = hmm_checked_max(v.lpi + r * K, K, &mx, p.check, HmmMatrixReport{1, r * K});
      pishift[r] = mx > -INFINITY ? mx : 0.0;
    } else {
      consts[3] = hmm_checked_max(p.lf, K, &mx, p.check, HmmMatrixReport{2, 0}) ? 1.0 : 0.0;
      hmm_exp_row(p.lf, K, mx, f);
      consts[2] = mx > -INFINITY ? mx : 0.0;
    }
  }
}

// The index of the matrix frame t (>= 1) of sequence b uses, and the initial row of sequence b.
DEV_FUNC inline int64_t hmm_var_matrix(const HmmVarying& v, int64_t t, int64_t b) {
  return (v.Ta == 1 ? 0 : t - 1) * v.Ba + (v.Ba == 1 ? 0 : b);
}
DEV_FUNC inline int64_t hmm_var_initial(const HmmVarying& v, int64_t b) { return v.Bp == 1 ? 0 : b; }

// Whether sequence b (T_b > 0) uses a matrix or initial row with a NaN.
DEV_FUNC inline bool hmm_var_param_nan(const HmmInferParams& p, const HmmVarying& v, int64_t b) {
  const int64_t len = p.seq_len[b];
  if (len == 0) return false;
  if (v.pi_nan[hmm_var_initial(v, b)]) return true;
  for (int64_t t = 1; t < len; ++t)
    if (v.A_nan[hmm_var_matrix(v, t, b)]) return true;
  return false;
}

// The filter's steps (hmm_infer_filter) with these parameters, and the shifted exps of the matrix of a frame.
struct HmmVaryingSteps {
  const HmmInferParams* p;
  const HmmVarying* v;
  DEV_FUNC void first(int64_t b, double* pred) const {
    const int64_t r = hmm_var_initial(*v, b);
    hmm_exp_row(v->lpi + r * p->K, p->K, v->pishift[r], pred);
  }
  // the shifted exps (K x K) of the matrix used at frame t >= 1 of sequence b (valid until the next call for b)
  DEV_FUNC const double* matrix(int64_t t, int64_t b) const {
    const int64_t KK = p->K * p->K, i = hmm_var_matrix(*v, t, b);
    if (v->expA) return v->expA + (v->Ba == 1 ? 0 : b) * KK;
    double* A = v->work + b * KK;
    hmm_exp_row(v->lA + i * KK, KK, v->Ashift[i], A);
    return A;
  }
  // pred = x . A; the CPU sums eight columns at a time in registers (the sums' chains overlap)
  DEV_FUNC void next(int64_t t, int64_t b, const double* __restrict__ x, double* __restrict__ pred) const {
    const int64_t K = p->K;
    const double* __restrict__ A = matrix(t, b);
    int64_t j0 = 0;
#if !CUDA
    for (; j0 + 8 <= K; j0 += 8) {
      double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
      for (int64_t i = 0; i < K; ++i) {
        const double xi = x[i];
        const double* Ai = A + i * K + j0;
        for (int q = 0; q < 8; ++q) acc[q] += xi * Ai[q];
      }
      for (int q = 0; q < 8; ++q) pred[j0 + q] = acc[q];
    }
#endif
    for (; j0 < K; ++j0) {
      double s = 0.0;
      for (int64_t i = 0; i < K; ++i) s += x[i] * A[i * K + j0];
      pred[j0] = s;
    }
  }
};

// Folds the parameters' NaN into the status of every sequence (after hmm_infer_scan).
DEF_KERNEL void hmm_var_status(HmmInferParams p, HmmVarying v) {
  GRID_LOOP(b, p.B) {
    if (hmm_var_param_nan(p, v, b)) p.status[b] = HMM_NAN;
  }
}

// The model of inputs 0-4 (log_emissions (T,B,K), log_transitions (Ta,Ba,K,K), log_initial (Bp,K), log_final (K),
// mask (T,B)) checked in the terms of `fn`, the parameters' shifts, and the per-sequence status (NaN on a valid
// frame, in log_final or in a matrix or initial row the sequence uses).  Failures raise.
static HmmInferParams hmm_var_setup(HmmScratch& scratch, Ndarray** inputs, HmmVarying* v, const char* fn) {
  Ndarray *le = inputs[0], *lA = inputs[1], *lpi = inputs[2], *lf = inputs[3], *mask = inputs[4];
  HmmInferParams p;
  memset(&p, 0, sizeof(p));
  p.T = Ndarray_DIMS(le)[0];
  p.B = Ndarray_DIMS(le)[1];
  p.K = Ndarray_DIMS(le)[2];
  p.Kp = (p.K + 3) / 4 * 4;
  const FsaTerms terms = hmm_model_terms(fn, p.T, p.B, p.K);
  const int64_t* dA = Ndarray_DIMS(lA);
  const int64_t Tm1 = p.T > 0 ? p.T - 1 : 0;
  if (!((dA[0] == 1 || dA[0] == Tm1) && (dA[1] == 1 || dA[1] == p.B) && dA[2] == p.K && dA[3] == p.K)) {
    std::ostringstream s;
    s << "log_transitions must have shape (K, K), (B, K, K) or (T-1, B, K, K), as (T-1, B, K, K) got (" << dA[0]
      << ", " << dA[1] << ", " << dA[2] << ", " << dA[3] << ") (log_emissions has shape (" << p.T << ", " << p.B
      << ", " << p.K << "))";
    fsa_require(false, terms, s.str());
  }
  const int64_t* dpi = Ndarray_DIMS(lpi);
  if (!((dpi[0] == 1 || dpi[0] == p.B) && dpi[1] == p.K)) {
    std::ostringstream s;
    s << "log_initial must have shape (K,) or (B, K), as (B, K) got (" << dpi[0] << ", " << dpi[1]
      << ") (log_emissions has shape (" << p.T << ", " << p.B << ", " << p.K << "))";
    fsa_require(false, terms, s.str());
  }
  hmm_check_shape(terms, lf, "log_final", p.K, 0, "(K,)");
  hmm_check_shape(terms, mask, "mask", p.T, p.B, "(T, B)");
  p.le = Ndarray_DEV_DATA(le);
  p.lf = Ndarray_DEV_DATA(lf);
  v->Ta = dA[0];
  v->Ba = dA[1];
  v->Bp = dpi[0];
  v->lA = Ndarray_DEV_DATA(lA);
  v->lpi = Ndarray_DEV_DATA(lpi);
  const int64_t nA = v->Ta * v->Ba, KK = p.K * p.K;
  double* Ashift = scratch.get<double>(nA);
  double* pishift = scratch.get<double>(v->Bp);
  int32_t* A_nan = scratch.get<int32_t>(nA);
  int32_t* pi_nan = scratch.get<int32_t>(v->Bp);
  double* expA = v->Ta == 1 ? scratch.get<double>(nA * KK) : (double*)0;
  double* f = scratch.get<double>(p.K);
  double* consts = scratch.get<double>(4);
  int32_t* seq_len = scratch.get<int32_t>(p.B);
  Ndarray_memset(consts, 0, 4 * sizeof(double));
  p.status = scratch.get<int32_t>(p.B);
  p.check = scratch.get<FsaCheck>(1);
  Ndarray_memset(p.check, 0, sizeof(FsaCheck));
  start_dev_kernel(fsa_mask_lengths, (p.T, p.B, Ndarray_DEV_DATA(mask), seq_len, p.check));
  start_dev_kernel(hmm_var_prep, (p, *v, Ashift, pishift, A_nan, pi_nan, expA, f, consts));
  hmm_infer_raise(p.check, terms);
  p.seq_len = seq_len;
  p.f = f;
  p.consts = consts;
  v->Ashift = Ashift;
  v->pishift = pishift;
  v->A_nan = A_nan;
  v->pi_nan = pi_nan;
  v->expA = expA;
  v->work = v->Ta == 1 ? (double*)0 : scratch.get<double>(p.B * KK);
  start_dev_kernel(hmm_infer_scan, (p));
  hmm_infer_raise(p.check, terms);
  if (p.B > 0) start_dev_kernel(hmm_var_status, (p, *v));
  return p;
}

// The start of the entry points: the argument counts checked, then hmm_var_setup in the terms of `fn`.
struct HmmVarCall {
  HmmScratch scratch;
  HmmVarying v;
  HmmInferParams p;
  HmmVarCall(const char* fn, Ndarray** inputs, int n_inputs, int want_inputs, int n_outputs, int want_outputs) {
    assert_cmp(n_inputs, ==, want_inputs);
    assert_cmp(n_outputs, ==, want_outputs);
    p = hmm_var_setup(scratch, inputs, &v, fn);
  }
};

// The backward pass of sequence b (T_b > 0, filtered: status HMM_SCALED) from its filter alpha, c, m: beta from f,
// and per frame t the weighted marginals g * gamma_t(k) (sink.state(t, k, value)) and for t >= 1 the weighted pair
// marginals g * p(z_{t-1} = i, z_t = j | x) = a * A_t(i, j) * v[j] per row i (sink.row(t, i, a, A_t row i, v), a != 0
// only).  work: 3 Kp doubles.
template <typename Sink>
DEV_FUNC void hmm_var_smooth(const HmmInferParams& p, const HmmVarying& v, int64_t b, const double* alpha,
                             const double* c, const double* m, double g, double* work, Sink& sink) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b];
  const HmmVaryingSteps steps{&p, &v};
  double* beta = work;
  double* E = beta + p.Kp;
  double* nb = E + p.Kp;
  for (int64_t k = 0; k < K; ++k) beta[k] = p.f[k];
  hmm_post_normalise(K, alpha + ((len - 1) * B + b) * K, beta, (double*)0);
  for (int64_t t = len - 1; t >= 0; --t) {
    const int64_t tb = t * B + b;
    const double* at = alpha + tb * K;
    const double r = g / hmm_dot(at, beta, K);
    for (int64_t k = 0; k < K; ++k) sink.state(t, k, at[k] * beta[k] * r);
    if (t == 0) break;
    const double* A = steps.matrix(t, b);
    hmm_infer_emissions(p, t, b, m[tb], E);
    for (int64_t k = 0; k < K; ++k) E[k] *= beta[k];  // E_t beta_t
    const double* ap = alpha + (tb - B) * K;
    const double x = r / c[tb];
    for (int64_t i = 0; i < K; ++i) {
      const double* Ai = A + i * K;
      nb[i] = hmm_dot(Ai, E, K);
      const double ai = ap[i] * x;
      if (ai != 0.0) sink.row(t, i, ai, Ai, E);
    }
    for (int64_t k = 0; k < K; ++k) beta[k] = nb[k];
    hmm_post_normalise(K, ap, beta, (double*)0);
  }
}

// ---------------------------------------------------------------- gradients
// The parameters' gradient accumulators (double, summed over the batch): (Ta, Ba, K, K), (Bp, K), (K).
struct HmmVarGrad {
  double *dA, *dpi, *df;
};

static HmmVarGrad hmm_var_grad_start(HmmScratch& scratch, const HmmInferParams& p, const HmmVarying& v) {
  const int64_t K = p.K, nA = v.Ta * v.Ba * K * K, n = nA + v.Bp * K + K;
  double* acc = scratch.get<double>(n);
  Ndarray_memset(acc, 0, n * sizeof(double));
  HmmVarGrad gr = {acc, acc + nA, acc + nA + v.Bp * K};
  return gr;
}

DEF_KERNEL void hmm_var_store(int64_t n, const double* acc, Float* out) {
  GRID_LOOP(i, n) out[i] = (Float)acc[i];
}

// The accumulators into the gradient op's outputs 1-3: d log_transitions, d log_initial, d log_final.
static void hmm_var_grad_store(const HmmInferParams& p, const HmmVarying& v, const HmmVarGrad& gr,
                               Ndarray*** outputs) {
  const int64_t K = p.K;
  start_dev_kernel(hmm_var_store, (v.Ta * v.Ba * K * K, gr.dA, Ndarray_DEV_DATA(*outputs[1])));
  start_dev_kernel(hmm_var_store, (v.Bp * K, gr.dpi, Ndarray_DEV_DATA(*outputs[2])));
  start_dev_kernel(hmm_var_store, (K, gr.df, Ndarray_DEV_DATA(*outputs[3])));
  HANDLE_LAST_ERROR();
}

// NaN into every gradient entry sequence b (status HMM_NAN) touches: its valid frames of d log e (T, B, K), the
// matrices and the initial row it uses, d log f.
DEV_FUNC void hmm_var_grad_nan(const HmmInferParams& p, const HmmVarying& v, int64_t b, Float* dle, HmmVarGrad gr) {
  const int64_t K = p.K, len = p.seq_len[b];
  const double nan = (double)NAN_F;
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t k = 0; k < K; ++k) dle[(t * p.B + b) * K + k] = (Float)NAN_F;
    if (t > 0)
      for (int64_t i = 0; i < K * K; ++i) elem_atomic_add(gr.dA + hmm_var_matrix(v, t, b) * K * K + i, nan);
  }
  for (int64_t k = 0; k < K; ++k) {
    elem_atomic_add(gr.dpi + hmm_var_initial(v, b) * K + k, nan);
    elem_atomic_add(gr.df + k, nan);
  }
}

#endif  // PTNATIVE_HMM_HMM_VARYING_H
