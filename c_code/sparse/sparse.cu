// Batched indexing and sparse (COO) ops.
//
// Indices arrive as floating values (the seed's API).  An index v names slot
// trunc(v); it is in range for a size n when -1 < v < n (NaN never is).
// Sparse entries live in (n_sparse, n_batch) arrays, entry (i, b) at i * B + b
// (all need_contiguous); an entry counts where its mask >= 0.1.  Out-of-range
// entries that count are skipped (SubtensorBatchedIndex clips instead), or,
// with `strict`, raise ValueError.
#include "../dialect/kernel.h"

#include "../common/softmax_row.h"

#if !CUDA && defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

HOST_FUNC DEV_FUNC inline int64_t ptn_sp_index(Float v, int64_t n) {
  if (!(v > Float(-1)) || !(v < Float(n))) return -1;
  return (int64_t)v;
}

DEV_FUNC inline int64_t ptn_sp_clip(Float v, int64_t n) {
  if (v >= Float(n)) return n - 1;
  if (!(v > Float(-1))) return 0;  // negative or NaN
  return (int64_t)v;
}

HOST_FUNC DEV_FUNC inline bool ptn_sp_counts(Float mask) { return mask >= Float(0.1); }

[[noreturn]] static void ptn_sp_range_error(const char* op_what, const char* arr, int64_t i, int64_t b, Float v,
                                            int64_t n) {
  std::ostringstream s;
  s << op_what << ": " << arr << "[" << i << ", " << b << "] = " << v << " is out of range [0, " << n << ")";
  ptn::raise(PTN_STATUS_VALUE, s.str());
}

// A 2-D float array that host code can read: its data (a host copy on CUDA) and element strides.
struct PtnSpHost {
  std::vector<Float> copy;
  const Float* p = 0;
  int64_t s0 = 0, s1 = 0;
  Float at(int64_t i, int64_t b) const { return p[i * s0 + b * s1]; }
};

static void ptn_sp_host(Ndarray* a, PtnSpHost* h) {
  h->s0 = Ndarray_STRIDE(a, 0);
  h->s1 = Ndarray_STRIDE(a, 1);
#if CUDA
  h->copy.resize(Ndarray_SIZE(a));  // device arrays are C-contiguous
  Ndarray_copy_to_host(h->copy.data(), Ndarray_DEV_DATA(a), h->copy.size() * sizeof(Float));
  h->p = h->copy.data();
#else
  h->p = Ndarray_DEV_DATA(a);
#endif
}

// The strict variants' check, by host code before any kernel runs (so the message is the same on CUDA): every
// entry (i, b) of `first` (n, B) that counts (`mask` >= 0.1; every entry without a mask) must be in range for
// `n_first`, and its `second` (when given) for `n_second`.  Raises for the first entry in (i, b) order that is not.
static void ptn_sp_strict_check(const char* op_what, Ndarray* first, const char* first_name, int64_t n_first,
                                Ndarray* second, const char* second_name, int64_t n_second, Ndarray* mask) {
  PtnSpHost h0, h1, hm;
  ptn_sp_host(first, &h0);
  if (second) ptn_sp_host(second, &h1);
  if (mask) ptn_sp_host(mask, &hm);
  const int64_t n = Ndarray_DIMS(first)[0], B = Ndarray_DIMS(first)[1];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < B; ++b) {
      if (mask && !ptn_sp_counts(hm.at(i, b))) continue;
      if (ptn_sp_index(h0.at(i, b), n_first) < 0) ptn_sp_range_error(op_what, first_name, i, b, h0.at(i, b), n_first);
      if (second && ptn_sp_index(h1.at(i, b), n_second) < 0)
        ptn_sp_range_error(op_what, second_name, i, b, h1.at(i, b), n_second);
    }
}

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

#if !CUDA
// Zeroes a fresh output of this call (n elements at p; the glue's allocation, private anonymous memory) in the way
// numpy's zeros gets one: from 32 MiB up, where glibc's malloc maps every allocation anew (its largest mmap
// threshold), the whole pages inside are handed back with MADV_DONTNEED, after which they read as zero and are
// zeroed by the system where first written, which the system does for fresh pages anyway; the partial pages at
// both ends are memset.  Returns false where it zeroed nothing (smaller outputs, no madvise, or a failed one):
// the caller then zeroes as it writes, while the memory is in the cache.
static bool ptn_sp_zero_fresh_pages(Float* p, int64_t n) {
#if defined(__linux__) && defined(MADV_DONTNEED)
  const size_t bytes = (size_t)n * sizeof(Float);
  if (bytes < ((size_t)32 << 20)) return false;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t begin = ((uintptr_t)p + page - 1) & ~(page - 1), end = ((uintptr_t)p + bytes) & ~(page - 1);
  if (madvise((void*)begin, end - begin, MADV_DONTNEED) != 0) return false;
  memset(p, 0, begin - (uintptr_t)p);
  memset((void*)end, 0, (uintptr_t)p + bytes - end);
  return true;
#else
  (void)p;
  (void)n;
  return false;
#endif
}
#endif

#if !CUDA
// body(i0, i1) for contiguous ranges covering [0, n), one per thread of up to `parts` (ptn::parallel_parts).
template <typename F>
static void ptn_sp_ranges(int64_t n, int64_t parts, F&& body) {
  if (parts > n) parts = n;
  if (parts <= 1) return body(int64_t(0), n);
  ptn::parallel_parts((int)parts, [&](int p) { body(n * p / parts, n * (p + 1) / parts); });
}
#endif

// The kernels below are grid-stride loops, the same on both targets (on the CPU start_dev_kernel runs one thread).
// Out-of-range entries are skipped (or clipped); the strict variants check them on the host first.

// ---------------------------------------------------------------- SubtensorBatchedIndex
// x (or D_x) (T, B, D) and idx (T, B), both strided.
struct PtnSbiArgs {
  int64_t T, B, D, xs0, xs1, xs2, is0, is1;
  const Float* idx;
};

static PtnSbiArgs ptn_sbi_args(Ndarray* x, Ndarray* idx) {
  const int64_t T = Ndarray_DIMS(x)[0], B = Ndarray_DIMS(x)[1];
  ptn_sp_check("idx dim 0", Ndarray_DIMS(idx)[0], T);
  ptn_sp_check("idx dim 1", Ndarray_DIMS(idx)[1], B);
  return PtnSbiArgs{T, B, Ndarray_DIMS(x)[2], Ndarray_STRIDE(x, 0), Ndarray_STRIDE(x, 1), Ndarray_STRIDE(x, 2),
                    Ndarray_STRIDE(idx, 0), Ndarray_STRIDE(idx, 1), Ndarray_DEV_DATA(idx)};
}

DEF_KERNEL void ptn_sbi_fw_kernel(PtnSbiArgs a, const Float* x, Float* y) {
  GRID_LOOP(k, a.T * a.B) {
    const int64_t t = k / a.B, b = k % a.B;
    y[k] = x[t * a.xs0 + b * a.xs1 + ptn_sp_clip(a.idx[t * a.is0 + b * a.is1], a.D) * a.xs2];
  }
}

// dx is C-contiguous and fully written: zeroed (all at once on the GPU; on the CPU by the system when large,
// ptn_sp_zero_fresh_pages, else row by row, so that each row is in the cache when its entry lands), then D_y at
// the selected entries.
DEF_KERNEL void ptn_sbi_bw_kernel(PtnSbiArgs a, const Float* dy, int64_t ds0, int64_t ds1, Float* dx) {
  GRID_LOOP(k, a.T * a.B) {
    const int64_t t = k / a.B, b = k % a.B;
    dx[k * a.D + ptn_sp_clip(a.idx[t * a.is0 + b * a.is1], a.D)] = dy[t * ds0 + b * ds1];
  }
}

#if !CUDA
static void ptn_sbi_bw_cpu(const PtnSbiArgs& a, const Float* dy, int64_t ds0, int64_t ds1, Float* dx) {
  const bool zeroed = ptn_sp_zero_fresh_pages(dx, a.T * a.B * a.D);
  for (int64_t k = 0; k < a.T * a.B; ++k) {
    const int64_t t = k / a.B, b = k % a.B;
    if (!zeroed) memset(dx + k * a.D, 0, (size_t)a.D * sizeof(Float));
    dx[k * a.D + ptn_sp_clip(a.idx[t * a.is0 + b * a.is1], a.D)] = dy[t * ds0 + b * ds1];
  }
}
#endif

// inputs: x (T,B,D), idx (T,B); outputs: y (T,B) with y[t,b] = x[t, b, clip(idx[t,b])].
static void subtensor_batched_index_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs,
                                       bool strict) {
  assert_cmp(n_inputs, ==, 2);
  assert_cmp(n_outputs, ==, 1);
  const PtnSbiArgs a = ptn_sbi_args(inputs[0], inputs[1]);
  if (a.T * a.B == 0) return;
  if (a.D == 0) ptn::raise(PTN_STATUS_VALUE, "SubtensorBatchedIndex: x has size 0 in its last dim, nothing to index");
  if (strict) ptn_sp_strict_check("SubtensorBatchedIndex", inputs[1], "idx", a.D, 0, 0, 0, 0);
  start_dev_kernel(ptn_sbi_fw_kernel, (a, Ndarray_DEV_DATA(inputs[0]), Ndarray_DEV_DATA(*outputs[0])));
  HANDLE_LAST_ERROR();
}

// inputs: x (shape only), idx (T,B), D_y (T,B); outputs: D_x (T,B,D) (fully written), zero but at the selected
// entries.
static void subtensor_batched_index_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 3);
  assert_cmp(n_outputs, ==, 1);
  Ndarray* dy = inputs[2];
  const PtnSbiArgs a = ptn_sbi_args(*outputs[0], inputs[1]);
  ptn_sp_check("D_y dim 0", Ndarray_DIMS(dy)[0], a.T);
  ptn_sp_check("D_y dim 1", Ndarray_DIMS(dy)[1], a.B);
  if (a.T * a.B == 0 || a.D == 0) return;
#if CUDA
  Ndarray_memset(Ndarray_DEV_DATA(*outputs[0]), 0, a.T * a.B * a.D * sizeof(Float));
  start_dev_kernel(ptn_sbi_bw_kernel, (a, Ndarray_DEV_DATA(dy), Ndarray_STRIDE(dy, 0), Ndarray_STRIDE(dy, 1),
                                       Ndarray_DEV_DATA(*outputs[0])));
  HANDLE_LAST_ERROR();
#else
  ptn_sbi_bw_cpu(a, Ndarray_DEV_DATA(dy), Ndarray_STRIDE(dy, 0), Ndarray_STRIDE(dy, 1), Ndarray_DEV_DATA(*outputs[0]));
#endif
}

// ---------------------------------------------------------------- COO entries
// An op's (N, B) entry arrays (C-contiguous) and the (T, B, D) space they index.
struct PtnSpEntries {
  int64_t N, T, B, D;
  const Float* s0;
  const Float* s1;
  const Float* mask;
  // The flat (t, b, j) slot of entry k; -1 when it does not count or is out of range.
  DEV_FUNC int64_t slot(int64_t k) const {
    if (!ptn_sp_counts(mask[k])) return -1;
    const int64_t t = ptn_sp_index(s0[k], T), j = ptn_sp_index(s1[k], D);
    return t < 0 || j < 0 ? -1 : (t * B + k % B) * D + j;
  }
};

// The entries s0, s1, mask, after checking that they and `others` are (N, B) with N = s0.shape[0].
static PtnSpEntries ptn_sp_entries(Ndarray** arrs, const char** names, int n_arrs, int i_s0, int i_s1, int i_mask,
                                   int64_t T, int64_t B, int64_t D) {
  const int64_t N = Ndarray_DIMS(arrs[i_s0])[0];
  ptn_sp_check_entries(arrs, names, n_arrs, N, B);
  return PtnSpEntries{N, T, B, D, Ndarray_DEV_DATA(arrs[i_s0]), Ndarray_DEV_DATA(arrs[i_s1]),
                      Ndarray_DEV_DATA(arrs[i_mask])};
}

// ---------------------------------------------------------------- SparseToDense
DEF_KERNEL void ptn_s2d_kernel(PtnSpEntries e, const Float* w, Float* W) {
  GRID_LOOP(k, e.N * e.B) {
    const int64_t s = e.slot(k);
    if (s >= 0) elem_atomic_add(&W[s], w[k]);
  }
}

DEF_KERNEL void ptn_s2d_bw_kernel(PtnSpEntries e, const Float* dW, Float* dw) {
  GRID_LOOP(k, e.N * e.B) {
    const int64_t s = e.slot(k);
    if (s >= 0) dw[k] = dW[s];
  }
}

// The entries s0, s1, weight, mask (inputs 1 to 4 of both ops) into W, checked (strict: every entry that counts
// in range).
static PtnSpEntries ptn_s2d_entries(Ndarray** inputs, Ndarray* W, bool strict) {
  const char* names[4] = {"s0", "s1", "weight", "mask"};
  const PtnSpEntries e = ptn_sp_entries(inputs + 1, names, 4, 0, 1, 3, Ndarray_DIMS(W)[0], Ndarray_DIMS(W)[1],
                                        Ndarray_DIMS(W)[2]);
  if (strict && e.N * e.B > 0)
    ptn_sp_strict_check("SparseToDense", inputs[1], "s0", e.T, inputs[2], "s1", e.D, inputs[4]);
  return e;
}

// inputs: _initial_W (T,B,D) [= W], s0, s1, weight, mask (N,B); outputs: W with W[s0, b, s1] += weight.
static void sparse_to_dense_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs, bool strict) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 1);
  Ndarray* W = *outputs[0];
  const PtnSpEntries e = ptn_s2d_entries(inputs, W, strict);
  if (e.N * e.B == 0) return;
  start_dev_kernel(ptn_s2d_kernel, (e, Ndarray_DEV_DATA(inputs[3]), Ndarray_DEV_DATA(W)));
  HANDLE_LAST_ERROR();
}

// D_weight[i, b] = D_W[s0, b, s1] for the entries that count, else 0: the gradient of both ops.
static void ptn_s2d_weight_grad(Ndarray** inputs, Ndarray* dW, Ndarray* dw) {
  Ndarray* arrs[4] = {inputs[0], inputs[1], inputs[2], dw};
  const char* names[4] = {"s0", "s1", "mask", "D_weight"};
  const PtnSpEntries e = ptn_sp_entries(arrs, names, 4, 0, 1, 2, Ndarray_DIMS(dW)[0], Ndarray_DIMS(dW)[1],
                                        Ndarray_DIMS(dW)[2]);
  if (e.N * e.B == 0) return;
  start_dev_kernel(ptn_s2d_bw_kernel, (e, Ndarray_DEV_DATA(dW), Ndarray_DEV_DATA(dw)));
  HANDLE_LAST_ERROR();
}

// inputs: s0, s1, mask (N,B), D_W (T,B,D) [= D__initial_W]; outputs: D__initial_W (= D_W), D_weight (N,B).
static void sparse_to_dense_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 4);
  assert_cmp(n_outputs, ==, 2);
  ptn_s2d_weight_grad(inputs, *outputs[0], *outputs[1]);
}

// ---------------------------------------------------------------- SparseToDenseZeros
#if !CUDA
// W (C-contiguous, fully written here) = zeros + the entries, one block of W at a time: the block is zeroed (its
// pages faulted in; a large W is zeroed by the system, ptn_sp_zero_fresh_pages) and then receives its entries while
// it is in the cache.  The entries are bucketed by block
// with a stable counting sort, so that the entries of one slot are added in the order of k, as ptn_s2d_kernel
// adds them (the same sums, bit for bit).
static void ptn_s2d_zeros_cpu(const PtnSpEntries& e, const Float* w, Float* W) {
  const int64_t n = e.T * e.B * e.D, n_entries = e.N * e.B;
  const int64_t block = ((int64_t)1 << 18) / (int64_t)sizeof(Float);  // 256 KiB of W
  const int64_t n_blocks = (n + block - 1) / block;
  std::vector<int64_t> slot(n_entries), start(n_blocks + 1, 0);
  for (int64_t k = 0; k < n_entries; ++k) {
    slot[k] = e.slot(k);
    if (slot[k] >= 0) ++start[slot[k] / block + 1];
  }
  for (int64_t q = 0; q < n_blocks; ++q) start[q + 1] += start[q];
  std::vector<int64_t> order(start[n_blocks] > 0 ? start[n_blocks] : 1), next(start.begin(), start.end() - 1);
  for (int64_t k = 0; k < n_entries; ++k)
    if (slot[k] >= 0) order[next[slot[k] / block]++] = k;
  const bool zeroed = ptn_sp_zero_fresh_pages(W, n);
  auto blocks = [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t lo = q * block, hi = lo + block < n ? lo + block : n;
      if (!zeroed) memset(W + lo, 0, (size_t)(hi - lo) * sizeof(Float));
      for (int64_t r = start[q]; r < start[q + 1]; ++r) W[slot[order[r]]] += w[order[r]];
    }
  };
  // Fresh pages (zeroed by the system where first written) are faulted in by several threads at once from 128 MiB
  // up, below by the calling thread alone: there the threads' extra CPU time outweighed the split.  Measured on the
  // 2-vCPU VM (float32, 2 threads against 1, alternating turns with numpy's zeros + add.at): 256 MB 17.6-18.2 against
  // 25.9-26.5 ms (numpy 24.2-25.0); 64 MB 8.1-9.7 (best 4.3, 2.2x the CPU time of one thread) against 7.1 ms (numpy
  // 7.9-9.1); on another day, when its page faults cost 3-4 times as much, 64 MB took 18.9 ms on two threads and
  // 26-30 on one (numpy 26-27).  Each block is filled by one thread, in order: the same sums either way.
  const int64_t parts = zeroed && n * (int64_t)sizeof(Float) >= ((int64_t)128 << 20) ? ptn::cpu_threads() : 1;
  ptn_sp_ranges(n_blocks, parts, blocks);
}
#endif

// inputs: _shape_of_W (T,0,D) (its shape only), s0, s1, weight, mask (N,B); outputs: W (T,B,D), fully written:
// zeros, then W[s0, b, s1] += weight.
static void sparse_to_dense_zeros_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs,
                                     bool strict) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 1);
  Ndarray* W = *outputs[0];
  const PtnSpEntries e = ptn_s2d_entries(inputs, W, strict);
  if (e.T * e.B * e.D == 0) return;
#if CUDA
  Ndarray_memset(Ndarray_DEV_DATA(W), 0, e.T * e.B * e.D * sizeof(Float));
  if (e.N * e.B > 0) start_dev_kernel(ptn_s2d_kernel, (e, Ndarray_DEV_DATA(inputs[3]), Ndarray_DEV_DATA(W)));
  HANDLE_LAST_ERROR();
#else
  ptn_s2d_zeros_cpu(e, Ndarray_DEV_DATA(inputs[3]), Ndarray_DEV_DATA(W));
#endif
}

// inputs: s0, s1, mask (N,B), D_W (T,B,D); outputs: D_weight (N,B).
static void sparse_to_dense_zeros_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 4);
  assert_cmp(n_outputs, ==, 1);
  ptn_s2d_weight_grad(inputs, inputs[3], *outputs[0]);
}

// ---------------------------------------------------------------- MaxAndArgmaxSparse
// One thread per batch entry, entries in order: the first of equal maxima wins.  s1 is not range-checked.
DEF_KERNEL void ptn_maxarg_kernel(PtnSpEntries e, const Float* w, Float* out_max, Float* out_arg) {
  GRID_LOOP(b, e.B) {
    for (int64_t i = 0; i < e.N; ++i) {
      const int64_t k = i * e.B + b;
      if (!ptn_sp_counts(e.mask[k])) continue;
      const int64_t t = ptn_sp_index(e.s0[k], e.T);
      if (t >= 0 && w[k] > out_max[t * e.B + b]) {
        out_max[t * e.B + b] = w[k];
        out_arg[t * e.B + b] = trunc(e.s1[k]);
      }
    }
  }
}

// inputs: s0, s1, weight, mask (N,B), _out_max (T,B) [= out_max], _out_arg (T,B) [= out_arg].
static void max_and_argmax_sparse_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs, bool strict) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 2);
  Ndarray* out_max = *outputs[0];
  Ndarray* out_arg = *outputs[1];
  const int64_t T = Ndarray_DIMS(out_max)[0], B = Ndarray_DIMS(out_max)[1];
  ptn_sp_check("max_and_argmax_sparse: out_arg dim 0 (out_max.shape[0])", Ndarray_DIMS(out_arg)[0], T);
  ptn_sp_check("max_and_argmax_sparse: out_arg dim 1 (out_max.shape[1])", Ndarray_DIMS(out_arg)[1], B);
  const char* names[4] = {"s0", "s1", "weight", "mask"};
  const PtnSpEntries e = ptn_sp_entries(inputs, names, 4, 0, 1, 3, T, B, 0);
  if (e.N * B == 0) return;
  if (strict) ptn_sp_strict_check("MaxAndArgmaxSparse", inputs[0], "s0", T, 0, 0, 0, inputs[3]);
  start_dev_kernel(ptn_maxarg_kernel, (e, Ndarray_DEV_DATA(inputs[2]), Ndarray_DEV_DATA(out_max),
                                       Ndarray_DEV_DATA(out_arg)));
  HANDLE_LAST_ERROR();
}

// ---------------------------------------------------------------- CrossEntropySoftmaxAndGradientZSparse
// A frame (t, b) counts where z_mask > 0.5.  Forward: grad_z = softmax(z) on counted frames (0 elsewhere),
// max_z = max(z), then per counted entry (i, b) with t = s0, j = s1 in range on a counted frame:
// ce[t,b] -= w * log_softmax(z)[t,b,j] and grad_z[t,b,j] -= w (duplicates add up).
// Backward: D_z = D_ce * (sum_j y_j * softmax - y), D_w = -D_ce * log_softmax at the entry.
//
// Per frame (counted, D > 0): lse[f] = log-sum-exp of z[f], max_z[f] (when given) its max, and p[f] (when given)
// softmax(z[f]) * scale[f] (scale 1 when not given; a zero scale leaves p[f] as it is).

#if CUDA
#define PTN_CE_BLOCK 256
// One block per frame: max and log-sum-exp by a shared-memory reduction.
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
    const Float sc = scale ? scale[f] : Float(1);
    if (p && sc != Float(0))
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) p[f * D + j] = sc * exp(zr[j] - l);
  }
}
#else
// One frame: returns its log-sum-exp; p (if not null) := scale * softmax.  softmax_row.h's vectorised max and
// exponentials, the sum in its lanes.
static inline Float ptn_ce_frame(const Float* zr, int64_t D, Float* p, Float scale, Float* max_z) {
  const Float m = ptn_row_max(zr, D);
  const Float acc = (Float)ptn_row_exp_sum(zr, p, D, m);
  if (p) {
    const Float r = scale / acc;
    for (int64_t j = 0; j < D; ++j) p[j] *= r;
  }
  if (max_z) *max_z = m;
  return m + std::log(acc);
}
#endif

// From this many elements (z's frames times D) the CPU splits the frames over its threads.
#define PTN_CE_PARALLEL_ELEMENTS (int64_t(1) << 19)

static void ptn_ce_frames(const Float* z, const Float* z_mask, int64_t F, int64_t D, Float* lse, Float* max_z, Float* p,
                          const Float* scale) {
  if (F == 0 || D == 0) return;
#if CUDA
  start_dev_kernel2(ptn_ce_frame_kernel, (F < 4096 ? F : 4096), PTN_CE_BLOCK, 0,
                    (z, z_mask, F, D, lse, max_z, p, scale));
#else
  auto frames = [&](int64_t f0, int64_t f1) {
    for (int64_t f = f0; f < f1; ++f) {
      if (!(z_mask[f] > Float(0.5))) continue;
      const Float sc = scale ? scale[f] : Float(1);
      lse[f] = ptn_ce_frame(z + f * D, D, p && sc != Float(0) ? p + f * D : (Float*)0, sc, max_z ? max_z + f : 0);
    }
  };
  ptn_sp_ranges(F, F * D >= PTN_CE_PARALLEL_ELEMENTS ? ptn::cpu_threads() : 1, frames);
#endif
}

// Per counted entry on a counted frame: ce and grad_z (forward: coef and dw null) or D_z and D_w (backward:
// coef = D_ce, ce null).  Entries in order, so that duplicates add up in the same order on the CPU.
DEF_KERNEL void ptn_ce_entry_kernel(PtnSpEntries e, const Float* z, const Float* z_mask, const Float* lse,
                                    const Float* w, Float* ce, Float* grad, const Float* coef, Float* dw) {
  GRID_LOOP(k, e.N * e.B) {
    const int64_t s = e.slot(k);
    if (s < 0) continue;
    const int64_t f = s / e.D, j = s % e.D;
    if (!(z_mask[f] > Float(0.5))) continue;  // frame does not count
    const Float c = coef ? coef[f] : Float(1);
    const Float logp = z[f * e.D + j] - lse[f];
    if (ce) elem_atomic_add(&ce[f], -w[k] * logp);
    elem_atomic_add(&grad[f * e.D + j], -c * w[k]);
    if (dw) dw[k] = -c * logp;
  }
}

// ysum[f] = D_ce[f] * (sum of the weights of the counted entries of frame f).
DEF_KERNEL void ptn_ce_ysum_kernel(PtnSpEntries e, const Float* w, Float* ysum) {
  GRID_LOOP(k, e.N * e.B) {
    const int64_t s = e.slot(k);
    if (s >= 0) elem_atomic_add(&ysum[s / e.D], w[k]);
  }
}

DEF_KERNEL void ptn_ce_scale_kernel(Float* ysum, const Float* d_ce, int64_t F) {
  GRID_LOOP(f, F) ysum[f] *= d_ce[f];
}

// z (T,B,D), z_mask (T,B), then the entries y_target_t, y_target_i, y_target_w, y_target_mask (N,B).
static PtnSpEntries ptn_ce_entries(Ndarray** inputs) {
  Ndarray* z = inputs[0];
  const int64_t T = Ndarray_DIMS(z)[0], B = Ndarray_DIMS(z)[1];
  ptn_sp_check("z_mask dim 0", Ndarray_DIMS(inputs[1])[0], T);
  ptn_sp_check("z_mask dim 1", Ndarray_DIMS(inputs[1])[1], B);
  const char* names[4] = {"y_target_t", "y_target_i", "y_target_w", "y_target_mask"};
  return ptn_sp_entries(inputs + 2, names, 4, 0, 1, 3, T, B, Ndarray_DIMS(z)[2]);
}

// inputs: z (T,B,D), z_mask (T,B), y_target_t, y_target_i, y_target_w, y_target_mask (N,B);
// outputs: out_ce (T,B), out_grad_z (T,B,D), _out_max_z (T,B).
static void crossentropy_softmax_sparse_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs,
                                           bool strict) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 3);
  const PtnSpEntries e = ptn_ce_entries(inputs);
  const int64_t F = e.T * e.B;
  if (strict && e.N * e.B > 0)
    ptn_sp_strict_check("CrossEntropySoftmaxAndGradientZSparse", inputs[2], "y_target_t", e.T, inputs[3],
                        "y_target_i", e.D, inputs[5]);
  if (F == 0) return;
  const Float* z = Ndarray_DEV_DATA(inputs[0]);
  const Float* z_mask = Ndarray_DEV_DATA(inputs[1]);
  Float* grad = Ndarray_DEV_DATA(*outputs[1]);
  ptn::Scratch scratch;
  Float* lse = scratch.get<Float>(F);
  ptn_ce_frames(z, z_mask, F, e.D, lse, Ndarray_DEV_DATA(*outputs[2]), grad, (const Float*)0);
  if (e.N * e.B > 0)
    start_dev_kernel(ptn_ce_entry_kernel, (e, z, z_mask, lse, Ndarray_DEV_DATA(inputs[4]),
                                           Ndarray_DEV_DATA(*outputs[0]), grad, (const Float*)0, (Float*)0));
  HANDLE_LAST_ERROR();
}

// inputs: z, z_mask, y_target_t, y_target_i, y_target_w, y_target_mask, D_out_ce (T,B);
// outputs: D_z (T,B,D), D_y_target_w (N,B).
static void crossentropy_softmax_sparse_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 2);
  const PtnSpEntries e = ptn_ce_entries(inputs);
  ptn_sp_check("D_out_ce dim 0", Ndarray_DIMS(inputs[6])[0], e.T);
  ptn_sp_check("D_out_ce dim 1", Ndarray_DIMS(inputs[6])[1], e.B);
  const int64_t F = e.T * e.B;
  if (F == 0 || e.N * e.B == 0) return;  // without counted entries, ce = 0 and both gradients are 0
  const Float* z = Ndarray_DEV_DATA(inputs[0]);
  const Float* z_mask = Ndarray_DEV_DATA(inputs[1]);
  const Float* w = Ndarray_DEV_DATA(inputs[4]);
  const Float* d_ce = Ndarray_DEV_DATA(inputs[6]);
  Float* dz = Ndarray_DEV_DATA(*outputs[0]);
  ptn::Scratch scratch;
  Float* ysum = scratch.get<Float>(F);
  Float* lse = scratch.get<Float>(F);
  Ndarray_memset(ysum, 0, F * sizeof(Float));
  start_dev_kernel(ptn_ce_ysum_kernel, (e, w, ysum));
  start_dev_kernel(ptn_ce_scale_kernel, (ysum, d_ce, F));
  ptn_ce_frames(z, z_mask, F, e.D, lse, (Float*)0, dz, ysum);
  start_dev_kernel(ptn_ce_entry_kernel, (e, z, z_mask, lse, w, (Float*)0, dz, d_ce, Ndarray_DEV_DATA(*outputs[1])));
  HANDLE_LAST_ERROR();
}
