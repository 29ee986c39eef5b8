// c_code/common/simd.h's ptn_vec against the compilers' own vector extensions: every operator and helper the
// kernels use, on lanes of double, float, int64 and uint64, computed both ways and compared bit for bit.  Built and
// run by tests/test_simd.py for targets where ptn_vec<T, N> is a ptn_wide (g++ below AVX-512) and where it is a
// native vector.  Prints "ok N" (N checks) or the first difference, and exits 1 on a difference.
#define CUDA 0
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../c_code/common/simd.h"

static int checks = 0, failures = 0;

template <typename A, typename B>
static void same(const A& a, const B& b, const char* what) {
  static_assert(sizeof(A) == sizeof(B), "same: sizes differ");
  ++checks;
  if (memcmp(&a, &b, sizeof(A)) != 0) {
    if (!failures) printf("differs: %s\n", what);
    ++failures;
  }
}

template <typename T, int N>
struct Pair {
  typedef ptn_vec<T, N> P;                                   // under test
  typedef T R __attribute__((vector_size(N * sizeof(T))));  // the compiler's own
};

template <typename V, typename T, int N>
static V from(const T (&x)[N]) {
  V v;
  memcpy(&v, x, sizeof v);
  return v;
}

template <typename T, int N>
static void arithmetic(const T (&x)[N], const T (&y)[N], T s) {
  typedef typename Pair<T, N>::P P;
  typedef typename Pair<T, N>::R R;
  const P a = from<P>(x), b = from<P>(y);
  const R ra = from<R>(x), rb = from<R>(y);
  same(a + b, ra + rb, "a + b");
  same(a - b, ra - rb, "a - b");
  same(a * b, ra * rb, "a * b");
  same(a * s + b, ra * s + rb, "a * s + b");
  same(s - a, s - ra, "s - a");
  same(a / s, ra / s, "a / s");
  same(-a, -ra, "-a");
  same(a < b, ra < rb, "a < b");
  same(a >= s, ra >= s, "a >= s");
  same(a == b, ra == rb, "a == b");
  same(a != s, ra != s, "a != s");
  same(ptn_select(a > b, a, b), ra > rb ? ra : rb, "select");
  P c = a;
  R rc = ra;
  c += b;
  rc += rb;
  c *= s;
  rc *= s;
  c[1] = s;
  rc[1] = s;
  same(c, rc, "compound, lane store");
  same(P{}, R{}, "{}");
  same(c[N - 1], rc[N - 1], "lane load");
}

template <typename T, int N>
static void integers(const T (&x)[N], const T (&y)[N], T s) {
  typedef typename Pair<T, N>::P P;
  typedef typename Pair<T, N>::R R;
  const P a = from<P>(x), b = from<P>(y);
  const R ra = from<R>(x), rb = from<R>(y);
  same(a & b, ra & rb, "a & b");
  same(a | s, ra | s, "a | s");
  same(a ^ b, ra ^ rb, "a ^ b");
  same(~a, ~ra, "~a");
  same(a >> 3, ra >> 3, "a >> 3");
  same(a << 7, ra << 7, "a << 7");
  same(a & 15, ra & 15, "a & 15");
  arithmetic<T, N>(x, y, s);
}

int main() {
  const double d1[8] = {1.5, -2.25, 0.0, -0.0, 1e300, -1e-310, 3.0, 7.5};
  const double d2[8] = {0.5, -2.25, 4.0, 1.0, -1e300, 2.0, -3.0, 7.25};
  const int64_t l1[8] = {1, -2, 3, -4, INT64_MAX, INT64_MIN, 0, 42};
  const int64_t l2[8] = {7, 2, -3, 4, 5, 6, -7, 8};
  const uint64_t u1[8] = {1, 2, 3, 4, UINT64_MAX, 6, 7, 8};
  const uint64_t u2[8] = {9, 8, 7, 6, 5, 4, 3, 2};
  const float f1[8] = {1.5f, -2.25f, 0.0f, 3.0f, 1e30f, -1e-40f, 5.0f, 6.5f};
  const float f2[8] = {0.5f, -2.25f, 4.0f, 1.0f, -1e30f, 2.0f, -3.0f, 6.25f};
  const double d4[4] = {1.0, -2.0, 3.5, -0.5}, e4[4] = {0.5, -2.0, -3.5, 4.0};
  arithmetic<double, 8>(d1, d2, 1.25);
  arithmetic<float, 8>(f1, f2, 1.25f);
  arithmetic<double, 4>(d4, e4, -0.75);
  integers<int64_t, 8>(l1, l2, 5);
  integers<uint64_t, 8>(u1, u2, 5);

  typedef ptn_vec<double, 8> v8d;
  typedef ptn_vec<int64_t, 8> v8l;
  typedef ptn_vec<float, 8> v8f;
  typedef double r8d __attribute__((vector_size(64)));
  typedef int64_t r8l __attribute__((vector_size(64)));
  typedef float r8f __attribute__((vector_size(32)));
  const v8d a = from<v8d>(d1), b = from<v8d>(d2);
  const r8d ra = from<r8d>(d1), rb = from<r8d>(d2);
  same((v8l)a, (r8l)ra, "bit cast");
  same((v8d)((v8l)a & (a > b)), (r8d)((r8l)ra & (ra > rb)), "masking through a bit cast");
  const double in_range[8] = {1.5, -2.5, 0.0, -0.0, 1e15, -1e15, 3.75, -7.5};  // a C cast of others is undefined
  same(ptn_convert<v8l>(from<v8d>(in_range)), __builtin_convertvector(from<r8d>(in_range), r8l), "double -> int64");
  same(ptn_convert<v8d>(from<v8l>(l1)), __builtin_convertvector(from<r8l>(l1), r8d), "int64 -> double");
  same(ptn_convert<v8f>(a), __builtin_convertvector(ra, r8f), "double -> float");
  same(ptn_convert<v8d>(from<v8f>(f1)), __builtin_convertvector(from<r8f>(f1), r8d), "float -> double");
  const v8d lanes = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0};
  const r8d rlanes = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0};
  same(lanes, rlanes, "{a, b, ...}");
  const int64_t perm[8] = {7, 0, 13, 2, 9, 4, 15, 6};
  const v8l m = from<v8l>(perm);
  r8d rs, rs2;
  for (int i = 0; i < 8; ++i) {
    rs[i] = ra[perm[i] & 7];
    rs2[i] = (perm[i] & 15) < 8 ? ra[perm[i] & 15] : rb[(perm[i] & 15) - 8];
  }
  same(ptn_shuffle(a, m), rs, "shuffle");
  same(ptn_shuffle2(a, b, m), rs2, "shuffle2");
  if (failures) {
    printf("%d of %d checks differ\n", failures, checks);
    return 1;
  }
  printf("ok %d wide=%d\n", checks, (int)ptn_is_wide<v8d>::value);
  return 0;
}
