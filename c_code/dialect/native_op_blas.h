// Row-major GEMM for the kernel dialect:  C = beta * C + alpha * op(A) . op(B).
//
// CPU: sgemm/dgemm from scipy.linalg.cython_blas, whose addresses are handed to
// us at load time (`ptn_set_blas`); there is no slow fallback.  CUDA: cuBLAS,
// opened at run time.
#ifndef PTNATIVE_NATIVE_OP_BLAS_H
#define PTNATIVE_NATIVE_OP_BLAS_H

// Compiled on its own, this file starts from the dialect, which includes it at its end.
#include "native_op.h"

#include <dlfcn.h>

namespace ptn {

typedef void (*sgemm_t)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                        const int*, const float*, const int*, const float*, float*, const int*);
typedef void (*dgemm_t)(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
                        const int*, const double*, const int*, const double*, double*, const int*);
static sgemm_t blas_sgemm = 0;
static dgemm_t blas_dgemm = 0;

inline void set_blas(void* sgemm, void* dgemm) {
  blas_sgemm = (sgemm_t)sgemm;
  blas_dgemm = (dgemm_t)dgemm;
#if !PTN_CUDA
  // OpenBLAS's worker pool for parallel_parts, found in the library that holds sgemm.
  Dl_info info;
  void* lib = sgemm && dladdr(sgemm, &info) && info.dli_fname ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : 0;
  blas_pool_run = lib ? (blas_pool_run_t)dlsym(lib, "gotoblas_pthread") : 0;
  blas_pool_size = 0;
  for (const char* name : {"openblas_get_num_threads", "scipy_openblas_get_num_threads"})
    if (lib && !blas_pool_size) blas_pool_size = (blas_pool_size_t)dlsym(lib, name);
  if (!blas_pool_size) blas_pool_run = 0;
  if (lib) dlclose(lib);
#endif
}

inline int checked_int(int64_t v, const char* what) {
  if (v < 0 || v > (int64_t)std::numeric_limits<int>::max()) {
    std::ostringstream s;
    s << "affine: " << what << " = " << v << " is out of the BLAS int range";
    raise(PTN_STATUS_VALUE, s.str());
  }
  return (int)v;
}

#if PTN_CUDA
// cuBLAS entry points, looked up at run time so that building needs no cuBLAS headers.
typedef int (*cublas_create_t)(void**);
typedef int (*cublas_set_stream_t)(void*, cudaStream_t);
typedef int (*cublas_sgemm_t)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int,
                              const float*, float*, int);
typedef int (*cublas_dgemm_t)(void*, int, int, int, int, int, const double*, const double*, int, const double*, int,
                              const double*, double*, int);
typedef int (*cublas_set_math_mode_t)(void*, int);
struct Cublas {
  void* handle = 0;
  cublas_set_stream_t set_stream = 0;
  cublas_sgemm_t sgemm = 0;
  cublas_dgemm_t dgemm = 0;
  cublas_set_math_mode_t set_math_mode = 0;
  int math_mode = -1;  // the handle's: 0 CUBLAS_DEFAULT_MATH, 3 CUBLAS_TF32_TENSOR_OP_MATH
};
// Float32 products on TF32 tensor cores unless PTNATIVE_ALLOW_TF32=0 (ptnative.config.allow_tf32; on by default,
// as torch's cuDNN path, torch.backends.cudnn.allow_tf32); read at every product.
inline bool tf32_allowed() {
  const char* v = getenv("PTNATIVE_ALLOW_TF32");
  return !v || !v[0] || !(v[0] == '0' && !v[1]);
}
static Cublas cublas_state;
inline Cublas& cublas() {
  if (cublas_state.handle) return cublas_state;
  // Python (ptnative.device.load_cublas) has loaded it already when it found it outside the search path.
  const char* names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  void* lib = 0;
  for (const char* name : names)
    if (name[0] && (lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL))) break;
  if (!lib) raise(PTN_STATUS_RUNTIME, "cuBLAS not found (install nvidia-cublas or the CUDA toolkit)");
  cublas_create_t create = (cublas_create_t)dlsym(lib, "cublasCreate_v2");
  cublas_state.set_stream = (cublas_set_stream_t)dlsym(lib, "cublasSetStream_v2");
  cublas_state.sgemm = (cublas_sgemm_t)dlsym(lib, "cublasSgemm_v2");
  cublas_state.dgemm = (cublas_dgemm_t)dlsym(lib, "cublasDgemm_v2");
  cublas_state.set_math_mode = (cublas_set_math_mode_t)dlsym(lib, "cublasSetMathMode");
  if (!create || !cublas_state.set_stream || !cublas_state.sgemm || !cublas_state.dgemm)
    raise(PTN_STATUS_RUNTIME, "cuBLAS library lacks the expected symbols");
  int st = create(&cublas_state.handle);
  if (st != 0) raise(PTN_STATUS_RUNTIME, "cublasCreate failed with status " + std::to_string(st));
  return cublas_state;
}
inline void gemm_colmajor(char ta, char tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
                          int ldb, float beta, float* C, int ldc) {
  Cublas& cb = cublas();
  cb.set_stream(cb.handle, current_stream);
  const int mode = tf32_allowed() ? 3 : 0;
  if (cb.set_math_mode && mode != cb.math_mode && cb.set_math_mode(cb.handle, mode) == 0) cb.math_mode = mode;
  PTN_COUNT(launches, 1);
  int st = cb.sgemm(cb.handle, ta == 'T', tb == 'T', m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc);
  if (st != 0) raise(PTN_STATUS_RUNTIME, "cublasSgemm failed with status " + std::to_string(st));
}
inline void gemm_colmajor(char ta, char tb, int m, int n, int k, double alpha, const double* A, int lda,
                          const double* B, int ldb, double beta, double* C, int ldc) {
  Cublas& cb = cublas();
  cb.set_stream(cb.handle, current_stream);
  PTN_COUNT(launches, 1);
  int st = cb.dgemm(cb.handle, ta == 'T', tb == 'T', m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc);
  if (st != 0) raise(PTN_STATUS_RUNTIME, "cublasDgemm failed with status " + std::to_string(st));
}
#else
inline void gemm_colmajor(char ta, char tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
                          int ldb, float beta, float* C, int ldc) {
  if (!blas_sgemm) raise(PTN_STATUS_RUNTIME, "BLAS sgemm is not initialised (ptn_set_blas was not called)");
  if (in_parallel_part) raise(PTN_STATUS_RUNTIME, "BLAS sgemm called from a parallel_parts body");
  blas_sgemm(&ta, &tb, &m, &n, &k, &alpha, A, &lda, B, &ldb, &beta, C, &ldc);
}
inline void gemm_colmajor(char ta, char tb, int m, int n, int k, double alpha, const double* A, int lda,
                          const double* B, int ldb, double beta, double* C, int ldc) {
  if (!blas_dgemm) raise(PTN_STATUS_RUNTIME, "BLAS dgemm is not initialised (ptn_set_blas was not called)");
  if (in_parallel_part) raise(PTN_STATUS_RUNTIME, "BLAS dgemm called from a parallel_parts body");
  blas_dgemm(&ta, &tb, &m, &n, &k, &alpha, A, &lda, B, &ldb, &beta, C, &ldc);
}
#endif

}  // namespace ptn

// C (c0 x c1) = beta * C + alpha * op(A) . op(B), all row-major; A is (a0 x a1) with
// leading dimension a1 * ldA_factor, likewise B.  Dimensions are checked.
template <typename T>
void affine_raw(const T* A, int64_t a0, int64_t a1, const T* B, int64_t b0, int64_t b1, T* C, int64_t c0, int64_t c1,
                bool transA = false, bool transB = false, double beta = 1.0, double alpha = 1.0, int64_t ldA_factor = 1,
                int64_t ldB_factor = 1) {
  int64_t m = transA ? a1 : a0, k = transA ? a0 : a1;
  int64_t kb = transB ? b1 : b0, n = transB ? b0 : b1;
  assert_cmp(m, ==, c0);
  assert_cmp(n, ==, c1);
  assert_cmp(k, ==, kb);
  if (c0 == 0 || c1 == 0) return;
  if (k == 0) {  // an empty product; BLAS would reject the zero leading dimensions.  C = beta * C.
#if PTN_CUDA
    if (beta == 0.0)
      Ndarray_memset(C, 0, c0 * c1 * (int64_t)sizeof(T));
    else if (beta != 1.0)  // no caller scales by another beta: say so rather than leave C unscaled
      ptn::raise(PTN_STATUS_RUNTIME, "affine: an empty product with beta other than 0 or 1 on CUDA");
#else
    for (int64_t i = 0; i < c0 * c1; ++i) C[i] = beta == 0.0 ? T(0) : T(beta) * C[i];
#endif
    return;
  }
  // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T.
  int lda = ptn::checked_int(std::max<int64_t>(1, a1 * ldA_factor), "lda");
  int ldb = ptn::checked_int(std::max<int64_t>(1, b1 * ldB_factor), "ldb");
  ptn::gemm_colmajor(transB ? 'T' : 'N', transA ? 'T' : 'N', ptn::checked_int(n, "n"), ptn::checked_int(m, "m"),
                     ptn::checked_int(k, "k"), T(alpha), B, ldb, A, lda, T(beta), C, ptn::checked_int(c1, "ldc"));
}

#endif  // PTNATIVE_NATIVE_OP_BLAS_H
