"""Compile translation units into content-hashed shared libraries, kept in a
per-user cache that trusts nothing it did not write itself (:mod:`ptnative.cache`),
and built under a file lock, so that parallel processes (PyMC chains,
pytest-xdist) share one build.

Every loader goes through :func:`open_library` (or :func:`load` for the CPU
entry points, :func:`open_cached` for a library known only by its path): they
check the library before loading it and load exactly the bytes they checked.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import threading
import warnings
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from . import blas, blas_threads, cache as _cache, flags, prebuilt
from .cache import CacheError, Directory, Missing, Unrecorded, Untrusted, UntrustedLibraryWarning
from .cache import check_output, checked_dir, configured_dir, directory_problem, dlopen_fd, open_verified
from .compilers import cxx, nvcc
from .flags import Toolchain
from .plan import dtype_code
from .source import Variant
from .spec import MAX_NDIM

__all__ = ["CompileError", "CacheError", "UntrustedLibraryWarning", "cache_dir", "cache_status", "build",
           "open_library", "open_cached", "load", "loaded", "library_path", "library_name", "resolve",
           "local_toolchain", "Library", "device_counts"]

log = logging.getLogger("ptnative.build")

# Hidden visibility and -Bsymbolic: every library keeps its own copy of the dialect's inline
# functions and statics, even when several are loaded RTLD_GLOBAL (as Numba does).  The command's template:
# ptnative.flags.for_platform puts the CPU target (the user's flags) in place of -march=native and adapts the
# shared-library flags to the platform (macOS: -dynamiclib, no -Bsymbolic).
CXX_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-march=native", "-fno-math-errno", "-fno-trapping-math",
             "-fvisibility=hidden",
             "-fvisibility-inlines-hidden", "-Wl,-Bsymbolic", "-DCUDA=0"]
#: A translation unit holding this line is compiled at ``QUICK_BUILD_OPT`` instead of ``-O3`` (so under another
#: library name): for code whose speed does not matter but whose compile time does, such as the test suite's CUDA
#: emulation (tests/test_cuda_emulation.py) and its nvcc compile checks.  For nvcc, ``-O`` sets the host code's
#: level only: cicc and ptxas optimise the device code as in every other build.
QUICK_BUILD_MARK = "// ptnative: quick build"
QUICK_BUILD_OPT = "-O0"
NVCC_FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden,-fvisibility-inlines-hidden",
              "-Xlinker", "-Bsymbolic", "--expt-relaxed-constexpr", "-x", "cu", "-DCUDA=1", "-diag-suppress", "177,550"]
DEFAULT_CUDA_ARCHS = ("75", "80", "86", "89", "90")
LOCK_TIMEOUT_S = 900


class CompileError(RuntimeError):
    """A kernel failed to compile; the message has the compiler's output and the source's path."""


def cache_dir() -> Path:
    """The kernel cache: ``$PTNATIVE_CACHE_DIR``, or ``$XDG_CACHE_HOME/ptnative/<system>-<machine>-py<XY>``
    (``XDG_CACHE_HOME`` defaults to ``~/.cache``; e.g. ``~/.cache/ptnative/linux-x86_64-py311``), created with
    mode 0700 if missing.  :class:`CacheError` (naming the directory and the fix) unless it is a real directory
    owned by the user and not writable by group or others (in the default layout, its ``ptnative`` parent too)."""
    return checked_dir()


def cache_status() -> tuple[Path, str | None]:
    """The configured cache directory (created if missing) and why it fails the rules, or None if it passes."""
    path, _ = configured_dir()
    try:
        return path, directory_problem()
    except CacheError as e:  # it could not be created
        return path, str(e)


@cache
def compiler_version(cmd: str) -> str:
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompileError(f"the compiler {cmd!r} cannot be run: {e}") from None
    return out.stdout.strip()


@cache
def _cpu_model() -> str:
    """A line naming this CPU, for the names of libraries built for it (``/proc/cpuinfo``'s model name on Linux;
    ``sysctl machdep.cpu.brand_string`` on macOS, where ``platform.processor()`` says only "arm" or "i386")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    return line
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return platform.processor()


def local_toolchain() -> Toolchain:
    """This process's compiler and CPU target (:mod:`ptnative.flags`): what a library is compiled with here."""
    target = flags.target_flags()
    compiler = cxx()
    return Toolchain(compiler, compiler_version(compiler), tuple(target),
                     _cpu_model() if flags.targets_this_cpu(target) else "")


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


def compile_command(variant: Variant, src: Path, out: Path, toolchain: Toolchain | None = None) -> list[str]:
    """The command compiling ``variant`` from ``src`` into ``out``; a CPU variant with ``toolchain``'s compiler
    and target (default: :func:`local_toolchain`)."""
    includes = [f"-I{d}" for d in variant.include_dirs]
    if variant.device == "cpu":
        if toolchain is None:
            toolchain = local_toolchain()
        cpu_flags = flags.for_platform(CXX_FLAGS, list(toolchain.target))
        return [toolchain.compiler, *_opt_level(cpu_flags, variant), *includes, str(src), "-o", str(out)]
    nv = nvcc()
    if nv is None:
        raise CompileError("nvcc was not found (set PTNATIVE_NVCC or CUDA_HOME, or put nvcc on PATH)")
    gencode = []
    for arch in cuda_archs():
        gencode += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    # PTNATIVE_COUNT_DEVICE_WORK=1: libraries that count their launches, allocations and copies
    # (ptnative.build.device_counts), under names of their own
    counting = ["-DPTN_COUNT_DEVICE_WORK=1"] if os.environ.get("PTNATIVE_COUNT_DEVICE_WORK") == "1" else []
    return [nv, *_opt_level(NVCC_FLAGS, variant), *counting, *includes, *gencode, str(src), "-o", str(out)]


def _opt_level(flags: list[str], variant: Variant) -> list[str]:
    """``flags``, at ``QUICK_BUILD_OPT`` instead of ``-O3`` where the source holds ``QUICK_BUILD_MARK``."""
    if QUICK_BUILD_MARK not in variant.source:
        return flags
    return [QUICK_BUILD_OPT if flag == "-O3" else flag for flag in flags]


@cache
def include_dir_digest(directory: str) -> str:
    """A digest of the headers under ``directory`` (relative paths and contents): what a library built with
    ``-I<directory>`` depends on, wherever the folder is (jaxlib's headers in each virtual environment)."""
    h = hashlib.sha256()
    root = Path(directory)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def library_name(variant: Variant, toolchain: Toolchain | None = None) -> str:
    """The file name of ``variant``'s library.  It hashes the source, the compile command (an include folder by
    its headers' contents, not its path), the compiler's version and, for a CPU target of this CPU (the default
    ``-march=native``) or a CUDA build, the CPU model.  A CPU variant is named for ``toolchain`` (default:
    :func:`local_toolchain`)."""
    if variant.device == "cpu" and toolchain is None:
        toolchain = local_toolchain()
    probe = compile_command(variant, Path("SRC"), Path("OUT"), toolchain)
    by_content = {f"-I{d}": f"-I<{include_dir_digest(d)}>" for d in variant.include_dirs}
    probe = [by_content.get(arg, arg) for arg in probe]
    if toolchain is None:
        identity = [compiler_version(probe[0]), _cpu_model()]
    else:
        identity = [toolchain.version, toolchain.cpu]
    key = "\0".join([variant.source, *probe, *identity])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{variant.symbol}-{variant.device}-{digest}.so"


def resolve(variant: Variant) -> tuple[Path, Toolchain | None]:
    """Where ``variant``'s library lives in the cache (built or not), and the toolchain it is compiled with there
    (None for CUDA).  A CPU variant is named for this process's toolchain, except where the user set no CPU
    target (:func:`ptnative.flags.user_set`), the package's prebuilt libraries were built for a portable target
    with the same compiler command and hold this variant's library for a CPU level this CPU runs
    (:func:`ptnative.prebuilt.portable_toolchains`, best first): then it is named, and if ever compiled here
    compiled, as the package built it for the best such level."""
    if variant.device == "cpu" and not flags.user_set():
        for shipped in prebuilt.portable_toolchains(cxx()):
            name = library_name(variant, shipped)
            if prebuilt.ships(name):
                return cache_dir() / name, shipped
    toolchain = local_toolchain() if variant.device == "cpu" else None
    return cache_dir() / library_name(variant, toolchain), toolchain


def library_path(variant: Variant) -> Path:
    """Where ``variant``'s library lives in the cache (built or not): :func:`resolve`'s path."""
    return resolve(variant)[0]


@contextmanager
def _build_lock(path: Path):
    try:
        with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
            yield
    except Timeout:
        raise CompileError(f"timed out after {LOCK_TIMEOUT_S} s waiting for the build lock {path}.lock") from None


def _warn_rebuild(path: Path, why: str) -> None:
    warnings.warn(f"ptnative: the cached library {path} {why}; it was not loaded and is being rebuilt",
                  UntrustedLibraryWarning, stacklevel=4)


def _install_prebuilt(directory: Directory, path: Path) -> bool:
    """Install the package's prebuilt library of the same name (:mod:`ptnative.prebuilt`) in the cache, if there
    is one that passes its checks; False if there is none (a failing one also warns)."""
    if not prebuilt.enabled():
        return False
    try:
        with prebuilt.packaged() as packaged:
            data = packaged.read_verified(path.name)
    except Missing:
        return False
    except Untrusted as e:
        warnings.warn(f"ptnative: the prebuilt library {prebuilt.prebuilt_dir() / path.name} (or its folder) {e}; "
                      "it was not used and the kernel is being compiled", UntrustedLibraryWarning, stacklevel=5)
        return False
    directory.install(path.name, data)
    log.info("installed %s from the package's prebuilt libraries", path.name)
    return True


def _ensure(variant: Variant, directory: Directory, path: Path, toolchain: Toolchain | None,
            rebuild_because: str | None = None) -> int:
    """A descriptor of ``variant``'s library that passed every check, compiled first if it is missing, and
    rebuilt (with one :class:`UntrustedLibraryWarning`) if it fails a check or ``rebuild_because`` is given.
    A missing or untrusted library is first looked for among the package's prebuilt ones; a library that
    passed its checks but could not be loaded (``rebuild_because``) is always compiled."""
    loadable = rebuild_because is None
    if rebuild_because is None:
        try:
            return open_verified(directory, path.name)
        except Untrusted:
            pass
    with _build_lock(path):
        if rebuild_because is None:
            try:
                return open_verified(directory, path.name)  # another process built it meanwhile
            except Missing:
                pass
            except Unrecorded as e:
                log.info("rebuilding %s: it %s", path, e)
                directory.discard(path.name)
            except Untrusted as e:
                rebuild_because = str(e)
        if rebuild_because is not None:
            _warn_rebuild(path, rebuild_because)
            directory.discard(path.name)
        if not (loadable and _install_prebuilt(directory, path)):
            _compile(variant, directory, path, toolchain)
        try:
            return open_verified(directory, path.name)
        except Untrusted as e:
            raise CacheError(f"ptnative: the library {path} was just built but {e}") from None


def build(variant: Variant) -> Path:
    """Make sure the cache holds a library of ``variant`` that passes every check: compile it if missing, rebuild
    it (with one :class:`UntrustedLibraryWarning`) if it fails one.  Return its path, for messages and for
    ahead-of-time builds; to load it use :func:`open_library` (never ``dlopen`` the path: it is not checked
    again).  :class:`CompileError` if the compiler fails or writes no usable library; :class:`CacheError` if the
    cache directory fails its checks."""
    path, toolchain = resolve(variant)
    with Directory(path.parent) as directory:
        os.close(_ensure(variant, directory, path, toolchain))
    return path


_opened: dict[str, ctypes.CDLL] = {}
_open_lock = threading.RLock()


def _dlopen_checked(directory: Directory, path: Path, fd: int) -> ctypes.CDLL:
    """Load the checked library open as ``fd`` (taking ownership of it): through ``/proc/self/fd``, or, where
    there is none (macOS), by its path under the cache's lock, checked again first and compared with the checked
    file after loading (:func:`ptnative.cache.dlopen_fd`)."""
    if _cache.proc_fd_usable():
        return dlopen_fd(fd, path)
    os.close(fd)
    with _build_lock(path):  # no /proc/self/fd: load the checked path while no ptnative process can replace it
        return dlopen_fd(open_verified(directory, path.name), path)


def open_library(variant: Variant) -> ctypes.CDLL:
    """``variant``'s library, built if needed, checked and loaded once per process (the one way every backend
    loads a library).  A library that passes its checks but fails to load is rebuilt once (with one
    :class:`UntrustedLibraryWarning`); if the rebuilt one fails too, :class:`CompileError` with the loader's
    message.  Errors as for :func:`build`."""
    path, toolchain = resolve(variant)
    lib = _opened.get(str(path))
    if lib is not None:
        return lib
    with _open_lock:
        lib = _opened.get(str(path))
        if lib is not None:
            return lib
        with Directory(path.parent) as directory:
            fd = _ensure(variant, directory, path, toolchain)
            try:
                lib = _dlopen_checked(directory, path, fd)
            except OSError as e:
                fd = _ensure(variant, directory, path, toolchain,
                             rebuild_because=f"passed its checks but cannot be loaded ({e})")
                try:
                    lib = _dlopen_checked(directory, path, fd)
                except OSError as e2:
                    raise CompileError(f"compiling {variant.symbol} ({variant.device}) gives a library that cannot "
                                       f"be loaded, even after a rebuild: {e2}\nlibrary: {path}\ncompiler: "
                                       f"{compile_command(variant, Path('SRC'), Path('OUT'), toolchain)[0]}") from None
        _opened[str(path)] = lib
    return lib


def open_cached(path: str | os.PathLike) -> ctypes.CDLL:
    """The library at ``path`` (a file in a kernel cache, as :func:`build` returned it), checked and loaded once
    per process, for code that knows a library only by its path (e.g. a compiled C module).  It cannot be
    rebuilt from here: :class:`CacheError` if the directory or the library fails a check, or if it cannot be
    loaded."""
    path = Path(path)
    with _open_lock:
        lib = _opened.get(str(path))
        if lib is not None:
            return lib
        with Directory(path.parent) as directory:
            try:
                lib = _dlopen_checked(directory, path, open_verified(directory, path.name))
            except Untrusted as e:
                raise CacheError(f"ptnative: the cached library {path} {e}; it was not loaded. Run the function "
                                 "again in a new process (the op rebuilds it) or `python -m ptnative build`") from None
            except OSError as e:
                raise CacheError(f"ptnative: the cached library {path} cannot be loaded ({e})") from None
        _opened[str(path)] = lib
    return lib


def _read_output(directory: Directory, name: str, fail) -> bytes:
    try:
        fd, st = directory.open_checked(name)
    except Missing:
        raise fail("the compiler exited with status 0 but wrote no library") from None
    except Untrusted as e:
        raise fail(f"the compiler's output {e}") from None
    try:
        problem = check_output(fd, st.st_size)
        if problem:
            raise fail(f"the compiler exited with status 0 but its output {problem}")
        chunks, offset = [], 0
        while chunk := os.pread(fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _compile(variant: Variant, directory: Directory, path: Path, toolchain: Toolchain | None = None) -> None:
    """Compile ``variant`` (a CPU one with ``toolchain``, default :func:`local_toolchain`) in a private build
    directory, check the output, and install it with its record."""
    src_name = path.stem + (".cu" if variant.device == "cuda" else ".cpp")
    directory.replace(directory.write_new(src_name, variant.source.encode()), src_name)
    build_name = directory.make_build_dir(path.stem)
    via = directory.child_path()
    cmd = compile_command(variant, Path(via, src_name), Path(via, build_name, "out.so"), toolchain)
    shown = shlex.join(cmd).replace(via + "/", f"{path.parent}/")  # the command in the user's terms
    log.info("compiling %s", path.name)
    try:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        except OSError as e:
            raise CompileError(f"compiling {variant.symbol} ({variant.device}): the compiler {cmd[0]!r} cannot be "
                               f"run: {e}\ncommand: {shown}") from None
        output = (proc.stderr + proc.stdout).strip().replace(via + "/", f"{path.parent}/")
        if len(output) > 20000:
            output = output[:20000] + "\n... (truncated)"

        def fail(what: str) -> CompileError:
            return CompileError(f"compiling {variant.symbol} ({variant.device}) failed: {what}. Nothing was "
                                f"installed in the cache.\nsource: {path.parent / src_name}\ncommand: {shown}\n"
                                f"{output or '(the compiler printed nothing)'}")

        if proc.returncode != 0:
            raise fail(f"the compiler exited with status {proc.returncode}")
        data = _read_output(directory, f"{build_name}/out.so", fail)
        directory.install(path.name, data)
    finally:
        directory.remove_tree(build_name)


class Library:
    """A loaded CPU library: ``run`` is the entry point, BLAS and the process's worker pool already set.  ``dlopen_name`` is the name it was
    loaded under (``dlopen`` of that name returns this library, without opening any file)."""

    def __init__(self, variant: Variant, path: Path, cdll: ctypes.CDLL):
        self.variant = variant
        self.path = path
        self.cdll = cdll
        self.dlopen_name = cdll._name
        self.run = getattr(self.cdll, variant.symbol)
        self.run.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64]
        self.run.restype = ctypes.c_int
        set_blas = getattr(self.cdll, variant.symbol + "_set_blas")
        set_blas.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        set_blas.restype = None
        set_blas(*blas.gemm_addresses())
        set_parts_pool = getattr(self.cdll, variant.symbol + "_set_parts_pool")
        set_parts_pool.argtypes = [ctypes.c_void_p]
        set_parts_pool.restype = None
        set_parts_pool(blas_threads.parts_runner(open_library))
        self.error_char = getattr(self.cdll, variant.symbol + "_error_char")
        self.error_char.argtypes = [ctypes.c_int64]
        self.error_char.restype = ctypes.c_int32


_loaded: dict[str, Library] = {}


def argument_error(variant: Variant, shapes, dtypes) -> str | None:
    """What ``variant``'s entry point would say of arrays of ``shapes`` and ``dtypes`` (every input, then every
    output), without running it: the message of its argument check (``<symbol>_check_arguments``, the check every
    call goes through; ``"input 'x' must have size 4 in dim 1"``), or None when they pass.  For glues that check
    before they call (JAX mode, when it traces a call)."""
    check = getattr(open_library(variant), variant.symbol + "_check_arguments")
    check.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64]
    check.restype = ctypes.c_int
    types = np.zeros(2 * len(shapes), np.int32)
    dims = np.zeros(len(shapes) * MAX_NDIM, np.int64)
    for j, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        types[2 * j:2 * j + 2] = len(shape), dtype_code(dtype)
        dims[j * MAX_NDIM:j * MAX_NDIM + min(len(shape), MAX_NDIM)] = shape[:MAX_NDIM]
    err = ctypes.create_string_buffer(2048)
    if check(types.ctypes.data, dims.ctypes.data, err, len(err)) == 0:
        return None
    return err.value.decode("utf-8", "replace")


def load(variant: Variant) -> Library:
    """Build if needed, check and load ``variant`` (CPU) into this process, once (through :func:`open_library`)."""
    lib = _loaded.get(variant.symbol)
    if lib is None:
        with _open_lock:
            lib = _loaded.get(variant.symbol)
            if lib is None:
                lib = _loaded[variant.symbol] = Library(variant, library_path(variant), open_library(variant))
                blas_threads.install(open_library)  # the OpenBLAS libraries loaded by now share one pool
    return lib


def loaded(symbol: str) -> Library | None:
    """The library of ``symbol`` if this process has loaded it."""
    return _loaded.get(symbol)


def device_counts(variant, reset: bool = False) -> dict[str, int]:
    """What the calls of CUDA ``variant``'s library (``op.variant(dtype, device="cuda")``; loaded here if it is not
    yet) did on the device since it was loaded or last reset: ``launches`` (kernels), ``allocs`` (cudaMalloc),
    ``h2d`` and ``d2h`` (bytes copied host -> device and device -> host).  Counted only in libraries built with
    ``PTNATIVE_COUNT_DEVICE_WORK=1`` in the environment (they have names of their own; without it every count is
    0).  ``reset``: start again from 0.  The CUDA emulation of the tests counts the same per call (docs/gpu.md)."""
    if variant.device != "cuda":
        raise ValueError(f"device_counts: {variant.symbol} is a {variant.device} variant, not a CUDA one")
    fn = open_library(variant).ptn_device_counts
    fn.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.c_int]
    fn.restype = None
    out = (ctypes.c_longlong * 4)()
    fn(out, int(reset))
    return dict(zip(("launches", "allocs", "h2d", "d2h"), (int(v) for v in out)))
