// ptnative's XLA FFI handler for JAX mode: one library per device (g++ for the CPU, nvcc for CUDA) that holds no
// op's code.  ptnative/backends/ffi_source.py fills the section below and ptnative/build.py compiles it like any
// kernel library; ptnative/backends/jax.py loads it, registers ptn_xla_ffi_handler with XLA under one target name
// per device, and registers each op variant once per process (ptn_xla_ffi_register) before JAX traces a call of
// it.  Each call names its variant by the string attribute "symbol" (the variant's entry point symbol, a hash of
// its source: the same in every process, unlike an address); the handler looks it up here and calls the entry
// point of the variant's own library (the one every mode loads, c_code/variant_unit.cc):
//   CPU:  int <symbol>(void** data, const int32_t* types, const int64_t* shapes, const int64_t* strides, char* err,
//                      int64_t errlen)
//   CUDA: int ptn_<symbol>_run_on_device(cudaStream_t stream, <the same arguments>)
// after the variant's argument check, <symbol>_check_arguments(types, shapes, err, errlen): the check every mode's
// calls go through (ranks, element types, the op's fixed sizes), run here before any buffer is copied.
//
// Python fills the section with plain substitutions only:
//   @MAX_NDIM@      PTN_MAX_NDIM of the entry point's ABI (ptnative.spec.MAX_NDIM)
//   @STATUS_VALUE@  PTN_STATUS_VALUE: the status of an error in the caller's input (ptnative.source.STATUS_VALUE)
// XLA owns the buffers (row-major, contiguous).  Outputs start zeroed, or as a copy of their want_inplace input
// (XLA aliases the two when it can, see input_output_aliases in ptnative/backends/jax.py), as in every mode: the
// entry point zeroes fresh outputs, this handler copies the inputs.

//@section handler
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

#ifdef __CUDACC__
#include <cuda_runtime.h>
#define PTN_CUDA 1
#else
#define PTN_CUDA 0
#endif
#define PTN_EXPORT __attribute__((visibility("default")))

namespace ptn_xla_ffi {
namespace ffi = xla::ffi;

constexpr int kMaxNdim = @MAX_NDIM@;
constexpr int kStatusValue = @STATUS_VALUE@;

#if PTN_CUDA
typedef int (*EntryPoint)(cudaStream_t stream, void** data, const int32_t* types, const int64_t* shapes,
                          const int64_t* strides, char* err, int64_t errlen);
#else
typedef int (*EntryPoint)(void** data, const int32_t* types, const int64_t* shapes, const int64_t* strides, char* err,
                          int64_t errlen);
#endif
typedef int (*CheckArguments)(const int32_t* types, const int64_t* shapes, char* err, int64_t errlen);

// One registered op variant: what the handler needs to call its entry point.
struct Variant {
  std::string symbol;
  std::string op_name;
  EntryPoint entry;
  CheckArguments check;
  int n_in, n_out;
  std::vector<int> source_of;    // per output: the input whose buffer it starts as (want_inplace), or -1
  std::vector<int> host_memory;  // per input: 1 where the kernel reads it on the host

  ffi::Error failure(ffi::ErrorCode code, const std::string& what) const {
    return ffi::Error(code, "NativeOp '" + op_name + "': " + what);
  }
};

// Variants by symbol.  Entries are added, never changed or removed, so a found pointer stays valid; many XLA
// threads look up at once (shared lock), registrations are rare (once per variant and process).
class Registry {
 public:
  const Variant* find(std::string_view symbol) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = by_symbol_.find(symbol);
    return it == by_symbol_.end() ? nullptr : it->second.get();
  }

  // Adds ``v`` unless its symbol is registered already (a symbol stands for one source, so for one plan).
  void add(std::unique_ptr<Variant> v) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    std::string_view key = v->symbol;  // a view into the entry itself, which never moves
    if (by_symbol_.count(key)) return;
    by_symbol_.emplace(key, std::move(v));
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string_view, std::unique_ptr<Variant>> by_symbol_;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: XLA may call handlers while the process exits
  return *r;
}

// The entry point's arguments for one call: per array its address, rank and element type, shape and byte strides
// (kMaxNdim each).  One per thread, reused: no allocation per call once it has grown to the largest op's size.
struct Frame {
  std::vector<void*> data;
  std::vector<int32_t> types;
  std::vector<int64_t> shapes, strides;
  std::vector<size_t> bytes;

  void reset(int n_arrays) {
    data.assign(n_arrays, nullptr);
    types.assign((size_t)n_arrays * 2, 0);
    shapes.assign((size_t)n_arrays * kMaxNdim, 0);
    strides.assign((size_t)n_arrays * kMaxNdim, 0);
    bytes.assign(n_arrays, 0);
  }
};

// The entry point's name of an XLA element type: ord(kind) << 8 | bytes, as numpy names it (ptnative.plan.dtype_code);
// another kind ('V') for types numpy has no kind for, which no op takes.
int32_t dtype_code(ffi::DataType t) {
  using T = ffi::DataType;
  int kind;
  switch (t) {
    case T::F16: case T::F32: case T::F64: kind = 'f'; break;
    case T::S8: case T::S16: case T::S32: case T::S64: kind = 'i'; break;
    case T::U8: case T::U16: case T::U32: case T::U64: kind = 'u'; break;
    case T::C64: case T::C128: kind = 'c'; break;
    case T::PRED: kind = 'b'; break;
    default: kind = 'V';
  }
  return (int32_t)(kind << 8 | ((int)ffi::ByteWidth(t) & 0xFF));
}

// Array j of the entry point's ABI from an XLA buffer: its rank and type as they are (the variant's argument check
// compares them with the op's), at most kMaxNdim sizes and strides.
void describe(const ffi::AnyBuffer& b, int j, Frame& f) {
  auto dims = b.dimensions();
  f.types[2 * j] = (int32_t)dims.size();
  f.types[2 * j + 1] = dtype_code(b.element_type());
  f.data[j] = b.untyped_data();
  f.bytes[j] = b.size_bytes();
  if ((int)dims.size() > kMaxNdim) return;  // refused by the check: no op has more
  int64_t stride = (int64_t)ffi::ByteWidth(b.element_type());
  for (int d = (int)dims.size() - 1; d >= 0; --d) {
    f.shapes[(size_t)j * kMaxNdim + d] = dims[d];
    f.strides[(size_t)j * kMaxNdim + d] = stride;
    stride *= dims[d];
  }
}

#if PTN_CUDA
ffi::Error call(cudaStream_t stream, std::string_view symbol, ffi::RemainingArgs args, ffi::RemainingRets rets) {
#else
ffi::Error call(std::string_view symbol, ffi::RemainingArgs args, ffi::RemainingRets rets) {
#endif
  const Variant* found = registry().find(symbol);
  if (found == nullptr)
    return ffi::Error(ffi::ErrorCode::kNotFound,
                      "ptnative: no NativeOp variant '" + std::string(symbol) + "' is registered with the XLA FFI "
                      "handler in this process (ptnative registers a variant when JAX traces a call of its op; a "
                      "computation compiled or exported elsewhere must be traced again in this process)");
  const Variant& v = *found;
  const int n_in = v.n_in, n_out = v.n_out;
  if ((int)args.size() != n_in || (int)rets.size() != n_out)
    return v.failure(ffi::ErrorCode::kInvalidArgument,
                     "the FFI call has " + std::to_string(args.size()) + " inputs and " +
                         std::to_string(rets.size()) + " outputs, the op " + std::to_string(n_in) + " and " +
                         std::to_string(n_out));
  thread_local Frame f;
  f.reset(n_in + n_out);
  for (int i = 0; i < n_in; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    describe(b.value(), i, f);
  }
  for (int k = 0; k < n_out; ++k) {
    auto r = rets.get<ffi::AnyBuffer>(k);
    if (!r.has_value()) return r.error();
    describe(*r.value(), n_in + k, f);
  }
  char err[2048] = {0};
  if (v.check(f.types.data(), f.shapes.data(), err, sizeof(err)) != 0)
    return v.failure(ffi::ErrorCode::kInvalidArgument, err);
#if PTN_CUDA
  // host_memory inputs (scalars, small parameter vectors) are read on the host: copy them there.
  std::vector<std::vector<char>> host_copies;
  for (int i = 0; i < n_in; ++i) {
    if (!v.host_memory[i] || !f.bytes[i]) continue;
    host_copies.resize(n_in);
    host_copies[i].resize(f.bytes[i]);
    if (cudaMemcpyAsync(host_copies[i].data(), f.data[i], f.bytes[i], cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      return v.failure(ffi::ErrorCode::kInternal, "copying a host_memory input to the host failed");
    f.data[i] = host_copies[i].data();
  }
#endif
  for (int k = 0; k < n_out; ++k) {
    void* out = f.data[n_in + k];
    const int i = v.source_of[k];
    const size_t size = f.bytes[n_in + k];
    if (!size || i < 0 || out == f.data[i]) continue;
    if (f.bytes[i] != size)  // the check compared the shapes; the element types may still differ in width
      return v.failure(ffi::ErrorCode::kInvalidArgument, "an output that starts as its input's copy has another size");
#if PTN_CUDA
    const cudaError_t status = cudaMemcpyAsync(out, f.data[i], size, cudaMemcpyDeviceToDevice, stream);
    if (status != cudaSuccess) return v.failure(ffi::ErrorCode::kInternal, cudaGetErrorString(status));
#else
    memcpy(out, f.data[i], size);
#endif
  }
#if PTN_CUDA
  const int status = v.entry(stream, f.data.data(), f.types.data(), f.shapes.data(), f.strides.data(), err,
                             sizeof(err));
#else
  const int status = v.entry(f.data.data(), f.types.data(), f.shapes.data(), f.strides.data(), err, sizeof(err));
#endif
  if (status != 0)
    return v.failure(status == kStatusValue ? ffi::ErrorCode::kInvalidArgument : ffi::ErrorCode::kInternal, err);
  return ffi::Error::Success();
}
}  // namespace ptn_xla_ffi

// Registers an op variant for the calls whose "symbol" attribute is ``symbol``; returns 0, or 1 if an argument
// is out of range.  A symbol registered already keeps its first registration (same symbol, same source).
extern "C" PTN_EXPORT int ptn_xla_ffi_register(
    const char* symbol,       // the variant's entry point symbol (NUL-terminated)
    void* entry,              // its entry point: <symbol> on the CPU, ptn_<symbol>_run_on_device on CUDA
    void* check,              // its argument check: <symbol>_check_arguments
    int n_in,                 // the number of inputs
    int n_out,                // the number of outputs (dummy ones included)
    const int* source_of,     // n_out entries: the input each output starts as a copy of, or -1
    const int* host_memory,   // n_in entries: 1 where the kernel reads the input on the host
    const char* op_name) {    // the op's name, for error messages (NUL-terminated UTF-8)
  if (!symbol || !entry || !check || !op_name || n_in < 0 || n_out < 0 || (n_out && !source_of) ||
      (n_in && !host_memory))
    return 1;
  for (int k = 0; k < n_out; ++k)
    if (source_of[k] < -1 || source_of[k] >= n_in) return 1;
  auto v = std::make_unique<ptn_xla_ffi::Variant>();
  v->symbol = symbol;
  v->op_name = op_name;
  v->entry = reinterpret_cast<ptn_xla_ffi::EntryPoint>(entry);
  v->check = reinterpret_cast<ptn_xla_ffi::CheckArguments>(check);
  v->n_in = n_in;
  v->n_out = n_out;
  v->source_of.assign(source_of, source_of + n_out);
  v->host_memory.assign(host_memory, host_memory + n_in);
  ptn_xla_ffi::registry().add(std::move(v));
  return 0;
}

// The handler XLA calls: the call's buffers, and the variant's symbol as the string attribute "symbol".
extern "C" PTN_EXPORT XLA_FFI_Error* ptn_xla_ffi_handler(XLA_FFI_CallFrame* call_frame);
#if PTN_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(ptn_xla_ffi_handler, ptn_xla_ffi::call,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Attr<std::string_view>("symbol")
                                  .RemainingArgs()
                                  .RemainingRets());
#else
XLA_FFI_DEFINE_HANDLER_SYMBOL(ptn_xla_ffi_handler, ptn_xla_ffi::call,
                              xla::ffi::Ffi::Bind().Attr<std::string_view>("symbol").RemainingArgs().RemainingRets());
#endif
