"""Exceptions raised when a kernel reports a failure.

Both are ordinary one-message exceptions (``KernelValueError("NativeOp 'x': ...")``), so PyTensor can
re-raise them with its "Apply node that caused the error" context appended.

Numba's nopython code can only raise exceptions with constant arguments, so the drivers (one text for
the Python and the Numba path, see :mod:`ptnative.backends.driver`) raise
``KernelValueError(FROM_KERNEL, op_name, symbol)``: the message is then read from the library's last
error when the exception is created, on the thread that ran the kernel, and becomes the exception's
only argument.
"""

from __future__ import annotations

#: First argument of the drivers' constant-argument form (see the module docstring).
FROM_KERNEL = "<ptnative: the message of the kernel's last error>"


def kernel_message(op_name: str, symbol: str) -> str:
    """``"NativeOp '<op_name>': <message>"`` with the last error that ``symbol``'s library recorded on this thread."""
    from .build import loaded

    lib = loaded(symbol)
    data = bytearray()
    while lib is not None and (c := lib.error_char(len(data))) != 0:
        data.append(c)
    return f"NativeOp {op_name!r}: " + (data.decode("utf-8", "replace") or "the kernel reported a failure")


class _KernelError(Exception):
    """``(message, *args)`` as any exception, or ``(FROM_KERNEL, op_name, symbol)`` from a driver."""

    def __init__(self, *args):
        if len(args) == 3 and args[0] == FROM_KERNEL:
            args = (kernel_message(args[1], args[2]),)
        super().__init__(*args)


class KernelValueError(_KernelError, ValueError):
    """A check in the kernel failed: ``assert_cmp`` / ``assert`` (a shape, length or index out of range)."""


class KernelRuntimeError(_KernelError, RuntimeError):
    """The kernel failed otherwise: ``%(fail)s`` after ``ptn_set_error``, out of memory, a BLAS or CUDA error."""
