"""Which device an op runs on: GPU discovery through the CUDA driver, and the choice rule."""

from __future__ import annotations

import ctypes
from functools import cache

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
    from .build import nvcc

    wanted = op.device or config.device
    has_gpu = cuda_device_count() > 0
    if wanted == "cuda" or (wanted == "auto" and has_gpu and nvcc() is not None):
        if not has_gpu:
            raise RuntimeError(f"NativeOp {op.name!r}: device 'cuda' was requested, but no CUDA driver and GPU "
                               "were found (set ptnative.config.device = 'auto' or 'cpu')")
        return "cuda"
    if not op.cpu_support:
        raise RuntimeError(f"NativeOp {op.name!r} has no CPU implementation (cpu_support=False) and needs a "
                           "CUDA GPU, but " + ("device 'cpu' was requested" if wanted == "cpu"
                                               else "no CUDA driver and GPU were found"))
    return "cpu"
