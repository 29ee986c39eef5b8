// The CPU's cell split of an LSTM recurrence (lstm.cu, lstm_lowmem.cu): where the batch rows would give row parts of
// fewer than 6 rows (lstm_cpu_cell_parts), part p computes, for every batch row, the four gate columns of its cells
// [j0, j1) (whole panels) from its slices of the packed weights, and the parts meet once per frame, since the next
// frame's product reads every cell of the carried output (LstmBarrier).  Each element is the same sum as in the row
// parts (a product's sums do not depend on the columns computed beside them), so the results are the same bits.
#ifndef PTNATIVE_LSTM_LSTM_TEAM_H
#define PTNATIVE_LSTM_LSTM_TEAM_H

#include "../dialect/kernel.h"
#include "lstm_packed.h"

#if !CUDA
// A barrier for the parts of one lstm_cpu_team (on the process's pool or threads of their own, ptn::parallel_parts:
// every part runs at once, so one may wait for the others).  A waiting part spins for half the time its own work since
// its last wait took (at least 50 us, at most 0.5 ms: the parts' shares of a frame are equal, so the others should be
// close), then sleeps in steps of the system's shortest sleep (~80 us here): with more busy threads than cores the part
// it waits for needs the core, and a shared machine the cycles (a spin of 1 ms before yielding ran a T=50 B=4 layer 4x
// slower than one thread at a load of 3.5; sleeping after a fixed 25 us lost ~10% at n=1024, whose frames take ~300 us
// and finish up to 50 us apart).  When parts have had to sleep at more than 2 + 1/8 of the meetings after the first
// (the machine has more busy threads than cores: a part that loses its core stalls the others at every frame), wait()
// tells every part, at the same meeting, to go on alone: part 0 computes every part's cells from then on (the same
// sums: the same bits) and the others leave the recurrence.  abort() releases the waiting parts (a part that failed
// will not arrive): their wait() throws LstmTeamAborted.
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
  typedef std::chrono::steady_clock Clock;
  explicit LstmBarrier(int parts) : parts_(parts), left_(parts, Clock::now()) {}
  // Part p waits for the others; true: part 0 goes on alone from here (the same answer for every part).
  bool wait(int p) {
    if (parts_ <= 1) return false;
    const Clock::time_point arrived = Clock::now();
    const unsigned phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts_) {
      arrived_.store(0, std::memory_order_relaxed);
      if (sleeps_.load(std::memory_order_relaxed) >= 3 + (int)(phase / 8)) solo_.store(true, std::memory_order_relaxed);
      phase_.store(phase + 1, std::memory_order_release);
      left_[p] = arrived;
      return solo_.load(std::memory_order_relaxed);
    }
    const Clock::duration spin = std::min<Clock::duration>(
        std::max<Clock::duration>((arrived - left_[p]) / 2, std::chrono::microseconds(50)),
        std::chrono::microseconds(500));
    bool slept = false;
    for (int spins = 0; phase_.load(std::memory_order_acquire) == phase; ++spins) {
      if (aborted_.load(std::memory_order_relaxed)) throw LstmTeamAborted();
      if (spins % 64 != 63 || Clock::now() - arrived < spin) {
        lstm_cpu_relax();
        continue;
      }
      if (!slept && phase > 0) sleeps_.fetch_add(1, std::memory_order_relaxed);  // the first waits for a thread start
      slept = true;
      std::this_thread::sleep_for(std::chrono::microseconds(1));
    }
    left_[p] = Clock::now();
    return solo_.load(std::memory_order_relaxed);
  }
  void abort() { aborted_.store(true, std::memory_order_relaxed); }

 private:
  const int parts_;
  std::vector<Clock::time_point> left_;  // per part, when it last left wait() (its own slot only)
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> phase_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<int> sleeps_{0};  // waits that slept
  std::atomic<bool> solo_{false};
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

// f(q) for the parts q whose shares part p computes: its own, or every part's when it goes on alone (`solo`: part 0
// after LstmBarrier::wait said so; the others have left).
template <typename F>
static void lstm_team_shares(int p, int parts, bool solo, F&& f) {
  for (int q = solo ? 0 : p; q < (solo ? parts : p + 1); ++q) f(q);
}

// The parts of the cell split (0: split the rows): as many as there are threads and panels of cells, when the row
// parts would have fewer than 6 rows each (lstm_cpu_parts' smallest share) and the work pays for starting threads.
// Measured at 2 threads, T=50, fwd+bwd of the layer, the machine to itself: the cell split took B=1 n=256 from 3.4 to
// 2.1 ms, B=8 n=512 (two row parts of 4) from 35 to 25 ms; at B=12 and 16 the row parts were as fast or faster
// (B=16 n=256: 12.8 against 16.5 ms), each of their products over more rows.
static int lstm_cpu_cell_parts(int64_t n_batch, int64_t n_cells, int64_t n_frames) {
  const int threads = ptn::cpu_threads();
  const double fma = (double)n_frames * n_batch * n_cells * 4 * n_cells;
  const int64_t panels = (n_cells + LSTM_NR - 1) / LSTM_NR;
  const int parts = (int)std::min<int64_t>(threads, panels);
  return fma >= 4e6 && parts > 1 && n_batch < 6 * (int64_t)threads ? parts : 0;
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

// The slices lstm_pack_gates_to wrote at dst.
static LstmGatePanels lstm_gate_panels_at(const Float* dst, int64_t k, const LstmSpan& span) {
  LstmGatePanels P;
  for (int q = 0; q < 4; ++q) P.gate[q] = LstmPanels{dst + q * lstm_packed_size(k, span.size()), k, span.size()};
  return P;
}

static LstmGatePanels lstm_pack_gates_to(Float* dst, const Float* W, int64_t k, int64_t n_cells, const LstmSpan& span) {
  for (int q = 0; q < 4; ++q)
    lstm_pack_to(dst + q * lstm_packed_size(k, span.size()), W + q * n_cells + span.j0, false, k, span.size(),
                 4 * n_cells);
  return lstm_gate_panels_at(dst, k, span);
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
