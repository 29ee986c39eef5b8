// The CPU's GEMMs of the LSTM kernels: W packed once per op call, a register-tiled FMA kernel, and the batch rows
// split over threads (lstm_cpu_rows); the weight gradients (A^T . B over many rows) with both operands packed in
// blocks, split over threads by columns.  No BLAS call: BLAS's threads would wait for each other and spin against
// the row parts.  Nothing here on CUDA (cuBLAS does the products there).
#ifndef PTNATIVE_LSTM_LSTM_PACKED_H
#define PTNATIVE_LSTM_LSTM_PACKED_H

#include "../dialect/kernel.h"

#include "../common/simd.h"

#if !CUDA
// ---------------------------------------------------------------- CPU recurrent GEMM
// The per-frame products y_prev . W (B x n x 4n) are too small for BLAS to thread well, and BLAS packs W again
// on every call.  On the CPU we pack W once per op call into column panels and multiply with a register-tiled
// kernel (gcc vector extensions, contracted to FMA), and split the batch rows over threads: rows are
// independent through the whole recurrence, so the threads never wait for each other.
// 64 bytes with AVX-512 (the width of the CPU's FMA units and of its BLAS), else 32: two registers of SSE or NEON,
// which ptn_vec keeps in registers under g++ too (c_code/common/simd.h).
typedef ptn_vec<Float, (PTN_VECTOR_BYTES >= 64 ? 64 : 32) / sizeof(Float)> lstm_vec;
constexpr int LSTM_VL = (int)(sizeof(lstm_vec) / sizeof(Float));  // lanes per vector
constexpr int LSTM_NR = 2 * LSTM_VL;                              // columns per panel
#ifdef __AVX512F__
constexpr int LSTM_MR = 8;  // rows per register tile: 16 accumulators of the 32 vector registers
#else
constexpr int LSTM_MR = 6;  // rows per register tile: 12 accumulators of the 16 vector registers
#endif

// Buffers whose size depends on the weights only (the packed weights, the weight gradients' packing space) are kept
// by the thread that took them for its next call (up to LSTM_POOL_KEEP_BYTES together, per kernel library): fresh
// memory costs a page fault per 4 KB page on first touch, which on the 2-core VM (~0.4 ms per MB) took longer than
// packing the weights, on the caller's thread before the row parts start.
constexpr size_t LSTM_POOL_KEEP_BYTES = size_t(16) << 20;

struct LstmPool {
  std::vector<std::vector<Float>> free;  // kept buffers (their capacity; content unspecified)
  size_t bytes = 0;                      // their capacity in bytes
};
static thread_local LstmPool lstm_pool;

// A vector of n values (content unspecified): the smallest kept one that holds n, else the largest one, grown.
static std::vector<Float> lstm_pool_take(size_t n) {
  auto& pool = lstm_pool;
  std::vector<Float> v;
  if (n > 0 && !pool.free.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < pool.free.size(); ++i) {
      const size_t ci = pool.free[i].capacity(), cb = pool.free[best].capacity();
      if (ci >= n ? (cb < n || ci < cb) : (cb < n && ci > cb)) best = i;
    }
    v = std::move(pool.free[best]);
    pool.free.erase(pool.free.begin() + best);
    pool.bytes -= v.capacity() * sizeof(Float);
  }
  v.resize(n);
  return v;
}

// Keeps v's memory for the thread's next lstm_pool_take, if the pool has room; else v frees it.
static void lstm_pool_give(std::vector<Float>&& v) {
  auto& pool = lstm_pool;
  const size_t bytes = v.capacity() * sizeof(Float);
  if (bytes == 0 || pool.bytes + bytes > LSTM_POOL_KEEP_BYTES) return;
  pool.bytes += bytes;
  pool.free.push_back(std::move(v));
}

// n values from the pool (content unspecified), given back when the object goes.
class LstmBuffer {
 public:
  LstmBuffer() = default;
  explicit LstmBuffer(size_t n) : v_(lstm_pool_take(n)) {}
  LstmBuffer(const LstmBuffer&) = delete;
  LstmBuffer(LstmBuffer&& o) noexcept : v_(std::move(o.v_)) { o.v_.clear(); }
  LstmBuffer& operator=(LstmBuffer&& o) noexcept {
    if (this != &o) {
      lstm_pool_give(std::move(v_));
      v_ = std::move(o.v_);
      o.v_.clear();
    }
    return *this;
  }
  ~LstmBuffer() { lstm_pool_give(std::move(v_)); }
  Float* data() { return v_.data(); }
  const Float* data() const { return v_.data(); }

 private:
  std::vector<Float> v_;
};

// A packed op(B) as the products read it: ceil(n / NR) panels, each k rows of NR columns (zero-padded).
struct LstmPanels {
  const Float* data = nullptr;
  int64_t k = 0, n = 0;
};

// The values of lstm_pack_to(k, n): ceil(n / NR) panels of k rows of NR.
static int64_t lstm_packed_size(int64_t k, int64_t n) { return (n + LSTM_NR - 1) / LSTM_NR * k * LSTM_NR; }

// op(B) is (k x n): B itself (row-major k x n, rows ldb apart) or, with `trans`, the transpose of row-major B (n x k,
// rows ldb apart); ldb < 0: n, or k with `trans`.  Written to dst (lstm_packed_size(k, n) values).  A whole panel's
// rows are copied as blocks (row-major B) or transposed 16 k-rows at a time, so that the block being written (16 rows
// of the panel, 2 KB in float32) and the 16-value pieces read from NR rows of B stay in the L1 cache.
static LstmPanels lstm_pack_to(Float* dst, const Float* B, bool trans, int64_t k, int64_t n, int64_t ldb = -1) {
  if (ldb < 0) ldb = trans ? k : n;
  const int64_t panels = (n + LSTM_NR - 1) / LSTM_NR;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t c0 = p * LSTM_NR, nc = std::min<int64_t>(LSTM_NR, n - c0);
    Float* panel = dst + p * k * LSTM_NR;
    if (!trans) {
      for (int64_t kk = 0; kk < k; ++kk) {
        memcpy(panel + kk * LSTM_NR, B + kk * ldb + c0, nc * sizeof(Float));
        std::fill(panel + kk * LSTM_NR + nc, panel + (kk + 1) * LSTM_NR, Float(0));
      }
      continue;
    }
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
      const int64_t kn = std::min<int64_t>(16, k - k0);
      for (int64_t c = 0; c < LSTM_NR; ++c) {
        Float* out = panel + k0 * LSTM_NR + c;
        if (c >= nc) {
          for (int64_t kk = 0; kk < kn; ++kk) out[kk * LSTM_NR] = Float(0);
          continue;
        }
        const Float* src = B + (c0 + c) * ldb + k0;
        for (int64_t kk = 0; kk < kn; ++kk) out[kk * LSTM_NR] = src[kk];
      }
    }
  }
  return LstmPanels{dst, k, n};
}

// lstm_pack_to into a buffer of its own (from the calling thread's pool).
struct LstmPacked {
  LstmBuffer data;
  int64_t k = 0, n = 0;
  operator LstmPanels() const { return LstmPanels{data.data(), k, n}; }
};

static LstmPacked lstm_pack(const Float* B, bool trans, int64_t k, int64_t n) {
  LstmPacked P;
  P.k = k;
  P.n = n;
  P.data = LstmBuffer(lstm_packed_size(k, n));  // every value is written by lstm_pack_to
  lstm_pack_to(P.data.data(), B, trans, k, n);
  return P;
}

static inline lstm_vec lstm_load(const Float* p) {
  lstm_vec v;
  memcpy(&v, p, sizeof v);
  return v;
}

// k rows of a panel fill 32 KB, which stays in the L1 cache (48 KB on this generation) while the row tiles of a
// product take it in turn; longer products run in blocks of this many k rows (the later blocks add to C).
constexpr int64_t LSTM_KC = 32768 / (LSTM_NR * (int64_t)sizeof(Float));

// C[r][0..nc) += A[r][0..k) . panel for the MR rows r, A's element (r, kk) at A[r * ars + kk * aks] (a row-major A:
// ars = lda, aks = 1; a transposed or packed one: ars = 1, aks = its row stride), C's rows at stride ldc.  With a
// bias (the panel's nc entries, else null), C[r][c] = (C[r][c] + bias[c]) + (A . panel)[r][c].  With `overwrite`,
// C's old values are not read: C = A . panel, or bias + A . panel.  With NP = 2, two whole panels side by side (the
// second `pstride` values after the first, its columns C's next NR, nc = 2 NR): the few-row tiles then keep as many
// accumulators busy as the full ones (each element's sum is the same, in the same order, as with NP = 1).
template <int MR, int NP>
static inline void lstm_tile_panels(int64_t k, const Float* A, int64_t ars, int64_t aks, const Float* __restrict__ panel,
                                    int64_t pstride, Float* C, int64_t ldc, int64_t nc, const Float* bias,
                                    bool overwrite) {
  constexpr int NV = 2 * NP;  // accumulators per row
  lstm_vec acc[MR][NV];
  if (!overwrite)  // C's lines are read after the k loop: fetched during it (LstmLowMem's step took 7% less CPU time)
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < NV; ++h) __builtin_prefetch(C + r * ldc + h * LSTM_VL, 1);
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < NV; ++h) acc[r][h] = lstm_vec{};
  for (int64_t kk = 0; kk < k; ++kk, A += aks) {
    lstm_vec bv[NV];
    for (int h = 0; h < NV; ++h) bv[h] = lstm_load(panel + (h / 2) * pstride + kk * LSTM_NR + (h % 2) * LSTM_VL);
    for (int r = 0; r < MR; ++r) {
      Float s = A[r * ars];
      for (int h = 0; h < NV; ++h) acc[r][h] += s * bv[h];
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (nc == NP * LSTM_NR) {  // whole panels: a vector add per vector (two with a bias)
      for (int h = 0; h < NV; ++h) {
        lstm_vec c;
        if (overwrite) {
          c = bias ? lstm_load(bias + h * LSTM_VL) + acc[r][h] : acc[r][h];
        } else {
          c = lstm_load(C + r * ldc + h * LSTM_VL);
          if (bias) c += lstm_load(bias + h * LSTM_VL);
          c += acc[r][h];
        }
        memcpy(C + r * ldc + h * LSTM_VL, &c, sizeof c);
      }
      continue;
    }
    Float out[NP * LSTM_NR];
    memcpy(out, acc[r], sizeof out);
    for (int64_t c = 0; c < nc; ++c) {
      Float base = overwrite ? (bias ? bias[c] : Float(0)) : (bias ? C[r * ldc + c] + bias[c] : C[r * ldc + c]);
      C[r * ldc + c] = overwrite && !bias ? out[c] : base + out[c];
    }
  }
}

template <int MR>
static void lstm_tile(int64_t k, const Float* A, int64_t ars, int64_t aks, const Float* panel, Float* C, int64_t ldc,
                      int64_t nc, const Float* bias, bool overwrite) {
  lstm_tile_panels<MR, 1>(k, A, ars, aks, panel, 0, C, ldc, nc, bias, overwrite);
}

// Tiles of at most LSTM_MR_WIDE rows run over two whole panels at once (lstm_tile_panels<MR, 2>): 4 x 4 accumulators
// and 4 panel vectors of the 32 registers with AVX-512, 2 x 4 and 4 of the 16 without.
#ifdef __AVX512F__
constexpr int LSTM_MR_WIDE = 4;
#else
constexpr int LSTM_MR_WIDE = 2;
#endif
typedef void (*lstm_tile2_fn)(int64_t, const Float*, int64_t, int64_t, const Float*, int64_t, Float*, int64_t,
                              int64_t, const Float*, bool);
static lstm_tile2_fn lstm_tile2_for(int64_t rows) {
  static const lstm_tile2_fn tiles[] = {0, lstm_tile_panels<1, 2>, lstm_tile_panels<2, 2>, lstm_tile_panels<3, 2>,
                                        lstm_tile_panels<4, 2>};
  static_assert(LSTM_MR_WIDE <= 4, "the two-panel tile table lists one entry per row count");
  return tiles[rows];
}

typedef void (*lstm_tile_fn)(int64_t, const Float*, int64_t, int64_t, const Float*, Float*, int64_t, int64_t,
                             const Float*, bool);
static lstm_tile_fn lstm_tile_for(int64_t rows) {
  static const lstm_tile_fn tiles[] = {0, lstm_tile<1>, lstm_tile<2>, lstm_tile<3>, lstm_tile<4>, lstm_tile<5>,
                                       lstm_tile<6>, lstm_tile<7>, lstm_tile<8>};
  static_assert(LSTM_MR <= 8, "the tile table lists one entry per row count");
  return tiles[rows];
}

// Row blocks of a product: block f's rows are m rows of A from A + f * a_step (rows lda apart) and of C from
// C + f * c_step (rows ldc apart); e.g. one part's batch rows of every frame.  With `rows`, block f has only its
// first rows[f] <= m rows (e.g. a frame's rows up to its last valid one); the others are left alone.
struct LstmRowBlocks {
  int64_t m, count;
  int64_t lda, a_step, ldc, c_step;
  const int64_t* rows = nullptr;
  int64_t rows_of(int64_t f) const { return rows ? rows[f] : m; }
};

// C_f (m x P.n) += A_f (m x P.k) . op(B) for the row blocks f (see LstmRowBlocks), op(B) packed by lstm_pack, in
// row tiles of near-equal counts up to LSTM_MR (16 rows: 8 8 with AVX-512, 5 5 6 without); each panel of op(B) (k
// in blocks of LSTM_KC rows) serves the tiles of a group of row blocks whose A rows fit the L2 cache.  With `bias`
// (P.n entries), C = (C + bias) + A . op(B), the bias added in the same pass (the order of a separate add before
// the product).  With `overwrite`, C's old values are not read (as if they were 0).  Each element is the sum over
// k in order within each block of LSTM_KC, the blocks added to C in order: the same bits whatever m or the blocks.
static void lstm_packed_gemm_blocks(const Float* A, const LstmPanels& P, Float* C, const LstmRowBlocks& rb,
                                    const Float* bias = nullptr, bool overwrite = false) {
  if (rb.m <= 0 || rb.count <= 0 || P.n <= 0) return;
  const int64_t panels = (P.n + LSTM_NR - 1) / LSTM_NR, n_tiles = (rb.m + LSTM_MR - 1) / LSTM_MR;
  const int64_t kc = std::max<int64_t>(1, std::min<int64_t>(LSTM_KC, P.k));
  // row blocks per group: their A rows of one k block within ~256 KB
  const int64_t group = std::max<int64_t>(1, (int64_t)(262144 / sizeof(Float)) / std::max<int64_t>(1, rb.m * kc));
  if (P.k == 0) {  // an empty product: C = C + bias, or bias, or 0
    for (int64_t f = 0; f < rb.count; ++f)
      for (int64_t r = 0; r < rb.rows_of(f); ++r) {
        Float* c = C + f * rb.c_step + r * rb.ldc;
        for (int64_t j = 0; j < P.n; ++j) c[j] = (overwrite ? Float(0) : c[j]) + (bias ? bias[j] : Float(0));
      }
    return;
  }
  for (int64_t g0 = 0; g0 < rb.count; g0 += group) {
    const int64_t g1 = std::min(rb.count, g0 + group);
    for (int64_t k0 = 0; k0 < P.k; k0 += kc) {
      const int64_t kn = std::min(kc, P.k - k0);
      const bool first = k0 == 0;
      for (int64_t p = 0; p < panels;) {
        const Float* panel = P.data + (p * P.k + k0) * LSTM_NR;
        // few rows (at most LSTM_MR_WIDE per tile) and two whole panels left: both in one pass
        const bool wide = (rb.m + n_tiles - 1) / n_tiles <= LSTM_MR_WIDE && (p + 2) * LSTM_NR <= P.n;
        const int64_t nc = wide ? 2 * LSTM_NR : std::min<int64_t>(LSTM_NR, P.n - p * LSTM_NR);
        const Float* pb = first && bias ? bias + p * LSTM_NR : nullptr;
        for (int64_t f = g0; f < g1; ++f) {
          const int64_t mf = rb.rows_of(f), tiles = mf == rb.m ? n_tiles : (mf + LSTM_MR - 1) / LSTM_MR;
          for (int64_t t = 0; t < tiles; ++t) {
            int64_t r0 = t * mf / tiles, r1 = (t + 1) * mf / tiles;
            const Float* a = A + f * rb.a_step + r0 * rb.lda + k0;
            Float* c = C + f * rb.c_step + r0 * rb.ldc + p * LSTM_NR;
            if (wide)
              lstm_tile2_for(r1 - r0)(kn, a, rb.lda, 1, panel, P.k * LSTM_NR, c, rb.ldc, nc, pb, first && overwrite);
            else
              lstm_tile_for(r1 - r0)(kn, a, rb.lda, 1, panel, c, rb.ldc, nc, pb, first && overwrite);
          }
        }
        p += wide ? 2 : 1;
      }
    }
  }
}

// C (m x P.n, row stride ldc) += A (m x P.k, row stride lda) . op(B): one row block of lstm_packed_gemm_blocks.
static void lstm_packed_gemm(const Float* A, int64_t lda, const LstmPanels& P, Float* C, int64_t ldc, int64_t m,
                             const Float* bias = nullptr, bool overwrite = false) {
  lstm_packed_gemm_blocks(A, P, C, LstmRowBlocks{m, 1, lda, 0, ldc, 0}, bias, overwrite);
}

// The rows per block of lstm_gemm_tn_blocks over K rows: blocks of equal size, at most LSTM_KC rows.
static int64_t lstm_gemm_tn_block_rows(int64_t K) {
  const int64_t blocks = (K + LSTM_KC - 1) / LSTM_KC;
  return blocks > 0 ? (K + blocks - 1) / blocks : 1;
}

// The rows that take part in A^T . B over K rows (lstm_gemm_tn_blocks), where the others are zero rows of B (e.g.
// NativeLstm2's gradients on masked rows): they would add exact zeros to each sum.  The blocks of the product stay
// those of all K rows (lstm_gemm_tn_block_rows), each with its kept rows in order, so that every element is the same
// sum as over all rows (bit for bit, for finite A).
struct LstmTnKeep {
  int64_t kc = 1;
  std::vector<int64_t> rows;   // the kept rows, in order
  std::vector<int64_t> first;  // block b's kept rows: rows[first[b] .. first[b + 1])
  std::vector<int64_t> pos;    // per row, its index among its block's kept rows; -1 for a row left out
  LstmTnKeep() = default;
  template <typename F>  // keep(row) -> bool
  LstmTnKeep(int64_t K, F&& keep) : kc(lstm_gemm_tn_block_rows(K)), pos(K, -1) {
    first.push_back(0);
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
      for (int64_t row = k0; row < std::min(K, k0 + kc); ++row)
        if (keep(row)) {
          pos[row] = (int64_t)rows.size() - first.back();
          rows.push_back(row);
        }
      first.push_back((int64_t)rows.size());
    }
  }
};

// A^T . B's A (K rows of M values) in the layout lstm_gemm_tn_blocks packs it to, written row by row by the kernel
// that makes it (NativeLstm2's [x | y_prev]): the product then reads it as it is instead of packing it on every
// thread.  Block by block (lstm_gemm_tn_block_rows), in each the tiles of LSTM_MR columns one after the other, each
// the block's rows of MR values (zero-padded beyond M); with `keep`, only its kept rows (put ignores the others).
// `data`: size() values.
struct LstmTnRows {
  Float* data;
  int64_t K, M, kc, tiles;
  const LstmTnKeep* keep;
  LstmTnRows(Float* data_, int64_t K_, int64_t M_, const LstmTnKeep* keep_ = nullptr)
      : data(data_), K(K_), M(M_), kc(lstm_gemm_tn_block_rows(K_)), tiles((M_ + LSTM_MR - 1) / LSTM_MR), keep(keep_) {}
  static int64_t size(int64_t K, int64_t M) { return K * ((M + LSTM_MR - 1) / LSTM_MR) * LSTM_MR; }
  // row `row` of A = [u[0 .. m) | v[0 .. M - m)], u null for zeros
  void put(int64_t row, const Float* u, int64_t m, const Float* v) const {
    const int64_t b = row / kc;
    int64_t r = row - b * kc, kn = std::min(kc, K - b * kc);
    if (keep) {
      if (keep->pos[row] < 0) return;
      r = keep->pos[row];
      kn = keep->first[b + 1] - keep->first[b];
    }
    Float* dst = data + b * kc * tiles * LSTM_MR + r * LSTM_MR;
    for (int64_t i = 0; i < tiles; ++i, dst += kn * LSTM_MR) {
      const int64_t c0 = i * LSTM_MR;
      if (c0 + LSTM_MR <= m) {  // within u
        if (u) memcpy(dst, u + c0, LSTM_MR * sizeof(Float));
        else std::fill_n(dst, LSTM_MR, Float(0));
      } else if (c0 >= m && c0 + LSTM_MR <= M) {  // within v
        memcpy(dst, v + (c0 - m), LSTM_MR * sizeof(Float));
      } else {
        for (int64_t c = 0; c < LSTM_MR; ++c)
          dst[c] = c0 + c < m ? (u ? u[c0 + c] : Float(0)) : c0 + c < M ? v[c0 + c - m] : Float(0);
      }
    }
  }
};

// Weight gradients: C (M x N) += A^T . B, summed over the rows of the row blocks f (A_f: m rows of M values from
// A + f * rb.a_step, rows rb.lda apart; B_f: m rows of N values from B + f * rb.c_step, rows rb.ldc apart), in
// blocks of LSTM_KC rows: a block's rows of B are packed into panels and its rows of A into tiles of LSTM_MR columns
// (`work`: lstm_gemm_tn_work(M, N) values), and every panel serves all the tiles.  C's rows below m_lo go to C_lo
// (row r at C_lo + r * ldc), the others to C_hi (row r at C_hi + (r - m_lo) * ldc): both weights of a layer,
// [W_in; W], in one pass.  Each element is its sum over the rows in order within each block, the blocks (of equal
// size, at most LSTM_KC rows) added to C in order; with `overwrite`, C's old values are not read (the first block
// writes them; no rows at all write 0).  With `A_packed` (an LstmTnRows' data of A's K rows), A is read from there
// (A and rb's A fields unused); with `keep` too (the LstmTnRows' own), only the kept rows of B are read.  Parts of
// the threads can share the work by columns: B, C_lo and C_hi offset by the same column, N the part's columns.
static int64_t lstm_gemm_tn_work(int64_t M, int64_t N) {
  return LSTM_KC * ((M + LSTM_MR - 1) / LSTM_MR * LSTM_MR + (N + LSTM_NR - 1) / LSTM_NR * LSTM_NR);
}

static void lstm_gemm_tn_blocks(const Float* A, const Float* B, const LstmRowBlocks& rb, int64_t M, int64_t N,
                                Float* C_lo, int64_t m_lo, Float* C_hi, int64_t ldc, Float* work,
                                bool overwrite = false, const Float* A_packed = nullptr,
                                const LstmTnKeep* keep = nullptr) {
  const int64_t K = rb.m * rb.count, tiles = (M + LSTM_MR - 1) / LSTM_MR, panels = (N + LSTM_NR - 1) / LSTM_NR;
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || (keep && keep->rows.empty())) {
    if (overwrite)
      for (int64_t r = 0; r < M; ++r) std::fill_n(r < m_lo ? C_lo + r * ldc : C_hi + (r - m_lo) * ldc, N, Float(0));
    return;
  }
  Float *Ap_work = work, *Bp = work + LSTM_KC * tiles * LSTM_MR;
  const int64_t full_tiles = M / LSTM_MR, full_panels = N / LSTM_NR;
  const int64_t kc = lstm_gemm_tn_block_rows(K);
  bool fresh = overwrite;  // C not written yet (overwrite: the first block with rows writes it)
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t* kept = keep ? keep->rows.data() + keep->first[k0 / kc] : nullptr;  // the block's rows
    const int64_t kn = keep ? keep->first[k0 / kc + 1] - keep->first[k0 / kc] : std::min<int64_t>(kc, K - k0);
    if (kn == 0) continue;
    const Float* Ap = A_packed ? A_packed + k0 * tiles * LSTM_MR : Ap_work;
    for (int64_t kk = 0; kk < kn; ++kk) {  // pack the block's row kk of A (unless packed) and of B
      const int64_t row = kept ? kept[kk] : k0 + kk, f = row / rb.m, r = row % rb.m;
      const Float* b = B + f * rb.c_step + r * rb.ldc;
      if (!A_packed) {
        const Float* a = A + f * rb.a_step + r * rb.lda;
        for (int64_t i = 0; i < full_tiles; ++i)
          memcpy(Ap_work + (i * kn + kk) * LSTM_MR, a + i * LSTM_MR, LSTM_MR * sizeof(Float));
        for (int64_t i = full_tiles; i < tiles; ++i)
          for (int64_t c = 0; c < LSTM_MR; ++c)
            Ap_work[(i * kn + kk) * LSTM_MR + c] = i * LSTM_MR + c < M ? a[i * LSTM_MR + c] : Float(0);
      }
      for (int64_t p = 0; p < full_panels; ++p)
        memcpy(Bp + (p * kn + kk) * LSTM_NR, b + p * LSTM_NR, LSTM_NR * sizeof(Float));
      for (int64_t p = full_panels; p < panels; ++p)
        for (int64_t c = 0; c < LSTM_NR; ++c)
          Bp[(p * kn + kk) * LSTM_NR + c] = p * LSTM_NR + c < N ? b[p * LSTM_NR + c] : Float(0);
    }
    for (int64_t p = 0; p < panels; ++p) {
      const Float* panel = Bp + p * kn * LSTM_NR;
      const int64_t nc = std::min<int64_t>(LSTM_NR, N - p * LSTM_NR);
      for (int64_t i = 0; i < tiles; ++i) {
        const int64_t r0 = i * LSTM_MR, r1 = std::min<int64_t>(M, r0 + LSTM_MR);
        // a tile that straddles m_lo is run as two
        const int64_t cut = r0 < m_lo && m_lo < r1 ? m_lo : r1;
        for (int64_t a0 = r0, a1 = cut; a0 < r1; a0 = a1, a1 = r1) {
          Float* c = a0 < m_lo ? C_lo + a0 * ldc : C_hi + (a0 - m_lo) * ldc;
          lstm_tile_for(a1 - a0)(kn, Ap + i * kn * LSTM_MR + (a0 - r0), 1, LSTM_MR, panel, c + p * LSTM_NR, ldc, nc,
                                 nullptr, fresh);
        }
      }
    }
    fresh = false;
  }
}

// The parts' bias gradients: sums[c] += X[r][c] over the (rows, cols) X, rows ld apart (ld < 0: cols), in double
// (each part its own sums, added in part order by lstm_sum_parts: the same result for a given thread count).
static void lstm_add_rows(const Float* X, int64_t rows, int64_t cols, double* sums, int64_t ld = -1) {
  if (ld < 0) ld = cols;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) sums[c] += (double)X[r * ld + c];
}

// out[c] = the sum over the parts p of sums[p * cols + c], in part order.
static void lstm_sum_parts(const std::vector<double>& sums, int parts, int64_t cols, Float* out) {
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (int p = 0; p < parts; ++p) sum += sums[p * cols + c];
    out[c] = (Float)sum;
  }
}

// Denormal operands read as zero (MXCSR's DAZ bit) while an object lives, then the caller's mode again.  g++'s
// vectorised activation loops (lstm_common.h) meet denormal operands even on normal data in and out (the
// underflow flag shows it; with DAZ it stays clear and the results are bit-identical, so those values reach no
// result), and an x86 core takes a microcode assist of ~100 cycles on each: NativeLstm2's forward activation
// pass ran 2-3x slower.  Inside the recurrence a denormal input (|x| < 1.2e-38 in float32) thus counts as 0.
// Other targets (aarch64: FPCR's FZ bit would also flush denormal results, which DAZ does not) keep the caller's
// mode: a no-op there, and the same results (DAZ changes none, see above).
struct LstmDenormalsAreZero {
#if defined(__SSE__)
  unsigned saved = __builtin_ia32_stmxcsr();
  LstmDenormalsAreZero() { __builtin_ia32_ldmxcsr(saved | 0x0040u); }
  ~LstmDenormalsAreZero() { __builtin_ia32_ldmxcsr(saved); }
#endif
};

// Runs body(r0, r1) over row blocks [r0, r1) covering [0, n_batch), one block per thread, on several threads
// when the work (n_frames products of n_batch x n_cells x 4 n_cells) pays for starting them.  One block per
// thread, of near-equal sizes, rather than tiles handed out one by one: each thread then streams the packed
// weights through its caches once per frame for all its rows (measured 3-5 % faster on 2 cores).
static int lstm_cpu_parts(int64_t n_batch, int64_t n_cells, int64_t n_frames) {
  int64_t blocks = (n_batch + 5) / 6;  // at most one part per 6 rows
  double fma = (double)n_frames * n_batch * n_cells * 4 * n_cells;
  return fma < 4e6 ? 1 : (int)std::max<int64_t>(1, std::min<int64_t>(ptn::cpu_threads(), blocks));
}

// body(p, r0, r1) for the parts p = 0 .. parts-1 (parts = lstm_cpu_parts(n_batch, n_cells, n_frames)), on
// OpenBLAS's workers where the kernel calls BLAS between its parts (LstmGenericBase, TwoDLSTM: right after a BLAS
// call its workers spin and would take the cores from threads of our own), else (`on`: PartsOn::own_threads; the
// kernels that call no BLAS on the CPU) on threads of our own, which leave no pool worker spinning after the parts.
template <typename F>
static void lstm_cpu_row_parts(int64_t n_batch, int parts, F&& body, ptn::PartsOn on = ptn::PartsOn::blas_workers) {
  ptn::parallel_parts(parts, [&](int p) {
    LstmDenormalsAreZero daz;  // on the part's own thread: MXCSR is per thread
    body(p, p * n_batch / parts, (p + 1) * n_batch / parts);
  }, on);
}

// The bounds of `parts` contiguous row ranges (part p: rows bounds[p] .. bounds[p + 1]) over work.size() rows, for
// near-equal sums of work[r] (a row's cost, e.g. its valid frames): part p ends at the candidate boundary nearest to
// (p + 1) / parts of the total, the candidates being lstm_cpu_row_parts' boundary (p + 1) rows / parts and the
// multiples of LSTM_MR (so that the parts' register tiles stay whole: at T=200, B=16, lengths in [0.7T, T], a split
// 7 / 9 by work alone ran the layer 13% slower than 8 / 8, the 9 rows in tiles of 4 and 5), each part at least one
// row (parts <= rows).  Without work, lstm_cpu_row_parts' parts.
static std::vector<int64_t> lstm_bounds_by_work(const std::vector<double>& work, int parts) {
  const int64_t rows = (int64_t)work.size();
  std::vector<double> before(rows + 1, 0.0);  // before[r]: the work of rows 0 .. r-1
  for (int64_t r = 0; r < rows; ++r) before[r + 1] = before[r] + work[r];
  std::vector<int64_t> bounds(parts + 1, 0);
  bounds[parts] = rows;
  for (int p = 1; p < parts; ++p) {
    const int64_t lo = bounds[p - 1] + 1, hi = rows - (parts - p);  // the part's end, leaving a row to each next
    int64_t best = std::min(std::max(p * rows / parts, lo), hi);
    if (before[rows] > 0) {
      const double goal = before[rows] * p / parts;
      for (int64_t r = (lo + LSTM_MR - 1) / LSTM_MR * LSTM_MR; r <= hi; r += LSTM_MR)
        if (std::fabs(before[r] - goal) < std::fabs(before[best] - goal)) best = r;
    }
    bounds[p] = best;
  }
  return bounds;
}

// body(p, r0, r1) for the parts p of lstm_bounds_by_work(work, parts), as lstm_cpu_row_parts.
template <typename F>
static void lstm_cpu_row_parts_by_work(const std::vector<double>& work, int parts, F&& body, ptn::PartsOn on) {
  const std::vector<int64_t> bounds = lstm_bounds_by_work(work, parts);
  ptn::parallel_parts(parts, [&](int p) {
    LstmDenormalsAreZero daz;
    body(p, bounds[p], bounds[p + 1]);
  }, on);
}

template <typename F>
static void lstm_cpu_rows(int64_t n_batch, int64_t n_cells, int64_t n_frames, F&& body,
                          ptn::PartsOn on = ptn::PartsOn::blas_workers) {
  lstm_cpu_row_parts(n_batch, lstm_cpu_parts(n_batch, n_cells, n_frames),
                     [&](int, int64_t r0, int64_t r1) { body(r0, r1); }, on);
}

// [C_lo; C_hi] (M x N, rows N apart; C_lo's first m_lo rows, C_hi's the rest) += A^T . B over K rows (A: K x M,
// rows lda apart; B: K x N, rows ldb apart), by lstm_gemm_tn_blocks with the columns split over `parts` threads
// (lstm_cpu_row_parts; `work`: lstm_weight_grad_work values); with `overwrite`, = instead of +=; with `A_packed`, A
// read from there (an LstmTnRows' data; A, lda unused), and with `keep` (that LstmTnRows'), only the kept rows.
// Each element is the same sum whatever `parts`.
static int64_t lstm_weight_grad_columns(int64_t N, int parts) {
  const int64_t panels = (N + LSTM_NR - 1) / LSTM_NR;
  return (panels + parts - 1) / parts * LSTM_NR;
}

static int64_t lstm_weight_grad_work(int64_t M, int64_t N, int parts) {
  return parts * lstm_gemm_tn_work(M, lstm_weight_grad_columns(N, parts));
}

// Part p's share of lstm_weight_grad (its columns), e.g. from a part of an lstm_cpu_team.
static void lstm_weight_grad_part(int p, int parts, const Float* A, int64_t lda, const Float* B, int64_t ldb, int64_t K,
                                  int64_t M, int64_t N, Float* C_lo, int64_t m_lo, Float* C_hi, Float* work,
                                  bool overwrite, const Float* A_packed = nullptr, const LstmTnKeep* keep = nullptr) {
  const int64_t panels = (N + LSTM_NR - 1) / LSTM_NR, p0 = p * panels / parts, p1 = (p + 1) * panels / parts;
  const int64_t c0 = p0 * LSTM_NR, c1 = std::min(N, p1 * LSTM_NR);
  if (c1 <= c0) return;
  lstm_gemm_tn_blocks(A, B + c0, LstmRowBlocks{K, 1, lda, 0, ldb, 0}, M, c1 - c0, C_lo ? C_lo + c0 : nullptr, m_lo,
                      C_hi ? C_hi + c0 : nullptr, N, work + p * lstm_gemm_tn_work(M, lstm_weight_grad_columns(N, parts)),
                      overwrite, A_packed, keep);
}

static void lstm_weight_grad(const Float* A, int64_t lda, const Float* B, int64_t ldb, int64_t K, int64_t M, int64_t N,
                             Float* C_lo, int64_t m_lo, Float* C_hi, int parts, Float* work, bool overwrite,
                             const Float* A_packed = nullptr, const LstmTnKeep* keep = nullptr) {
  ptn::parallel_parts(parts, [&](int p) {
    LstmDenormalsAreZero daz;
    lstm_weight_grad_part(p, parts, A, lda, B, ldb, K, M, N, C_lo, m_lo, C_hi, work, overwrite, A_packed, keep);
  }, ptn::PartsOn::own_threads);
}
#endif

#endif  // PTNATIVE_LSTM_LSTM_PACKED_H
