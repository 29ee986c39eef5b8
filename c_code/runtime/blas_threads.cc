// The worker pool behind ptn_blas_threads_run (blas_threads.h).
#include "blas_threads.h"

#include <pthread.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

typedef std::chrono::steady_clock Clock;
const Clock::duration kSpin = std::chrono::microseconds(PTN_BLAS_THREADS_SPIN_US);

// One call's jobs.  Written by the caller before it publishes the call in Pool::state, read by the workers that
// take part, and not changed again before they have all finished (the next call waits for that).
struct Batch {
  ptn_blas_dojob dojob;
  char* jobdata;
  size_t elsize;
  int dojob_data;
  bool spread;  // a kernel's parts: each on a core of its own (SpreadPart)
};

// The core this thread runs on, as a bit of a 64-bit set (0: unknown, or a core past 63).
inline uint64_t this_core_bit() {
#if defined(__linux__)
  const int cpu = sched_getcpu();
  return cpu >= 0 && cpu < 64 ? uint64_t(1) << cpu : 0;
#else
  return 0;
#endif
}

// For the job of one part of a kernel's call (Linux; `spread` false: nothing): where another part of the call already runs on this core, the
// part moves to an allowed core that none has, for this job only.  The parts of a kernel may wait for each other
// (the LSTM's cell split meets at every frame), and the system does not place them apart reliably: on the 2-vCPU
// VM a sleeping worker woken for a call was put on the caller's core in most calls after an idle pause (the other
// vCPU halted), and the scheduler moved one of them only milliseconds later, so that both parts took turns on one
// core.  `cores` holds the call's claimed cores (the caller's first); restoring the thread's own set afterwards
// does not move it again, so the next call wakes it on the core it moved to.
class SpreadPart {
 public:
  SpreadPart(std::atomic<uint64_t>& cores, bool spread) {
#if defined(__linux__)
    const uint64_t mine = spread ? this_core_bit() : 0;
    if (!mine || !(cores.fetch_or(mine, std::memory_order_acq_rel) & mine)) return;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    for (int c = 0; c < 64 && c < CPU_SETSIZE; ++c) {
      const uint64_t bit = uint64_t(1) << c;
      if (!CPU_ISSET(c, &allowed) || (cores.fetch_or(bit, std::memory_order_acq_rel) & bit)) continue;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      if (sched_setaffinity(0, sizeof one, &one) == 0) {
        saved_ = allowed;
        moved_ = true;
      }
      return;
    }
#else
    (void)cores;
    (void)spread;
#endif
  }
  ~SpreadPart() {
#if defined(__linux__)
    if (moved_) sched_setaffinity(0, sizeof saved_, &saved_);
#endif
  }
  SpreadPart(const SpreadPart&) = delete;
  SpreadPart& operator=(const SpreadPart&) = delete;

 private:
#if defined(__linux__)
  cpu_set_t saved_;
#endif
  bool moved_ = false;
};

// state: (call number << 16) | numjobs of the latest call.  Worker w (1, 2, ...) runs job w of a call with more
// than w jobs; whether it takes part is read from the same word as the call number, so a worker that wakes late
// never reads the Batch of a call it has no part in.
struct Pool {
  std::mutex busy;  // held by the call that uses the workers
  std::mutex lock;  // with `wake`: the sleeping workers
  std::condition_variable wake;  // a new call
  std::condition_variable done;  // the workers' last job of a call finished
  std::atomic<uint64_t> state{0};
  std::atomic<int> remaining{0};  // jobs of the current call not yet finished on the workers
  Batch batch{};
  std::atomic<uint64_t> cores{0};  // of a kernel's call: the cores its parts claimed (SpreadPart)
  std::atomic<int> workers{0};  // started so far; only the holder of `busy` starts more
  // One lock per OpenBLAS library (told apart by its dojob function): OpenBLAS runs job i of a call with the
  // library's buffers of thread i, so two calls into one library must not overlap (its own pool never lets them).
  std::mutex libraries_lock;
  std::vector<std::pair<ptn_blas_dojob, std::mutex*>> libraries;  // the mutexes are never freed

  std::mutex* library_lock(ptn_blas_dojob dojob) {
    std::lock_guard<std::mutex> guard(libraries_lock);
    for (auto& entry : libraries)
      if (entry.first == dojob) return entry.second;
    std::mutex* m = new (std::nothrow) std::mutex();
    if (m) {
      try {
        libraries.emplace_back(dojob, m);
      } catch (const std::exception&) {
        delete m;
        return nullptr;
      }
    }
    return m;
  }
};

std::atomic<Pool*> the_pool{nullptr};
thread_local ptn_blas_dojob running_job_of = nullptr;  // the library whose job this thread is running, if any
thread_local bool holds_workers = false;  // this thread holds Pool::busy (its call's job 0 may call BLAS again)
std::atomic<int64_t> n_calls{0};
std::once_flag atfork_once;

inline void run_job(ptn_blas_dojob dojob, char* jobdata, size_t elsize, int dojob_data, int i) {
  ptn_blas_dojob outer = running_job_of;
  running_job_of = dojob;
  dojob(i, jobdata + (size_t)i * elsize, dojob_data);
  running_job_of = outer;
}

// Worker w, started before call number `seen` + 1 was published.
void worker_loop(Pool* pool, int w, uint64_t seen) {
  for (;;) {
    uint64_t s = pool->state.load(std::memory_order_acquire);
    if ((s >> 16) == seen) {
      const Clock::time_point until = Clock::now() + kSpin;
      while (((s = pool->state.load(std::memory_order_acquire)) >> 16) == seen && Clock::now() < until)
        for (int i = 0; i < 64; ++i) cpu_relax();
      if ((s >> 16) == seen) {
        std::unique_lock<std::mutex> guard(pool->lock);
        pool->wake.wait(guard, [&] { return (pool->state.load(std::memory_order_acquire) >> 16) != seen; });
        s = pool->state.load(std::memory_order_acquire);
      }
    }
    seen = s >> 16;
    if (w < (int)(s & 0xffff)) {
      const Batch& b = pool->batch;
      {
        SpreadPart apart(pool->cores, b.spread);
        run_job(b.dojob, b.jobdata, b.elsize, b.dojob_data, w);
      }
      if (pool->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        { std::lock_guard<std::mutex> caller(pool->lock); }
        pool->done.notify_all();
      }
    }
  }
}

// The child of a fork has none of the parent's workers, and its mutexes may have been held by a thread that is
// not there: it starts over with a new pool (the old one is left as it is).
void forget_pool_in_child() { the_pool.store(nullptr, std::memory_order_release); }

Pool* pool() {
  Pool* p = the_pool.load(std::memory_order_acquire);
  if (p) return p;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, forget_pool_in_child); });
  Pool* fresh = new (std::nothrow) Pool();  // never freed: workers may still wait on it at exit
  if (!fresh) return nullptr;
  if (!the_pool.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) {
    delete fresh;
    return p;
  }
  return fresh;
}

// Jobs 1.. on threads of their own, job 0 here.  If no thread can be started, the rest run here one after the
// other (the best that is left; OpenBLAS gives jobs that wait for each other only to calls with threads).
void run_on_new_threads(ptn_blas_dojob dojob, int numjobs, char* jobdata, size_t elsize, int dojob_data) {
  std::vector<std::thread> threads;
  int started = 1;
  try {
    threads.reserve(numjobs - 1);
    for (; started < numjobs; ++started)
      threads.emplace_back(run_job, dojob, jobdata, elsize, dojob_data, started);
  } catch (const std::exception&) {
  }
  run_job(dojob, jobdata, elsize, dojob_data, 0);
  for (int i = started; i < numjobs; ++i) run_job(dojob, jobdata, elsize, dojob_data, i);
  for (auto& t : threads) t.join();
}

// Starts workers until there are `want`; false if the system refuses a thread.
bool start_workers(Pool* p, int want) {
  try {
    const uint64_t seen = p->state.load(std::memory_order_relaxed) >> 16;
    for (int w = p->workers.load(); w < want; p->workers.store(++w)) std::thread(worker_loop, p, w + 1, seen).detach();
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The jobs of one call on the pool's workers (threads apart where they serve another call).  OpenBLAS's calls hold
// their library's lock throughout (one_library); the kernels' parts need none.
void run_call(ptn_blas_dojob dojob, int numjobs, size_t jobdata_elsize, void* jobdata, int dojob_data,
              bool one_library) {
  char* data = (char*)jobdata;
  if (numjobs <= 1) {
    if (numjobs == 1) run_job(dojob, data, jobdata_elsize, dojob_data, 0);
    return;
  }
  n_calls.fetch_add(1, std::memory_order_relaxed);
  Pool* p = running_job_of == dojob ? nullptr : pool();  // a call from inside a job of the same library: apart
  std::mutex* library = p && one_library ? p->library_lock(dojob) : nullptr;
  if (!p || (one_library && !library)) return run_on_new_threads(dojob, numjobs, data, jobdata_elsize, dojob_data);
  std::unique_lock<std::mutex> one_call_per_library;
  if (library) one_call_per_library = std::unique_lock<std::mutex>(*library);
  if (numjobs > 0xffff || holds_workers || !p->busy.try_lock())  // the workers serve another call: threads apart
    return run_on_new_threads(dojob, numjobs, data, jobdata_elsize, dojob_data);
  std::lock_guard<std::mutex> hold(p->busy, std::adopt_lock);
  struct Holding {
    Holding() { holds_workers = true; }
    ~Holding() { holds_workers = false; }
  } holding;
  if (!start_workers(p, numjobs - 1)) return run_on_new_threads(dojob, numjobs, data, jobdata_elsize, dojob_data);
  p->batch = Batch{dojob, data, jobdata_elsize, dojob_data, !one_library};
  p->cores.store(this_core_bit(), std::memory_order_relaxed);
  p->remaining.store(numjobs - 1, std::memory_order_relaxed);
  const uint64_t call = (p->state.load(std::memory_order_relaxed) >> 16) + 1;
  p->state.store((call << 16) | (uint64_t)numjobs, std::memory_order_release);
  { std::lock_guard<std::mutex> sleepers(p->lock); }
  p->wake.notify_all();
  run_job(dojob, data, jobdata_elsize, dojob_data, 0);
  const Clock::time_point until = Clock::now() + kSpin;
  while (p->remaining.load(std::memory_order_acquire) != 0 && Clock::now() < until) cpu_relax();
  if (p->remaining.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> guard(p->lock);
    p->done.wait(guard, [&] { return p->remaining.load(std::memory_order_acquire) == 0; });
  }
}

}  // namespace

extern "C" void ptn_blas_threads_run(int, ptn_blas_dojob dojob, int numjobs, size_t jobdata_elsize, void* jobdata,
                                     int dojob_data) {
  run_call(dojob, numjobs, jobdata_elsize, jobdata, dojob_data, true);
}

extern "C" void ptn_parts_run(ptn_blas_dojob job, int numjobs, size_t jobdata_elsize, void* jobdata) {
  run_call(job, numjobs, jobdata_elsize, jobdata, 0, false);
}

extern "C" int64_t ptn_blas_threads_calls(void) { return n_calls.load(std::memory_order_relaxed); }

extern "C" int ptn_blas_threads_workers(void) {
  Pool* p = the_pool.load(std::memory_order_acquire);
  return p ? p->workers.load() : 0;
}
