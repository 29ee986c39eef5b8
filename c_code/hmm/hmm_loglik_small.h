// The scaled forward-backward of hmm.cu for one sequence with K <= 4 on the CPU: the path a part of the batch takes
// when it is one sequence (B = 1, the PyMC case), whose chain of steps is then the whole work.
//
// The same recursions as hmm_fwd_step / hmm_fwd_final and hmm_backward_cpu, with the state vectors in registers
// (K known at compile time) and the chain from step to step kept short: the exps, the normalisers' divisions and
// the log-likelihood's logs are off it.  The next step's product starts from the unnormalised vector and is scaled
// by the divisor when it arrives; the step masses are multiplied into one number whose binary exponent is moved
// into an integer every step (exactly), so the log-likelihood takes one log at the end instead of one per frame.
// Frames with a NaN or +inf log-emission leave the register path as the scalar step does (status HMM_NAN, or the
// +inf recorded and HMM_LOG_SPACE).  Results equal the general path's to rounding.
#ifndef PTNATIVE_HMM_HMM_LOGLIK_SMALL_H
#define PTNATIVE_HMM_HMM_LOGLIK_SMALL_H

#include "../dialect/kernel.h"

#include "hmm_likelihood.h"
#include "hmm_vectors_small.h"

#if !CUDA
// m * 2^e = x for x > 0 normal: e += the exponent of x, and x becomes its mantissa in [1, 2) (exact).
static inline void hmm_split_exponent(double* x, int64_t* e) {
  uint64_t bits;
  memcpy(&bits, x, sizeof(bits));
  *e += (int64_t)((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & ~(0x7ffULL << 52)) | (1023ULL << 52);
  memcpy(x, &bits, sizeof(bits));
}

// The scaled forward of sequence b (status HMM_SCALED, T_b > 0): alpha and c, and *ll its log-likelihood; returns
// its status.  A +inf log-emission is recorded in `check`.
template <int K>
static int hmm_small_forward(const HmmParams& p, int64_t b, FsaCheck* check, double* ll) {
  const int64_t B = p.B, len = p.seq_len[b];
  hmm_v4d A[4];
  hmm_small_rows<K>(p.A, A);
  hmm_v4d u = hmm_lanes<K>(p.pi);  // alpha_{t-1} times s_{t-1} (pi at t = 0)
  double inv = 1.0;                // 1 / s_{t-1}
  double mass = 1.0, shifts = 0.0;  // log-likelihood = log(mass) + mass_exp log 2 + shifts
  int64_t mass_exp = 0;
  for (int64_t t = 0; t < len; ++t) {
    const int64_t tb = t * B + b;
    const hmm_v4d le = hmm_lanes<K>(p.le + tb * K, -INFINITY);
    double mx = le[0];
    bool nan = le[0] != le[0];
    for (int k = 1; k < K; ++k) {
      mx = le[k] > mx ? le[k] : mx;
      nan |= le[k] != le[k];
    }
    if (nan || mx == INFINITY) {  // hmm_checked_max's report and hmm_fwd_step's status
      for (int k = 0; k < K; ++k)
        if (le[k] == INFINITY) {
          HmmEmissionReport{t, b}(check, k);
          break;
        }
      return nan ? HMM_NAN : HMM_LOG_SPACE;
    }
    const hmm_v4d e = hmm_exp_below(le, mx);
    const hmm_v4d pred = t == 0 ? u : hmm_vecmat<K>(u, A) * inv;
    u = pred * e;
    const double s = hmm_hsum(u);
    p.c[tb] = s;
    if (!(s >= HMM_TINY)) return HMM_LOG_SPACE;
    inv = 1.0 / s;
    hmm_store_lanes<K>(p.alpha + tb * K, u * inv);
    mass *= s;
    hmm_split_exponent(&mass, &mass_exp);
    shifts += mx + (t == 0 ? p.consts[1] : p.consts[0]);
  }
  const double s = hmm_hsum(u * inv * hmm_lanes<K>(p.f));
  if (!(s >= HMM_TINY)) return HMM_LOG_SPACE;
  *ll = (log(mass) + (double)mass_exp * 0.6931471805599453) + shifts + (log(s) + p.consts[2]);
  return HMM_SCALED;
}

// The scaled backward of sequence b (after a successful forward) with upstream gradient g: d log e into dle, and
// U (K rows of stride ldu; expected transitions / A), d log pi, d log f added to.
template <int K>
static void hmm_small_backward(const HmmParams& p, int64_t b, double g, Float* dle, double* U, int64_t ldu,
                               double* dpi, double* df) {
  const int64_t B = p.B, len = p.seq_len[b];
  hmm_v4d AT[4], Ur[4];
  hmm_small_rows<K>(p.AT, AT);
  for (int i = 0; i < 4; ++i) Ur[i] = hmm_splat(0.0);
  hmm_v4d beta_u = hmm_lanes<K>(p.f);  // beta_t times its sum
  for (int64_t t = len - 1; t >= 0; --t) {
    const int64_t tb = t * B + b;
    const double sum = hmm_hsum(beta_u), inv = sum > 0.0 ? 1.0 / sum : 0.0;
    const hmm_v4d at = hmm_lanes<K>(p.alpha + tb * K);
    const hmm_v4d ab = at * (beta_u * inv);
    const double z = hmm_hsum(ab);
    if (!(z > 0.0)) {  // cannot happen after a successful forward pass; frames t..0 get 0
      hmm_zero_frames(dle, 0, t + 1, B, K, b);
      break;
    }
    const hmm_v4d d = ab * (g / z);
    hmm_store_lanes<K>(dle + tb * K, d);
    if (t == len - 1)
      for (int k = 0; k < K; ++k) df[k] += d[k];
    if (t == 0) {
      for (int k = 0; k < K; ++k) dpi[k] += d[k];
      break;
    }
    const hmm_v4d le = hmm_lanes<K>(p.le + tb * K, -INFINITY);
    const hmm_v4d w = hmm_exp_below(le, hmm_lane_max<K>(le)) * beta_u;
    const hmm_v4d x = hmm_lanes<K>(p.alpha + (tb - B) * K) * ((g / z) / p.c[tb]);
    const hmm_v4d v = w * inv;  // E_t beta_t
    for (int i = 0; i < K; ++i) Ur[i] += hmm_splat(x[i]) * v;
    beta_u = hmm_vecmat<K>(w, AT) * inv;  // A v
  }
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) U[i * ldu + j] += Ur[i][j];
}
#endif  // !CUDA

#endif  // PTNATIVE_HMM_HMM_LOGLIK_SMALL_H
