// The CPU's recurrent GEMM of the LSTM kernels: W packed once per op call, a register-tiled FMA kernel, and
// the batch rows split over threads (lstm_cpu_rows).  Nothing here on CUDA (cuBLAS does the products there).
#if !CUDA
// ---------------------------------------------------------------- CPU recurrent GEMM
// The per-frame products y_prev . W (B x n x 4n) are too small for BLAS to thread well, and BLAS packs W again
// on every call.  On the CPU we pack W once per op call into column panels and multiply with a register-tiled
// kernel (gcc vector extensions, contracted to FMA), and split the batch rows over threads: rows are
// independent through the whole recurrence, so the threads never wait for each other.
#ifdef __AVX512F__
typedef Float lstm_vec __attribute__((vector_size(64)));  // the width of the CPU's FMA units (and of its BLAS)
#else
typedef Float lstm_vec __attribute__((vector_size(32)));
#endif
constexpr int LSTM_VL = (int)(sizeof(lstm_vec) / sizeof(Float));  // lanes per vector
constexpr int LSTM_NR = 2 * LSTM_VL;                              // columns per panel
#ifdef __AVX512F__
constexpr int LSTM_MR = 8;  // rows per register tile: 16 accumulators of the 32 vector registers
#else
constexpr int LSTM_MR = 6;  // rows per register tile: 12 accumulators of the 16 vector registers
#endif

struct LstmPacked {
  std::vector<Float> data;  // ceil(n / NR) panels, each k rows of NR columns (zero-padded)
  int64_t k = 0, n = 0;
};

// op(B) is (k x n): B itself (row-major k x n) or, with `trans`, the transpose of row-major B (n x k).
static LstmPacked lstm_pack(const Float* B, bool trans, int64_t k, int64_t n) {
  LstmPacked P;
  P.k = k;
  P.n = n;
  int64_t panels = (n + LSTM_NR - 1) / LSTM_NR;
  P.data.assign(panels * k * LSTM_NR, Float(0));
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t kk = 0; kk < k; ++kk) {
      Float* out = P.data.data() + (p * k + kk) * LSTM_NR;
      for (int64_t c = 0; c < LSTM_NR && p * LSTM_NR + c < n; ++c) {
        int64_t col = p * LSTM_NR + c;
        out[c] = trans ? B[col * k + kk] : B[kk * n + col];
      }
    }
  return P;
}

static inline lstm_vec lstm_load(const Float* p) {
  lstm_vec v;
  memcpy(&v, p, sizeof v);
  return v;
}

// C[r][0..nc) += A[r][0..k) . panel for the MR rows r (A rows at stride lda, C rows at stride ldc); with a bias
// (the panel's nc entries, else null), C[r][c] = (C[r][c] + bias[c]) + (A . panel)[r][c].  With `overwrite`, C's
// old values are not read: C = A . panel, or bias + A . panel.
template <int MR>
static inline void lstm_tile(int64_t k, const Float* A, int64_t lda, const Float* __restrict__ panel, Float* C,
                             int64_t ldc, int64_t nc, const Float* bias, bool overwrite) {
  lstm_vec acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = lstm_vec{};
  for (int64_t kk = 0; kk < k; ++kk) {
    lstm_vec b0 = lstm_load(panel + kk * LSTM_NR), b1 = lstm_load(panel + kk * LSTM_NR + LSTM_VL);
    for (int r = 0; r < MR; ++r) {
      Float s = A[r * lda + kk];
      acc[r][0] += s * b0;
      acc[r][1] += s * b1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (nc == LSTM_NR) {  // a whole panel: two vector adds (three with a bias)
      for (int h = 0; h < 2; ++h) {
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
    Float out[LSTM_NR];
    memcpy(out, acc[r], sizeof out);
    for (int64_t c = 0; c < nc; ++c) {
      Float base = overwrite ? (bias ? bias[c] : Float(0)) : (bias ? C[r * ldc + c] + bias[c] : C[r * ldc + c]);
      C[r * ldc + c] = overwrite && !bias ? out[c] : base + out[c];
    }
  }
}

// C (m x P.n, row stride ldc) += A (m x P.k, row stride lda) . op(B), op(B) packed by lstm_pack, in tiles of
// near-equal row counts up to LSTM_MR (16 rows: 8 8 with AVX-512, 5 5 6 without); each panel of op(B) serves
// all of them in turn.  With `bias` (P.n entries), C = (C + bias) + A . op(B), the bias added to every row in the
// same pass (the order of a separate add before the product, without the pass over C).  With `overwrite`, C's
// old values are not read (as if they were 0): C = A . op(B), or bias + A . op(B).
static void lstm_packed_gemm(const Float* A, int64_t lda, const LstmPacked& P, Float* C, int64_t ldc, int64_t m,
                             const Float* bias = nullptr, bool overwrite = false) {
  typedef void (*tile_fn)(int64_t, const Float*, int64_t, const Float*, Float*, int64_t, int64_t, const Float*, bool);
  static const tile_fn tiles[] = {0, lstm_tile<1>, lstm_tile<2>, lstm_tile<3>, lstm_tile<4>, lstm_tile<5>,
                                  lstm_tile<6>, lstm_tile<7>, lstm_tile<8>};
  static_assert(LSTM_MR <= 8, "the tile table lists one entry per row count");
  int64_t panels = (P.n + LSTM_NR - 1) / LSTM_NR, n_tiles = (m + LSTM_MR - 1) / LSTM_MR;
  for (int64_t p = 0; p < panels; ++p) {
    const Float* panel = P.data.data() + p * P.k * LSTM_NR;
    int64_t nc = std::min<int64_t>(LSTM_NR, P.n - p * LSTM_NR);
    for (int64_t t = 0; t < n_tiles; ++t) {
      int64_t r0 = t * m / n_tiles, r1 = (t + 1) * m / n_tiles;
      tiles[r1 - r0](P.k, A + r0 * lda, lda, panel, C + r0 * ldc + p * LSTM_NR, ldc, nc,
                     bias ? bias + p * LSTM_NR : nullptr, overwrite);
    }
  }
}

// The parts' bias gradients: sums[c] += X[r][c] over the (rows, cols) row-major X, in double (each part its own
// sums, added in part order by lstm_sum_parts: the same result for a given thread count).
static void lstm_add_rows(const Float* X, int64_t rows, int64_t cols, double* sums) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) sums[c] += (double)X[r * cols + c];
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

// body(p, r0, r1) for the parts p = 0 .. parts-1 (parts = lstm_cpu_parts(n_batch, n_cells, n_frames)).
template <typename F>
static void lstm_cpu_row_parts(int64_t n_batch, int parts, F&& body) {
  ptn::parallel_parts(parts, [&](int p) {
    LstmDenormalsAreZero daz;  // on the part's own thread: MXCSR is per thread
    body(p, p * n_batch / parts, (p + 1) * n_batch / parts);
  }, ptn::PartsOn::blas_workers);  // BLAS runs between the frames' parts
}

template <typename F>
static void lstm_cpu_rows(int64_t n_batch, int64_t n_cells, int64_t n_frames, F&& body) {
  lstm_cpu_row_parts(n_batch, lstm_cpu_parts(n_batch, n_cells, n_frames),
                     [&](int, int64_t r0, int64_t r1) { body(r0, r1); });
}
#endif
