"""The kernel tree (c_code/): folders by role, and every file compiles on its own, with any compiler.

``dialect/`` (what every variant's unit opens with), ``glue/`` (the templates ptnative fills: a variant's unit,
PyTensor's C module, the XLA FFI handler), ``common/`` (kernel helpers several families share), ``runtime/``
(libraries of their own that hold no op's code: the worker pool of OpenBLAS and the kernels' threads,
ptnative/blas_threads.py) and one folder per op family.  A kernel file includes what it needs by real relative
includes, ``dialect/kernel.h`` first, so that a compiler, clangd or nvcc pointed at one file compiles it;
ptnative's build inlines the same includes into one translation unit per variant (``ptnative.source.kernel_unit``).
The glue templates hold ``@KEY@`` placeholders and are compiled, filled, by every test that runs an op.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ptnative.build import cxx, nvcc
from ptnative.source import kernel_dir, kernel_unit, read_kernel_file

ROOT = Path(str(kernel_dir()))
ROLES = {"dialect", "glue", "common", "runtime"}
FAMILIES = {"fsa", "ctc", "hmm", "hsmm", "lstm", "rnnt", "edit_distance", "chunking", "sparse"}
#: No kernel file grows past this many lines (issue 29): split it by what its parts do.
MAX_LINES = 700
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def kernel_files() -> list[str]:
    """Every C/C++/CUDA file of c_code/ but the glue templates, as paths in c_code/."""
    return sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                  if p.suffix in (".h", ".cu", ".cc", ".c") and p.parent.name != "glue")


def test_folders_by_role():
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == ROLES | FAMILIES
    assert not [p.name for p in ROOT.iterdir() if p.is_file() and p.name != "__init__.py"]


def test_includes_name_headers_and_kernel_h_comes_first():
    for path in kernel_files():
        includes = _INCLUDE.findall(read_kernel_file(path))
        assert not [i for i in includes if i.endswith(".cu")], f"{path} includes a .cu file"
        for name in includes:
            assert (ROOT / Path(path).parent / name).resolve().is_file(), f"{path}: {name} not found"
        if not path.startswith(("dialect/", "runtime/")):  # the runtime's libraries are not kernels
            assert includes and includes[0] == "../dialect/kernel.h", f"{path} does not include kernel.h first"


def test_no_kernel_file_over_the_line_limit():
    long = {p: n for p in kernel_files() if (n := read_kernel_file(p).count("\n")) > MAX_LINES}
    assert not long, long


def test_every_kernel_unit_inlines_its_includes():
    """The units the ops use hold no include of a c_code/ file any more (each was inlined once)."""
    for path in kernel_files():
        if path.endswith(".cu"):
            assert not _INCLUDE.search(kernel_unit(path)), path


def _compile_each(command, paths):
    def run(path):
        proc = subprocess.run([*command, path], cwd=ROOT, capture_output=True, text=True, timeout=600)
        return path, proc.returncode, proc.stderr[-3000:]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failed = [(p, err) for p, rc, err in pool.map(run, paths) if rc != 0]
    assert not failed, "\n\n".join(f"{p}:\n{err}" for p, err in failed)


def test_every_file_compiles_on_its_own_for_the_cpu():
    """``<c++> -fsyntax-only`` on each file (PTNATIVE_CXX or g++; the build's -march flag, which the SIMD paths
    need)."""
    _compile_each([cxx(), "-std=c++17", "-fsyntax-only", "-x", "c++", "-march=native"], kernel_files())


@pytest.mark.parametrize("march", ["x86-64-v2"])  # both vector widths of the HMM (4 and 8 doubles) are ptn_wide
def test_every_file_compiles_on_its_own_below_avx512(march):
    """The same at the wheel's lower CPU levels (ptnative/cpu_levels.py), where g++ gets the kernels' wide vectors
    as ptn_wide (c_code/common/simd.h): code that spells a vector operation only the plain vector extensions have
    (``c ? a : b`` on a mask, ``__builtin_convertvector``) fails here, not at -march=native."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 levels")
    _compile_each([cxx(), "-std=c++17", "-fsyntax-only", "-x", "c++", f"-march={march}"], kernel_files())


def test_every_file_compiles_on_its_own_for_cuda():
    """nvcc's front end (``-cuda``: host and device code parsed and checked, no code generated) on each file."""
    nv = nvcc()
    if nv is None or not shutil.which(nv):
        pytest.skip("no nvcc")
    _compile_each([nv, "-x", "cu", "-std=c++17", "--expt-relaxed-constexpr", "-diag-suppress", "177,550", "-cuda",
                   "-o", os.devnull], kernel_files())
