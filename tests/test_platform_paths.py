"""The code paths for what macOS lacks, each forced here on Linux (issue 30, item 5; docs/install.md,
"Platforms"): the load without ``/proc/self/fd`` (by path, under the cache's lock, the path compared with the
checked file before and after ``dlopen``), the Mach-O counterpart of the ELF check (forged headers), and a BLAS
that is not OpenBLAS (Accelerate) or whose symbols cannot be found."""

import ctypes
import os
import shutil
import struct

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ptnative
from ptnative import blas, blas_threads, build, cache
from ptnative.cache import CacheError

from ._ops_for_tests import double_spec

DOUBLE = double_spec(kernel="twice_no_proc", name="DoubleNoProc")


# ---- no /proc/self/fd

@pytest.fixture
def no_proc(monkeypatch, tmp_path):
    """A fresh cache, and this process without /proc/self/fd as far as ptnative can tell."""
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "proc_fd_usable", lambda: False)
    return ptnative.NativeOp(**DOUBLE).variant("float64")


def test_without_proc_a_library_is_compiled_checked_and_loaded_by_its_path(no_proc, tmp_path):
    path = build.build(no_proc)
    with cache.Directory(path.parent) as d:
        assert d.child_path() == str(path.parent)  # the compiler got the plain path
    lib = build.open_library(no_proc)
    assert lib._name == str(path) and not hasattr(lib, "_ptnative_fd")
    x = pt.vector("x", dtype="float64")
    f = pytensor.function([x], ptnative.NativeOp(**DOUBLE)(x), mode="FAST_COMPILE")
    np.testing.assert_array_equal(f(np.array([1.5, -2.0])), [3.0, -4.0])


def _checked(path):
    d = cache.Directory(path.parent)
    return d, cache.open_verified(d, path.name)


def _not_loaded(path) -> bool:
    try:
        ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD)
    except OSError:
        return True
    return False


def test_without_proc_a_file_replaced_after_its_check_is_not_loaded(no_proc, tmp_path):
    built = build.build(no_proc)
    path = tmp_path / "work" / built.name
    path.parent.mkdir(mode=0o700)
    shutil.copyfile(built, path)
    shutil.copyfile(built.with_name(built.name + cache.RECORD_SUFFIX), path.with_name(path.name + ".integrity"))
    d, fd = _checked(path)
    with d:
        os.replace(shutil.copyfile(path, tmp_path / "other.so"), path)  # same bytes, another file
        with pytest.raises(CacheError, match="replaced after it was checked; it was not loaded"):
            cache.dlopen_fd(fd, path)
    assert _not_loaded(path)


def test_without_proc_a_file_replaced_during_dlopen_is_not_used(no_proc, tmp_path, monkeypatch):
    built = build.build(no_proc)
    path = tmp_path / "work" / built.name
    path.parent.mkdir(mode=0o700)
    shutil.copyfile(built, path)
    shutil.copyfile(built.with_name(built.name + cache.RECORD_SUFFIX), path.with_name(path.name + ".integrity"))
    real_cdll = ctypes.CDLL

    def racing_cdll(name, *a, **k):
        lib = real_cdll(name, *a, **k)
        os.replace(shutil.copyfile(path, tmp_path / "other.so"), path)  # swapped while dlopen ran
        return lib

    d, fd = _checked(path)
    with d:
        monkeypatch.setattr(cache.ctypes, "CDLL", racing_cdll)
        with pytest.raises(CacheError, match="replaced while it was being loaded; it is not used"):
            cache.dlopen_fd(fd, path)


# ---- Mach-O

CPU_ARM64, CPU_X86_64 = 0x0100000C, 0x01000007


def macho(*, magic=b"\xcf\xfa\xed\xfe", cputype=CPU_ARM64, filetype=6, segments=((0, 0x4000),), size=0x8000,
          cmdsize=72, ncmds=None):
    """A forged 64-bit Mach-O file: a header, one LC_SEGMENT_64 per (fileoff, filesize), zeros up to ``size``."""
    commands = b"".join(struct.pack("<II16sQQQQiiII", 0x19, cmdsize, b"__TEXT", 0, 0x4000, off, n, 5, 5, 0, 0)
                        for off, n in segments)
    header = magic + struct.pack("<iiIIIII", cputype, 0, filetype, len(segments) if ncmds is None else ncmds,
                                 len(commands), 0, 0)
    data = header + commands
    return data + bytes(max(0, size - len(data)))


@pytest.mark.parametrize("data, machine, expected", [
    (macho(), "arm64", None),
    (macho(cputype=CPU_X86_64), "x86_64", None),
    (macho(filetype=8), "arm64", None),  # a bundle, as some toolchains build loadable modules
    (macho(segments=((0, 0x4000), (0x4000, 0x4000))), "arm64", None),
    (macho(segments=((0, 0x4000), (0x4000, 0x4001))), "arm64", "a segment lies past the end"),
    (macho(size=0x3000), "arm64", "a segment lies past the end"),
    (macho(cputype=CPU_X86_64), "arm64", "for another CPU"),
    (macho(filetype=2), "arm64", "not a Mach-O dynamic library \\(file type 2\\)"),
    (macho(magic=b"\xca\xfe\xba\xbe"), "arm64", "universal \\(fat\\)"),
    (macho(magic=b"\xce\xfa\xed\xfe"), "arm64", "32-bit Mach-O"),
    (macho(cmdsize=4), "arm64", "bad size"),
    (macho(ncmds=3), "arm64", "overrun"),
    (macho(ncmds=0), "arm64", "load commands are missing"),
    (macho()[:20], "arm64", "header is incomplete"),
    (b"\x7fELF" + bytes(60), "arm64", "not a Mach-O dynamic library"),
])
def test_macho_check(tmp_path, data, machine, expected):
    path = tmp_path / "lib.dylib"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        problem = cache.macho_problem(fd, len(data), machine)
    finally:
        os.close(fd)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and __import__("re").search(expected, problem), problem


def test_the_check_follows_the_platform(no_proc, tmp_path):
    path = build.build(no_proc)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert cache.library_problem(fd, size, "Linux") is None
        assert cache.library_problem(fd, size, "Darwin") == "is not a Mach-O dynamic library"
    finally:
        os.close(fd)
    forged = tmp_path / "forged.dylib"
    forged.write_bytes(macho())
    fd = os.open(forged, os.O_RDONLY)
    try:
        assert cache.library_problem(fd, 0x8000, "Linux") == "is not an ELF shared library"
    finally:
        os.close(fd)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tail=st.binary(max_size=300), size=st.integers(0, 1 << 40))
def test_macho_check_never_raises(tail, size, tmp_path):
    path = tmp_path / "probe"
    path.write_bytes(b"\xcf\xfa\xed\xfe" + tail)
    fd = os.open(path, os.O_RDONLY)
    try:
        problem = cache.macho_problem(fd, size, "arm64")
        assert problem is None or isinstance(problem, str)
    finally:
        os.close(fd)


# ---- a BLAS that is not OpenBLAS

@pytest.fixture
def fresh_pool(monkeypatch):
    blas.thread_pool.cache_clear()
    yield
    blas.thread_pool.cache_clear()


def test_no_dladdr_means_threads_of_our_own(fresh_pool, monkeypatch):
    monkeypatch.setattr(blas, "_dladdr", lambda: None)
    assert blas.thread_pool() is None
    assert "threads of their own" in blas.describe()


def test_a_blas_without_the_openblas_pool_means_threads_of_our_own(fresh_pool, monkeypatch):
    """As with Accelerate: sgemm's library has no ``gotoblas_pthread``."""
    libm = ctypes.CDLL("libm.so.6")
    monkeypatch.setattr(blas, "gemm_addresses", lambda: (ctypes.cast(libm.cos, ctypes.c_void_p).value,) * 2)
    assert blas.thread_pool() is None


def test_an_unopenable_blas_library_means_threads_of_our_own(fresh_pool, monkeypatch):
    monkeypatch.setattr(blas, "_file_of", lambda address: "/no/such/libblas.dylib")
    assert blas.thread_pool() is None


def test_the_kernels_take_the_same_choice(monkeypatch):
    """The C side (``set_blas``) given a BLAS without OpenBLAS's pool, or none at all, runs parallel parts on
    ptnative's pool (a part's thread the same from call to call), or without that pool on threads started for each
    call (a part's thread differs from call to call)."""
    from .test_native_op import parts_op

    x, what = pt.vector(), pt.iscalar()
    op = parts_op()
    f = pytensor.function([x, what], op(x, what), mode="FAST_COMPILE")
    f(np.zeros(2), 10)
    lib = build.load(op.variant(pytensor.config.floatX))
    set_blas = getattr(lib.cdll, lib.variant.symbol + "_set_blas")
    libm = ctypes.CDLL("libm.so.6")
    cos = ctypes.cast(libm.cos, ctypes.c_void_p).value
    set_parts_pool = getattr(lib.cdll, lib.variant.symbol + "_set_parts_pool")
    set_parts_pool.argtypes = [ctypes.c_void_p]
    runner = blas_threads.parts_runner(build.open_library)
    try:
        for addresses in ((cos, cos), (None, None)):
            set_blas(*addresses)
            for pool in (runner, None):
                set_parts_pool(pool)
                np.testing.assert_array_equal(f(np.arange(3.0), 10), [1, 2, 3])
                first, second = f(np.zeros(2), 13), f(np.zeros(2), 13)
                assert (first[1] == second[1]) == (pool is not None)  # ptnative's worker, or a new thread each call
    finally:
        set_blas(*blas.gemm_addresses())
        set_parts_pool(runner)
