// TwoDLSTM: a 2-D LSTM over (target time y) x (source time x), on the CPU and on CUDA.  Pasted after
// lstm.cu (lstm_tanh, lstm_sigmoid, lstm_gemm, LSTM_FOR_BJ).
//
// Layout: X (h, w, B, n_in); H (h, w, B, 5n) holding per cell [in, forget, lambda, out, state]; Y (h, w, B, n).
// Cell (y, x):  a = b + X W + Y[y, x-1] V_h + Y[y-1, x] V_v   (gate blocks: in, forget, lambda, out, cell-in)
//   s = v * (i * tanh(a_z) + f * lambda * s_up + f * (1 - lambda) * s_left),   Y = v * o * tanh(s)
// with v = (y < sizes[b, 0] && x < sizes[b, 1]); s_up = initialState[0, x, :, 4n:] in row 0; s_left = 0 in
// column 0; no V_h term in column 0; in row 0 the V_v term uses initialOutput[0, x] when iteration >= 1
// (then h must be 1) and is absent otherwise.  The rows are computed in order, the cells of a row left to
// right: the V_v products of a whole row are one GEMM.

DEV_FUNC inline Float twod_valid(const Float* sizes, int64_t b, int64_t y, int64_t x) {
  return (Float(y) < sizes[2 * b] && Float(x) < sizes[2 * b + 1]) ? Float(1) : Float(0);
}

// h_cell (B, 5n): pre-activations in, [i, f, lambda, o, s] out.  s_up / s_left: states with row stride 5n
// (s_left may be null).
DEF_KERNEL void twod_fw_cell(Float* h_cell, const Float* s_up, const Float* s_left, Float* y_out, const Float* sizes,
                             int64_t yy, int64_t xx, int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    Float* g = h_cell + b * 5 * n_cells + j;
    int64_t so = b * 5 * n_cells + j;
    Float v = twod_valid(sizes, b, yy, xx);
    Float ig = lstm_sigmoid(g[0]);
    Float fg = lstm_sigmoid(g[n_cells]);
    Float lg = lstm_sigmoid(g[2 * n_cells]);
    Float og = lstm_sigmoid(g[3 * n_cells]);
    Float z = lstm_tanh(g[4 * n_cells]);
    Float sl = s_left ? s_left[so] : Float(0);
    Float s = v * (ig * z + fg * lg * s_up[so] + fg * (Float(1) - lg) * sl);
    g[0] = ig;
    g[n_cells] = fg;
    g[2 * n_cells] = lg;
    g[3 * n_cells] = og;
    g[4 * n_cells] = s;
    y_out[b * n_cells + j] = v * og * lstm_tanh(s);
  }
}

// Backward through cell (y, x).  eps: dL/dY of the cell (direct + both recurrences).  es_below: dL/ds from
// the cell below (null in the last row); es_right: dL/ds from the cell to the right on entry (0 in the
// last column), to the left on exit; es_up: dL/ds passed to the cell above.  delta (B, 5n): out.
DEF_KERNEL void twod_bw_cell(const Float* h_cell, const Float* s_up, const Float* s_left, const Float* eps,
                             const Float* es_below, Float* es_right, Float* es_up, Float* delta, const Float* sizes,
                             int64_t yy, int64_t xx, int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    const Float* g = h_cell + b * 5 * n_cells + j;
    Float* d = delta + b * 5 * n_cells + j;
    int64_t so = b * 5 * n_cells + j, idx = b * n_cells + j;
    Float v = twod_valid(sizes, b, yy, xx);
    Float ig = g[0], fg = g[n_cells], lg = g[2 * n_cells], og = g[3 * n_cells], s = g[4 * n_cells];
    Float su = s_up[so], sl = s_left ? s_left[so] : Float(0);
    Float mix = lg * su + (Float(1) - lg) * sl;
    // tanh(cell input), recovered from the state (only needed on valid cells)
    Float z = v * (s - fg * mix) / std::max(ig, Float(1e-30));
    z = std::min(std::max(z, Float(-1)), Float(1));
    Float tc = lstm_tanh(s);
    Float ev = eps[idx] * v;
    Float es = ev * og * (Float(1) - tc * tc) + (es_below ? es_below[idx] : Float(0)) + es_right[idx];
    Float esv = es * v;
    d[0] = esv * z * ig * (Float(1) - ig);
    d[n_cells] = esv * mix * fg * (Float(1) - fg);
    d[2 * n_cells] = esv * fg * (su - sl) * lg * (Float(1) - lg);
    d[3 * n_cells] = ev * tc * og * (Float(1) - og);
    d[4 * n_cells] = esv * ig * (Float(1) - z * z);
    es_up[idx] = esv * fg * lg;
    es_right[idx] = esv * fg * (Float(1) - lg);
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

static Float twod_iteration(Ndarray* iteration) {
  if (Ndarray_SIZE(iteration) == 0) return 0;
  Float it = 0;
  Ndarray_copy_to_host(&it, Ndarray_DEV_DATA(iteration), sizeof(Float));
  return it;
}

static TwoDShapes check_twod_shapes(Ndarray** inputs) {
  Ndarray *X = inputs[0], *V_h = inputs[1], *V_v = inputs[2], *W = inputs[3], *b = inputs[4], *sizes = inputs[10];
  Ndarray *initialState = inputs[12], *initialOutput = inputs[13];
  TwoDShapes s;
  s.h = Ndarray_DIMS(X)[0];
  s.w = Ndarray_DIMS(X)[1];
  s.B = Ndarray_DIMS(X)[2];
  s.n_in = Ndarray_DIMS(X)[3];
  s.n = Ndarray_DIMS(V_h)[0];
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
  for (int64_t y = 0; y < s.h; ++y) {
    Float* Hrow = Hd + y * s.w * cell_h;
    if (y > 0)
      lstm_gemm(Yd + (y - 1) * s.w * cell_y, false, Ndarray_DEV_DATA(V_v), false, Hrow, s.w * s.B, n5, s.n, 1.0);
    else if (s.with_initial_output)
      lstm_gemm(Ndarray_DEV_DATA(initialOutput), false, Ndarray_DEV_DATA(V_v), false, Hrow, s.w * s.B, n5, s.n, 1.0);
    for (int64_t x = 0; x < s.w; ++x) {
      Float* Hc = Hrow + x * cell_h;
      Float* Yc = Yd + (y * s.w + x) * cell_y;
      if (x > 0) lstm_gemm(Yc - cell_y, false, Ndarray_DEV_DATA(V_h), false, Hc, s.B, n5, s.n, 1.0);
      const Float* s_up = (y > 0 ? Hc - s.w * cell_h : Ndarray_DEV_DATA(initialState) + x * cell_h) + 4 * s.n;
      const Float* s_left = x > 0 ? Hc - cell_h + 4 * s.n : (const Float*)0;
      start_dev_kernel(twod_fw_cell, (Hc, s_up, s_left, Yc, sizes, y, x, s.B, s.n));
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
  Float* eps = scratch.get<Float>(row_y);
  Float* es_below = scratch.get<Float>(row_y);
  Float* es_up = scratch.get<Float>(row_y);
  Float* es_right = scratch.get<Float>(cell_y);
  for (int64_t y = s.h - 1; y >= 0; --y) {
    Ndarray_memcpy(eps, Ndarray_DEV_DATA(DY) + y * row_y, row_y * sizeof(Float));
    if (y < s.h - 1)
      lstm_gemm(delta + (y + 1) * row_h, false, Ndarray_DEV_DATA(V_v), true, eps, s.w * s.B, s.n, n5, 1.0);
    Ndarray_memset(es_right, 0, cell_y * sizeof(Float));
    for (int64_t x = s.w - 1; x >= 0; --x) {
      const Float* Hc = Hd + y * row_h + x * cell_h;
      Float* dc = delta + y * row_h + x * cell_h;
      if (x < s.w - 1) lstm_gemm(dc + cell_h, false, Ndarray_DEV_DATA(V_h), true, eps + x * cell_y, s.B, s.n, n5, 1.0);
      const Float* s_up = (y > 0 ? Hc - row_h : Ndarray_DEV_DATA(initialState) + x * cell_h) + 4 * s.n;
      const Float* s_left = x > 0 ? Hc - cell_h + 4 * s.n : (const Float*)0;
      start_dev_kernel(twod_bw_cell, (Hc, s_up, s_left, eps + x * cell_y, y < s.h - 1 ? es_below + x * cell_y : (Float*)0,
                                      es_right, es_up + x * cell_y, dc, sizes, y, x, s.B, s.n));
    }
    std::swap(es_below, es_up);
  }
  // DW = X^T delta, DX = delta W^T, Db = column sums of delta
  lstm_gemm(Ndarray_DEV_DATA(X), true, delta, false, Ndarray_DEV_DATA(DW), s.n_in, n5, rows, 0.0);
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
