// LstmLowMem: an LSTM with the input projection fused in, storing only Y and C; the backward pass recomputes
// the gates.
#include "../dialect/kernel.h"
#include "lstm_common.h"
#include "lstm_packed.h"

// h (B, 4n): a frame's pre-activations [X[t], y_prev] . W + b.
LSTM_WIDE_LOOPS
DEF_KERNEL void lowmem_fw_frame(const Float* __restrict__ h, const Float* __restrict__ mask,
                                const Float* __restrict__ c_prev, Float* __restrict__ y, Float* __restrict__ c,
                                int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    const Float* g = h + b * 4 * n_cells + j;
    int64_t idx = b * n_cells + j;
    Float m = mask[b];
    LstmGates q = lstm_gates(g[0], g[n_cells], g[2 * n_cells], g[3 * n_cells]);
    Float cp = c_prev[idx];
    Float cv = lstm_blend(m, cp * q.fg + q.a * q.ig, cp);
    c[idx] = cv;
    y[idx] = lstm_masked(m, lstm_tanh(cv) * q.og);
  }
}

// Backward through one frame.  h (B, 4n): the frame's pre-activations (bias included); dgd receives dL/d(them) (a
// buffer of its own: g++ vectorises nothing when the gradients overwrite the pre-activations in place).  dh:
// dL/dY[t] from the next frame's recurrence; dc: dL/dC[t] on entry, dL/dc_prev on exit.  db (CUDA only)
// accumulates dgd's column sums (the CPU's parts sum them per part).  One cell, mask value m:
template <bool kValid>
DEV_FUNC inline void lowmem_bw_cell(int64_t b, int64_t j, Float m, const Float* __restrict__ h,
                                    const Float* __restrict__ c, const Float* __restrict__ c_prev,
                                    const Float* __restrict__ dY, const Float* __restrict__ dC,
                                    const Float* __restrict__ dh, Float* __restrict__ dc, Float* __restrict__ dgd,
                                    Float* __restrict__ db, int64_t n_cells) {
  const Float* g = h + b * 4 * n_cells + j;
  Float* d = dgd + b * 4 * n_cells + j;
  int64_t idx = b * n_cells + j;
  LstmGates q = lstm_gates(g[0], g[n_cells], g[2 * n_cells], g[3 * n_cells]);
  Float dct = lstm_cell_backward<kValid>(m, q, lstm_tanh(c[idx]), c_prev[idx], dY[idx] + dh[idx], dc[idx] + dC[idx],
                                         d, n_cells);
#if CUDA
  for (int k = 0; k < 4; ++k) elem_atomic_add(&db[k * n_cells + j], d[k * n_cells]);
#endif
  dc[idx] = lstm_carry_grad_by<kValid>(m, dct, q.fg);
}

#if !CUDA
__attribute__((noinline))  // inlined into the row parts' loop, its restrict pointers meant nothing and no loop vectorised
#endif
LSTM_WIDE_LOOPS
DEF_KERNEL void lowmem_bw_frame(const Float* __restrict__ h, const Float* __restrict__ mask,
                                const Float* __restrict__ c, const Float* __restrict__ c_prev,
                                const Float* __restrict__ dY, const Float* __restrict__ dC,
                                const Float* __restrict__ dh, Float* __restrict__ dc, Float* __restrict__ dgd,
                                Float* __restrict__ db, int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ_BY_MASK(mask, n_batch, n_cells, lowmem_bw_cell, h, c, c_prev, dY, dC, dh, dc, dgd, db, n_cells);
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
// gd = X[t] . W_x + b + y_prev . W_h  (W_x = W[:n_in], W_h = W[n_in:], both contiguous row blocks), the order of
// the CPU's packed products
static void lowmem_gates_in(Ndarray* X, Ndarray* W, const Float* bias, int64_t t, const Float* y_prev, Float* gd,
                            int64_t n_batch, int64_t n_in, int64_t n_cells) {
  const Float* Wd = Ndarray_DEV_DATA(W);
  lstm_gemm(data_ptr(X, t), false, Wd, false, gd, n_batch, 4 * n_cells, n_in, 0.0);
  start_dev_kernel(lstm_add_bias, (gd, bias, n_batch, 4 * n_cells));
  lstm_gemm(y_prev, false, Wd + n_in * 4 * n_cells, false, gd, n_batch, 4 * n_cells, n_cells, 1.0);
}
#else
// On the CPU the batch rows are split over threads (lstm_cpu_rows' parts) for the whole recurrence, and each part
// works through the visited frames in chunks of about LOWMEM_CHUNK_ROWS batch rows (of all parts together):
//   forward, per chunk: the part's X rows . W_x + b for all the chunk's frames as one packed product, then frame by
//   frame + y_prev . W_h (packed) and the activations;
//   backward, per chunk: the same gates again for all its frames at once ([X | y_prev] are all known then; the
//   same packed products, so the same bits as forward), then frame by frame the cell backward, the bias gradient
//   (in double, per part), dL/dy_prev = G . W_h^T and dL/dX[t] = G . W_x^T (packed), where G are the frame's
//   pre-activation gradients, and [DW_x; DW_h] += [X | Yp]^T . G over the chunk's rows (packed, see below).
// What is stored: Y and C (the outputs); the scratch is one chunk of [X | Yp], of the pre-activations and of G
// (LOWMEM_CHUNK_ROWS x (n_in + 9n) values; forward: n_in + 4n) and the packed weights (forward W, backward W and
// W^T), whatever T, and (backward) each further thread's own [DW_x; DW_h] when that is no larger.  Neither pass calls
// BLAS; each joins its threads once (the backward twice per chunk where the threads' own DW would not fit).
constexpr int64_t LOWMEM_CHUNK_ROWS = 768;

struct LowmemChunk {
  int64_t k0, k1, rows;  // visited frames k0 .. k1-1 (in visit order), (k1 - k0) * B rows
};

// Frames per chunk: at most LOWMEM_CHUNK_ROWS / B (at least 1), the chunks as equal as that allows.
static int64_t lowmem_frames_per_chunk(const LstmCall& c) {
  int64_t most = std::max<int64_t>(1, LOWMEM_CHUNK_ROWS / std::max<int64_t>(c.n_batch, 1));
  int64_t chunks = std::max<int64_t>(1, (c.fr.count + most - 1) / most);
  return std::max<int64_t>(1, (c.fr.count + chunks - 1) / chunks);
}

static LowmemChunk lowmem_chunk(const LstmCall& c, int64_t k0) {
  int64_t k1 = std::min(k0 + lowmem_frames_per_chunk(c), c.fr.count);
  return {k0, k1, (k1 - k0) * c.n_batch};
}

// A part's rows r0 .. r1-1 of the chunk's buffers: frame k's rows at (k - k0) * (r1 - r0), the parts one after the
// other ((k1 - k0) * r0 rows before part r0's), so that the whole chunk is one matrix for the weight gradient.
static int64_t lowmem_part_row(const LowmemChunk& ch, int64_t r0) { return (ch.k1 - ch.k0) * r0; }

// h (the part's rows of the chunk's frames, laid out as lowmem_part_row says, rows 4n apart) = X[t] . W_x + b, X read
// in place: a masked row's pre-activations (NaN on padding included) reach nothing, as the cells select.
static void lowmem_input_products(Ndarray* X, const LstmCall& c, const LowmemChunk& ch, int64_t r0, int64_t r1,
                                  const LstmPacked& Wx, const Float* bias, Float* h) {
  const int64_t n_in = Ndarray_DIMS(X)[2], nr = r1 - r0, g = 4 * c.n_cells;
  lstm_packed_gemm_blocks(data_ptr(X, c.fr.at(ch.k0)) + r0 * n_in, Wx, h,
                          LstmRowBlocks{nr, ch.k1 - ch.k0, n_in, c.fr.step * c.n_batch * n_in, g, nr * g}, bias, true);
}

// The part's rows of [X[t] | y_prev] for the chunk's frames into the weight gradient's packed layout, from row `row0`
// (laid out as lowmem_part_row says): X[t] with the masked rows zeroed (a NaN on padding reaches no weight
// gradient), then the frame's recurrent input (y0 at the first visited frame, else Y at the one before).
static void lowmem_put_rows(Ndarray* X, Ndarray* i, Ndarray* Y, Ndarray* y0, const LstmCall& c, const LowmemChunk& ch,
                            int64_t r0, int64_t r1, const LstmTnRows& P, int64_t row0) {
  const int64_t n_in = Ndarray_DIMS(X)[2], nr = r1 - r0;
  const Float* mask = Ndarray_DEV_DATA(i);
  for (int64_t k = ch.k0; k < ch.k1; ++k) {
    const int64_t t = c.fr.at(k);
    const Float* yp = (k > 0 ? data_ptr(Y, t - c.fr.step) : Ndarray_DEV_DATA(y0)) + r0 * c.n_cells;
    for (int64_t r = 0; r < nr; ++r)
      P.put(row0 + (k - ch.k0) * nr + r,
            mask[t * c.n_batch + r0 + r] != Float(0) ? data_ptr(X, t) + (r0 + r) * n_in : nullptr, n_in,
            yp + r * c.n_cells);
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
  auto y_prev_at = [&](int64_t k) { return k > 0 ? data_ptr(Y, fr.at(k) - fr.step) : Ndarray_DEV_DATA(y0); };
  auto c_prev_at = [&](int64_t k) { return k > 0 ? data_ptr(C, fr.at(k) - fr.step) : Ndarray_DEV_DATA(c0); };
  const std::vector<char> visited = lstm_visited(fr, Ndarray_DIMS(i)[0]);  // every output is written in full
  lstm_zero_unvisited(visited, Y);
  lstm_zero_unvisited(visited, C);
#if CUDA
  Float* gd = scratch.get<Float>(4 * call.frame);
  for (int64_t k = 0; k < fr.count; ++k) {
    int64_t t = fr.at(k);
    lowmem_gates_in(X, W, bias, t, y_prev_at(k), gd, n_batch, n_in, n_cells);
    start_dev_kernel(lowmem_fw_frame, (gd, mask + t * n_batch, c_prev_at(k), data_ptr(Y, t), data_ptr(C, t), n_batch,
                                       n_cells));
  }
#else
  if (fr.count > 0) {
    const int64_t per_chunk = lowmem_frames_per_chunk(call), chunk_rows = per_chunk * n_batch;
    Float* gates = scratch.get<Float>(chunk_rows * g);
    const LstmPacked packed_Wx = lstm_pack(Wd, false, n_in, g), packed_Wh = lstm_pack(Wd + n_in * g, false, n_cells, g);
    lstm_cpu_rows(n_batch, n_cells, fr.count, [&](int64_t r0, int64_t r1) {
      const int64_t nr = r1 - r0, at = r0 * n_cells;
      // the parts do not wait for each other between chunks: each keeps the same rows of the buffers in every
      // chunk (per_chunk frames' worth), also where the last chunk is shorter
      Float* gp = gates + per_chunk * r0 * g;
      for (int64_t k0 = 0; k0 < fr.count; k0 += per_chunk) {
        LowmemChunk ch = lowmem_chunk(call, k0);
        lowmem_input_products(X, call, ch, r0, r1, packed_Wx, bias, gp);  // X[t] . W_x + b
        for (int64_t k = ch.k0; k < ch.k1; ++k) {
          int64_t t = fr.at(k);
          Float* h = gp + (k - ch.k0) * nr * g;
          lstm_packed_gemm(y_prev_at(k) + at, n_cells, packed_Wh, h, g, nr);
          lowmem_fw_frame(h, mask + t * n_batch + r0, c_prev_at(k) + at, data_ptr(Y, t) + at, data_ptr(C, t) + at, nr,
                          n_cells);
        }
      }
    }, ptn::PartsOn::own_threads);
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
  // Every output is written in full (the glue does not zero them): DX's frames not visited are zeroed here.
  lstm_zero_unvisited(lstm_visited(fr, Ndarray_DIMS(i)[0]), DX);
  Float* dh = Ndarray_DEV_DATA(Dy0);  // dL/dY[t] through the next frame's recurrence; dL/dy0 at the end
  Ndarray_memset(dh, 0, call.frame * sizeof(Float));
  if (fr.count == 0) {  // no frame: W, b and y0 get no gradient
    Ndarray_set_zero(DW);
    Ndarray_set_zero(Db);
    return;
  }
  const Float *bias = Ndarray_DEV_DATA(b), *mask = Ndarray_DEV_DATA(i), *Wd = Ndarray_DEV_DATA(W);
  Float *DWd = Ndarray_DEV_DATA(DW), *dbd = Ndarray_DEV_DATA(Db);
  Float* dc = Ndarray_DEV_DATA(Dc0);
  ptn::Scratch scratch;
  auto c_prev_at = [&](int64_t k) { return k > 0 ? data_ptr(C, fr.at(k) - fr.step) : Ndarray_DEV_DATA(c0); };
#if CUDA
  Ndarray_set_zero(DW);  // both summed over the frames below
  Ndarray_set_zero(Db);
  Float* h = scratch.get<Float>(4 * call.frame);
  Float* gd = scratch.get<Float>(4 * call.frame);
  Float* x_valid = scratch.get<Float>(n_batch * n_in);  // X[t] without its padded rows (a NaN there stays there)
  for (int64_t k = fr.count - 1; k >= 0; --k) {
    int64_t t = fr.at(k);
    const Float* y_prev = k > 0 ? data_ptr(Y, t - fr.step) : Ndarray_DEV_DATA(y0);
    lowmem_gates_in(X, W, bias, t, y_prev, h, n_batch, n_in, n_cells);
    start_dev_kernel(lowmem_bw_frame, (h, mask + t * n_batch, data_ptr(C, t), c_prev_at(k), data_ptr(DY, t),
                                       data_ptr(DC, t), dh, dc, gd, dbd, n_batch, n_cells));
    start_dev_kernel(lstm_rows_to, (data_ptr(X, t), mask + t * n_batch, x_valid, n_batch, n_in, n_in));
    lstm_gemm(gd, false, Wd, true, data_ptr(DX, t), n_batch, n_in, g, 0.0);
    lstm_gemm(x_valid, true, gd, false, DWd, n_in, g, n_batch, 1.0);
    lstm_gemm(y_prev, true, gd, false, DWd + n_in * g, n_cells, g, n_batch, 1.0);
    lstm_gemm(gd, false, Wd + n_in * g, true, dh, n_batch, n_cells, g, 0.0);
  }
#else
  const int64_t ld = n_in + n_cells, chunk_rows = lowmem_frames_per_chunk(call) * n_batch;
  const int64_t ldp = LstmTnRows::size(1, ld);  // values per row of P
  Float* P = scratch.get<Float>(chunk_rows * ldp);  // the chunk's [X[t] | y_prev] rows, packed (LstmTnRows)
  Float* H = scratch.get<Float>(chunk_rows * g);   // their pre-activations
  Float* G = scratch.get<Float>(chunk_rows * g);   // the gradients of those
  const LstmPacked packed_Wx = lstm_pack(Wd, false, n_in, g), packed_Wh = lstm_pack(Wd + n_in * g, false, n_cells, g);
  const LstmPacked packed_WxT = lstm_pack(Wd, true, g, n_in), packed_WhT = lstm_pack(Wd + n_in * g, true, g, n_cells);
  const int parts = lstm_cpu_parts(n_batch, n_cells, fr.count);
  std::vector<double> db_parts(parts * g, 0.0);
  const int64_t per_chunk = lowmem_frames_per_chunk(call);
  // the chunk's gates, exactly as in the forward pass (the same bits: each element is summed in the same order), then
  // its frames backward; the part's rows of [X | y_prev] into pp from row row0
  auto chunk_backward = [&](const LowmemChunk& ch, int p, int64_t r0, int64_t r1, const LstmTnRows& pp, int64_t row0,
                            Float* hp, Float* gp) {
    const int64_t nr = r1 - r0, at = r0 * n_cells;
    lowmem_put_rows(X, i, Y, y0, call, ch, r0, r1, pp, row0);
    lowmem_input_products(X, call, ch, r0, r1, packed_Wx, bias, hp);
    int64_t kf = ch.k0;  // + y_prev . W_h: y0 at the first visited frame, else Y at the frame before
    if (kf == 0) {
      lstm_packed_gemm(Ndarray_DEV_DATA(y0) + at, n_cells, packed_Wh, hp, g, nr);
      ++kf;
    }
    if (kf < ch.k1)
      lstm_packed_gemm_blocks(data_ptr(Y, fr.at(kf) - fr.step) + at, packed_Wh, hp + (kf - ch.k0) * nr * g,
                              LstmRowBlocks{nr, ch.k1 - kf, n_cells, fr.step * n_batch * n_cells, g, nr * g});
    for (int64_t k = ch.k1 - 1; k >= ch.k0; --k) {
      int64_t t = fr.at(k), f = (k - ch.k0) * nr * g;
      lowmem_bw_frame(hp + f, mask + t * n_batch + r0, data_ptr(C, t) + at, c_prev_at(k) + at, data_ptr(DY, t) + at,
                      data_ptr(DC, t) + at, dh + at, dc + at, gp + f, nullptr, nr, n_cells);
      lstm_add_rows(gp + f, nr, g, db_parts.data() + p * g);
      lstm_packed_gemm(gp + f, g, packed_WhT, dh + at, n_cells, nr, nullptr, true);  // dL/dY[t_prev] = G . W_h^T
    }
    // dL/dX[t] = G . W_x^T for all the chunk's frames at once (per frame, W_x^T and W_h^T together did not stay in L2)
    lstm_packed_gemm_blocks(gp, packed_WxT, data_ptr(DX, fr.at(ch.k0)) + r0 * n_in,
                            LstmRowBlocks{nr, ch.k1 - ch.k0, g, nr * g, n_in, fr.step * n_batch * n_in}, nullptr, true);
  };
  // The weight gradient: where the parts' own matrices take no more than the chunk buffers, each part adds its rows'
  // [X | Yp]^T . G of every chunk into its own (part 0 into DW), and they are added in part order after the one join
  // (the threads never wait between chunks; the same result for a given thread count); else after each chunk's join
  // one product over the chunk's rows, its columns split over the threads.
  if ((parts - 1) * ld * g <= chunk_rows * (ld + 2 * g)) {
    LstmBuffer dw_buffer((parts - 1) * ld * g), work_buffer(parts * lstm_gemm_tn_work(ld, g));
    Float *dw_parts = dw_buffer.data(), *work = work_buffer.data();
    lstm_cpu_row_parts(n_batch, parts, [&](int p, int64_t r0, int64_t r1) {
      Float *hp = H + per_chunk * r0 * g, *gp = G + per_chunk * r0 * g;
      Float* dw = p == 0 ? DWd : dw_parts + (p - 1) * ld * g;
      const int64_t last = (fr.count - 1) / per_chunk * per_chunk;
      for (int64_t k0 = last; k0 >= 0; k0 -= per_chunk) {
        LowmemChunk ch = lowmem_chunk(call, k0);
        const int64_t rows = (ch.k1 - ch.k0) * (r1 - r0);
        const LstmTnRows pp(P + per_chunk * r0 * ldp, rows, ld);
        chunk_backward(ch, p, r0, r1, pp, 0, hp, gp);
        lstm_gemm_tn_blocks(nullptr, gp, LstmRowBlocks{rows, 1, 0, 0, g, 0}, ld, g, dw, ld, nullptr, g,
                            work + p * lstm_gemm_tn_work(ld, g), k0 == last, pp.data);  // the first chunk: dw =
      }
    }, ptn::PartsOn::own_threads);
    if (parts > 1)  // the parts' own DW added in part order, the rows of DW split over the threads (no DAZ here)
      ptn::parallel_parts(parts, [&](int q) {
        const int64_t e0 = q * ld / parts * g, e1 = (q + 1) * ld / parts * g;
        for (int p = 1; p < parts; ++p)
          for (int64_t e = e0; e < e1; ++e) DWd[e] += dw_parts[(p - 1) * ld * g + e];
      }, ptn::PartsOn::own_threads);
  } else {
    LstmBuffer work_buffer(lstm_weight_grad_work(ld, g, parts));
    Float* work = work_buffer.data();
    const int64_t last = (fr.count - 1) / per_chunk * per_chunk;
    for (int64_t k0 = last; k0 >= 0; k0 -= per_chunk) {
      LowmemChunk ch = lowmem_chunk(call, k0);
      const LstmTnRows pc(P, ch.rows, ld);
      lstm_cpu_row_parts(n_batch, parts, [&](int p, int64_t r0, int64_t r1) {
        const int64_t row = lowmem_part_row(ch, r0);
        chunk_backward(ch, p, r0, r1, pc, row, H + row * g, G + row * g);
      }, ptn::PartsOn::own_threads);
      // [DW_x; DW_h] (+)= [X | Yp]^T . G (the first chunk overwrites)
      lstm_weight_grad(nullptr, 0, G, g, ch.rows, ld, g, DWd, ld, nullptr, parts, work, k0 == last, pc.data);
    }
  }
  lstm_sum_parts(db_parts, parts, g, dbd);
#endif
  HANDLE_LAST_ERROR();
}
