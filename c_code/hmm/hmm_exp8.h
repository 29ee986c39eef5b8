// exp in eight lanes of doubles (one AVX-512 vector where the CPU has it), for the HMM kernels' CPU paths.
#ifndef PTNATIVE_HMM_HMM_EXP8_H
#define PTNATIVE_HMM_HMM_EXP8_H

#include "../dialect/kernel.h"

#include "hmm_gemm.h"

#if !CUDA
// exp(x) in eight lanes for x <= 0: 2^(k/16) exp(r) with k = round(16 x / ln 2), |r| <= ln 2 / 32, 2^(j/16) from a
// table of 16 (one two-vector permute on AVX-512) and exp(r) by its Taylor polynomial of degree 7 (at most ~1.5 ulp
// off).  Lanes below -707 (and -inf) give 0, as fsa_exp's below -708 do: such a weight is below e^-707 times its
// row's largest, which is 1, and vanishes in every sum it enters.
static inline hmm_v8d hmm_exp8(hmm_v8d x) {
  const hmm_v8d t_lo = {1.0, 1.0442737824274138, 1.0905077326652577, 1.1387886347566916,
                        1.189207115002721, 1.241857812073484, 1.2968395546510096, 1.3542555469368927};
  const hmm_v8d t_hi = {1.4142135623730951, 1.4768261459394993, 1.5422108254079407, 1.6104903319492543,
                        1.681792830507429, 1.7562521603732995, 1.8340080864093424, 1.9152065613971474};
  const hmm_v8d zero = {}, shifter = zero + 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const hmm_v8l keep = x >= -707.0;  // all ones or zero per lane
  x = (hmm_v8d)((hmm_v8l)x & keep);
  const hmm_v8d kb = x * 23.083120654223414 + shifter;  // 16 / ln 2
  const hmm_v8d k = kb - shifter;
  const hmm_v8d r = (x - k * 0.04332169877307024) - k * 1.1926343307941173e-11;  // ln 2 / 16 in two parts
  // q = 1 + r P(r), P = sum_{n <= 6} r^n / (n + 1)! in powers of r^2 (five multiply-adds deep instead of Horner's
  // eight; P's rounding is scaled by |r| < 0.022 in q, which takes one rounding)
  const hmm_v8d r2 = r * r;
  const hmm_v8d p01 = r * 0.5 + 1.0, p23 = r * (1.0 / 24.0) + 1.0 / 6.0, p45 = r * (1.0 / 720.0) + 1.0 / 120.0;
  const hmm_v8d P = p01 + r2 * (p23 + r2 * (p45 + r2 * (1.0 / 5040.0)));
  const hmm_v8d q = r * P + 1.0;
  const hmm_v8l ki = (hmm_v8l)kb - (hmm_v8l)shifter;           // k
  const hmm_v8d tj = ptn_shuffle2(t_lo, t_hi, ki & 15);   // 2^((k mod 16) / 16)
  const hmm_v8d y = (hmm_v8d)((hmm_v8l)(tj * q) + (hmm_v8l)((hmm_v8u)(ki >> 4) << 52));  // unsigned: k may be < 0
  return (hmm_v8d)((hmm_v8l)y & keep);
}

// x[0..8) as a vector of doubles.
static inline hmm_v8d hmm_load8(const double* x) {
  hmm_v8d v;
  memcpy(&v, x, sizeof(v));
  return v;
}
static inline hmm_v8d hmm_load8(const float* x) {
  typedef ptn_vec<float, 8> hmm_v8f;
  hmm_v8f v;
  memcpy(&v, x, sizeof(v));
  return ptn_convert<hmm_v8d>(v);
}
#endif  // !CUDA

#endif  // PTNATIVE_HMM_HMM_EXP8_H
