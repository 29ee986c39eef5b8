"""Compile translation units into content-hashed shared libraries, cached per
user (mode 0700) and built under a file lock, so that parallel processes
(PyMC chains, pytest-xdist) share one build."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from filelock import FileLock, Timeout

from . import blas
from .source import Variant

log = logging.getLogger("ptnative.build")

# Hidden visibility and -Bsymbolic: every library keeps its own copy of the dialect's inline
# functions and statics, even when several are loaded RTLD_GLOBAL (as Numba does).
CXX_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-march=native", "-fno-math-errno", "-fno-trapping-math",
             "-fvisibility=hidden",
             "-fvisibility-inlines-hidden", "-Wl,-Bsymbolic", "-DCUDA=0"]
NVCC_FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden,-fvisibility-inlines-hidden",
              "-Xlinker", "-Bsymbolic", "--expt-relaxed-constexpr", "-x", "cu", "-DCUDA=1", "-diag-suppress", "177,550"]
DEFAULT_CUDA_ARCHS = ("75", "80", "86", "89", "90")
LOCK_TIMEOUT_S = 900


class CompileError(RuntimeError):
    """A kernel failed to compile; the message has the compiler's output and the source's path."""


def cache_dir() -> Path:
    """``$PTNATIVE_CACHE_DIR`` or ``~/.cache/ptnative/<platform>-py<X.Y>``, created with mode 0700."""
    base = os.environ.get("PTNATIVE_CACHE_DIR")
    if base:
        path = Path(base)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        tag = f"{platform.system().lower()}-{platform.machine()}-py{sys.version_info[0]}{sys.version_info[1]}"
        path = Path(xdg) / "ptnative" / tag
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def cxx() -> str:
    return os.environ.get("PTNATIVE_CXX") or os.environ.get("CXX") or "g++"


def nvcc() -> str | None:
    """The nvcc to use: ``$PTNATIVE_NVCC``, ``$CUDA_HOME/bin/nvcc`` or the one on PATH."""
    if os.environ.get("PTNATIVE_NVCC"):
        return os.environ["PTNATIVE_NVCC"]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        return os.path.join(cuda_home, "bin", "nvcc")
    return shutil.which("nvcc")


@cache
def compiler_version(cmd: str) -> str:
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompileError(f"the compiler {cmd!r} cannot be run: {e}") from None
    return out.stdout.strip()


@cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    return line
    except OSError:
        pass
    return platform.processor()


def cuda_archs() -> tuple[str, ...]:
    """``$PTNATIVE_CUDA_ARCHS`` (e.g. ``"80;90"``), else the GPUs found, else a default list."""
    env = os.environ.get("PTNATIVE_CUDA_ARCHS")
    if env:
        return tuple(a.strip().replace(".", "") for a in env.replace(",", ";").split(";") if a.strip())
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30)
            found = sorted({line.strip().replace(".", "") for line in out.stdout.splitlines() if line.strip()})
            if out.returncode == 0 and found:
                return tuple(found)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return DEFAULT_CUDA_ARCHS


def compile_command(variant: Variant, src: Path, out: Path) -> list[str]:
    includes = [f"-I{d}" for d in variant.include_dirs]
    if variant.device == "cpu":
        return [cxx(), *CXX_FLAGS, *includes, str(src), "-o", str(out)]
    nv = nvcc()
    if nv is None:
        raise CompileError("nvcc was not found (set PTNATIVE_NVCC or CUDA_HOME, or put nvcc on PATH)")
    gencode = []
    for arch in cuda_archs():
        gencode += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    return [nv, *NVCC_FLAGS, *includes, *gencode, str(src), "-o", str(out)]


def library_path(variant: Variant) -> Path:
    """Where ``variant``'s library lives in the cache (built or not)."""
    probe = compile_command(variant, Path("SRC"), Path("OUT"))
    key = "\0".join([variant.source, *probe, compiler_version(probe[0]), _cpu_model()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"{variant.symbol}-{variant.device}-{digest}.so"


def build(variant: Variant) -> Path:
    """Compile ``variant`` unless the cache already has it; return the library's path."""
    path = library_path(variant)
    if path.exists():
        return path
    try:
        with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
            if path.exists():  # another process built it while we waited
                return path
            _compile(variant, path)
    except Timeout:
        raise CompileError(f"timed out after {LOCK_TIMEOUT_S} s waiting for the build lock {path}.lock") from None
    return path


def _compile(variant: Variant, path: Path) -> None:
    ext = ".cu" if variant.device == "cuda" else ".cpp"
    src = path.with_suffix(ext)
    src.write_text(variant.source)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp.so")
    os.close(fd)
    cmd = compile_command(variant, src, Path(tmp))
    log.info("compiling %s", path.name)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            output = (proc.stderr + proc.stdout).strip()
            if len(output) > 20000:
                output = output[:20000] + "\n... (truncated)"
            raise CompileError(f"compiling {variant.symbol} ({variant.device}) failed.\n"
                               f"source: {src}\ncommand: {' '.join(cmd)}\n{output}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class Library:
    """A loaded CPU library: ``run`` is the entry point, BLAS already set."""

    def __init__(self, variant: Variant, path: Path):
        self.variant = variant
        self.path = path
        self.cdll = ctypes.CDLL(str(path))
        self.run = getattr(self.cdll, variant.symbol)
        self.run.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64]
        self.run.restype = ctypes.c_int
        set_blas = getattr(self.cdll, variant.symbol + "_set_blas")
        set_blas.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        set_blas.restype = None
        set_blas(*blas.gemm_addresses())
        self.error_char = getattr(self.cdll, variant.symbol + "_error_char")
        self.error_char.argtypes = [ctypes.c_int64]
        self.error_char.restype = ctypes.c_int32


_loaded: dict[str, Library] = {}


def load(variant: Variant) -> Library:
    """Build if needed and load ``variant`` (CPU) into this process, once."""
    lib = _loaded.get(variant.symbol)
    if lib is None:
        lib = _loaded[variant.symbol] = Library(variant, build(variant))
    return lib


def loaded(symbol: str) -> Library | None:
    """The library of ``symbol`` if this process has loaded it."""
    return _loaded.get(symbol)
