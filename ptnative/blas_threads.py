"""One worker pool for the process's OpenBLAS libraries and ptnative's kernels: ``c_code/runtime/blas_threads.cc``,
installed as the OpenBLAS libraries' threads callback (``openblas_set_threads_callback_function``, OpenBLAS >=
0.3.27) and handed to every kernel library for its parallel parts (:func:`parts_runner`).

numpy and scipy each bundle an OpenBLAS with a worker pool of its own, and a PyTensor graph calls both (Python-mode
``Dot22`` through numpy, C-mode ``Gemm`` through scipy) between ptnative's threaded kernels.  After each parallel
call those workers spin for about 0.1 s waiting for the next one, and take a core from the kernels' threads: the
CTC training step of ``bench/train_ctc.py`` took 151-156 ms on 2 threads with them, 102-113 ms with this pool.
With the callback installed, every OpenBLAS's parallel work runs on the pool's workers, which spin for 50 us and
then sleep; OpenBLAS's own workers sleep after their last spin and are not woken again.

:func:`install` runs when ptnative loads its first CPU kernel library (:func:`ptnative.build.load`), and again at
each later load for OpenBLAS libraries loaded since.  ``PTNATIVE_BLAS_THREADS=openblas`` (read then) leaves
OpenBLAS's own workers in place.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import sys
import threading
from functools import cache

from .source import Variant, inline_includes, read_kernel_file

log = logging.getLogger("ptnative")

SOURCE_FILE = "runtime/blas_threads.cc"
RUN_SYMBOL = "ptn_blas_threads_run"
PARTS_SYMBOL = "ptn_parts_run"
#: The setting, and its values: ``ptnative`` (the default: the pool here) or ``openblas`` (OpenBLAS's own workers).
SETTING = "PTNATIVE_BLAS_THREADS"
CHOICES = ("ptnative", "openblas")
#: The callback setters of OpenBLAS builds: plain (a system OpenBLAS, scipy's 32-bit-integer build) and the
#: symbol-prefixed builds that numpy bundles (scipy-openblas64).
SETTERS = ("openblas_set_threads_callback_function", "scipy_openblas_set_threads_callback_function",
           "scipy_openblas_set_threads_callback_function64_")

_lock = threading.Lock()
_installed: dict[str, ctypes.CDLL] = {}  # OpenBLAS library path -> the library, with the callback set
_pool: ctypes.CDLL | None = None
_pool_failed = False  # the pool's library could not be built or loaded: not tried again in this process


def choice() -> str:
    """The value of ``PTNATIVE_BLAS_THREADS`` (default ``ptnative``); a ValueError names the setting otherwise."""
    value = os.environ.get(SETTING, "").strip().lower() or "ptnative"
    if value not in CHOICES:
        raise ValueError(f"ptnative: {SETTING} must be one of {CHOICES}, got {value!r}")
    return value


@cache
def pool_variant() -> Variant:
    """The pool's library as a CPU :class:`~ptnative.source.Variant` (built and cached like a kernel library)."""
    source = inline_includes(read_kernel_file(SOURCE_FILE), folder="runtime")
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return Variant(symbol=f"ptn_blas_threads_{digest}", source=source, device="cpu")


def _loaded_library_paths() -> list[str]:
    """Paths of the shared libraries loaded in this process (Linux: /proc/self/maps; macOS: dyld's image list)."""
    if sys.platform == "darwin":
        dyld = ctypes.CDLL(None)
        dyld._dyld_image_count.restype = ctypes.c_uint32
        dyld._dyld_get_image_name.restype = ctypes.c_char_p
        dyld._dyld_get_image_name.argtypes = [ctypes.c_uint32]
        names = (dyld._dyld_get_image_name(i) for i in range(dyld._dyld_image_count()))
        return sorted({n.decode(errors="replace") for n in names if n})
    try:
        with open("/proc/self/maps") as f:
            fields = [line.split(None, 5) for line in f]
    except OSError:
        return []
    return sorted({f[5].strip() for f in fields if len(f) == 6 and f[5].startswith("/")})


def _already_loaded(path: str) -> ctypes.CDLL | None:
    """The library ``path`` if this process has it loaded (``RTLD_NOLOAD``: nothing is read from disk, so a file
    put at that path since is never loaded), else None."""
    try:
        return ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1))
    except OSError:
        return None


def openblas_libraries() -> list[str]:
    """Paths of the loaded libraries whose file name says OpenBLAS and that export a threads-callback setter."""
    found = []
    for path in _loaded_library_paths():
        if "openblas" not in os.path.basename(path).lower():
            continue
        lib = _already_loaded(path)
        if lib is not None and any(hasattr(lib, name) for name in SETTERS):
            found.append(path)
    return found


def _set_callback(lib: ctypes.CDLL, address: int | None) -> None:
    setter = next(getattr(lib, name) for name in SETTERS if hasattr(lib, name))
    setter.argtypes = [ctypes.c_void_p]
    setter.restype = None
    setter(address)


def _open_pool(open_library) -> ctypes.CDLL | None:
    """The pool's library, built and loaded on first use; None where it cannot be (logged once, not tried again).
    Called with ``_lock`` held."""
    global _pool, _pool_failed
    if _pool is None and not _pool_failed:
        try:
            _pool = open_library(pool_variant())
        except Exception as e:  # no compiler, an untrusted cache...: OpenBLAS keeps its workers, parts their threads
            _pool_failed = True
            log.warning("ptnative: no shared worker pool (its library was not built: %s); OpenBLAS keeps its own "
                        "workers and the kernels start threads for each call", e)
    return _pool


def parts_runner(open_library) -> int | None:
    """The address of the pool's ``ptn_parts_run``, which a kernel library runs its parallel parts on (handed to it
    at load time, ``<symbol>_set_parts_pool``), or None where the pool's library cannot be built (the kernels then
    start threads for each call).  Whatever ``PTNATIVE_BLAS_THREADS`` says: that setting is OpenBLAS's."""
    with _lock:
        pool = _open_pool(open_library)
    return None if pool is None else ctypes.cast(getattr(pool, PARTS_SYMBOL), ctypes.c_void_p).value


def install(open_library) -> list[str]:
    """Set the pool as the threads callback of every loaded OpenBLAS that has none from us yet; returns the
    paths of all the OpenBLAS libraries that have it.  ``open_library(variant)`` builds (if needed), checks and
    loads a library (:func:`ptnative.build.open_library`).  Does nothing under ``PTNATIVE_BLAS_THREADS=openblas``,
    and where the pool's library cannot be built (logged once; not tried again): OpenBLAS keeps its own workers."""
    if choice() == "openblas":
        return []
    with _lock:
        todo = [p for p in openblas_libraries() if p not in _installed]
        if todo and _open_pool(open_library) is None:
            return list(_installed)
        for path in todo:
            lib = _already_loaded(path)
            if lib is None:  # unloaded since it was listed
                continue
            _set_callback(lib, ctypes.cast(getattr(_pool, RUN_SYMBOL), ctypes.c_void_p).value)
            _installed[path] = lib
        return list(_installed)


def uninstall() -> None:
    """Give every OpenBLAS with the pool its own workers back (the callback set to none)."""
    with _lock:
        for lib in _installed.values():
            _set_callback(lib, None)
        _installed.clear()


def status() -> dict:
    """For ``python -m ptnative info`` and tests: the setting, the OpenBLAS libraries using the pool, the pool's
    calls with more than one job so far and its workers (0 and 0 before the pool is loaded)."""
    calls = workers = 0
    if _pool is not None:
        _pool.ptn_blas_threads_calls.restype = ctypes.c_int64
        calls, workers = _pool.ptn_blas_threads_calls(), _pool.ptn_blas_threads_workers()
    return {"setting": choice(), "libraries": list(_installed), "calls": calls, "workers": workers}
