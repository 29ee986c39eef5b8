// Helpers that depend on the op's floating type.  The generated translation
// unit includes this once inside each op's namespace, right after
// `typedef <float|double> Float;`.  No include guard on purpose.
// Compiled on its own, it is compiled as kernel.h, which declares a Float and includes it.
#if !defined(PTNATIVE_TYPED_FROM_KERNEL_H) && !defined(PTNATIVE_IN_VARIANT_UNIT)
#include "kernel.h"
#else

static inline Float* data_ptr(Ndarray* a, int64_t t) { return (Float*)ptn::data_ptr_bytes(a, t); }

static inline void last_two_dims(const Ndarray* a, int64_t out[2]) {
  assert_cmp(a->ndim, >=, 2);
  out[0] = a->dims[a->ndim - 2];
  out[1] = a->dims[a->ndim - 1];
}

// C[x_C] += A[x_A] . B[x_B] on time slices (2-D operands ignore their index).
static inline void affine_y_x(int64_t x_A, Ndarray* A, int64_t x_B, Ndarray* B, int64_t x_C, Ndarray* C,
                              bool transA = false, bool transB = false, double beta = 1.0) {
  int64_t a[2], b[2], c[2];
  last_two_dims(A, a);
  last_two_dims(B, b);
  last_two_dims(C, c);
  affine_raw(data_ptr(A, x_A), a[0], a[1], data_ptr(B, x_B), b[0], b[1], data_ptr(C, x_C), c[0], c[1], transA,
             transB, beta);
}

// C = beta * C + A' . B' with A, B flattened to matrices of their last dim, B
// starting `offset` frames later and both cut by `offset` frames of A's
// second-to-last dim (so offset=1 pairs frame t of A with frame t+1 of B).
static inline void affine_global(Ndarray* A, Ndarray* B, Ndarray* C, bool transA = false, bool transB = false,
                                 int64_t offset = 0, double beta = 1.0) {
  int64_t a[2], b[2], c[2];
  last_two_dims(A, a);
  last_two_dims(B, b);
  last_two_dims(C, c);
  int64_t rows_cut = offset * a[0];
  int64_t a_rows = ptn::n_elements(A) / std::max<int64_t>(a[1], 1) - rows_cut;
  int64_t b_rows = ptn::n_elements(B) / std::max<int64_t>(b[1], 1) - rows_cut;
  assert_cmp(a_rows, >=, 0);
  assert_cmp(b_rows, >=, 0);
  const Float* B_data = Ndarray_DEV_DATA(B) + offset * b[0] * b[1];
  affine_raw(Ndarray_DEV_DATA(A), a_rows, a[1], B_data, b_rows, b[1], Ndarray_DEV_DATA(C), c[0], c[1], transA, transB,
             beta);
}

#endif
