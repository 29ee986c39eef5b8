"""BLAS for the CPU kernels: sgemm/dgemm from ``scipy.linalg.cython_blas``,
taken at run time (pip's PyTensor has no BLAS for C code)."""

from __future__ import annotations

import ctypes
from functools import cache


@cache
def gemm_addresses() -> tuple[int, int]:
    """Addresses of scipy's Fortran-ABI ``sgemm`` and ``dgemm``."""
    from scipy.linalg import cython_blas

    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    addresses = []
    for fn in ("sgemm", "dgemm"):
        capsule = cython_blas.__pyx_capi__[fn]
        addresses.append(get_pointer(capsule, get_name(capsule)))
    return addresses[0], addresses[1]


# The symbols by which the kernels find OpenBLAS's worker pool (c_code/dialect/native_op_blas.h, set_blas).
POOL_RUN = "gotoblas_pthread"
POOL_SIZE = ("openblas_get_num_threads", "scipy_openblas_get_num_threads")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p), ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


def _dladdr():
    """The C library's ``dladdr`` (Linux and macOS both have it), or None where this process cannot find it."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    return dladdr


def _file_of(address: int | None) -> str | None:
    """The shared library file that holds ``address``; None if unknown (no ``dladdr``, no such library)."""
    dladdr = _dladdr()
    info = _DlInfo()
    if dladdr is None or not address or not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname.decode(errors="replace")


def _open(path: str):
    """The already loaded library ``path`` (``ctypes.CDLL``), or None if it cannot be opened."""
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


@cache
def thread_pool() -> str | None:
    """The file of the OpenBLAS (pthread server) whose worker pool the CPU kernels run their threads on, found
    as they find it: from the library of scipy's sgemm and its dependencies.  None: threads of their own — where
    scipy's BLAS is not OpenBLAS (Accelerate on macOS, MKL, a BLAS without ``gotoblas_pthread``), where
    ``dladdr`` is missing, or where the library cannot be opened; the kernels' C side (``set_blas``) makes the
    same choice the same way."""
    path = _file_of(gemm_addresses()[0])
    lib = _open(path) if path is not None else None
    if lib is None or not hasattr(lib, POOL_RUN) or not any(hasattr(lib, name) for name in POOL_SIZE):
        return None
    return _file_of(ctypes.cast(getattr(lib, POOL_RUN), ctypes.c_void_p).value)


def describe() -> str:
    """Which BLAS the kernels use and where their CPU threads run (for ``python -m ptnative info``)."""
    import scipy

    pool = thread_pool()
    threads = f"the worker pool of {pool}" if pool else "threads of their own"
    return f"scipy {scipy.__version__} cython_blas; CPU kernel threads: {threads}"
