// Smoothed state marginals and expected transition counts of a dense K-state HMM with batched or time-varying
// transitions and batched initial weights (the parameters as hmm_varying.h takes them), and their vector-Jacobian
// product (the math of hmm_posteriors.cu, per frame with the matrix that frame uses).
//
// Forward: the scaled filter with hmm_varying.h's steps (kept as hidden outputs alpha, c, m, status), then
// hmm_var_smooth writing gamma and summing the pair marginals of every frame into the sequence's counts.
// Backward: hmm_post_grad_seq (hmm_posteriors_grad.h) with each frame's matrix; the gradient of log_transitions has
// its (Ta, Ba, K, K) shape, that of log_initial (Bp, K).
//
// A sequence without a path gets all-zero marginals, counts and gradients; one with a NaN (on a valid frame, in
// log_final, or in a matrix or initial row it uses) NaN marginals and counts, and NaN in every gradient entry it
// touches.  The empty series: zeros.
#include "../dialect/kernel.h"

#include "hmm_varying.h"
#include "hmm_posteriors_grad.h"

// hmm_var_smooth's sink for the posteriors of sequence b: gamma (T, B, K) and the counts xi (K x K, double).
struct HmmVarPostSink {
  int64_t B, K, b;
  Float* gamma;
  double* xi;
  DEV_FUNC void state(int64_t t, int64_t k, double g) const { gamma[(t * B + b) * K + k] = (Float)g; }
  DEV_FUNC void row(int64_t, int64_t i, double a, const double* __restrict__ Ai, const double* __restrict__ E) const {
    double* __restrict__ x = xi + i * K;
#if !CUDA
#pragma GCC ivdep
#endif
    for (int64_t j = 0; j < K; ++j) x[j] += a * Ai[j] * E[j];
  }
};

// Per sequence: the filter, then the marginals and counts.  work: Kp (pred) + 3 Kp (smoothing) + K K (counts).
DEF_KERNEL void hmm_var_post_forward(HmmInferParams p, HmmVarying v, HmmPostState st, double* work, Float* gamma,
                                     Float* counts) {
  GRID_LOOP(b, p.B) {
    const int64_t K = p.K, len = p.seq_len[b];
    double* pred = work + b * (4 * p.Kp + K * K);
    double* xi = pred + 4 * p.Kp;
    int s = p.status[b];
    if (s == HMM_SCALED && len > 0)
      s = hmm_infer_filter(p, b, st.alpha, st.c, st.m, pred, p.f, HmmVaryingSteps{&p, &v});
    st.status[b] = s;
    for (int64_t i = 0; i < K * K; ++i) xi[i] = 0.0;
    Float* xo = counts + b * K * K;
    if (len > 0 && s != HMM_SCALED) {
      const Float fill = s == HMM_NAN ? (Float)NAN_F : (Float)0.0;
      for (int64_t t = 0; t < len; ++t)
        for (int64_t k = 0; k < K; ++k) gamma[(t * p.B + b) * K + k] = fill;
      for (int64_t i = 0; i < K * K; ++i) xo[i] = fill;
      continue;
    }
    if (len > 0) {
      HmmVarPostSink sink = {p.B, K, b, gamma, xi};
      hmm_var_smooth(p, v, b, st.alpha, st.c, st.m, 1.0, pred + p.Kp, sink);
    }
    for (int64_t i = 0; i < K * K; ++i) xo[i] = (Float)xi[i];
  }
}

// inputs: log_emissions (T,B,K), log_transitions (Ta,Ba,K,K), log_initial (Bp,K), log_final (K), mask (T,B)
// outputs: marginals (T,B,K), counts (B,K,K); hidden (double): alpha (T,B,K), c (T,B), m (T,B), status (B)
static void hmm_varying_posteriors_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmVarCall call("hmm_posteriors", inputs, n_inputs, 5, n_outputs, 6);
  const HmmInferParams& p = call.p;
  if (p.B == 0) return;
  const HmmPostState st = {(double*)(*outputs[2])->data, (double*)(*outputs[3])->data, (double*)(*outputs[4])->data,
                           (double*)(*outputs[5])->data, true};
  double* work = call.scratch.get<double>(p.B * (4 * p.Kp + p.K * p.K));
  start_dev_kernel(hmm_var_post_forward, (p, call.v, st, work, Ndarray_DEV_DATA(*outputs[0]),
                                          Ndarray_DEV_DATA(*outputs[1])));
  HANDLE_LAST_ERROR();
}

// ---------------------------------------------------------------- gradient
// hmm_post_grad_seq's matrices: the one frame t of sequence b uses, its gradient, and the sequence's initial row's.
struct HmmVarMats {
  HmmVaryingSteps steps;
  HmmVarGrad gr;
  DEV_FUNC const double* A(int64_t t, int64_t b) const { return steps.matrix(t, b); }
  DEV_FUNC double* dA(int64_t t, int64_t b) const {
    return gr.dA + hmm_var_matrix(*steps.v, t, b) * steps.p->K * steps.p->K;
  }
  DEV_FUNC double* dpi(int64_t b) const { return gr.dpi + hmm_var_initial(*steps.v, b) * steps.p->K; }
};

DEF_KERNEL void hmm_var_post_grad(HmmInferParams p, HmmVarying v, HmmPostState st, const Float* G, const Float* H,
                                  double* r, double* work, Float* dle, HmmVarGrad gr) {
  GRID_LOOP(b, p.B) {
    const int64_t len = p.seq_len[b];
    const int status = (int)st.status[b];
    hmm_zero_frames(dle, len == 0 || status == HMM_NO_PATH ? 0 : len, p.T, p.B, p.K, b);  // padded frames too
    if (len == 0 || status == HMM_NO_PATH) continue;
    if (status == HMM_NAN) {
      hmm_var_grad_nan(p, v, b, dle, gr);
      continue;
    }
    const HmmVarMats mats = {HmmVaryingSteps{&p, &v}, gr};
    hmm_post_grad_seq(p, st, G, H, r, work, dle, mats, gr.df, b);
  }
}

// inputs: the five inputs, alpha, c, m, status (hidden outputs), D_marginals (T,B,K), D_counts (B,K,K)
// outputs: d log_emissions (T,B,K), d log_transitions (Ta,Ba,K,K), d log_initial (Bp,K), d log_final (K)
static void hmm_varying_posteriors_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmVarCall call("hmm_posteriors", inputs, n_inputs, 11, n_outputs, 4);
  const HmmInferParams& p = call.p;
  if (p.B == 0) return;
  assert_cmp(Ndarray_DIMS(inputs[9])[0], ==, p.T);
  assert_cmp(Ndarray_DIMS(inputs[10])[0], ==, p.B);
  const HmmPostState st = {(double*)inputs[5]->data, (double*)inputs[6]->data, (double*)inputs[7]->data,
                           (double*)inputs[8]->data, true};
  const HmmVarGrad gr = hmm_var_grad_start(call.scratch, p, call.v);
  double* r = call.scratch.get<double>(p.T * p.B * p.K);
  double* work = call.scratch.get<double>(p.B * 5 * p.Kp);
  start_dev_kernel(hmm_var_post_grad, (p, call.v, st, Ndarray_DEV_DATA(inputs[9]), Ndarray_DEV_DATA(inputs[10]), r,
                                       work, Ndarray_DEV_DATA(*outputs[0]), gr));
  hmm_var_grad_store(p, call.v, gr, outputs);
}
