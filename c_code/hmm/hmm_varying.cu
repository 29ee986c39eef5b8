// Dense K-state HMM log-likelihood with batched or time-varying transitions and batched initial weights, and its
// gradients (the parameters as hmm_varying.h takes them).
//
// The forward is the scaled filter of hmm_infer.h with hmm_varying.h's steps; the backward recomputes beta, gamma
// (d log e, d log pi, d log f) and xi_t (d log A of the matrix frame t used) by hmm_var_smooth.
//
// A NaN in a sequence's emissions (valid frames) or in a matrix or initial row it uses gives it the log-likelihood
// NaN and NaN in every gradient entry it touches.  No path: -inf, gradient 0.  The empty series: 0.
#include "../dialect/kernel.h"

#include "hmm_varying.h"

// Per sequence: the filter and the log-likelihood.
DEF_KERNEL void hmm_var_forward(HmmInferParams p, HmmVarying v, double* alpha, double* c, double* m, double* status,
                                double* work, Float* ll) {
  GRID_LOOP(b, p.B) {
    const int64_t len = p.seq_len[b];
    int st = p.status[b];
    if (st == HMM_SCALED && len > 0)
      st = hmm_infer_filter(p, b, alpha, c, m, work + b * p.Kp, p.f, HmmVaryingSteps{&p, &v});
    status[b] = st;
    if (len == 0) {
      ll[b] = (Float)0.0;
      continue;
    }
    if (st != HMM_SCALED) {
      ll[b] = st == HMM_NAN ? (Float)NAN_F : (Float)-INFINITY;
      continue;
    }
    double acc = v.pishift[hmm_var_initial(v, b)] + p.consts[2];
    for (int64_t t = 0; t < len; ++t) {
      const int64_t tb = t * p.B + b;
      acc += log(c[tb]) + m[tb];
      if (t > 0) acc += v.Ashift[hmm_var_matrix(v, t, b)];
    }
    const double* al = alpha + ((len - 1) * p.B + b) * p.K;
    double s = 0.0;
    for (int64_t k = 0; k < p.K; ++k) s += al[k] * p.f[k];
    ll[b] = (Float)(acc + log(s));
  }
}

// inputs: log_emissions (T,B,K), log_transitions (Ta,Ba,K,K), log_initial (Bp,K), log_final (K), mask (T,B)
// outputs: log_likelihood (B); hidden (double): alpha (T,B,K), c (T,B), m (T,B), status (B)
static void hmm_varying_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmVarCall call("hmm_log_likelihood", inputs, n_inputs, 5, n_outputs, 5);
  const HmmInferParams& p = call.p;
  if (p.B == 0) return;
  start_dev_kernel(hmm_var_forward, (p, call.v, (double*)(*outputs[1])->data, (double*)(*outputs[2])->data,
                                     (double*)(*outputs[3])->data, (double*)(*outputs[4])->data,
                                     call.scratch.get<double>(p.B * p.Kp), Ndarray_DEV_DATA(*outputs[0])));
  HANDLE_LAST_ERROR();
}

// ---------------------------------------------------------------- gradient
// hmm_var_smooth's sink for the gradients: gamma into d log e (and d log pi, d log f at the ends), the pair
// marginals into d log A of the matrix of their frame (the nonzero ones: atomics on CUDA).
struct HmmVarLikSink {
  const HmmInferParams* p;
  const HmmVarying* v;
  int64_t b;
  Float* dle;
  HmmVarGrad gr;
  DEV_FUNC void state(int64_t t, int64_t k, double gam) const {
    dle[(t * p->B + b) * p->K + k] = (Float)gam;
    if (t == 0) elem_atomic_add(gr.dpi + hmm_var_initial(*v, b) * p->K + k, gam);
    if (t == p->seq_len[b] - 1) elem_atomic_add(gr.df + k, gam);
  }
  DEV_FUNC void row(int64_t t, int64_t i, double a, const double* Ai, const double* E) const {
    double* d = gr.dA + (hmm_var_matrix(*v, t, b) * p->K + i) * p->K;
    for (int64_t j = 0; j < p->K; ++j) {
      const double x = a * Ai[j] * E[j];
      if (x != 0.0) elem_atomic_add(d + j, x);
    }
  }
};

DEF_KERNEL void hmm_var_backward(HmmInferParams p, HmmVarying v, const double* alpha, const double* c,
                                 const double* m, const double* status, const Float* g, double* work, Float* dle,
                                 HmmVarGrad gr) {
  GRID_LOOP(b, p.B) {
    const int64_t len = p.seq_len[b];
    hmm_zero_frames(dle, len == 0 || status[b] == HMM_NO_PATH ? 0 : len, p.T, p.B, p.K, b);  // padded frames too
    if (len == 0 || status[b] == HMM_NO_PATH) continue;
    if (status[b] == HMM_NAN) {
      hmm_var_grad_nan(p, v, b, dle, gr);
      continue;
    }
    HmmVarLikSink sink = {&p, &v, b, dle, gr};
    hmm_var_smooth(p, v, b, alpha, c, m, (double)g[b], work + b * 3 * p.Kp, sink);
  }
}

// inputs: the five inputs, alpha, c, m, status (hidden outputs), D_log_likelihood (B)
// outputs: d log_emissions (T,B,K), d log_transitions (Ta,Ba,K,K), d log_initial (Bp,K), d log_final (K)
static void hmm_varying_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmVarCall call("hmm_log_likelihood", inputs, n_inputs, 10, n_outputs, 4);
  const HmmInferParams& p = call.p;
  const HmmVarying& v = call.v;
  if (p.B == 0) return;
  assert_cmp(Ndarray_DIMS(inputs[8])[0], ==, p.B);
  const HmmVarGrad gr = hmm_var_grad_start(call.scratch, p, v);
  start_dev_kernel(hmm_var_backward, (p, v, (const double*)inputs[5]->data, (const double*)inputs[6]->data,
                                      (const double*)inputs[7]->data, (const double*)inputs[8]->data,
                                      Ndarray_DEV_DATA(inputs[9]), call.scratch.get<double>(p.B * 3 * p.Kp),
                                      Ndarray_DEV_DATA(*outputs[0]), gr));
  hmm_var_grad_store(p, v, gr, outputs);
}
