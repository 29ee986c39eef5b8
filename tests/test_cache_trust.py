"""The kernel cache trusts nothing it did not write itself (issue 14, items 1-3).

Every case runs in its own temporary cache (``PTNATIVE_CACHE_DIR=tmp_path/...``, never the user's cache nor the
shared test cache), and every case that loads a tampered library does so in a child process, so that a crash
(SIGBUS in ``dlopen``, foreign code) is a failed test rather than a dead test run.  Those children are forked from
one server process per module that has imported NumPy, PyTensor and ptnative and done nothing else
(tests/forkserver.py), so that each case pays for its build, not for Python's start-up.  The op is the README's tiny
``Double``, so a build takes about a second.
"""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ptnative
from ptnative import build, cache
from ptnative.cache import RECORD_SUFFIX, CacheError, UntrustedLibraryWarning

from ._ops_for_tests import double_spec
from .forkserver import ForkServer

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")

DOUBLE = double_spec()
X = [1.5, -2.0, 3.25, 0.0]
EXPECTED = [3.0, -4.0, 6.5, 0.0]

# The child: compile a function of Double in ``mode`` and print its result on the last line; every warning is
# shown (one line each) so that the parent can count them.
CHILD = textwrap.dedent("""
    import json, os, sys, warnings
    warnings.simplefilter("always")
    warnings.formatwarning = lambda m, c, *a, **k: f"WARNING {c.__name__}: {m}\\n"
    import numpy as np, pytensor, pytensor.tensor as pt
    import ptnative
    from ptnative import build
    spec, mode = json.loads(sys.argv[1]), sys.argv[2]
    if os.environ.get("PTN_TEST_LOG"):
        import logging
        logging.basicConfig(level=logging.INFO, format="LOG %%(name)s: %%(message)s")
    swap_to = os.environ.get("PTN_TEST_SWAP_AFTER_CHECK")
    if swap_to:  # replace the library by a link to foreign code between its check and its load
        checked_dlopen = build.dlopen_fd
        def racing_dlopen(fd, path):
            os.unlink(path)
            os.symlink(swap_to, path)
            return checked_dlopen(fd, path)
        build.dlopen_fd = racing_dlopen
    op = ptnative.NativeOp(**spec)
    x = pt.vector("x", dtype="float64")
    f = pytensor.function([x], op(x), mode=None if mode == "default" else mode)
    print(json.dumps(f(np.array(%r)).tolist()))
""" % (X,))

FOREIGN_C = r"""
#include <stdio.h>
#include <stdlib.h>
/* Stands for anyone else's library: its constructor runs as soon as it is loaded. */
__attribute__((constructor)) static void planted(void) {
  const char* path = getenv("PTN_TEST_MARKER");
  FILE* f = path ? fopen(path, "w") : NULL;
  if (f) { fputs("foreign code ran\n", f); fclose(f); }
}
"""


def child_env(**extra):
    """This environment (a child imports ``tests`` and the same ptnative, tests/conftest.py) with ``extra`` set."""
    return dict(os.environ, **extra)


def spec_json(**changes):
    spec = dict(DOUBLE, **changes)
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()})


_SERVER = []


def forks():
    """This module's fork server (tests/forkserver.py): NumPy, PyTensor and ptnative imported once; each child
    forked from it has built and loaded nothing, and gets its own environment (ptnative reads its variables at
    each use, never at import)."""
    if not _SERVER:
        _SERVER.append(ForkServer(["numpy", "pytensor", "pytensor.tensor", "ptnative"], env=child_env()))
    return _SERVER[0]


@pytest.fixture(scope="module", autouse=True)
def _close_fork_server():
    yield
    while _SERVER:
        _SERVER.pop().close()


def run_child(cache_dir, tmp_path, mode="FAST_COMPILE", env=None, spec=None):
    """Run CHILD with ``cache_dir`` in a child of the fork server (a new process, as ``python -c CHILD``); return
    (returncode, stdout, stderr, warnings lines, marker written?)."""
    marker = tmp_path / "foreign-code-ran"
    full_env = child_env(PTNATIVE_CACHE_DIR=str(cache_dir), PTN_TEST_MARKER=str(marker), **(env or {}))
    out = forks().run(CHILD, [spec or spec_json(), mode], env=full_env, cwd=tmp_path, timeout=600)
    if out.returncode < 0:
        pytest.fail(f"the child process died of {signal.Signals(-out.returncode).name}:\n{out.stderr[-3000:]}")
    warned = [line for line in out.stderr.splitlines() if line.startswith("WARNING UntrustedLibraryWarning")]
    return out.returncode, out.stdout, out.stderr, warned, marker.exists()


def assert_correct(stdout):
    np.testing.assert_array_equal(json.loads(stdout.strip().splitlines()[-1]), EXPECTED)


def double_variant():
    return ptnative.NativeOp(**DOUBLE).variant("float64")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cache holding a good Double library and its record, built once for the module."""
    path = tmp_path_factory.mktemp("pristine") / "cache"
    old = os.environ.get("PTNATIVE_CACHE_DIR")
    os.environ["PTNATIVE_CACHE_DIR"] = str(path)
    try:
        lib = build.build(double_variant())
    finally:
        if old is None:
            del os.environ["PTNATIVE_CACHE_DIR"]
        else:
            os.environ["PTNATIVE_CACHE_DIR"] = old
    return path, lib.name


@pytest.fixture
def cached(pristine, tmp_path, monkeypatch):
    """A private copy of the pristine cache, set as this process's cache; yields the library's path."""
    src, name = pristine
    dst = tmp_path / "cache"
    shutil.copytree(src, dst)
    os.chmod(dst, 0o700)
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(dst))
    return dst / name


@pytest.fixture(scope="module")
def foreign_lib(tmp_path_factory):
    """A shared library that writes a marker file when loaded."""
    d = tmp_path_factory.mktemp("foreign")
    (d / "foreign.c").write_text(FOREIGN_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "foreign.so"), str(d / "foreign.c")], check=True)
    return d / "foreign.so"


def write_record(lib: Path, data: bytes):
    """A forged record: well formed and matching ``data``, as a user of the same account could write it."""
    import hashlib

    record = {"format": 1, "library": lib.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    Path(str(lib) + RECORD_SUFFIX).write_text(json.dumps(record))


def assert_trusted_again(lib: Path):
    """The cache holds a checked library again (never dlopen-ed here: the checks alone)."""
    st = os.lstat(lib)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
    with cache.Directory(lib.parent) as d:
        os.close(cache.open_verified(d, lib.name))


def test_foreign_library_marker_works(foreign_lib, tmp_path):
    """The marker used below does appear when the foreign library is loaded (so its absence means something)."""
    marker = tmp_path / "marker"
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(foreign_lib)!r})"], check=True,
                   env=dict(os.environ, PTN_TEST_MARKER=str(marker)))
    assert marker.read_text() == "foreign code ran\n"


def test_truncated_library_really_crashes_dlopen(cached, tmp_path):
    """The hazard of issue 14 item 2: a half-written library loaded as is kills the process with SIGBUS (here a
    child of the fork server, which reports it as run_child's children's crashes are reported, and serves on)."""
    cut = tmp_path / "cut.so"
    data = cached.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    out = forks().run(f"import ctypes; ctypes.CDLL({str(cut)!r})", env=child_env(), cwd=tmp_path)
    assert out.returncode == -signal.SIGBUS
    assert forks().run("print(6 * 7)", env=child_env()).stdout == "42\n"


# Each tampering: (what to do to the cache, the reason the warning must give).
def _symlink_to_foreign(lib, foreign):
    lib.unlink()
    lib.symlink_to(foreign)


def _symlink_to_foreign_with_forged_record(lib, foreign):
    _symlink_to_foreign(lib, foreign)
    write_record(lib, foreign.read_bytes())


def _truncate(lib, foreign):
    data = lib.read_bytes()
    lib.write_bytes(data[:len(data) // 2])


def _truncate_with_forged_record(lib, foreign):
    _truncate(lib, foreign)
    write_record(lib, lib.read_bytes())


def _garbage(lib, foreign):
    lib.write_bytes(np.random.default_rng(0).bytes(lib.stat().st_size))


def _garbage_with_forged_record(lib, foreign):
    _garbage(lib, foreign)
    write_record(lib, lib.read_bytes())


def _replaced_by_copy_of_foreign(lib, foreign):
    lib.write_bytes(foreign.read_bytes())


def _no_record(lib, foreign):
    Path(str(lib) + RECORD_SUFFIX).unlink()


def _record_symlink(lib, foreign):
    rec = Path(str(lib) + RECORD_SUFFIX)
    good = lib.parent.parent / "record-elsewhere"
    shutil.copy(rec, good)
    rec.unlink()
    rec.symlink_to(good)


def _record_not_json(lib, foreign):
    Path(str(lib) + RECORD_SUFFIX).write_text("sha256 of everything: fine\n")


def _record_names_another_library(lib, foreign):
    rec = Path(str(lib) + RECORD_SUFFIX)
    record = json.loads(rec.read_text())
    rec.write_text(json.dumps(dict(record, library="ptn_Other_0-cpu-0.so")))


def _record_wrong_hash(lib, foreign):
    rec = Path(str(lib) + RECORD_SUFFIX)
    record = json.loads(rec.read_text())
    rec.write_text(json.dumps(dict(record, sha256="0" * 64)))


def _group_writable(lib, foreign):
    os.chmod(lib, 0o664)


def _world_writable_record(lib, foreign):
    os.chmod(str(lib) + RECORD_SUFFIX, 0o666)


def _fifo(lib, foreign):
    lib.unlink()
    os.mkfifo(lib, 0o600)


def _directory(lib, foreign):
    lib.unlink()
    lib.mkdir(mode=0o700)


def _foreign_owner(lib, foreign):
    os.chown(lib, NOBODY, NOBODY)


def _foreign_owner_record(lib, foreign):
    os.chown(str(lib) + RECORD_SUFFIX, NOBODY, NOBODY)


def _unloadable_with_forged_record(lib, foreign):
    # A complete ELF shared library that dlopen refuses (an undefined symbol, resolved at load time).
    src = lib.parent.parent / "unloadable.c"
    src.write_text("extern int ptn_test_no_such_symbol;\nint* ptn_test_ref = &ptn_test_no_such_symbol;\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    os.chmod(lib, 0o600)
    write_record(lib, lib.read_bytes())


TAMPERINGS = [
    pytest.param(_symlink_to_foreign, "is a symbolic link", id="symlink to foreign library"),
    pytest.param(_symlink_to_foreign_with_forged_record, "is a symbolic link",
                 id="symlink to foreign library, forged record"),
    pytest.param(_truncate, r"has \d+ bytes but its integrity record says \d+", id="truncated"),
    pytest.param(_truncate_with_forged_record, "is truncated", id="truncated, forged record"),
    pytest.param(_garbage, "does not match the SHA-256", id="garbage"),
    pytest.param(_garbage_with_forged_record, "is not an ELF shared library", id="garbage, forged record"),
    pytest.param(_replaced_by_copy_of_foreign, r"has \d+ bytes but|does not match the SHA-256",
                 id="foreign library copied in"),
    pytest.param(_record_symlink, "has an integrity record that is a symbolic link", id="record is a symlink"),
    pytest.param(_record_not_json, "has a malformed integrity record", id="record not JSON"),
    pytest.param(_record_names_another_library, "has a malformed integrity record", id="record of another library"),
    pytest.param(_record_wrong_hash, "does not match the SHA-256", id="record with a wrong hash"),
    pytest.param(_group_writable, r"is writable by group or others \(mode 0664\)", id="group-writable library"),
    pytest.param(_world_writable_record, "integrity record that is writable by group or others",
                 id="world-writable record"),
    pytest.param(_fifo, "is not a regular file", id="FIFO in place of the library"),
    pytest.param(_directory, "is not a regular file", id="directory in place of the library"),
    pytest.param(_foreign_owner, f"is owned by uid {NOBODY}", id="library owned by nobody", marks=as_root),
    pytest.param(_foreign_owner_record, f"integrity record that is owned by uid {NOBODY}",
                 id="record owned by nobody", marks=as_root),
    pytest.param(_unloadable_with_forged_record, "passed its checks but cannot be loaded",
                 id="unloadable library, forged record"),
]


@pytest.mark.parametrize("tamper, reason", TAMPERINGS)
def test_tampered_library_is_rebuilt_never_loaded(tamper, reason, cached, foreign_lib, tmp_path):
    tamper(cached, foreign_lib)
    rc, stdout, stderr, warned, foreign_ran = run_child(cached.parent, tmp_path)
    assert rc == 0, stderr
    assert not foreign_ran
    assert_correct(stdout)
    assert len(warned) == 1, stderr
    assert str(cached) in warned[0] and "it was not loaded and is being rebuilt" in warned[0]
    assert re.search(reason, warned[0]), warned[0]
    assert_trusted_again(cached)


def test_rebuilt_library_is_used_as_is_by_the_next_process(cached, foreign_lib, tmp_path):
    _symlink_to_foreign(cached, foreign_lib)
    rc, stdout, stderr, warned, _ = run_child(cached.parent, tmp_path)
    assert rc == 0 and len(warned) == 1, stderr
    mtime = cached.stat().st_mtime_ns
    rc, stdout, stderr, warned, foreign_ran = run_child(cached.parent, tmp_path)
    assert (rc, warned, foreign_ran) == (0, [], False), stderr
    assert_correct(stdout)
    assert cached.stat().st_mtime_ns == mtime


def test_library_without_record_is_rebuilt_quietly(cached, tmp_path):
    """As after an upgrade from a ptnative that wrote no records, or an interrupted build: not loaded, rebuilt
    without a warning (it is no sign of tampering)."""
    _no_record(cached, None)
    rc, stdout, stderr, warned, _ = run_child(cached.parent, tmp_path, env={"PTN_TEST_LOG": "1"})
    assert rc == 0, stderr
    assert_correct(stdout)
    assert warned == [] and re.search(r"rebuilding .*\.so: it has no integrity record", stderr), stderr
    assert_trusted_again(cached)


def test_non_empty_directory_in_place_of_the_library_is_refused(cached, tmp_path):
    cached.unlink()
    cached.mkdir(mode=0o700)
    (cached / "keep").write_text("not ours to delete")
    with pytest.warns(UntrustedLibraryWarning, match="is not a regular file"):
        with pytest.raises(CacheError, match=r"cannot remove the untrusted .*\.so: .*Remove it by hand"):
            build.build(double_variant())
    assert (cached / "keep").read_text() == "not ours to delete"


def test_check_and_load_see_the_same_file(cached, foreign_lib, tmp_path):
    """The path is swapped for a link to foreign code after the library was checked and before it is loaded:
    what gets loaded is still the checked file (loaded through its open descriptor)."""
    rc, stdout, stderr, warned, foreign_ran = run_child(cached.parent, tmp_path,
                                                        env={"PTN_TEST_SWAP_AFTER_CHECK": str(foreign_lib)})
    assert rc == 0, stderr
    assert not foreign_ran
    assert_correct(stdout)
    assert warned == [] and cached.is_symlink()  # the swap did happen


@pytest.mark.parametrize("mode", ["default", "C"])
def test_other_modes_load_through_the_checks(mode, cached, foreign_lib, tmp_path):
    _symlink_to_foreign(cached, foreign_lib)
    rc, stdout, stderr, warned, foreign_ran = run_child(cached.parent, tmp_path, mode=mode)
    assert rc == 0, stderr
    assert not foreign_ran
    assert_correct(stdout)
    assert len(warned) == 1 and "is a symbolic link" in warned[0], stderr
    assert_trusted_again(cached)


def test_jax_mode_loads_through_the_checks(cached, foreign_lib, tmp_path):
    """JAX mode loads its own library (the XLA FFI handler): built on the first run, replaced by links to foreign
    code, rebuilt (never loaded) on the second."""
    pytest.importorskip("jax")
    rc, stdout, stderr, warned, _ = run_child(cached.parent, tmp_path, mode="JAX")
    assert rc == 0, stderr
    assert_correct(stdout)
    libs = sorted(cached.parent.glob("*.so"))
    assert any(lib != cached for lib in libs), "JAX mode built no library of its own"
    for lib in libs:
        _symlink_to_foreign(lib, foreign_lib)
    rc, stdout, stderr, warned, foreign_ran = run_child(cached.parent, tmp_path, mode="JAX")
    assert rc == 0, stderr
    assert not foreign_ran
    assert_correct(stdout)
    assert warned and all("is a symbolic link" in w for w in warned), stderr
    for lib in libs:
        if not lib.is_symlink():
            assert_trusted_again(lib)
    assert any(not lib.is_symlink() and lib != cached for lib in libs)


def test_concurrent_processes_build_once_and_agree(tmp_path):
    """Three processes start on an empty cache at once: one compiles, all load the same checked library."""
    cache_dir = tmp_path / "cache"
    marker = tmp_path / "foreign-code-ran"
    env = child_env(PTNATIVE_CACHE_DIR=str(cache_dir), PTN_TEST_MARKER=str(marker))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, spec_json(), "FAST_COMPILE"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path) for _ in range(3)]
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr
        assert "UntrustedLibraryWarning" not in stderr
        assert_correct(stdout)
    libs = list(cache_dir.glob("*.so"))  # the op's, and the OpenBLAS pool's that its load installs
    assert len([lib for lib in libs if not lib.name.startswith("ptn_blas_threads_")]) == 1
    for lib in libs:
        assert_trusted_again(lib)
    assert not list(cache_dir.glob(".*")), "temporary files or build directories were left behind"


def test_library_is_hashed_once_per_process(cached, monkeypatch):
    calls = []
    real = cache._sha256_of_fd
    monkeypatch.setattr(cache, "_sha256_of_fd", lambda fd: calls.append(fd) or real(fd))
    variant = double_variant()
    for _ in range(3):
        assert build.build(variant) == cached
    assert len(calls) == 1
    lib = build.open_library(variant)
    assert build.open_library(variant) is lib and len(calls) == 1
    assert lib._name.startswith("/proc/self/fd/")
    # A changed file (new inode or ctime) is checked again, and a bad one is not accepted from the memo.
    data = cached.read_bytes()
    changed = cached.with_name("changed")
    changed.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # a new file: the loaded one stays intact
    os.chmod(changed, 0o600)
    os.replace(changed, cached)
    with pytest.warns(UntrustedLibraryWarning, match="does not match the SHA-256"):
        build.build(variant)
    assert len(calls) == 4  # the changed file (before and under the build lock), then the rebuilt one


def test_open_cached_refuses_what_it_cannot_rebuild(cached, foreign_lib):
    lib = build.open_cached(cached)
    assert lib._name.startswith("/proc/self/fd/") and hasattr(lib, double_variant().symbol)
    other = cached.parent / ("ptn_Other_0-cpu-0" + ".so")
    other.symlink_to(foreign_lib)
    with pytest.raises(CacheError, match=r"ptn_Other_0-cpu-0\.so is a symbolic link; it was not loaded"):
        build.open_cached(other)
    shutil.copy(foreign_lib, cached.parent / "ptn_Other_1-cpu-0.so")
    with pytest.raises(CacheError, match="has no integrity record"):
        build.open_cached(cached.parent / "ptn_Other_1-cpu-0.so")


# The cache directory itself.
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_directory_writable_by_others_is_refused(mode, cached):
    os.chmod(cached.parent, mode)
    with pytest.raises(CacheError, match=rf"kernel cache {re.escape(str(cached.parent))} is writable by group or "
                                         rf"others \(mode 0{mode:o}\).*chmod go-w"):
        build.cache_dir()
    with pytest.raises(CacheError, match="is writable by group or others"):
        build.build(double_variant())
    with pytest.raises(CacheError, match="is writable by group or others"):
        build.open_cached(cached)


def test_symlinked_directory_is_refused(cached, tmp_path, monkeypatch):
    link = tmp_path / "link"
    link.symlink_to(cached.parent)
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(link))
    with pytest.raises(CacheError, match=rf"kernel cache {re.escape(str(link))} is a symbolic link.*mkdir -m 700"):
        build.build(double_variant())
    with pytest.raises(CacheError, match="is a symbolic link"):
        build.open_cached(link / cached.name)


@as_root
def test_directory_of_another_user_is_refused(cached):
    os.chown(cached.parent, NOBODY, NOBODY)
    with pytest.raises(CacheError, match=rf"is owned by uid {NOBODY}.*not by you.*PTNATIVE_CACHE_DIR"):
        build.build(double_variant())


# The owner checks from a process that is not root: root made the files above, so those tests prove only that root
# refuses another user's files.  Here a child runs as ``nobody`` on a cache that nobody owns, with one entry handed
# to root: it must trust its own files (an owner check that compared with uid 0 would refuse them) and refuse
# root's (uid 0 is not this user).
NON_ROOT_CHILD = textwrap.dedent("""
    import json, os, pwd, sys
    from pathlib import Path
    from ptnative import build, cache
    # Python itself may lie where only root may enter (/root/.pyenv here): the child starts as root, imports what
    # it needs, then becomes nobody for good before any check runs.
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    d, name = Path(sys.argv[1]), sys.argv[2]
    out = {"euid": os.geteuid(), "uid": os.getuid()}
    try:
        out["dir"] = str(build.cache_dir())
    except Exception as e:
        out["dir"] = f"{type(e).__name__}: {e}"
    try:
        with cache.Directory(d) as directory:
            os.close(cache.open_verified(directory, name))
        out["library"] = "trusted"
    except Exception as e:
        out["library"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
""").replace("NOBODY", str(NOBODY))


@pytest.fixture
def nobodys_cache(pristine):
    """A copy of the pristine cache in a directory of nobody's (mode 0700, every file nobody's); yields the
    library's path."""
    src, name = pristine
    base = Path(tempfile.mkdtemp(prefix="ptn-nobody-"))  # not under tmp_path, whose parents only root may enter
    try:
        shutil.copytree(src, base / "cache")
        for p in [base, *base.rglob("*")]:
            os.chown(p, NOBODY, NOBODY)
        os.chmod(base / "cache", 0o700)
        yield base / "cache" / name
    finally:
        shutil.rmtree(base)


def _root_owns(path):
    """Root's now, and readable by all (a file of someone else's that one can read is what the check is for)."""
    os.chown(path, 0, 0)
    os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)


@as_root
@pytest.mark.parametrize("change, dir_problem, library_problem", [
    (None, None, None),
    (lambda lib: _root_owns(lib), None, r"^Untrusted: is owned by uid 0 \(root\), not by you$"),
    (lambda lib: _root_owns(str(lib) + RECORD_SUFFIX), None,
     r"^Untrusted: has an integrity record that is owned by uid 0 \(root\), not by you$"),
    (lambda lib: _root_owns(lib.parent), r"kernel cache .* is owned by uid 0 \(root\), not by you \(uid 65534",
     r"kernel cache .* is owned by uid 0 \(root\), not by you \(uid 65534"),
], ids=["all nobody's", "library root's", "record root's", "directory root's"])
def test_owner_checks_in_a_process_that_is_not_root(change, dir_problem, library_problem, nobodys_cache):
    lib = nobodys_cache
    if change:
        change(lib)
    env = child_env(PTNATIVE_CACHE_DIR=str(lib.parent), HOME=str(lib.parent.parent))
    out = subprocess.run([sys.executable, "-c", NON_ROOT_CHILD, str(lib.parent), lib.name], env=env,
                         cwd=lib.parent.parent, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["euid"] == got["uid"] == NOBODY
    if dir_problem is None:
        assert got["dir"] == str(lib.parent), got["dir"]
    else:
        assert re.search(dir_problem, got["dir"]) and got["dir"].startswith("CacheError: "), got["dir"]
    if library_problem is None:
        assert got["library"] == "trusted", got["library"]
    else:
        assert re.search(library_problem, got["library"]), got["library"]


def test_file_in_place_of_directory_is_refused(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(tmp_path / "f"))
    with pytest.raises(CacheError, match="is not a directory"):
        build.cache_dir()


def test_default_directory_and_its_parent(tmp_path, monkeypatch):
    """``$XDG_CACHE_HOME/ptnative/<system>-<machine>-py<XY>``: made private; a parent others can write is refused."""
    monkeypatch.delenv("PTNATIVE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = build.cache_dir()
    tag = f"linux-{os.uname().machine}-py{sys.version_info[0]}{sys.version_info[1]}"
    assert path == tmp_path / "xdg" / "ptnative" / tag
    assert stat.S_IMODE(path.stat().st_mode) == 0o700 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    os.chmod(path.parent, 0o777)
    with pytest.raises(CacheError, match=rf"parent directory {re.escape(str(path.parent))} is writable by group"):
        build.cache_dir()


# Compilers that fail quietly: nothing is installed.
def _wrapper(tmp_path, body):
    script = tmp_path / "cxx"
    script.write_text("#!/bin/sh\nfor a; do out=$a_next; a_next=; [ \"$a\" = -o ] && a_next=1; "
                      "[ -n \"$out\" ] && OUT=$a; done\n" + body)
    os.chmod(script, 0o755)
    return str(script)


@pytest.mark.parametrize("cxx, message", [
    pytest.param("/bin/true", "the compiler exited with status 0 but wrote no library", id="/bin/true"),
    pytest.param("empty", "the compiler exited with status 0 but its output is empty", id="empty output"),
    pytest.param("garbage", "the compiler exited with status 0 but its output is not an ELF shared library",
                 id="garbage output"),
    pytest.param("object", r"the compiler exited with status 0 but its output is not an ELF shared library "
                           r"\(ELF type 1\)", id="object file output"),
    pytest.param("symlink", "the compiler's output is a symbolic link", id="output is a symlink"),
    pytest.param("silent failure", r"the compiler exited with status 3\.(?s:.*)\(the compiler printed nothing\)",
                 id="silent failure"),
])
def test_compiler_without_a_library_is_a_compile_error(cxx, message, tmp_path, monkeypatch, foreign_lib):
    bodies = {
        "empty": ': > "$OUT"\n',
        "garbage": 'printf "not a library" > "$OUT"\n',
        "object": 'g++ -x c++ -c -fPIC -o "$OUT" - <<EOF\nint f() { return 1; }\nEOF\n',
        "symlink": f'ln -s {foreign_lib} "$OUT"\n',
        "silent failure": "exit 3\n",
    }
    if cxx != "/bin/true":
        cxx = _wrapper(tmp_path, bodies[cxx])
    monkeypatch.setenv("PTNATIVE_CXX", cxx)
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(cache_dir))
    with pytest.raises(build.CompileError, match=rf"compiling ptn_Double_\w+ \(cpu\) failed: {message}"):
        build.build(double_variant())
    with pytest.raises(build.CompileError, match=rf"Nothing was installed in the cache\.\nsource: .*\ncommand: "
                                                 rf"{re.escape(cxx)} .* -o .*out\.so"):
        build.build(double_variant())
    assert not list(cache_dir.glob("*.so")) and not list(cache_dir.glob("*" + RECORD_SUFFIX))
    assert not list(cache_dir.glob(".*")), "temporary files or build directories were left behind"


def _flaky_compiler(tmp_path, times_bad):
    """g++, whose first ``times_bad`` libraries reference a symbol that does not exist (dlopen fails on them)."""
    extra = tmp_path / "unresolved.cpp"
    extra.write_text('extern "C" int ptn_test_no_such_symbol;\nint* ptn_test_ref = &ptn_test_no_such_symbol;\n')
    count = tmp_path / "count"
    return _wrapper(tmp_path, f'if [ "$1" = --version ]; then exec g++ --version; fi\n'
                              f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n'
                              f'if [ "$n" -lt {times_bad} ]; then exec g++ "$@" {extra}; fi\nexec g++ "$@"\n')


def test_unloadable_build_is_rebuilt_once(tmp_path):
    cxx = _flaky_compiler(tmp_path, times_bad=1)
    rc, stdout, stderr, warned, _ = run_child(tmp_path / "cache", tmp_path, env={"PTNATIVE_CXX": cxx})
    assert rc == 0, stderr
    assert_correct(stdout)
    assert len(warned) == 1 and "passed its checks but cannot be loaded" in warned[0]
    assert "undefined symbol" in warned[0]


def test_build_that_never_loads_is_a_clear_error(tmp_path):
    cxx = _flaky_compiler(tmp_path, times_bad=100)
    rc, stdout, stderr, warned, _ = run_child(tmp_path / "cache", tmp_path, env={"PTNATIVE_CXX": cxx})
    assert rc == 1
    assert len(warned) == 1
    assert re.search(r"CompileError: compiling ptn_Double_\w+ \(cpu\) gives a library that cannot be loaded, even "
                     r"after a rebuild: .*undefined symbol", stderr), stderr


def test_info_reports_the_cache_and_its_checks(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    bad.mkdir(mode=0o777)
    os.chmod(bad, 0o777)
    for path, expected in ((good, "passes the checks (private"), (bad, "FAILS THE CHECKS: ptnative's kernel cache")):
        out = subprocess.run([sys.executable, "-m", "ptnative", "info"], capture_output=True, text=True, timeout=300,
                             env=child_env(PTNATIVE_CACHE_DIR=str(path)))
        assert out.returncode == 0, out.stderr
        row = [line for line in out.stdout.splitlines() if line.startswith("kernel cache")]
        assert len(row) == 1 and str(path) in row[0] and expected in row[0], out.stdout


TRUNCATION_CHILD = textwrap.dedent("""
    import json, os, sys, hashlib
    from pathlib import Path
    from ptnative import cache
    data, work, cases = Path(sys.argv[1]).read_bytes(), Path(sys.argv[2]), json.loads(sys.argv[3])
    results = []
    with cache.Directory(work) as d:
        for k, (strip, cut) in enumerate(cases):
            blob = bytearray(data)
            if strip:  # no section headers (e_shoff, e_shnum, e_shstrndx = 0): only the segments matter
                blob[0x28:0x30] = bytes(8)
                blob[0x3C:0x40] = bytes(4)
            blob = bytes(blob[:cut])
            name = f"cut{k}.so"
            (work / name).write_bytes(blob)
            os.chmod(work / name, 0o600)
            record = {"format": 1, "library": name, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
            (work / (name + ".integrity")).write_text(json.dumps(record))
            try:
                fd = cache.open_verified(d, name)
            except cache.Untrusted as e:
                results.append("rejected")
                continue
            try:
                cache.dlopen_fd(fd, work / name)
                results.append("loaded")
            except OSError:
                results.append("load error")
    print(json.dumps(results))
""")


def test_no_truncation_reaches_dlopen(cached, tmp_path):
    """Fuzz: the library cut at ~200 places (a grid, and one byte either side of every segment's end), with and
    without section headers, each with a forged matching record, in one child process: the checks reject every
    cut that leaves a loadable segment incomplete (any of them would SIGBUS in dlopen), and load the rest."""
    import struct

    data = cached.read_bytes()
    assert data[:5] == b"\x7fELF\x02"  # 64-bit ELF, as on every platform ptnative builds for
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segments = [struct.unpack_from("<I4xQ16xQ", data, phoff + k * phentsize) for k in range(phnum)]
    load_end = max(off + size for kind, off, size in segments if kind == 1)
    ends = sorted({off + size for _, off, size in segments} | {load_end, len(data)})
    cuts = sorted({c for e in ends for c in (e - 1, e, e + 1) if 0 < c <= len(data)} |
                  set(range(1, len(data), max(1, len(data) // 100))))
    cases = [(strip, c) for strip in (False, True) for c in cuts]
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    out = subprocess.run([sys.executable, "-c", TRUNCATION_CHILD, str(cached), str(work), json.dumps(cases)],
                         capture_output=True, text=True, timeout=600, env=child_env())
    if out.returncode < 0:
        pytest.fail(f"a truncated library crashed the child: {signal.Signals(-out.returncode).name}\n{out.stderr}")
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(cases) >= 200
    for (strip, cut), result in zip(cases, results):
        complete = cut == len(data) or (strip and cut >= load_end)
        assert result == ("loaded" if complete else "rejected"), (strip, cut, len(data), load_end, result)


def test_swapping_the_cache_directory_during_a_build_changes_nothing(tmp_path):
    """The attack on a cache whose parent others can write: the directory is renamed and replaced by the
    attacker's (with a planted source) after ptnative checked it, and put back before the compiler writes its
    output.  The compiler reads and writes through the checked directory (``/proc/<pid>/fd/<fd>``), so the
    planted source is never compiled."""
    cache_dir = tmp_path / "cache"
    planted = tmp_path / "planted.cpp"
    planted.write_text(FOREIGN_C)
    cxx = _wrapper(tmp_path, textwrap.dedent(f"""\
        [ "$1" = --version ] && exec g++ --version
        for a; do case "$a" in *.cpp) SRC=$a;; esac; done
        C={cache_dir}; B=$(basename "$(dirname "$OUT")")
        mv "$C" "$C.real" && mkdir -m 700 "$C" "$C/$B" && cp {planted} "$C/$(basename "$SRC")"
        g++ "$@"; rc=$?
        [ -e "$C/$B/out.so" ] && cp "$C/$B/out.so" "$C.real/$B/out.so"
        rm -rf "$C" && mv "$C.real" "$C"
        exit $rc
        """))
    rc, stdout, stderr, warned, foreign_ran = run_child(cache_dir, tmp_path, env={"PTNATIVE_CXX": cxx})
    assert not foreign_ran
    assert rc == 0, stderr
    assert_correct(stdout)
    assert warned == []
    assert "planted" not in (cache_dir / next(cache_dir.glob("*.so")).name.replace(".so", ".cpp")).read_text()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.binary(min_size=0, max_size=200), size=st.integers(0, 1 << 40))
def test_elf_check_never_raises(header, size, tmp_path):
    """Any file that starts with the ELF magic (and any size it claims to have) gets an answer, not an exception."""
    path = tmp_path / "probe"
    path.write_bytes(b"\x7fELF" + header)
    fd = os.open(path, os.O_RDONLY)
    try:
        problem = cache.elf_problem(fd, size)
        assert problem is None or isinstance(problem, str)
    finally:
        os.close(fd)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=5), max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()),
                        st.fixed_dictionaries({"format": json_values, "library": json_values, "size": json_values,
                                               "sha256": json_values}).map(lambda v: json.dumps(v).encode())))
def test_malformed_records_are_refused(record, tmp_path):
    """Whatever the record holds, it is accepted only if well formed, and then only if it names this library."""
    directory = tmp_path / "records"
    directory.mkdir(mode=0o700, exist_ok=True)
    (directory / ("lib.so" + RECORD_SUFFIX)).write_bytes(record)
    with cache.Directory(directory) as d:
        try:
            parsed = d.read_record("lib.so")
        except cache.Untrusted as e:
            assert "integrity record" in str(e)
        else:
            assert parsed["format"] == 1 and parsed["library"] == "lib.so" and type(parsed["size"]) is int
