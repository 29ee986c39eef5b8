"""JAX mode: each NativeOp becomes an XLA FFI call (``jax.ffi.ffi_call``) of a
handler built from the op's own entry point, so it runs inside XLA on the
device JAX uses (CPU, or CUDA with a handler built by nvcc), with no host
round trip.  ``want_inplace`` inputs are aliased to their outputs.  Gradients
need nothing special: the gradient op is a NativeOp too.

Registered when PyTensor's JAX dispatch is imported (see :func:`install`),
so that importing ptnative does not import JAX.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.util
import sys

_TARGET_MODULE = "pytensor.link.jax.dispatch"
_libraries: dict[str, ctypes.CDLL] = {}


def ffi_target(op, float_dtype: str, device: str) -> str:
    """Build (once) and register the FFI handler of ``op``; return its target name."""
    import jax

    from .. import blas
    from ..build import build
    from ..source import generate_ffi

    variant = generate_ffi(op.clone_with(inplace=(), device=None), float_dtype, device, jax.ffi.include_dir())
    name = f"{variant.symbol}_{device}"
    if name not in _libraries:
        lib = ctypes.CDLL(str(build(variant)))
        if device == "cpu":
            set_blas = getattr(lib, variant.symbol + "_set_blas")
            set_blas.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            set_blas(*blas.gemm_addresses())
        else:
            from ..device import load_cublas
            load_cublas()  # where the kernels' dlopen("libcublas.so.13") finds it
        handler = jax.ffi.pycapsule(getattr(lib, variant.symbol + "_ffi"))
        jax.ffi.register_ffi_target(name, handler, platform="cpu" if device == "cpu" else "CUDA")
        _libraries[name] = lib
    return name


def register() -> None:
    import jax
    from pytensor.link.jax.dispatch import jax_funcify

    from ..op import NativeOp

    @jax_funcify.register(NativeOp)
    def jax_funcify_native_op(op, node=None, **kwargs):
        device = "cuda" if jax.default_backend() == "gpu" else "cpu"
        if device == "cpu" and not op.cpu_support:
            raise RuntimeError(f"NativeOp {op.name!r} has no CPU implementation (cpu_support=False) and JAX runs "
                               "on the CPU")
        target = ffi_target(op, op.float_dtype_of(node), device)
        out_dtypes = [o.type.dtype for o in node.outputs]
        aliases = {i: info["want_inplace"] for i, info in enumerate(op.in_info) if info.get("want_inplace", -1) >= 0}
        out_shapes = [info["shape"] for info in op.out_info]

        def native_op(*inputs):
            result_types = [
                jax.ShapeDtypeStruct(tuple(s if isinstance(s, int) else inputs[s[0]].shape[s[1]] for s in shape), dt)
                for shape, dt in zip(out_shapes, out_dtypes)
            ]
            call = jax.ffi.ffi_call(target, result_types, input_output_aliases=aliases, vmap_method="sequential")
            outputs = call(*inputs)
            return outputs[0] if len(outputs) == 1 else tuple(outputs)

        return native_op


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Register the JAX implementation now if PyTensor's JAX dispatch is loaded, else when it is."""
    if _TARGET_MODULE in sys.modules:
        register()
    elif importlib.util.find_spec("jax") is not None:
        sys.meta_path.insert(0, _Finder())
