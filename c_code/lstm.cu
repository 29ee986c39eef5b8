// LSTM kernels.  Gate layout along the 4n axis: [cell input | input gate |
// forget gate | output gate], each n wide.  The mask `i` is 1 on valid frames
// and 0 on padding; a masked frame outputs 0 and carries the cell state.

DEV_FUNC inline Float ptn_sigmoid(Float x) { return Float(1) / (Float(1) + exp(-x)); }

// ---------------------------------------------------------------- LstmGenericBase
// One time frame.  h: (B, 4n) pre-activations (Z + recurrent part), overwritten
// with [state, in gate, forget gate, out gate].  prev_state: the previous
// frame's h (state in its first n columns, row stride 4n) or the initial c
// (row stride n).
DEF_KERNEL void lstm_generic_fw_frame(Float* h, const Float* prev_state, bool prev_in_h, Float* y, Float* final_c,
                                      int64_t n_cells, int64_t n_batch, const Float* mask) {
  int64_t idx = threadIdx.x + (int64_t)blockDim.x * blockIdx.x;
  for (; idx < n_cells * n_batch; idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t b = idx / n_cells, cell = idx % n_cells;
    Float* g = h + b * 4 * n_cells + cell;
    Float m = mask[b];
    Float s_prev = prev_in_h ? prev_state[b * 4 * n_cells + cell] : prev_state[idx];
    Float cell_in = tanh(g[0]);
    Float in_gate = ptn_sigmoid(g[n_cells]);
    Float forget_gate = ptn_sigmoid(g[2 * n_cells]);
    Float out_gate = ptn_sigmoid(g[3 * n_cells]);
    Float s = (in_gate * cell_in + forget_gate * s_prev) * m + s_prev * (Float(1) - m);
    y[idx] = out_gate * tanh(s) * m;
    g[0] = s;
    g[n_cells] = in_gate;
    g[2 * n_cells] = forget_gate;
    g[3 * n_cells] = out_gate;
    if (final_c) final_c[idx] = s;
  }
}

// Backward through one frame.  delta: (B, 4n) holding [state, gates] of this
// frame, overwritten with the gradient w.r.t. the pre-activations.  eps: dL/dy
// of this frame (direct + recurrent), overwritten with dL/d(previous state).
// next_eps: dL/d(this frame's state) coming from the frame after it.
DEF_KERNEL void lstm_generic_bw_frame(Float* delta, Float* eps, const Float* next_eps, const Float* prev_state,
                                      bool prev_in_h, int64_t n_cells, int64_t n_batch, const Float* mask) {
  int64_t idx = threadIdx.x + (int64_t)blockDim.x * blockIdx.x;
  for (; idx < n_cells * n_batch; idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t b = idx / n_cells, cell = idx % n_cells;
    Float* d = delta + b * 4 * n_cells + cell;
    Float m = mask[b];
    Float s_prev = prev_in_h ? prev_state[b * 4 * n_cells + cell] : prev_state[idx];
    Float s = d[0], in_gate = d[n_cells], forget_gate = d[2 * n_cells], out_gate = d[3 * n_cells];
    Float tanh_s = tanh(s);
    // tanh(cell input), recovered from the state; only used on valid frames.
    Float cell_in = (s - forget_gate * s_prev) / std::max(in_gate, Float(1e-16));
    Float e = eps[idx];
    Float eps_s = (Float(1) - tanh_s * tanh_s) * out_gate * e * m + next_eps[idx];
    d[0] = in_gate * (Float(1) - cell_in * cell_in) * eps_s * m;
    d[n_cells] = in_gate * (Float(1) - in_gate) * cell_in * eps_s * m;
    d[2 * n_cells] = forget_gate * (Float(1) - forget_gate) * s_prev * eps_s * m;
    d[3 * n_cells] = out_gate * (Float(1) - out_gate) * tanh_s * e * m;
    eps[idx] = eps_s * (forget_gate * m + (Float(1) - m));
  }
}

static void check_lstm_generic_shapes(Ndarray* Z_or_H, Ndarray* V_h, Ndarray* c, Ndarray* i) {
  assert_cmp(Ndarray_DIMS(Z_or_H)[2] % 4, ==, 0);
  int64_t n_cells = Ndarray_DIMS(Z_or_H)[2] / 4;
  assert_cmp(Ndarray_DIMS(Z_or_H)[0], ==, Ndarray_DIMS(i)[0]);
  assert_cmp(Ndarray_DIMS(Z_or_H)[1], ==, Ndarray_DIMS(i)[1]);
  assert_cmp(Ndarray_DIMS(V_h)[0], ==, n_cells);
  assert_cmp(Ndarray_DIMS(V_h)[1], ==, 4 * n_cells);
  assert_cmp(Ndarray_DIMS(c)[0], ==, Ndarray_DIMS(i)[1]);
  assert_cmp(Ndarray_DIMS(c)[1], ==, n_cells);
}

// inputs: Z (T,B,4n) [H is Z's buffer], V_h (n,4n), c (B,n), i (T,B); outputs: Y, H, d.
static void lstm_generic_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 4);
  assert_cmp(n_outputs, ==, 3);
  Ndarray* V_h = inputs[1];
  Ndarray* c = inputs[2];
  Ndarray* i = inputs[3];
  Ndarray* Y = *outputs[0];
  Ndarray* H = *outputs[1];
  Ndarray* d = *outputs[2];
  check_lstm_generic_shapes(H, V_h, c, i);
  int64_t T = Ndarray_DIMS(i)[0], n_batch = Ndarray_DIMS(i)[1], n_cells = Ndarray_DIMS(H)[2] / 4;
  if (T == 0) {
    Ndarray_memcpy(Ndarray_DEV_DATA(d), Ndarray_DEV_DATA(c), n_batch * n_cells * sizeof(Float));
    return;
  }
  for (int64_t x = 0; x < T; ++x) {
    if (x > 0) affine_y_x(x - 1, Y, 0, V_h, x, H);  // H[x] += Y[x-1] . V_h
    start_dev_kernel(lstm_generic_fw_frame,
                     (data_ptr(H, x), x > 0 ? data_ptr(H, x - 1) : Ndarray_DEV_DATA(c), x > 0, data_ptr(Y, x),
                      x == T - 1 ? Ndarray_DEV_DATA(d) : (Float*)0, n_cells, n_batch, Ndarray_DEV_DATA(i) + x * n_batch));
  }
  HANDLE_LAST_ERROR();
}

// inputs: V_h, c, i, Y, H [DZ is H's buffer], DY [tmpDc is DY's buffer], Dd;
// outputs: DZ (T,B,4n), DV_h (n,4n), Dc (B,n), tmpDc (T,B,n).
static void lstm_generic_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 4);
  Ndarray* V_h = inputs[0];
  Ndarray* c = inputs[1];
  Ndarray* i = inputs[2];
  Ndarray* Y = inputs[3];
  Ndarray* Dd = inputs[6];
  Ndarray* DZ = *outputs[0];
  Ndarray* DV_h = *outputs[1];
  Ndarray* Dc = *outputs[2];
  Ndarray* tmpDc = *outputs[3];
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
  for (int64_t x = T - 1; x >= 0; --x) {
    if (x < T - 1) affine_y_x(x + 1, DZ, 0, V_h, x, tmpDc, false, true);  // dY[x] += DZ[x+1] . V_h^T
    start_dev_kernel(lstm_generic_bw_frame,
                     (data_ptr(DZ, x), data_ptr(tmpDc, x), x == T - 1 ? Ndarray_DEV_DATA(Dd) : data_ptr(tmpDc, x + 1),
                      x > 0 ? data_ptr(DZ, x - 1) : Ndarray_DEV_DATA(c), x > 0, n_cells, n_batch,
                      Ndarray_DEV_DATA(i) + x * n_batch));
  }
  affine_global(Y, DZ, DV_h, true, false, 1, 0.0);  // DV_h = Y[0..T-2]^T . DZ[1..T-1]
  Ndarray_memcpy(Ndarray_DEV_DATA(Dc), data_ptr(tmpDc, 0), n_batch * n_cells * sizeof(Float));
  HANDLE_LAST_ERROR();
}
