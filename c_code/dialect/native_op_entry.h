// The entry point shared by every op: wrap raw buffers as Ndarray views, run
// the op's body, and turn any failure into a status and a message.
#ifndef PTNATIVE_NATIVE_OP_ENTRY_H
#define PTNATIVE_NATIVE_OP_ENTRY_H

// Compiled on its own, this file starts from the dialect, which includes it at its end.
#include "native_op.h"

#include <new>
#if defined(__linux__) && !PTN_CUDA
#include <sys/mman.h>
#include <unistd.h>
#endif
#if PTN_CUDA
#include <mutex>
#endif

namespace ptn {

typedef void (*body_t)(int, Ndarray**, int, Ndarray***);

// What an entry point knows of its op: the argument plan's tables (ptnative/plan.py), filled into each variant's
// translation unit (c_code/variant_unit.cc).  Per-array tables list the inputs, then the outputs.
struct EntryPlan {
  int n_in, n_out;
  const int* ndims;           // per array: its rank
  const int* itemsizes;       // per array: bytes per element
  const int* dtype_codes;     // per array: its element type, ord(kind) << 8 | itemsize (ptnative.plan.dtype_code)
  const char* const* labels;  // per array: how messages name it ("input 'x'")
  const int* inplace_of;      // per input: the output that starts as its copy, or -1
  const int* host_memory;     // per input: 1 where the CUDA build reads it on the host
  const int* fully_written;   // per output: 1 where the kernel writes every element (not zeroed first)
  int n_checks;               // fixed input sizes: input check_input[c] has check_size[c] elements in check_dim[c]
  const int* check_input;
  const int* check_dim;
  const int64_t* check_size;
  const int64_t* out_dims;    // per output, PTN_MAX_NDIM each: a size >= 0, or -1 - (input * PTN_MAX_NDIM + dim)
};

// "float64" for ord('f') << 8 | 8, the name numpy gives the type.
inline std::string dtype_name(int32_t code) {
  const int kind = code >> 8, size = code & 0xFF;
  switch (kind) {
    case 'f': return "float" + std::to_string(8 * size);
    case 'i': return "int" + std::to_string(8 * size);
    case 'u': return "uint" + std::to_string(8 * size);
    case 'c': return "complex" + std::to_string(8 * size);
    case 'b': return size == 1 ? std::string("bool") : "a " + std::to_string(size) + "-byte boolean";
    default: return "an unsupported type of " + std::to_string(size) + " bytes";
  }
}

// The one check of a call's arguments, for every glue (Python, Numba, PyTensor's C module, the XLA FFI handler;
// the device entry point too): each array's rank and element type (`types`: two entries per array, as the
// caller's array has them) and every size the op fixes, against the plan.  Throws Error(PTN_STATUS_VALUE) with a
// message in the op's terms ("input 'x' must have size 4 in dim 1"; the glue puts "NativeOp 'name': " before it)
// on the first mismatch; touches no buffer.  `shapes` holds PTN_MAX_NDIM entries per array, of which the first
// rank are read.
inline void check_arguments(const EntryPlan& plan, const int32_t* types, const int64_t* shapes) {
  const int n = plan.n_in + plan.n_out;
  for (int j = 0; j < n; ++j) {
    const int rank = types[2 * j], want = plan.ndims[j];
    if (rank != want) {
      std::ostringstream s;
      s << plan.labels[j] << " has " << rank << (rank == 1 ? " dimension" : " dimensions") << " where the op takes "
        << want;
      raise(PTN_STATUS_VALUE, s.str());
    }
    if (types[2 * j + 1] != plan.dtype_codes[j])
      raise(PTN_STATUS_VALUE, std::string(plan.labels[j]) + " has dtype " + dtype_name(types[2 * j + 1]) +
                                  " where the op takes " + dtype_name(plan.dtype_codes[j]));
    for (int d = 0; d < rank; ++d) {
      if (shapes[(size_t)j * PTN_MAX_NDIM + d] < 0) {
        std::ostringstream s;
        s << plan.labels[j] << " has a negative size in dim " << d;
        raise(PTN_STATUS_VALUE, s.str());
      }
    }
  }
  for (int c = 0; c < plan.n_checks; ++c) {
    const int i = plan.check_input[c], d = plan.check_dim[c];
    if (shapes[(size_t)i * PTN_MAX_NDIM + d] != plan.check_size[c]) {
      std::ostringstream s;
      s << plan.labels[i] << " must have size " << plan.check_size[c] << " in dim " << d;
      raise(PTN_STATUS_VALUE, s.str());
    }
  }
  for (int k = 0; k < plan.n_out; ++k) {  // the glue allocates outputs from the plan: only a hand-made call differs
    const int j = plan.n_in + k;
    for (int d = 0; d < plan.ndims[j]; ++d) {
      const int64_t code = plan.out_dims[(size_t)k * PTN_MAX_NDIM + d];
      const int64_t want = code >= 0 ? code : shapes[(size_t)(-1 - code)];
      if (shapes[(size_t)j * PTN_MAX_NDIM + d] != want) {
        std::ostringstream s;
        s << plan.labels[j] << " must have size " << want << " in dim " << d;
        raise(PTN_STATUS_VALUE, s.str());
      }
    }
  }
}

// The last failure's message on this thread, also readable one character at a
// time (`error_char`) by callers that cannot read back a buffer we wrote.
static thread_local std::string last_error;

inline void write_error(char* err, int64_t errlen, const char* msg) {
  last_error = msg;
  if (!err || errlen <= 0) return;
  strncpy(err, msg, (size_t)errlen - 1);
  err[errlen - 1] = 0;
}

inline int32_t error_char(int64_t j) {
  return j >= 0 && j < (int64_t)last_error.size() ? (int32_t)(unsigned char)last_error[j] : 0;
}

#if PTN_CUDA
// Device buffers kept between calls (grown when too small), one per argument.
struct DeviceBuffers {
  std::vector<void*> ptr;
  std::vector<size_t> size;
  void* get(size_t j, size_t bytes) {
    if (ptr.size() <= j) { ptr.resize(j + 1, 0); size.resize(j + 1, 0); }
    if (size[j] < bytes) {
      if (ptr[j]) cudaFree(ptr[j]);
      ptr[j] = 0;
      size[j] = 0;
      PTN_COUNT(allocs, 1);
      cuda_check(cudaMalloc(&ptr[j], bytes), __FILE__, __LINE__);
      size[j] = bytes;
    }
    return ptr[j];
  }
};

// Pinned host memory kept between calls, through which the host-array entry copies (page-locked memory copies
// asynchronously and at full speed; pageable memory goes through the driver's own staging): grown when too small,
// up to 1 GiB (beyond, a call copies from and to the arrays directly).
struct PinnedStaging {
  char* ptr = 0;
  size_t size = 0;
  char* get(size_t bytes) {
    if (bytes > ((size_t)1 << 30)) return 0;
    if (size < bytes) {
      if (ptr) cudaFreeHost(ptr);
      ptr = 0;
      size = 0;
      if (cudaHostAlloc((void**)&ptr, bytes, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();  // out of pinned memory: copy directly
        ptr = 0;
        return 0;
      }
      size = bytes;
    }
    return ptr;
  }
};
inline size_t staged_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }
#endif

// The arrays as Ndarray views, after check_arguments.
inline std::vector<Ndarray> make_views(const EntryPlan& plan, void** data, const int64_t* shapes,
                                       const int64_t* strides) {
  const int n = plan.n_in + plan.n_out;
  std::vector<Ndarray> views(n);
  for (int j = 0; j < n; ++j) {
    Ndarray& v = views[j];
    v.data = data[j];
    v.ndim = plan.ndims[j];
    v.itemsize = plan.itemsizes[j];
    for (int d = 0; d < PTN_MAX_NDIM; ++d) {
      v.dims[d] = d < v.ndim ? shapes[j * PTN_MAX_NDIM + d] : 1;
      v.strides[d] = d < v.ndim ? strides[j * PTN_MAX_NDIM + d] : v.itemsize;
    }
  }
  return views;
}

// Large fresh output buffers are advised to use huge pages (as numpy does for its own arrays): far fewer page
// faults when they are first touched.
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !PTN_CUDA
  const size_t huge = (size_t)1 << 22;
  if (bytes >= huge) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = ((uintptr_t)p + page - 1) & ~(page - 1), end = ((uintptr_t)p + bytes) & ~(page - 1);
    if (end > begin) madvise((void*)begin, end - begin, MADV_HUGEPAGE);
  }
#else
  (void)p; (void)bytes;
#endif
}

// The byte that outputs the spec declares fully_written are filled with instead of being left as allocated (0:
// left), for tests that prove a kernel writes every element of such an output: PTNATIVE_POISON_OUTPUTS=1 fills
// 0xFF bytes (NaN in a float, but -1 in an int, a value some int outputs hold), =2 fills 0x5A bytes
// (1515870810 in an int32: no index, state or count a kernel writes).
inline int poison_fully_written() {
  const char* v = getenv("PTNATIVE_POISON_OUTPUTS");
  if (!v || !v[0] || (v[0] == '0' && !v[1])) return 0;
  return v[0] == '2' && !v[1] ? 0x5A : 0xFF;
}

// Fresh outputs (those that do not start as an input's copy) start at zero, except those the spec declares
// fully_written (the kernel writes every element): the one place outputs are initialised, for every glue
// (PyTensor's C module, the Numba/Python driver, the XLA FFI handler) on either target.  Copies of want_inplace
// inputs are the glue's: it owns the buffers and knows when they are one.
inline void zero_fresh_outputs(int n_in, int n_out, const int* inplace_of, const int* fully_written,
                               std::vector<Ndarray>& views) {
  std::vector<char> is_copy(n_out + 1, 0);
  for (int i = 0; i < n_in; ++i) if (inplace_of[i] >= 0) is_copy[inplace_of[i]] = 1;
  int poison = -1;  // looked up once, and only when an output is fully_written
  for (int k = 0; k < n_out; ++k) {
    const Ndarray& v = views[n_in + k];
    const size_t bytes = (size_t)n_elements(&v) * v.itemsize;
    if (is_copy[k] || !bytes) continue;
    int fill = 0;
    if (fully_written[k]) {
      if (poison < 0) poison = poison_fully_written();
      if (!poison) {
        advise_huge_pages(v.data, bytes);
        continue;
      }
      fill = poison;
    }
#if PTN_CUDA
    cuda_check(cudaMemsetAsync(v.data, fill, bytes, current_stream), __FILE__, __LINE__);
#else
    advise_huge_pages(v.data, bytes);
    memset(v.data, fill, bytes);
#endif
  }
}

// Calls the body on the views; a want_inplace input is its output's view.
inline void call_body(body_t body, int n_in, int n_out, const int* inplace_of, std::vector<Ndarray>& views) {
  std::vector<Ndarray*> outs(n_out + 1), ins(n_in + 1);
  std::vector<Ndarray**> out_slots(n_out + 1);
  for (int k = 0; k < n_out; ++k) {
    outs[k] = &views[n_in + k];
    out_slots[k] = &outs[k];
  }
  for (int i = 0; i < n_in; ++i) ins[i] = inplace_of[i] >= 0 ? outs[inplace_of[i]] : &views[i];
  body(n_in, ins.data(), n_out, out_slots.data());
}

// Runs `f`, turning every failure into a status and a message.
template <typename F>
int guarded(F&& f, char* err, int64_t errlen) {
  try {
    f();
    return PTN_STATUS_OK;
  } catch (const Error& e) {
    write_error(err, errlen, e.what());
    return e.status;
  } catch (const std::bad_alloc&) {
    write_error(err, errlen, "out of memory");
    return PTN_STATUS_RUNTIME;
  } catch (const std::exception& e) {
    write_error(err, errlen, e.what());
    return PTN_STATUS_RUNTIME;
  } catch (...) {
    write_error(err, errlen, "unknown C++ exception");
    return PTN_STATUS_RUNTIME;
  }
}

// check_arguments as a status and a message: the entry point's <symbol>_check_arguments, for glues that check
// before they allocate or copy (the XLA FFI handler, JAX mode when it traces a call).
inline int run_check(const EntryPlan& plan, const int32_t* types, const int64_t* shapes, char* err, int64_t errlen) {
  return guarded([&]() { check_arguments(plan, types, shapes); }, err, errlen);
}

// Host arrays in, host arrays out, checked first (check_arguments); outputs that are not an input's copy arrive
// uninitialised and start at zero unless fully_written (zero_fresh_outputs).  On the CPU the body works on them
// directly; the CUDA build copies (C-contiguous) arrays to device buffers kept for the next call, runs, and copies
// the outputs back.  `host_memory` inputs stay on the host.
inline int run_entry(body_t body, const EntryPlan& plan, void** data, const int32_t* types, const int64_t* shapes,
                     const int64_t* strides, char* err, int64_t errlen) {
  return guarded([&]() {
    check_arguments(plan, types, shapes);
    const int n_in = plan.n_in, n_out = plan.n_out;
    const int* inplace_of = plan.inplace_of;
    std::vector<Ndarray> views = make_views(plan, data, shapes, strides);
#if PTN_CUDA
    static std::mutex lock;
    std::lock_guard<std::mutex> guard(lock);
    static DeviceBuffers buffers;
    static PinnedStaging staging;
    if (!current_stream) cuda_check(cudaStreamCreateWithFlags(&current_stream, cudaStreamNonBlocking), __FILE__, __LINE__);
    std::vector<int> input_of(n_out, -1);
    for (int i = 0; i < n_in; ++i) if (inplace_of[i] >= 0) input_of[inplace_of[i]] = i;
    // Copied in: inputs, and outputs holding an input's copy; copied out: outputs.  One staging buffer serves both
    // ways (the copies out are queued after the copies in).
    std::vector<size_t> n_bytes(n_in + n_out, 0);
    size_t in_total = 0, out_total = 0;
    for (int j = 0; j < n_in + n_out; ++j) {
      if (j < n_in && (plan.host_memory[j] || inplace_of[j] >= 0)) continue;  // host value / the output's buffer
      n_bytes[j] = (size_t)n_elements(&views[j]) * views[j].itemsize;
      if (j < n_in || input_of[j - n_in] >= 0) in_total += staged_bytes(n_bytes[j]);
      if (j >= n_in) out_total += staged_bytes(n_bytes[j]);
    }
    char* stage = staging.get(std::max(in_total, out_total));
    size_t at = 0;
    for (int j = 0; j < n_in + n_out; ++j) {
      Ndarray& v = views[j];
      if (j < n_in && (plan.host_memory[j] || inplace_of[j] >= 0)) continue;
      const size_t bytes = n_bytes[j];
      int64_t stride = v.itemsize;
      for (int d = v.ndim - 1; d >= 0; --d) { v.strides[d] = stride; stride *= v.dims[d]; }
      void* host = v.data;
      v.data = buffers.get(j, bytes ? bytes : 1);
      if (bytes && (j < n_in || input_of[j - n_in] >= 0)) {  // inputs, and outputs holding an input's copy
        PTN_COUNT(h2d, bytes);
        if (stage) {
          memcpy(stage + at, host, bytes);
          host = stage + at;
          at += staged_bytes(bytes);
        }
        cuda_check(cudaMemcpyAsync(v.data, host, bytes, cudaMemcpyHostToDevice, current_stream), __FILE__, __LINE__);
      }
    }
#endif
    zero_fresh_outputs(n_in, n_out, inplace_of, plan.fully_written, views);
    call_body(body, n_in, n_out, inplace_of, views);
#if PTN_CUDA
    HANDLE_LAST_ERROR();
    at = 0;
    for (int k = 0; k < n_out; ++k) {
      const Ndarray& v = views[n_in + k];
      const size_t bytes = n_bytes[n_in + k];
      if (!bytes) continue;
      PTN_COUNT(d2h, bytes);
      void* dst = stage ? (void*)(stage + at) : data[n_in + k];
      at += staged_bytes(bytes);
      cuda_check(cudaMemcpyAsync(dst, v.data, bytes, cudaMemcpyDeviceToHost, current_stream), __FILE__, __LINE__);
    }
    cuda_check(cudaStreamSynchronize(current_stream), __FILE__, __LINE__);
    if (stage) {
      at = 0;
      for (int k = 0; k < n_out; ++k) {
        const size_t bytes = n_bytes[n_in + k];
        if (!bytes) continue;
        memcpy(data[n_in + k], stage + at, bytes);
        at += staged_bytes(bytes);
      }
    }
#endif
  }, err, errlen);
}

#if PTN_CUDA
// Device buffers in and out (XLA's), on the caller's stream: no copies, no synchronisation.
inline int run_entry_device(cudaStream_t stream, body_t body, const EntryPlan& plan, void** data,
                            const int32_t* types, const int64_t* shapes, const int64_t* strides, char* err,
                            int64_t errlen) {
  return guarded([&]() {
    check_arguments(plan, types, shapes);
    std::vector<Ndarray> views = make_views(plan, data, shapes, strides);
    current_stream = stream;
    zero_fresh_outputs(plan.n_in, plan.n_out, plan.inplace_of, plan.fully_written, views);
    call_body(body, plan.n_in, plan.n_out, plan.inplace_of, views);
    HANDLE_LAST_ERROR();
  }, err, errlen);
}
#endif

}  // namespace ptn

#if PTN_CUDA
// The library's device counts (ptn::DeviceCounts: launches, allocations, bytes in, bytes out) into out[0..3];
// reset: start again from zero.  All zero unless built with PTN_COUNT_DEVICE_WORK.
extern "C" PTN_EXPORT void ptn_device_counts(long long* out, int reset) {
  ptn::DeviceCounts& c = ptn::device_counts();
  out[0] = c.launches;
  out[1] = c.allocs;
  out[2] = c.h2d;
  out[3] = c.d2h;
  if (reset) c = ptn::DeviceCounts{0, 0, 0, 0};
}
#endif

#endif  // PTNATIVE_NATIVE_OP_ENTRY_H
