// LstmLowMem: an LSTM with the input projection fused in, storing only Y and C; the backward pass recomputes
// the gates.
#include "lstm_common.h"
#include "lstm_packed.h"

// The gates of one cell from g = &intern[b, j] (its cell-input pre-activation, without the bias) and bias_j =
// &bias[j]; the blocks are n apart in both.
DEV_FUNC inline LstmGates lowmem_gates(const Float* g, const Float* bias_j, int64_t n) {
  return lstm_gates(g[0] + bias_j[0], g[n] + bias_j[n], g[2 * n] + bias_j[2 * n], g[3 * n] + bias_j[3 * n]);
}

// intern (B, 4n): X[t] . W_x + y_prev . W_h, without the bias.
DEF_KERNEL void lowmem_fw_frame(const Float* __restrict__ intern, const Float* __restrict__ bias,
                                const Float* __restrict__ mask, const Float* __restrict__ c_prev, Float* __restrict__ y,
                                Float* __restrict__ c, int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    const Float* g = intern + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    LstmGates q = lowmem_gates(g, bias + j, n_cells);
    Float cp = c_prev[idx];
    Float cv = lstm_blend(m, cp * q.fg + q.a * q.ig, cp);
    c[idx] = cv;
    y[idx] = lstm_masked(m, lstm_tanh(cv) * q.og);
  }
}

// Backward through one frame.  dh: dL/dY[t] from the next frame's recurrence; dc: dL/dC[t] on entry,
// dL/dc_prev on exit.  dintern: dL/d(pre-activations); db accumulates its column sums (on CUDA; the CPU sums
// dintern's columns per chunk).  One cell, mask value m:
template <bool kValid>
DEV_FUNC inline void lowmem_bw_cell(int64_t b, int64_t j, Float m, const Float* __restrict__ intern,
                                    const Float* __restrict__ bias, const Float* __restrict__ c,
                                    const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                                    const Float* __restrict__ dC, const Float* __restrict__ dh, Float* __restrict__ dc,
                                    Float* __restrict__ dintern, Float* __restrict__ db, int64_t n_cells) {
  const Float* g = intern + b * 4 * n_cells + j;
  Float* d = dintern + b * 4 * n_cells + j;
  int64_t idx = b * n_cells + j;
  LstmGates q = lowmem_gates(g, bias + j, n_cells);
  Float dct = lstm_cell_backward<kValid>(m, q, lstm_tanh(c[idx]), c_prev[idx], dY[idx] + dh[idx], dc[idx] + dC[idx],
                                         d, n_cells);
#if CUDA
  for (int k = 0; k < 4; ++k) elem_atomic_add(&db[k * n_cells + j], d[k * n_cells]);
#endif
  dc[idx] = lstm_carry_grad_by<kValid>(m, dct, q.fg);
}

DEF_KERNEL void lowmem_bw_frame(const Float* __restrict__ intern, const Float* __restrict__ bias,
                                const Float* __restrict__ mask, const Float* __restrict__ c,
                                const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                                const Float* __restrict__ dC, const Float* __restrict__ dh, Float* __restrict__ dc,
                                Float* __restrict__ dintern, Float* __restrict__ db, int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ_BY_MASK(mask, n_batch, n_cells, lowmem_bw_cell, intern, bias, c, c_prev, dY, dC, dh, dc, dintern, db,
                      n_cells);
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

