// LstmGenericBase (RETURNN's NativeLstm): an LSTM over precomputed input projections, without y0.
#include "../dialect/kernel.h"
#include "lstm_common.h"
#include "lstm_packed.h"

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
  if (T == 0) {  // (every output is written in full: the glue does not zero them)
    Ndarray_memcpy(Ndarray_DEV_DATA(Dc), Ndarray_DEV_DATA(Dd), n_batch * n_cells * sizeof(Float));
    Ndarray_set_zero(DV_h);
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
