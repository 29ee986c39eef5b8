// Dense K-state HMM: smoothed state marginals gamma_t(k) = p(z_t = k | x) and expected transition counts
// xi(i, j) = sum_{t >= 1} p(z_{t-1} = i, z_t = j | x), and their vector-Jacobian product.
//
// Forward: the scaled filter of hmm_infer.cu (kept as hidden outputs alpha, c, m, status for the gradient op).
// Backward: beta_{T_b-1} = f, beta_{t-1} = A (E_t * beta_t), each renormalised to sum 1 and set to 0 where
// alpha is 0 (states no path reaches: their beta does not matter, and zeroing keeps inf * 0 out);
// gamma_t = alpha_t beta_t / z_t with z_t = alpha_t . beta_t, and
// xi += alpha_{t-1}(i) A(i, j) E_t(j) beta_t(j) / (c_t z_t).
//
// Gradient: with upstream G (T, B, K) for gamma and H (B, K, K) for xi, the vector-Jacobian product is a
// covariance under the posterior: d/d log e_t(k) = E[F 1{z_t = k}] - E[F] gamma_t(k), with the path functional
// F = sum_t G_t(z_t) + sum_{t >= 1} H(z_{t-1}, z_t) (log e, log pi and log f enter log p(path) through state
// indicators, log A through transition indicators).  E[F 1{...}] comes from a tangent forward r (r_0 = alpha_0 G_0,
// r_t = ((r_{t-1} A + (alpha_{t-1} (A o H))) E_t / c_t + alpha_t G_t) and a tangent backward s (s_{T_b-1} = 0,
// s_{t-1}(i) = sum_j A(i, j) E_t(j) (s_t(j) + beta_t(j) (G_t(j) + H(i, j))), scaled like beta), so that
// E[F 1{z_t = k}] = (r_t(k) beta_t(k) + alpha_t(k) s_t(k)) / z_t.
//
// A sequence without a path gets all-zero marginals, counts and gradients; one with a NaN input NaN marginals and
// counts (and NaN gradients; the shared parameters' gradients are then NaN).  The empty series: zeros.

#include "hmm_infer.cu"

struct HmmPostState {
  double *alpha, *c, *m;  // hidden outputs of the forward op
  double* status;         // hidden output: the sequence's status (double, like hmm.cu's)
};

// The forward op's work per sequence b: pred, beta, v (Kp each) in work + b * 3 Kp; xi (K x K, double) after the
// B * 3 Kp of those.  small: 9 T per sequence for the CPU's one-sequence path (null where no part is one sequence).
struct HmmPostWork {
  double* work;
  int64_t B, Kp, K;
  double* small;
  DEV_FUNC double* pred(int64_t b) const { return work + b * 3 * Kp; }
  DEV_FUNC double* beta(int64_t b) const { return work + b * 3 * Kp + Kp; }
  DEV_FUNC double* v(int64_t b) const { return work + b * 3 * Kp + 2 * Kp; }
  DEV_FUNC double* xi(int64_t b) const { return work + B * 3 * Kp + b * K * K; }
};

DEV_FUNC void hmm_post_fwd_step(const HmmInferParams& p, const HmmPostState& st, const HmmPostWork& w, int64_t t,
                                int64_t b) {
  if (t >= p.seq_len[b] || st.status[b] != HMM_SCALED) return;
  st.status[b] = hmm_infer_filter_step(p, t, b, st.alpha, st.c, st.m, w.pred(b), p.f, HmmSharedSteps{&p});
}

// gamma_t, and for t > 0 the pair marginals of (t-1, t) (divided by A: U += alpha_{t-1} v^T / (c_t z_t)) and
// beta_{t-1}.
DEV_FUNC void hmm_post_bwd_step(const HmmInferParams& p, const HmmPostState& st, const HmmPostWork& w, int64_t t,
                                int64_t b, Float* gamma) {
  const int64_t B = p.B, K = p.K, len = p.seq_len[b], tb = t * B + b;
  if (t >= len || st.status[b] != HMM_SCALED) return;
  double* beta = w.beta(b);
  double* v = w.v(b);
  const double* at = st.alpha + tb * K;
  if (t == len - 1) {
    for (int64_t k = 0; k < K; ++k) beta[k] = p.f[k];
    hmm_post_normalise(K, at, beta, (double*)0);
  }
  const double rz = 1.0 / hmm_dot(at, beta, K);
  for (int64_t k = 0; k < K; ++k) gamma[tb * K + k] = (Float)(at[k] * beta[k] * rz);
  if (t == 0) return;
  hmm_infer_emissions(p, t, b, st.m[tb], v);
  for (int64_t k = 0; k < K; ++k) v[k] *= beta[k];
  const double* ap = st.alpha + (tb - B) * K;
  const double x = rz / st.c[tb];
  double* U = w.xi(b);  // xi / A, multiplied by A in hmm_post_finish
  for (int64_t i = 0; i < K; ++i) {
    const double ai = ap[i] * x;
    if (ai == 0.0) continue;
    double* Ur = U + i * K;
#if !CUDA
#pragma GCC ivdep
#endif
    for (int64_t j = 0; j < K; ++j) Ur[j] += ai * v[j];
  }
  hmm_infer_matvec(p, v, beta, true);  // beta_{t-1} = A v
  hmm_post_normalise(K, ap, beta, (double*)0);
}

// Sequence b's counts; a sequence without a path gets zeros, one with a NaN NaN on its valid frames.
DEV_FUNC void hmm_post_finish(const HmmInferParams& p, const HmmPostState& st, const HmmPostWork& w, int64_t b,
                              Float* gamma, Float* xi_out) {
  const int64_t K = p.K, len = p.seq_len[b];
  Float* xo = xi_out + b * K * K;
  const double* xi = w.xi(b);
  if (len > 0 && st.status[b] != HMM_SCALED) {
    const Float fill = st.status[b] == HMM_NAN ? (Float)NAN_F : (Float)0.0;
    for (int64_t t = 0; t < len; ++t)
      for (int64_t k = 0; k < K; ++k) gamma[(t * p.B + b) * K + k] = fill;
    for (int64_t i = 0; i < K * K; ++i) xo[i] = fill;
    return;
  }
  for (int64_t i = 0; i < K * K; ++i) xo[i] = (Float)(xi[i] * p.A[i]);
}

#if !CUDA
// ---------------------------------------------------------------- one sequence, K <= 4, on the CPU
// The same recursions for a part of the batch that is one sequence (its chain of steps is then the whole work),
// with the state vectors in registers (K known at compile time) and the chain from step to step kept short: the
// exps and the normalisers' divisions are off it (the next step's product starts from the unnormalised vector and
// is scaled by the divisor when it arrives), so that the processor overlaps them with the chain.  Forward,
// E_t = exp(log e_t - max_k log e_t), which is the filter's E_t whenever the frame's largest emission is at a
// reachable state (else the step computes it as hmm_infer_filter_step does); backward, the filter's own shifts.

// log e_t of sequence b in lanes [0, K), -inf in the others.
template <int K>
static inline hmm_v4d hmm_small_le(const HmmInferParams& p, int64_t t, int64_t b) {
  return hmm_lanes<K>(p.le + (t * p.B + b) * K, -INFINITY);
}

// 0 where alpha is 0 (as hmm_post_normalise).
static inline hmm_v4d hmm_small_mask(hmm_v4d alpha, hmm_v4d beta) {
  return alpha > hmm_splat(0.0) ? beta : hmm_splat(0.0);
}

static inline double hmm_small_inverse(double s) { return s > 0.0 ? 1.0 / s : 0.0; }

// The filter and the backward recursion of sequence b at once, as two independent chains that the processor
// overlaps, then gamma and U = xi / A (into xi) in one pass over the frames.  E_t = exp(log e_t - max_k log e_t)
// comes first for all frames (one vectorised exp per frame, shared by both chains and the last pass): it is the
// filter's E_t whenever the frame's largest emission is at a reachable state (else the filter's step computes its
// own, as hmm_infer_filter_step does).  The backward runs without hmm_small_mask and with these E_t, which is what
// the sequential pass computes when every state has alpha_t > 0 at every frame (m_t is then that maximum, the
// zeroing does nothing): *done says whether that held (else the caller runs hmm_post_small_backward on the stored
// filter).  Returns the filter's status.  buf: 9 T_b doubles (beta_t, E_t per frame, then the maxima).
template <int K>
static int hmm_post_small_fused(const HmmInferParams& p, const HmmPostState& st, int64_t b, Float* gamma,
                                double* xi, double* buf, bool* done) {
  const int64_t B = p.B, len = p.seq_len[b];
  double *beta = buf, *E = buf + 4 * len, *maxima = buf + 8 * len;
  for (int64_t t = 0; t < len; ++t) {
    const hmm_v4d le = hmm_small_le<K>(p, t, b);
    maxima[t] = hmm_lane_max<K>(le);
    hmm_store_lanes<4>(E + 4 * t, hmm_exp_below(le, maxima[t]));
  }
  hmm_v4d A[4], AT[4];
  hmm_rows<K>(p.Ap, A);
  hmm_rows<K>(p.ATp, AT);
  hmm_v4d u = hmm_lanes<K>(p.pi), beta_u = hmm_lanes<K>(p.f);
  double inv = 1.0;
  hmm_v4d positive = hmm_splat(1.0);  // lanes [0, K) of every alpha_t > 0 (their product)
  *done = false;
  for (int64_t i = 0; i < len; ++i) {
    {  // forward, frame i: hmm_infer_filter_step
      const int64_t tb = i * B + b;
      const hmm_v4d le = hmm_small_le<K>(p, i, b);
      const hmm_v4d pred = i == 0 ? u : hmm_vecmat<K>(u, A) * inv;
      const double mt = hmm_lane_max<K>(pred > hmm_splat(0.0) ? le : hmm_splat(-INFINITY));
      if (!(mt > -INFINITY)) return HMM_NO_PATH;
      u = pred * (mt == maxima[i] ? hmm_lanes<4>(E + 4 * i) : hmm_exp_below(le, mt));
      const double s = hmm_hsum(u);
      if (!(s > 0.0)) return HMM_NO_PATH;
      inv = 1.0 / s;
      const hmm_v4d a = u * inv;
      positive = a > hmm_splat(0.0) ? positive : hmm_splat(0.0);
      hmm_store_lanes<K>(st.alpha + tb * K, a);
      st.c[tb] = s;
      st.m[tb] = mt;
    }
    {  // backward, frame len - 1 - i
      const int64_t t = len - 1 - i;
      const double binv = hmm_small_inverse(hmm_hsum(beta_u));
      hmm_store_lanes<4>(beta + 4 * t, beta_u * binv);
      if (t > 0) beta_u = hmm_vecmat<K>(hmm_lanes<4>(E + 4 * t) * beta_u, AT) * binv;
    }
  }
  if (!(hmm_hsum(u * hmm_lanes<K>(p.f)) > 0.0)) return HMM_NO_PATH;
  for (int k = 0; k < K; ++k)
    if (!(positive[k] > 0.0)) return HMM_SCALED;
  hmm_v4d U[4], ap = hmm_splat(0.0);
  for (int i = 0; i < 4; ++i) U[i] = hmm_splat(0.0);
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tb = t * B + b;
    const hmm_v4d a = hmm_lanes<K>(st.alpha + tb * K), bt = hmm_lanes<4>(beta + 4 * t), ab = a * bt;
    const double rz = 1.0 / hmm_hsum(ab);
    hmm_store_lanes<K>(gamma + tb * K, ab * rz);
    if (t > 0) {
      const hmm_v4d v = hmm_lanes<4>(E + 4 * t) * bt, x = ap * (rz / st.c[tb]);
      for (int k = 0; k < K; ++k) U[k] += hmm_splat(x[k]) * v;
    }
    ap = a;
  }
  for (int k = 0; k < K; ++k) hmm_store_lanes<K>(xi + k * K, U[k]);
  *done = true;
  return HMM_SCALED;
}

// The backward pass of sequence b after a successful filter: gamma, and U = xi / A into xi (K x K).
template <int K>
static void hmm_post_small_backward(const HmmInferParams& p, const HmmPostState& st, int64_t b, Float* gamma,
                                    double* xi) {
  const int64_t B = p.B, len = p.seq_len[b];
  hmm_v4d AT[4], U[4];
  hmm_rows<K>(p.ATp, AT);
  for (int i = 0; i < 4; ++i) U[i] = hmm_splat(0.0);
  hmm_v4d a = hmm_lanes<K>(st.alpha + ((len - 1) * B + b) * K);
  hmm_v4d beta_u = hmm_small_mask(a, hmm_lanes<K>(p.f));  // beta_t times its sum
  for (int64_t t = len - 1;; --t) {
    const int64_t tb = t * B + b;
    const double inv = hmm_small_inverse(hmm_hsum(beta_u));
    const hmm_v4d beta = beta_u * inv;
    const hmm_v4d ab = a * beta;
    const double rz = 1.0 / hmm_hsum(ab);
    hmm_store_lanes<K>(gamma + tb * K, ab * rz);
    if (t == 0) break;
    const hmm_v4d w = hmm_exp_below(hmm_small_le<K>(p, t, b), st.m[tb]) * beta_u;
    const hmm_v4d ap = hmm_lanes<K>(st.alpha + (tb - B) * K);
    const hmm_v4d v = w * inv;  // E_t beta_t
    const hmm_v4d x = ap * (rz / st.c[tb]);
    for (int i = 0; i < K; ++i) U[i] += hmm_splat(x[i]) * v;
    beta_u = hmm_small_mask(ap, hmm_vecmat<K>(w, AT) * inv);
    a = ap;
  }
  for (int i = 0; i < K; ++i) hmm_store_lanes<K>(xi + i * K, U[i]);
}
#endif

// Forward op: the filter, then the backward pass writing gamma and xi.  The CPU runs time outer and batch inner
// (the sequences' independent recursions overlap in the pipeline) over the sequences [b0, b1) of one part of the
// batch (hmm_run_parts: one per CPU thread for large problems); CUDA one thread per sequence.
DEF_KERNEL void hmm_post_kernel(HmmInferParams p, HmmPostState st, HmmPostWork w, Float* gamma, Float* xi_out,
                                int64_t b0, int64_t b1) {
#if CUDA
  GRID_LOOP(i, b1 - b0) {
    const int64_t b = b0 + i;
    st.status[b] = p.status[b];
    for (int64_t j = 0; j < p.K * p.K; ++j) w.xi(b)[j] = 0.0;
    for (int64_t t = 0; t < p.seq_len[b]; ++t) hmm_post_fwd_step(p, st, w, t, b);
    for (int64_t t = p.seq_len[b] - 1; t >= 0; --t) hmm_post_bwd_step(p, st, w, t, b, gamma);
    hmm_post_finish(p, st, w, b, gamma, xi_out);
  }
#else
  for (int64_t b = b0; b < b1; ++b) {
    st.status[b] = p.status[b];
    for (int64_t j = 0; j < p.K * p.K; ++j) w.xi(b)[j] = 0.0;
  }
  if (w.small && b1 - b0 == 1) {  // one sequence of few states
    if (p.seq_len[b0] > 0 && st.status[b0] == HMM_SCALED)
      hmm_with_k(p.K, [&](auto k) {
        constexpr int K = decltype(k)::value;
        bool done;
        st.status[b0] = hmm_post_small_fused<K>(p, st, b0, gamma, w.xi(b0), w.small + 9 * p.T * b0, &done);
        if (st.status[b0] == HMM_SCALED && !done) hmm_post_small_backward<K>(p, st, b0, gamma, w.xi(b0));
      });
    hmm_post_finish(p, st, w, b0, gamma, xi_out);
    return;
  }
  hmm_time_outer(p.T, b0, b1, false, [&](int64_t t, int64_t b) { hmm_post_fwd_step(p, st, w, t, b); });
  hmm_time_outer(p.T, b0, b1, true, [&](int64_t t, int64_t b) { hmm_post_bwd_step(p, st, w, t, b, gamma); });
  for (int64_t b = b0; b < b1; ++b) hmm_post_finish(p, st, w, b, gamma, xi_out);
#endif
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B)
// outputs: marginals (T,B,K), counts (B,K,K); hidden (double): alpha (T,B,K), c (T,B), m (T,B), status (B)
static void hmm_posteriors_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmInferCall call("hmm_posteriors", inputs, n_inputs, 5, n_outputs, 6);
  const HmmInferParams& p = call.p;
  if (p.B == 0) return;
  HmmPostState st;
  st.alpha = (double*)(*outputs[2])->data;
  st.c = (double*)(*outputs[3])->data;
  st.m = (double*)(*outputs[4])->data;
  st.status = (double*)(*outputs[5])->data;
  HmmPostWork w = {call.scratch.get<double>(p.B * (3 * p.Kp + p.K * p.K)), p.B, p.Kp, p.K, (double*)0};
#if !CUDA
  if (p.Kp == 4 && hmm_cpu_parts(p.T, p.B, p.K) == p.B) w.small = call.scratch.get<double>(9 * p.T * p.B);
#endif
  HMM_OVER_BATCH(call, hmm_post_kernel, p, st, w, Ndarray_DEV_DATA(*outputs[0]), Ndarray_DEV_DATA(*outputs[1]));
  HANDLE_LAST_ERROR();
}

// ---------------------------------------------------------------- gradient
// Per sequence: the tangent forward r (T, B, K scratch), then beta, s backwards with the products.
// dA_acc (K x K), dpi_acc, df_acc (K): double accumulators shared by the batch (atomics on CUDA).
DEF_KERNEL void hmm_post_grad_kernel(HmmInferParams p, HmmPostState st, const Float* G, const Float* H, double* r,
                                     double* work, Float* dle, double* dA_acc, double* dpi_acc, double* df_acc,
                                     int32_t* any_nan) {
  GRID_LOOP(b, p.B) {
    const int64_t B = p.B, K = p.K, len = p.seq_len[b];
    const int status = (int)st.status[b];
    if (len == 0 || status == HMM_NO_PATH) continue;  // dle stays 0
    if (status == HMM_NAN) {
      for (int64_t t = 0; t < len; ++t)
        for (int64_t k = 0; k < K; ++k) dle[(t * B + b) * K + k] = (Float)NAN_F;
      elem_atomic_add(any_nan, 1);
      continue;
    }
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
      for (int64_t j = 0; j < K; ++j) u[j] = 0.0;
      for (int64_t i = 0; i < K; ++i) {
        const double ri = rp[i], ai = ap[i];
        const double* Ai = p.A + i * K;
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
        if (t == 0) elem_atomic_add(dpi_acc + k, gk);
        if (tb == last) elem_atomic_add(df_acc + k, gk);
      }
      if (t == 0) break;
      const Float* Gt = G + tb * K;
      hmm_infer_emissions(p, t, b, st.m[tb], E);
      const double* ap = st.alpha + (tb - B) * K;
      const double* rp = r + (tb - B) * K;
      const double x = rz / st.c[tb];
      for (int64_t i = 0; i < K; ++i) {
        const double* Ai = p.A + i * K;
        const Float* Hi = Hb + i * K;
        double bi = 0.0, si = 0.0;
        for (int64_t j = 0; j < K; ++j) {
          const double w = Ai[j] * E[j];
          const double gh = (double)Gt[j] + (double)Hi[j];
          bi += w * beta[j];
          si += w * (s[j] + beta[j] * gh);
          const double dij = w * x * (rp[i] * beta[j] + ap[i] * (beta[j] * (gh - ef) + s[j]));
          if (dij != 0.0) elem_atomic_add(dA_acc + i * K + j, dij);
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
}

DEF_KERNEL void hmm_post_grad_store(int64_t K, const double* dA_acc, const double* dpi_acc, const double* df_acc,
                                    const int32_t* any_nan, Float* dA, Float* dpi, Float* df) {
  GRID_LOOP(i, K * K) {
    const bool nan = any_nan[0] != 0;
    dA[i] = nan ? (Float)NAN_F : (Float)dA_acc[i];
    if (i < K) {
      dpi[i] = nan ? (Float)NAN_F : (Float)dpi_acc[i];
      df[i] = nan ? (Float)NAN_F : (Float)df_acc[i];
    }
  }
}

// inputs: the five inputs, alpha, c, m, status (hidden outputs), D_marginals (T,B,K), D_counts (B,K,K)
// outputs: d log_emissions (T,B,K), d log_transitions (K,K), d log_initial (K), d log_final (K)
static void hmm_posteriors_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  HmmInferCall call("hmm_posteriors", inputs, n_inputs, 11, n_outputs, 4);
  const HmmInferParams& p = call.p;
  HmmScratch& scratch = call.scratch;
  const int64_t T = p.T, B = p.B, K = p.K;
  if (B == 0) return;
  assert_cmp(Ndarray_DIMS(inputs[9])[0], ==, T);
  assert_cmp(Ndarray_DIMS(inputs[10])[0], ==, B);
  HmmPostState st;
  st.alpha = (double*)inputs[5]->data;
  st.c = (double*)inputs[6]->data;
  st.m = (double*)inputs[7]->data;
  st.status = (double*)inputs[8]->data;
  double* acc = scratch.get<double>(K * K + 2 * K);
  Ndarray_memset(acc, 0, (K * K + 2 * K) * sizeof(double));
  int32_t* any_nan = scratch.get<int32_t>(1);
  Ndarray_memset(any_nan, 0, sizeof(int32_t));
  double* r = scratch.get<double>(T * B * K);
  double* work = scratch.get<double>(B * 5 * p.Kp);
  start_dev_kernel(hmm_post_grad_kernel, (p, st, Ndarray_DEV_DATA(inputs[9]), Ndarray_DEV_DATA(inputs[10]), r, work,
                                          Ndarray_DEV_DATA(*outputs[0]), acc, acc + K * K, acc + K * K + K, any_nan));
  start_dev_kernel(hmm_post_grad_store, (K, acc, acc + K * K, acc + K * K + K, any_nan, Ndarray_DEV_DATA(*outputs[1]),
                                         Ndarray_DEV_DATA(*outputs[2]), Ndarray_DEV_DATA(*outputs[3])));
  HANDLE_LAST_ERROR();
}
