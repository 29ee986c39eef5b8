// The CPU's cell split of an LSTM recurrence (lstm.cu): where the batch rows give fewer row parts than threads
// (lstm_cpu_parts: one per 6 rows), part p computes, for every batch row, the four gate columns of its cells [j0, j1)
// (whole panels) from its slices of the packed weights, and the parts meet once per frame, since the next frame's
// product reads every cell of the carried output (LstmBarrier).  Each element is the same sum as in the row parts (a
// product's sums do not depend on the columns computed beside them), so the results are the same bits.
#ifndef PTNATIVE_LSTM_LSTM_TEAM_H
#define PTNATIVE_LSTM_LSTM_TEAM_H

#include "../dialect/kernel.h"
#include "lstm_packed.h"

#if !CUDA
// A barrier for the parts of one lstm_cpu_team (on threads of their own: every part runs at once, so one may wait for
// the others).  A waiting part spins a while (a frame's work takes microseconds, and the parts finish it close
// together), then sleeps in steps of the system's shortest sleep (~80 us here): with more busy threads than cores the
// part it waits for needs the core, and a shared machine the cycles (a spin of 1 ms before yielding ran a T=50 B=4
// layer 4x slower than one thread at a load of 3.5).  abort() releases the waiting parts (a part that failed will not
// arrive): their wait() throws LstmTeamAborted.
struct LstmTeamAborted {};

static inline void lstm_cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();  // ~50 ns
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

class LstmBarrier {
 public:
  explicit LstmBarrier(int parts) : parts_(parts) {}
  void wait() {
    if (parts_ <= 1) return;
    const unsigned phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts_) {
      arrived_.store(0, std::memory_order_relaxed);
      phase_.store(phase + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; phase_.load(std::memory_order_acquire) == phase; ++spins) {
      if (aborted_.load(std::memory_order_relaxed)) throw LstmTeamAborted();
      if (spins < 500) lstm_cpu_relax();
      else std::this_thread::sleep_for(std::chrono::microseconds(1));
    }
  }
  void abort() { aborted_.store(true, std::memory_order_relaxed); }

 private:
  const int parts_;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> phase_{0};
  std::atomic<bool> aborted_{false};
};

// body(p, barrier) for the parts p = 0 .. parts-1, each on a thread of its own (with DAZ, as the row parts), all at
// once; barrier.wait() returns when every part has called it.  An exception in a part releases the others and is
// rethrown here.
template <typename F>
static void lstm_cpu_team(int parts, F&& body) {
  LstmBarrier barrier(parts);
  ptn::parallel_parts(parts, [&](int p) {
    LstmDenormalsAreZero daz;
    try {
      body(p, barrier);
    } catch (const LstmTeamAborted&) {  // another part failed: its exception is the one rethrown
    } catch (...) {
      barrier.abort();
      throw;
    }
  }, ptn::PartsOn::own_threads);
}

// The parts of the cell split for n cells (0: split the rows): as many as there are threads and panels of cells, when
// that is more than the row parts (lstm_cpu_parts) and the work pays for starting threads.
static int lstm_cpu_cell_parts(int64_t n_batch, int64_t n_cells, int64_t n_frames) {
  const int row_parts = lstm_cpu_parts(n_batch, n_cells, n_frames);
  const double fma = (double)n_frames * n_batch * n_cells * 4 * n_cells;
  const int64_t panels = (n_cells + LSTM_NR - 1) / LSTM_NR;
  const int parts = (int)std::min<int64_t>(ptn::cpu_threads(), panels);
  return fma >= 4e6 && parts > row_parts && parts > 1 ? parts : 0;
}

// Part p's share [j0, j1) of n columns: whole panels of LSTM_NR, near-equal counts of them.
struct LstmSpan {
  int64_t j0, j1;
  int64_t size() const { return j1 - j0; }
};
static LstmSpan lstm_span_of(int p, int parts, int64_t n) {
  const int64_t panels = (n + LSTM_NR - 1) / LSTM_NR;
  return {std::min(n, p * panels / parts * LSTM_NR), std::min(n, (p + 1) * panels / parts * LSTM_NR)};
}

// The four gate blocks' columns of cells [j0, j1) of a (k x 4n) weight (rows 4n apart), each block packed on its own.
struct LstmGatePanels {
  LstmPanels gate[4];
};

// The values of lstm_pack_gates_to for `span`'s cells.
static int64_t lstm_gate_panels_size(int64_t k, const LstmSpan& span) { return 4 * lstm_packed_size(k, span.size()); }

static LstmGatePanels lstm_pack_gates_to(Float* dst, const Float* W, int64_t k, int64_t n_cells, const LstmSpan& span) {
  LstmGatePanels P;
  for (int q = 0; q < 4; ++q)
    P.gate[q] = lstm_pack_to(dst + q * lstm_packed_size(k, span.size()), W + q * n_cells + span.j0, false, k,
                             span.size(), 4 * n_cells);
  return P;
}

// The gate columns of `span`'s cells of the row blocks' C (+)= A . W, as lstm_packed_gemm_blocks (bias likewise
// sliced), W's slices from lstm_pack_gates_to.
static void lstm_gates_gemm_blocks(const Float* A, const LstmGatePanels& P, Float* C, const LstmRowBlocks& rb,
                                   int64_t n_cells, const LstmSpan& span, const Float* bias = nullptr,
                                   bool overwrite = false) {
  for (int q = 0; q < 4; ++q)
    lstm_packed_gemm_blocks(A, P.gate[q], C + q * n_cells + span.j0, rb, bias ? bias + q * n_cells + span.j0 : nullptr,
                            overwrite);
}
#endif

#endif  // PTNATIVE_LSTM_LSTM_TEAM_H
