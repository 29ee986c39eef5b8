// The vector-Jacobian product of the posteriors (see hmm_posteriors.cu for the math) for one sequence, shared by
// the shared-parameter op (hmm_posteriors.cu) and the batched / time-varying one (hmm_varying_posteriors.cu): the
// two differ only in where a frame's matrix comes from and where its gradient goes (Mats).
#ifndef PTNATIVE_HMM_HMM_POSTERIORS_GRAD_H
#define PTNATIVE_HMM_HMM_POSTERIORS_GRAD_H

#include "../dialect/kernel.h"

#include "hmm_posteriors_steps.h"

// Sequence b (T_b > 0, status HMM_SCALED): the tangent forward r (T, B, K scratch), then beta, s backwards with the
// products into d log e (dle), the accumulators mats.dA(t, b) (K x K: d log A of the matrix frame t >= 1 uses),
// mats.dpi(b) (K) and df_acc (K) (atomics on CUDA).  mats.A(t, b): the shifted exps (K x K) of that matrix.  G, H:
// the upstream gradients of gamma (T, B, K) and xi (B, K, K); work: 5 Kp doubles per sequence.
template <typename Mats>
DEV_FUNC void hmm_post_grad_seq(const HmmInferParams& p, const HmmPostState& st, const Float* G, const Float* H,
                                double* r, double* work, Float* dle, const Mats& mats, double* df_acc, int64_t b) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b];
  double* E = work + b * 5 * p.Kp;
  double* beta = E + p.Kp;
  double* s = beta + p.Kp;
  double* u = s + p.Kp;
  double* sn = u + p.Kp;
  const Float* Hb = H + b * K * K;
  // tangent forward
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tb = t * B + b;
    const double* at = st.alpha + tb * K;
    double* rt = r + tb * K;
    const Float* Gt = G + tb * K;
    if (t == 0) {
      for (int64_t k = 0; k < K; ++k) rt[k] = at[k] * (double)Gt[k];
      continue;
    }
    const double* ap = st.alpha + (tb - B) * K;
    const double* rp = r + (tb - B) * K;
    const double* A = mats.A(t, b);
    for (int64_t j = 0; j < K; ++j) u[j] = 0.0;
    for (int64_t i = 0; i < K; ++i) {
      const double ri = rp[i], ai = ap[i];
      const double* Ai = A + i * K;
      const Float* Hi = Hb + i * K;
      for (int64_t j = 0; j < K; ++j) u[j] += Ai[j] * (ri + ai * (double)Hi[j]);
    }
    hmm_infer_emissions(p, t, b, st.m[tb], E);
    const double ic = 1.0 / st.c[tb];
    for (int64_t k = 0; k < K; ++k) rt[k] = u[k] * E[k] * ic + at[k] * (double)Gt[k];
  }
  // backward: beta, s, and the products
  const int64_t last = (len - 1) * B + b;
  for (int64_t k = 0; k < K; ++k) {
    beta[k] = p.f[k];
    s[k] = 0.0;
  }
  hmm_post_normalise(K, st.alpha + last * K, beta, s);
  for (int64_t t = len - 1; t >= 0; --t) {
    const int64_t tb = t * B + b;
    const double* at = st.alpha + tb * K;
    const double* rt = r + tb * K;
    double z = 0.0, ef = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      z += at[k] * beta[k];
      ef += rt[k] * beta[k] + at[k] * s[k];
    }
    const double rz = 1.0 / z;
    ef *= rz;  // E[F]
    Float* d = dle + tb * K;
    for (int64_t k = 0; k < K; ++k) {
      const double gk = ((rt[k] * beta[k] + at[k] * s[k]) - ef * at[k] * beta[k]) * rz;
      d[k] = (Float)gk;
      if (t == 0) elem_atomic_add(mats.dpi(b) + k, gk);
      if (tb == last) elem_atomic_add(df_acc + k, gk);
    }
    if (t == 0) break;
    const Float* Gt = G + tb * K;
    hmm_infer_emissions(p, t, b, st.m[tb], E);
    const double* ap = st.alpha + (tb - B) * K;
    const double* rp = r + (tb - B) * K;
    const double x = rz / st.c[tb];
    const double* A = mats.A(t, b);
    double* dA = mats.dA(t, b);
    for (int64_t i = 0; i < K; ++i) {
      const double* Ai = A + i * K;
      const Float* Hi = Hb + i * K;
      double bi = 0.0, si = 0.0;
      for (int64_t j = 0; j < K; ++j) {
        const double w = Ai[j] * E[j];
        const double gh = (double)Gt[j] + (double)Hi[j];
        bi += w * beta[j];
        si += w * (s[j] + beta[j] * gh);
        const double dij = w * x * (rp[i] * beta[j] + ap[i] * (beta[j] * (gh - ef) + s[j]));
        if (dij != 0.0) elem_atomic_add(dA + i * K + j, dij);
      }
      u[i] = bi;
      sn[i] = si;
    }
    for (int64_t i = 0; i < K; ++i) {
      beta[i] = u[i];
      s[i] = sn[i];
    }
    hmm_post_normalise(K, ap, beta, s);
  }
}

#endif  // PTNATIVE_HMM_HMM_POSTERIORS_GRAD_H
