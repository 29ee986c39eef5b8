// LstmLowMem: an LSTM with the input projection fused in, storing only Y and C; the backward pass recomputes
// the gates.
#include "../dialect/kernel.h"
#include "lstm_common.h"
#include "lstm_packed.h"
#include "lstm_team.h"

// One cell of a visited frame, mask value m: g points at its cell-input pre-activation ([X[t], y_prev] . W + b; the
// other gates n_cells, 2 n_cells and 3 n_cells after it); k is its index in the (B, n) arrays.
DEV_FUNC inline void lowmem_fw_cell(const Float* g, int64_t n_cells, Float m, int64_t k, const Float* c_prev, Float* y,
                                    Float* c) {
  LstmGates q = lstm_gates(g[0], g[n_cells], g[2 * n_cells], g[3 * n_cells]);
  Float cp = c_prev[k];
  Float cv = lstm_blend(m, cp * q.fg + q.a * q.ig, cp);
  c[k] = cv;
  y[k] = lstm_masked(m, lstm_tanh(cv) * q.og);
}

#if CUDA
// h (B, 4n): a frame's pre-activations.
DEF_KERNEL void lowmem_fw_frame(const Float* __restrict__ h, const Float* __restrict__ mask,
                                const Float* __restrict__ c_prev, Float* __restrict__ y, Float* __restrict__ c,
                                int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ(b, j, n_batch, n_cells) {
    lowmem_fw_cell(h + b * 4 * n_cells + j, n_cells, mask[b], b * n_cells + j, c_prev, y, c);
  }
}
#else
// The CPU's cells [j0, j1) of n_batch rows of a frame (the row parts: all of them; the cell split: a part's), h (B, 4n)
// its pre-activations.  Not inlined (as lstm.cu's lstm2_fw_cells: inlined, its restrict pointers meant nothing).
LSTM_WIDE_LOOPS __attribute__((noinline))
static void lowmem_fw_cells(const Float* __restrict__ h, const Float* __restrict__ mask,
                            const Float* __restrict__ c_prev, Float* __restrict__ y, Float* __restrict__ c,
                            int64_t n_batch, int64_t n_cells, int64_t j0, int64_t j1) {
  for (int64_t b = 0; b < n_batch; ++b)
    for (int64_t j = j0; j < j1; ++j)
      lowmem_fw_cell(h + b * 4 * n_cells + j, n_cells, mask[b], b * n_cells + j, c_prev, y, c);
}
#endif

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

#if CUDA
DEF_KERNEL void lowmem_bw_frame(const Float* __restrict__ h, const Float* __restrict__ mask,
                                const Float* __restrict__ c, const Float* __restrict__ c_prev,
                                const Float* __restrict__ dY, const Float* __restrict__ dC,
                                const Float* __restrict__ dh, Float* __restrict__ dc, Float* __restrict__ dgd,
                                Float* __restrict__ db, int64_t n_batch, int64_t n_cells) {
  LSTM_FOR_BJ_BY_MASK(mask, n_batch, n_cells, lowmem_bw_cell, h, c, c_prev, dY, dC, dh, dc, dgd, db, n_cells);
}
#else
// The CPU's cells [j0, j1) of n_batch rows (as lowmem_fw_cells; not inlined either: inlined into the row parts' loop,
// its restrict pointers meant nothing and no loop vectorised).
LSTM_WIDE_LOOPS __attribute__((noinline))
static void lowmem_bw_cells(const Float* __restrict__ h, const Float* __restrict__ mask, const Float* __restrict__ c,
                            const Float* __restrict__ c_prev, const Float* __restrict__ dY,
                            const Float* __restrict__ dC, const Float* __restrict__ dh, Float* __restrict__ dc,
                            Float* __restrict__ dgd, int64_t n_batch, int64_t n_cells, int64_t j0, int64_t j1) {
  Float* no_db = nullptr;  // the CPU's parts sum the bias gradient themselves
  LSTM_FOR_BJ_BY_MASK_CELLS(mask, n_batch, j0, j1, lowmem_bw_cell, h, c, c_prev, dY, dC, dh, dc, dgd, no_db, n_cells);
}
#endif

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
// Where the row parts would have fewer than 6 rows (lstm_cpu_cell_parts), the threads split the cells instead (the
// cell split, lstm_team.h): the same products and passes, each part computing its cells' gate columns for every row
// and meeting the others once per frame; every element is the same sum as on one thread.
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

// A part's product with one block of W (W_x or W_h): C (+)= A . block over row blocks (lstm_packed_gemm_blocks'
// bias and overwrite), for all 4n gate columns (the row parts: the block packed whole) or for the gate columns of the
// part's cells (the cell split: the block's slices from lstm_pack_gates_to).  Each element is the same sum either way.
struct LowmemGemm {
  LstmPanels whole;
  LstmGatePanels slices;
  LstmSpan cells = {0, 0};
  int64_t n_cells = 0;  // 0: `whole`
  void operator()(const Float* A, Float* C, const LstmRowBlocks& rb, const Float* bias = nullptr,
                  bool overwrite = false) const {
    if (n_cells == 0) lstm_packed_gemm_blocks(A, whole, C, rb, bias, overwrite);
    else lstm_gates_gemm_blocks(A, slices, C, rb, n_cells, cells, bias, overwrite);
  }
};

static LowmemGemm lowmem_gemm_whole(const LstmPanels& P) {
  LowmemGemm m;
  m.whole = P;
  return m;
}

// Part q's slices of W (n_in + n, 4n) for the cell split: the gate columns of its cells (lstm_span_of) of W_x and W_h,
// and for the backward pass the columns of W_h^T of its cells (dL/dy_prev) and of W_x^T of its share of the n_in
// inputs (dL/dX).
struct LowmemSlices {
  LowmemGemm Wx, Wh;
  LstmPanels WhT, WxT;
  LstmSpan cells, cols;
};

// Every part's slices in one buffer (from the calling thread's pool), each part packing its own (of(p, W)).
class LowmemTeamSlices {
 public:
  LowmemTeamSlices(int parts, int64_t n_in, int64_t n_cells, bool backward)
      : parts_(parts), n_in_(n_in), n_cells_(n_cells), backward_(backward), at_(parts + 1, 0) {
    for (int q = 0; q < parts; ++q) {
      const LstmSpan cells = lstm_span_of(q, parts, n_cells), cols = lstm_span_of(q, parts, n_in);
      at_[q + 1] = at_[q] + lstm_gate_panels_size(n_in, cells) + lstm_gate_panels_size(n_cells, cells) +
                   (backward ? lstm_packed_size(4 * n_cells, cells.size()) + lstm_packed_size(4 * n_cells, cols.size())
                             : 0);
    }
    buffer_ = LstmBuffer(at_[parts]);
  }

  // Part q's slices (packed there from W first, with W).
  LowmemSlices of(int q, const Float* W = nullptr) {
    const int64_t n_in = n_in_, n_cells = n_cells_, g = 4 * n_cells;
    LowmemSlices s;
    s.cells = lstm_span_of(q, parts_, n_cells);
    s.cols = lstm_span_of(q, parts_, n_in);
    Float* wx = buffer_.data() + at_[q];
    Float* wh = wx + lstm_gate_panels_size(n_in, s.cells);
    if (W) {
      lstm_pack_gates_to(wx, W, n_in, n_cells, s.cells);
      lstm_pack_gates_to(wh, W + n_in * g, n_cells, n_cells, s.cells);
    }
    s.Wx.slices = lstm_gate_panels_at(wx, n_in, s.cells);
    s.Wh.slices = lstm_gate_panels_at(wh, n_cells, s.cells);
    s.Wx.cells = s.Wh.cells = s.cells;
    s.Wx.n_cells = s.Wh.n_cells = n_cells;
    if (backward_) {
      Float* wht = wh + lstm_gate_panels_size(n_cells, s.cells);
      Float* wxt = wht + lstm_packed_size(g, s.cells.size());
      if (W) {
        lstm_pack_to(wht, W + (n_in + s.cells.j0) * g, true, g, s.cells.size());  // (W_h's rows j0 .. j1-1)^T
        lstm_pack_to(wxt, W + s.cols.j0 * g, true, g, s.cols.size());
      }
      s.WhT = LstmPanels{wht, g, s.cells.size()};
      s.WxT = LstmPanels{wxt, g, s.cols.size()};
    }
    return s;
  }

 private:
  int parts_;
  int64_t n_in_, n_cells_;
  bool backward_;
  std::vector<int64_t> at_;  // part q's slices from at_[q]
  LstmBuffer buffer_;
};

// The row blocks of a product over `count` frames of nr rows each (A's frames a_step values apart, rows lda apart;
// C's likewise): one block of count * nr rows where both A's and C's frames follow each other in memory (step 1 and
// all B rows, e.g. the cell split's): its tiles then hold 8 rows rather than a frame's few (at B = 1 a tile of one
// row reads as many panel values as it adds products).  The same sums either way.
static LstmRowBlocks lowmem_blocks(int64_t nr, int64_t count, int64_t lda, int64_t a_step, int64_t ldc,
                                   int64_t c_step) {
  if (a_step == nr * lda && c_step == nr * ldc) return LstmRowBlocks{count * nr, 1, lda, 0, ldc, 0};
  return LstmRowBlocks{nr, count, lda, a_step, ldc, c_step};
}

// h (the part's rows of the chunk's frames, laid out as lowmem_part_row says, rows 4n apart) = X[t] . W_x + b, X read
// in place: a masked row's pre-activations (NaN on padding included) reach nothing, as the cells select.
static void lowmem_input_products(Ndarray* X, const LstmCall& c, const LowmemChunk& ch, int64_t r0, int64_t r1,
                                  const LowmemGemm& Wx, const Float* bias, Float* h) {
  const int64_t n_in = Ndarray_DIMS(X)[2], nr = r1 - r0, g = 4 * c.n_cells;
  Wx(data_ptr(X, c.fr.at(ch.k0)) + r0 * n_in, h,
     lowmem_blocks(nr, ch.k1 - ch.k0, n_in, c.fr.step * c.n_batch * n_in, g, nr * g), bias, true);
}

// The backward pass's h (as lowmem_input_products) += y_prev . W_h for all the chunk's frames at once (Y is known):
// y0 at the first visited frame, else Y at the frame before.
static void lowmem_recurrent_products(Ndarray* Y, Ndarray* y0, const LstmCall& c, const LowmemChunk& ch, int64_t r0,
                                      int64_t r1, const LowmemGemm& Wh, Float* h) {
  const int64_t nr = r1 - r0, at = r0 * c.n_cells, g = 4 * c.n_cells;
  int64_t kf = ch.k0;
  if (kf == 0) {
    Wh(Ndarray_DEV_DATA(y0) + at, h, LstmRowBlocks{nr, 1, c.n_cells, 0, g, 0});
    ++kf;
  }
  if (kf < ch.k1)
    Wh(data_ptr(Y, c.fr.at(kf) - c.fr.step) + at, h + (kf - ch.k0) * nr * g,
       lowmem_blocks(nr, ch.k1 - kf, c.n_cells, c.fr.step * c.n_batch * c.n_cells, g, nr * g));
}

// dL/dX[t] = G . W_x^T for the part's rows of all the chunk's frames at once (G laid out as lowmem_part_row says) and
// the columns col0 .. col0 + WxT.n - 1 (WxT: those columns of W_x^T packed).  Per frame, W_x^T and W_h^T together did
// not stay in L2.
static void lowmem_input_grads(Ndarray* DX, const LstmCall& c, const LowmemChunk& ch, int64_t r0, int64_t r1,
                               const Float* G, const LstmPanels& WxT, int64_t col0) {
  const int64_t n_in = Ndarray_DIMS(DX)[2], nr = r1 - r0, g = 4 * c.n_cells;
  lstm_packed_gemm_blocks(G, WxT, data_ptr(DX, c.fr.at(ch.k0)) + r0 * n_in + col0,
                          lowmem_blocks(nr, ch.k1 - ch.k0, g, nr * g, n_in, c.fr.step * c.n_batch * n_in), nullptr,
                          true);
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
  // Visited frame k's cells [j0, j1) of the rows r0 .. r1-1, h their pre-activations
  auto frame_cells = [&](int64_t k, int64_t r0, int64_t r1, const Float* h, const LstmSpan& cells) {
    const int64_t t = fr.at(k), at = r0 * n_cells;
    lowmem_fw_cells(h, mask + t * n_batch + r0, c_prev_at(k) + at, data_ptr(Y, t) + at, data_ptr(C, t) + at, r1 - r0,
                    n_cells, cells.j0, cells.j1);
  };
  const int64_t per_chunk = lowmem_frames_per_chunk(call);
  Float* gates = scratch.get<Float>(per_chunk * n_batch * g);  // one chunk's pre-activations
  if (const int parts = lstm_cpu_cell_parts(n_batch, n_cells, fr.count)) {
    // The cell split (few rows): part p computes the gate columns of its cells for every row, per chunk their
    // X[t] . W_x + b, then frame by frame their + y_prev . W_h and the cells; the parts meet after each frame (the next
    // product reads every cell of Y[t]).  A part reads and writes its own columns of the chunk's gates only.
    LowmemTeamSlices slices(parts, n_in, n_cells, false);
    lstm_cpu_team(parts, [&](int p, LstmBarrier& barrier) {
      slices.of(p, Wd);  // each part packs its own slices
      bool solo = false;  // part 0 computes every part's cells (LstmBarrier::wait), the others have left
      for (int64_t k0 = 0; k0 < fr.count; k0 += per_chunk) {
        const LowmemChunk ch = lowmem_chunk(call, k0);
        lstm_team_shares(p, parts, solo, [&](int q) {
          lowmem_input_products(X, call, ch, 0, n_batch, slices.of(q).Wx, bias, gates);
        });
        for (int64_t k = ch.k0; k < ch.k1; ++k) {
          Float* h = gates + (k - ch.k0) * n_batch * g;
          lstm_team_shares(p, parts, solo, [&](int q) {
            const LowmemSlices s = slices.of(q);
            s.Wh(y_prev_at(k), h, LstmRowBlocks{n_batch, 1, n_cells, 0, g, 0});
            frame_cells(k, 0, n_batch, h, s.cells);
          });
          if (!solo && (solo = barrier.wait(p)) && p > 0) return;
        }
      }
    });
  } else if (fr.count > 0) {
    const LstmPacked packed_Wx = lstm_pack(Wd, false, n_in, g), packed_Wh = lstm_pack(Wd + n_in * g, false, n_cells, g);
    lstm_cpu_rows(n_batch, n_cells, fr.count, [&](int64_t r0, int64_t r1) {
      const int64_t nr = r1 - r0, at = r0 * n_cells;
      // the parts do not wait for each other between chunks: each keeps the same rows of the buffers in every
      // chunk (per_chunk frames' worth), also where the last chunk is shorter
      Float* gp = gates + per_chunk * r0 * g;
      for (int64_t k0 = 0; k0 < fr.count; k0 += per_chunk) {
        LowmemChunk ch = lowmem_chunk(call, k0);
        lowmem_input_products(X, call, ch, r0, r1, lowmem_gemm_whole(packed_Wx), bias, gp);  // X[t] . W_x + b
        for (int64_t k = ch.k0; k < ch.k1; ++k) {
          Float* h = gp + (k - ch.k0) * nr * g;
          lstm_packed_gemm(y_prev_at(k) + at, n_cells, packed_Wh, h, g, nr);
          frame_cells(k, r0, r1, h, LstmSpan{0, n_cells});
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
  const int64_t ld = n_in + n_cells, per_chunk = lowmem_frames_per_chunk(call), chunk_rows = per_chunk * n_batch;
  const int64_t ldp = LstmTnRows::size(1, ld);  // values per row of P
  Float* P = scratch.get<Float>(chunk_rows * ldp);  // the chunk's [X[t] | y_prev] rows, packed (LstmTnRows)
  Float* H = scratch.get<Float>(chunk_rows * g);   // their pre-activations
  Float* G = scratch.get<Float>(chunk_rows * g);   // the gradients of those
  const int64_t last = (fr.count - 1) / per_chunk * per_chunk;  // the first visited frame of the last chunk
  // The chunk's gates of the rows r0 .. r1-1 (hp, laid out as lowmem_part_row says), exactly as in the forward pass
  // (the same bits: each element is summed in the same order): X[t] . W_x + b, + y_prev . W_h.
  auto chunk_gates = [&](const LowmemChunk& ch, int64_t r0, int64_t r1, const LowmemGemm& Wx, const LowmemGemm& Wh,
                         Float* hp) {
    lowmem_input_products(X, call, ch, r0, r1, Wx, bias, hp);
    lowmem_recurrent_products(Y, y0, call, ch, r0, r1, Wh, hp);
  };
  // Visited frame k's cells of `cells` for the rows r0 .. r1-1: G (gf) from their pre-activations (hf), dc and dh
  // (dL/dY[t] from the next frame's recurrence).
  auto frame_cells = [&](int64_t k, int64_t r0, int64_t r1, const Float* hf, Float* gf, const LstmSpan& cells) {
    const int64_t t = fr.at(k), at = r0 * n_cells;
    lowmem_bw_cells(hf, mask + t * n_batch + r0, data_ptr(C, t) + at, c_prev_at(k) + at, data_ptr(DY, t) + at,
                    data_ptr(DC, t) + at, dh + at, dc + at, gf, r1 - r0, n_cells, cells.j0, cells.j1);
  };
  if (const int parts = lstm_cpu_cell_parts(n_batch, n_cells, fr.count)) {
    // The cell split (few rows): per chunk, part p writes its share of the chunk's frames of [X | Yp] and recomputes
    // its cells' gate columns of the pre-activations (as forward); then frame by frame its cells' gradients and bias
    // sums and, after the parts have met (the product reads every column of the frame's G), its cells' columns of
    // dL/dY[t_prev] = G . W_h^T; then, over the whole chunk, its columns of dL/dX = G . W_x^T and its share of the
    // weight gradient's columns (lstm_weight_grad_part).  The parts meet once more before the next chunk's [X | Yp]
    // and G overwrite this one's.  The bias gradient: each gate column summed by one part, rows and frames in the
    // one thread's order.
    LowmemTeamSlices slices(parts, n_in, n_cells, true);
    LstmBuffer work(lstm_weight_grad_work(ld, g, parts));
    std::vector<double> db(g, 0.0);
    lstm_cpu_team(parts, [&](int p, LstmBarrier& barrier) {
      slices.of(p, Wd);  // each part packs its own slices
      bool solo = false;  // part 0 computes every part's share (LstmBarrier::wait), the others have left
      for (int64_t k0 = last; k0 >= 0; k0 -= per_chunk) {
        const LowmemChunk ch = lowmem_chunk(call, k0);
        const int64_t frames = ch.k1 - ch.k0;
        if (k0 != last && !solo && (solo = barrier.wait(p)) && p > 0) return;
        const LstmTnRows pc(P, ch.rows, ld);
        lstm_team_shares(p, parts, solo, [&](int q) {
          const int64_t ka = ch.k0 + q * frames / parts, kb = ch.k0 + (q + 1) * frames / parts;
          lowmem_put_rows(X, i, Y, y0, call, LowmemChunk{ka, kb, (kb - ka) * n_batch}, 0, n_batch, pc,
                          (ka - ch.k0) * n_batch);
          const LowmemSlices s = slices.of(q);
          chunk_gates(ch, 0, n_batch, s.Wx, s.Wh, H);
        });
        for (int64_t k = ch.k1 - 1; k >= ch.k0; --k) {
          const int64_t f = (k - ch.k0) * n_batch * g;
          lstm_team_shares(p, parts, solo, [&](int q) {
            const LstmSpan cells = lstm_span_of(q, parts, n_cells);
            frame_cells(k, 0, n_batch, H + f, G + f, cells);
            for (int gate = 0; gate < 4; ++gate)
              lstm_add_rows(G + f + gate * n_cells + cells.j0, n_batch, cells.size(),
                            db.data() + gate * n_cells + cells.j0, g);
          });
          if (!solo && (solo = barrier.wait(p)) && p > 0) return;
          lstm_team_shares(p, parts, solo, [&](int q) {  // dL/dY[t_prev] = G . W_h^T, the columns of q's cells
            const LowmemSlices s = slices.of(q);
            lstm_packed_gemm(G + f, g, s.WhT, dh + s.cells.j0, n_cells, n_batch, nullptr, true);
          });
        }
        lstm_team_shares(p, parts, solo, [&](int q) {  // G and [X | Yp] are complete (the last frame's meeting)
          const LowmemSlices s = slices.of(q);
          lowmem_input_grads(DX, call, ch, 0, n_batch, G, s.WxT, s.cols.j0);
          // [DW_x; DW_h] (+)= [X | Yp]^T . G, q's share of the columns (the first chunk overwrites)
          lstm_weight_grad_part(q, parts, nullptr, 0, G, g, ch.rows, ld, g, DWd, ld, nullptr, work.data(), k0 == last,
                                pc.data);
        });
      }
    });
    lstm_sum_parts(db, 1, g, dbd);
    HANDLE_LAST_ERROR();
    return;
  }
  const LstmPacked packed_Wx = lstm_pack(Wd, false, n_in, g), packed_Wh = lstm_pack(Wd + n_in * g, false, n_cells, g);
  const LstmPacked packed_WxT = lstm_pack(Wd, true, g, n_in), packed_WhT = lstm_pack(Wd + n_in * g, true, g, n_cells);
  const int parts = lstm_cpu_parts(n_batch, n_cells, fr.count);
  std::vector<double> db_parts(parts * g, 0.0);
  // the chunk's gates, then its frames backward; the part's rows of [X | y_prev] into pp from row row0
  auto chunk_backward = [&](const LowmemChunk& ch, int p, int64_t r0, int64_t r1, const LstmTnRows& pp, int64_t row0,
                            Float* hp, Float* gp) {
    const int64_t nr = r1 - r0, at = r0 * n_cells;
    lowmem_put_rows(X, i, Y, y0, call, ch, r0, r1, pp, row0);
    chunk_gates(ch, r0, r1, lowmem_gemm_whole(packed_Wx), lowmem_gemm_whole(packed_Wh), hp);
    for (int64_t k = ch.k1 - 1; k >= ch.k0; --k) {
      const int64_t f = (k - ch.k0) * nr * g;
      frame_cells(k, r0, r1, hp + f, gp + f, LstmSpan{0, n_cells});
      lstm_add_rows(gp + f, nr, g, db_parts.data() + p * g);
      lstm_packed_gemm(gp + f, g, packed_WhT, dh + at, n_cells, nr, nullptr, true);  // dL/dY[t_prev] = G . W_h^T
    }
    lowmem_input_grads(DX, call, ch, r0, r1, gp, packed_WxT, 0);
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
