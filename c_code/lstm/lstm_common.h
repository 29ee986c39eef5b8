// Shared by every LSTM kernel file (lstm.cu, lstm_generic.cu, lstm_lowmem.cu, twod_lstm.cu, lstm_cell.cu):
// activations, mask helpers, the (batch row, cell) loop, GEMM through the dialect, the frames an op visits.
// Gate layout along the 4n axis: [cell input | input gate | forget gate | output gate], each n wide.  The mask
// `i` is 1 on valid frames and 0 on padding; a masked frame outputs 0 and carries the cell state.
#ifndef PTNATIVE_LSTM_LSTM_COMMON_H
#define PTNATIVE_LSTM_LSTM_COMMON_H

#include "../dialect/kernel.h"
#include "../common/fast_math.h"

// The CPU's activation passes (the frames' cells) in vectors of the FMA units' width: g++ prefers 256-bit vectors on
// AVX-512 machines for the loops it vectorises.
#if !CUDA && defined(__AVX512F__)
#define LSTM_WIDE_LOOPS __attribute__((target("prefer-vector-width=512")))
#else
#define LSTM_WIDE_LOOPS
#endif

// Activations.  CUDA and float64 use the libm functions; the float32 CPU build uses branch-free versions
// (exp by range reduction + polynomial, about 1 ulp) that gcc vectorises, since a call to expf/tanhf per
// element would cost as much as the GEMMs.
#if CUDA
DEV_FUNC inline float lstm_exp(float x) { return expf(x); }
DEV_FUNC inline float lstm_tanh(float x) { return tanhf(x); }
#else
__attribute__((always_inline)) static inline float lstm_exp(float x) {
  return fast_exp_in_range(std::min(std::max(x, -87.0f), 88.0f));
}
__attribute__((always_inline)) static inline float lstm_tanh(float x) {
  float ax = std::fabs(x);
  float e = lstm_exp(-2.0f * ax);
  float big = (1.0f - e) / (1.0f + e);
  float x2 = x * x;  // odd Taylor series for |x| < 0.125: relative error < 1e-8
  float small = ax * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * (-0.0539682540f + x2 * 0.0218694885f))));
  float t = ax < 0.125f ? small : big;
  return x < 0.0f ? -t : t;
}
#endif
DEV_FUNC inline double lstm_exp(double x) { return exp(x); }
DEV_FUNC inline double lstm_tanh(double x) { return tanh(x); }
DEV_FUNC inline Float lstm_sigmoid(Float x) { return Float(1) / (Float(1) + lstm_exp(-x)); }

// Masks select rather than multiply, so that a NaN or inf on a masked frame (padding) stays there (NaN * 0 is
// NaN).  m = 1 gives v, m = 0 gives keep (0), a mask value in between the blend.
DEV_FUNC inline Float lstm_blend(Float m, Float v, Float keep) {
  return m == Float(0) ? keep : v * m + keep * (Float(1) - m);
}
DEV_FUNC inline Float lstm_masked(Float m, Float v) { return m == Float(0) ? Float(0) : v * m; }
// dL/d(previous state) from dL/d(state) ds: through the forget gate fg on a valid frame, unchanged on padding.
DEV_FUNC inline Float lstm_carry_grad(Float m, Float ds, Float fg) {
  return m == Float(0) ? ds : ds * (fg * m + (Float(1) - m));
}

// One cell of NativeLstm2 / LstmLowMem: the activated gates from the pre-activations of the four blocks.
struct LstmGates {
  Float a, ig, fg, og;  // tanh(cell input), sigmoid(input gate), sigmoid(forget gate), sigmoid(output gate)
};
DEV_FUNC inline LstmGates lstm_gates(Float z_cell, Float z_in, Float z_forget, Float z_out) {
  return {lstm_tanh(z_cell), lstm_sigmoid(z_in), lstm_sigmoid(z_forget), lstm_sigmoid(z_out)};
}

// lstm_masked and lstm_carry_grad for a mask value m known to be non-zero (kValid) or 0: a caller that decides
// this once per batch row leaves the loop over the row's cells without a select on m, and g++ vectorises it
// (with a select per cell it moves the loads that only one side needs into that side, and vectorises nothing).
template <bool kValid>
DEV_FUNC inline Float lstm_masked_by(Float m, Float v) {
  return kValid ? v * m : Float(0);
}
template <bool kValid>
DEV_FUNC inline Float lstm_carry_grad_by(Float m, Float ds, Float fg) {
  return kValid ? ds * (fg * m + (Float(1) - m)) : ds;
}

// Backward through one cell: writes dL/d(pre-activations) to d[0], d[n], d[2n], d[3n] and returns dL/dc of this
// frame (all paths).  m: mask (non-zero iff kValid); tc = tanh(c); dy, dc: dL/dy and dL/dc reaching the cell
// from outside it.
template <bool kValid>
DEV_FUNC inline Float lstm_cell_backward(Float m, const LstmGates& g, Float tc, Float c_prev, Float dy, Float dc,
                                         Float* d, int64_t n) {
  Float dct = dc + lstm_masked_by<kValid>(m, dy * g.og * (Float(1) - tc * tc));
  d[0] = lstm_masked_by<kValid>(m, dct * g.ig * (Float(1) - g.a * g.a));
  d[n] = lstm_masked_by<kValid>(m, dct * g.a * g.ig * (Float(1) - g.ig));
  d[2 * n] = lstm_masked_by<kValid>(m, dct * c_prev * g.fg * (Float(1) - g.fg));
  d[3 * n] = lstm_masked_by<kValid>(m, dy * tc * g.og * (Float(1) - g.og));
  return dct;
}

// Runs CELL<true>(b, j, m) on the cells of the rows whose mask value m = mask[b] is non-zero, CELL<false>(b, j, m)
// on the others: a grid-stride loop on CUDA; on the CPU the choice is made once per row.  CELL names a function
// template taking (b, j, m, args...); `...` are the further arguments.
#if CUDA
#define LSTM_FOR_BJ_BY_MASK(mask, nb, nc, CELL, ...)                                            \
  LSTM_FOR_BJ(_b, _j, nb, nc) {                                                                 \
    if (mask[_b] != Float(0)) CELL<true>(_b, _j, mask[_b], __VA_ARGS__);                        \
    else CELL<false>(_b, _j, mask[_b], __VA_ARGS__);                                            \
  }
#else
// The CPU's loop over the cells j0 <= j < j1 of each row (the cell split's share of a frame: lstm_packed.h).
#define LSTM_FOR_BJ_BY_MASK_CELLS(mask, nb, j0, j1, CELL, ...)                                  \
  for (int64_t _b = 0; _b < (nb); ++_b) {                                                       \
    Float _m = mask[_b];                                                                        \
    if (_m != Float(0))                                                                         \
      for (int64_t _j = (j0); _j < (j1); ++_j) CELL<true>(_b, _j, _m, __VA_ARGS__);            \
    else                                                                                        \
      for (int64_t _j = (j0); _j < (j1); ++_j) CELL<false>(_b, _j, _m, __VA_ARGS__);           \
  }
#define LSTM_FOR_BJ_BY_MASK(mask, nb, nc, CELL, ...) LSTM_FOR_BJ_BY_MASK_CELLS(mask, nb, 0, nc, CELL, __VA_ARGS__)
#endif

// Loop over (batch row b, cell j) of a (n_batch, n_cells) grid: a grid-stride loop on CUDA, two plain
// nested loops (the inner one vectorisable, no div/mod) on the CPU.  The body must not use break/continue.
#if CUDA
#define LSTM_FOR_BJ(b, j, nb, nc)                                                                    \
  for (int64_t _k = threadIdx.x + (int64_t)blockDim.x * blockIdx.x, b = 0, j = 0;                   \
       _k < (int64_t)(nb) * (nc) ? (b = _k / (nc), j = _k % (nc), true) : false;                     \
       _k += (int64_t)gridDim.x * blockDim.x)
#else
#define LSTM_FOR_BJ(b, j, nb, nc) for (int64_t b = 0; b < (nb); ++b) for (int64_t j = 0; j < (nc); ++j)
#endif

// out[r, c] += bias[c] for the (rows, cols) row-major `out` (CUDA: a frame's pre-activations before its recurrent
// product, the order of the CPU's packed product with a bias).
DEF_KERNEL void lstm_add_bias(Float* __restrict__ out, const Float* __restrict__ bias, int64_t rows, int64_t cols) {
  LSTM_FOR_BJ(r, c, rows, cols) { out[r * cols + c] += bias[c]; }
}

// out[b, 0..n) (rows ld apart) = src[b, 0..n) (rows n apart); with a mask, 0 on the rows where it is 0 (so that a
// NaN on a padded frame reaches no weight gradient).
DEF_KERNEL void lstm_rows_to(const Float* __restrict__ src, const Float* __restrict__ mask, Float* __restrict__ out,
                             int64_t n_batch, int64_t n, int64_t ld) {
  LSTM_FOR_BJ(b, j, n_batch, n) { out[b * ld + j] = mask && mask[b] == Float(0) ? Float(0) : src[b * n + j]; }
}


// C (m x n) (+)= A (m x k) . B (k x n) with row-major pointers; op(A) / op(B) by the flags (an empty product
// leaves C as it is with beta = 1 and zeroes it with beta = 0, as affine_raw does).
static void lstm_gemm(const Float* A, bool tA, const Float* B, bool tB, Float* C, int64_t m, int64_t n, int64_t k,
                      double beta) {
  affine_raw(A, tA ? k : m, tA ? m : k, B, tB ? n : k, tB ? k : n, C, m, n, tA, tB, beta);
}



// The frames an LSTM op visits, in order.  NativeLstm2: step > 0 from `start` up to T-1; step < 0 from
// T-1-start down to 0.  LstmLowMem (lowmem_rule): step < 0 runs from T-1-start down to `start`.
struct LstmFrames {
  int64_t first, step, count;
  int64_t at(int64_t k) const { return first + k * step; }
};

static LstmFrames lstm_frames(int64_t T, int64_t start, int64_t step, bool lowmem_rule) {
  LstmFrames f = {0, step, 0};
  if (T == 0) return f;
  if (step == 0) ptn::raise(PTN_STATUS_VALUE, "step must not be 0");
  if (start < 0 || start >= T) {
    std::ostringstream s;
    s << "start = " << start << " is out of range [0, T = " << T << ")";
    ptn::raise(PTN_STATUS_VALUE, s.str());
  }
  int64_t last;
  if (step > 0) {
    f.first = start;
    last = T - 1;
  } else {
    f.first = T - 1 - start;
    last = lowmem_rule ? start : 0;
  }
  int64_t span = step > 0 ? last - f.first : f.first - last;
  int64_t abs_step = step > 0 ? step : -step;
  f.count = span < 0 ? 0 : span / abs_step + 1;
  return f;
}

// The CPU kernels' skipping of masked rows (host memory): 1 + the last row r < n of a frame with mask[r] != 0, 0 if
// none.  The rows after it are all masked, so a kernel computes no product for them (their outputs are fixed).
static inline int64_t lstm_rows_to_last_valid(const Float* mask, int64_t n) {
  while (n > 0 && mask[n - 1] == Float(0)) --n;
  return n;
}

// Per batch row, the number of visited frames where its mask is non-zero (the mask (T, n_batch) in host memory): the
// rows' work, by which the CPU's row parts are balanced (lstm_cpu_row_parts_by_work).
static std::vector<double> lstm_valid_frames(const Float* mask, const LstmFrames& fr, int64_t n_batch) {
  std::vector<double> work(n_batch, 0.0);
  for (int64_t k = 0; k < fr.count; ++k)
    for (int64_t r = 0; r < n_batch; ++r) work[r] += mask[fr.at(k) * n_batch + r] != Float(0);
  return work;
}

// visited[t] = 1 for the frames the call visits, 0 for the others.
static std::vector<char> lstm_visited(const LstmFrames& fr, int64_t T) {
  std::vector<char> visited(T, 0);
  for (int64_t k = 0; k < fr.count; ++k) visited[fr.at(k)] = 1;
  return visited;
}

// Zeroes the frames t of the (T, ...) array `a` that are not visited: the kernels write every element of their
// outputs (the glue does not zero them first).
static void lstm_zero_unvisited(const std::vector<char>& visited, Ndarray* a) {
  const size_t frame_bytes = (size_t)Ndarray_DIMS(a)[1] * Ndarray_DIMS(a)[2] * sizeof(Float);
  for (size_t t = 0; t < visited.size(); ++t)
    if (!visited[t] && frame_bytes) Ndarray_memset(data_ptr(a, (int64_t)t), 0, frame_bytes);
}

// A NativeLstm2 / LstmLowMem call: its sizes (from the mask i (T, B) and y0 (B, n)) and the frames it visits
// (from its int32 inputs start and step).
struct LstmCall {
  int64_t n_batch, n_cells, frame;  // frame = B * n, one frame of Y or C
  LstmFrames fr;
};

static LstmCall lstm_call(Ndarray* i, Ndarray* y0, Ndarray* start, Ndarray* step, bool lowmem_rule) {
  int64_t n_batch = Ndarray_DIMS(i)[1], n_cells = Ndarray_DIMS(y0)[1];
  return {n_batch, n_cells, n_batch * n_cells,
          lstm_frames(Ndarray_DIMS(i)[0], Ndarray_DEV_DATA_int32_scalar(start), Ndarray_DEV_DATA_int32_scalar(step),
                      lowmem_rule)};
}

// d = C at the last visited frame; c0 when no frame is visited.
static void lstm_final_state(Ndarray* d, Ndarray* C, Ndarray* c0, const LstmCall& c) {
  const Float* src = c.fr.count > 0 ? data_ptr(C, c.fr.at(c.fr.count - 1)) : Ndarray_DEV_DATA(c0);
  Ndarray_memcpy(Ndarray_DEV_DATA(d), src, c.frame * sizeof(Float));
}

// The backward inputs of NativeLstm2 and LstmLowMem: Y, C, DY, DC (T, B, n) and Dd (B, n), T and B from the mask i.
static void check_lstm_bw_shapes(Ndarray* i, int64_t n_cells, Ndarray* Y, Ndarray* C, Ndarray* DY, Ndarray* DC,
                                 Ndarray* Dd) {
  for (int k = 0; k < 3; ++k) {
    int64_t want = k < 2 ? Ndarray_DIMS(i)[k] : n_cells;
    assert_cmp(Ndarray_DIMS(Y)[k], ==, want);
    assert_cmp(Ndarray_DIMS(C)[k], ==, want);
    assert_cmp(Ndarray_DIMS(DY)[k], ==, want);
    assert_cmp(Ndarray_DIMS(DC)[k], ==, want);
  }
  assert_cmp(Ndarray_DIMS(Dd)[0], ==, Ndarray_DIMS(i)[1]);
  assert_cmp(Ndarray_DIMS(Dd)[1], ==, n_cells);
}

#endif  // PTNATIVE_LSTM_LSTM_COMMON_H
