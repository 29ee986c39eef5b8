// The XLA FFI handler of one op variant: appended by ptnative/backends/ffi_source.py to the variant's translation
// unit (ptnative/source.py: dialect, kernels, entry point @SYM@), for JAX mode.  Not compiled on its own.
//
// Sections start with a "//@section <name>" line.  Python fills them with plain substitutions only:
//   @SYM@          the entry point's symbol; the handler is exported as @SYM@_ffi
//   @N_IN@ @N_OUT@ the number of inputs and outputs (dummy outputs included)
//   @ITEMSIZES@    per input then output: bytes per element (C array initialisers, with a trailing 0 so that
//                  no array is empty)
//   @SOURCE_OF@    per output: the input whose buffer it starts as (want_inplace), or -1
//   @HOST_MEMORY@  per input: 1 where the kernel reads it on the host (host_memory)
//   @NAME@         the op's name as a C string literal (escaped)
// XLA owns the buffers (row-major, contiguous).  Outputs start zeroed, or as a copy of their want_inplace input
// (XLA aliases the two when it can, see input_output_aliases in ptnative/backends/jax.py), as in every mode: the
// entry point zeroes fresh outputs on either target (zero_fresh_outputs), this handler copies the inputs.

//@section handler
#include "xla/ffi/api/ffi.h"

namespace @SYM@_ffi_ns {
namespace ffi = xla::ffi;

static const int n_in = @N_IN@, n_out = @N_OUT@;
static const int itemsizes[] = @ITEMSIZES@;
static const int source_of[] = @SOURCE_OF@;
static const int host_memory[] = @HOST_MEMORY@;
static const char op_name[] = @NAME@;

static ffi::Error failure(ffi::ErrorCode code, const std::string& what) {
  return ffi::Error(code, std::string("NativeOp '") + op_name + "': " + what);
}

// Array j of the entry point's ABI (see ptnative/source.py) from an XLA buffer.
static ffi::Error describe(const ffi::AnyBuffer& b, int j, void** data, int64_t* shapes, int64_t* strides,
                           size_t* bytes) {
  auto dims = b.dimensions();
  if ((int)dims.size() > PTN_MAX_NDIM) return failure(ffi::ErrorCode::kInvalidArgument, "too many dimensions");
  data[j] = b.untyped_data();
  bytes[j] = b.size_bytes();
  int64_t stride = itemsizes[j];
  for (int d = (int)dims.size() - 1; d >= 0; --d) {
    shapes[j * PTN_MAX_NDIM + d] = dims[d];
    strides[j * PTN_MAX_NDIM + d] = stride;
    stride *= dims[d];
  }
  return ffi::Error::Success();
}

#if PTN_CUDA
static ffi::Error impl(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets rets) {
#else
static ffi::Error impl(ffi::RemainingArgs args, ffi::RemainingRets rets) {
#endif
  if ((int)args.size() != n_in || (int)rets.size() != n_out)
    return failure(ffi::ErrorCode::kInvalidArgument, "wrong number of arguments");
  void* data[n_in + n_out + 1];
  int64_t shapes[(n_in + n_out + 1) * PTN_MAX_NDIM] = {0}, strides[(n_in + n_out + 1) * PTN_MAX_NDIM] = {0};
  size_t bytes[n_in + n_out + 1] = {0};
  for (int i = 0; i < n_in; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    if (auto e = describe(b.value(), i, data, shapes, strides, bytes); e.failure()) return e;
  }
#if PTN_CUDA
  // host_memory inputs (scalars, small parameter vectors) are read on the host: copy them there.
  std::vector<std::vector<char>> host_copies(n_in);
  for (int i = 0; i < n_in; ++i) {
    if (!host_memory[i] || !bytes[i]) continue;
    host_copies[i].resize(bytes[i]);
    if (cudaMemcpyAsync(host_copies[i].data(), data[i], bytes[i], cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      return failure(ffi::ErrorCode::kInternal, "copying a host_memory input to the host failed");
    data[i] = host_copies[i].data();
  }
#endif
  for (int k = 0; k < n_out; ++k) {
    auto r = rets.get<ffi::AnyBuffer>(k);
    if (!r.has_value()) return r.error();
    if (auto e = describe(*r.value(), n_in + k, data, shapes, strides, bytes); e.failure()) return e;
  }
  for (int k = 0; k < n_out; ++k) {
    void* out = data[n_in + k];
    const int i = source_of[k];
    const size_t size = bytes[n_in + k];
    if (!size || i < 0 || out == data[i]) continue;
#if PTN_CUDA
    const cudaError_t status = cudaMemcpyAsync(out, data[i], size, cudaMemcpyDeviceToDevice, stream);
    if (status != cudaSuccess) return failure(ffi::ErrorCode::kInternal, cudaGetErrorString(status));
#else
    memcpy(out, data[i], size);
#endif
  }
  char err[2048] = {0};
#if PTN_CUDA
  const int status = ptn_@SYM@_run_on_device(stream, data, shapes, strides, err, sizeof(err));
#else
  const int status = @SYM@(data, shapes, strides, err, sizeof(err));
#endif
  if (status != 0)
    return failure(status == PTN_STATUS_VALUE ? ffi::ErrorCode::kInvalidArgument : ffi::ErrorCode::kInternal, err);
  return ffi::Error::Success();
}
}  // namespace @SYM@_ffi_ns

extern "C" PTN_EXPORT XLA_FFI_Error* @SYM@_ffi(XLA_FFI_CallFrame* call_frame);
#if PTN_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(@SYM@_ffi, @SYM@_ffi_ns::impl,
                              xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs().RemainingRets());
#else
XLA_FFI_DEFINE_HANDLER_SYMBOL(@SYM@_ffi, @SYM@_ffi_ns::impl, xla::ffi::Ffi::Bind().RemainingArgs().RemainingRets());
#endif
