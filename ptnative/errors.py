"""Exceptions raised when a kernel reports a failure.

The driver raises them with static arguments (the op's name and the library's
symbol), which Numba code can do too; the message is read from the library's
last error when the exception is created, on the thread that ran the kernel.
"""

from __future__ import annotations


def kernel_message(op_name: str, symbol: str) -> str:
    from .build import loaded

    lib = loaded(symbol)
    chars = []
    while lib is not None and (c := lib.error_char(len(chars))) != 0:
        chars.append(chr(c))
    return f"NativeOp {op_name!r}: " + ("".join(chars) or "the kernel reported a failure")


class KernelValueError(ValueError):
    """A check in the kernel failed (``assert_cmp``, a shape or index out of range)."""

    def __init__(self, op_name: str, symbol: str):
        super().__init__(kernel_message(op_name, symbol))


class KernelRuntimeError(RuntimeError):
    """The kernel failed otherwise (``%(fail)s``, out of memory, BLAS or CUDA errors)."""

    def __init__(self, op_name: str, symbol: str):
        super().__init__(kernel_message(op_name, symbol))
