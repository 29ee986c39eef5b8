// The CPU's vector helpers of the likelihood's batch-inner passes (hmm.cu) and lanes (hmm_lanes.h): sums and
// products over eight lanes, exact powers of two for the scalings, the shifted exps of a row of log-densities, and
// the emission rows of a chunk of frames (hmm_emission_rows; HMM_CHUNK frames ahead of the recursion).
#ifndef PTNATIVE_HMM_HMM_ROWS_H
#define PTNATIVE_HMM_HMM_ROWS_H

#include "../dialect/kernel.h"

#include "hmm_likelihood.h"

#if !CUDA
// The sum of a vector's eight lanes (as a tree).
static inline double hmm_hsum8(hmm_v8d v) {
  const hmm_v8l half = {4, 5, 6, 7, 0, 1, 2, 3}, quarter = {2, 3, 0, 1, 6, 7, 4, 5}, pair = {1, 0, 3, 2, 5, 4, 7, 6};
  v += ptn_shuffle(v, half);
  v += ptn_shuffle(v, quarter);
  v += ptn_shuffle(v, pair);
  return v[0];
}

// sum_k x[k] y[k] over eight lanes, and out[k] = x[k] y[k] if out is given.
static inline double hmm_dot(const double* __restrict__ x, const double* __restrict__ y, int64_t K,
                             double* __restrict__ out = nullptr) {
  hmm_v8d acc = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    hmm_v8d a, b;
    memcpy(&a, x + k, sizeof(a));
    memcpy(&b, y + k, sizeof(b));
    a *= b;
    if (out) memcpy(out + k, &a, sizeof(a));
    acc += a;
  }
  double s = hmm_hsum8(acc);
  for (; k < K; ++k) {
    const double a = x[k] * y[k];
    if (out) out[k] = a;
    s += a;
  }
  return s;
}

// x[k] *= a for k < K, eight lanes at a time.
static inline void hmm_scale(double* __restrict__ x, int64_t K, double a) {
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    hmm_v8d v;
    memcpy(&v, x + k, sizeof(v));
    v *= a;
    memcpy(x + k, &v, sizeof(v));
  }
  for (; k < K; ++k) x[k] *= a;
}

// 2^-e for x = m 2^e with m in [1, 2) and 2^-1022 <= x < 2^1023 (x's exponent field negated): x times it is in
// [1, 2), exactly.  0 for x = 0 (and for subnormal, infinite or NaN x, which the scaled passes do not produce).
static inline double hmm_inverse_power_of_two(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof(bits));
  const uint64_t e = (bits >> 52) & 0x7ff;  // biased exponent: 1..2046 for normal x
  const uint64_t out = e == 0 || e == 0x7ff ? 0 : (2046 - e) << 52;  // biased exponent of 2^-(e - 1023)
  double r;
  memcpy(&r, &out, sizeof(r));
  return r;
}

// e for x = m 2^e with m in [1, 2) (x > 0 normal).
static inline int64_t hmm_exponent(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof(bits));
  return (int64_t)((bits >> 52) & 0x7ff) - 1023;
}

// out[k] = exp(x[k] - m) for k < K, eight at a time by hmm_exp8 (0 everywhere if m = -inf).
static inline void hmm_exp_shifted(const Float* __restrict__ x, int64_t K, double m, double* __restrict__ out) {
  if (!(m > -INFINITY)) {
    for (int64_t k = 0; k < K; ++k) out[k] = 0.0;
    return;
  }
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const hmm_v8d v = hmm_exp8(hmm_load8(x + k) - m);
    memcpy(out + k, &v, sizeof(v));
  }
  if (k < K) {
    hmm_v8d v = {};
    for (int64_t w = 0; w < K - k; ++w) v[w] = (double)x[k + w];
    v = hmm_exp8(v - m);
    for (int64_t w = 0; w < K - k; ++w) out[k + w] = v[w];
  }
}

// hmm_checked_max on the CPU, eight lanes at a time: rows without NaN or +-inf take the vector path; the others
// (and -inf is a common one: an impossible state) hmm_checked_max's scalar one, which records a +inf in `check`.
template <typename Report>
static inline bool hmm_row_max(const Float* __restrict__ x, int64_t K, double* out, FsaCheck* check, Report report) {
  const hmm_v8d zero = {};
  hmm_v8d mx = zero - INFINITY, poison = zero;  // poison: sum of x * 0, NaN iff some x is NaN or infinite
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const hmm_v8d v = hmm_load8(x + k);
    mx = ptn_select(v > mx, v, mx);
    poison += v * 0.0;
  }
  if (k < K) {
    hmm_v8d v = zero - INFINITY;
    for (int64_t w = 0; w < K - k; ++w) v[w] = (double)x[k + w];
    mx = ptn_select(v > mx, v, mx);
    for (int64_t w = 0; w < K - k; ++w) poison[w] += v[w] * 0.0;
  }
  const hmm_v8l half = {4, 5, 6, 7, 0, 1, 2, 3}, quarter = {2, 3, 0, 1, 6, 7, 4, 5}, pair = {1, 0, 3, 2, 5, 4, 7, 6};
  hmm_v8d y = ptn_shuffle(mx, half);
  mx = ptn_select(y > mx, y, mx);
  y = ptn_shuffle(mx, quarter);
  mx = ptn_select(y > mx, y, mx);
  y = ptn_shuffle(mx, pair);
  mx = ptn_select(y > mx, y, mx);
  poison += ptn_shuffle(poison, half);
  poison += ptn_shuffle(poison, quarter);
  poison += ptn_shuffle(poison, pair);
  if (poison[0] == 0.0) {
    *out = mx[0];
    return false;
  }
  return hmm_checked_max(x, K, out, check, report);
}

// The emission rows of frames [t0, t1) of the part's sequences [b0, b0 + nb): shift[(t - t0) * nb + i] = the row's
// largest log-density (NaN for a row with a NaN; -inf with a +inf, recorded in `check`) and p.E's row its shifted
// exps.  A sequence's rows after its first NaN (dead[i]) are not read: it is NaN whatever they hold.
static void hmm_emission_rows(const HmmParams& p, int64_t t0, int64_t t1, int64_t b0, int64_t nb, char* dead,
                              double* shift, FsaCheck* check) {
  const int64_t B = p.B, K = p.K;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t b = b0 + i, tb = t * B + b;
      if (t >= p.seq_len[b] || dead[i]) continue;
      double m;
      if (hmm_row_max(p.le + tb * K, K, &m, check, HmmEmissionReport{t, b})) {
        dead[i] = 1;
        m = NAN;
      } else {
        hmm_exp_shifted(p.le + tb * K, K, m, p.E + tb * K);
      }
      shift[(t - t0) * nb + i] = m;
    }
}

#define HMM_CHUNK 16  // frames whose emission rows are computed ahead of the recursion
#endif

#endif  // PTNATIVE_HMM_HMM_ROWS_H
