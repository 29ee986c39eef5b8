// Vectorisable float32 math for the CPU kernels (LSTM activations, RNN-T's log-softmax rows).
//
// A call to expf per element costs as much as the products around it, and g++ vectorises no libm call without
// -ffast-math; these are branch-free (no float selects, no std::floor), so the loops that call them vectorise.
// CUDA builds use the libm functions and do not need this header's contents.
#ifndef PTNATIVE_COMMON_FAST_MATH_H
#define PTNATIVE_COMMON_FAST_MATH_H

#include "../dialect/kernel.h"

#if !CUDA
// e^x for float32 x in [-87, 88] (the caller clamps; NaN gives NaN): Cody-Waite reduction x = k ln2 + r
// (k rounded to nearest by the 1.5 * 2^23 trick), a degree-6 polynomial for e^r (relative error < 1e-7, about
// 1 ulp), and 2^k from the exponent bits.
__attribute__((always_inline)) static inline float fast_exp_in_range(float x) {
  float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)k + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof(float));
  return p * scale;
}
#endif

#endif  // PTNATIVE_COMMON_FAST_MATH_H
