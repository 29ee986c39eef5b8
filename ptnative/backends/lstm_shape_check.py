"""``LstmShapeCheck``'s code for PyTensor's backends (:class:`ptnative.ops.lstm.LstmShapeCheck`): its C code
(modes ``"C"`` and ``"CVM"``), its Numba implementation (the default mode) and its JAX one.

The op holds the layer's shape rules and hands them over; this module renders them and imports nothing of the
op.  A rule ``(arg, k, ref, kr, factor, what)`` reads: ``arg.shape[k]`` must equal ``factor * ref.shape[kr]``
(``what`` words the expected size in the message).  ``args`` names the op's inputs, in order, and ``check`` is the
Python check (``ValueError`` for the first broken rule) that the Numba and JAX code call.
"""

from __future__ import annotations

import zlib
from typing import Callable

from .jax_dispatch import register_lazily


def c_code(fn: str, args, rules, inputs, outputs, fail: str) -> str:
    """The C code of the check: every rule unrolled (``ValueError`` naming ``fn`` and the argument, then PyTensor's
    ``fail``), then the outputs as the inputs themselves (views)."""
    dims = {arg: f"PyArray_DIMS({v})" for arg, v in zip(args, inputs)}
    checks = []
    for arg, k, ref, kr, factor, what in rules:
        got, want = f"{dims[arg]}[{k}]", f"{factor} * {dims[ref]}[{kr}]"
        checks.append(f"""if ({got} != {want}) {{
              PyErr_Format(PyExc_ValueError, "{fn}: {arg}.shape[{k}] = %lld; expected {what} = %lld",
                           (long long){got}, (long long)({want}));
              {fail}
            }}""")
    views = [f"Py_XDECREF({out}); {out} = {v}; Py_INCREF({out});" for v, out in zip(inputs, outputs)]
    return "\n".join(checks + views)


def c_code_cache_version(rules) -> tuple:
    """The C code's cache version: changes with the rules."""
    # crc32, not hash(): str hashes differ between processes, and so would the module's cache key.
    return (1, zlib.crc32(repr(rules).encode()))


def numba_source(args, rules) -> str:
    """The Numba source of the check: the rules unrolled in nopython code; a broken one raises the message of
    ``check_layer_shapes`` from object mode (Numba cannot build it in a graph function)."""
    condition = " and ".join(f"{arg}.shape[{k}] == {factor} * {ref}.shape[{kr}]"
                             for arg, k, ref, kr, factor, _ in rules)
    names = ", ".join(args)
    shapes = ", ".join(f"{a}.shape" for a in args)
    return (f"def lstm_shape_check({names}):\n"
            f"    if not ({condition}):\n"
            f"        with numba.objmode():\n"
            f"            check_layer_shapes(({shapes},))\n"
            f"    return {names}\n")


def jax_function(check: Callable) -> Callable:
    """The JAX implementation: ``check`` on the static shapes when JAX traces the function, then the arrays."""
    def lstm_shape_check(*arrays):
        check([a.shape for a in arrays])
        return arrays

    return lstm_shape_check


def register(op_class: type, args, rules, check: Callable) -> None:
    """Register ``op_class``'s Numba implementation with PyTensor's ``numba_funcify`` and its JAX one lazily
    (:func:`ptnative.backends.jax_dispatch.register_lazily`)."""
    from pytensor.link.numba.dispatch.basic import register_funcify_and_cache_key

    @register_funcify_and_cache_key(op_class)
    def numba_funcify_shape_check(op, node, **kwargs):
        import numba
        from pytensor.link.numba.cache import compile_numba_function_src
        from pytensor.link.numba.dispatch.basic import numba_njit

        fn = compile_numba_function_src(numba_source(args, rules), "lstm_shape_check",
                                        global_env={"numba": numba, "check_layer_shapes": check})
        return numba_njit(fn), None

    register_lazily(op_class, lambda op, node=None, **kwargs: jax_function(check))
