"""Which compilers build the kernels: the C++ compiler and nvcc, as the environment names them.

A module of its own, importing nothing of ptnative, so that the build (:mod:`ptnative.build`), the device choice
(:mod:`ptnative.device`) and the prebuilt step (:mod:`ptnative.prebuilt`) all ask the same place without importing
each other."""

from __future__ import annotations

import os
import shutil


def cxx() -> str:
    """The C++ compiler to use: ``$PTNATIVE_CXX``, ``$CXX`` or ``g++``."""
    return os.environ.get("PTNATIVE_CXX") or os.environ.get("CXX") or "g++"


def nvcc() -> str | None:
    """The nvcc to use: ``$PTNATIVE_NVCC``, ``$CUDA_HOME/bin/nvcc`` or the one on PATH."""
    if os.environ.get("PTNATIVE_NVCC"):
        return os.environ["PTNATIVE_NVCC"]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        return os.path.join(cuda_home, "bin", "nvcc")
    return shutil.which("nvcc")
