// The portable vector layer of the CPU kernels: lane permutations on the GCC/clang vector extensions
// (`vector_size` types), the same meaning on every compiler and target.
//
// The kernels compute on `vector_size` types (hmm_gemm.h: hmm_v8d, eight doubles; hmm_vectors_small.h: hmm_v4d),
// which g++ and clang lower to the widest registers of the target (AVX-512, AVX2, NEON or scalar code), so one text
// serves x86-64, aarch64 and anything else.  What the two compilers spell differently is a permutation of lanes by
// an index vector: g++ has __builtin_shuffle (indices of any value, taken modulo the lane count, or modulo twice it
// for two operands); clang has __builtin_shufflevector with constant indices only.  ptn_shuffle / ptn_shuffle2 are
// that permutation on both: g++ keeps its builtin (the code it compiled before, instruction for instruction);
// clang gets a lane loop, which it folds into one shuffle where the indices are known when it compiles (every use
// but the exp's table lookup and the Viterbi backpointers).  Target-specific instructions elsewhere stay behind
// the target's feature macros (__AVX__, __AVX512F__, __SSE__), each with a plain vector-extension fallback.
#ifndef PTNATIVE_COMMON_SIMD_H
#define PTNATIVE_COMMON_SIMD_H

#include "../dialect/kernel.h"

#if !CUDA
// r[i] = v[mask[i] mod n] for the n lanes of v.
template <typename V, typename M>
__attribute__((always_inline)) static inline V ptn_shuffle(V v, M mask) {
#if defined(__clang__)
  constexpr int n = (int)(sizeof(V) / sizeof(v[0]));
  V r;
  for (int i = 0; i < n; ++i) r[i] = v[mask[i] & (n - 1)];
  return r;
#else
  return __builtin_shuffle(v, mask);
#endif
}

// r[i] = (a, b)[mask[i] mod 2n]: lane mask[i] of a for indices below n, of b above.
template <typename V, typename M>
__attribute__((always_inline)) static inline V ptn_shuffle2(V a, V b, M mask) {
#if defined(__clang__)
  constexpr int n = (int)(sizeof(V) / sizeof(a[0]));
  V r;
  for (int i = 0; i < n; ++i) {
    const int j = (int)(mask[i] & (2 * n - 1));
    r[i] = j < n ? a[j] : b[j - n];
  }
  return r;
#else
  return __builtin_shuffle(a, b, mask);
#endif
}
#endif  // !CUDA

#endif  // PTNATIVE_COMMON_SIMD_H
