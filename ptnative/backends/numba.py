"""The default (Numba) mode: the driver compiled by Numba, calling our library
through ``numba.types.ExternalFunction``.

``ptn_run`` (allocate, call the entry point; it never raises) is compiled once
and cached across processes.  ``ptn_driver`` (the checks and the ``raise``) is
inlined into PyTensor's graph function, without a cache key: a failed check is
then a ``raise`` in that function, and Numba releases everything the graph holds
before it (an exception coming back from a call would leave the caller's arrays
pinned for good, numba/numba#1549).  The price: PyTensor does not cache a graph
holding a native op across processes.  ``ptnative.config.numba_graph_cache = True``
gives the op a cache key instead (graphs reused across processes; every failing
call then pins the arrays the graph function holds at that moment).

There is no key without that leak: for a keyed node PyTensor's
``numba_funcify_ensure_cache`` calls our function from a cached
``def f(*args): return jitable_func(*args)`` (Numba refuses to inline a callee
called with ``*args``), and the graph's own key puts the whole graph function
behind the same kind of wrapper, which alone pins every graph input per failing
call.  tests/test_leaks.py measures both sides of the trade."""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
from numba import types
from numba.extending import overload
from numba.np.numpy_support import as_dtype
from pytensor.link.numba.cache import compile_numba_function_src
from pytensor.link.numba.dispatch.basic import numba_njit, register_funcify_and_cache_key

from ..build import load
from ..op import NativeOp
from ..plan import dtype_code
from ..settings import config
from .driver import DRIVER_GLOBALS, array_type_code, driver_source

ENTRY_SIGNATURE = types.int32(types.voidptr, types.voidptr, types.voidptr, types.voidptr, types.voidptr, types.int64)


@overload(array_type_code)
def _array_type_code(a):
    code = dtype_code(as_dtype(a.dtype))  # the array's type is known when Numba compiles: a constant
    return lambda a: code
_loaded_permanently: set[str] = set()


def _driver(op, node, tuple_return: bool):
    """(driver source, cache key, globals with ``ptn_run`` compiled) of ``node``'s variant; loads its library."""
    variant = op.node_variant(node)
    lib = load(variant)  # builds if needed, sets BLAS in the library
    if lib.dlopen_name not in _loaded_permanently:  # the checked library, already loaded: no file is opened
        llvm.load_library_permanently(lib.dlopen_name)
        _loaded_permanently.add(lib.dlopen_name)
    src = driver_source(variant, op.inplace, tuple_return=tuple_return)
    key = f"ptnative_{variant.symbol}_{lib.path.stem.rsplit('-', 1)[-1]}_{src.digest}"
    env = dict(DRIVER_GLOBALS, __name__=__name__, ext=types.ExternalFunction(variant.symbol, ENTRY_SIGNATURE))
    run = compile_numba_function_src(src.run_text, src.run_name, global_env=env, cache_key=key + "_run")
    return src, key, dict(env, **{src.run_name: numba_njit(run, cache=True)})


@register_funcify_and_cache_key(NativeOp)
def numba_funcify_native_op(op, node, **kwargs):
    src, key, env = _driver(op, node, tuple_return=False)
    if config.numba_graph_cache:
        fn = compile_numba_function_src(src.driver_text, src.function_name, global_env=env, cache_key=key)
        return numba_njit(fn), key
    fn = compile_numba_function_src(src.driver_text, src.function_name, global_env=env)
    return numba_njit(fn, inline="always"), None


#: python_callable's functions, by (op, node's variant, signature or None).
_callables: dict = {}


def python_callable(op, node, signature=None):
    """``node``'s driver compiled by Numba as a function called from Python (``ptnative.eager``): the node's input
    arrays -> the tuple of its outputs, raising as the graph does.  With a Numba ``signature`` (argument types) it
    is compiled for those types alone, and any other argument types are a ``TypeError`` from Numba's dispatch
    before anything runs.  Made once per op, variant and signature; its ``ptn_run`` is the graph's (cached across
    processes), and the driver is called directly, so a failing call pins nothing (see the module's
    documentation)."""
    cache_key = (op, op.node_variant(node), signature)
    fn = _callables.get(cache_key)
    if fn is None:
        src, key, env = _driver(op, node, tuple_return=True)
        fn = compile_numba_function_src(src.driver_text, src.function_name, global_env=env, cache_key=key + "_py")
        fn = _callables[cache_key] = numba.njit(*([[signature]] if signature else []), cache=True)(fn)
    return fn
