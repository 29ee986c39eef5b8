"""c_code/common/simd.h: ptn_vec<T, N> computes, lane for lane and bit for bit, what the compilers' own vector
extensions compute, in both of its forms: a `vector_size` type, and ptn_wide (an array of register-sized vectors,
what g++ gets where the target's registers are narrower than the vector: x86-64-v3 and -v2, aarch64).

tests/simd_lanes.cc checks every operator and helper the kernels use (arithmetic, comparisons, masks, shifts, bit
casts, ptn_convert, ptn_select, ptn_shuffle / ptn_shuffle2, lane access, brace initialisation) against the plain
vector extensions; it is built per compiler and target here and run (aarch64 under qemu-user where installed).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ptnative import cpu_levels

PROGRAM = Path(__file__).with_name("simd_lanes.cc")
HOST_LEVELS = {level.target[0].split("=", 1)[1] for level in cpu_levels.levels_for()}


def _run(cmd: list[str], tmp_path: Path, march: str, runner: list[str] = ()) -> str:
    exe = tmp_path / "simd_lanes"
    built = subprocess.run([*cmd, "-std=c++17", "-O2", f"-march={march}", "-Wno-psabi", str(PROGRAM), "-o",
                            str(exe)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    out = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _needs(tool: str):
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} is not installed")


@_needs("g++")
@pytest.mark.parametrize("march, wide", [("x86-64-v2", 1), ("x86-64-v3", 1), ("x86-64-v4", 0)])
def test_gxx_both_forms(tmp_path, march, wide):
    if march not in HOST_LEVELS or not cpu_levels.runs(next(level for level in cpu_levels.levels_for()
                                                            if level.target[0] == f"-march={march}")):
        pytest.skip(f"this CPU does not run {march}")
    assert _run(["g++"], tmp_path, march).split() == ["ok", "98", f"wide={wide}"]


@_needs("clang++")
@pytest.mark.parametrize("march", ["x86-64-v2", "x86-64-v3"])
def test_clang_native_vectors(tmp_path, march):
    if march not in HOST_LEVELS:
        pytest.skip("not an x86-64 machine")
    assert _run(["clang++"], tmp_path, march).split() == ["ok", "98", "wide=0"]


@_needs("aarch64-linux-gnu-g++")
@_needs("qemu-aarch64-static")
def test_aarch64_gxx_wide_form(tmp_path):
    out = _run(["aarch64-linux-gnu-g++", "-static"], tmp_path, "armv8-a", runner=["qemu-aarch64-static"])
    assert out.split() == ["ok", "98", "wide=1"]
