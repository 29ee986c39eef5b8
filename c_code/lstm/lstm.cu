// NativeLstm2: an LSTM over precomputed input projections, with y0, direction and stride (the op that
// ptnative.ops.lstm.lstm(impl="native2") runs).  The other LSTM ops: lstm_generic.cu, lstm_lowmem.cu,
// twod_lstm.cu, lstm_cell.cu; what they share: lstm_common.h, lstm_packed.h.
#include "../dialect/kernel.h"
#include "lstm_common.h"
#include "lstm_cuda.h"
#include "lstm_packed.h"
#include "lstm_team.h"

// One cell of a visited frame, mask value m: g points at its cell-input pre-activation in H (X[t] + y_prev . W; the
// other gates n_cells, 2 n_cells and 3 n_cells after it), which become the activated gates [tanh(cell-in), in, forget,
// out]; k is its index in the (B, n) arrays; y_out[k] = the carried output (y, or y_in[k] on a masked frame).
DEV_FUNC inline void lstm2_fw_cell(Float* g, int64_t n_cells, Float m, int64_t k, const Float* y_in, Float* y_out,
                                   const Float* c_prev, Float* y, Float* c) {
  LstmGates q = lstm_gates(g[0], g[n_cells], g[2 * n_cells], g[3 * n_cells]);
  g[0] = q.a;
  g[n_cells] = q.ig;
  g[2 * n_cells] = q.fg;
  g[3 * n_cells] = q.og;
  Float cp = c_prev[k];
  Float cv = lstm_blend(m, cp * q.fg + q.a * q.ig, cp);
  Float yv = lstm_masked(m, lstm_tanh(cv) * q.og);
  c[k] = cv;
  y[k] = yv;
  y_out[k] = yv + y_in[k] * (Float(1) - m);
}

#if CUDA
// H row (B, 4n) holds X[t] + y_prev . W on entry and the activated gates on exit, 0 on a masked row (m = 0: its gates
// reach nothing); y_carry is y_prev on entry and the carried output on exit.
DEF_KERNEL void lstm2_fw_frame(Float* __restrict__ h, const Float* __restrict__ mask, Float* __restrict__ y_carry,
                               const Float* __restrict__ c_prev, Float* __restrict__ y, Float* __restrict__ c,
                               int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    Float* g = h + b * 4 * n_cells + j;
    lstm2_fw_cell(g, n_cells, mask[b], b * n_cells + j, y_carry, y_carry, c_prev, y, c);
    if (mask[b] == Float(0)) g[0] = g[n_cells] = g[2 * n_cells] = g[3 * n_cells] = Float(0);
  }
}
#else
// The CPU's cells [j0, j1) of n_batch rows of a visited frame (h: row b's gates at b * 4n; the others' row b at
// b * n): lstm2_fw_cell with the carried output read from y_in and written to y_out (the parts of the cell split
// read every cell of y_in while others write theirs), then the gates of the masked rows set to 0 (the CPU may skip
// their product).  Not inlined: inlined into a part's loop, its restrict pointers meant nothing and no loop vectorised
// (the layer's step took 26% more CPU time).
LSTM_WIDE_LOOPS __attribute__((noinline))
static void lstm2_fw_cells(Float* __restrict__ h, const Float* __restrict__ mask, const Float* __restrict__ y_in,
                           Float* __restrict__ y_out, const Float* __restrict__ c_prev, Float* __restrict__ y,
                           Float* __restrict__ c, int64_t n_batch, int64_t n_cells, int64_t j0, int64_t j1) {
  for (int64_t b = 0; b < n_batch; ++b)
    for (int64_t j = j0; j < j1; ++j)
      lstm2_fw_cell(h + b * 4 * n_cells + j, n_cells, mask[b], b * n_cells + j, y_in, y_out, c_prev, y, c);
  // a pass of its own: in the loop above it would change how g++ contracts the cell's products (the bits)
  for (int64_t b = 0; b < n_batch; ++b)
    if (mask[b] == Float(0))
      for (int q = 0; q < 4; ++q) std::fill(h + b * 4 * n_cells + q * n_cells + j0, h + b * 4 * n_cells + q * n_cells + j1, Float(0));
}

// What lstm2_fw_cells gives on rows whose mask is 0, without reading their h (the CPU skips their product): gates 0,
// C = c_prev, Y = 0, the carried output kept (as y + y_in (1 - m) does: a -0 becomes +0).
static void lstm2_fw_masked_rows(Float* __restrict__ h, const Float* __restrict__ y_in, Float* __restrict__ y_out,
                                 const Float* __restrict__ c_prev, Float* __restrict__ y, Float* __restrict__ c,
                                 int64_t n_batch, int64_t n_cells, int64_t j0, int64_t j1) {
  for (int64_t b = 0; b < n_batch; ++b) {
    for (int q = 0; q < 4; ++q) std::fill(h + b * 4 * n_cells + q * n_cells + j0, h + b * 4 * n_cells + q * n_cells + j1, Float(0));
    const int64_t k0 = b * n_cells + j0, k1 = b * n_cells + j1;
    std::fill(y + k0, y + k1, Float(0));
    std::copy(c_prev + k0, c_prev + k1, c + k0);
    for (int64_t k = k0; k < k1; ++k) y_out[k] = Float(0) + y_in[k];
  }
}
#endif

// yp_next = y + yp * (1 - m): the recurrent input of the next visited frame (yp's rows ld apart).
DEF_KERNEL void lstm2_carry(const Float* y, const Float* yp, Float* yp_next, const Float* mask, int64_t n_batch,
                            int64_t n_cells, int64_t ld) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    yp_next[b * ld + j] = y[b * n_cells + j] + yp[b * ld + j] * (Float(1) - mask[b]);
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

#if CUDA
DEF_KERNEL void lstm2_bw_frame(Float* __restrict__ gd, const Float* __restrict__ mask, const Float* __restrict__ c,
                               const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                               const Float* __restrict__ dC, Float* __restrict__ dy_carry, Float* __restrict__ dc,
                               int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ_BY_MASK(mask, n_batch, n_cells, lstm2_bw_cell, gd, c, c_prev, dY, dC, dy_carry, dc, n_cells);
}
#else
// The CPU's cells [j0, j1) of n_batch rows (as lstm2_fw_cells; not inlined either).
LSTM_WIDE_LOOPS __attribute__((noinline))
static void lstm2_bw_cells(Float* __restrict__ gd, const Float* __restrict__ mask, const Float* __restrict__ c,
                           const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                           const Float* __restrict__ dC, Float* __restrict__ dy_carry, Float* __restrict__ dc,
                           int64_t n_batch, int64_t n_cells, int64_t j0, int64_t j1) {
  LSTM_FOR_BJ_BY_MASK_CELLS(mask, n_batch, j0, j1, lstm2_bw_cell, gd, c, c_prev, dY, dC, dy_carry, dc, n_cells);
}
#endif

// out[c] = the sum of column c of the (rows, cols) row-major X, accumulated in double row by row (CUDA: one
// thread per column).
DEF_KERNEL void lstm2_column_sums(const Float* __restrict__ X, int64_t rows, int64_t cols, Float* __restrict__ out) {
  LSTM_FOR_BJ(unused, c, 1, cols) {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += (double)X[r * cols + c];
    out[c] = (Float)s;
  }
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

// NativeLstm2Layer's input projection: H = x (T, B, n_in) . W_in (n_in, 4n) before the recurrence.
struct Lstm2Input {
  Ndarray *x, *W_in;
};

// The forward pass of NativeLstm2 (b = null, proj = null) and NativeLstm2Layer (H = proj's x . W_in over all frames,
// then b added to each visited frame's H[t] before its recurrent product).  inputs: W, y0, c0, i, start, step;
// outputs Y, C, H [X's buffer], d.
static void lstm2_forward(Ndarray** in, Ndarray* b, const Lstm2Input* proj, Ndarray*** outputs) {
  Ndarray *W = in[0], *y0 = in[1], *c0 = in[2], *i = in[3];
  Ndarray *Y = *outputs[0], *C = *outputs[1], *H = *outputs[2], *d = *outputs[3];
  check_lstm2_shapes(H, W, y0, c0, i);
  if (b) ptn::require_dim(b, "b", 0, Ndarray_DIMS(W)[1], "4 * n (n = y0.shape[1])");
  const Float* bias = b ? Ndarray_DEV_DATA(b) : nullptr;
  const LstmCall call = lstm_call(i, y0, in[4], in[5], false);
  const LstmFrames& fr = call.fr;
  const int64_t n_batch = call.n_batch, n_cells = call.n_cells, frame = call.frame, step = fr.step;
  const int64_t T = Ndarray_DIMS(i)[0], g = 4 * n_cells, n_in = proj ? Ndarray_DIMS(proj->x)[2] : 0;
  const std::vector<char> visited = lstm_visited(fr, T);
  lstm_zero_unvisited(visited, Y);
  lstm_zero_unvisited(visited, C);
  if (fr.count == 0 && !proj) return lstm_final_state(d, C, c0, call);
  ptn::Scratch scratch;
  Float* y_carry = scratch.get<Float>(frame);
  Ndarray_memcpy(y_carry, Ndarray_DEV_DATA(y0), frame * sizeof(Float));
#if CUDA
  if (proj)
    lstm_gemm(Ndarray_DEV_DATA(proj->x), false, Ndarray_DEV_DATA(proj->W_in), false, Ndarray_DEV_DATA(H), T * n_batch,
              g, n_in, 0.0);
  if (bias && fr.count > 0)
    start_dev_kernel(lstm_add_bias_frames, (Ndarray_DEV_DATA(H), bias, fr.first, fr.step, fr.count, n_batch, g));
  for (int64_t k = 0; k < fr.count; ++k) {
    int64_t t = fr.at(k);
    lstm_gemm(y_carry, false, Ndarray_DEV_DATA(W), false, data_ptr(H, t), n_batch, 4 * n_cells, n_cells, 1.0);
    start_dev_kernel(lstm2_fw_frame, (data_ptr(H, t), Ndarray_DEV_DATA(i) + t * n_batch, y_carry,
                                      k > 0 ? data_ptr(C, t - step) : Ndarray_DEV_DATA(c0), data_ptr(Y, t),
                                      data_ptr(C, t), n_batch, n_cells));
  }
#else
  const Float *mask = Ndarray_DEV_DATA(i), *Wd = Ndarray_DEV_DATA(W);
  const Float *x = proj ? Ndarray_DEV_DATA(proj->x) : nullptr, *W_in = proj ? Ndarray_DEV_DATA(proj->W_in) : nullptr;
  // The carried output is double-buffered: visited frame k reads y_carry and writes y_next when k is even, else the
  // other way round (the cell split's parts read every cell of it while others write theirs).
  Float* y_next = scratch.get<Float>(frame);
  // Visited frame k's cells of `cells` for the rows r0 .. r1-1, whose pre-activations hold the recurrent product for
  // the rows before r0 + m (the rows after them have the mask 0: their outputs are fixed).
  auto frame_cells = [&](int64_t k, int64_t r0, int64_t r1, int64_t m, const LstmSpan& cells) {
    const int64_t t = fr.at(k), at = r0 * n_cells, after = (r0 + m) * n_cells;
    Float *h = data_ptr(H, t) + r0 * g, *y = data_ptr(Y, t), *c = data_ptr(C, t);
    const Float* c_prev = k > 0 ? data_ptr(C, t - step) : Ndarray_DEV_DATA(c0);
    const Float* y_in = k % 2 ? y_next : y_carry;
    Float* y_out = k % 2 ? y_carry : y_next;
    lstm2_fw_cells(h, mask + t * n_batch + r0, y_in + at, y_out + at, c_prev + at, y + at, c + at, m, n_cells,
                   cells.j0, cells.j1);
    lstm2_fw_masked_rows(h + m * g, y_in + after, y_out + after, c_prev + after, y + after, c + after, r1 - r0 - m,
                         n_cells, cells.j0, cells.j1);
  };
  const int64_t work = std::max<int64_t>(fr.count, proj ? T : 0);
  if (const int cell_parts = lstm_cpu_cell_parts(n_batch, n_cells, work)) {
    const int parts = cell_parts;
    // The cell split (few rows): part p computes the gate columns of its cells for every row, first their input
    // projection over all frames (the layer), then frame by frame their share of y_prev . W and the cells; the parts
    // meet after each frame.  Each packs its slices of the weights (into one buffer of the calling thread's pool).
    std::vector<int64_t> rows(T, n_batch);  // per frame, the rows up to the last valid one (visited frames)
    for (int64_t k = 0; k < fr.count; ++k) rows[fr.at(k)] = lstm_rows_to_last_valid(mask + fr.at(k) * n_batch, n_batch);
    std::vector<int64_t> packed_at(parts + 1, 0);
    for (int p = 0; p < parts; ++p) {
      const LstmSpan cells = lstm_span_of(p, parts, n_cells);
      packed_at[p + 1] = packed_at[p] + lstm_gate_panels_size(n_cells, cells) + lstm_gate_panels_size(n_in, cells);
    }
    LstmBuffer packed(packed_at[parts]);
    lstm_cpu_team(parts, [&](int p, LstmBarrier& barrier) {
      const LstmSpan cells = lstm_span_of(p, parts, n_cells);
      Float* mine = packed.data() + packed_at[p];
      lstm_pack_gates_to(mine, Wd, n_cells, n_cells, cells);
      if (proj) {
        const LstmGatePanels Wi = lstm_pack_gates_to(mine + lstm_gate_panels_size(n_cells, cells), W_in, n_in, n_cells,
                                                     cells);
        // every row of every frame as one block (tiles of 8 rows rather than of a frame's few): the masked rows'
        // gates are overwritten by the frames' cells (0), as in the row parts where a hole is computed too
        lstm_gates_gemm_blocks(x, Wi, Ndarray_DEV_DATA(H), LstmRowBlocks{T * n_batch, 1, n_in, 0, g, 0}, n_cells, cells,
                               nullptr, true);
      }
      bool solo = false;  // part 0 computes every part's cells (LstmBarrier::wait), the others have left
      for (int64_t k = 0; k < fr.count; ++k) {
        const int64_t t = fr.at(k);
        lstm_team_shares(p, parts, solo, [&](int q) {
          const LstmSpan span = lstm_span_of(q, parts, n_cells);
          lstm_gates_gemm_blocks(k % 2 ? y_next : y_carry, lstm_gate_panels_at(packed.data() + packed_at[q], n_cells, span),
                                 data_ptr(H, t), LstmRowBlocks{rows[t], 1, n_cells, 0, g, 0}, n_cells, span, bias);
          frame_cells(k, 0, n_batch, rows[t], span);
        });
        if (!solo && (solo = barrier.wait(p)) && p > 0) break;
      }
    });
  } else {
    // Each part computes its rows of every frame: first their input projection (the layer), then the recurrence.
    // The products skip a part's rows after the last valid one of a visited frame (their outputs are fixed; the
    // frame's cells write them), and the parts are balanced by the rows' valid frames.
    LstmPacked packed_W = lstm_pack(Wd, false, n_cells, g);
    LstmPacked packed_W_in = proj ? lstm_pack(W_in, false, n_in, g) : LstmPacked();
    const int parts = lstm_cpu_parts(n_batch, n_cells, work);
    lstm_cpu_row_parts_by_work(lstm_valid_frames(mask, fr, n_batch), parts, [&](int, int64_t r0, int64_t r1) {
      std::vector<int64_t> rows(T, r1 - r0);  // per frame, the part's rows up to its last valid one (visited frames)
      for (int64_t k = 0; k < fr.count; ++k)
        rows[fr.at(k)] = lstm_rows_to_last_valid(mask + fr.at(k) * n_batch + r0, r1 - r0);
      if (proj) {
        LstmRowBlocks rb{r1 - r0, T, n_in, n_batch * n_in, g, n_batch * g};
        rb.rows = rows.data();
        lstm_packed_gemm_blocks(x + r0 * n_in, packed_W_in, Ndarray_DEV_DATA(H) + r0 * g, rb, nullptr, true);
      }
      for (int64_t k = 0; k < fr.count; ++k) {
        const int64_t t = fr.at(k);
        lstm_packed_gemm((k % 2 ? y_next : y_carry) + r0 * n_cells, n_cells, packed_W, data_ptr(H, t) + r0 * g, g,
                         rows[t], bias);
        frame_cells(k, r0, r1, rows[t], LstmSpan{0, n_cells});
      }
    }, ptn::PartsOn::own_threads);
  }
#endif
  HANDLE_LAST_ERROR();
  lstm_final_state(d, C, c0, call);
}

// inputs: X (T,B,4n) [H is X's buffer], W (n,4n), y0, c0 (B,n), i (T,B), start, step;
// outputs: Y, C (T,B,n), H (T,B,4n), d (B,n).
static void native_lstm2_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 7);
  assert_cmp(n_outputs, ==, 4);
  lstm2_forward(inputs + 1, nullptr, nullptr, outputs);
}

// What NativeLstm2Layer's backward pass computes besides NativeLstm2's: the input projection's gradients.
struct Lstm2LayerGrads {
  Ndarray *x, *W_in;          // the layer's input (T, B, n_in) and input weights (n_in, 4n)
  Ndarray *Dx, *DW_in, *Db;  // their gradients and the bias's
};

// The backward pass of NativeLstm2 and (with `layer`) NativeLstm2Layer.
// in: W, y0, c0, i, start, step, Y, C, H, DY, DC, Dd; outputs DX [H's buffer], DW, Dy0, Dc0.
static void lstm2_backward(Ndarray** in, Ndarray*** outputs, const Lstm2LayerGrads* layer) {
  Ndarray *W = in[0], *y0 = in[1], *c0 = in[2], *i = in[3];
  Ndarray *Y = in[6], *C = in[7], *H = in[8], *DY = in[9], *DC = in[10], *Dd = in[11];
  Ndarray *DX = *outputs[0], *DW = *outputs[1], *Dy0 = *outputs[2], *Dc0 = *outputs[3];
  check_lstm2_shapes(H, W, y0, c0, i);
  const LstmCall call = lstm_call(i, y0, in[4], in[5], false);
  const LstmFrames& fr = call.fr;
  const int64_t T = Ndarray_DIMS(i)[0], n_batch = call.n_batch, n_cells = call.n_cells, frame = call.frame;
  const int64_t step = fr.step, g = 4 * n_cells;
  check_lstm_bw_shapes(i, n_cells, Y, C, DY, DC, Dd);
  Ndarray_memcpy(Ndarray_DEV_DATA(Dc0), Ndarray_DEV_DATA(Dd), frame * sizeof(Float));
  // Every output is written in full below (the glue does not zero them).  DX starts as a copy of H (or is H):
  // every visited frame is overwritten below, the others are zeroed.  Dy0 is the running dL/dy_prev.
  const std::vector<char> visited = lstm_visited(fr, T);
  lstm_zero_unvisited(visited, DX);
  Ndarray_memset(Ndarray_DEV_DATA(Dy0), 0, frame * sizeof(Float));
  if (fr.count == 0) {  // no frame: the weights, y0 and the layer's input get no gradient
    Ndarray_set_zero(DW);
    if (layer) {
      Ndarray_set_zero(layer->Dx);
      Ndarray_set_zero(layer->DW_in);
      Ndarray_set_zero(layer->Db);
    }
    return;
  }
  // P (T*B rows of ld = n_in + n): [x[t] (0 on padded rows) | Yp[t]], Yp[t] the recurrent input of visited frame t
  // (y0, then the carried output); 0 on the frames not visited.  Then [DW_in; DW] = P^T . DX is one product over all
  // frames and both weights (n_in = 0 without the layer: DW alone).  On the CPU no product goes to BLAS: the row
  // parts compute their rows' x . W_in (forward) and dx = DX . W_in^T, the recurrent products, and then, split by
  // columns, the weight gradients (lstm_packed.h), P written in the layout that product reads, for the rows where
  // DX is not 0 only (the valid rows of visited frames).
  const Float* mask = Ndarray_DEV_DATA(i);
  const int64_t n_in = layer ? Ndarray_DIMS(layer->x)[2] : 0, ld = n_in + n_cells;
  ptn::Scratch scratch;
  const Float* x = layer ? Ndarray_DEV_DATA(layer->x) : nullptr;
  Float* db_out = layer ? Ndarray_DEV_DATA(layer->Db) : nullptr;
#if CUDA
  Float* P = scratch.get<Float>(T * n_batch * ld);  // row-major
  for (int64_t t = 0; t < T; ++t)
    if (!visited[t]) Ndarray_memset(P + t * n_batch * ld, 0, n_batch * ld * sizeof(Float));
  if (fr.count > 0)
    start_dev_kernel(lstm2_fill_p, (x, mask, Ndarray_DEV_DATA(y0), Ndarray_DEV_DATA(Y), P, fr.first, fr.step,
                                    fr.count, n_batch, n_in, n_cells));
  for (int64_t k = fr.count - 1; k >= 0; --k) {
    int64_t t = fr.at(k);
    start_dev_kernel(lstm2_bw_frame, (data_ptr(DX, t), mask + t * n_batch, data_ptr(C, t),
                                      k > 0 ? data_ptr(C, t - step) : Ndarray_DEV_DATA(c0), data_ptr(DY, t),
                                      data_ptr(DC, t), Ndarray_DEV_DATA(Dy0), Ndarray_DEV_DATA(Dc0), n_batch,
                                      n_cells));
    // dL/dy_prev += DX[t] . W^T
    lstm_gemm(data_ptr(DX, t), false, Ndarray_DEV_DATA(W), true, Ndarray_DEV_DATA(Dy0), n_batch, n_cells, g, 1.0);
  }
  if (layer) start_dev_kernel(lstm2_column_sums, (Ndarray_DEV_DATA(DX), T * n_batch, g, db_out));
  const Float* DXd = Ndarray_DEV_DATA(DX);
  if (!layer) {
    lstm_gemm(P, true, DXd, false, Ndarray_DEV_DATA(DW), n_cells, g, T * n_batch, 0.0);
  } else {
    Float* DWs = scratch.get<Float>(ld * g);  // [DW_in; DW]
    lstm_gemm(P, true, DXd, false, DWs, ld, g, T * n_batch, 0.0);
    Ndarray_memcpy(Ndarray_DEV_DATA(layer->DW_in), DWs, n_in * g * sizeof(Float));
    Ndarray_memcpy(Ndarray_DEV_DATA(DW), DWs + n_in * g, n_cells * g * sizeof(Float));
    lstm_gemm(DXd, false, Ndarray_DEV_DATA(layer->W_in), true, Ndarray_DEV_DATA(layer->Dx), T * n_batch, n_in, g, 0.0);
  }
#else
  // DX is 0 on the masked rows and the frames not visited: the weight gradients' product leaves those rows out.
  const LstmTnKeep keep(T * n_batch, [&](int64_t row) { return visited[row / n_batch] && mask[row] != Float(0); });
  const LstmTnRows P(scratch.get<Float>(LstmTnRows::size(T * n_batch, ld)), T * n_batch, ld, &keep);
  const Float *Wd = Ndarray_DEV_DATA(W), *W_in = layer ? Ndarray_DEV_DATA(layer->W_in) : nullptr;
  Float *Dy0d = Ndarray_DEV_DATA(Dy0), *Dc0d = Ndarray_DEV_DATA(Dc0), *Dx = layer ? Ndarray_DEV_DATA(layer->Dx) : nullptr;
  Float *DXd = Ndarray_DEV_DATA(DX), *DW_in = layer ? Ndarray_DEV_DATA(layer->DW_in) : nullptr;
  // The rows r0 .. r1-1 of P, frame by frame: [x[t] | the recurrent input yp] (the product reads no other row).
  auto put_rows = [&](int64_t r0, int64_t r1) {
    std::vector<Float> yp(Ndarray_DEV_DATA(y0) + r0 * n_cells, Ndarray_DEV_DATA(y0) + r1 * n_cells);
    for (int64_t k = 0; k < fr.count; ++k) {
      const int64_t t = fr.at(k), tp = k > 0 ? fr.at(k - 1) : 0;
      if (k > 0)  // the carried output of the frame before
        lstm2_carry(data_ptr(Y, tp) + r0 * n_cells, yp.data(), yp.data(), mask + tp * n_batch + r0, r1 - r0, n_cells,
                    n_cells);
      for (int64_t r = r0; r < r1; ++r)
        if (mask[t * n_batch + r] != Float(0))
          P.put(t * n_batch + r, layer ? x + (t * n_batch + r) * n_in : nullptr, n_in, yp.data() + (r - r0) * n_cells);
    }
  };
  // Visited frame k's cells of `cells` for the rows r0 .. r1-1; the bias gradient's sums (db, else null) of their
  // gate columns gain its rows up to the last valid one (rows[t], counted from r0; the rows after it add 0).
  auto frame_cells = [&](int64_t k, int64_t r0, int64_t r1, const std::vector<int64_t>& rows, const LstmSpan& cells,
                         double* db) {
    const int64_t t = fr.at(k), at = r0 * n_cells;
    Float* dx = data_ptr(DX, t) + r0 * g;
    lstm2_bw_cells(dx, mask + t * n_batch + r0, data_ptr(C, t) + at,
                   (k > 0 ? data_ptr(C, t - step) : Ndarray_DEV_DATA(c0)) + at, data_ptr(DY, t) + at,
                   data_ptr(DC, t) + at, Dy0d + at, Dc0d + at, r1 - r0, n_cells, cells.j0, cells.j1);
    if (db)
      for (int q = 0; q < 4; ++q)
        lstm_add_rows(dx + q * n_cells + cells.j0, rows[t], cells.size(), db + q * n_cells + cells.j0, g);
  };
  // dx = DX . W_in^T for the rows r0 .. r1-1 of every frame and the columns of `cols` (W_inT: those columns packed),
  // 0 where DX is 0 (after rows[t]); with `whole` (r0 = 0, r1 = B), the product runs over all rows as one block (tiles
  // of 8 rows rather than of a frame's few) before the rows after rows[t] are zeroed.
  auto input_grads = [&](int64_t r0, int64_t r1, const std::vector<int64_t>& rows, const LstmSpan& cols,
                         const LstmPanels& W_inT, bool whole) {
    LstmRowBlocks rb{r1 - r0, T, g, n_batch * g, n_in, n_batch * n_in};
    rb.rows = rows.data();
    lstm_packed_gemm_blocks(DXd + r0 * g, W_inT, Dx + r0 * n_in + cols.j0,
                            whole ? LstmRowBlocks{T * n_batch, 1, g, 0, n_in, 0} : rb, nullptr, true);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = r0 + rows[t]; r < r1; ++r)
        std::fill(Dx + (t * n_batch + r) * n_in + cols.j0, Dx + (t * n_batch + r) * n_in + cols.j1, Float(0));
  };
  if (const int cell_parts = lstm_cpu_cell_parts(n_batch, n_cells, fr.count)) {
    const int parts = cell_parts;
    // The cell split (few rows): part p fills its share of P's rows, then, frame by frame, the backward of its cells
    // for every row and, after the parts have met, their columns of dL/dy_prev += DX[t] . W^T; then its columns of
    // dx = DX . W_in^T (the layer) and of the weight gradients.  Db: its gate columns' sums over all rows.
    std::vector<int64_t> rows(T, 0);  // per frame, the rows up to the last valid one (0: frame not visited)
    for (int64_t k = 0; k < fr.count; ++k) rows[fr.at(k)] = lstm_rows_to_last_valid(mask + fr.at(k) * n_batch, n_batch);
    std::vector<double> db(layer ? g : 0, 0.0);
    std::vector<int64_t> packed_at(parts + 1, 0);
    for (int p = 0; p < parts; ++p)
      packed_at[p + 1] = packed_at[p] + lstm_packed_size(g, lstm_span_of(p, parts, n_cells).size()) +
                         lstm_packed_size(g, lstm_span_of(p, parts, n_in).size());
    LstmBuffer packed(packed_at[parts]), work(lstm_weight_grad_work(ld, g, parts));
    lstm_cpu_team(parts, [&](int p, LstmBarrier& barrier) {
      put_rows(p * n_batch / parts, (p + 1) * n_batch / parts);
      const LstmSpan cells = lstm_span_of(p, parts, n_cells), cols = lstm_span_of(p, parts, n_in);
      Float* mine = packed.data() + packed_at[p];
      lstm_pack_to(mine, Wd + cells.j0 * g, true, g, cells.size());  // (W's rows j0 .. j1-1)^T
      bool solo = false;  // part 0 computes every part's cells (LstmBarrier::wait), the others have left
      for (int64_t k = fr.count - 1; k >= 0; --k) {
        const int64_t t = fr.at(k);
        lstm_team_shares(p, parts, solo, [&](int q) {
          frame_cells(k, 0, n_batch, rows, lstm_span_of(q, parts, n_cells), layer ? db.data() : nullptr);
        });
        if (!solo && (solo = barrier.wait(p)) && p > 0) break;
        lstm_team_shares(p, parts, solo, [&](int q) {
          const LstmSpan span = lstm_span_of(q, parts, n_cells);
          lstm_packed_gemm(data_ptr(DX, t), g, LstmPanels{packed.data() + packed_at[q], g, span.size()},
                           Dy0d + span.j0, n_cells, rows[t]);
        });
      }
      if (solo) barrier.wait(p);  // the parts that left wait for the recurrence's DX
      if (layer && cols.size() > 0)
        input_grads(0, n_batch, rows, cols,
                    lstm_pack_to(mine + lstm_packed_size(g, cells.size()), W_in + cols.j0 * g, true, g, cols.size()),
                    true);
      // [DW_in; DW] = P^T . DX: P and DX are complete (every part has passed the last frame's meeting)
      lstm_weight_grad_part(p, parts, nullptr, 0, DXd, g, T * n_batch, ld, g, DW_in, n_in, Ndarray_DEV_DATA(DW),
                            work.data(), true, P.data, &keep);
    });
    if (layer) lstm_sum_parts(db, 1, g, db_out);
  } else {
    LstmPacked packed_WT = lstm_pack(Wd, true, g, n_cells);
    LstmPacked packed_W_inT = layer ? lstm_pack(W_in, true, g, n_in) : LstmPacked();
    // As forward, the parts are balanced by the rows' valid frames, and the products skip a part's rows after the
    // last valid one of a frame: their gradients to the pre-activations are 0 (lstm_cell_backward<false>).  Db: each
    // part sums its rows' DX columns in double, frame by frame while they are in its cache; the parts' sums are added
    // in part order (the same result for a given thread count and mask).
    const int parts = lstm_cpu_parts(n_batch, n_cells, fr.count);
    std::vector<double> db_parts(layer ? parts * g : 0, 0.0);
    lstm_cpu_row_parts_by_work(lstm_valid_frames(mask, fr, n_batch), parts, [&](int p, int64_t r0, int64_t r1) {
      put_rows(r0, r1);
      std::vector<int64_t> rows(T, 0);  // per frame, the part's rows up to its last valid one (0: frame not visited)
      for (int64_t k = fr.count - 1; k >= 0; --k) {
        const int64_t t = fr.at(k);
        rows[t] = lstm_rows_to_last_valid(mask + t * n_batch + r0, r1 - r0);
        frame_cells(k, r0, r1, rows, LstmSpan{0, n_cells}, layer ? db_parts.data() + p * g : nullptr);
        lstm_packed_gemm(data_ptr(DX, t) + r0 * g, g, packed_WT, Dy0d + r0 * n_cells, n_cells, rows[t]);
      }
      if (layer) input_grads(r0, r1, rows, LstmSpan{0, n_in}, packed_W_inT, false);
    }, ptn::PartsOn::own_threads);
    if (layer) lstm_sum_parts(db_parts, parts, g, db_out);
    // [DW_in; DW] = P^T . DX over the valid rows of all frames, the columns split over the parts: each element is the
    // same sum whatever the thread count.
    lstm_weight_grad(nullptr, 0, DXd, g, T * n_batch, ld, g, DW_in, n_in, Ndarray_DEV_DATA(DW), parts,
                     LstmBuffer(lstm_weight_grad_work(ld, g, parts)).data(), true, P.data, &keep);
  }
#endif
  HANDLE_LAST_ERROR();
}

// inputs: W, y0, c0, i, start, step, Y, C, H, DY, DC, Dd; outputs: DX [H's buffer], DW, Dy0, Dc0.
static void native_lstm2_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 12);
  assert_cmp(n_outputs, ==, 4);
  lstm2_backward(inputs, outputs, nullptr);
}

// x (T, B, n_in) and W_in (n_in, 4n) of NativeLstm2Layer against the gates buffer H (T, B, 4n).
static void check_lstm2_layer_shapes(Ndarray* x, Ndarray* W_in, Ndarray* H) {
  ptn::require_dim(x, "x", 0, Ndarray_DIMS(H)[0], "T (i.shape[0])");
  ptn::require_dim(x, "x", 1, Ndarray_DIMS(H)[1], "B (i.shape[1])");
  ptn::require_dim(W_in, "W_in", 0, Ndarray_DIMS(x)[2], "n_in (x.shape[2])");
  ptn::require_dim(W_in, "W_in", 1, Ndarray_DIMS(H)[2], "4 * n (n = y0.shape[1])");
}

// inputs: x (T,B,n_in), W_in (n_in,4n), W (n,4n), b (4n), y0, c0 (B,n), i (T,B), start, step;
// outputs: Y, C (T,B,n), H (T,B,4n), d (B,n).  H = x . W_in, then NativeLstm2's pass with the bias.
static void native_lstm2_layer_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 9);
  assert_cmp(n_outputs, ==, 4);
  Ndarray *x = inputs[0], *W_in = inputs[1], *H = *outputs[2];
  check_lstm2_shapes(H, inputs[2], inputs[4], inputs[5], inputs[6]);
  check_lstm2_layer_shapes(x, W_in, H);
  Ndarray* in[6] = {inputs[2], inputs[4], inputs[5], inputs[6], inputs[7], inputs[8]};
  const Lstm2Input proj = {x, W_in};
  lstm2_forward(in, inputs[3], &proj, outputs);
}

// inputs: x, W_in, W, y0, c0, i, start, step, Y, C, H, DY, DC, Dd;
// outputs: Dx, DW_in, DW, Db, Dy0, Dc0, DX [H's buffer, scratch].
static void native_lstm2_layer_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 14);
  assert_cmp(n_outputs, ==, 7);
  Ndarray *x = inputs[0], *W_in = inputs[1];
  check_lstm2_shapes(inputs[10], inputs[2], inputs[3], inputs[4], inputs[5]);
  check_lstm2_layer_shapes(x, W_in, inputs[10]);
  Lstm2LayerGrads layer = {x, W_in, *outputs[0], *outputs[1], *outputs[3]};
  Ndarray** out[4] = {outputs[6], outputs[2], outputs[4], outputs[5]};
  lstm2_backward(inputs + 2, out, &layer);
}
