// hmm_posteriors with the sequences in vector lanes, on the CPU (hmm_posteriors.cu's path for B >= 3; the math
// and layout below).
#ifndef PTNATIVE_HMM_HMM_POSTERIORS_LANES_H
#define PTNATIVE_HMM_HMM_POSTERIORS_LANES_H

#include "../dialect/kernel.h"

#include "hmm_posteriors_steps.h"

#if !CUDA
// ---------------------------------------------------------------- sequences in vector lanes, on the CPU
// Where the batch has enough sequences (hmm_post_use_lanes), each group of 8 runs with one vector of eight
// doubles per state, lane l holding sequence b0 + l (hmm_lanes_base.h).  Forward: u_t = (u_{t-1} A) E_t sigma_t
// (u_0 = pi E_0 sigma_0), with E_t = exp(log e_t - M_t), M_t the largest log-density of the frame, and sigma_t the
// power of two that brings the sum s_t of (u_{t-1} A) E_t into [1, 2); u_t and E_t kept (T, K, 8) per group.
// Backward, from each lane's last frame (v = f there): z_t = u_t . v_t, gamma_t = u_t v_t / z_t, and for t > 0 the
// pair marginals u_{t-1}(i) A(i, j) w_t(j) sigma_t / z_t with w_t = E_t v_t, buffered for HMM_LANE_STEPS steps and
// added lane-wise into U = xi / A; then v_{t-1} = A w_t scaled by the power of two that brings its sum into [1, 2).
// The scalings cancel (gamma and the pair marginals are normalised per frame), so these are the sequential pass's
// values to rounding, unless something underflows here that it keeps (nothing overflows: sums stay below 2 K):
// a lane whose s_t or sum of A w_t falls below 2^-200, or z_t below 2^-400 (possible where an unreachable state
// holds the frame's largest log-density, or the final weights), is recomputed by the sequential pass.  For the
// gradient op the forward also writes the filter in hmm_infer.h's terms: alpha_t = u_t / s'_t, s'_t = s_t sigma_t
// its sum, c_t = s_t / s'_{t-1} (c_0 = s_0), m_t = M_t.

#define HMM_POST_CHUNK 16  // frames whose emission rows are computed ahead of the forward recursion

// A group's memory: u, E (T, K, 8), sigma, M (T, 8), the emissions' scratch (K, 8), the buffered steps X, V
// (K, HMM_LANE_STEPS, 8 each), U (K, K, 8) and v, w, gamma (K, 8 each).
static inline int64_t hmm_post_lane_doubles(int64_t T, int64_t K) {
  return (T * (2 * K + 2) + K + 2 * K * HMM_LANE_STEPS + K * K + 3 * K) * HMM_W;
}

// Group g's marginals into gamma, counts into xi_out and the filter into st (if st.filter_read), for the lanes whose
// sequences have the status HMM_SCALED; a sequence with a NaN on a valid frame gets p.status[b] = HMM_NAN (its
// lane stops there), those to recompute by the sequential pass redo[b] = 1.
// mem: hmm_post_lane_doubles(T, K) doubles on a cache line.
static void hmm_post_lane_group(const HmmInferParams& p, const HmmPostState& st, int64_t g, double* mem, Float* gamma,
                                Float* xi_out, char* redo, FsaCheck* check) {
  const int64_t T = p.T, B = p.B, K = p.K;
  const HmmGroup G = hmm_group(p, g);
  hmm_v8d* uL = (hmm_v8d*)mem;
  hmm_v8d* EL = uL + T * K;
  hmm_v8d* sigma = EL + T * K;
  hmm_v8d* M = sigma + T;
  double* raw = (double*)(M + T);
  hmm_v8d* Xb = (hmm_v8d*)raw + K;  // K rows of HMM_LANE_STEPS vectors
  hmm_v8d* Vb = Xb + K * HMM_LANE_STEPS;
  hmm_v8d* U = Vb + K * HMM_LANE_STEPS;
  hmm_v8d* v = U + K * K;
  hmm_v8d* w = v + K;
  hmm_v8d* gam = w + K;
  hmm_v8l on = {};  // lanes of sequences with a frame and, so far, the status HMM_SCALED
  char dead[HMM_W];
  for (int64_t l = 0; l < HMM_W; ++l) {
    on[l] = l < G.n && p.status[G.b0 + l] == HMM_SCALED && G.len[l] > 0 ? -1 : 0;
    dead[l] = !on[l];
  }
  hmm_v8l good = on;  // lanes computed here so far
  const hmm_v8d lo = hmm_bc8(0x1p-200), zlo = hmm_bc8(0x1p-400);
  hmm_v8d s_prev = {};  // s'_{t-1}
  for (int64_t t0 = 0; t0 < G.t_end; t0 += HMM_POST_CHUNK) {
    const int64_t t1 = std::min<int64_t>(t0 + HMM_POST_CHUNK, G.t_end);
    hmm_lane_emissions(p, G, t0, t1, dead, raw, EL + t0 * K, M + t0, check);
    for (int64_t t = t0; t < t1; ++t) {
      hmm_v8d* __restrict__ ut = uL + t * K;
      const hmm_v8d* __restrict__ Et = EL + t * K;
      if (t == 0)
        for (int64_t k = 0; k < K; ++k) ut[k] = hmm_bc8(p.pi[k]);
      else
        hmm_lane_matvec(uL + (t - 1) * K, K, p.A, ut);
      for (int64_t k = 0; k < K; ++k) ut[k] *= Et[k];
      const hmm_v8d s = hmm_lane_sum(ut, K);
      const hmm_v8l act = good & (t < G.len), ok = act & (s >= lo);
      good &= ~act | ok;
      const hmm_v8d scale = (hmm_v8d)((hmm_v8l)hmm_inverse_power_of_two8(s) & ok);
      for (int64_t k = 0; k < K; ++k) ut[k] *= scale;
      sigma[t] = scale;
      if (st.filter_read) {
        const hmm_v8d s_now = s * scale, inv = (hmm_v8d)((hmm_v8l)(1.0 / s_now) & ok), c = t == 0 ? s : s / s_prev;
        s_prev = s_now;
        for (int64_t k = 0; k < K; ++k) gam[k] = ut[k] * inv;
        hmm_lane_store_rows(G, ok, gam, K, st.alpha + (t * B + G.b0) * K);
        for (int64_t l = 0; l < G.n; ++l)
          if (ok[l]) {
            st.c[t * B + G.b0 + l] = c[l];
            st.m[t * B + G.b0 + l] = M[t][l];
          }
      }
    }
  }
  for (int64_t k = 0; k < K * K; ++k) U[k] = hmm_v8d{};
  int64_t n_steps = 0;
  auto add_steps = [&]() {
    hmm_lane_outer(Xb, Vb, HMM_LANE_STEPS, n_steps, K, [&](int64_t i, int64_t j, hmm_v8d acc) { U[i * K + j] += acc; });
    n_steps = 0;
  };
  for (int64_t k = 0; k < K; ++k) v[k] = hmm_v8d{};
  for (int64_t t = G.t_end - 1; t >= 0; --t) {
    const hmm_v8l start = good & (t == G.len - 1);
    for (int64_t k = 0; k < K; ++k) v[k] = ptn_select(start, hmm_bc8(p.f[k]), v[k]);
    const hmm_v8d* __restrict__ ut = uL + t * K;
    const hmm_v8d z = hmm_lane_sum(ut, K, v);
    hmm_v8l act = good & (t < G.len);
    good &= ~act | (z >= zlo);
    act &= z >= zlo;
    const hmm_v8d r = (hmm_v8d)((hmm_v8l)(1.0 / z) & act);
    for (int64_t k = 0; k < K; ++k) gam[k] = ut[k] * v[k] * r;
    hmm_lane_store_rows(G, act, gam, K, gamma + (t * B + G.b0) * K);
    if (t == 0) break;
    const hmm_v8d* __restrict__ Et = EL + t * K;
    const hmm_v8d* __restrict__ up = uL + (t - 1) * K;
    const hmm_v8d x = r * sigma[t];
    for (int64_t k = 0; k < K; ++k) {
      w[k] = Et[k] * v[k];
      Vb[k * HMM_LANE_STEPS + n_steps] = w[k];
      Xb[k * HMM_LANE_STEPS + n_steps] = up[k] * x;
    }
    if (++n_steps == HMM_LANE_STEPS) add_steps();
    hmm_lane_matvec(w, K, p.AT, v);
    const hmm_v8d sv = hmm_lane_sum(v, K);
    good &= ~act | (sv >= lo);
    const hmm_v8d scale = hmm_inverse_power_of_two8(sv);
    for (int64_t k = 0; k < K; ++k) v[k] *= scale;
  }
  if (n_steps > 0) add_steps();
  for (int64_t l = 0; l < G.n; ++l) {
    const int64_t b = G.b0 + l;
    if (!on[l]) continue;
    if (dead[l]) {  // hmm_lane_emissions met a NaN on a valid frame
      p.status[b] = HMM_NAN;
    } else if (good[l]) {
      Float* xo = xi_out + b * K * K;
      for (int64_t i = 0; i < K * K; ++i) xo[i] = (Float)(U[i][l] * p.A[i]);
    } else {
      redo[b] = 1;
    }
  }
}
#endif

#endif  // PTNATIVE_HMM_HMM_POSTERIORS_LANES_H
