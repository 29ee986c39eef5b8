// LSTM kernels.  Gate layout along the 4n axis: [cell input | input gate |
// forget gate | output gate], each n wide.  The mask `i` is 1 on valid frames
// and 0 on padding; a masked frame outputs 0 and carries the cell state.

// ================================================================ shared helpers (every LSTM op)
//
// Activations.  CUDA and float64 use the libm functions; the float32 CPU build uses branch-free versions
// (exp by range reduction + polynomial, about 1 ulp) that gcc vectorises, since a call to expf/tanhf per
// element would cost as much as the GEMMs.
#if CUDA
DEV_FUNC inline float lstm_exp(float x) { return expf(x); }
DEV_FUNC inline float lstm_tanh(float x) { return tanhf(x); }
#else
__attribute__((always_inline)) static inline float lstm_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // round to nearest by the 1.5 * 2^23 trick (std::floor does not vectorise without -ffast-math)
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

// out[b, :] = X[b, :] where mask[b] != 0, else 0 (a frame's input rows for a weight gradient, without padding).
DEF_KERNEL void lstm_valid_rows(const Float* __restrict__ X, const Float* __restrict__ mask, Float* __restrict__ out,
                                int64_t n_batch, int64_t n_cols) {
  LSTM_FOR_BJ(b, j, n_batch, n_cols) { out[b * n_cols + j] = mask[b] == Float(0) ? Float(0) : X[b * n_cols + j]; }
}

// C (m x n) (+)= A (m x k) . B (k x n) with row-major pointers; op(A) / op(B) by the flags (an empty product
// leaves C as it is with beta = 1 and zeroes it with beta = 0, as affine_raw does).
static void lstm_gemm(const Float* A, bool tA, const Float* B, bool tB, Float* C, int64_t m, int64_t n, int64_t k,
                      double beta) {
  affine_raw(A, tA ? k : m, tA ? m : k, B, tB ? n : k, tB ? k : n, C, m, n, tA, tB, beta);
}

#if !CUDA
// ---------------------------------------------------------------- CPU recurrent GEMM
// The per-frame products y_prev . W (B x n x 4n) are too small for BLAS to thread well, and BLAS packs W again
// on every call.  On the CPU we pack W once per op call into column panels and multiply with a register-tiled
// kernel (gcc vector extensions, contracted to FMA), and split the batch rows over threads: rows are
// independent through the whole recurrence, so the threads never wait for each other.
#ifdef __AVX512F__
typedef Float lstm_vec __attribute__((vector_size(64)));  // the width of the CPU's FMA units (and of its BLAS)
#else
typedef Float lstm_vec __attribute__((vector_size(32)));
#endif
constexpr int LSTM_VL = (int)(sizeof(lstm_vec) / sizeof(Float));  // lanes per vector
constexpr int LSTM_NR = 2 * LSTM_VL;                              // columns per panel
#ifdef __AVX512F__
constexpr int LSTM_MR = 8;  // rows per register tile: 16 accumulators of the 32 vector registers
#else
constexpr int LSTM_MR = 6;  // rows per register tile: 12 accumulators of the 16 vector registers
#endif

struct LstmPacked {
  std::vector<Float> data;  // ceil(n / NR) panels, each k rows of NR columns (zero-padded)
  int64_t k = 0, n = 0;
};

// op(B) is (k x n): B itself (row-major k x n) or, with `trans`, the transpose of row-major B (n x k).
static LstmPacked lstm_pack(const Float* B, bool trans, int64_t k, int64_t n) {
  LstmPacked P;
  P.k = k;
  P.n = n;
  int64_t panels = (n + LSTM_NR - 1) / LSTM_NR;
  P.data.assign(panels * k * LSTM_NR, Float(0));
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t kk = 0; kk < k; ++kk) {
      Float* out = P.data.data() + (p * k + kk) * LSTM_NR;
      for (int64_t c = 0; c < LSTM_NR && p * LSTM_NR + c < n; ++c) {
        int64_t col = p * LSTM_NR + c;
        out[c] = trans ? B[col * k + kk] : B[kk * n + col];
      }
    }
  return P;
}

static inline lstm_vec lstm_load(const Float* p) {
  lstm_vec v;
  memcpy(&v, p, sizeof v);
  return v;
}

// C[r][0..nc) += A[r][0..k) . panel for the MR rows r (A rows at stride lda, C rows at stride ldc).
template <int MR>
static inline void lstm_tile(int64_t k, const Float* A, int64_t lda, const Float* __restrict__ panel, Float* C,
                             int64_t ldc, int64_t nc) {
  lstm_vec acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = lstm_vec{};
  for (int64_t kk = 0; kk < k; ++kk) {
    lstm_vec b0 = lstm_load(panel + kk * LSTM_NR), b1 = lstm_load(panel + kk * LSTM_NR + LSTM_VL);
    for (int r = 0; r < MR; ++r) {
      Float s = A[r * lda + kk];
      acc[r][0] += s * b0;
      acc[r][1] += s * b1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (nc == LSTM_NR) {  // a whole panel: two vector adds
      for (int h = 0; h < 2; ++h) {
        lstm_vec c = lstm_load(C + r * ldc + h * LSTM_VL) + acc[r][h];
        memcpy(C + r * ldc + h * LSTM_VL, &c, sizeof c);
      }
      continue;
    }
    Float out[LSTM_NR];
    memcpy(out, acc[r], sizeof out);
    for (int64_t c = 0; c < nc; ++c) C[r * ldc + c] += out[c];
  }
}

// C (m x P.n, row stride ldc) += A (m x P.k, row stride lda) . op(B), op(B) packed by lstm_pack, in tiles of
// near-equal row counts up to LSTM_MR (16 rows: 8 8 with AVX-512, 5 5 6 without); each panel of op(B) serves
// all of them in turn.
static void lstm_packed_gemm(const Float* A, int64_t lda, const LstmPacked& P, Float* C, int64_t ldc, int64_t m) {
  typedef void (*tile_fn)(int64_t, const Float*, int64_t, const Float*, Float*, int64_t, int64_t);
  static const tile_fn tiles[] = {0, lstm_tile<1>, lstm_tile<2>, lstm_tile<3>, lstm_tile<4>, lstm_tile<5>,
                                  lstm_tile<6>, lstm_tile<7>, lstm_tile<8>};
  static_assert(LSTM_MR <= 8, "the tile table lists one entry per row count");
  int64_t panels = (P.n + LSTM_NR - 1) / LSTM_NR, n_tiles = (m + LSTM_MR - 1) / LSTM_MR;
  for (int64_t p = 0; p < panels; ++p) {
    const Float* panel = P.data.data() + p * P.k * LSTM_NR;
    int64_t nc = std::min<int64_t>(LSTM_NR, P.n - p * LSTM_NR);
    for (int64_t t = 0; t < n_tiles; ++t) {
      int64_t r0 = t * m / n_tiles, r1 = (t + 1) * m / n_tiles;
      tiles[r1 - r0](P.k, A + r0 * lda, lda, panel, C + r0 * ldc + p * LSTM_NR, ldc, nc);
    }
  }
}

// Runs body(r0, r1) over row blocks [r0, r1) covering [0, n_batch), one block per thread, on several threads
// when the work (n_frames products of n_batch x n_cells x 4 n_cells) pays for starting them.  One block per
// thread, of near-equal sizes, rather than tiles handed out one by one: each thread then streams the packed
// weights through its caches once per frame for all its rows (measured 3-5 % faster on 2 cores).
template <typename F>
static void lstm_cpu_rows(int64_t n_batch, int64_t n_cells, int64_t n_frames, F&& body) {
  int64_t blocks = (n_batch + 5) / 6;  // at most one part per 6 rows
  double fma = (double)n_frames * n_batch * n_cells * 4 * n_cells;
  int parts = fma < 4e6 ? 1 : (int)std::max<int64_t>(1, std::min<int64_t>(ptn::cpu_threads(), blocks));
  ptn::parallel_parts(parts, [&](int p) { body(p * n_batch / parts, (p + 1) * n_batch / parts); });
}
#endif

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

// ---------------------------------------------------------------- LstmGenericBase
// One time frame.  h: (B, 4n) pre-activations (Z + recurrent part), overwritten
// with [state, in gate, forget gate, out gate].  prev_state: the previous
// state, row b at prev_state[b * prev_stride] (the previous frame's h, stride
// 4n, or the initial c, stride n).
// (The frames read and written never overlap, hence __restrict__: it lets g++ vectorise the cell loop.)
DEF_KERNEL void lstm_generic_fw_frame(Float* __restrict__ h, const Float* __restrict__ prev_state, int64_t prev_stride,
                                      Float* __restrict__ y, Float* __restrict__ final_c, int64_t n_cells,
                                      int64_t n_batch, const Float* __restrict__ mask) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    Float* g = h + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    Float s_prev = prev_state[b * prev_stride + j];
    Float cell_in = lstm_tanh(g[0]);
    Float in_gate = lstm_sigmoid(g[n_cells]);
    Float forget_gate = lstm_sigmoid(g[2 * n_cells]);
    Float out_gate = lstm_sigmoid(g[3 * n_cells]);
    Float s = lstm_blend(m, in_gate * cell_in + forget_gate * s_prev, s_prev);
    y[idx] = lstm_masked(m, out_gate * lstm_tanh(s));
    g[0] = s;
    g[n_cells] = in_gate;
    g[2 * n_cells] = forget_gate;
    g[3 * n_cells] = out_gate;
  }
  if (final_c) {
    LSTM_FOR_BJ(b, j, n_batch, n_cells) { final_c[b * n_cells + j] = h[b * 4 * n_cells + j]; }
  }
}

// Backward through one frame.  delta: (B, 4n) holding [state, gates] of this
// frame, overwritten with the gradient w.r.t. the pre-activations.  eps: dL/dy
// of this frame (direct + recurrent), overwritten with dL/d(previous state).
// next_eps: dL/d(this frame's state) coming from the frame after it.
DEF_KERNEL void lstm_generic_bw_frame(Float* __restrict__ delta, Float* __restrict__ eps,
                                      const Float* __restrict__ next_eps, const Float* __restrict__ prev_state,
                                      int64_t prev_stride, int64_t n_cells, int64_t n_batch,
                                      const Float* __restrict__ mask) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    Float* d = delta + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    Float s_prev = prev_state[b * prev_stride + j];
    Float s = d[0], in_gate = d[n_cells], forget_gate = d[2 * n_cells], out_gate = d[3 * n_cells];
    Float tanh_s = lstm_tanh(s);
    // tanh(cell input), recovered from the state; only used on valid frames.
    Float cell_in = (s - forget_gate * s_prev) / std::max(in_gate, Float(1e-16));
    Float e = eps[idx];
    Float eps_s = lstm_masked(m, (Float(1) - tanh_s * tanh_s) * out_gate * e) + next_eps[idx];
    d[0] = lstm_masked(m, in_gate * (Float(1) - cell_in * cell_in) * eps_s);
    d[n_cells] = lstm_masked(m, in_gate * (Float(1) - in_gate) * cell_in * eps_s);
    d[2 * n_cells] = lstm_masked(m, forget_gate * (Float(1) - forget_gate) * s_prev * eps_s);
    d[3 * n_cells] = lstm_masked(m, out_gate * (Float(1) - out_gate) * tanh_s * e);
    eps[idx] = lstm_carry_grad(m, eps_s, forget_gate);
  }
}

static void check_lstm_generic_shapes(Ndarray* Z_or_H, Ndarray* V_h, Ndarray* c, Ndarray* i) {
  int64_t n_cells = Ndarray_DIMS(V_h)[0];
  ptn::require_dim(V_h, "V_h", 1, 4 * n_cells, "4 * n (n = V_h.shape[0])");
  ptn::require_dim(Z_or_H, "Z", 2, 4 * n_cells, "4 * n (n = V_h.shape[0])");
  ptn::require_dim(Z_or_H, "Z", 0, Ndarray_DIMS(i)[0], "T (i.shape[0])");
  ptn::require_dim(Z_or_H, "Z", 1, Ndarray_DIMS(i)[1], "B (i.shape[1])");
  ptn::require_dim(c, "c", 0, Ndarray_DIMS(i)[1], "B (i.shape[1])");
  ptn::require_dim(c, "c", 1, n_cells, "n (V_h.shape[0])");
}

// inputs: Z (T,B,4n) [H is Z's buffer], V_h (n,4n), c (B,n), i (T,B); outputs: Y, H, d.
static void lstm_generic_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 4);
  assert_cmp(n_outputs, ==, 3);
  Ndarray *V_h = inputs[1], *c = inputs[2], *i = inputs[3];
  Ndarray *Y = *outputs[0], *H = *outputs[1], *d = *outputs[2];
  check_lstm_generic_shapes(H, V_h, c, i);
  int64_t T = Ndarray_DIMS(i)[0], n_batch = Ndarray_DIMS(i)[1], n_cells = Ndarray_DIMS(H)[2] / 4;
  if (T == 0) {
    Ndarray_memcpy(Ndarray_DEV_DATA(d), Ndarray_DEV_DATA(c), n_batch * n_cells * sizeof(Float));
    return;
  }
#if CUDA
  for (int64_t x = 0; x < T; ++x) {
    if (x > 0) affine_y_x(x - 1, Y, 0, V_h, x, H);  // H[x] += Y[x-1] . V_h
    start_dev_kernel(lstm_generic_fw_frame,
                     (data_ptr(H, x), x > 0 ? data_ptr(H, x - 1) : Ndarray_DEV_DATA(c), x > 0 ? 4 * n_cells : n_cells,
                      data_ptr(Y, x),
                      x == T - 1 ? Ndarray_DEV_DATA(d) : (Float*)0, n_cells, n_batch,
                      Ndarray_DEV_DATA(i) + x * n_batch));
  }
#else
  LstmPacked packed_V = lstm_pack(Ndarray_DEV_DATA(V_h), false, n_cells, 4 * n_cells);
  lstm_cpu_rows(n_batch, n_cells, T - 1, [&](int64_t r0, int64_t r1) {
    for (int64_t x = 0; x < T; ++x) {
      Float* h = data_ptr(H, x) + r0 * 4 * n_cells;
      if (x > 0) lstm_packed_gemm(data_ptr(Y, x - 1) + r0 * n_cells, n_cells, packed_V, h, 4 * n_cells, r1 - r0);
      lstm_generic_fw_frame(h, x > 0 ? data_ptr(H, x - 1) + r0 * 4 * n_cells : Ndarray_DEV_DATA(c) + r0 * n_cells,
                            x > 0 ? 4 * n_cells : n_cells, data_ptr(Y, x) + r0 * n_cells,
                            x == T - 1 ? Ndarray_DEV_DATA(d) + r0 * n_cells : (Float*)0, n_cells, r1 - r0,
                            Ndarray_DEV_DATA(i) + x * n_batch + r0);
    }
  });
#endif
  HANDLE_LAST_ERROR();
}

// inputs: V_h, c, i, Y, H [DZ is H's buffer], DY [tmpDc is DY's buffer], Dd;
// outputs: DZ (T,B,4n), DV_h (n,4n), Dc (B,n), tmpDc (T,B,n).
static void lstm_generic_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 4);
  Ndarray *V_h = inputs[0], *c = inputs[1], *i = inputs[2], *Y = inputs[3], *Dd = inputs[6];
  Ndarray *DZ = *outputs[0], *DV_h = *outputs[1], *Dc = *outputs[2], *tmpDc = *outputs[3];
  check_lstm_generic_shapes(DZ, V_h, c, i);
  int64_t T = Ndarray_DIMS(i)[0], n_batch = Ndarray_DIMS(i)[1], n_cells = Ndarray_DIMS(DZ)[2] / 4;
  for (int d = 0; d < 3; ++d) {
    assert_cmp(Ndarray_DIMS(Y)[d], ==, Ndarray_DIMS(tmpDc)[d]);
    assert_cmp(Ndarray_DIMS(tmpDc)[d], ==, (d < 2 ? Ndarray_DIMS(DZ)[d] : n_cells));
  }
  assert_cmp(Ndarray_DIMS(Dd)[0], ==, n_batch);
  assert_cmp(Ndarray_DIMS(Dd)[1], ==, n_cells);
  if (T == 0) {
    Ndarray_memcpy(Ndarray_DEV_DATA(Dc), Ndarray_DEV_DATA(Dd), n_batch * n_cells * sizeof(Float));
    return;
  }
#if CUDA
  for (int64_t x = T - 1; x >= 0; --x) {
    if (x < T - 1) affine_y_x(x + 1, DZ, 0, V_h, x, tmpDc, false, true);  // dY[x] += DZ[x+1] . V_h^T
    start_dev_kernel(lstm_generic_bw_frame,
                     (data_ptr(DZ, x), data_ptr(tmpDc, x), x == T - 1 ? Ndarray_DEV_DATA(Dd) : data_ptr(tmpDc, x + 1),
                      x > 0 ? data_ptr(DZ, x - 1) : Ndarray_DEV_DATA(c), x > 0 ? 4 * n_cells : n_cells, n_cells,
                      n_batch,
                      Ndarray_DEV_DATA(i) + x * n_batch));
  }
#else
  LstmPacked packed_VT = lstm_pack(Ndarray_DEV_DATA(V_h), true, 4 * n_cells, n_cells);
  lstm_cpu_rows(n_batch, n_cells, T - 1, [&](int64_t r0, int64_t r1) {
    int64_t at = r0 * n_cells, at4 = r0 * 4 * n_cells;
    for (int64_t x = T - 1; x >= 0; --x) {
      if (x < T - 1)  // dY[x] += DZ[x+1] . V_h^T
        lstm_packed_gemm(data_ptr(DZ, x + 1) + at4, 4 * n_cells, packed_VT, data_ptr(tmpDc, x) + at, n_cells, r1 - r0);
      lstm_generic_bw_frame(data_ptr(DZ, x) + at4, data_ptr(tmpDc, x) + at,
                            (x == T - 1 ? Ndarray_DEV_DATA(Dd) : data_ptr(tmpDc, x + 1)) + at,
                            x > 0 ? data_ptr(DZ, x - 1) + at4 : Ndarray_DEV_DATA(c) + at, x > 0 ? 4 * n_cells : n_cells,
                            n_cells, r1 - r0, Ndarray_DEV_DATA(i) + x * n_batch + r0);
    }
  });
#endif
  affine_global(Y, DZ, DV_h, true, false, 1, 0.0);  // DV_h = Y[0..T-2]^T . DZ[1..T-1]
  Ndarray_memcpy(Ndarray_DEV_DATA(Dc), data_ptr(tmpDc, 0), n_batch * n_cells * sizeof(Float));
  HANDLE_LAST_ERROR();
}

// ================================================================ NativeLstm2
// H row (B, 4n) holds X[t] + y_prev . W on entry and the activated gates [tanh(cell-in), in, forget, out]
// on exit; y_carry is y_prev on entry and the carried output (y, or y_prev on masked frames) on exit.
DEF_KERNEL void lstm2_fw_frame(Float* __restrict__ h, const Float* __restrict__ mask, Float* __restrict__ y_carry,
                               const Float* __restrict__ c_prev, Float* __restrict__ y, Float* __restrict__ c,
                               int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    Float* g = h + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    Float a = lstm_tanh(g[0]);
    Float ig = lstm_sigmoid(g[n_cells]);
    Float fg = lstm_sigmoid(g[2 * n_cells]);
    Float og = lstm_sigmoid(g[3 * n_cells]);
    g[0] = a;
    g[n_cells] = ig;
    g[2 * n_cells] = fg;
    g[3 * n_cells] = og;
    Float cp = c_prev[idx];
    Float cv = lstm_blend(m, cp * fg + a * ig, cp);
    Float yv = lstm_masked(m, lstm_tanh(cv) * og);
    c[idx] = cv;
    y[idx] = yv;
    y_carry[idx] = yv + y_carry[idx] * (Float(1) - m);
  }
}

// yp_next = y + yp * (1 - m): the recurrent input of the next visited frame.
DEF_KERNEL void lstm2_carry(const Float* y, const Float* yp, Float* yp_next, const Float* mask, int64_t n_batch,
                            int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    int64_t idx = b * n_cells + j;
    yp_next[idx] = y[idx] + yp[idx] * (Float(1) - mask[b]);
  }
}

// Backward through one visited frame.  dy_carry: dL/d(carried output of this frame) without DY[t]; on
// exit the part that reaches y_prev through the carry.  dc: dL/dC[t] on entry, dL/dc_prev on exit.
// gd (B, 4n): the frame's activated gates (H[t]) on entry, dL/dX[t] on exit.
DEF_KERNEL void lstm2_bw_frame(Float* __restrict__ gd, const Float* __restrict__ mask, const Float* __restrict__ c,
                               const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                               const Float* __restrict__ dC, Float* __restrict__ dy_carry, Float* __restrict__ dc,
                               int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    Float* d = gd + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    Float a = d[0], ig = d[n_cells], fg = d[2 * n_cells], og = d[3 * n_cells];
    Float tc = lstm_tanh(c[idx]);
    Float dy = dY[idx] + dy_carry[idx];
    Float dct = dc[idx] + dC[idx] + lstm_masked(m, dy * og * (Float(1) - tc * tc));
    d[0] = lstm_masked(m, dct * ig * (Float(1) - a * a));
    d[n_cells] = lstm_masked(m, dct * a * ig * (Float(1) - ig));
    d[2 * n_cells] = lstm_masked(m, dct * c_prev[idx] * fg * (Float(1) - fg));
    d[3 * n_cells] = lstm_masked(m, dy * tc * og * (Float(1) - og));
    dc[idx] = lstm_carry_grad(m, dct, fg);
    dy_carry[idx] *= Float(1) - m;
  }
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

// H: the gates buffer (X's buffer and shape).
static void check_lstm2_shapes(Ndarray* H, Ndarray* W, Ndarray* y0, Ndarray* c0, Ndarray* i) {
  int64_t T = Ndarray_DIMS(i)[0], n_batch = Ndarray_DIMS(i)[1], n_cells = Ndarray_DIMS(y0)[1];
  ptn::require_dim(H, "X", 0, T, "T (i.shape[0])");
  ptn::require_dim(H, "X", 1, n_batch, "B (i.shape[1])");
  ptn::require_dim(H, "X", 2, 4 * n_cells, "4 * n (n = y0.shape[1])");
  ptn::require_dim(W, "W", 0, n_cells, "n (y0.shape[1])");
  ptn::require_dim(W, "W", 1, 4 * n_cells, "4 * n (n = y0.shape[1])");
  ptn::require_dim(y0, "y0", 0, n_batch, "B (i.shape[1])");
  ptn::require_dim(c0, "c0", 0, n_batch, "B (i.shape[1])");
  ptn::require_dim(c0, "c0", 1, n_cells, "n (y0.shape[1])");
}

// inputs: X (T,B,4n) [H is X's buffer], W (n,4n), y0, c0 (B,n), i (T,B), start, step;
// outputs: Y, C (T,B,n), H (T,B,4n), d (B,n).
static void native_lstm2_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 4);
  Ndarray *W = inputs[1], *y0 = inputs[2], *c0 = inputs[3], *i = inputs[4];
  Ndarray *Y = *outputs[0], *C = *outputs[1], *H = *outputs[2], *d = *outputs[3];
  check_lstm2_shapes(H, W, y0, c0, i);
  const LstmCall call = lstm_call(i, y0, inputs[5], inputs[6], false);
  const LstmFrames& fr = call.fr;
  const int64_t n_batch = call.n_batch, n_cells = call.n_cells, frame = call.frame, step = fr.step;
  if (fr.count == 0) return lstm_final_state(d, C, c0, call);
  ptn::Scratch scratch;
  Float* y_carry = scratch.get<Float>(frame);
  Ndarray_memcpy(y_carry, Ndarray_DEV_DATA(y0), frame * sizeof(Float));
#if CUDA
  for (int64_t k = 0; k < fr.count; ++k) {
    int64_t t = fr.at(k);
    lstm_gemm(y_carry, false, Ndarray_DEV_DATA(W), false, data_ptr(H, t), n_batch, 4 * n_cells, n_cells, 1.0);
    start_dev_kernel(lstm2_fw_frame, (data_ptr(H, t), Ndarray_DEV_DATA(i) + t * n_batch, y_carry,
                                      k > 0 ? data_ptr(C, t - step) : Ndarray_DEV_DATA(c0), data_ptr(Y, t),
                                      data_ptr(C, t), n_batch, n_cells));
  }
#else
  LstmPacked packed_W = lstm_pack(Ndarray_DEV_DATA(W), false, n_cells, 4 * n_cells);
  lstm_cpu_rows(n_batch, n_cells, fr.count, [&](int64_t r0, int64_t r1) {
    for (int64_t k = 0; k < fr.count; ++k) {
      int64_t t = fr.at(k);
      Float* h = data_ptr(H, t) + r0 * 4 * n_cells;
      lstm_packed_gemm(y_carry + r0 * n_cells, n_cells, packed_W, h, 4 * n_cells, r1 - r0);
      lstm2_fw_frame(h, Ndarray_DEV_DATA(i) + t * n_batch + r0, y_carry + r0 * n_cells,
                     (k > 0 ? data_ptr(C, t - step) : Ndarray_DEV_DATA(c0)) + r0 * n_cells,
                     data_ptr(Y, t) + r0 * n_cells, data_ptr(C, t) + r0 * n_cells, r1 - r0, n_cells);
    }
  });
#endif
  HANDLE_LAST_ERROR();
  lstm_final_state(d, C, c0, call);
}

// inputs: W, y0, c0, i, start, step, Y, C, H, DY, DC, Dd; outputs: DX [H's buffer], DW, Dy0, Dc0.
static void native_lstm2_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 12);
  assert_cmp(n_outputs, ==, 4);
  Ndarray *W = inputs[0], *y0 = inputs[1], *c0 = inputs[2], *i = inputs[3];
  Ndarray *Y = inputs[6], *C = inputs[7], *H = inputs[8], *DY = inputs[9], *DC = inputs[10], *Dd = inputs[11];
  Ndarray *DX = *outputs[0], *DW = *outputs[1], *Dy0 = *outputs[2], *Dc0 = *outputs[3];
  check_lstm2_shapes(H, W, y0, c0, i);
  const LstmCall call = lstm_call(i, y0, inputs[4], inputs[5], false);
  const LstmFrames& fr = call.fr;
  const int64_t T = Ndarray_DIMS(i)[0], n_batch = call.n_batch, n_cells = call.n_cells, frame = call.frame;
  const int64_t step = fr.step;
  check_lstm_bw_shapes(i, n_cells, Y, C, DY, DC, Dd);
  Ndarray_memcpy(Ndarray_DEV_DATA(Dc0), Ndarray_DEV_DATA(Dd), frame * sizeof(Float));
  // DX starts as a copy of H (or is H): every visited frame is overwritten below, the others are zeroed.
  // DW and Dy0 (the running dL/dy_prev) start zeroed by the glue.
  std::vector<char> visited(T, 0);
  for (int64_t k = 0; k < fr.count; ++k) visited[fr.at(k)] = 1;
  for (int64_t t = 0; t < T; ++t)
    if (!visited[t]) Ndarray_memset(data_ptr(DX, t), 0, 4 * frame * sizeof(Float));
  if (fr.count == 0) return;
  // Yp[t]: the recurrent input of visited frame t (y0, then the carried output), 0 elsewhere, so that
  // DW = Yp^T . DX is one GEMM over all frames (DX is 0 on frames that are not visited).
  ptn::Scratch scratch;
  Float* Yp = scratch.get<Float>(T * frame);
  for (int64_t t = 0; t < T; ++t)
    if (!visited[t]) Ndarray_memset(Yp + t * frame, 0, frame * sizeof(Float));
  Ndarray_memcpy(Yp + fr.at(0) * frame, Ndarray_DEV_DATA(y0), frame * sizeof(Float));
#if CUDA
  for (int64_t k = 1; k < fr.count; ++k) {
    int64_t t = fr.at(k), tp = fr.at(k - 1);
    start_dev_kernel(lstm2_carry, (data_ptr(Y, tp), Yp + tp * frame, Yp + t * frame,
                                   Ndarray_DEV_DATA(i) + tp * n_batch, n_batch, n_cells));
  }
  for (int64_t k = fr.count - 1; k >= 0; --k) {
    int64_t t = fr.at(k);
    start_dev_kernel(lstm2_bw_frame, (data_ptr(DX, t), Ndarray_DEV_DATA(i) + t * n_batch, data_ptr(C, t),
                                      k > 0 ? data_ptr(C, t - step) : Ndarray_DEV_DATA(c0), data_ptr(DY, t),
                                      data_ptr(DC, t), Ndarray_DEV_DATA(Dy0), Ndarray_DEV_DATA(Dc0), n_batch,
                                      n_cells));
    // dL/dy_prev += DX[t] . W^T
    lstm_gemm(data_ptr(DX, t), false, Ndarray_DEV_DATA(W), true, Ndarray_DEV_DATA(Dy0), n_batch, n_cells,
              4 * n_cells, 1.0);
  }
#else
  LstmPacked packed_WT = lstm_pack(Ndarray_DEV_DATA(W), true, 4 * n_cells, n_cells);
  lstm_cpu_rows(n_batch, n_cells, fr.count, [&](int64_t r0, int64_t r1) {
    Float *dy_prev = Ndarray_DEV_DATA(Dy0) + r0 * n_cells, *dc = Ndarray_DEV_DATA(Dc0) + r0 * n_cells;
    for (int64_t k = 1, at = r0 * n_cells; k < fr.count; ++k) {
      int64_t t = fr.at(k), tp = fr.at(k - 1);
      lstm2_carry(data_ptr(Y, tp) + at, Yp + tp * frame + at, Yp + t * frame + at,
                  Ndarray_DEV_DATA(i) + tp * n_batch + r0, r1 - r0, n_cells);
    }
    for (int64_t k = fr.count - 1; k >= 0; --k) {
      int64_t t = fr.at(k), at = r0 * n_cells;
      Float* dx = data_ptr(DX, t) + r0 * 4 * n_cells;
      lstm2_bw_frame(dx, Ndarray_DEV_DATA(i) + t * n_batch + r0, data_ptr(C, t) + at,
                     (k > 0 ? data_ptr(C, t - step) : Ndarray_DEV_DATA(c0)) + at, data_ptr(DY, t) + at,
                     data_ptr(DC, t) + at, dy_prev, dc, r1 - r0, n_cells);
      lstm_packed_gemm(dx, 4 * n_cells, packed_WT, dy_prev, n_cells, r1 - r0);  // dL/dy_prev += DX[t] . W^T
    }
  });
#endif
  lstm_gemm(Yp, true, Ndarray_DEV_DATA(DX), false, Ndarray_DEV_DATA(DW), n_cells, 4 * n_cells, T * n_batch, 0.0);
  HANDLE_LAST_ERROR();
}

// ================================================================ LstmLowMem
// intern (B, 4n): X[t] . W_x + y_prev . W_h, without the bias.
DEF_KERNEL void lowmem_fw_frame(const Float* __restrict__ intern, const Float* __restrict__ bias,
                                const Float* __restrict__ mask, const Float* __restrict__ c_prev, Float* __restrict__ y,
                                Float* __restrict__ c, int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    const Float* g = intern + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    Float a = lstm_tanh(g[0] + bias[j]);
    Float ig = lstm_sigmoid(g[n_cells] + bias[n_cells + j]);
    Float fg = lstm_sigmoid(g[2 * n_cells] + bias[2 * n_cells + j]);
    Float og = lstm_sigmoid(g[3 * n_cells] + bias[3 * n_cells + j]);
    Float cp = c_prev[idx];
    Float cv = lstm_blend(m, cp * fg + a * ig, cp);
    c[idx] = cv;
    y[idx] = lstm_masked(m, lstm_tanh(cv) * og);
  }
}

// Backward through one frame.  dh: dL/dY[t] from the next frame's recurrence; dc: dL/dC[t] on entry,
// dL/dc_prev on exit.  dintern: dL/d(pre-activations); db accumulates its column sums.
DEF_KERNEL void lowmem_bw_frame(const Float* __restrict__ intern, const Float* __restrict__ bias,
                                const Float* __restrict__ mask, const Float* __restrict__ c,
                                const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                                const Float* __restrict__ dC, const Float* __restrict__ dh, Float* __restrict__ dc,
                                Float* __restrict__ dintern, Float* __restrict__ db, int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    const Float* g = intern + b * 4 * n_cells + j;
    Float* d = dintern + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    Float a = lstm_tanh(g[0] + bias[j]);
    Float ig = lstm_sigmoid(g[n_cells] + bias[n_cells + j]);
    Float fg = lstm_sigmoid(g[2 * n_cells] + bias[2 * n_cells + j]);
    Float og = lstm_sigmoid(g[3 * n_cells] + bias[3 * n_cells + j]);
    Float tc = lstm_tanh(c[idx]);
    Float dy = dY[idx] + dh[idx];
    Float dct = dc[idx] + dC[idx] + lstm_masked(m, dy * og * (Float(1) - tc * tc));
    Float d0 = lstm_masked(m, dct * ig * (Float(1) - a * a));
    Float d1 = lstm_masked(m, dct * a * ig * (Float(1) - ig));
    Float d2 = lstm_masked(m, dct * c_prev[idx] * fg * (Float(1) - fg));
    Float d3 = lstm_masked(m, dy * tc * og * (Float(1) - og));
    d[0] = d0;
    d[n_cells] = d1;
    d[2 * n_cells] = d2;
    d[3 * n_cells] = d3;
#if CUDA
    elem_atomic_add(&db[j], d0);
    elem_atomic_add(&db[n_cells + j], d1);
    elem_atomic_add(&db[2 * n_cells + j], d2);
    elem_atomic_add(&db[3 * n_cells + j], d3);
#endif
    dc[idx] = lstm_carry_grad(m, dct, fg);
  }
}

static void check_lowmem_shapes(Ndarray* X, Ndarray* W, Ndarray* b, Ndarray* y0, Ndarray* c0, Ndarray* i) {
  int64_t T = Ndarray_DIMS(i)[0], n_batch = Ndarray_DIMS(i)[1], n_cells = Ndarray_DIMS(y0)[1];
  int64_t n_in = Ndarray_DIMS(X)[2];
  ptn::require_dim(X, "X", 0, T, "T (i.shape[0])");
  ptn::require_dim(X, "X", 1, n_batch, "B (i.shape[1])");
  ptn::require_dim(W, "W", 0, n_in + n_cells, "n_in + n (X.shape[2] + y0.shape[1])");
  ptn::require_dim(W, "W", 1, 4 * n_cells, "4 * n (n = y0.shape[1])");
  ptn::require_dim(b, "b", 0, 4 * n_cells, "4 * n (n = y0.shape[1])");
  ptn::require_dim(y0, "y0", 0, n_batch, "B (i.shape[1])");
  ptn::require_dim(c0, "c0", 0, n_batch, "B (i.shape[1])");
  ptn::require_dim(c0, "c0", 1, n_cells, "n (y0.shape[1])");
}

#if CUDA
// intern = X[t] . W_x + y_prev . W_h  (W_x = W[:n_in], W_h = W[n_in:], both contiguous row blocks)
static void lowmem_intern(Ndarray* X, Ndarray* W, int64_t t, const Float* y_prev, Float* intern, int64_t n_batch,
                          int64_t n_in, int64_t n_cells) {
  const Float* Wd = Ndarray_DEV_DATA(W);
  lstm_gemm(data_ptr(X, t), false, Wd, false, intern, n_batch, 4 * n_cells, n_in, 0.0);
  lstm_gemm(y_prev, false, Wd + n_in * 4 * n_cells, false, intern, n_batch, 4 * n_cells, n_cells, 1.0);
}
#else
// On the CPU LstmLowMem works through the visited frames in chunks of about LOWMEM_CHUNK_ROWS batch rows: the
// input products of a chunk are one GEMM (backward: the recomputed gates two, the gradients three more), the
// recurrent products run frame by frame on the packed W_h with the batch rows split over threads, as in
// NativeLstm2.  The scratch memory is a few chunks, whatever T.  Forward and backward chunk the frames alike,
// so the backward pass recomputes exactly the forward's gates.
constexpr int64_t LOWMEM_CHUNK_ROWS = 512;

struct LowmemChunk {
  int64_t k0, k1, rows;  // visited frames k0 .. k1-1 (in visit order), (k1 - k0) * B rows
};

static int64_t lowmem_frames_per_chunk(const LstmCall& c) {
  return std::max<int64_t>(1, std::min<int64_t>(c.fr.count, LOWMEM_CHUNK_ROWS / std::max<int64_t>(c.n_batch, 1)));
}

static LowmemChunk lowmem_chunk(const LstmCall& c, int64_t k0) {
  int64_t k1 = std::min(k0 + lowmem_frames_per_chunk(c), c.fr.count);
  return {k0, k1, (k1 - k0) * c.n_batch};
}

// The chunk's inputs in visit order: Xc = its X frames with the masked rows zeroed (a NaN on padding reaches no
// product), Yp (optional) = the recurrent input of each frame (y0 at the first visited frame).
static void lowmem_gather(Ndarray* X, Ndarray* i, Ndarray* Y, Ndarray* y0, const LstmCall& c, const LowmemChunk& ch,
                          Float* Xc, Float* Yp) {
  int64_t n_in = Ndarray_DIMS(X)[2];
  for (int64_t k = ch.k0; k < ch.k1; ++k) {
    int64_t t = c.fr.at(k), row = (k - ch.k0) * c.n_batch;
    lstm_valid_rows(data_ptr(X, t), Ndarray_DEV_DATA(i) + t * c.n_batch, Xc + row * n_in, c.n_batch, n_in);
    if (Yp)
      Ndarray_memcpy(Yp + row * c.n_cells, k > 0 ? data_ptr(Y, t - c.fr.step) : Ndarray_DEV_DATA(y0),
                     c.frame * sizeof(Float));
  }
}
#endif

// inputs: X (T,B,n_in), W (n_in+n,4n), b (4n), y0, c0 (B,n), i (T,B), start, step; outputs: Y, C (T,B,n), d (B,n).
static void lstm_lowmem_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 8);
  assert_cmp(n_outputs, ==, 3);
  Ndarray *X = inputs[0], *W = inputs[1], *b = inputs[2], *y0 = inputs[3], *c0 = inputs[4], *i = inputs[5];
  Ndarray *Y = *outputs[0], *C = *outputs[1], *d = *outputs[2];
  check_lowmem_shapes(X, W, b, y0, c0, i);
  const LstmCall call = lstm_call(i, y0, inputs[6], inputs[7], true);
  const LstmFrames& fr = call.fr;
  const int64_t n_batch = call.n_batch, n_cells = call.n_cells, n_in = Ndarray_DIMS(X)[2], g = 4 * n_cells;
  const Float *bias = Ndarray_DEV_DATA(b), *mask = Ndarray_DEV_DATA(i), *Wd = Ndarray_DEV_DATA(W);
  ptn::Scratch scratch;
#if CUDA
  Float* intern = scratch.get<Float>(4 * call.frame);
  for (int64_t k = 0; k < fr.count; ++k) {
    int64_t t = fr.at(k);
    lowmem_intern(X, W, t, k > 0 ? data_ptr(Y, t - fr.step) : Ndarray_DEV_DATA(y0), intern, n_batch, n_in, n_cells);
    start_dev_kernel(lowmem_fw_frame, (intern, bias, mask + t * n_batch,
                                       k > 0 ? data_ptr(C, t - fr.step) : Ndarray_DEV_DATA(c0), data_ptr(Y, t),
                                       data_ptr(C, t), n_batch, n_cells));
  }
#else
  if (fr.count > 0) {
    int64_t chunk_rows = lowmem_frames_per_chunk(call) * n_batch;
    Float* Xc = scratch.get<Float>(chunk_rows * n_in);
    Float* intern = scratch.get<Float>(chunk_rows * g);
    LstmPacked packed_Wh = lstm_pack(Wd + n_in * g, false, n_cells, g);
    for (int64_t k0 = 0; k0 < fr.count; k0 += lowmem_frames_per_chunk(call)) {
      LowmemChunk ch = lowmem_chunk(call, k0);
      lowmem_gather(X, i, Y, y0, call, ch, Xc, nullptr);
      lstm_gemm(Xc, false, Wd, false, intern, ch.rows, g, n_in, 0.0);
      lstm_cpu_rows(n_batch, n_cells, ch.k1 - ch.k0, [&](int64_t r0, int64_t r1) {
        for (int64_t k = ch.k0; k < ch.k1; ++k) {
          int64_t t = fr.at(k), at = r0 * n_cells;
          Float* h = intern + ((k - ch.k0) * n_batch + r0) * g;
          lstm_packed_gemm((k > 0 ? data_ptr(Y, t - fr.step) : Ndarray_DEV_DATA(y0)) + at, n_cells, packed_Wh, h, g,
                           r1 - r0);
          lowmem_fw_frame(h, bias, mask + t * n_batch + r0,
                          (k > 0 ? data_ptr(C, t - fr.step) : Ndarray_DEV_DATA(c0)) + at, data_ptr(Y, t) + at,
                          data_ptr(C, t) + at, r1 - r0, n_cells);
        }
      });
    }
  }
#endif
  HANDLE_LAST_ERROR();
  lstm_final_state(d, C, c0, call);
}

// inputs: X, W, b, y0, c0, i, start, step, Y, C, DY, DC, Dd; outputs: DX, DW, Db, Dy0, Dc0.
static void lstm_lowmem_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 13);
  assert_cmp(n_outputs, ==, 5);
  Ndarray *X = inputs[0], *W = inputs[1], *b = inputs[2], *y0 = inputs[3], *c0 = inputs[4], *i = inputs[5];
  Ndarray *Y = inputs[8], *C = inputs[9], *DY = inputs[10], *DC = inputs[11], *Dd = inputs[12];
  Ndarray *DX = *outputs[0], *DW = *outputs[1], *Db = *outputs[2], *Dy0 = *outputs[3], *Dc0 = *outputs[4];
  check_lowmem_shapes(X, W, b, y0, c0, i);
  const LstmCall call = lstm_call(i, y0, inputs[6], inputs[7], true);
  const LstmFrames& fr = call.fr;
  const int64_t n_batch = call.n_batch, n_cells = call.n_cells, n_in = Ndarray_DIMS(X)[2], g = 4 * n_cells;
  check_lstm_bw_shapes(i, n_cells, Y, C, DY, DC, Dd);
  Ndarray_memcpy(Ndarray_DEV_DATA(Dc0), Ndarray_DEV_DATA(Dd), call.frame * sizeof(Float));
  if (fr.count == 0) return;  // DX, DW, Db, Dy0 stay 0
  const Float *bias = Ndarray_DEV_DATA(b), *mask = Ndarray_DEV_DATA(i), *Wd = Ndarray_DEV_DATA(W);
  Float *DWd = Ndarray_DEV_DATA(DW), *dbd = Ndarray_DEV_DATA(Db);
  Float* dh = Ndarray_DEV_DATA(Dy0);  // dL/dY[t] through the next frame's recurrence; dL/dy0 at the end
  Float* dc = Ndarray_DEV_DATA(Dc0);
  ptn::Scratch scratch;
#if CUDA
  Float* intern = scratch.get<Float>(4 * call.frame);
  Float* dintern = scratch.get<Float>(4 * call.frame);
  Float* x_valid = scratch.get<Float>(n_batch * n_in);  // X[t] without its padded rows (a NaN there stays there)
  for (int64_t k = fr.count - 1; k >= 0; --k) {
    int64_t t = fr.at(k);
    const Float* y_prev = k > 0 ? data_ptr(Y, t - fr.step) : Ndarray_DEV_DATA(y0);
    lowmem_intern(X, W, t, y_prev, intern, n_batch, n_in, n_cells);
    start_dev_kernel(lowmem_bw_frame, (intern, bias, mask + t * n_batch, data_ptr(C, t),
                                       k > 0 ? data_ptr(C, t - fr.step) : Ndarray_DEV_DATA(c0), data_ptr(DY, t),
                                       data_ptr(DC, t), dh, dc, dintern, dbd, n_batch, n_cells));
    start_dev_kernel(lstm_valid_rows, (data_ptr(X, t), mask + t * n_batch, x_valid, n_batch, n_in));
    lstm_gemm(dintern, false, Wd, true, data_ptr(DX, t), n_batch, n_in, g, 0.0);
    lstm_gemm(x_valid, true, dintern, false, DWd, n_in, g, n_batch, 1.0);
    lstm_gemm(y_prev, true, dintern, false, DWd + n_in * g, n_cells, g, n_batch, 1.0);
    lstm_gemm(dintern, false, Wd + n_in * g, true, dh, n_batch, n_cells, g, 0.0);
  }
#else
  int64_t chunk_rows = lowmem_frames_per_chunk(call) * n_batch;
  Float* Xc = scratch.get<Float>(chunk_rows * n_in);
  Float* Yp = scratch.get<Float>(chunk_rows * n_cells);
  Float* intern = scratch.get<Float>(chunk_rows * g);
  Float* dintern = scratch.get<Float>(chunk_rows * g);
  Float* DXc = scratch.get<Float>(chunk_rows * n_in);
  LstmPacked packed_Wh = lstm_pack(Wd + n_in * g, false, n_cells, g);
  LstmPacked packed_WhT = lstm_pack(Wd + n_in * g, true, g, n_cells);
  Ndarray_memset(dh, 0, call.frame * sizeof(Float));
  int64_t per_chunk = lowmem_frames_per_chunk(call);
  for (int64_t k0 = (fr.count - 1) / per_chunk * per_chunk; k0 >= 0; k0 -= per_chunk) {
    LowmemChunk ch = lowmem_chunk(call, k0);
    // the chunk's gates, exactly as in the forward pass: X part by BLAS, recurrent part on the packed W_h
    lowmem_gather(X, i, Y, y0, call, ch, Xc, Yp);
    lstm_gemm(Xc, false, Wd, false, intern, ch.rows, g, n_in, 0.0);
    lstm_cpu_rows(ch.rows, n_cells, 1, [&](int64_t r0, int64_t r1) {
      lstm_packed_gemm(Yp + r0 * n_cells, n_cells, packed_Wh, intern + r0 * g, g, r1 - r0);
    });
    lstm_cpu_rows(n_batch, n_cells, ch.k1 - ch.k0, [&](int64_t r0, int64_t r1) {
      int64_t at = r0 * n_cells;
      for (int64_t k = ch.k1 - 1; k >= ch.k0; --k) {
        int64_t t = fr.at(k), row = ((k - ch.k0) * n_batch + r0) * g;
        lowmem_bw_frame(intern + row, bias, mask + t * n_batch + r0, data_ptr(C, t) + at,
                        (k > 0 ? data_ptr(C, t - fr.step) : Ndarray_DEV_DATA(c0)) + at, data_ptr(DY, t) + at,
                        data_ptr(DC, t) + at, dh + at, dc + at, dintern + row, dbd, r1 - r0, n_cells);
        Ndarray_memset(dh + at, 0, (r1 - r0) * n_cells * sizeof(Float));  // dL/dY[t_prev] = dintern . W_h^T
        lstm_packed_gemm(dintern + row, g, packed_WhT, dh + at, n_cells, r1 - r0);
      }
    });
    // the chunk's gradients: DX, DW = [Xc; Yp]^T . dintern, db = the column sums of dintern
    lstm_gemm(dintern, false, Wd, true, DXc, ch.rows, n_in, g, 0.0);
    for (int64_t k = ch.k0; k < ch.k1; ++k)
      Ndarray_memcpy(data_ptr(DX, fr.at(k)), DXc + (k - ch.k0) * n_batch * n_in, n_batch * n_in * sizeof(Float));
    lstm_gemm(Xc, true, dintern, false, DWd, n_in, g, ch.rows, 1.0);
    lstm_gemm(Yp, true, dintern, false, DWd + n_in * g, n_cells, g, ch.rows, 1.0);
    for (int64_t r = 0; r < ch.rows; ++r)
      for (int64_t c = 0; c < g; ++c) dbd[c] += dintern[r * g + c];
  }
#endif
  HANDLE_LAST_ERROR();
}
