// hmm_log_likelihood's scaled forward-backward on the CPU with the sequences in vector lanes (hmm_lanes_base.h: the
// batch in groups of HMM_W = 8 sequences, one hmm_v8d per state): a step is K^2 lane-wise multiply-adds,
// pred_j = sum_i alpha_{t-1,i} A_ij, alpha_t = pred E_t, its sum over the states lane-wise.  Sums over the batch (the
// shared parameters' gradients) add the groups' partial sums in group order.
//
// The same recursions and status rules as hmm.cu's batch-inner path (hmm_forward_cpu / hmm_backward_cpu): alpha and
// beta scaled by powers of two, a step mass below HMM_TINY sends the sequence to the log-space fallback, a NaN row
// makes it NaN, a +inf one is recorded in `check` (the smallest (frame, sequence) first).  Lanes of padding (a last
// group of fewer than 8 sequences), of finished sequences and of sequences that left the scaled pass carry zeros.
//
// Layout of the kept forward pass (the gradient op's), per group g: alpha and E (T, K, 8) and the step scalings
// (T, 8), from (g T) on.  The forward op alone keeps two alpha vectors and a chunk of emission rows.
#ifndef PTNATIVE_HMM_HMM_LANES_H
#define PTNATIVE_HMM_HMM_LANES_H

#include "../dialect/kernel.h"

#include "hmm_lanes_base.h"
#include "hmm_rows.h"

#if !CUDA
// The scaled forward of group G: statuses and log-likelihoods of its sequences into p.status and ll.  keep: the
// gradient op's pass, alpha, E and the scalings kept in p.aL, p.EL, p.sL; else two alpha vectors and a chunk of
// emission rows in `work` (hmm_lane_work_doubles).
static inline int64_t hmm_lane_work_doubles(int64_t K) { return (2 * K + (HMM_CHUNK + 1) * (K + 1)) * HMM_W; }

static void hmm_lane_forward(const HmmParams& p, int64_t g, bool keep, double* work, double* ll, FsaCheck* check) {
  const int64_t T = p.T, K = p.K;
  const HmmGroup G = hmm_group(p, g);
  hmm_v8l st = {};
  char dead[HMM_W];
  for (int64_t l = 0; l < HMM_W; ++l) {
    st[l] = l < G.n ? (int64_t)p.status[G.b0 + l] : HMM_SCALED;
    dead[l] = st[l] != HMM_SCALED;
  }
  hmm_v8d* roll = (hmm_v8d*)work;  // two alpha vectors (forward op)
  hmm_v8d* chunk_E = roll + 2 * K;
  hmm_v8d* shift = chunk_E + HMM_CHUNK * K;
  double* raw = (double*)(shift + HMM_CHUNK);
  hmm_v8d* aL = keep ? (hmm_v8d*)p.aL + g * T * K : nullptr;
  hmm_v8d* EL = keep ? (hmm_v8d*)p.EL + g * T * K : nullptr;
  hmm_v8d* sL = keep ? (hmm_v8d*)p.sL + g * T : nullptr;
  hmm_v8d mass = {}, shifts = {}, fin = {};
  for (int64_t t0 = 0; t0 < G.t_end; t0 += HMM_CHUNK) {
    const int64_t t1 = std::min<int64_t>(t0 + HMM_CHUNK, G.t_end);
    hmm_v8d* E0 = keep ? EL + t0 * K : chunk_E;
    hmm_lane_emissions(p, G, t0, t1, dead, raw, E0, shift, check);
    for (int64_t t = t0; t < t1; ++t) {
      hmm_v8d* __restrict__ at = keep ? aL + t * K : roll + (t & 1) * K;
      const hmm_v8d* __restrict__ Et = E0 + (t - t0) * K;
      if (t == 0) {
        for (int64_t k = 0; k < K; ++k) at[k] = hmm_bc8(p.pi[k]);
      } else {
        hmm_lane_matvec(keep ? aL + (t - 1) * K : roll + ((t - 1) & 1) * K, K, p.A, at);
      }
      for (int64_t k = 0; k < K; ++k) at[k] *= Et[k];
      const hmm_v8d s = hmm_lane_sum(at, K), m = shift[t - t0];
      const hmm_v8l act = (t < G.len) & (st == (int64_t)HMM_SCALED);
      const hmm_v8l nan = act & (m != m);
      const hmm_v8l ok = act & (m == m) & (s >= HMM_TINY);
      st = ptn_select(nan, hmm_v8l{} + (int64_t)HMM_NAN, st);
      st = ptn_select(act & ~nan & ~ok, hmm_v8l{} + (int64_t)HMM_LOG_SPACE, st);
      const hmm_v8d scale = (hmm_v8d)((hmm_v8l)hmm_inverse_power_of_two8(s) & ok);
      for (int64_t k = 0; k < K; ++k) at[k] *= scale;
      mass += (hmm_v8d)((hmm_v8l)hmm_exponent8(s) & ok);
      shifts += (hmm_v8d)((hmm_v8l)(m + (t == 0 ? p.consts[1] : p.consts[0])) & ok);
      if (keep) sL[t] = scale;
      const hmm_v8l last = ok & (t == G.len - 1);
      bool any_last = false;
      for (int64_t l = 0; l < HMM_W; ++l) any_last |= last[l] != 0;
      if (any_last) {
        hmm_v8d f = at[0] * p.f[0];
        for (int64_t k = 1; k < K; ++k) f += at[k] * p.f[k];
        fin = ptn_select(last, f, fin);
      }
    }
  }
  for (int64_t l = 0; l < G.n; ++l) {
    const int64_t b = G.b0 + l;
    p.status[b] = (double)st[l];
    if (G.len[l] > 0 && st[l] == HMM_SCALED) {
      if (fin[l] >= HMM_TINY) {
        ll[b] = mass[l] * 0.6931471805599453 + shifts[l];
        ll[b] += log(fin[l]) + p.consts[2];
      } else {
        p.status[b] = HMM_LOG_SPACE;
      }
    }
  }
}

static inline int64_t hmm_lane_back_doubles(int64_t K) { return (5 * K + 2 * K * HMM_LANE_STEPS) * HMM_W; }

// The scaled backward of group G after hmm_lane_forward(keep): d log e of its sequences into dle, and the group's
// partial sums of U (K x K, expected transitions / A), d log pi and d log f (K each) into out (zeroed here).
// work: hmm_lane_back_doubles(K) doubles on a cache line.
static void hmm_lane_backward(const HmmParams& p, int64_t g, const Float* gout, Float* dle, double* work,
                              double* out) {
  const int64_t T = p.T, B = p.B, K = p.K;
  const HmmGroup G = hmm_group(p, g);
  double* U = out;
  double* dpi = U + K * K;
  double* df = dpi + K;
  memset(out, 0, (K * K + 2 * K) * sizeof(double));
  hmm_v8d* beta = (hmm_v8d*)work;
  hmm_v8d* v = beta + K;
  hmm_v8d* dpiL = v + K;
  hmm_v8d* dfL = dpiL + K;
  hmm_v8d* Xb = dfL + K;  // K rows of HMM_LANE_STEPS vectors
  hmm_v8d* Vb = Xb + K * HMM_LANE_STEPS;
  hmm_v8d* gam = Vb + K * HMM_LANE_STEPS;  // gamma_t
  hmm_v8d gv = {};
  hmm_v8l on = {};  // lanes the backward runs for: scaled, with a frame and a nonzero upstream gradient
  for (int64_t l = 0; l < G.n; ++l) {
    gv[l] = (double)gout[G.b0 + l];
    on[l] = G.len[l] > 0 && p.status[G.b0 + l] == HMM_SCALED && gv[l] != 0.0 ? -1 : 0;
  }
  bool any_on = false;
  for (int64_t l = 0; l < HMM_W; ++l) any_on |= on[l] != 0;
  if (!any_on) return;
  for (int64_t k = 0; k < K; ++k) beta[k] = dpiL[k] = dfL[k] = hmm_v8d{};
  const hmm_v8d* aL = (const hmm_v8d*)p.aL + g * T * K;
  const hmm_v8d* EL = (const hmm_v8d*)p.EL + g * T * K;
  const hmm_v8d* sL = (const hmm_v8d*)p.sL + g * T;
  int64_t n_steps = 0;
  auto sum_into_U = [&](int64_t i, int64_t j, hmm_v8d acc) { U[i * K + j] += hmm_hsum8(acc); };  // over the lanes too
  for (int64_t t = G.t_end - 1; t >= 0; --t) {
    const hmm_v8l act = on & (t < G.len), start = act & (t == G.len - 1);
    for (int64_t k = 0; k < K; ++k) beta[k] = ptn_select(start, hmm_bc8(p.f[k]), beta[k]);
    const hmm_v8d* __restrict__ at = aL + t * K;
    const hmm_v8d z = hmm_lane_sum(at, K, beta);
    const hmm_v8d r = (hmm_v8d)((hmm_v8l)(gv / z) & (act & (z > 0.0)));
    // gamma_t = alpha_t beta_t r into d log e (the lanes' rows of frame t), and d log f / d log pi
    for (int64_t k = 0; k < K; ++k) {
      gam[k] = at[k] * beta[k] * r;
      dfL[k] = ptn_select(start, gam[k], dfL[k]);
      if (t == 0) dpiL[k] = gam[k];
    }
    hmm_lane_store_rows(G, act, gam, K, dle + (t * B + G.b0) * K);
    if (t == 0) break;
    const hmm_v8d* __restrict__ Et = EL + t * K;
    const hmm_v8d x = r * sL[t];  // r / c_t, c_t = 1 / scale (powers of two: exact)
    const hmm_v8d* __restrict__ ap = aL + (t - 1) * K;
    for (int64_t k = 0; k < K; ++k) {
      v[k] = Et[k] * beta[k];
      Vb[k * HMM_LANE_STEPS + n_steps] = v[k];
      Xb[k * HMM_LANE_STEPS + n_steps] = ap[k] * x;
    }
    if (++n_steps == HMM_LANE_STEPS) {
      hmm_lane_outer(Xb, Vb, HMM_LANE_STEPS, n_steps, K, sum_into_U);
      n_steps = 0;
    }
    // beta_{t-1} = A v, scaled by the power of two that brings its sum into [1, 2) (0 in lanes not running)
    hmm_lane_matvec(v, K, p.AT, beta);
    const hmm_v8d scale = hmm_inverse_power_of_two8(hmm_lane_sum(beta, K));
    for (int64_t k = 0; k < K; ++k) beta[k] *= scale;
  }
  if (n_steps > 0) hmm_lane_outer(Xb, Vb, HMM_LANE_STEPS, n_steps, K, sum_into_U);
  for (int64_t l = 0; l < G.n; ++l)
    for (int64_t k = 0; k < K; ++k) {
      dpi[k] += dpiL[k][l];
      df[k] += dfL[k][l];
    }
}
#endif  // !CUDA

#endif  // PTNATIVE_HMM_HMM_LANES_H
