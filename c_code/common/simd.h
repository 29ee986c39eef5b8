// The portable vector layer of the CPU kernels: vectors of N lanes (ptn_vec<T, N>) with the GCC/clang vector
// extensions' operators, the same meaning and the same arithmetic per lane on every compiler and target.
//
// ptn_vec<T, N> is a `vector_size` type where the compiler makes good code for it on the target: always with clang
// (LLVM splits a vector wider than the target's registers into register-sized parts), and with g++ where the
// target's registers are at least that wide (PTN_VECTOR_BYTES: AVX-512 64 bytes, AVX 32, SSE2 / NEON 16).  g++
// keeps a wider vector in memory and moves it through general registers 8 bytes at a time (the HMM's lanes of
// eight doubles ran 10 to 20 times slower at -march=x86-64-v3 than with AVX-512); there ptn_vec<T, N> is
// ptn_wide<T, N>, an array of register-sized vectors with the same operators, which g++ keeps in registers.  Either
// way a lane computes the same operations in the same order (g++ contracts a * b + c into one FMA in both forms),
// so results do not depend on the form.
//
// What the vector extensions spell with builtins or syntax that a struct cannot take has a function here, for both
// forms: ptn_convert<V>(v) (__builtin_convertvector: lane-wise value conversion), ptn_select(m, a, b) (m ? a : b
// lane-wise, m a mask of all-ones / zero lanes), ptn_shuffle / ptn_shuffle2 (lane permutations by an index vector:
// g++'s __builtin_shuffle for its native vectors; a lane loop otherwise, which clang folds into one shuffle where
// the indices are known when it compiles).  A C-style cast between vectors of the same size reinterprets the bits
// in both forms.  Target-specific instructions elsewhere stay behind the target's feature macros (__AVX__,
// __AVX512F__, __SSE__), each with a plain vector fallback, and take native vectors only.
#ifndef PTNATIVE_COMMON_SIMD_H
#define PTNATIVE_COMMON_SIMD_H

#include "../dialect/kernel.h"

#if !CUDA
#include <stdint.h>
#include <string.h>
#include <type_traits>

// The width in bytes of the target's vector registers (8: none, every lane on its own).
#if defined(__AVX512F__)
#define PTN_VECTOR_BYTES 64
#elif defined(__AVX__)
#define PTN_VECTOR_BYTES 32
#elif defined(__SSE2__) || defined(__ARM_NEON) || defined(__aarch64__) || defined(__ALTIVEC__)
#define PTN_VECTOR_BYTES 16
#else
#define PTN_VECTOR_BYTES 8
#endif

// The signed integer of a lane's size: the lane type of a comparison's mask.
template <typename T>
using ptn_mask_lane = std::conditional_t<sizeof(T) == 8, int64_t, std::conditional_t<sizeof(T) == 4, int32_t,
                                                                                      std::conditional_t<sizeof(T) == 2, int16_t, int8_t>>>;

template <typename V>
struct ptn_is_wide;

// N lanes of T as N * sizeof(T) / PTN_VECTOR_BYTES register-sized vectors, with the vector extensions' operators
// (lane-wise; a scalar operand goes to every lane).  {} is all zeros, {a, b, ...} sets the lanes in
// order (both through constructors: not an aggregate, but trivially copyable).
template <typename T, int N>
struct ptn_wide {
  typedef T part __attribute__((vector_size(PTN_VECTOR_BYTES)));
  static constexpr int lanes = (int)(PTN_VECTOR_BYTES / sizeof(T));
  static constexpr int P = N / lanes;
  static_assert(P >= 2 && P * lanes == N, "ptn_wide: N lanes must fill two or more registers");
  typedef ptn_wide<ptn_mask_lane<T>, N> mask;

  part p[P];

  ptn_wide() = default;  // ptn_wide{} is all zeros (value-initialised), a plain declaration undefined
  // {a, b, ...}: the N lanes in order.
  template <typename... A, typename = std::enable_if_t<sizeof...(A) == N>>
  ptn_wide(A... a) {
    const T lanes_in[N] = {(T)a...};
    memcpy(p, lanes_in, sizeof p);
  }
  // (ptn_wide)v for a vector v of the same size (either form): the same bits.
  template <typename V, typename = std::enable_if_t<sizeof(V) == N * sizeof(T) && !std::is_arithmetic<V>::value>>
  explicit ptn_wide(const V& v) {
    memcpy(p, &v, sizeof p);
  }

  T& operator[](int64_t i) { return reinterpret_cast<T*>(p)[i]; }
  const T& operator[](int64_t i) const { return reinterpret_cast<const T*>(p)[i]; }

  // (V)v for a native vector V of the same size: the same bits.
  template <typename V, typename = std::enable_if_t<sizeof(V) == N * sizeof(T) && !std::is_arithmetic<V>::value &&
                                                    !ptn_is_wide<V>::value>>
  explicit operator V() const {
    V r;
    memcpy(&r, p, sizeof r);
    return r;
  }

#define PTN_WIDE_BINARY(op)                                                                                     \
  friend inline ptn_wide operator op(const ptn_wide& a, const ptn_wide& b) {                                    \
    ptn_wide r;                                                                                                 \
    for (int i = 0; i < P; ++i) r.p[i] = a.p[i] op b.p[i];                                                      \
    return r;                                                                                                   \
  }                                                                                                             \
  friend inline ptn_wide operator op(const ptn_wide& a, T b) {                                                  \
    ptn_wide r;                                                                                                 \
    for (int i = 0; i < P; ++i) r.p[i] = a.p[i] op b;                                                           \
    return r;                                                                                                   \
  }                                                                                                             \
  friend inline ptn_wide operator op(T a, const ptn_wide& b) {                                                  \
    ptn_wide r;                                                                                                 \
    for (int i = 0; i < P; ++i) r.p[i] = a op b.p[i];                                                           \
    return r;                                                                                                   \
  }                                                                                                             \
  ptn_wide& operator op##=(const ptn_wide& b) { return *this = *this op b; }                                    \
  ptn_wide& operator op##=(T b) { return *this = *this op b; }
  PTN_WIDE_BINARY(+)
  PTN_WIDE_BINARY(-)
  PTN_WIDE_BINARY(*)
  PTN_WIDE_BINARY(/)
  PTN_WIDE_BINARY(&)
  PTN_WIDE_BINARY(|)
  PTN_WIDE_BINARY(^)
  PTN_WIDE_BINARY(<<)
  PTN_WIDE_BINARY(>>)
#undef PTN_WIDE_BINARY

#define PTN_WIDE_COMPARE(op)                                                                                    \
  friend inline mask operator op(const ptn_wide& a, const ptn_wide& b) {                                        \
    mask r;                                                                                                     \
    for (int i = 0; i < P; ++i) r.p[i] = (typename mask::part)(a.p[i] op b.p[i]);                               \
    return r;                                                                                                   \
  }                                                                                                             \
  friend inline mask operator op(const ptn_wide& a, T b) {                                                      \
    mask r;                                                                                                     \
    for (int i = 0; i < P; ++i) r.p[i] = (typename mask::part)(a.p[i] op b);                                    \
    return r;                                                                                                   \
  }                                                                                                             \
  friend inline mask operator op(T a, const ptn_wide& b) {                                                      \
    mask r;                                                                                                     \
    for (int i = 0; i < P; ++i) r.p[i] = (typename mask::part)(a op b.p[i]);                                    \
    return r;                                                                                                   \
  }
  PTN_WIDE_COMPARE(==)
  PTN_WIDE_COMPARE(!=)
  PTN_WIDE_COMPARE(<)
  PTN_WIDE_COMPARE(<=)
  PTN_WIDE_COMPARE(>)
  PTN_WIDE_COMPARE(>=)
#undef PTN_WIDE_COMPARE

  friend inline ptn_wide operator-(const ptn_wide& a) {
    ptn_wide r;
    for (int i = 0; i < P; ++i) r.p[i] = -a.p[i];
    return r;
  }
  friend inline ptn_wide operator~(const ptn_wide& a) {
    ptn_wide r;
    for (int i = 0; i < P; ++i) r.p[i] = ~a.p[i];
    return r;
  }
};

template <typename V>
struct ptn_is_wide : std::false_type {};
template <typename T, int N>
struct ptn_is_wide<ptn_wide<T, N>> : std::true_type {};

template <typename T, int N, bool native>
struct ptn_vector_type {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};
template <typename T, int N>
struct ptn_vector_type<T, N, false> {
  typedef ptn_wide<T, N> type;
};

// N lanes of T (N a power of two): a `vector_size` type, or ptn_wide where g++ would keep that in memory.
#if defined(__GNUC__) && !defined(__clang__)
template <typename T, int N>
using ptn_vec = typename ptn_vector_type<T, N, (N * sizeof(T) <= PTN_VECTOR_BYTES)>::type;
#else
template <typename T, int N>
using ptn_vec = typename ptn_vector_type<T, N, true>::type;
#endif

// The lane type of a vector of either form.
template <typename V>
using ptn_lane_t = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<V&>()[0])>>;

// V's lanes from v's values, lane by lane, converted as a C cast converts (__builtin_convertvector).
template <typename V, typename U>
__attribute__((always_inline)) static inline V ptn_convert(const U& v) {
  if constexpr (!ptn_is_wide<V>::value && !ptn_is_wide<U>::value) {
    return __builtin_convertvector(v, V);
  } else {
    constexpr int n = (int)(sizeof(V) / sizeof(ptn_lane_t<V>));
    static_assert(n == (int)(sizeof(U) / sizeof(ptn_lane_t<U>)), "ptn_convert: lane counts differ");
    V r;
    for (int i = 0; i < n; ++i) r[i] = (ptn_lane_t<V>)v[i];
    return r;
  }
}

// m ? a : b lane-wise: a's lane where m's lane is all ones, b's where it is zero.
template <typename M, typename V>
__attribute__((always_inline)) static inline V ptn_select(const M& m, const V& a, const V& b) {
  if constexpr (ptn_is_wide<V>::value) {
    V r;
    for (int i = 0; i < V::P; ++i) r.p[i] = m.p[i] ? a.p[i] : b.p[i];
    return r;
  } else {
    return m ? a : b;
  }
}

// r[i] = v[mask[i] mod n] for the n lanes of v.
template <typename V, typename M>
__attribute__((always_inline)) static inline V ptn_shuffle(V v, M mask) {
#if !defined(__clang__)
  if constexpr (!ptn_is_wide<V>::value && !ptn_is_wide<M>::value) return __builtin_shuffle(v, mask);
#endif
  constexpr int n = (int)(sizeof(V) / sizeof(ptn_lane_t<V>));
  V r;
  for (int i = 0; i < n; ++i) r[i] = v[mask[i] & (n - 1)];
  return r;
}

// r[i] = (a, b)[mask[i] mod 2n]: lane mask[i] of a for indices below n, of b above.
template <typename V, typename M>
__attribute__((always_inline)) static inline V ptn_shuffle2(V a, V b, M mask) {
#if !defined(__clang__)
  if constexpr (!ptn_is_wide<V>::value && !ptn_is_wide<M>::value) return __builtin_shuffle(a, b, mask);
#endif
  constexpr int n = (int)(sizeof(V) / sizeof(ptn_lane_t<V>));
  V r;
  for (int i = 0; i < n; ++i) {
    const int j = (int)(mask[i] & (2 * n - 1));
    r[i] = j < n ? a[j] : b[j - n];
  }
  return r;
}
#endif  // !CUDA

#endif  // PTNATIVE_COMMON_SIMD_H
