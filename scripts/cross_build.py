"""Cross-compile every CPU variant of the catalogue (and JAX mode's CPU handler where jax is installed: the 92
libraries of ``python -m ptnative build``) for another architecture (default: aarch64), as ptnative's own
build would compile it there: the same translation units and flags (``ptnative.build.compile_command``, so -O3 and
GCC's vectoriser run), with the cross compiler and a portable ``-march`` as the CPU target (``-march=native``'s
place, as ``PTNATIVE_CXXFLAGS`` sets it).  Nothing
is loaded or run; the libraries are linked into a temporary folder and thrown away.

    python scripts/cross_build.py [-j N] [--cxx aarch64-linux-gnu-g++] [--march armv8.2-a] [-k NAME]

Prints one line per failure (with the compiler's last lines) and a summary ``N of M libraries built``; exits 1 when
one fails, 2 when the cross compiler is missing.  Used by tests/test_cross_build.py and .ci/run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_CXX = "aarch64-linux-gnu-g++"
DEFAULT_MARCH = "armv8.2-a"


def variants(only: str | None = None):
    """(label, variant) for every CPU variant of the catalogue, the OpenBLAS pool and JAX mode's CPU handler (where
    jax is installed), as ``python -m ptnative build`` makes them; ``only`` keeps those whose label contains it."""
    from ptnative import catalogue
    from ptnative.backends.ffi_source import installed_handler_variant

    for name, op, dtype in catalogue.variants("cpu"):
        label = f"{name} ({dtype})"
        if only is None or only in label:
            yield label, op.variant(dtype, device="cpu")
    from ptnative.blas_threads import pool_variant

    label = "the OpenBLAS worker pool"
    if only is None or only in label:
        yield label, pool_variant()
    handler = installed_handler_variant("cpu")  # None where jax is not installed
    label = "JAX mode's XLA FFI handler"
    if handler is not None and (only is None or only in label):
        yield label, handler


def command(variant, src: Path, out: Path, cxx: str, march: str) -> list[str]:
    """ptnative's compile command for ``variant`` (``ptnative.build.compile_command``) with a toolchain of
    ``cxx`` and the CPU target ``-march=<march>`` in place of ``-march=native`` (as ``PTNATIVE_CXXFLAGS`` would
    set it; the user's own setting is not used here)."""
    from ptnative import build
    from ptnative.flags import Toolchain

    return build.compile_command(variant, src, out, Toolchain(cxx, "", (f"-march={march}",), ""))


def compile_one(label: str, variant, workdir: Path, cxx: str, march: str, extra: list[str]):
    """(label, None) when it compiles, else (label, the compiler's last lines)."""
    d = Path(tempfile.mkdtemp(dir=workdir))
    src = d / (variant.symbol + ".cpp")
    src.write_text(variant.source)
    cmd = command(variant, src, d / "out.so", cxx, march) + extra
    proc = subprocess.run(cmd, capture_output=True, text=True)
    ok = proc.returncode == 0 and (d / "out.so").is_file()
    shutil.rmtree(d, ignore_errors=True)
    if ok:
        return label, None
    return label, "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cxx", default=os.environ.get("PTNATIVE_CROSS_CXX", DEFAULT_CXX))
    parser.add_argument("--march", default=DEFAULT_MARCH)
    parser.add_argument("-k", dest="only", default=None, help="only the variants whose label contains this")
    parser.add_argument("extra", nargs="*", help="more compiler flags (after --)")
    args = parser.parse_args(argv)
    if shutil.which(args.cxx) is None:
        print(f"cross_build: no cross compiler {args.cxx!r} found", file=sys.stderr)
        return 2
    todo = list(variants(args.only))
    start = time.time()
    failures = []
    with tempfile.TemporaryDirectory(prefix="ptnative-cross-") as workdir, \
            ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for label, error in pool.map(lambda lv: compile_one(*lv, Path(workdir), args.cxx, args.march, args.extra),
                                     todo):
            if error is not None:
                failures.append(label)
                print(f"FAILED {label}:\n{error}\n", file=sys.stderr, flush=True)
    print(f"cross_build ({args.cxx}, -march={args.march}): {len(todo) - len(failures)} of {len(todo)} libraries "
          f"built ({time.time() - start:.0f} s, -j {args.jobs})" + (f"; failed: {', '.join(failures)}" if failures
                                                                      else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
