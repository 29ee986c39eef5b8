// The entry point shared by every op: wrap raw buffers as Ndarray views, run
// the op's body, and turn any failure into a status and a message.
#ifndef PTNATIVE_NATIVE_OP_ENTRY_H
#define PTNATIVE_NATIVE_OP_ENTRY_H

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
      cuda_check(cudaMalloc(&ptr[j], bytes), __FILE__, __LINE__);
      size[j] = bytes;
    }
    return ptr[j];
  }
};
#endif

inline std::vector<Ndarray> make_views(int n, const int* ndims, const int* itemsizes, void** data,
                                       const int64_t* shapes, const int64_t* strides) {
  std::vector<Ndarray> views(n);
  for (int j = 0; j < n; ++j) {
    Ndarray& v = views[j];
    v.data = data[j];
    v.ndim = ndims[j];
    v.itemsize = itemsizes[j];
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

// Whether outputs the spec declares fully_written are to be filled with 0xFF bytes (NaN in a float, -1 in an
// int) instead of being left as allocated: PTNATIVE_POISON_OUTPUTS=1, for tests that prove a kernel writes
// every element of such an output.
inline bool poison_fully_written() {
  const char* v = getenv("PTNATIVE_POISON_OUTPUTS");
  return v && v[0] && !(v[0] == '0' && !v[1]);
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
      fill = 0xFF;
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

// Host arrays in, host arrays out; outputs that are not an input's copy arrive
// uninitialised and start at zero unless fully_written (zero_fresh_outputs).  On the CPU the body works on them directly;
// the CUDA build copies (C-contiguous) arrays to device buffers kept for the next
// call, runs, and copies the outputs back.  `host_memory` inputs stay on the host.
inline int run_entry(body_t body, int n_in, int n_out, const int* ndims, const int* itemsizes, const int* inplace_of,
                     const int* host_memory, const int* fully_written, void** data, const int64_t* shapes, const int64_t* strides, char* err,
                     int64_t errlen) {
  return guarded([&]() {
    std::vector<Ndarray> views = make_views(n_in + n_out, ndims, itemsizes, data, shapes, strides);
#if PTN_CUDA
    static std::mutex lock;
    std::lock_guard<std::mutex> guard(lock);
    static DeviceBuffers buffers;
    if (!current_stream) cuda_check(cudaStreamCreateWithFlags(&current_stream, cudaStreamNonBlocking), __FILE__, __LINE__);
    std::vector<int> input_of(n_out, -1);
    for (int i = 0; i < n_in; ++i) if (inplace_of[i] >= 0) input_of[inplace_of[i]] = i;
    for (int j = 0; j < n_in + n_out; ++j) {
      Ndarray& v = views[j];
      if (j < n_in && (host_memory[j] || inplace_of[j] >= 0)) continue;  // host value / the output's buffer
      size_t bytes = (size_t)n_elements(&v) * v.itemsize;
      int64_t stride = v.itemsize;
      for (int d = v.ndim - 1; d >= 0; --d) { v.strides[d] = stride; stride *= v.dims[d]; }
      void* host = v.data;
      v.data = buffers.get(j, bytes ? bytes : 1);
      if (bytes && (j < n_in || input_of[j - n_in] >= 0))  // inputs, and outputs holding an input's copy
        cuda_check(cudaMemcpyAsync(v.data, host, bytes, cudaMemcpyHostToDevice, current_stream), __FILE__, __LINE__);
    }
#else
    (void)host_memory;
#endif
    zero_fresh_outputs(n_in, n_out, inplace_of, fully_written, views);
    call_body(body, n_in, n_out, inplace_of, views);
#if PTN_CUDA
    HANDLE_LAST_ERROR();
    for (int k = 0; k < n_out; ++k) {
      const Ndarray& v = views[n_in + k];
      size_t bytes = (size_t)n_elements(&v) * v.itemsize;
      if (bytes)
        cuda_check(cudaMemcpyAsync(data[n_in + k], v.data, bytes, cudaMemcpyDeviceToHost, current_stream), __FILE__,
                   __LINE__);
    }
    cuda_check(cudaStreamSynchronize(current_stream), __FILE__, __LINE__);
#endif
  }, err, errlen);
}

#if PTN_CUDA
// Device buffers in and out (XLA's), on the caller's stream: no copies, no synchronisation.
inline int run_entry_device(cudaStream_t stream, body_t body, int n_in, int n_out, const int* ndims,
                            const int* itemsizes, const int* inplace_of, const int* fully_written, void** data, const int64_t* shapes,
                            const int64_t* strides, char* err, int64_t errlen) {
  return guarded([&]() {
    std::vector<Ndarray> views = make_views(n_in + n_out, ndims, itemsizes, data, shapes, strides);
    current_stream = stream;
    zero_fresh_outputs(n_in, n_out, inplace_of, fully_written, views);
    call_body(body, n_in, n_out, inplace_of, views);
    HANDLE_LAST_ERROR();
  }, err, errlen);
}
#endif

}  // namespace ptn

#endif  // PTNATIVE_NATIVE_OP_ENTRY_H
