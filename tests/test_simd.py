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
@pytest.mark.parametrize("level", range(3))
def test_gxx_both_forms_at_each_level_this_cpu_runs(tmp_path, level):
    """Each portable level of this machine's architecture that its CPU runs (x86-64: v4 with native 64-byte vectors,
    v3 and v2 with ptn_wide; aarch64: ptn_wide at armv8.2-a and armv8-a)."""
    levels = cpu_levels.levels_for()
    if level >= len(levels) or not cpu_levels.runs(levels[level]):
        pytest.skip("no such level here, or this CPU does not run it")
    march = levels[level].target[0].split("=", 1)[1]
    assert _run(["g++"], tmp_path, march).split() == ["ok", "98", f"wide={int(march != 'x86-64-v4')}"]


@_needs("clang++")
@pytest.mark.parametrize("march", ["x86-64-v2", "x86-64-v3"])
def test_clang_native_vectors(tmp_path, march):
    if cpu_levels.levels_for() != cpu_levels.LEVELS["x86_64"]:
        pytest.skip("not an x86-64 machine")
    assert _run(["clang++"], tmp_path, march).split() == ["ok", "98", "wide=0"]


@_needs("aarch64-linux-gnu-g++")
@_needs("qemu-aarch64-static")
def test_aarch64_gxx_wide_form(tmp_path):
    out = _run(["aarch64-linux-gnu-g++", "-static"], tmp_path, "armv8-a", runner=["qemu-aarch64-static"])
    assert out.split() == ["ok", "98", "wide=1"]
