// Softmax rows on the CPU: a row's maximum and its exponentials' sum, written so that the compilers vectorise
// them without -ffast-math (float: integer keys and integer selects instead of float selects, fast_math.h's exp
// instead of libm's, the sum in 16 lanes; double: the plain forms with libm's exp).  Used by the RNN-T loss's
// log-softmax rows and the sparse cross-entropy's frames.
//
// NaN: a row holding NaN gives NaN from ptn_row_exp_sum (whatever its sign bit; ptn_row_max may skip a NaN
// whose sign bit is set, its exponential is still NaN).
#ifndef PTNATIVE_COMMON_SOFTMAX_ROW_H
#define PTNATIVE_COMMON_SOFTMAX_ROW_H

#include "../dialect/kernel.h"
#include "fast_math.h"

#if !CUDA
#define PTN_ROW_LANES 16

// e^x for float32 x <= 0 or NaN (x = value - row maximum): 0 below -87 (and for -inf), NaN for NaN.  The clamp
// works on the bit pattern: for x <= 0, x < -87 <=> bits(x) > bits(-87) as unsigned.
static inline float ptn_row_exp(float x) {
  const uint32_t lim = 0xC2AE0000u;  // bits of -87.0f
  uint32_t ub;
  memcpy(&ub, &x, 4);
  const bool nan = (ub & 0x7FFFFFFFu) > 0x7F800000u;
  const bool under = ub > lim && !nan;
  uint32_t cb = under ? lim : ub;
  float xc;
  memcpy(&xc, &cb, 4);
  float res = fast_exp_in_range(xc);
  uint32_t rb;
  memcpy(&rb, &res, 4);
  rb &= under ? 0u : 0xFFFFFFFFu;
  memcpy(&res, &rb, 4);
  return res;
}
static inline double ptn_row_exp(double x) { return exp(x); }

// An int32 that orders like the float (for non-NaN values; a NaN with the sign bit clear sorts above +inf).
static inline int32_t ptn_row_float_key(float v) {
  int32_t b;
  memcpy(&b, &v, 4);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}

// max_k x[k] for K >= 1 (-inf for K = 0).
static inline float ptn_row_max(const float* x, int64_t K) {
  int32_t lane[PTN_ROW_LANES];
  for (int j = 0; j < PTN_ROW_LANES; ++j) lane[j] = ptn_row_float_key(-INFINITY);
  int64_t k = 0;
  for (; k + PTN_ROW_LANES <= K; k += PTN_ROW_LANES)
    for (int j = 0; j < PTN_ROW_LANES; ++j) {
      int32_t v = ptn_row_float_key(x[k + j]);
      lane[j] = v > lane[j] ? v : lane[j];
    }
  int32_t m = lane[0];
  for (int j = 1; j < PTN_ROW_LANES; ++j) m = lane[j] > m ? lane[j] : m;
  for (; k < K; ++k) {
    int32_t v = ptn_row_float_key(x[k]);
    m = v > m ? v : m;
  }
  m ^= (m >> 31) & 0x7FFFFFFF;
  float r;
  memcpy(&r, &m, 4);
  return r;
}
static inline double ptn_row_max(const double* x, int64_t K) {
  double m = -INFINITY;
  for (int64_t k = 0; k < K; ++k) m = x[k] > m ? x[k] : m;
  return m;
}

// out[k] := e^(x[k] - m) for k < K (out may be x, or null to only sum); returns the sum, taken in
// PTN_ROW_LANES lane-wise partial sums added in double.
template <typename T>
static inline double ptn_row_exp_sum(const T* x, T* out, int64_t K, T m) {
  T lane[PTN_ROW_LANES];
  for (int j = 0; j < PTN_ROW_LANES; ++j) lane[j] = 0;
  int64_t k = 0;
  if (out) {
    for (; k + PTN_ROW_LANES <= K; k += PTN_ROW_LANES)
      for (int j = 0; j < PTN_ROW_LANES; ++j) {
        const T e = ptn_row_exp(x[k + j] - m);
        out[k + j] = e;
        lane[j] += e;
      }
  } else {
    for (; k + PTN_ROW_LANES <= K; k += PTN_ROW_LANES)
      for (int j = 0; j < PTN_ROW_LANES; ++j) lane[j] += ptn_row_exp(x[k + j] - m);
  }
  double s = 0;
  for (int j = 0; j < PTN_ROW_LANES; ++j) s += lane[j];
  for (; k < K; ++k) {
    const T e = ptn_row_exp(x[k] - m);
    if (out) out[k] = e;
    s += e;
  }
  return s;
}
#endif

#endif  // PTNATIVE_COMMON_SOFTMAX_ROW_H
