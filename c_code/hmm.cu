// Dense K-state HMM: log-likelihood and its gradients by scaled forward-backward.
//
// Everything runs in double with per-step scaling: emissions exp(log e - max_k log e)
// per (t, b), transitions exp(log A - max log A), initial / final likewise; the
// forward vector is renormalised every step and the log-scales summed.  One small
// GEMM per step (hand loops on the CPU for small K, BLAS / cuBLAS otherwise).

#define HMM_LOOP(i, n) \
  for (int64_t i = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; i < (int64_t)(n); i += (int64_t)blockDim.x * gridDim.x)

// exp(x) for the CPU as plain arithmetic (Cody-Waite reduction, degree-13 Taylor, ~1 ulp),
// so that loops over it vectorise; values below exp(-708) flush to 0.  CUDA: exp.
DEV_FUNC inline double hmm_exp(double x) {
#if CUDA
  return exp(x);
#else
  // branch-free (x <= 0 in our use; NaN is excluded by the callers)
  double xc = x > -708.0 ? x : -708.0;
  xc = xc < 709.0 ? xc : 709.0;
  double k = std::floor(xc * 1.4426950408889634 + 0.5);
  double r = (xc - k * 0.6931471803691238) - k * 1.9082149292705877e-10;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  uint64_t bits = (uint64_t)((int64_t)k + 1023) << 52;
  double scale;
  memcpy(&scale, &bits, sizeof(double));
  return x > -708.0 ? p * scale : 0.0;
#endif
}

// Scratch memory that is freed on every exit path (errors are exceptions).
struct HmmScratch {
  std::vector<void*> bufs;
  template <typename T> T* get(int64_t n) {
    void* p = device_malloc((size_t)std::max<int64_t>(n, 1) * sizeof(T));
    bufs.push_back(p);
    return (T*)p;
  }
  ~HmmScratch() {
    for (void* p : bufs) device_free(p);
  }
};

// C (c0 x c1) = beta C + op(A) op(B), row-major; (tA, tB) in {(0,0), (0,1), (1,0)}.
static void hmm_gemm(const double* A, int64_t a0, int64_t a1, const double* B, int64_t b0, int64_t b1, double* C,
                     int64_t c0, int64_t c1, bool tA, bool tB, double beta) {
#if !CUDA
  int64_t k_dim = tA ? a0 : a1;
  if (c0 * c1 * k_dim <= 65536) {
    if (beta == 0.0) for (int64_t i = 0; i < c0 * c1; ++i) C[i] = 0.0;
    if (!tA && !tB) {  // C[i, j] += A[i, k] B[k, j]
      for (int64_t i = 0; i < c0; ++i)
        for (int64_t k = 0; k < k_dim; ++k) {
          double a = A[i * a1 + k];
          if (a == 0.0) continue;
          const double* Bk = B + k * b1;
          double* Ci = C + i * c1;
          for (int64_t j = 0; j < c1; ++j) Ci[j] += a * Bk[j];
        }
    } else if (!tA && tB) {  // C[i, j] += A[i, k] B[j, k]
      for (int64_t i = 0; i < c0; ++i)
        for (int64_t j = 0; j < c1; ++j) {
          const double* Ai = A + i * a1;
          const double* Bj = B + j * b1;
          double s = 0.0;
          for (int64_t k = 0; k < k_dim; ++k) s += Ai[k] * Bj[k];
          C[i * c1 + j] += s;
        }
    } else {  // C[i, j] += A[k, i] B[k, j]
      for (int64_t k = 0; k < k_dim; ++k)
        for (int64_t i = 0; i < c0; ++i) {
          double a = A[k * a1 + i];
          if (a == 0.0) continue;
          const double* Bk = B + k * b1;
          double* Ci = C + i * c1;
          for (int64_t j = 0; j < c1; ++j) Ci[j] += a * Bk[j];
        }
    }
    return;
  }
#endif
  affine_raw(A, a0, a1, B, b0, b1, C, c0, c1, tA, tB, beta);
}

DEF_KERNEL void hmm_check_mask(int64_t n_time, int64_t n_batch, const Float* mask, int32_t* seq_len) {
  HMM_LOOP(b, n_batch) {
    int32_t len = 0;
    bool ended = false;
    for (int64_t t = 0; t < n_time; ++t) {
      Float m = mask[t * n_batch + b];
      bool mask_is_0_or_1 = m == Float(0) || m == Float(1);
      assert_cmp(mask_is_0_or_1, ==, true);
      if (m == Float(1)) {
        bool mask_is_a_prefix_mask = !ended;
        assert_cmp(mask_is_a_prefix_mask, ==, true);
        ++len;
      } else {
        ended = true;
      }
    }
    seq_len[b] = len;
  }
}

DEV_FUNC inline void hmm_check_value(double v) {
  bool log_probability_is_not_nan_or_plus_inf = !(v != v) && v < INFINITY;
  assert_cmp(log_probability_is_not_nan_or_plus_inf, ==, true);
}

// out[i] = exp(x[i] - m), vectorisable on the CPU.
DEV_FUNC inline void hmm_exp_row(const Float* __restrict__ x, int64_t n, double m, double* __restrict__ out) {
#if !CUDA
#pragma GCC ivdep
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = hmm_exp((double)x[i] - m);
}

// exp(x - max x) of a vector; returns the max (0 if all -inf).
DEV_FUNC inline double hmm_exp_shift(const Float* x, int64_t n, double* out) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    double v = (double)x[i];
    hmm_check_value(v);
    if (v > m) m = v;
  }
  if (!(m > -INFINITY)) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.0;
    return 0.0;
  }
  hmm_exp_row(x, n, m, out);
  return m;
}

// consts: [log-shift of A, of pi, of f]
DEF_KERNEL void hmm_prep(int64_t K, const Float* lA, const Float* lpi, const Float* lf, double* A, double* pi, double* f,
                         double* consts) {
  HMM_LOOP(i, 1) {
    consts[0] = hmm_exp_shift(lA, K * K, A);
    consts[1] = hmm_exp_shift(lpi, K, pi);
    consts[2] = hmm_exp_shift(lf, K, f);
  }
}

DEF_KERNEL void hmm_emissions(int64_t t, int64_t n_batch, int64_t K, const Float* le, const int32_t* seq_len,
                              double* E, double* mshift) {
  HMM_LOOP(b, n_batch) {
    if (t >= seq_len[b]) continue;
    mshift[t * n_batch + b] = hmm_exp_shift(le + (t * n_batch + b) * K, K, E + (t * n_batch + b) * K);
  }
}

// alpha_t = alpha_hat * E_t (alpha_hat = pi at t = 0), normalised; ll += log-scales.
DEF_KERNEL void hmm_fwd_norm(int64_t t, int64_t n_batch, int64_t K, const int32_t* seq_len, const double* alpha_hat,
                             const double* pi, const double* E, const double* mshift, const double* consts,
                             double* alpha, double* c, double* ll) {
  HMM_LOOP(b, n_batch) {
    if (t >= seq_len[b]) continue;
    const double* Eb = E + (t * n_batch + b) * K;
    double* ab = alpha + (t * n_batch + b) * K;
    const double* prev = t == 0 ? pi : alpha_hat + b * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      ab[k] = prev[k] * Eb[k];
      s += ab[k];
    }
    c[t * n_batch + b] = s;
    if (s > 0.0) {
      double inv = 1.0 / s;
      for (int64_t k = 0; k < K; ++k) ab[k] *= inv;
      ll[b] += log(s) + mshift[t * n_batch + b] + (t == 0 ? consts[1] : consts[0]);
    } else {
      for (int64_t k = 0; k < K; ++k) ab[k] = 0.0;
      ll[b] = -INFINITY;
    }
  }
}

DEF_KERNEL void hmm_fwd_final(int64_t n_batch, int64_t K, const int32_t* seq_len, const double* alpha,
                              const double* pi, const double* f, const double* consts, double* ll) {
  HMM_LOOP(b, n_batch) {
    int64_t len = seq_len[b];
    const double* a = len == 0 ? pi : alpha + ((len - 1) * n_batch + b) * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += a[k] * f[k];
    if (s > 0.0 && ll[b] > -INFINITY)
      ll[b] += log(s) + consts[2] + (len == 0 ? consts[1] : 0.0);
    else
      ll[b] = -INFINITY;
  }
}

struct HmmState {
  int64_t T, B, K;
  int32_t* seq_len;
  double *A, *pi, *f, *consts, *alpha, *alpha_hat, *E, *mshift, *c, *ll;
};

static void hmm_forward(HmmScratch& scratch, HmmState& s, const Float* le, const Float* lA, const Float* lpi,
                        const Float* lf, const Float* mask) {
  const int64_t T = s.T, B = s.B, K = s.K;
  s.seq_len = scratch.get<int32_t>(B);
  s.A = scratch.get<double>(K * K);
  s.pi = scratch.get<double>(K);
  s.f = scratch.get<double>(K);
  s.consts = scratch.get<double>(3);
  s.alpha = scratch.get<double>(T * B * K);
  s.alpha_hat = scratch.get<double>(B * K);
  s.E = scratch.get<double>(T * B * K);
  s.mshift = scratch.get<double>(T * B);
  s.c = scratch.get<double>(T * B);
  s.ll = scratch.get<double>(B);
  start_dev_kernel(hmm_check_mask, (T, B, mask, s.seq_len));
  HANDLE_LAST_ERROR();
  start_dev_kernel(hmm_prep, (K, lA, lpi, lf, s.A, s.pi, s.f, s.consts));
  HANDLE_LAST_ERROR();
  Ndarray_memset(s.alpha, 0, T * B * K * sizeof(double));
  Ndarray_memset(s.E, 0, T * B * K * sizeof(double));
  Ndarray_memset(s.c, 0, T * B * sizeof(double));
  Ndarray_memset(s.mshift, 0, T * B * sizeof(double));
  Ndarray_memset(s.ll, 0, B * sizeof(double));
  for (int64_t t = 0; t < T; ++t) {
    start_dev_kernel(hmm_emissions, (t, B, K, le, s.seq_len, s.E, s.mshift));
    if (t > 0) hmm_gemm(s.alpha + (t - 1) * B * K, B, K, s.A, K, K, s.alpha_hat, B, K, false, false, 0.0);
    start_dev_kernel(hmm_fwd_norm, (t, B, K, s.seq_len, s.alpha_hat, s.pi, s.E, s.mshift, s.consts, s.alpha, s.c,
                                    s.ll));
  }
  HANDLE_LAST_ERROR();
  start_dev_kernel(hmm_fwd_final, (B, K, s.seq_len, s.alpha, s.pi, s.f, s.consts, s.ll));
  HANDLE_LAST_ERROR();
}

static void hmm_check_shapes(Ndarray** inputs) {
  Ndarray *le = inputs[0], *lA = inputs[1], *lpi = inputs[2], *lf = inputs[3], *mask = inputs[4];
  int64_t K = Ndarray_DIMS(le)[2];
  assert_cmp(Ndarray_DIMS(lA)[0], ==, K);
  assert_cmp(Ndarray_DIMS(lA)[1], ==, K);
  assert_cmp(Ndarray_DIMS(lpi)[0], ==, K);
  assert_cmp(Ndarray_DIMS(lf)[0], ==, K);
  assert_cmp(Ndarray_DIMS(mask)[0], ==, Ndarray_DIMS(le)[0]);
  assert_cmp(Ndarray_DIMS(mask)[1], ==, Ndarray_DIMS(le)[1]);
}

DEF_KERNEL void hmm_store_ll(int64_t n_batch, const double* ll, Float* out) {
  HMM_LOOP(b, n_batch) out[b] = (Float)ll[b];
}

// inputs: log_emissions (T,B,K), log_transitions (K,K), log_initial (K), log_final (K), mask (T,B)
// output: log_likelihood (B)
static void hmm_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 1);
  hmm_check_shapes(inputs);
  HmmState s;
  s.T = Ndarray_DIMS(inputs[0])[0];
  s.B = Ndarray_DIMS(inputs[0])[1];
  s.K = Ndarray_DIMS(inputs[0])[2];
  if (s.B == 0) return;
  HmmScratch scratch;
  hmm_forward(scratch, s, Ndarray_DEV_DATA(inputs[0]), Ndarray_DEV_DATA(inputs[1]), Ndarray_DEV_DATA(inputs[2]),
              Ndarray_DEV_DATA(inputs[3]), Ndarray_DEV_DATA(inputs[4]));
  start_dev_kernel(hmm_store_ll, (s.B, s.ll, Ndarray_DEV_DATA(*outputs[0])));
  HANDLE_LAST_ERROR();
}

// ---------------------------------------------------------------- backward
// Per b at frame t: beta_t (rows that end at t start from f), gamma_t -> d log_emissions,
// first / last frame -> d log_initial / d log_final; z[b] = sum_k alpha_t beta_t.
DEF_KERNEL void hmm_bw_gamma(int64_t t, int64_t n_batch, int64_t K, const int32_t* seq_len, const double* alpha,
                             const double* f, const double* ll, const Float* g, double* beta, double* z, Float* dle,
                             double* dpi, double* df) {
  HMM_LOOP(b, n_batch) {
    int64_t len = seq_len[b];
    double* bb = beta + b * K;
    Float* d = dle + (t * n_batch + b) * K;
    if (t >= len || !(ll[b] > -INFINITY)) {
      for (int64_t k = 0; k < K; ++k) d[k] = Float(0);
      z[b] = 0.0;
      continue;
    }
    if (t == len - 1)
      for (int64_t k = 0; k < K; ++k) bb[k] = f[k];
    const double* ab = alpha + (t * n_batch + b) * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += ab[k] * bb[k];
    z[b] = s;
    double gb = (double)g[b];
    double scale = s > 0.0 ? gb / s : 0.0;
    for (int64_t k = 0; k < K; ++k) {
      double gam = ab[k] * bb[k] * scale;
      d[k] = (Float)gam;
      if (t == 0) elem_atomic_add(dpi + k, gam);
      if (t == len - 1) elem_atomic_add(df + k, gam);
    }
  }
}

// v = E_t * beta_t; X = alpha_{t-1} * g / (c_t z_t) (0 for rows that are not valid at t).
DEF_KERNEL void hmm_bw_rows(int64_t t, int64_t n_batch, int64_t K, const int32_t* seq_len, const double* alpha,
                            const double* E, const double* c, const double* ll, const Float* g, const double* beta,
                            const double* z, double* v, double* X) {
  HMM_LOOP(b, n_batch) {
    double* vb = v + b * K;
    double* xb = X + b * K;
    bool ok = t < seq_len[b] && ll[b] > -INFINITY && z[b] > 0.0 && c[t * n_batch + b] > 0.0;
    const double* Eb = E + (t * n_batch + b) * K;
    const double* ap = alpha + ((t - 1) * n_batch + b) * K;
    double r = ok ? (double)g[b] / (c[t * n_batch + b] * z[b]) : 0.0;
    for (int64_t k = 0; k < K; ++k) {
      vb[k] = ok ? Eb[k] * beta[b * K + k] : 0.0;
      xb[k] = ap[k] * r;
    }
  }
}

DEF_KERNEL void hmm_bw_norm(int64_t n_batch, int64_t K, double* beta) {
  HMM_LOOP(b, n_batch) {
    double* bb = beta + b * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += bb[k];
    double inv = s > 0.0 ? 1.0 / s : 0.0;
    for (int64_t k = 0; k < K; ++k) bb[k] *= inv;
  }
}

// T_b = 0: p = sum pi f.
DEF_KERNEL void hmm_bw_empty(int64_t n_batch, int64_t K, const int32_t* seq_len, const double* pi, const double* f,
                             const double* ll, const Float* g, double* dpi, double* df) {
  HMM_LOOP(b, n_batch) {
    if (seq_len[b] != 0 || !(ll[b] > -INFINITY)) continue;
    double s = 0.0;
    for (int64_t k = 0; k < K; ++k) s += pi[k] * f[k];
    if (!(s > 0.0)) continue;
    for (int64_t k = 0; k < K; ++k) {
      double gam = (double)g[b] * pi[k] * f[k] / s;
      elem_atomic_add(dpi + k, gam);
      elem_atomic_add(df + k, gam);
    }
  }
}

DEF_KERNEL void hmm_bw_store(int64_t K, const double* U, const double* A, const double* dpi, const double* df,
                             Float* dA, Float* dpi_out, Float* df_out) {
  HMM_LOOP(i, K * K) {
    dA[i] = (Float)(U[i] * A[i]);
    if (i < K) {
      dpi_out[i] = (Float)dpi[i];
      df_out[i] = (Float)df[i];
    }
  }
}

// inputs: log_emissions, log_transitions, log_initial, log_final, mask, D_log_likelihood (B)
// outputs: d log_emissions (T,B,K), d log_transitions (K,K), d log_initial (K), d log_final (K)
static void hmm_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 4);
  hmm_check_shapes(inputs);
  HmmState s;
  const int64_t T = s.T = Ndarray_DIMS(inputs[0])[0];
  const int64_t B = s.B = Ndarray_DIMS(inputs[0])[1];
  const int64_t K = s.K = Ndarray_DIMS(inputs[0])[2];
  assert_cmp(Ndarray_DIMS(inputs[5])[0], ==, B);
  if (B == 0) return;
  HmmScratch scratch;
  hmm_forward(scratch, s, Ndarray_DEV_DATA(inputs[0]), Ndarray_DEV_DATA(inputs[1]), Ndarray_DEV_DATA(inputs[2]),
              Ndarray_DEV_DATA(inputs[3]), Ndarray_DEV_DATA(inputs[4]));
  const Float* g = Ndarray_DEV_DATA(inputs[5]);
  double* beta = scratch.get<double>(B * K);
  double* v = scratch.get<double>(B * K);
  double* X = scratch.get<double>(B * K);
  double* z = scratch.get<double>(B);
  double* U = scratch.get<double>(K * K);
  double* dpi = scratch.get<double>(K);
  double* df = scratch.get<double>(K);
  Ndarray_memset(beta, 0, B * K * sizeof(double));
  Ndarray_memset(U, 0, K * K * sizeof(double));
  Ndarray_memset(dpi, 0, K * sizeof(double));
  Ndarray_memset(df, 0, K * sizeof(double));
  Float* dle = Ndarray_DEV_DATA(*outputs[0]);
  for (int64_t t = T - 1; t >= 0; --t) {
    start_dev_kernel(hmm_bw_gamma, (t, B, K, s.seq_len, s.alpha, s.f, s.ll, g, beta, z, dle, dpi, df));
    if (t == 0) break;
    start_dev_kernel(hmm_bw_rows, (t, B, K, s.seq_len, s.alpha, s.E, s.c, s.ll, g, beta, z, v, X));
    hmm_gemm(X, B, K, v, B, K, U, K, K, true, false, 1.0);        // U += X^T v
    hmm_gemm(v, B, K, s.A, K, K, beta, B, K, false, true, 0.0);   // beta_{t-1} = v A^T
    start_dev_kernel(hmm_bw_norm, (B, K, beta));
  }
  start_dev_kernel(hmm_bw_empty, (B, K, s.seq_len, s.pi, s.f, s.ll, g, dpi, df));
  start_dev_kernel(hmm_bw_store, (K, U, s.A, dpi, df, Ndarray_DEV_DATA(*outputs[1]), Ndarray_DEV_DATA(*outputs[2]),
                                  Ndarray_DEV_DATA(*outputs[3])));
  HANDLE_LAST_ERROR();
}
