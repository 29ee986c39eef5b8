"""Metadata lives in setup.cfg.  This file adds one build step: the wheel ships the catalogue's CPU kernel
libraries, compiled for this machine (``ptnative/prebuilt/``, see ptnative/prebuilt.py and README "Install").

``PTNATIVE_PREBUILD=0`` skips it; ``PTNATIVE_BUILD_JOBS`` sets how many compilers run at once (default: every
core); ``PTNATIVE_CXXFLAGS`` sets the CPU target instead of ``-march=native``; ``PTNATIVE_PREBUILT_LEVELS=portable``
builds every portable CPU level of the architecture instead (``make wheel``; the best one the CPU runs is loaded).  It
prints what it compiles, a line per library and the time taken on stderr (``pip install -v .`` shows them).
Without a C++ compiler, or if the step fails, the package installs without prebuilt libraries and the
kernels compile on first use, as they always do for user-written ops."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        build_lib = Path(self.build_lib).resolve()
        if getattr(self, "editable_mode", False) or os.environ.get("PTNATIVE_PREBUILD", "1").strip() == "0":
            shutil.rmtree(build_lib / "ptnative" / "prebuilt", ignore_errors=True)  # none left from an earlier build
            return
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        jobs = os.environ.get("PTNATIVE_BUILD_JOBS") or str(cores or 1)
        # Fresh PyTensor and Numba caches: importing them at build time leaves nothing in the user's home.
        scratch = build_lib.parent / "ptnative-build-caches"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(build_lib), os.environ.get("PYTHONPATH")] if p),
                   PYTENSORFLAGS=f"base_compiledir={scratch / 'pytensor'}", NUMBA_CACHE_DIR=str(scratch / "numba"))
        cmd = [sys.executable, "-m", "ptnative.prebuilt", str(build_lib / "ptnative" / "prebuilt"), "-j", jobs]
        print("ptnative: compiling the catalogue's CPU kernels into the package:", " ".join(cmd), file=sys.stderr)
        try:
            problem = f"exit status {subprocess.run(cmd, cwd=build_lib, env=env).returncode}"
        except OSError as e:
            problem = str(e)
        if not problem.endswith(" 0"):
            print(f"ptnative: prebuilt kernels not built ({problem}); they will compile on first use", file=sys.stderr)


class PlatformDistribution(Distribution):
    """The wheel holds libraries compiled for this machine: tag it for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithKernels}, distclass=PlatformDistribution)
