// TwoDLSTM: a 2-D LSTM over (target time y) x (source time x), on the CPU and on CUDA.
//
// Layout: X (h, w, B, n_in); H (h, w, B, 5n) holding per cell [in, forget, lambda, out, state]; Y (h, w, B, n).
// Cell (y, x):  a = b + X W + Y[y, x-1] V_h + Y[y-1, x] V_v   (gate blocks: in, forget, lambda, out, cell-in)
//   s = v * (i * tanh(a_z) + f * lambda * s_up + f * (1 - lambda) * s_left),   Y = v * o * tanh(s)
// with v = (y < sizes[b, 0] && x < sizes[b, 1]); s_up = initialState[0, x, :, 4n:] in row 0; s_left = 0 in
// column 0; no V_h term in column 0; in row 0 the V_v term uses initialOutput[0, x] when iteration >= 1
// (then h must be 1) and is absent otherwise.  The cells are computed by anti-diagonals y + x = d: a cell
// depends only on its left and upper neighbours, both on diagonal d - 1, so the recurrent products of a whole
// diagonal are two GEMMs (one per recurrent matrix) over its gathered neighbours.
#include "../dialect/kernel.h"

#include "lstm_common.h"
#include "lstm_packed.h"

DEV_FUNC inline Float twod_valid(const Float* sizes, int64_t b, int64_t y, int64_t x) {
  return (Float(y) < sizes[2 * b] && Float(x) < sizes[2 * b + 1]) ? Float(1) : Float(0);
}

// h_cell (B, 5n): the input part of the pre-activations (b + X W) in, [i, f, lambda, o, s] out; rec (B, 5n): their
// recurrent part.  s_up / s_left: states with row stride 5n (s_left may be null).
DEF_KERNEL void twod_fw_cell(Float* __restrict__ h_cell, const Float* __restrict__ rec, const Float* s_up,
                             const Float* s_left, Float* __restrict__ y_out, const Float* sizes, int64_t yy, int64_t xx,
                             int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    Float* g = h_cell + b * 5 * n_cells + j;
    const Float* r = rec + b * 5 * n_cells + j;
    int64_t so = b * 5 * n_cells + j;
    Float v = twod_valid(sizes, b, yy, xx);
    Float ig = lstm_sigmoid(g[0] + r[0]);
    Float fg = lstm_sigmoid(g[n_cells] + r[n_cells]);
    Float lg = lstm_sigmoid(g[2 * n_cells] + r[2 * n_cells]);
    Float og = lstm_sigmoid(g[3 * n_cells] + r[3 * n_cells]);
    Float z = lstm_tanh(g[4 * n_cells] + r[4 * n_cells]);
    Float sl = s_left ? s_left[so] : Float(0);
    Float s = lstm_masked(v, ig * z + fg * lg * s_up[so] + fg * (Float(1) - lg) * sl);
    g[0] = ig;
    g[n_cells] = fg;
    g[2 * n_cells] = lg;
    g[3 * n_cells] = og;
    g[4 * n_cells] = s;
    y_out[b * n_cells + j] = lstm_masked(v, og * lstm_tanh(s));
  }
}

// Backward through cell (y, x).  dL/dY of the cell: dy (direct) + rec (through both recurrences).  es_below /
// es_right: dL/ds from the cell below / to the right (null at the grid's edge); es_up / es_left: dL/ds passed to
// the cell above / to the left.  delta (B, 5n): out.
DEF_KERNEL void twod_bw_cell(const Float* h_cell, const Float* s_up, const Float* s_left, const Float* dy,
                             const Float* rec, const Float* es_below, const Float* es_right, Float* es_left,
                             Float* es_up, Float* delta, const Float* sizes, int64_t yy, int64_t xx, int64_t n_batch,
                             int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    const Float* g = h_cell + b * 5 * n_cells + j;
    Float* d = delta + b * 5 * n_cells + j;
    int64_t so = b * 5 * n_cells + j, idx = b * n_cells + j;
    // v is 0 or 1: everything below is the valid cell's value, or 0 outside the grid (selected, not multiplied,
    // so that a NaN in an outside cell's gates stays there)
    Float v = twod_valid(sizes, b, yy, xx);
    Float ig = g[0], fg = g[n_cells], lg = g[2 * n_cells], og = g[3 * n_cells], s = g[4 * n_cells];
    Float su = s_up[so], sl = s_left ? s_left[so] : Float(0);
    Float mix = lg * su + (Float(1) - lg) * sl;
    // tanh(cell input), recovered from the state
    Float z = (s - fg * mix) / std::max(ig, Float(1e-30));
    z = std::min(std::max(z, Float(-1)), Float(1));
    Float tc = lstm_tanh(s);
    Float ev = dy[idx] + rec[idx];
    Float es = lstm_masked(v, ev * og * (Float(1) - tc * tc) + (es_below ? es_below[idx] : Float(0)) +
                                  (es_right ? es_right[idx] : Float(0)));
    d[0] = lstm_masked(v, es * z * ig * (Float(1) - ig));
    d[n_cells] = lstm_masked(v, es * mix * fg * (Float(1) - fg));
    d[2 * n_cells] = lstm_masked(v, es * fg * (su - sl) * lg * (Float(1) - lg));
    d[3 * n_cells] = lstm_masked(v, ev * tc * og * (Float(1) - og));
    d[4 * n_cells] = lstm_masked(v, es * ig * (Float(1) - z * z));
    es_up[idx] = lstm_masked(v, es * fg * lg);
    es_left[idx] = lstm_masked(v, es * fg * (Float(1) - lg));
  }
}

// out = X with the rows of the cells outside their pair's grid zeroed (X row r is cell (y, x) = divmod(r / B, w),
// pair b = r % B): the inputs of the weight gradient, without the cells that do not exist.
DEF_KERNEL void twod_valid_inputs(const Float* X, const Float* sizes, Float* out, int64_t rows, int64_t n_in, int64_t w,
                                  int64_t n_batch) {
  LSTM_FOR_BJ(r, j, rows, n_in) {
    int64_t cell = r / n_batch;
    Float v = twod_valid(sizes, r % n_batch, cell / w, cell % w);
    out[r * n_in + j] = v == Float(0) ? Float(0) : X[r * n_in + j];
  }
}

// H[r, :] = b for every row r
DEF_KERNEL void twod_fill_bias(Float* H, const Float* bias, int64_t rows, int64_t cols) {
  LSTM_FOR_BJ(r, j, rows, cols) { H[r * cols + j] = bias[j]; }
}

// db[j] = sum over rows of delta[r, j]
DEF_KERNEL void twod_col_sums(const Float* delta, Float* db, int64_t rows, int64_t cols) {
#if CUDA
  for (int64_t j = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
    Float acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += delta[r * cols + j];
    db[j] = acc;
  }
#else
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) db[j] += delta[r * cols + j];
#endif
}

struct TwoDShapes {
  int64_t h, w, B, n_in, n;
  bool with_initial_output;
};

// The cells (y, x) of the anti-diagonal y + x = d: rows y0 .. y0 + count - 1.
struct TwoDDiagonal {
  int64_t y0, count;
};

static TwoDDiagonal twod_diagonal(const TwoDShapes& s, int64_t d) {
  int64_t y0 = std::max<int64_t>(0, d - (s.w - 1)), y1 = std::min<int64_t>(d, s.h - 1);
  return {y0, y1 - y0 + 1};
}

// The recurrent products of a diagonal, out (rows x cols) = a_h . op(V_h) + a_v . op(V_v), with op(V) = V forward
// ((n x 5n) each) and V^T backward.  On the CPU by the packed kernel of lstm.cu (BLAS would start its threads for
// each of these small products), its rows split over threads when that pays; on CUDA by cuBLAS.
struct TwoDProducts {
  const Float *V_h, *V_v;
  bool trans;
  int64_t k, cols;
#if !CUDA
  LstmPacked packed_h, packed_v;
#endif
};

static TwoDProducts twod_products(Ndarray* V_h, Ndarray* V_v, bool trans, int64_t n) {
  TwoDProducts p{Ndarray_DEV_DATA(V_h), Ndarray_DEV_DATA(V_v), trans, trans ? 5 * n : n, trans ? n : 5 * n};
#if !CUDA
  p.packed_h = lstm_pack(p.V_h, trans, p.k, p.cols);
  p.packed_v = lstm_pack(p.V_v, trans, p.k, p.cols);
#endif
  return p;
}

static void twod_recurrent(const TwoDProducts& p, const Float* a_h, const Float* a_v, Float* out, int64_t rows) {
#if CUDA
  lstm_gemm(a_h, false, p.V_h, p.trans, out, rows, p.cols, p.k, 0.0);
  lstm_gemm(a_v, false, p.V_v, p.trans, out, rows, p.cols, p.k, 1.0);
#else
  Ndarray_memset(out, 0, rows * p.cols * sizeof(Float));
  lstm_cpu_rows(rows, std::min(p.k, p.cols), 1, [&](int64_t r0, int64_t r1) {
    lstm_packed_gemm(a_h + r0 * p.k, p.k, p.packed_h, out + r0 * p.cols, p.cols, r1 - r0);
    lstm_packed_gemm(a_v + r0 * p.k, p.k, p.packed_v, out + r0 * p.cols, p.cols, r1 - r0);
  });
#endif
}

// dst[0 .. n) = src, or 0 without one.
static void twod_copy_or_zero(Float* dst, const Float* src, int64_t n) {
  if (src)
    Ndarray_memcpy(dst, src, n * sizeof(Float));
  else
    Ndarray_memset(dst, 0, n * sizeof(Float));
}

static Float twod_iteration(Ndarray* iteration) {
  if (Ndarray_SIZE(iteration) == 0) return 0;
  Float it = 0;
  Ndarray_copy_to_host(&it, Ndarray_DEV_DATA(iteration), sizeof(Float));
  return it;
}

static TwoDShapes check_twod_shapes(Ndarray** inputs) {
  Ndarray *X = inputs[0], *V_h = inputs[1], *V_v = inputs[2], *W = inputs[3], *b = inputs[4], *sizes = inputs[10];
  Ndarray *initialState = inputs[12], *initialOutput = inputs[13];
  const int64_t* xd = Ndarray_DIMS(X);
  TwoDShapes s = {xd[0], xd[1], xd[2], xd[3], Ndarray_DIMS(V_h)[0], false};
  const char* five_n = "5 * n (n = V_h.shape[0])";
  ptn::require_dim(V_h, "V_h", 1, 5 * s.n, five_n);
  ptn::require_dim(V_v, "V_v", 0, s.n, "n (V_h.shape[0])");
  ptn::require_dim(V_v, "V_v", 1, 5 * s.n, five_n);
  ptn::require_dim(W, "W", 0, s.n_in, "n_in (X.shape[3])");
  ptn::require_dim(W, "W", 1, 5 * s.n, five_n);
  ptn::require_dim(b, "b", 0, 5 * s.n, five_n);
  ptn::require_dim(sizes, "sizes", 0, s.B, "B (X.shape[2])");
  ptn::require_dim(sizes, "sizes", 1, 2, "(height, width)");
  if (Ndarray_DIMS(initialState)[0] < 1) ptn::raise(PTN_STATUS_VALUE, "initial_state.shape[0] must be >= 1");
  ptn::require_dim(initialState, "initial_state", 1, s.w, "w (X.shape[1])");
  ptn::require_dim(initialState, "initial_state", 2, s.B, "B (X.shape[2])");
  ptn::require_dim(initialState, "initial_state", 3, 5 * s.n, five_n);
  s.with_initial_output = twod_iteration(inputs[14]) >= Float(1);
  if (s.with_initial_output) {
    std::ostringstream m;
    m << "an initial_output (iteration >= 1) needs a single target row, X.shape[0] = " << s.h;
    if (s.h > 1) ptn::raise(PTN_STATUS_VALUE, m.str());
    if (Ndarray_DIMS(initialOutput)[0] < 1) ptn::raise(PTN_STATUS_VALUE, "initial_output.shape[0] must be >= 1");
    ptn::require_dim(initialOutput, "initial_output", 1, s.w, "w (X.shape[1])");
    ptn::require_dim(initialOutput, "initial_output", 2, s.B, "B (X.shape[2])");
    ptn::require_dim(initialOutput, "initial_output", 3, s.n, "n (V_h.shape[0])");
  }
  return s;
}

// inputs: X, V_h, V_v, W, b, ptr_storage_fwd, ptr_storage_bwd, valid, workmem, workmem2, sizes, DYDummy,
//   initialState, initialOutput, iteration (scratch inputs are unused); outputs: CompleteY (h,w,B,n), H (h,w,B,5n).
static void twod_lstm_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 15);
  assert_cmp(n_outputs, ==, 2);
  TwoDShapes s = check_twod_shapes(inputs);
  Ndarray *X = inputs[0], *V_h = inputs[1], *V_v = inputs[2], *W = inputs[3], *b = inputs[4];
  const Float* sizes = Ndarray_DEV_DATA(inputs[10]);
  Ndarray *initialState = inputs[12], *initialOutput = inputs[13];
  Ndarray *Y = *outputs[0], *H = *outputs[1];
  int64_t n5 = 5 * s.n, cell_h = s.B * n5, cell_y = s.B * s.n, rows = s.h * s.w * s.B;
  if (rows == 0 || s.n == 0) return;
  Float* Hd = Ndarray_DEV_DATA(H);
  Float* Yd = Ndarray_DEV_DATA(Y);
  start_dev_kernel(twod_fill_bias, (Hd, Ndarray_DEV_DATA(b), rows, n5));
  lstm_gemm(Ndarray_DEV_DATA(X), false, Ndarray_DEV_DATA(W), false, Hd, rows, n5, s.n_in, 1.0);
  ptn::Scratch scratch;
  int64_t most = std::min(s.h, s.w);
  Float* left = scratch.get<Float>(most * cell_y);  // the outputs of the diagonal's left neighbours (0: none)
  Float* up = scratch.get<Float>(most * cell_y);    // and of its upper neighbours
  Float* rec = scratch.get<Float>(most * cell_h);   // the recurrent part of the diagonal's pre-activations
  TwoDProducts products = twod_products(V_h, V_v, false, s.n);
  for (int64_t dg = 0; dg < s.h + s.w - 1; ++dg) {
    TwoDDiagonal D = twod_diagonal(s, dg);
    for (int64_t c = 0; c < D.count; ++c) {
      int64_t y = D.y0 + c, x = dg - y;
      const Float* above = y > 0 ? Yd + ((y - 1) * s.w + x) * cell_y
                                 : s.with_initial_output ? Ndarray_DEV_DATA(initialOutput) + x * cell_y : nullptr;
      twod_copy_or_zero(left + c * cell_y, x > 0 ? Yd + (y * s.w + x - 1) * cell_y : nullptr, cell_y);
      twod_copy_or_zero(up + c * cell_y, above, cell_y);
    }
    twod_recurrent(products, left, up, rec, D.count * s.B);
    for (int64_t c = 0; c < D.count; ++c) {
      int64_t y = D.y0 + c, x = dg - y;
      Float* Hc = Hd + (y * s.w + x) * cell_h;
      const Float* s_up = (y > 0 ? Hc - s.w * cell_h : Ndarray_DEV_DATA(initialState) + x * cell_h) + 4 * s.n;
      const Float* s_left = x > 0 ? Hc - cell_h + 4 * s.n : (const Float*)0;
      start_dev_kernel(twod_fw_cell, (Hc, rec + c * cell_h, s_up, s_left, Yd + (y * s.w + x) * cell_y, sizes, y, x,
                                      s.B, s.n));
    }
  }
  HANDLE_LAST_ERROR();
}

// inputs: the 15 forward inputs, CompleteY, H, DCompleteY, DH (ignored); outputs: DX, DV_h, DV_v, DW, Db.
static void twod_lstm_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 19);
  assert_cmp(n_outputs, ==, 5);
  TwoDShapes s = check_twod_shapes(inputs);
  Ndarray *X = inputs[0], *V_h = inputs[1], *V_v = inputs[2], *W = inputs[3];
  const Float* sizes = Ndarray_DEV_DATA(inputs[10]);
  Ndarray *initialState = inputs[12], *initialOutput = inputs[13];
  Ndarray *Y = inputs[15], *H = inputs[16], *DY = inputs[17];
  Ndarray *DX = *outputs[0], *DV_h = *outputs[1], *DV_v = *outputs[2], *DW = *outputs[3], *Db = *outputs[4];
  for (int k = 0; k < 3; ++k) {
    assert_cmp(Ndarray_DIMS(Y)[k], ==, Ndarray_DIMS(X)[k]);
    assert_cmp(Ndarray_DIMS(H)[k], ==, Ndarray_DIMS(X)[k]);
    assert_cmp(Ndarray_DIMS(DY)[k], ==, Ndarray_DIMS(X)[k]);
  }
  assert_cmp(Ndarray_DIMS(Y)[3], ==, s.n);
  assert_cmp(Ndarray_DIMS(DY)[3], ==, s.n);
  assert_cmp(Ndarray_DIMS(H)[3], ==, 5 * s.n);
  int64_t n5 = 5 * s.n, cell_h = s.B * n5, cell_y = s.B * s.n, rows = s.h * s.w * s.B;
  int64_t row_y = s.w * cell_y, row_h = s.w * cell_h;
  if (rows == 0 || s.n == 0) return;  // all gradients stay 0
  const Float* Hd = Ndarray_DEV_DATA(H);
  const Float* Yd = Ndarray_DEV_DATA(Y);
  ptn::Scratch scratch;
  Float* delta = scratch.get<Float>(rows * n5);
  int64_t most = std::min(s.h, s.w);
  Float* right = scratch.get<Float>(most * cell_h);  // delta of the diagonal's right neighbours (0: none)
  Float* below = scratch.get<Float>(most * cell_h);  // and of its lower neighbours
  Float* rec = scratch.get<Float>(most * cell_y);    // dL/dY of the diagonal's cells through the recurrences
  TwoDProducts products = twod_products(V_h, V_v, true, s.n);
  // dL/ds passed left and up by the cells of the previous (d + 1) and of the current diagonal, by row y
  Float* es_left[2] = {scratch.get<Float>(s.h * cell_y), scratch.get<Float>(s.h * cell_y)};
  Float* es_up[2] = {scratch.get<Float>(s.h * cell_y), scratch.get<Float>(s.h * cell_y)};
  for (int64_t dg = s.h + s.w - 2, cur = 0; dg >= 0; --dg, cur ^= 1) {
    TwoDDiagonal D = twod_diagonal(s, dg);
    for (int64_t c = 0; c < D.count; ++c) {
      int64_t y = D.y0 + c, x = dg - y;
      twod_copy_or_zero(right + c * cell_h, x + 1 < s.w ? delta + y * row_h + (x + 1) * cell_h : nullptr, cell_h);
      twod_copy_or_zero(below + c * cell_h, y + 1 < s.h ? delta + (y + 1) * row_h + x * cell_h : nullptr, cell_h);
    }
    twod_recurrent(products, right, below, rec, D.count * s.B);
    for (int64_t c = 0; c < D.count; ++c) {
      int64_t y = D.y0 + c, x = dg - y;
      const Float* Hc = Hd + y * row_h + x * cell_h;
      const Float* s_up = (y > 0 ? Hc - row_h : Ndarray_DEV_DATA(initialState) + x * cell_h) + 4 * s.n;
      const Float* s_left = x > 0 ? Hc - cell_h + 4 * s.n : (const Float*)0;
      const Float* from_below = y + 1 < s.h ? es_up[cur ^ 1] + (y + 1) * cell_y : (const Float*)0;
      const Float* from_right = x + 1 < s.w ? es_left[cur ^ 1] + y * cell_y : (const Float*)0;
      start_dev_kernel(twod_bw_cell, (Hc, s_up, s_left, Ndarray_DEV_DATA(DY) + y * row_y + x * cell_y, rec + c * cell_y,
                                      from_below, from_right, es_left[cur] + y * cell_y, es_up[cur] + y * cell_y,
                                      delta + y * row_h + x * cell_h, sizes, y, x, s.B, s.n));
    }
  }
  // DW = X^T delta (X without the cells outside the grid), DX = delta W^T, Db = column sums of delta
  Float* x_valid = scratch.get<Float>(rows * s.n_in);
  start_dev_kernel(twod_valid_inputs, (Ndarray_DEV_DATA(X), sizes, x_valid, rows, s.n_in, s.w, s.B));
  lstm_gemm(x_valid, true, delta, false, Ndarray_DEV_DATA(DW), s.n_in, n5, rows, 0.0);
  lstm_gemm(delta, false, Ndarray_DEV_DATA(W), true, Ndarray_DEV_DATA(DX), rows, s.n_in, n5, 0.0);
  start_dev_kernel(twod_col_sums, (delta, Ndarray_DEV_DATA(Db), rows, n5));
  // DV_h = sum over rows of Y[y, 0:w-1]^T delta[y, 1:w]
  for (int64_t y = 0; y < s.h && s.w > 1; ++y)
    lstm_gemm(Yd + y * row_y, true, delta + y * row_h + cell_h, false, Ndarray_DEV_DATA(DV_h), s.n, n5,
              (s.w - 1) * s.B, 1.0);
  // DV_v = Y[0:h-1]^T delta[1:h] (+ initialOutput[0]^T delta[0])
  if (s.h > 1)
    lstm_gemm(Yd, true, delta + row_h, false, Ndarray_DEV_DATA(DV_v), s.n, n5, (s.h - 1) * s.w * s.B, 1.0);
  if (s.with_initial_output)
    lstm_gemm(Ndarray_DEV_DATA(initialOutput), true, delta, false, Ndarray_DEV_DATA(DV_v), s.n, n5, s.w * s.B, 1.0);
  HANDLE_LAST_ERROR();
}
