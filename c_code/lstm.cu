// NativeLstm2: an LSTM over precomputed input projections, with y0, direction and stride (the op that
// ptnative.ops.lstm.lstm(impl="native2") runs).  The other LSTM ops: lstm_generic.cu, lstm_lowmem.cu,
// twod_lstm.cu, lstm_cell.cu; what they share: lstm_common.h, lstm_packed.h.
#include "lstm_common.h"
#include "lstm_packed.h"

// H row (B, 4n) holds X[t] + y_prev . W on entry and the activated gates [tanh(cell-in), in, forget, out]
// on exit; y_carry is y_prev on entry and the carried output (y, or y_prev on masked frames) on exit.
DEF_KERNEL void lstm2_fw_frame(Float* __restrict__ h, const Float* __restrict__ mask, Float* __restrict__ y_carry,
                               const Float* __restrict__ c_prev, Float* __restrict__ y, Float* __restrict__ c,
                               int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    Float* g = h + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    LstmGates q = lstm_gates(g[0], g[n_cells], g[2 * n_cells], g[3 * n_cells]);
    g[0] = q.a;
    g[n_cells] = q.ig;
    g[2 * n_cells] = q.fg;
    g[3 * n_cells] = q.og;
    Float cp = c_prev[idx];
    Float cv = lstm_blend(m, cp * q.fg + q.a * q.ig, cp);
    Float yv = lstm_masked(m, lstm_tanh(cv) * q.og);
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
// gd (B, 4n): the frame's activated gates (H[t]) on entry, dL/dX[t] on exit.  One cell, mask value m:
template <bool kValid>
DEV_FUNC inline void lstm2_bw_cell(int64_t b, int64_t j, Float m, Float* __restrict__ gd, const Float* __restrict__ c,
                                   const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                                   const Float* __restrict__ dC, Float* __restrict__ dy_carry, Float* __restrict__ dc,
                                   int64_t n_cells) {
  int64_t idx = b * n_cells + j;
  Float* d = gd + b * 4 * n_cells + j;
  LstmGates q = {d[0], d[n_cells], d[2 * n_cells], d[3 * n_cells]};
  Float dct = lstm_cell_backward<kValid>(m, q, lstm_tanh(c[idx]), c_prev[idx], dY[idx] + dy_carry[idx],
                                         dc[idx] + dC[idx], d, n_cells);
  dc[idx] = lstm_carry_grad_by<kValid>(m, dct, q.fg);
  dy_carry[idx] *= Float(1) - m;
}

DEF_KERNEL void lstm2_bw_frame(Float* __restrict__ gd, const Float* __restrict__ mask, const Float* __restrict__ c,
                               const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                               const Float* __restrict__ dC, Float* __restrict__ dy_carry, Float* __restrict__ dc,
                               int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ_BY_MASK(mask, n_batch, n_cells, lstm2_bw_cell, gd, c, c_prev, dY, dC, dy_carry, dc, n_cells);
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
