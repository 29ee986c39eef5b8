"""Which device an op runs on: GPU discovery through the CUDA driver, and the choice rule."""

from __future__ import annotations

import ctypes
import glob
import os
from functools import cache

from .compilers import nvcc
from .settings import config


@cache
def cuda_device_count() -> int:
    """Number of CUDA devices the driver reports (0 without a driver or a device)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def resolve(op) -> str:
    """``"cpu"`` or ``"cuda"`` for ``op`` under its own ``device`` or ``ptnative.config.device``.

    ``"auto"`` picks the GPU when one is present (and nvcc, to build for it) and the op supports it, else
    the CPU.  Raises
    ``RuntimeError`` when the choice cannot run here: ``"cuda"`` without a GPU, or a GPU-only op
    (``cpu_support=False``) without one.
    """
    wanted = op.device or config.device
    has_gpu = cuda_device_count() > 0
    if wanted == "cuda" or (wanted == "auto" and has_gpu and nvcc() is not None):
        if not has_gpu:
            raise RuntimeError(f"NativeOp {op.name!r}: device 'cuda' was requested, but no CUDA driver and GPU "
                               "were found (set ptnative.config.device = 'auto' or 'cpu')")
        load_cublas()
        return "cuda"
    if not op.cpu_support:
        raise RuntimeError(f"NativeOp {op.name!r} has no CPU implementation (cpu_support=False) and needs a "
                           "CUDA GPU, but " + ("device 'cpu' was requested" if wanted == "cpu"
                                               else "no CUDA driver and GPU were found"))
    return "cpu"


def cublas_candidates() -> list[str]:
    """Where cuBLAS may be, best first: ``$PTNATIVE_CUBLAS``, the ``nvidia-cublas`` wheel, the CUDA toolkit
    (``$CUDA_HOME``, next to the nvcc in use, ``/usr/local/cuda``), then the loader's own search by name."""
    found = [os.environ["PTNATIVE_CUBLAS"]] if os.environ.get("PTNATIVE_CUBLAS") else []
    try:
        import nvidia.cublas
        dirs = [os.path.join(p, "lib") for p in nvidia.cublas.__path__]
    except ImportError:
        dirs = []
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if nvcc():
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc()))))
    roots.append("/usr/local/cuda")
    dirs += [os.path.join(r, sub) for r in roots if r for sub in ("lib64", "lib", "targets/x86_64-linux/lib")]
    for d in dirs:
        for major in ("13", "12"):
            found += sorted(glob.glob(os.path.join(d, f"libcublas.so.{major}*")))[:1]
    return found + ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]


@cache
def load_cublas() -> str | None:
    """Load cuBLAS into the process (RTLD_GLOBAL) and return its path, or None when it is not found.

    The CUDA kernels open ``libcublas.so.13`` (or ``.12``) by name at their first GEMM; once loaded here the
    loader finds it by that name, also when it lives in a wheel or toolkit folder outside the search path.
    """
    for path in cublas_candidates():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return path
        except OSError:
            continue
    return None
