// Batched indexing and sparse (COO) ops.
//
// Indices arrive as floating values (the seed's API).  An index v names slot
// trunc(v); it is in range for a size n when -1 < v < n (NaN never is).
// Sparse entries live in (n_sparse, n_batch) arrays, entry (i, b) at i * B + b
// (all need_contiguous); an entry counts where its mask >= 0.1.  Out-of-range
// entries that count are skipped (SubtensorBatchedIndex clips instead), or,
// with `strict`, raise ValueError.

DEV_FUNC inline int64_t ptn_sp_index(Float v, int64_t n) {
  if (!(v > Float(-1)) || !(v < Float(n))) return -1;
  return (int64_t)v;
}

DEV_FUNC inline int64_t ptn_sp_clip(Float v, int64_t n) {
  if (v >= Float(n)) return n - 1;
  if (!(v > Float(-1))) return 0;  // negative or NaN
  return (int64_t)v;
}

DEV_FUNC inline bool ptn_sp_counts(Float mask) { return mask >= Float(0.1); }

[[noreturn]] static void ptn_sp_range_error(const char* op_what, const char* arr, int64_t i, int64_t b, Float v,
                                            int64_t n) {
  std::ostringstream s;
  s << op_what << ": " << arr << "[" << i << ", " << b << "] = " << v << " is out of range [0, " << n << ")";
  ptn::raise(PTN_STATUS_VALUE, s.str());
}

#if !CUDA
// CPU loops over (time index, dim index) entries: whether entry (i, b) lands inside (T, D).  Out-of-range
// entries are skipped, or raise with `strict`.
static bool ptn_sp_in_range(const char* op_what, const char* name0, const char* name1, int64_t i, int64_t b, Float v0,
                            int64_t T, Float v1, int64_t D, bool strict, int64_t* t, int64_t* j) {
  *t = ptn_sp_index(v0, T);
  *j = ptn_sp_index(v1, D);
  if (*t >= 0 && *j >= 0) return true;
  if (strict) {
    if (*t < 0) ptn_sp_range_error(op_what, name0, i, b, v0, T);
    ptn_sp_range_error(op_what, name1, i, b, v1, D);
  }
  return false;
}
#endif

static void ptn_sp_check(const char* what, int64_t got, int64_t want) {
  if (got != want) {
    std::ostringstream s;
    s << what << " is " << got << ", expected " << want;
    ptn::raise(PTN_STATUS_VALUE, s.str());
  }
}

// All of `arrs` (2-D) have shape (n, B).
static void ptn_sp_check_entries(Ndarray** arrs, const char** names, int n_arrs, int64_t n, int64_t B) {
  for (int k = 0; k < n_arrs; ++k) {
    ptn_sp_check((std::string(names[k]) + " dim 0 (n_sparse)").c_str(), Ndarray_DIMS(arrs[k])[0], n);
    ptn_sp_check((std::string(names[k]) + " dim 1 (n_batch)").c_str(), Ndarray_DIMS(arrs[k])[1], B);
  }
}

// ---------------------------------------------------------------- SubtensorBatchedIndex
#if CUDA
DEF_KERNEL void ptn_sbi_fw_kernel(const Float* x, int64_t T, int64_t B, int64_t D, int64_t xs0, int64_t xs1,
                                  int64_t xs2, const Float* idx, int64_t is0, int64_t is1, Float* y, bool strict) {
  for (int64_t k = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; k < T * B; k += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = k / B, b = k % B;
    Float v = idx[t * is0 + b * is1];
    if (strict) assert_cmp(ptn_sp_index(v, D), >=, 0);
    y[k] = x[t * xs0 + b * xs1 + ptn_sp_clip(v, D) * xs2];
  }
}
DEF_KERNEL void ptn_sbi_bw_kernel(Float* dx, int64_t T, int64_t B, int64_t D, const Float* idx, int64_t is0,
                                  int64_t is1, const Float* dy, int64_t ds0, int64_t ds1) {
  for (int64_t k = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; k < T * B; k += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = k / B, b = k % B;
    dx[k * D + ptn_sp_clip(idx[t * is0 + b * is1], D)] = dy[t * ds0 + b * ds1];
  }
}
#endif

// inputs: x (T,B,D), idx (T,B); outputs: y (T,B) with y[t,b] = x[t, b, clip(idx[t,b])].
static void subtensor_batched_index_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs,
                                       bool strict) {
  assert_cmp(n_inputs, ==, 2);
  assert_cmp(n_outputs, ==, 1);
  Ndarray* x = inputs[0];
  Ndarray* idx = inputs[1];
  Ndarray* y = *outputs[0];
  const int64_t T = Ndarray_DIMS(x)[0], B = Ndarray_DIMS(x)[1], D = Ndarray_DIMS(x)[2];
  ptn_sp_check("idx dim 0", Ndarray_DIMS(idx)[0], T);
  ptn_sp_check("idx dim 1", Ndarray_DIMS(idx)[1], B);
  if (T * B == 0) return;
  if (D == 0) ptn::raise(PTN_STATUS_VALUE, "SubtensorBatchedIndex: x has size 0 in its last dim, nothing to index");
  const Float* xp = Ndarray_DEV_DATA(x);
  const Float* ip = Ndarray_DEV_DATA(idx);
  const int64_t xs0 = Ndarray_STRIDE(x, 0), xs1 = Ndarray_STRIDE(x, 1), xs2 = Ndarray_STRIDE(x, 2);
  const int64_t is0 = Ndarray_STRIDE(idx, 0), is1 = Ndarray_STRIDE(idx, 1);
#if CUDA
  start_dev_kernel(ptn_sbi_fw_kernel, (xp, T, B, D, xs0, xs1, xs2, ip, is0, is1, Ndarray_DEV_DATA(y), strict));
  HANDLE_LAST_ERROR();
#else
  Float* yp = Ndarray_DEV_DATA(y);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      Float v = ip[t * is0 + b * is1];
      if (strict && ptn_sp_index(v, D) < 0) ptn_sp_range_error("SubtensorBatchedIndex", "idx", t, b, v, D);
      yp[t * B + b] = xp[t * xs0 + b * xs1 + ptn_sp_clip(v, D) * xs2];
    }
#endif
}

// inputs: x (shape only), idx (T,B), D_y (T,B); outputs: D_x (T,B,D), zero but at the selected entries.
static void subtensor_batched_index_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 3);
  assert_cmp(n_outputs, ==, 1);
  Ndarray* idx = inputs[1];
  Ndarray* dy = inputs[2];
  Ndarray* dx = *outputs[0];
  const int64_t T = Ndarray_DIMS(dx)[0], B = Ndarray_DIMS(dx)[1], D = Ndarray_DIMS(dx)[2];
  ptn_sp_check("idx dim 0", Ndarray_DIMS(idx)[0], T);
  ptn_sp_check("idx dim 1", Ndarray_DIMS(idx)[1], B);
  ptn_sp_check("D_y dim 0", Ndarray_DIMS(dy)[0], T);
  ptn_sp_check("D_y dim 1", Ndarray_DIMS(dy)[1], B);
  if (T * B == 0 || D == 0) return;
  const Float* ip = Ndarray_DEV_DATA(idx);
  const Float* dyp = Ndarray_DEV_DATA(dy);
  const int64_t is0 = Ndarray_STRIDE(idx, 0), is1 = Ndarray_STRIDE(idx, 1);
  const int64_t ds0 = Ndarray_STRIDE(dy, 0), ds1 = Ndarray_STRIDE(dy, 1);
#if CUDA
  start_dev_kernel(ptn_sbi_bw_kernel, (Ndarray_DEV_DATA(dx), T, B, D, ip, is0, is1, dyp, ds0, ds1));
  HANDLE_LAST_ERROR();
#else
  Float* dxp = Ndarray_DEV_DATA(dx);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      dxp[(t * B + b) * D + ptn_sp_clip(ip[t * is0 + b * is1], D)] = dyp[t * ds0 + b * ds1];
#endif
}

// ---------------------------------------------------------------- SparseToDense
#if CUDA
DEF_KERNEL void ptn_s2d_kernel(Float* W, const Float* s0, const Float* s1, const Float* w, const Float* mask,
                               int64_t N, int64_t T, int64_t B, int64_t D, bool strict) {
  for (int64_t k = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; k < N * B; k += (int64_t)gridDim.x * blockDim.x) {
    if (!ptn_sp_counts(mask[k])) continue;
    int64_t t = ptn_sp_index(s0[k], T), j = ptn_sp_index(s1[k], D);
    if (strict) {
      assert_cmp(t, >=, 0);
      assert_cmp(j, >=, 0);
    }
    if (t < 0 || j < 0) continue;
    elem_atomic_add(&W[(t * B + k % B) * D + j], w[k]);
  }
}
DEF_KERNEL void ptn_s2d_bw_kernel(const Float* dW, const Float* s0, const Float* s1, const Float* mask, Float* dw,
                                  int64_t N, int64_t T, int64_t B, int64_t D) {
  for (int64_t k = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; k < N * B; k += (int64_t)gridDim.x * blockDim.x) {
    if (!ptn_sp_counts(mask[k])) continue;
    int64_t t = ptn_sp_index(s0[k], T), j = ptn_sp_index(s1[k], D);
    if (t < 0 || j < 0) continue;
    dw[k] = dW[(t * B + k % B) * D + j];
  }
}
#endif

// inputs: _initial_W (T,B,D) [= W], s0, s1, weight, mask (N,B); outputs: W with W[s0, b, s1] += weight.
static void sparse_to_dense_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs, bool strict) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 1);
  Ndarray* W = *outputs[0];
  const int64_t T = Ndarray_DIMS(W)[0], B = Ndarray_DIMS(W)[1], D = Ndarray_DIMS(W)[2];
  const int64_t N = Ndarray_DIMS(inputs[1])[0];
  const char* names[4] = {"s0", "s1", "weight", "mask"};
  ptn_sp_check_entries(inputs + 1, names, 4, N, B);
  if (N * B == 0) return;
  const Float* s0 = Ndarray_DEV_DATA(inputs[1]);
  const Float* s1 = Ndarray_DEV_DATA(inputs[2]);
  const Float* w = Ndarray_DEV_DATA(inputs[3]);
  const Float* mask = Ndarray_DEV_DATA(inputs[4]);
#if CUDA
  start_dev_kernel(ptn_s2d_kernel, (Ndarray_DEV_DATA(W), s0, s1, w, mask, N, T, B, D, strict));
  HANDLE_LAST_ERROR();
#else
  Float* Wp = Ndarray_DEV_DATA(W);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t k = i * B + b;
      if (!ptn_sp_counts(mask[k])) continue;
      int64_t t, j;
      if (!ptn_sp_in_range("SparseToDense", "s0", "s1", i, b, s0[k], T, s1[k], D, strict, &t, &j)) continue;
      Wp[(t * B + b) * D + j] += w[k];
    }
#endif
}

// inputs: s0, s1, mask (N,B), D_W (T,B,D) [= D__initial_W]; outputs: D__initial_W (= D_W), D_weight (N,B).
static void sparse_to_dense_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 4);
  assert_cmp(n_outputs, ==, 2);
  Ndarray* dW = *outputs[0];
  Ndarray* dw = *outputs[1];
  const int64_t T = Ndarray_DIMS(dW)[0], B = Ndarray_DIMS(dW)[1], D = Ndarray_DIMS(dW)[2];
  const int64_t N = Ndarray_DIMS(inputs[0])[0];
  Ndarray* entries[4] = {inputs[0], inputs[1], inputs[2], dw};
  const char* names[4] = {"s0", "s1", "mask", "D_weight"};
  ptn_sp_check_entries(entries, names, 4, N, B);
  if (N * B == 0) return;
  const Float* s0 = Ndarray_DEV_DATA(inputs[0]);
  const Float* s1 = Ndarray_DEV_DATA(inputs[1]);
  const Float* mask = Ndarray_DEV_DATA(inputs[2]);
#if CUDA
  start_dev_kernel(ptn_s2d_bw_kernel, (Ndarray_DEV_DATA(dW), s0, s1, mask, Ndarray_DEV_DATA(dw), N, T, B, D));
  HANDLE_LAST_ERROR();
#else
  const Float* dWp = Ndarray_DEV_DATA(dW);
  Float* dwp = Ndarray_DEV_DATA(dw);
  for (int64_t k = 0; k < N * B; ++k) {
    if (!ptn_sp_counts(mask[k])) continue;
    const int64_t t = ptn_sp_index(s0[k], T), j = ptn_sp_index(s1[k], D);
    if (t < 0 || j < 0) continue;
    dwp[k] = dWp[(t * B + k % B) * D + j];
  }
#endif
}

// ---------------------------------------------------------------- MaxAndArgmaxSparse
#if CUDA
// One thread per batch entry, entries in order (the first of equal maxima wins, as on the CPU).
DEF_KERNEL void ptn_maxarg_kernel(const Float* s0, const Float* s1, const Float* w, const Float* mask, Float* out_max,
                                  Float* out_arg, int64_t N, int64_t T, int64_t B, bool strict) {
  for (int64_t b = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; b < B; b += (int64_t)gridDim.x * blockDim.x) {
    for (int64_t i = 0; i < N; ++i) {
      const int64_t k = i * B + b;
      if (!ptn_sp_counts(mask[k])) continue;
      const int64_t t = ptn_sp_index(s0[k], T);
      if (strict) assert_cmp(t, >=, 0);
      if (t < 0) continue;
      if (w[k] > out_max[t * B + b]) {
        out_max[t * B + b] = w[k];
        out_arg[t * B + b] = trunc(s1[k]);
      }
    }
  }
}
#endif

// inputs: s0, s1, weight, mask (N,B), _out_max (T,B) [= out_max], _out_arg (T,B) [= out_arg].
static void max_and_argmax_sparse_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs, bool strict) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 2);
  Ndarray* out_max = *outputs[0];
  Ndarray* out_arg = *outputs[1];
  const int64_t T = Ndarray_DIMS(out_max)[0], B = Ndarray_DIMS(out_max)[1];
  ptn_sp_check("max_and_argmax_sparse: out_arg dim 0 (out_max.shape[0])", Ndarray_DIMS(out_arg)[0], T);
  ptn_sp_check("max_and_argmax_sparse: out_arg dim 1 (out_max.shape[1])", Ndarray_DIMS(out_arg)[1], B);
  const int64_t N = Ndarray_DIMS(inputs[0])[0];
  const char* names[4] = {"s0", "s1", "weight", "mask"};
  ptn_sp_check_entries(inputs, names, 4, N, B);
  if (N * B == 0) return;
  const Float* s0 = Ndarray_DEV_DATA(inputs[0]);
  const Float* s1 = Ndarray_DEV_DATA(inputs[1]);
  const Float* w = Ndarray_DEV_DATA(inputs[2]);
  const Float* mask = Ndarray_DEV_DATA(inputs[3]);
#if CUDA
  start_dev_kernel(ptn_maxarg_kernel,
                   (s0, s1, w, mask, Ndarray_DEV_DATA(out_max), Ndarray_DEV_DATA(out_arg), N, T, B, strict));
  HANDLE_LAST_ERROR();
#else
  Float* mp = Ndarray_DEV_DATA(out_max);
  Float* ap = Ndarray_DEV_DATA(out_arg);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t k = i * B + b;
      if (!ptn_sp_counts(mask[k])) continue;
      const int64_t t = ptn_sp_index(s0[k], T);
      if (t < 0) {
        if (strict) ptn_sp_range_error("MaxAndArgmaxSparse", "s0", i, b, s0[k], T);
        continue;
      }
      if (w[k] > mp[t * B + b]) {
        mp[t * B + b] = w[k];
        ap[t * B + b] = std::trunc(s1[k]);
      }
    }
#endif
}

// ---------------------------------------------------------------- CrossEntropySoftmaxAndGradientZSparse
// A frame (t, b) counts where z_mask > 0.5.  Forward: grad_z = softmax(z) on counted frames (0 elsewhere),
// max_z = max(z), then per counted entry (i, b) with t = s0, j = s1 in range on a counted frame:
// ce[t,b] -= w * log_softmax(z)[t,b,j] and grad_z[t,b,j] -= w (duplicates add up).
// Backward: D_z = D_ce * (sum_j y_j * softmax - y), D_w = -D_ce * log_softmax at the entry.

#if CUDA
#define PTN_CE_BLOCK 256
// One block per frame: max and log-sum-exp by a shared-memory reduction.  Writes lse[f] (and max_z, and
// p = softmax * scale[f] into `p` when given) for the frames that count.
DEF_KERNEL void ptn_ce_frame_kernel(const Float* z, const Float* z_mask, int64_t F, int64_t D, Float* lse,
                                    Float* max_z, Float* p, const Float* scale) {
  __shared__ Float buf[PTN_CE_BLOCK];
  for (int64_t f = blockIdx.x; f < F; f += gridDim.x) {
    if (!(z_mask[f] > Float(0.5)) || D == 0) continue;  // uncounted frames are skipped by the entry kernel too
    const Float* zr = z + f * D;
    Float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = zr[j] > m ? zr[j] : m;
    buf[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s && buf[threadIdx.x + s] > buf[threadIdx.x]) buf[threadIdx.x] = buf[threadIdx.x + s];
      __syncthreads();
    }
    m = buf[0];
    __syncthreads();
    Float acc = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += exp(zr[j] - m);
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
      __syncthreads();
    }
    const Float l = m + log(buf[0]);
    __syncthreads();
    if (threadIdx.x == 0) {
      lse[f] = l;
      if (max_z) max_z[f] = m;
    }
    if (p) {
      const Float sc = scale ? scale[f] : Float(1);
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) p[f * D + j] = sc * exp(zr[j] - l);
    }
  }
}

// Per entry: ce and grad_z (forward, dw == 0) or D_z and D_w (backward, coef = D_ce).
DEF_KERNEL void ptn_ce_entry_kernel(const Float* z, const Float* z_mask, const Float* lse, const Float* s0,
                                    const Float* s1, const Float* w,
                                    const Float* mask, int64_t N, int64_t T, int64_t B, int64_t D, Float* ce,
                                    Float* grad, const Float* coef, Float* dw, bool strict) {
  for (int64_t k = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; k < N * B; k += (int64_t)gridDim.x * blockDim.x) {
    if (!ptn_sp_counts(mask[k])) continue;
    const int64_t t = ptn_sp_index(s0[k], T), j = ptn_sp_index(s1[k], D);
    if (strict) {
      assert_cmp(t, >=, 0);
      assert_cmp(j, >=, 0);
    }
    if (t < 0 || j < 0) continue;
    const int64_t f = t * B + k % B;
    if (!(z_mask[f] > Float(0.5))) continue;  // frame does not count
    const Float l = lse[f];
    const Float c = coef ? coef[f] : Float(1);
    const Float logp = z[f * D + j] - l;
    if (ce) elem_atomic_add(&ce[f], -w[k] * logp);
    elem_atomic_add(&grad[f * D + j], -c * w[k]);
    if (dw) dw[k] = -c * logp;
  }
}

DEF_KERNEL void ptn_ce_ysum_kernel(const Float* s0, const Float* s1, const Float* w, const Float* mask, int64_t N,
                                   int64_t T, int64_t B, int64_t D, Float* ysum) {
  for (int64_t k = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; k < N * B; k += (int64_t)gridDim.x * blockDim.x) {
    if (!ptn_sp_counts(mask[k])) continue;
    const int64_t t = ptn_sp_index(s0[k], T), j = ptn_sp_index(s1[k], D);
    if (t < 0 || j < 0) continue;
    elem_atomic_add(&ysum[t * B + k % B], w[k]);
  }
}

DEF_KERNEL void ptn_ce_scale_kernel(Float* ysum, const Float* d_ce, int64_t F) {
  for (int64_t f = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; f < F; f += (int64_t)gridDim.x * blockDim.x)
    ysum[f] *= d_ce[f];
}
#else
// The frame's log-sum-exp; writes softmax * scale into p (when given) and the max into max_z (when given).
static inline Float ptn_ce_frame(const Float* zr, int64_t D, Float* p, Float scale, Float* max_z) {
  Float m = zr[0];
  for (int64_t j = 1; j < D; ++j) m = zr[j] > m ? zr[j] : m;
  Float acc = 0;
  if (p) {
    for (int64_t j = 0; j < D; ++j) {
      p[j] = std::exp(zr[j] - m);
      acc += p[j];
    }
    const Float r = scale / acc;
    for (int64_t j = 0; j < D; ++j) p[j] *= r;
  } else {
    for (int64_t j = 0; j < D; ++j) acc += std::exp(zr[j] - m);
  }
  if (max_z) *max_z = m;
  return m + std::log(acc);
}
#endif

static void ptn_ce_check(Ndarray** inputs, int64_t* T, int64_t* B, int64_t* D, int64_t* N) {
  Ndarray* z = inputs[0];
  *T = Ndarray_DIMS(z)[0];
  *B = Ndarray_DIMS(z)[1];
  *D = Ndarray_DIMS(z)[2];
  ptn_sp_check("z_mask dim 0", Ndarray_DIMS(inputs[1])[0], *T);
  ptn_sp_check("z_mask dim 1", Ndarray_DIMS(inputs[1])[1], *B);
  *N = Ndarray_DIMS(inputs[2])[0];
  const char* names[4] = {"y_target_t", "y_target_i", "y_target_w", "y_target_mask"};
  ptn_sp_check_entries(inputs + 2, names, 4, *N, *B);
}

// inputs: z (T,B,D), z_mask (T,B), y_target_t, y_target_i, y_target_w, y_target_mask (N,B);
// outputs: out_ce (T,B), out_grad_z (T,B,D), _out_max_z (T,B).
static void crossentropy_softmax_sparse_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs,
                                           bool strict) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 3);
  int64_t T, B, D, N;
  ptn_ce_check(inputs, &T, &B, &D, &N);
  const int64_t F = T * B;
  if (F == 0 && N * B == 0) return;
  const Float* z = Ndarray_DEV_DATA(inputs[0]);
  const Float* z_mask = Ndarray_DEV_DATA(inputs[1]);
  const Float* s0 = Ndarray_DEV_DATA(inputs[2]);
  const Float* s1 = Ndarray_DEV_DATA(inputs[3]);
  const Float* w = Ndarray_DEV_DATA(inputs[4]);
  const Float* mask = Ndarray_DEV_DATA(inputs[5]);
  Float* ce = Ndarray_DEV_DATA(*outputs[0]);
  Float* grad = Ndarray_DEV_DATA(*outputs[1]);
  Float* max_z = Ndarray_DEV_DATA(*outputs[2]);
#if CUDA
  ptn::Scratch scratch;
  Float* lse = scratch.get<Float>(F);
  if (F > 0) start_dev_kernel2(ptn_ce_frame_kernel, (F < 4096 ? F : 4096), PTN_CE_BLOCK, 0,
                               (z, z_mask, F, D, lse, max_z, grad, (const Float*)0));
  if (N * B > 0 && F > 0)
    start_dev_kernel(ptn_ce_entry_kernel, (z, z_mask, lse, s0, s1, w, mask, N, T, B, D, ce, grad, (const Float*)0,
                                           (Float*)0, strict));
  HANDLE_LAST_ERROR();
#else
  std::vector<Float> lse(F, Float(0));
  for (int64_t f = 0; f < F; ++f) {
    if (!(z_mask[f] > Float(0.5)) || D == 0) continue;
    lse[f] = ptn_ce_frame(z + f * D, D, grad + f * D, Float(1), max_z + f);
  }
  for (int64_t i = 0; i < N; ++i)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t k = i * B + b;
      if (!ptn_sp_counts(mask[k])) continue;
      int64_t t, j;
      if (!ptn_sp_in_range("CrossEntropySoftmaxAndGradientZSparse", "y_target_t", "y_target_i", i, b, s0[k], T, s1[k],
                           D, strict, &t, &j))
        continue;
      const int64_t f = t * B + b;
      if (!(z_mask[f] > Float(0.5))) continue;  // frame does not count
      ce[f] -= w[k] * (z[f * D + j] - lse[f]);
      grad[f * D + j] -= w[k];
    }
#endif
}

// inputs: z, z_mask, y_target_t, y_target_i, y_target_w, y_target_mask, D_out_ce (T,B);
// outputs: D_z (T,B,D), D_y_target_w (N,B).
static void crossentropy_softmax_sparse_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 2);
  int64_t T, B, D, N;
  ptn_ce_check(inputs, &T, &B, &D, &N);
  ptn_sp_check("D_out_ce dim 0", Ndarray_DIMS(inputs[6])[0], T);
  ptn_sp_check("D_out_ce dim 1", Ndarray_DIMS(inputs[6])[1], B);
  const int64_t F = T * B;
  if (F == 0 || N * B == 0) return;  // without counted entries, ce = 0 and both gradients are 0
  const Float* z = Ndarray_DEV_DATA(inputs[0]);
  const Float* z_mask = Ndarray_DEV_DATA(inputs[1]);
  const Float* s0 = Ndarray_DEV_DATA(inputs[2]);
  const Float* s1 = Ndarray_DEV_DATA(inputs[3]);
  const Float* w = Ndarray_DEV_DATA(inputs[4]);
  const Float* mask = Ndarray_DEV_DATA(inputs[5]);
  const Float* d_ce = Ndarray_DEV_DATA(inputs[6]);
  Float* dz = Ndarray_DEV_DATA(*outputs[0]);
  Float* dw = Ndarray_DEV_DATA(*outputs[1]);
#if CUDA
  ptn::Scratch scratch;
  Float* tmp = scratch.get<Float>(2 * F);
  Float* ysum = tmp;
  Float* lse = tmp + F;
  Ndarray_memset(ysum, 0, F * sizeof(Float));
  start_dev_kernel(ptn_ce_ysum_kernel, (s0, s1, w, mask, N, T, B, D, ysum));
  start_dev_kernel(ptn_ce_scale_kernel, (ysum, d_ce, F));  // ysum * D_ce
  start_dev_kernel2(ptn_ce_frame_kernel, (F < 4096 ? F : 4096), PTN_CE_BLOCK, 0,
                    (z, z_mask, F, D, lse, (Float*)0, dz, (const Float*)ysum));
  start_dev_kernel(ptn_ce_entry_kernel, (z, z_mask, lse, s0, s1, w, mask, N, T, B, D, (Float*)0, dz, d_ce, dw, false));
  HANDLE_LAST_ERROR();
#else
  std::vector<Float> ysum(F, Float(0)), lse(F, Float(0));
  for (int64_t k = 0; k < N * B; ++k) {
    if (!ptn_sp_counts(mask[k])) continue;
    const int64_t t = ptn_sp_index(s0[k], T), j = ptn_sp_index(s1[k], D);
    if (t < 0 || j < 0) continue;
    ysum[t * B + k % B] += w[k];
  }
  for (int64_t f = 0; f < F; ++f) {
    if (!(z_mask[f] > Float(0.5)) || D == 0) continue;
    const Float scale = ysum[f] * d_ce[f];
    if (scale == Float(0)) {
      lse[f] = ptn_ce_frame(z + f * D, D, (Float*)0, Float(0), (Float*)0);
    } else {
      lse[f] = ptn_ce_frame(z + f * D, D, dz + f * D, scale, (Float*)0);
    }
  }
  for (int64_t i = 0; i < N; ++i)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t k = i * B + b;
      if (!ptn_sp_counts(mask[k])) continue;
      const int64_t t = ptn_sp_index(s0[k], T), j = ptn_sp_index(s1[k], D);
      if (t < 0 || j < 0) continue;
      const int64_t f = t * B + b;
      if (!(z_mask[f] > Float(0.5))) continue;  // frame does not count
      dz[f * D + j] -= d_ce[f] * w[k];
      dw[k] = -d_ce[f] * (z[f * D + j] - lse[f]);
    }
#endif
}
