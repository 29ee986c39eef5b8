"""The translation unit of one op variant: dialect headers, the op's support
code and its fw code wrapped in a C entry point.

The same text is compiled by ptnative's own build (g++ or nvcc, see
:mod:`ptnative.build`) and pasted into PyTensor's C modules (see
:mod:`ptnative.backends.c`).  The entry point's ABI::

    int <symbol>(void** data, const int64_t* shapes, const int64_t* strides,
                 char* err, int64_t errlen);

``data`` holds the inputs' then the outputs' buffer addresses; ``shapes`` and
``strides`` (bytes) hold ``PTN_MAX_NDIM`` entries per array in the same order.
Outputs are allocated by the caller and zeroed by the entry point; a
``want_inplace`` input and its output are the same buffer.  The return value is 0, or a ``PTN_STATUS_*`` with a
message in ``err``.  The CUDA build takes host arrays too (C-contiguous ones):
it copies them to device buffers that it keeps for the next call, runs, and
copies the outputs back; ``host_memory`` inputs stay on the host.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

MAX_NDIM = 8
STATUS_VALUE = 2
#: Bumped whenever the generated glue changes incompatibly.
GLUE_VERSION = 5

_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


@cache
def kernel_dir():
    """``c_code/``: the installed ``ptnative.c_code`` package, or the checkout's folder."""
    try:
        return resources.files("ptnative.c_code")
    except ModuleNotFoundError:  # running from a source checkout that is not installed
        return Path(__file__).resolve().parent.parent / "c_code"


@cache
def read_kernel_file(filename: str) -> str:
    """The text of a file in ``c_code/``."""
    return kernel_dir().joinpath(filename).read_text()


def inline_includes(text: str, seen: set[str] | None = None) -> str:
    """Replace ``#include "x.h"`` of files in ``c_code/`` by their text (once each)."""
    seen = set() if seen is None else seen

    def repl(m):
        name = m.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return inline_includes(read_kernel_file(name), seen)

    return _LOCAL_INCLUDE.sub(repl, text)


def dialect_header() -> str:
    return inline_includes('#include "native_op.h"\n')


def c_name(name: str) -> str:
    """An identifier made from ``name``: its word characters, at most 40 (``"op"`` when none are left)."""
    return re.sub(r"[^0-9A-Za-z_]", "_", name).strip("_")[:40] or "op"


_LITERAL_SAFE = frozenset(range(0x20, 0x7F)) - {ord('"'), ord("\\"), ord("?")}


def c_string_literal(text: str) -> str:
    """``text`` as a C/C++ string literal (double quotes included) that means exactly its UTF-8 bytes.

    Printable ASCII stays as is except ``"``, ``\\`` and ``?`` (no trigraph can form); every other byte, newlines
    and non-ASCII included, is a three-digit octal escape, which never swallows the digits after it.  Use it for
    every user string that ends up in generated C, and pass the result as an argument, never as a format."""
    data = text.encode("utf-8", "surrogatepass")
    return '"' + "".join(chr(b) if b in _LITERAL_SAFE else f"\\{b:03o}" for b in data) + '"'


@dataclass(frozen=True)
class Variant:
    """One compiled form of an op: its spec, its floating type and the target."""

    symbol: str
    source: str
    device: str  # "cpu" | "cuda"
    include_dirs: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        return self.symbol.rsplit("_", 1)[-1]


def generate(op, float_dtype: str, device: str = "cpu") -> Variant:
    """The translation unit of ``op``'s fw code, computing in ``float_dtype``."""
    ctype = {"float32": "float", "float64": "double"}[float_dtype]
    n_in, n_out = len(op.in_info), len(op.out_info)
    dtypes = [op.array_dtype(info, float_dtype) for info in op.in_info + op.out_info]
    ndims = [info["ndim"] for info in op.in_info + op.out_info]
    inplace_of = [info.get("want_inplace", -1) for info in op.in_info]
    host_memory = [bool(info.get("host_memory")) for info in op.in_info]
    body = op.c_fw_code % {"fail": "ptn::fail_pending();"}

    def ints(values):
        return "{" + ", ".join(str(int(v)) for v in values) + (", 0" if not values else "") + "}"

    text = f"""\
// ptnative: op {op.name!r}, computing in {ctype}, for {device}.  Generated; do not edit.
{dialect_header()}
// Op code written with plain `assert` gets the non-aborting check.
#pragma push_macro("assert")
#undef assert
#define assert(x) ptn_assert(x)
namespace @NS@ {{
typedef {ctype} Float;
{read_kernel_file("native_op_typed.h")}
// ---- support code
{op.c_extra_support_code}
// ---- fw code
static void body(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {{
  (void)n_inputs; (void)n_outputs; (void)inputs; (void)outputs;
{body}
}}
}}  // namespace @NS@
#pragma pop_macro("assert")

namespace @NS@ {{
static const int ndims[] = {ints(ndims)};
static const int itemsizes[] = {ints(np.dtype(d).itemsize for d in dtypes)};
static const int inplace_of[] = {ints(inplace_of)};
static const int host_memory[] = {ints(host_memory)};
}}  // namespace @NS@

extern "C" PTN_EXPORT int @SYM@(void** data, const int64_t* shapes, const int64_t* strides, char* err, int64_t errlen) {{
  using namespace @NS@;
  return ptn::run_entry(&body, {n_in}, {n_out}, ndims, itemsizes, inplace_of, host_memory, data, shapes, strides, err,
                        errlen);
}}
#if PTN_CUDA
extern "C" PTN_EXPORT int ptn_@SYM@_run_on_device(cudaStream_t stream, void** data, const int64_t* shapes,
                                                 const int64_t* strides, char* err, int64_t errlen) {{
  using namespace @NS@;
  return ptn::run_entry_device(stream, &body, {n_in}, {n_out}, ndims, itemsizes, inplace_of, data, shapes, strides,
                               err, errlen);
}}
#endif

extern "C" PTN_EXPORT void @SYM@_set_blas(void* sgemm, void* dgemm) {{ ptn::set_blas(sgemm, dgemm); }}

extern "C" PTN_EXPORT int32_t @SYM@_error_char(int64_t j) {{ return ptn::error_char(j); }}
"""
    digest = hashlib.sha256(f"{GLUE_VERSION}\0{text}".encode()).hexdigest()[:16]
    symbol = f"ptn_{c_name(op.name)}_{digest}"
    text = text.replace("@NS@", symbol + "_ns").replace("@SYM@", symbol)
    return Variant(symbol=symbol, source=text, device=device)


# An XLA FFI handler around the entry point: XLA owns the buffers (row-major,
# contiguous); outputs start zeroed or as their input's copy, as everywhere.
_FFI_WRAPPER = r"""
#include "xla/ffi/api/ffi.h"
namespace @SYM@_ffi_ns {
namespace ffi = xla::ffi;
static ffi::Error fill(const ffi::AnyBuffer& b, int j, int itemsize, void** data, int64_t* shapes, int64_t* strides) {
  auto dims = b.dimensions();
  if ((int)dims.size() > PTN_MAX_NDIM) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "too many dimensions");
  data[j] = b.untyped_data();
  int64_t stride = itemsize;
  for (int d = (int)dims.size() - 1; d >= 0; --d) {
    shapes[j * PTN_MAX_NDIM + d] = dims[d];
    strides[j * PTN_MAX_NDIM + d] = stride;
    stride *= dims[d];
  }
  return ffi::Error::Success();
}
static ffi::Error impl(@STREAM_PARAM@ffi::RemainingArgs args, ffi::RemainingRets rets) {
  const int n_in = @N_IN@, n_out = @N_OUT@;
  static const int itemsizes[] = @ITEMSIZES@;
  static const int source_of[] = @SOURCE_OF@;  // per output: the input it starts as, or -1
  if ((int)args.size() != n_in || (int)rets.size() != n_out)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "@NAME@: wrong number of arguments");
  void* data[@N@ + 1];
  int64_t shapes[(@N@ + 1) * PTN_MAX_NDIM] = {0}, strides[(@N@ + 1) * PTN_MAX_NDIM] = {0};
  std::vector<size_t> bytes(@N@ + 1, 0);
  for (int i = 0; i < n_in; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    if (auto e = fill(b.value(), i, itemsizes[i], data, shapes, strides); e.failure()) return e;
    bytes[i] = b.value().size_bytes();
  }
@HOST_COPIES@
  for (int k = 0; k < n_out; ++k) {
    auto r = rets.get<ffi::AnyBuffer>(k);
    if (!r.has_value()) return r.error();
    if (auto e = fill(*r.value(), n_in + k, itemsizes[n_in + k], data, shapes, strides); e.failure()) return e;
    bytes[n_in + k] = r.value()->size_bytes();
  }
  for (int k = 0; k < n_out; ++k) {
    void* out = data[n_in + k];
    int i = source_of[k];
    if (!bytes[n_in + k]) continue;
    if (i < 0) @ZERO@
    else if (out != data[i]) @MEMCPY@(out, data[i], bytes[n_in + k]@COPY_KIND@@ASYNC@);
  }
  char err[2048] = {0};
  int status = @RUN@;
  if (status != 0)
    return ffi::Error(status == PTN_STATUS_VALUE ? ffi::ErrorCode::kInvalidArgument : ffi::ErrorCode::kInternal,
                      std::string("NativeOp '@NAME@': ") + err);
  return ffi::Error::Success();
}
}  // namespace @SYM@_ffi_ns
extern "C" PTN_EXPORT XLA_FFI_Error* @SYM@_ffi(XLA_FFI_CallFrame* call_frame);
XLA_FFI_DEFINE_HANDLER_SYMBOL(@SYM@_ffi, @SYM@_ffi_ns::impl,
                              xla::ffi::Ffi::Bind()@STREAM_BIND@.RemainingArgs().RemainingRets());
"""


def generate_ffi(op, float_dtype: str, device: str, include_dir: str) -> Variant:
    """The translation unit of an XLA FFI handler ``<symbol>_ffi`` for ``op`` on ``device``.

    CPU: a host handler.  CUDA: a handler working on device buffers, on XLA's stream."""
    base = generate(op, float_dtype, device)
    n_in, n_out = len(op.in_info), len(op.out_info)
    dtypes = [op.array_dtype(info, float_dtype) for info in op.in_info + op.out_info]
    source_of = [-1] * n_out
    for i, info in enumerate(op.in_info):
        if info.get("want_inplace", -1) >= 0:
            source_of[info["want_inplace"]] = i
    cuda = device == "cuda"
    fields = {
        "@N_IN@": str(n_in), "@N_OUT@": str(n_out), "@N@": str(n_in + n_out), "@NAME@": op.name.replace('"', ""),
        "@ITEMSIZES@": "{" + ", ".join(str(np.dtype(d).itemsize) for d in dtypes) + "}",
        "@SOURCE_OF@": "{" + ", ".join(map(str, source_of + [0])) + "}",
        "@STREAM_PARAM@": "cudaStream_t stream, " if cuda else "",
        "@STREAM_BIND@": ".Ctx<xla::ffi::PlatformStream<cudaStream_t>>()" if cuda else "",
        # On the host the entry point zeroes fresh outputs itself; on the device this handler does.
        "@ZERO@": "cudaMemsetAsync(out, 0, bytes[n_in + k], stream);" if cuda else "continue;",
        "@MEMCPY@": "cudaMemcpyAsync" if cuda else "memcpy",
        "@COPY_KIND@": ", cudaMemcpyDeviceToDevice" if cuda else "",
        "@ASYNC@": ", stream" if cuda else "",
        # host_memory inputs (scalars, small parameter vectors) are read on the host: copy them there.
        "@HOST_COPIES@": ("""  static const int host_memory[] = @HOST_MEMORY@;
  std::vector<std::vector<char>> host_copies(n_in);
  for (int i = 0; i < n_in; ++i) {
    if (!host_memory[i] || !bytes[i]) continue;
    host_copies[i].resize(bytes[i]);
    if (cudaMemcpyAsync(host_copies[i].data(), data[i], bytes[i], cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      return ffi::Error(ffi::ErrorCode::kInternal, "copying a host_memory input to the host failed");
    data[i] = host_copies[i].data();
  }""" if cuda else ""),
        "@HOST_MEMORY@": "{" + ", ".join(str(int(bool(info.get("host_memory")))) for info in op.in_info) + ", 0}",
        "@RUN@": (f"ptn_{base.symbol}_run_on_device(stream, data, shapes, strides, err, sizeof(err))" if cuda
                  else f"{base.symbol}(data, shapes, strides, err, sizeof(err))"),
    }
    text = _FFI_WRAPPER
    for k, v in fields.items():
        text = text.replace(k, v)
    text = text.replace("@SYM@", base.symbol)
    return Variant(symbol=base.symbol, source=base.source + text, device=device, include_dirs=(include_dir,))
