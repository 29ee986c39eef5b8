// ptnative kernel dialect.
//
// One kernel text, written CUDA-style, compiles for the CPU (g++: a launch is a
// loop over blocks and threads) and for CUDA (nvcc).  Kernel code sees
// `Ndarray*` views, `Float` (the op's floating type, see native_op_typed.h) and
// the macros below.  Nothing here aborts the process: every failed check
// throws `ptn::Error` on the host (turned into a status + message by the
// entry point) and sets a flag on the device (checked after the launch).
#ifndef PTNATIVE_NATIVE_OP_H
#define PTNATIVE_NATIVE_OP_H

#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <stdio.h>
#include <math.h>
#include <cmath>
#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>
#if !CUDA
#include <exception>
#include <atomic>
#include <chrono>
#include <thread>
#include <type_traits>
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <math_constants.h>
#include <mutex>
#define PTN_CUDA 1
#else
#define PTN_CUDA 0
#endif
#ifndef CUDA
#define CUDA PTN_CUDA
#endif

#define PTN_EXPORT __attribute__((visibility("default")))
#define PTN_MAX_NDIM 8
#define PTN_STATUS_OK 0
#define PTN_STATUS_RUNTIME 1
#define PTN_STATUS_VALUE 2

typedef int64_t Ndarray_DIM_Type;
typedef const int64_t* Ndarray_DIMS_Type;

// A view on one input or output buffer.  Strides are in bytes.
struct Ndarray {
  void* data;
  int ndim;
  int itemsize;
  int64_t dims[PTN_MAX_NDIM];
  int64_t strides[PTN_MAX_NDIM];
};

namespace ptn {

// ---------------------------------------------------------------- errors
struct Error : public std::runtime_error {
  int status;
  Error(int status_, const std::string& msg) : std::runtime_error(msg), status(status_) {}
};

[[noreturn]] inline void raise(int status, const std::string& msg) { throw Error(status, msg); }

template <typename A, typename B>
[[noreturn]] void check_failed(const char* expr, const A& a, const B& b, const char* file, int line) {
  std::ostringstream s;
  s << "check failed: " << expr << " (" << +a << " vs " << +b << ") at " << file << ":" << line;
  raise(PTN_STATUS_VALUE, s.str());
}

[[noreturn]] inline void assert_failed(const char* expr, const char* file, int line) {
  std::ostringstream s;
  s << "check failed: " << expr << " at " << file << ":" << line;
  raise(PTN_STATUS_VALUE, s.str());
}

// `%(fail)s` in fw/bw code: bail out, with the message set by `ptn_set_error` if any.
static thread_local std::string pending_error;
inline void set_error(const std::string& msg) { pending_error = msg; }
[[noreturn]] inline void fail_pending() {
  std::string msg = pending_error.empty() ? std::string("kernel code signalled failure") : pending_error;
  pending_error.clear();
  raise(PTN_STATUS_RUNTIME, msg);
}

// ---------------------------------------------------------------- arrays
inline int64_t n_elements(const Ndarray* a) {
  int64_t n = 1;
  for (int i = 0; i < a->ndim; ++i) n *= a->dims[i];
  return n;
}

// A ValueError "<name>.shape[k] = <got>; expected <what> = <want>" unless a's dim k is `want` (a shape check
// in the terms of the op's inputs).
inline void require_dim(const Ndarray* a, const char* name, int k, int64_t want, const char* what) {
  if (k < a->ndim && a->dims[k] == want) return;
  std::ostringstream s;
  s << name << ".shape[" << k << "] = " << (k < a->ndim ? a->dims[k] : -1) << "; expected " << what << " = " << want;
  raise(PTN_STATUS_VALUE, s.str());
}

// Start of time frame `t` of a C-contiguous 3-D array (2-D: the whole matrix).
inline char* data_ptr_bytes(const Ndarray* a, int64_t t) {
  if (a->ndim == 2) return (char*)a->data;
  if (a->ndim != 3) check_failed("data_ptr: Ndarray_NDIM(a) in {2, 3}", a->ndim, 3, __FILE__, __LINE__);
  return (char*)a->data + t * a->dims[1] * a->dims[2] * a->itemsize;
}

#if !CUDA
// ---------------------------------------------------------------- CPU threads
// Worker threads for host code that splits independent work: $PTNATIVE_NUM_THREADS, else $OMP_NUM_THREADS,
// else the hardware's count.
inline int cpu_threads() {
  for (const char* var : {"PTNATIVE_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = getenv(var);
    if (v && atoi(v) > 0) return atoi(v);
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? (int)hw : 1;
}

// OpenBLAS's own worker pool, when the BLAS we were handed is OpenBLAS with its pthread server (set by
// set_blas; see native_op_blas.h).  `gotoblas_pthread(n, fn, args, stride)` runs fn(args + i * stride) for
// i < n, part 0 on the calling thread and the others on OpenBLAS's workers, and returns when all are done.
// Running our parts there instead of on threads of our own keeps the process at one worker per core: after
// each BLAS call OpenBLAS's idle workers spin for ~0.1 s, and would take a core from our threads.
typedef int (*blas_pool_run_t)(int, void*, void*, int);
typedef int (*blas_pool_size_t)(void);
static blas_pool_run_t blas_pool_run = 0;
static blas_pool_size_t blas_pool_size = 0;
static thread_local bool in_parallel_part = false;  // BLAS must not be called from a part (see gemm_colmajor)

template <typename F>
struct PoolPart {
  F* body;
  int part;
  std::exception_ptr* error;
  static void run(void* arg) {
    PoolPart* p = (PoolPart*)arg;
    bool was = in_parallel_part;
    in_parallel_part = true;
    try { (*p->body)(p->part); } catch (...) { *p->error = std::current_exception(); }
    in_parallel_part = was;
  }
};

// The process's worker pool (c_code/runtime/blas_threads.h, ptn_parts_run), handed to each library at load time
// (set_parts_pool; null where the pool could not be built: parts then run on threads started for the call).
// run(job, n, elsize, jobs) runs job(i, jobs + i * elsize, 0) for every i < n, all at once, job 0 on the calling
// thread, and returns when all are done.  Its workers are kept between calls and wait for the next one by spinning
// for a while before they sleep, and on Linux a part that finds another part of its call on its core moves to a
// free one for the call: threads started anew at each call cost the start, and the system tends to put a new or a
// woken thread on its creator's core (measured: in most calls of an LSTM layer after an idle pause, both parts of
// the recurrence shared one core and waited for each other at every frame).
typedef void (*parts_job_t)(int, void*, int);
typedef void (*parts_pool_run_t)(parts_job_t, int, size_t, void*);
static parts_pool_run_t parts_pool_run = 0;

// A part's job in the pool's terms: one function per library, whatever the body.
struct ErasedPart {
  void (*run)(void*);
  void* job;
  static void run_job(int, void* arg, int) { ((ErasedPart*)arg)->run(((ErasedPart*)arg)->job); }
};

// Where parallel_parts runs the parts after the first.  OpenBLAS's workers wait for work by spinning: beside
// another busy process they and the caller fight over the cores (ctc_loss fwd+bwd T=100 B=16 on 2 threads beside
// one busy process: 7.9 ms on them, 2.2 ms on threads of its own, 2.9 ms on one thread).  Only kernels that call
// BLAS between their parallel parts (the LSTM recurrence) take them: right after a BLAS call the workers still
// spin and would take the cores from threads of our own.
enum class PartsOn { own_threads, blas_workers };

// Runs body(part) for every part in [0, parts): part 0 on the calling thread, the others on threads of their own
// (the process's pool where there is one and this is not itself a part; threads started for the call otherwise)
// or, with PartsOn::blas_workers, on OpenBLAS's workers when there are enough of them.  Returns when all are
// done; an exception in any part is rethrown here (the first one).  Parts must be independent (none may wait for
// another: there may be fewer workers than parts) and must not call BLAS (refused: see gemm_colmajor).
template <typename F>
void parallel_parts(int parts, F&& body, PartsOn on = PartsOn::own_threads) {
  if (parts <= 0) return;
  typedef typename std::remove_reference<F>::type Body;
  std::vector<std::exception_ptr> errors(parts);
  std::vector<PoolPart<Body>> jobs(parts);
  for (int p = 0; p < parts; ++p) jobs[p] = PoolPart<Body>{&body, p, &errors[p]};
  if (parts == 1) {
    PoolPart<Body>::run(&jobs[0]);
  } else if (on == PartsOn::blas_workers && blas_pool_run && !in_parallel_part && blas_pool_size() >= parts) {
    blas_pool_run(parts, (void*)&PoolPart<Body>::run, (void*)jobs.data(), (int)sizeof(PoolPart<Body>));
  } else if (parts_pool_run && !in_parallel_part) {
    std::vector<ErasedPart> erased(parts);
    for (int p = 0; p < parts; ++p) erased[p] = ErasedPart{&PoolPart<Body>::run, &jobs[p]};
    parts_pool_run(&ErasedPart::run_job, parts, sizeof(ErasedPart), erased.data());
  } else {
    std::vector<std::thread> threads;
    threads.reserve(parts - 1);
    for (int p = 1; p < parts; ++p) threads.emplace_back([&, p]() { PoolPart<Body>::run(&jobs[p]); });
    PoolPart<Body>::run(&jobs[0]);
    for (auto& t : threads) t.join();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}
#endif

// Hands the library the process's pool (see parts_pool_run); a no-op in CUDA builds, whose host code has no parts.
inline void set_parts_pool(void* run) {
#if !CUDA
  parts_pool_run = (parts_pool_run_t)run;
#else
  (void)run;
#endif
}

}  // namespace ptn

#define Ndarray_DEV_DATA(x) ((Float*)(x)->data)
#define Ndarray_DEV_DATA_int32(x) ((int32_t*)(x)->data)
#define Ndarray_DEV_DATA_int32_scalar(x) (((const int32_t*)(x)->data)[0])
#define Ndarray_HOST_DIMS(x) ((Ndarray_DIMS_Type)(x)->dims)
#define Ndarray_DIMS(x) Ndarray_HOST_DIMS(x)
#define Ndarray_NDIM(x) ((x)->ndim)
#define Ndarray_STRIDE(x, i) ((x)->strides[i] / (x)->itemsize)
#define Ndarray_SIZE(x) ptn::n_elements(x)
#define Ndarray_get_n_total_elements(x) ptn::n_elements(x)
#define Ndarray_dtype_size(x) ((x)->itemsize)
#define ARRAY_LEN(x) (sizeof(x) / sizeof((x)[0]))
#define ptn_set_error(msg) ptn::set_error(msg)

// ---------------------------------------------------------------- checks
#ifdef __CUDA_ARCH__
// Device side: remember the first failing line, skip the rest of this thread's work.
__device__ int ptn_device_error_line = 0;
#define assert_cmp(a, cmp, b) \
  do { if (!((a) cmp (b))) { atomicCAS(&ptn_device_error_line, 0, __LINE__); return; } } while (0)
#define ptn_assert(x) \
  do { if (!(x)) { atomicCAS(&ptn_device_error_line, 0, __LINE__); return; } } while (0)
#else
#if PTN_CUDA
__device__ int ptn_device_error_line = 0;
#endif
#define assert_cmp(a, cmp, b)                                                       \
  do {                                                                              \
    auto _ptn_a = (a);                                                              \
    auto _ptn_b = (b);                                                              \
    if (!(_ptn_a cmp _ptn_b)) ptn::check_failed(#a " " #cmp " " #b, _ptn_a, _ptn_b, __FILE__, __LINE__); \
  } while (0)
#define ptn_assert(x) do { if (!(x)) ptn::assert_failed(#x, __FILE__, __LINE__); } while (0)
#endif

// ---------------------------------------------------------------- kernels
#if PTN_CUDA

#define DEF_KERNEL __global__
#define DEV_FUNC __device__
#define HOST_FUNC __host__
#define DEF_SHARED(type, name) extern __shared__ type name[]
#define PTN_DIM_GRID 128
#define PTN_DIM_BLOCK 512
namespace ptn {
static cudaStream_t current_stream = 0;
// Per library, what its calls did on the device: kernel launches, device allocations (cudaMalloc), bytes copied
// host -> device and device -> host.  Counted when the library is built with PTN_COUNT_DEVICE_WORK (the setting
// PTNATIVE_COUNT_DEVICE_WORK=1, docs/gpu.md) and read through ptn_device_counts (ptnative.device.device_counts).
struct DeviceCounts {
  long long launches, allocs, h2d, d2h;
};
inline DeviceCounts& device_counts() {
  static DeviceCounts counts = {0, 0, 0, 0};
  return counts;
}
}  // namespace ptn
#ifdef PTN_COUNT_DEVICE_WORK
#define PTN_COUNT(field, n) (void)(ptn::device_counts().field += (long long)(n))
#else
#define PTN_COUNT(field, n) ((void)0)
#endif
namespace ptn {
inline void cuda_check(cudaError_t e, const char* file, int line) {
  if (e != cudaSuccess) {
    std::ostringstream s;
    s << "CUDA error " << (int)e << " (" << cudaGetErrorString(e) << ") at " << file << ":" << line;
    raise(PTN_STATUS_RUNTIME, s.str());
  }
}
// Device-to-host copy ordered after the work queued on the op's stream (which need not synchronise with the
// legacy default stream that plain cudaMemcpy uses); returns when the data is on the host.
inline void copy_to_host(void* dst, const void* src, size_t n, const char* file, int line) {
  if (n == 0) return;
  PTN_COUNT(d2h, n);
  cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, current_stream), file, line);
  cuda_check(cudaStreamSynchronize(current_stream), file, line);
}
inline void check_device_flag(const char* file, int line) {
  int err_line = 0;
  cuda_check(cudaMemcpyFromSymbolAsync(&err_line, ptn_device_error_line, sizeof(int), 0, cudaMemcpyDeviceToHost,
                                       current_stream), file, line);
  cuda_check(cudaStreamSynchronize(current_stream), file, line);
  if (err_line) {
    static const int zero = 0;
    cudaMemcpyToSymbolAsync(ptn_device_error_line, &zero, sizeof(int), 0, cudaMemcpyHostToDevice, current_stream);
    cudaStreamSynchronize(current_stream);
    std::ostringstream s;
    s << "check failed in device code at line " << err_line;
    raise(PTN_STATUS_VALUE, s.str());
  }
}
inline void* device_malloc(size_t n) {
  void* p = 0;
  if (n == 0) return 0;
  PTN_COUNT(allocs, 1);
  cuda_check(cudaMalloc(&p, n), __FILE__, __LINE__);
  return p;
}
inline void device_free(void* p) { if (p) cudaFree(p); }

// Device blocks of Scratch, kept between calls (cudaMalloc and cudaFree synchronise the whole device): a freed
// block serves a later request of at most its size and more than half of it.  An event recorded on the releasing
// call's stream marks the end of its work there; reused from another stream, the block's new work is queued after
// that event (cudaStreamWaitEvent: no host wait, and valid after the releasing stream is gone).  At most 4 GiB are
// kept; beyond, or where no event can be recorded, blocks are freed.
struct ScratchPool {
  struct Block {
    void* p;
    size_t bytes;
    cudaStream_t stream;
    cudaEvent_t done;  // recorded on `stream` when the block was released
  };
  std::mutex lock;
  std::vector<Block> blocks;
  size_t kept = 0;
};
inline ScratchPool& scratch_pool() {
  static ScratchPool* pool = new ScratchPool();  // never destroyed: blocks may be released during exit
  return *pool;
}
inline void* scratch_alloc(size_t n, size_t* got) {
  ScratchPool& pool = scratch_pool();
  {
    std::lock_guard<std::mutex> guard(pool.lock);
    size_t at = pool.blocks.size();
    for (size_t i = 0; i < pool.blocks.size(); ++i) {
      const size_t b = pool.blocks[i].bytes;
      if (b >= n && b / 2 < n && (at == pool.blocks.size() || b < pool.blocks[at].bytes)) at = i;
    }
    if (at < pool.blocks.size()) {
      ScratchPool::Block b = pool.blocks[at];
      pool.blocks.erase(pool.blocks.begin() + at);
      pool.kept -= b.bytes;
      const cudaError_t ordered = b.stream == current_stream ? cudaSuccess
                                                             : cudaStreamWaitEvent(current_stream, b.done, 0);
      cudaEventDestroy(b.done);  // released by CUDA once recorded work is done
      if (ordered != cudaSuccess) {
        cudaFree(b.p);  // waits for the device's work, then gives the block back
        cuda_check(ordered, __FILE__, __LINE__);
      }
      *got = b.bytes;
      return b.p;
    }
  }
  *got = n;
  return device_malloc(n);
}
inline void scratch_release(void* p, size_t bytes) {
  if (!p) return;
  ScratchPool& pool = scratch_pool();
  std::lock_guard<std::mutex> guard(pool.lock);
  cudaEvent_t done = nullptr;
  if (pool.kept + bytes > ((size_t)4 << 30) || cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(done, current_stream) != cudaSuccess) {
    cudaGetLastError();  // not kept: a block is never reused without the order of its last work
    if (done) cudaEventDestroy(done);
    cudaFree(p);
    return;
  }
  pool.blocks.push_back(ScratchPool::Block{p, bytes, current_stream, done});
  pool.kept += bytes;
}
}  // namespace ptn
#define CUDA_CUR_STREAM (ptn::current_stream)
#define HANDLE_ERROR(e) ptn::cuda_check((e), __FILE__, __LINE__)
#define HANDLE_LAST_ERROR()                                  \
  do {                                                       \
    ptn::cuda_check(cudaGetLastError(), __FILE__, __LINE__); \
    ptn::check_device_flag(__FILE__, __LINE__);              \
  } while (0)
#define start_dev_kernel(kernel, args) \
  (PTN_COUNT(launches, 1), kernel<<<PTN_DIM_GRID, PTN_DIM_BLOCK, 0, CUDA_CUR_STREAM>>> args)
#define start_dev_kernel2(kernel, dim_grid, dim_block, shared_size, args) \
  (PTN_COUNT(launches, 1), kernel<<<dim_grid, dim_block, shared_size, CUDA_CUR_STREAM>>> args)
#define elem_atomic_add(x, v) atomicAdd((x), (v))
#define elem_atomic_min(x, v) atomicMin((x), (v))
#define elem_atomic_cas(a, c, v) atomicCAS((a), (c), (v))
#define int_as_float __int_as_float
#define float_as_int __float_as_int
#define INF_F CUDART_INF_F
#define NAN_F CUDART_NAN_F
#define Ndarray_memcpy(y, x, size) HANDLE_ERROR(cudaMemcpyAsync((y), (x), (size), cudaMemcpyDeviceToDevice, CUDA_CUR_STREAM))
#define Ndarray_memset(p, c, size) HANDLE_ERROR(cudaMemsetAsync((p), (c), (size), CUDA_CUR_STREAM))
#define Ndarray_copy_to_host(dst, src, size) ptn::copy_to_host((dst), (src), (size), __FILE__, __LINE__)
#define device_malloc(n) ptn::device_malloc(n)
#define device_free(p) ptn::device_free(p)

#else  // CPU emulation of the launch grid

#define DEF_KERNEL
#define DEV_FUNC
#define HOST_FUNC
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
namespace ptn {
static thread_local dim3 thread_idx(0, 0, 0), block_idx(0, 0, 0), block_dim, grid_dim;
static thread_local size_t shared_size = 0;

// Runs `kernel` once per (block, thread), sequentially.  Shared memory is
// private to each emulated thread, so it is only valid with one thread per block.
template <typename F>
void launch(dim3 grid, dim3 block, size_t shmem, F&& call) {
  if (shmem > 0 && block.x * block.y * block.z > 1)
    raise(PTN_STATUS_RUNTIME, "start_dev_kernel2: shared memory needs one thread per block on the CPU");
  grid_dim = grid; block_dim = block; shared_size = shmem;
  for (unsigned bz = 0; bz < grid.z; ++bz) for (unsigned by = 0; by < grid.y; ++by) for (unsigned bx = 0; bx < grid.x; ++bx)
  for (unsigned tz = 0; tz < block.z; ++tz) for (unsigned ty = 0; ty < block.y; ++ty) for (unsigned tx = 0; tx < block.x; ++tx) {
    block_idx = dim3(bx, by, bz);
    thread_idx = dim3(tx, ty, tz);
    call();
  }
  thread_idx = dim3(0, 0, 0); block_idx = dim3(0, 0, 0); block_dim = dim3(); grid_dim = dim3(); shared_size = 0;
}
inline dim3 as_dim3(dim3 d) { return d; }
inline dim3 as_dim3(long long n) { return dim3((unsigned int)n); }

inline void* host_malloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) raise(PTN_STATUS_RUNTIME, "device_malloc: out of memory");
  return p;
}
inline float int_as_float(int32_t i) { float f; memcpy(&f, &i, 4); return f; }
inline int32_t float_as_int(float f) { int32_t i; memcpy(&i, &f, 4); return i; }
template <typename T> T host_atomic_cas(T* addr, T compare, T val) {
  T old = *addr;
  if (old == compare) *addr = val;
  return old;
}
}  // namespace ptn
#define threadIdx (ptn::thread_idx)
#define blockIdx (ptn::block_idx)
#define blockDim (ptn::block_dim)
#define gridDim (ptn::grid_dim)
#define __syncthreads() ((void)0)
#define DEF_SHARED(type, name) std::vector<type> name(ptn::shared_size / sizeof(type))
#define CUDA_CUR_STREAM 0
#define HANDLE_ERROR(e) ((void)(e))
#define HANDLE_LAST_ERROR() ((void)0)
// One call with grid = block = 1: kernels use grid-stride loops.
#define start_dev_kernel(kernel, args) ptn::launch(dim3(1), dim3(1), 0, [&]() { kernel args; })
#define start_dev_kernel2(kernel, dim_grid, dim_block, shmem, args) \
  ptn::launch(ptn::as_dim3(dim_grid), ptn::as_dim3(dim_block), (shmem), [&]() { kernel args; })
#define elem_atomic_add(x, v) (*(x) += (v))
#define elem_atomic_min(x, v) (*(x) = ((v) < *(x)) ? (v) : *(x))
#define elem_atomic_cas(a, c, v) ptn::host_atomic_cas((a), (c), (v))
#define int_as_float ptn::int_as_float
#define float_as_int ptn::float_as_int
#define INF_F (std::numeric_limits<float>::infinity())
#define NAN_F (std::numeric_limits<float>::quiet_NaN())
#define Ndarray_memcpy(y, x, size) memcpy((y), (x), (size))
#define Ndarray_memset(p, c, size) memset((p), (c), (size))
#define Ndarray_copy_to_host(dst, src, size) memcpy((dst), (src), (size))
#define device_malloc(n) ptn::host_malloc(n)
#define device_free(p) free(p)

#endif  // PTN_CUDA

// Block-wide reductions through shared memory `sh` (blockDim.x entries; blockDim.x a power of two): every
// thread of the block calls them and gets the result.  With one thread per block (the CPU) they return `v`.
// `sync` is the block's barrier (a CUDA emulation passes its own).
struct ptn_syncthreads { DEV_FUNC void operator()() const { __syncthreads(); } };
template <typename T, typename Op, typename Barrier = ptn_syncthreads>
DEV_FUNC inline T ptn_block_reduce(T* sh, T v, Op op, Barrier sync = Barrier()) {
  const int tid = threadIdx.x;
  sh[tid] = v;
  sync();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) sh[tid] = op(sh[tid], sh[tid + s]);
    sync();
  }
  T r = sh[0];
  sync();
  return r;
}
struct ptn_op_sum { template <typename T> DEV_FUNC T operator()(T a, T b) const { return a + b; } };
struct ptn_op_min { template <typename T> DEV_FUNC T operator()(T a, T b) const { return b < a ? b : a; } };
struct ptn_op_max { template <typename T> DEV_FUNC T operator()(T a, T b) const { return b > a ? b : a; } };
#define block_sum(sh, v) ptn_block_reduce(&(sh)[0], (v), ptn_op_sum())
#define block_min(sh, v) ptn_block_reduce(&(sh)[0], (v), ptn_op_min())
#define block_max(sh, v) ptn_block_reduce(&(sh)[0], (v), ptn_op_max())

#define Ndarray_set_zero(a) Ndarray_memset((a)->data, 0, ptn::n_elements(a) * (a)->itemsize)

// ---------------------------------------------------------------- helpers for kernels
// A grid-stride loop over i in [0, n): each thread starts at its global index and steps by the number of threads
// of the launch (on the CPU, start_dev_kernel runs one thread, which takes every i).
#define GRID_LOOP(i, n) \
  for (int64_t i = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; i < (int64_t)(n); i += (int64_t)blockDim.x * gridDim.x)

// The length of column b of a (n_time, n_batch) 0/1 prefix mask in C order: its number of leading ones.  -1 if an
// entry is neither 0 nor 1, -2 if a 1 follows a 0; *bad_t is then that entry's frame.
template <typename T>
DEV_FUNC inline int64_t ptn_prefix_mask_length(int64_t n_time, int64_t n_batch, const T* mask, int64_t b,
                                               int64_t* bad_t) {
  int64_t len = 0;
  bool ended = false;
  for (int64_t t = 0; t < n_time; ++t) {
    T m = mask[t * n_batch + b];
    if (!(m == T(0) || m == T(1))) {
      *bad_t = t;
      return -1;
    }
    if (m == T(1)) {
      if (ended) {
        *bad_t = t;
        return -2;
      }
      ++len;
    } else {
      ended = true;
    }
  }
  return len;
}

namespace ptn {
// Scratch memory for a kernel's host code: device memory on CUDA, host memory on the CPU.  Every block is freed
// when the Scratch goes out of scope, on every exit path (a failed check throws), so a failure never leaks (on
// CUDA it goes back to the blocks kept between calls, ScratchPool).
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
#if PTN_CUDA
    for (size_t i = 0; i < blocks_.size(); ++i) scratch_release(blocks_[i], sizes_[i]);
#else
    for (void* p : blocks_) device_free(p);
#endif
  }
  // A block of n elements of T (at least one, so never null).
  template <typename T>
  T* get(int64_t n) {
    blocks_.reserve(blocks_.size() + 1);  // so that the push_back below cannot throw once the block exists
    const size_t bytes = (size_t)(n > 1 ? n : 1) * sizeof(T);
#if PTN_CUDA
    sizes_.reserve(sizes_.size() + 1);
    size_t got = 0;
    void* p = scratch_alloc(bytes, &got);  // from the blocks kept between calls
    sizes_.push_back(got);
#else
    void* p = device_malloc(bytes);
#endif
    blocks_.push_back(p);
    return (T*)p;
  }

 private:
  std::vector<void*> blocks_;
#if PTN_CUDA
  std::vector<size_t> sizes_;
#endif
};
}  // namespace ptn

#include "native_op_blas.h"
#include "native_op_entry.h"

#endif  // PTNATIVE_NATIVE_OP_H
