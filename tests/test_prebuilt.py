"""Prebuilt libraries shipped inside the package (ptnative/prebuilt.py, docs/install.md): used only under exactly
the cache's name (same source, compiler, flags, CPU), only if they pass their checks, copied into the kernel cache;
anything else compiles as before.

Each case has its own kernel cache and its own stand-in for the package's ``prebuilt`` folder, filled by building
the README's tiny ``Double`` op into a scratch cache (about a second).
"""

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import ptnative
from ptnative import build, prebuilt
from ptnative.cache import RECORD_SUFFIX, UntrustedLibraryWarning

from ._ops_for_tests import double_spec

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534

DOUBLE = double_spec(kernel="twice_prebuilt", name="DoublePrebuilt")  # a library apart from test_cache_trust's


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A folder holding Double's float64 library and its record, as the package would ship them."""
    base = tmp_path_factory.mktemp("shipped")
    source_cache = base / "source-cache"
    old = os.environ.get("PTNATIVE_CACHE_DIR")
    os.environ["PTNATIVE_CACHE_DIR"] = str(source_cache)
    try:
        path = build.build(ptnative.NativeOp(**DOUBLE).variant("float64"))
    finally:
        if old is None:
            del os.environ["PTNATIVE_CACHE_DIR"]
        else:
            os.environ["PTNATIVE_CACHE_DIR"] = old
    return path


@pytest.fixture
def setup(tmp_path, monkeypatch, shipped):
    """(variant, the stand-in prebuilt folder, the fresh cache, the list of compiled library names)."""
    folder = tmp_path / "prebuilt"
    folder.mkdir(mode=0o755)
    for name in (shipped.name, shipped.name + RECORD_SUFFIX):
        shutil.copyfile(shipped.parent / name, folder / name)
        os.chmod(folder / name, 0o644)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: folder)
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PTNATIVE_PREBUILT", raising=False)
    compiled = []
    real_compile = build._compile

    def counting_compile(variant, directory, path, *toolchain):
        compiled.append(path.name)
        real_compile(variant, directory, path, *toolchain)

    monkeypatch.setattr(build, "_compile", counting_compile)
    return ptnative.NativeOp(**DOUBLE).variant("float64"), folder, tmp_path / "cache", compiled


def build_quietly(variant):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntrustedLibraryWarning)
        return build.build(variant)


def test_a_matching_prebuilt_library_is_copied_into_the_cache_not_compiled(setup, shipped):
    variant, folder, cache, compiled = setup
    path = build_quietly(variant)
    assert compiled == []
    assert path == cache / shipped.name
    assert path.read_bytes() == (folder / shipped.name).read_bytes()
    assert (cache / (shipped.name + RECORD_SUFFIX)).is_file()
    assert os.stat(path).st_mode & 0o077 == 0  # the cache's own private copy
    x = pt.vector("x", dtype="float64")
    f = pytensor.function([x], ptnative.NativeOp(**DOUBLE)(x), mode="FAST_COMPILE")
    np.testing.assert_array_equal(f(np.array([1.5, -2.0, 0.0])), [3.0, -4.0, 0.0])
    assert compiled == []


def test_other_flags_give_another_name_and_a_compile(setup, monkeypatch):
    variant, _, _, compiled = setup
    monkeypatch.setattr(build, "CXX_FLAGS", [*build.CXX_FLAGS, "-DPTN_PREBUILT_TEST_FLAG=1"])
    build_quietly(variant)
    assert compiled == [build.library_path(variant).name]


def test_other_compiler_version_gives_another_name_and_a_compile(setup, monkeypatch):
    variant, _, _, compiled = setup
    real_version = build.compiler_version
    monkeypatch.setattr(build, "compiler_version", lambda cmd: real_version(cmd) + " (patched)")
    build_quietly(variant)
    assert len(compiled) == 1


def test_turned_off_by_environment(setup, monkeypatch):
    variant, _, _, compiled = setup
    monkeypatch.setenv("PTNATIVE_PREBUILT", "0")
    build_quietly(variant)
    assert len(compiled) == 1


def tamper_bytes(folder, name):
    data = bytearray((folder / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / name).write_bytes(bytes(data))


def tamper_record(folder, name):
    (folder / (name + RECORD_SUFFIX)).unlink()


def tamper_link(folder, name):
    os.rename(folder / name, folder / "elsewhere.so")
    os.symlink(folder / "elsewhere.so", folder / name)


def tamper_file_mode(folder, name):
    os.chmod(folder / name, 0o666)


def tamper_folder_mode(folder, name):
    os.chmod(folder, 0o777)


def tamper_owner(folder, name):
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(folder / name, NOBODY, NOBODY)


@pytest.mark.parametrize("tamper, reason", [
    (tamper_bytes, "does not match the SHA-256"),
    (tamper_record, "has no integrity record"),
    (tamper_link, "is a symbolic link"),
    (tamper_file_mode, "is writable by group or others"),
    (tamper_folder_mode, "is writable by group or others"),
    (tamper_owner, "is owned by uid 65534"),
])
def test_a_prebuilt_library_failing_a_check_is_not_used_but_compiled(setup, shipped, tamper, reason):
    variant, folder, _, compiled = setup
    tamper(folder, shipped.name)
    with pytest.warns(UntrustedLibraryWarning, match=rf"prebuilt library .*{reason}.*being compiled"):
        path = build.build(variant)
    assert compiled == [shipped.name] and path.is_file()


def test_a_missing_folder_compiles_without_warning(setup, monkeypatch, tmp_path):
    variant, _, _, compiled = setup
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: tmp_path / "no-such-folder")
    build_quietly(variant)
    assert len(compiled) == 1
    assert prebuilt.count() is None


def test_count(setup):
    assert prebuilt.count() == 1


def test_prebuild_without_a_compiler_installs_nothing_and_succeeds(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PTNATIVE_CXX=str(tmp_path / "no-such-compiler"))
    out = subprocess.run([sys.executable, "-m", "ptnative.prebuilt", str(tmp_path / "dest")], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "no C++ compiler" in out.stderr and "compile on first use" in out.stderr
    assert not (tmp_path / "dest").exists()


def test_prune_keeps_only_recorded_libraries(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o700)
    for name in ("a.so", "a.so" + RECORD_SUFFIX, "a.cpp", "a.so.lock", "b.so", "c.so" + RECORD_SUFFIX):
        (dest / name).write_text(name)
        os.chmod(dest / name, 0o600)
    (dest / ".x.build").mkdir()
    assert prebuilt._prune(dest) == 1
    assert sorted(os.listdir(dest)) == ["a.so", "a.so" + RECORD_SUFFIX]
    assert os.stat(dest / "a.so").st_mode & 0o777 == 0o644 and os.stat(dest).st_mode & 0o777 == 0o755


# ---- Compiler flags (PTNATIVE_CXXFLAGS) and a portable package (toolchain.json, `make wheel`)

PORTABLE = "-march=x86-64-v2" if build.platform.machine() == "x86_64" else "-march=armv8-a"


def test_user_flags_never_load_a_prebuilt_library_built_with_others(setup):
    variant, _, _, compiled = setup
    shipped_name = build.library_path(variant).name
    os.environ["PTNATIVE_CXXFLAGS"] = PORTABLE
    try:
        path = build_quietly(variant)
    finally:
        del os.environ["PTNATIVE_CXXFLAGS"]
    assert compiled == [path.name] and path.name != shipped_name


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    """A folder as `make wheel` ships it: Double's float64 library built for a portable target, its record, and
    toolchain.json."""
    base = tmp_path_factory.mktemp("portable")
    folder = base / "prebuilt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PTNATIVE_CXXFLAGS=PORTABLE, PTNATIVE_CACHE_DIR=str(folder), PTNATIVE_PREBUILT="0")
    for name in ("PTNATIVE_CXX", "CXX"):  # the package is built by the default compiler, the user's (below) too
        env.pop(name, None)
    code = ("import ptnative, sys; from ptnative import build, prebuilt\n"
            "sys.path.insert(0, sys.argv[1]); from _ops_for_tests import double_spec\n"
            "v = ptnative.NativeOp(**double_spec(kernel='twice_prebuilt', name='DoublePrebuilt')).variant('float64')\n"
            "p = build.build(v)\n"
            "(p.parent / prebuilt.MANIFEST).write_bytes(prebuilt.manifest_data(build.local_toolchain()))\n"
            "print(p.name)\n")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert prebuilt._prune(folder) == 1
    return folder, out.stdout.split()[-1]


@pytest.fixture
def portable_setup(setup, portable, monkeypatch):
    """``setup`` with the package's folder replaced by the portable one, on a machine whose compiler's version
    differs from the one that built the package (as a user's would)."""
    variant, _, cache, compiled = setup
    folder, name = portable
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: folder)
    real_version = build.compiler_version
    monkeypatch.setattr(build, "compiler_version", lambda cmd: real_version(cmd) + " (another machine)")
    monkeypatch.delenv("PTNATIVE_CXXFLAGS", raising=False)
    monkeypatch.delenv("PTNATIVE_CXX", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    return variant, folder, name, cache, compiled


def test_a_portable_package_is_used_where_the_user_set_no_flags(portable_setup):
    variant, folder, name, cache, compiled = portable_setup
    path = build_quietly(variant)
    assert compiled == [] and path == cache / name
    assert path.read_bytes() == (folder / name).read_bytes()
    assert build.resolve(variant)[1].target == (PORTABLE,)


def test_a_portable_package_is_not_used_with_other_user_flags(portable_setup, monkeypatch):
    variant, _, name, _, compiled = portable_setup
    for target in ("-march=native", PORTABLE):  # even the same flags: the user's compiler is another version
        monkeypatch.setenv("PTNATIVE_CXXFLAGS", target)
        path = build_quietly(variant)
        assert path.name != name and compiled[-1] == path.name
    assert len(compiled) == 2


def test_a_portable_package_is_not_used_with_another_compiler_command(portable_setup, monkeypatch):
    variant, _, name, _, compiled = portable_setup
    monkeypatch.setenv("PTNATIVE_CXX", shutil.which(build.cxx()))  # the same compiler, named otherwise
    path = build_quietly(variant)
    assert path.name != name and compiled == [path.name]


def test_a_portable_package_is_not_used_when_turned_off(portable_setup, monkeypatch):
    variant, _, name, _, compiled = portable_setup
    monkeypatch.setenv("PTNATIVE_PREBUILT", "0")
    assert build_quietly(variant).name != name and len(compiled) == 1


@pytest.mark.parametrize("manifest", [
    b"not json", b'{"format": 1}', b'{"format": 2, "compiler": "g++", "version": "x", "target": ["-O2"]}',
    b'{"format": 1, "compiler": "g++", "version": "x", "target": ["-march=native"]}',
    b'{"format": 1, "compiler": "g++", "version": "x", "target": ["-o", "x"]}', b"\xff" * 20000,
])
def test_a_malformed_or_native_manifest_is_ignored(portable_setup, tmp_path, monkeypatch, manifest):
    variant, folder, name, _, compiled = portable_setup
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    os.chmod(copy / prebuilt.MANIFEST, 0o644)
    (copy / prebuilt.MANIFEST).write_bytes(manifest)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: copy)
    assert prebuilt.portable_toolchain(build.cxx()) is None
    assert build_quietly(variant).name != name and len(compiled) == 1


def test_an_untrusted_manifest_is_ignored(portable_setup, tmp_path, monkeypatch):
    variant, folder, name, _, compiled = portable_setup
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    os.chmod(copy / prebuilt.MANIFEST, 0o666)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: copy)
    assert prebuilt.portable_toolchain(build.cxx()) is None
    assert build_quietly(variant).name != name


def test_a_tampered_portable_library_is_compiled_with_the_package_flags(portable_setup, tmp_path, monkeypatch):
    variant, folder, name, _, compiled = portable_setup
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    os.chmod(copy / name, 0o644)
    tamper_bytes(copy, name)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: copy)
    with pytest.warns(UntrustedLibraryWarning, match="does not match the SHA-256"):
        path = build.build(variant)
    assert compiled == [name] and path.is_file()


def test_the_prebuild_step_records_its_toolchain_and_keeps_it(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o700)
    (dest / prebuilt.MANIFEST).write_bytes(prebuilt.manifest_data(
        build.Toolchain("g++", "g++ 12", (PORTABLE,), "")))
    assert prebuilt._prune(dest) == 0
    assert os.stat(dest / prebuilt.MANIFEST).st_mode & 0o777 == 0o644
    parsed = prebuilt.parse_manifest((dest / prebuilt.MANIFEST).read_bytes())
    assert parsed == build.Toolchain("g++", "g++ 12", (PORTABLE,), "")


def test_the_prebuild_step_says_what_it_compiles(tmp_path, monkeypatch, capsys):
    """``python -m ptnative.prebuilt`` (setup.py's step): a first line with the CPU target, the build with one
    progress line per library and toolchain.json written by it, then a summary with the time."""
    dest = tmp_path / "dest"
    seen = []

    def fake_build(cmd, env, **kw):
        seen.append((cmd, env["PTNATIVE_CXXFLAGS"], env["PTNATIVE_PREBUILT"], kw.get("stdout")))
        for name in ("x.so", "x.so" + RECORD_SUFFIX, prebuilt.MANIFEST):
            (dest / name).write_bytes(b"x")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(prebuilt.subprocess, "run", fake_build)
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", PORTABLE)
    assert prebuilt.main([str(dest), "-j", "2"]) == 0
    err = capsys.readouterr().err
    assert f"CPU target {PORTABLE}" in err
    assert "ptnative: 1 prebuilt libraries in" in err and "built in 0 min" in err
    (cmd, flags_env, prebuilt_env, stdout), = seen
    assert cmd[-6:] == ["-j", "2", "--progress", "lines", "--toolchain-record", str(dest / prebuilt.MANIFEST)]
    assert flags_env == PORTABLE and prebuilt_env == "0" and stdout is sys.stderr
    assert sorted(os.listdir(dest)) == sorted(["x.so", "x.so" + RECORD_SUFFIX, prebuilt.MANIFEST])  # kept


def test_the_prebuild_step_with_bad_flags_installs_nothing_and_succeeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march='oops")
    assert prebuilt.main([str(tmp_path / "dest")]) == 0
    assert "no prebuilt libraries" in capsys.readouterr().err and not (tmp_path / "dest").exists()
