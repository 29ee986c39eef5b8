"""The default (Numba) mode: the driver compiled by Numba, calling our library
through ``numba.types.ExternalFunction``, with a cache key so that compiled
graphs are reused across processes."""

from __future__ import annotations

import llvmlite.binding as llvm
from numba import types
from pytensor.link.numba.cache import compile_numba_function_src
from pytensor.link.numba.dispatch.basic import numba_njit, register_funcify_and_cache_key

from ..build import load
from ..op import NativeOp
from .driver import DRIVER_GLOBALS, driver_source

ENTRY_SIGNATURE = types.int32(types.voidptr, types.voidptr, types.voidptr, types.voidptr, types.int64)
_loaded_permanently: set[str] = set()


@register_funcify_and_cache_key(NativeOp)
def numba_funcify_native_op(op, node, **kwargs):
    float_dtype, device = op.target(node)
    variant = op.variant(float_dtype, device)
    lib = load(variant)  # builds if needed, sets BLAS in the library
    if lib.dlopen_name not in _loaded_permanently:  # the checked library, already loaded: no file is opened
        llvm.load_library_permanently(lib.dlopen_name)
        _loaded_permanently.add(lib.dlopen_name)
    src = driver_source(op, float_dtype, device, tuple_return=False)
    key = f"ptnative_{variant.symbol}_{lib.path.stem.rsplit('-', 1)[-1]}_{src.digest}"
    env = dict(DRIVER_GLOBALS, ext=types.ExternalFunction(variant.symbol, ENTRY_SIGNATURE))
    fn = compile_numba_function_src(src.text, src.function_name, global_env=env, cache_key=key)
    return numba_njit(fn), key
