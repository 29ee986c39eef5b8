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


def describe() -> str:
    """Which BLAS the kernels use (for ``python -m ptnative info``)."""
    try:
        import scipy
        from threadpoolctl import threadpool_info  # optional

        libs = [f"{i['internal_api']} {i['version']} ({i['filepath']})" for i in threadpool_info()
                if i.get("user_api") == "blas"]
        return f"scipy {scipy.__version__} cython_blas -> " + "; ".join(libs)
    except ImportError:
        import scipy

        return f"scipy {scipy.__version__} cython_blas (bundled OpenBLAS)"
