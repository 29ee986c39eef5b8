"""The aarch64 cross build (scripts/cross_build.py; CI cross-compiles the whole catalogue, docs/install.md,
"aarch64"): its compile command is ptnative's with only the compiler and -march changed, and the float32 HMM
likelihood unit, once an internal compiler error of GCC 12 for aarch64 (c_code/hmm/hmm_likelihood.h,
hmm_running_max), compiles.  Skipped where aarch64-linux-gnu-g++ is not installed."""

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from ptnative import build, flags
from ptnative.flags import Toolchain

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "cross_build.py")


@pytest.fixture(scope="module")
def cross_build():
    if not os.path.exists(SCRIPT):
        pytest.skip("scripts/ is not next to the tests")
    spec = importlib.util.spec_from_file_location("cross_build", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_command_is_ptnatives_with_the_cross_compiler_and_march(cross_build):
    (label, variant), = cross_build.variants("HmmLikelihoodWithGradOp (float32)")
    native = build.compile_command(variant, Path("u.cpp"), Path("u.so"),
                                   Toolchain("g++", "", tuple(flags.default_target()), ""))
    cross = cross_build.command(variant, Path("u.cpp"), Path("u.so"), "aarch64-linux-gnu-g++", "armv8.2-a")
    assert cross[0] == "aarch64-linux-gnu-g++" and "-O3" in cross
    assert cross[1:] == ["-march=armv8.2-a" if a == flags.NATIVE else a for a in native[1:]]


def test_hmm_likelihood_float32_cross_compiles_for_aarch64(cross_build):
    if shutil.which(cross_build.DEFAULT_CXX) is None:
        pytest.skip(f"{cross_build.DEFAULT_CXX} is not installed")
    (label, variant), = cross_build.variants("HmmLikelihoodWithGradOp (float32)")
    with tempfile.TemporaryDirectory() as d:
        assert cross_build.compile_one(label, variant, Path(d), cross_build.DEFAULT_CXX, cross_build.DEFAULT_MARCH,
                                       []) == (label, None)
