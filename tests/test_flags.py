"""Compiler flags a user can set (ptnative/flags.py, ptnative.config.cxxflags, PTNATIVE_CXXFLAGS) and the
platform's shared-library flags: the user's flags reach the compile command in place of -march=native, change
the library's name, and bad values are refused with a message; macOS gets -dynamiclib and no -Bsymbolic."""

import shutil
import subprocess
from pathlib import Path

import pytest

import ptnative
from ptnative import build, flags
from ptnative.settings import config

from ._ops_for_tests import double_spec

DOUBLE = double_spec(kernel="twice_flags", name="DoubleFlags")


@pytest.fixture
def variant(monkeypatch, tmp_path):
    monkeypatch.setenv("PTNATIVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PTNATIVE_CXXFLAGS", raising=False)
    monkeypatch.setattr(config, "_cxxflags", None)
    return ptnative.NativeOp(**DOUBLE).variant("float64")


def command(variant):
    return build.compile_command(variant, Path("SRC"), Path("OUT"))


def test_default_is_march_native_and_the_linux_command_is_unchanged(variant):
    assert not flags.user_set() and flags.target_flags() == [flags.NATIVE]
    cmd = command(variant)
    assert cmd[1:1 + len(build.CXX_FLAGS)] == build.CXX_FLAGS  # flag for flag as before
    assert flags.for_platform(build.CXX_FLAGS, [flags.NATIVE], "Linux") == build.CXX_FLAGS


@pytest.mark.parametrize("how", ["env", "config"])
def test_user_flags_replace_march_native_in_the_command(variant, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march=x86-64-v2  -mtune=generic")
    else:
        config.cxxflags = ["-march=x86-64-v2", "-mtune=generic"]
    cmd = command(variant)
    assert "-march=native" not in cmd
    at = build.CXX_FLAGS.index(flags.NATIVE) + 1
    assert cmd[at:at + 2] == ["-march=x86-64-v2", "-mtune=generic"]  # where -march=native was: after -O3
    assert cmd.index("-O3") < at
    assert flags.user_set()


def test_user_flags_change_the_library_name(variant, monkeypatch):
    native = build.library_path(variant).name
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march=x86-64-v2")
    v2 = build.library_path(variant).name
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march=x86-64-v3")
    v3 = build.library_path(variant).name
    assert len({native, v2, v3}) == 3
    monkeypatch.delenv("PTNATIVE_CXXFLAGS")
    assert build.library_path(variant).name == native


def test_cpu_model_is_part_of_the_name_only_for_a_native_target(variant, monkeypatch):
    native = build.library_path(variant).name
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march=x86-64-v2")
    portable = build.library_path(variant).name
    monkeypatch.setattr(build, "_cpu_model", lambda: "model name : another CPU")
    assert build.library_path(variant).name == portable  # same name on every machine
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-mcpu=native")
    assert flags.targets_this_cpu(flags.target_flags())
    monkeypatch.delenv("PTNATIVE_CXXFLAGS")
    assert build.library_path(variant).name != native


@pytest.mark.parametrize("value, match", [
    ("-march='x86-64", "cannot be split"),
    ("-O2 foo.cpp", "only compiler options"),
    ("-o /tmp/elsewhere.so", "only compiler options"),
    ("-o/tmp/elsewhere.so", "only compiler options"),
    (["-O2", 3], "a list of strings"),
    (["-O2\0"], "only compiler options"),
])
def test_bad_flags_are_refused_with_a_message(variant, monkeypatch, value, match):
    with pytest.raises(ValueError, match=match):
        config.cxxflags = value
    if isinstance(value, str):
        monkeypatch.setenv("PTNATIVE_CXXFLAGS", value)
        with pytest.raises(ValueError, match=f"PTNATIVE_CXXFLAGS.*{match}"):
            build.library_path(variant)


def test_empty_flags_mean_unset(variant, monkeypatch):
    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "   ")
    assert not flags.user_set()
    config.cxxflags = ""
    assert config.cxxflags is None


def test_a_build_with_user_flags_compiles_and_runs(variant, monkeypatch):
    import numpy as np
    import pytensor
    import pytensor.tensor as pt

    monkeypatch.setenv("PTNATIVE_CXXFLAGS", "-march=x86-64 -O2")
    path = build.build(variant)
    assert path.name == build.library_path(variant).name and path.is_file()
    x = pt.vector("x", dtype="float64")
    f = pytensor.function([x], ptnative.NativeOp(**DOUBLE)(x), mode="FAST_COMPILE")
    np.testing.assert_array_equal(f(np.array([1.0, 2.5])), [2.0, 5.0])


def test_macos_shared_library_flags():
    mac = flags.for_platform(build.CXX_FLAGS, ["-mcpu=native"], "Darwin")
    assert "-dynamiclib" in mac and "-shared" not in mac
    assert not any("Bsymbolic" in f for f in mac)  # GNU ld / lld only
    assert "-mcpu=native" in mac and "-march=native" not in mac
    assert flags.default_target("Darwin", "arm64") == ["-mcpu=native"]
    assert flags.default_target("Darwin", "x86_64") == ["-march=native"]
    assert flags.default_target("Linux", "aarch64") == ["-march=native"]


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_a_kernel_library_refers_to_no_python_symbol(variant):
    """So a macOS build needs no ``-undefined dynamic_lookup``: nothing is left for the interpreter to provide."""
    path = build.build(variant)
    out = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    undefined = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
    assert undefined and not [s for s in undefined if s.startswith(("Py", "_Py"))]
