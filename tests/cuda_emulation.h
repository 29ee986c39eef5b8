// CUDA emulation for tests (tests/test_cuda_emulation.py): a kernel file's CUDA branches (CUDA = 1), compiled by the
// host compiler after the dialect header, run on the CPU with what matters for their logic kept as on a GPU:
//
// - A launch runs every block and, in each block, every thread as a fiber (ucontext): __syncthreads is a real
//   barrier (threads that have returned no longer count), and between barriers the threads run one after the other
//   in a fresh pseudo-random order each time, so a missing barrier shows.  Blocks run in reverse order.  Dynamic
//   shared memory (DEF_SHARED) is one buffer per block, filled with 0xff bytes (NaN) when the block starts;
//   `__shared__` arrays are static (one per kernel).  The dialect's block reductions get the real barrier.  A launch
//   that CUDA refuses (an empty grid, too many threads or too much shared memory) is an error.
// - start_dev_kernel launches PTN_EMU_GRID x PTN_EMU_BLOCK threads (grid-stride loops must not depend on the
//   launch size); start_dev_kernel2 launches what it is given, as on CUDA.
// - Device memory: like the CUDA entry point, every input not in host memory and every output gets its own
//   C-contiguous buffer (inputs copied in, outputs zeroed unless they hold an input's copy, copied back at the end).
//   Each buffer ends on a guard page and is inaccessible outside kernel launches and the dialect's device copies,
//   so host code that reads or writes device memory, and a kernel that runs past the end of a buffer, fault; the
//   fault becomes an error naming the buffer.  ptn::Scratch blocks are device buffers too.
// - A failed check in device code is "check failed in device code at line N" at the next HANDLE_LAST_ERROR, as on
//   CUDA.  A device_malloc block not freed by the end of the body is an error.  GEMMs run on the host BLAS with
//   device memory open (an empty product, which the CUDA dialect turns into a device-side C = beta * C, too).
//
// Inserted as support code: it closes the op's namespace for its own includes and reopens it at the end.
}  // namespace @NS@

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef PTN_EMU_GRID
#define PTN_EMU_GRID 3
#endif
#ifndef PTN_EMU_BLOCK
#define PTN_EMU_BLOCK 32
#endif

namespace ptn_emu {

// ---------------------------------------------------------------- device buffers
struct Region {
  char* base;        // mapping: data pages, then one guard page
  size_t map_bytes;
  char* data;        // ends where the guard page starts
  size_t bytes;
  std::string name;
};
static std::vector<Region> regions;
static int open_depth = 0;  // > 0 while device code (a launch, a device copy, a GEMM) runs

// ---------------------------------------------------------------- accounting
struct Counts {
  long long launches = 0, allocs = 0, h2d = 0, d2h = 0;
};
static Counts counts;
// What the CUDA dialect keeps between calls: the sizes of its free scratch blocks (ptn::ScratchPool: a block serves
// a request of at most its size and more than half of it), and the entry's per-argument device buffers.
static std::vector<size_t> cached_blocks;
static std::vector<size_t> entry_buffers;
inline void count_alloc(size_t bytes) {
  size_t best = (size_t)-1, at = 0;
  for (size_t i = 0; i < cached_blocks.size(); ++i)
    if (cached_blocks[i] >= bytes && cached_blocks[i] / 2 < bytes && cached_blocks[i] < best) {
      best = cached_blocks[i];
      at = i;
    }
  if (best == (size_t)-1) {
    ++counts.allocs;
    return;
  }
  cached_blocks.erase(cached_blocks.begin() + at);
}
inline void count_free(size_t bytes) { cached_blocks.push_back(bytes); }
inline void count_entry_buffer(size_t j, size_t bytes) {
  if (entry_buffers.size() <= j) entry_buffers.resize(j + 1, 0);
  if (entry_buffers[j] < bytes) {
    entry_buffers[j] = bytes;
    ++counts.allocs;
  }
}

inline size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }

inline void set_access(bool open) {
  for (Region& r : regions)
    if (mprotect(r.base, r.map_bytes - page_size(), open ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
      ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: mprotect failed");
}

// Device memory is accessible while an Open is alive.
struct Open {
  Open() { if (open_depth++ == 0) set_access(true); }
  ~Open() { if (--open_depth == 0) set_access(false); }
};

inline char* new_region(size_t bytes, const std::string& name) {
  const size_t pg = page_size();
  const size_t data_pages = (bytes + pg - 1) / pg + (bytes == 0);
  const size_t map_bytes = (data_pages + 1) * pg;
  void* p = mmap(0, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: mmap failed");
  char* base = (char*)p;
  if (open_depth > 0 && mprotect(base, map_bytes - pg, PROT_READ | PROT_WRITE) != 0)
    ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: mprotect failed");
  char* data = base + data_pages * pg - bytes;
  regions.push_back(Region{base, map_bytes, data, bytes, name});
  return data;
}

inline void free_region(void* data) {
  for (size_t i = 0; i < regions.size(); ++i)
    if (regions[i].data == data) {
      munmap(regions[i].base, regions[i].map_bytes);
      regions.erase(regions.begin() + i);
      return;
    }
}

inline size_t region_bytes(const void* data) {
  for (const Region& r : regions)
    if (r.data == data) return r.bytes;
  return 0;
}

inline void* dev_alloc(size_t n, const char* what = "device_malloc") {
  Open open;
  count_alloc(n);
  return new_region(n, what);
}

inline void dev_free(void* p) {
  if (!p) return;
  count_free(region_bytes(p));
  free_region(p);
}

inline void device_copy(void* dst, const void* src, size_t n) {
  Open open;
  if (n) memmove(dst, src, n);
}

inline void copy_to_host(void* dst, const void* src, size_t n) {
  counts.d2h += (long long)n;
  device_copy(dst, src, n);
}

inline void device_set(void* p, int c, size_t n) {
  Open open;
  if (n) memset(p, c, n);
}

// ---------------------------------------------------------------- device errors (sticky, as the CUDA flag)
static int device_error_line = 0;
static std::string device_error_what;
static bool in_device = false;  // a fiber (kernel code) is running
struct DeviceCheck {
  int line;
};

[[noreturn]] inline void device_check_failed(int line) { throw DeviceCheck{line}; }

inline void check_device_flag() {
  if (!device_error_line) return;
  std::ostringstream s;
  if (device_error_line > 0)
    s << "check failed in device code at line " << device_error_line;
  else
    s << "exception in device code (not possible on CUDA): " << device_error_what;
  device_error_line = 0;
  device_error_what.clear();
  ptn::raise(PTN_STATUS_VALUE, s.str());
}

// ---------------------------------------------------------------- launches
struct Fiber {
  ucontext_t ctx;
  char* stack = 0;
  bool started = false, done = false, waiting = false;
  dim3 tid;
};
static const size_t kStackBytes = (size_t)1 << 19;
static std::vector<char*> free_stacks;
static ucontext_t scheduler;
static Fiber* current = 0;
static void (*current_call)(void*) = 0;
static void* current_arg = 0;
static std::vector<unsigned char> block_shared;

inline void fiber_main() {
  Fiber* f = current;
  try {
    current_call(current_arg);
  } catch (const DeviceCheck& e) {
    if (!device_error_line) device_error_line = e.line;
  } catch (const std::exception& e) {
    if (!device_error_line) {
      device_error_line = -1;
      device_error_what = e.what();
    }
  }
  f->done = true;
}  // returns to `scheduler` (uc_link)

inline void sync_threads() {
  if (!current) return;  // host code
  Fiber* f = current;
  f->waiting = true;
  swapcontext(&f->ctx, &scheduler);
}

inline void* dynamic_shared() { return block_shared.data(); }

template <typename F>
void call_kernel(void* arg) { (*(F*)arg)(); }

inline void run_fiber(Fiber& f) {
  if (!f.started) {
    if (free_stacks.empty()) {
      char* s = (char*)malloc(kStackBytes);
      if (!s) ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: out of memory for a thread stack");
      free_stacks.push_back(s);
    }
    f.stack = free_stacks.back();
    free_stacks.pop_back();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &scheduler;
    makecontext(&f.ctx, (void (*)())fiber_main, 0);
    f.started = true;
  }
  ptn::thread_idx = f.tid;
  current = &f;
  in_device = true;
  swapcontext(&scheduler, &f.ctx);
  in_device = false;
  current = 0;
  if (f.done) {
    free_stacks.push_back(f.stack);
    f.stack = 0;
  }
}

// Resets the launch state after a fault left a launch through siglongjmp (its fibers' stacks are dropped).
inline void abandon_launch() {
  current = 0;
  in_device = false;
  ptn::thread_idx = ptn::block_idx = dim3(0, 0, 0);
  ptn::block_dim = ptn::grid_dim = dim3();
  ptn::shared_size = 0;
}

// The order in which the threads of a block run between two barriers: a fresh pseudo-random permutation each
// time (a fixed xorshift sequence from the start of each call), so that a missing barrier shows whichever way.
static uint64_t order_state = 0x9E3779B97F4A7C15ull;
inline void shuffle(std::vector<unsigned>& order) {
  for (size_t i = order.size(); i > 1; --i) {
    order_state ^= order_state << 13;
    order_state ^= order_state >> 7;
    order_state ^= order_state << 17;
    std::swap(order[i - 1], order[order_state % i]);
  }
}

template <typename F>
void launch(dim3 grid, dim3 block, size_t shmem, F&& call) {
  typedef typename std::remove_reference<F>::type Call;
  Open open;
  const unsigned nt = block.x * block.y * block.z;
  // What CUDA refuses at launch ("invalid configuration argument"; the default 48 KiB of dynamic shared memory).
  if (nt == 0 || nt > 1024 || block.z > 64)
    ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: a block needs 1 to 1024 threads (block.z <= 64)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u)
    ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: an empty or too large grid (invalid configuration on CUDA)");
  if (shmem > 48 * 1024) ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: more than 48 KiB of dynamic shared memory");
  ++counts.launches;
  ptn::grid_dim = grid;
  ptn::block_dim = block;
  ptn::shared_size = shmem;
  current_call = &call_kernel<Call>;
  current_arg = (void*)&call;
  std::vector<Fiber> fibers(nt);
  std::vector<unsigned> order(nt);
  for (unsigned k = 0; k < nt; ++k) order[k] = k;
  for (long long bz = grid.z - 1; bz >= 0; --bz)
    for (long long by = grid.y - 1; by >= 0; --by)
      for (long long bx = grid.x - 1; bx >= 0; --bx) {
        ptn::block_idx = dim3((unsigned)bx, (unsigned)by, (unsigned)bz);
        block_shared.assign(shmem, 0xff);
        unsigned i = 0;
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx) fibers[i++] = Fiber{ucontext_t(), 0, false, false, false,
                                                                            dim3(tx, ty, tz)};
        for (;;) {
          bool live = false;
          shuffle(order);
          for (unsigned k : order) {
            Fiber& f = fibers[k];
            if (f.done) continue;
            if (!f.waiting) run_fiber(f);
            live = live || !f.done;
          }
          if (!live) break;
          for (Fiber& f : fibers) f.waiting = false;  // every live thread reached the barrier
        }
      }
  abandon_launch();
}
inline dim3 as_dim3(dim3 d) { return d; }
inline dim3 as_dim3(long long n) { return dim3((unsigned int)n); }

// The real barrier for the dialect's block reductions (compiled before this file, with a no-op one by default).
struct Barrier { void operator()() const { sync_threads(); } };

// ---------------------------------------------------------------- GEMM (cuBLAS on CUDA)
// An empty product (k = 0): the CUDA dialect sets C = beta * C on the device (a memset for beta = 0); the CPU
// branch that the emulation compiles does it on the host, so the buffers are open meanwhile.
struct EmptyProduct {
  bool empty;
  explicit EmptyProduct(int64_t k) : empty(k == 0) { if (empty && open_depth++ == 0) set_access(true); }
  ~EmptyProduct() { if (empty && --open_depth == 0) set_access(false); }
};

template <typename T>
void affine(const T* A, int64_t a0, int64_t a1, const T* B, int64_t b0, int64_t b1, T* C, int64_t c0, int64_t c1,
            bool transA = false, bool transB = false, double beta = 1.0, double alpha = 1.0, int64_t ldA_factor = 1,
            int64_t ldB_factor = 1) {
  Open open;
  ::affine_raw(A, a0, a1, B, b0, b1, C, c0, c1, transA, transB, beta, alpha, ldA_factor, ldB_factor);
}

// BLAS through the pointers the dialect calls (native_op_typed.h's helpers call affine_raw before this file):
// device memory is accessible while a GEMM runs, as cuBLAS reads device memory.
static ptn::sgemm_t host_sgemm = 0;
static ptn::dgemm_t host_dgemm = 0;
inline void open_sgemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                       const float* A, const int* lda, const float* B, const int* ldb, const float* beta, float* C,
                       const int* ldc) {
  Open open;
  ++counts.launches;  // a cuBLAS launch
  host_sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void open_dgemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
                       const double* A, const int* lda, const double* B, const int* ldb, const double* beta, double* C,
                       const int* ldc) {
  Open open;
  ++counts.launches;
  host_dgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void route_blas() {
  if (ptn::blas_sgemm && ptn::blas_sgemm != &open_sgemm) {
    host_sgemm = ptn::blas_sgemm;
    ptn::blas_sgemm = &open_sgemm;
  }
  if (ptn::blas_dgemm && ptn::blas_dgemm != &open_dgemm) {
    host_dgemm = ptn::blas_dgemm;
    ptn::blas_dgemm = &open_dgemm;
  }
}

// ---------------------------------------------------------------- the op's body on device buffers
static sigjmp_buf* fault_jump = 0;
static const Region* fault_region = 0;
static bool fault_in_device = false, fault_in_guard = false;
static struct sigaction old_segv, old_bus;

inline void on_fault(int sig, siginfo_t* info, void*) {
  char* a = (char*)info->si_addr;
  for (const Region& r : regions)
    if (fault_jump && a >= r.base && a < r.base + r.map_bytes) {
      fault_region = &r;
      fault_in_device = in_device;
      fault_in_guard = a >= r.base + r.map_bytes - page_size();
      siglongjmp(*fault_jump, 1);
    }
  sigaction(sig, sig == SIGSEGV ? &old_segv : &old_bus, 0);  // not ours: the previous handler, on the next try
}

inline int64_t strided_offset(const Ndarray& v, int64_t flat) {
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    off += (flat % v.dims[d]) * v.strides[d];
    flat /= v.dims[d];
  }
  return off;
}

inline void copy_strided(const Ndarray& from, const Ndarray& to) {
  const int64_t n = ptn::n_elements(&from);
  for (int64_t i = 0; i < n; ++i)
    memcpy((char*)to.data + strided_offset(to, i), (const char*)from.data + strided_offset(from, i), from.itemsize);
}

// Appends this call's counts to the file named by PTNATIVE_EMU_COUNTS, if set.
inline void report_counts(int n_in, int n_out, const char* const* names) {
  const char* path = getenv("PTNATIVE_EMU_COUNTS");
  if (!path || !path[0]) return;
  FILE* f = fopen(path, "a");
  if (!f) return;
  for (int j = 0; j < n_in + n_out; ++j) fprintf(f, "%s%s", j == n_in ? " -> " : (j ? "," : ""), names[j]);
  fprintf(f, ": launches=%lld allocs=%lld h2d=%lld d2h=%lld\n", counts.launches, counts.allocs, counts.h2d,
          counts.d2h);
  fclose(f);
}

// Runs body(n_in, inputs, n_out, outputs) as the CUDA entry point would: on device copies of the arrays.
template <typename F>
void run_body(int n_in, Ndarray** inputs, int n_out, Ndarray*** outputs, const int* host_memory,
              const char* const* names, F&& body) {
  route_blas();
  counts = Counts();
  order_state = 0x9E3779B97F4A7C15ull;  // every call runs its threads in the same orders (atomics add up alike)
  for (Region& r : regions) munmap(r.base, r.map_bytes);  // left by a fault in an earlier call
  regions.clear();
  std::vector<Ndarray*> host;  // distinct arrays: outputs, then inputs (an inplace input is its output's view)
  std::vector<std::string> what;
  for (int k = 0; k < n_out; ++k) {
    host.push_back(*outputs[k]);
    what.push_back(std::string("output '") + names[n_in + k] + "'");
  }
  for (int i = 0; i < n_in; ++i)
    if (!host_memory[i] && std::find(host.begin(), host.end(), inputs[i]) == host.end()) {
      host.push_back(inputs[i]);
      what.push_back(std::string("input '") + names[i] + "'");
    }
  std::vector<Ndarray> dev(host.size());
  {
    Open open;
    for (size_t j = 0; j < host.size(); ++j) {
      Ndarray& v = dev[j];
      v = *host[j];
      int64_t stride = v.itemsize;
      for (int d = v.ndim - 1; d >= 0; --d) {
        v.strides[d] = stride;
        stride *= v.dims[d];
      }
      const size_t bytes = (size_t)ptn::n_elements(&v) * v.itemsize;
      v.data = new_region(bytes, what[j]);
      count_entry_buffer(j, bytes ? bytes : 1);
      copy_strided(*host[j], v);
      // inputs, and outputs that hold an input's copy (an inplace input), are copied in
      bool copied_in = j >= (size_t)n_out;
      for (int i = 0; i < n_in && !copied_in; ++i) copied_in = inputs[i] == host[j];
      if (copied_in) counts.h2d += (long long)bytes;
    }
  }
  auto device_view = [&](Ndarray* a) {
    size_t j = std::find(host.begin(), host.end(), a) - host.begin();
    return j < host.size() ? &dev[j] : a;
  };
  std::vector<Ndarray*> ins(n_in + 1), outs(n_out + 1);
  std::vector<Ndarray**> out_slots(n_out + 1);
  for (int i = 0; i < n_in; ++i) ins[i] = device_view(inputs[i]);
  for (int k = 0; k < n_out; ++k) {
    outs[k] = &dev[k];
    out_slots[k] = &outs[k];
  }

  sigjmp_buf jump;
  struct sigaction act;
  memset(&act, 0, sizeof(act));
  act.sa_sigaction = on_fault;
  act.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&act.sa_mask);
  sigaction(SIGSEGV, &act, &old_segv);
  sigaction(SIGBUS, &act, &old_bus);
  std::exception_ptr error;
  std::string fault;
  if (sigsetjmp(jump, 1) == 0) {
    fault_jump = &jump;
    try {
      body(n_in, ins.data(), n_out, out_slots.data());
      check_device_flag();
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    fault = std::string(fault_in_device ? "kernel code" : "host code") +
            (fault_in_guard ? " ran past the end of the device buffer of " : " touched the device buffer of ") +
            fault_region->name;
    open_depth = 0;
    abandon_launch();
  }
  fault_jump = 0;
  sigaction(SIGSEGV, &old_segv, 0);
  sigaction(SIGBUS, &old_bus, 0);
  {
    Open open;
    if (!error && fault.empty())
      for (int k = 0; k < n_out; ++k) {
        copy_strided(dev[k], *host[k]);
        counts.d2h += (long long)ptn::n_elements(&dev[k]) * dev[k].itemsize;
      }
  }
  if (!error && fault.empty()) report_counts(n_in, n_out, names);
  for (Ndarray& v : dev) free_region(v.data);
  const size_t leaked = regions.size();
  for (Region& r : regions) munmap(r.base, r.map_bytes);
  regions.clear();
  if (leaked && fault.empty() && !error)
    ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: " + std::to_string(leaked) + " device_malloc block(s) not freed");
  if (!fault.empty()) ptn::raise(PTN_STATUS_RUNTIME, "cuda emulation: " + fault);
  if (error) std::rethrow_exception(error);
}

}  // namespace ptn_emu

// CUDA's own qualifiers, for kernel code that spells them out instead of using the dialect's DEV_FUNC etc.
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline

// Device-side integer intrinsics used by kernel files.
inline int atomicCAS(int* a, int c, int v) { return ptn::host_atomic_cas(a, c, v); }
inline unsigned int atomicCAS(unsigned int* a, unsigned int c, unsigned int v) { return ptn::host_atomic_cas(a, c, v); }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long c, unsigned long long v) {
  return ptn::host_atomic_cas(a, c, v);
}
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }

#undef assert_cmp
#define assert_cmp(a, cmp, b)                                                                   \
  do {                                                                                          \
    auto _ptn_a = (a);                                                                          \
    auto _ptn_b = (b);                                                                          \
    if (!(_ptn_a cmp _ptn_b)) {                                                                 \
      if (ptn_emu::in_device) ptn_emu::device_check_failed(__LINE__);                           \
      ptn::check_failed(#a " " #cmp " " #b, _ptn_a, _ptn_b, __FILE__, __LINE__);                \
    }                                                                                           \
  } while (0)
#undef ptn_assert
#define ptn_assert(x)                                                   \
  do {                                                                  \
    if (!(x)) {                                                         \
      if (ptn_emu::in_device) ptn_emu::device_check_failed(__LINE__);   \
      ptn::assert_failed(#x, __FILE__, __LINE__);                       \
    }                                                                   \
  } while (0)
#undef __syncthreads
#define __syncthreads() ptn_emu::sync_threads()
#define __shared__ static
#undef DEF_SHARED
#define DEF_SHARED(type, name) type* name = (type*)ptn_emu::dynamic_shared()
#define ptn_block_reduce(sh, v, op) ptn_block_reduce((sh), (v), (op), ptn_emu::Barrier())
#undef HANDLE_LAST_ERROR
#define HANDLE_LAST_ERROR() ptn_emu::check_device_flag()
#undef start_dev_kernel
#define start_dev_kernel(kernel, args) \
  ptn_emu::launch(dim3(PTN_EMU_GRID), dim3(PTN_EMU_BLOCK), 0, [&]() { kernel args; })
#undef start_dev_kernel2
#define start_dev_kernel2(kernel, dim_grid, dim_block, shmem, args) \
  ptn_emu::launch(ptn_emu::as_dim3(dim_grid), ptn_emu::as_dim3(dim_block), (shmem), [&]() { kernel args; })
#undef Ndarray_memcpy
#define Ndarray_memcpy(y, x, size) ptn_emu::device_copy((y), (x), (size))
#undef Ndarray_memset
#define Ndarray_memset(p, c, size) ptn_emu::device_set((p), (c), (size))
#undef Ndarray_copy_to_host
#define Ndarray_copy_to_host(dst, src, size) ptn_emu::copy_to_host((dst), (src), (size))
#undef device_malloc
#define device_malloc(n) ptn_emu::dev_alloc(n)
#undef device_free
#define device_free(p) ptn_emu::dev_free(p)

// ptn::Scratch as on CUDA: its blocks are device buffers (guarded, inaccessible to host code) and counted.
namespace ptn {
class EmuScratch {
 public:
  EmuScratch() = default;
  EmuScratch(const EmuScratch&) = delete;
  EmuScratch& operator=(const EmuScratch&) = delete;
  ~EmuScratch() {
    for (void* p : blocks_) ptn_emu::dev_free(p);
  }
  template <typename T>
  T* get(int64_t n) {
    blocks_.reserve(blocks_.size() + 1);
    void* p = ptn_emu::dev_alloc((size_t)(n > 1 ? n : 1) * sizeof(T), "a ptn::Scratch block");
    blocks_.push_back(p);
    return (T*)p;
  }

 private:
  std::vector<void*> blocks_;
};
}  // namespace ptn
#define Scratch EmuScratch
#define affine_raw(...) ptn_emu::affine(__VA_ARGS__)

namespace @NS@ {
// native_op_typed.h's GEMM helpers (compiled before this file), with device memory open for an empty product.
inline void ptn_emu_affine_y_x(int64_t x_A, Ndarray* A, int64_t x_B, Ndarray* B, int64_t x_C, Ndarray* C,
                               bool transA = false, bool transB = false, double beta = 1.0) {
  int64_t a[2], c[2];
  last_two_dims(A, a);
  last_two_dims(C, c);
  const int64_t k = transA ? a[0] : a[1];
  ptn_emu::EmptyProduct device_side(k);
  (affine_y_x)(x_A, A, x_B, B, x_C, C, transA, transB, beta);
}
inline void ptn_emu_affine_global(Ndarray* A, Ndarray* B, Ndarray* C, bool transA = false, bool transB = false,
                                  int64_t offset = 0, double beta = 1.0) {
  int64_t a[2], c[2];
  last_two_dims(A, a);
  last_two_dims(C, c);
  const int64_t a_rows = ptn::n_elements(A) / std::max<int64_t>(a[1], 1) - offset * a[0];
  const int64_t k = transA ? a_rows : a[1];
  ptn_emu::EmptyProduct device_side(k);
  (affine_global)(A, B, C, transA, transB, offset, beta);
}
#define affine_y_x(...) ptn_emu_affine_y_x(__VA_ARGS__)
#define affine_global(...) ptn_emu_affine_global(__VA_ARGS__)
