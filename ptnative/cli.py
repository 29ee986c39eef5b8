"""``python -m ptnative info | build [--device cuda] [-j N] | demo``."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import time
from functools import partial


def _version(module: str) -> str:
    try:
        return importlib.import_module(module).__version__
    except ImportError:
        return "not installed"


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
        return lines[0] if out.returncode == 0 and lines else "not found"
    except (OSError, subprocess.TimeoutExpired):
        return "not found"


def _dir_size(path) -> int:
    """Bytes of the regular files under ``path``; files and folders that another process removes meanwhile (a
    compiler's temporary build folder) are skipped, and links are not followed."""
    total = 0
    for folder, _, files in os.walk(path):  # os.walk ignores folders that vanish under it
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def info() -> None:
    from . import __version__, blas, build, prebuilt

    rows = [
        ("ptnative", __version__),
        ("python", platform.python_version()),
        ("pytensor", _version("pytensor")),
        ("numpy", _version("numpy")),
        ("numba", _version("numba")),
        ("scipy", _version("scipy")),
        ("jax", _version("jax")),
        ("C++ compiler", f"{build.cxx()}: {_first_line([build.cxx(), '--version'])}"),
    ]
    from . import flags
    try:
        target = " ".join(flags.target_flags())
        rows.append(("CPU target flags", target + (" (PTNATIVE_CXXFLAGS / ptnative.config.cxxflags)"
                                                   if flags.user_set() else " (the default)")))
    except ValueError as e:
        rows.append(("CPU target flags", f"INVALID: {e}"))
    nvcc = build.nvcc()
    nvcc_version = [line for line in build.compiler_version(nvcc).splitlines() if "release" in line] if nvcc else []
    rows.append(("nvcc", f"{nvcc}: {nvcc_version[0].strip() if nvcc_version else '?'}" if nvcc else "not found"))
    smi = shutil.which("nvidia-smi")
    gpu = _first_line([smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]) if smi else ""
    rows.append(("GPU", gpu if gpu and gpu != "not found" else "none found"))
    rows.append(("CUDA archs for builds", ", ".join("sm_" + a for a in build.cuda_archs())))
    from .device import load_cublas
    rows.append(("cuBLAS (CUDA kernels)", load_cublas() or "not found"))
    rows.append(("BLAS (CPU kernels)", blas.describe()))
    rows.append(("OpenBLAS worker threads", _blas_threads_row()))
    cache, problem = build.cache_status()
    if problem:
        rows.append(("kernel cache", f"{cache}: FAILS THE CHECKS: {problem}"))
    else:
        libs = list(cache.glob("*.so"))
        rows.append(("kernel cache", f"{cache}: passes the checks (private directory; {len(libs)} libraries, "
                                     f"{_dir_size(cache) / 2**20:.1f} MiB)"))
    shipped = prebuilt.count()
    rows.append(("prebuilt libraries", f"{prebuilt.prebuilt_dir()}: {shipped} (CPU, built with the package)"
                 if shipped is not None else "none (kernels compile on first use)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _blas_threads_row() -> str:
    """Who runs the loaded OpenBLAS libraries' parallel work once a CPU kernel loads (ptnative.blas_threads)."""
    from . import blas_threads

    try:
        setting = blas_threads.choice()
    except ValueError as e:
        return f"INVALID: {e}"
    libraries = blas_threads.openblas_libraries()
    if setting == "openblas":
        return f"their own ({blas_threads.SETTING}=openblas)"
    if not libraries:
        return "their own (no loaded OpenBLAS has a threads callback)"
    return f"ptnative's pool, for {', '.join(os.path.basename(p) for p in libraries)}"


class _Bar:
    """A stand-in for tqdm (a dependency, so only used if it is missing)."""

    def __init__(self, total, **kw):
        self.total = total

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass


class _Lines:
    """Progress as one line per library on stderr (``[12/92] HmmViterbiOp (float64): 14.2 s``), for logs and
    for pip, which shows a build's stderr with ``-v`` but has no terminal for a bar."""

    def __init__(self, total, **kw):
        self.total, self.done = total, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1, label="", seconds=0.0):
        self.done += n
        print(f"[{self.done}/{self.total}] {label}: {seconds:.1f} s", file=sys.stderr, flush=True)


def _timed_build(build, make):
    t0 = time.monotonic()
    build.build(make())
    return time.monotonic() - t0


def _announce(device: str, count: int, jobs: int, record: str | None) -> bool:
    """Say on stderr what is about to be compiled (compiler, version, CPU target) and write ``record``
    (``toolchain.json``, :mod:`ptnative.prebuilt`) for a CPU build; False, with the reason, if the toolchain is
    unusable (no compiler, bad ``PTNATIVE_CXXFLAGS``)."""
    from . import build, prebuilt
    from .cpu_levels import Level

    if device != "cpu":
        print(f"ptnative: building {count} libraries ({device}), {jobs} at a time", file=sys.stderr, flush=True)
        return True
    try:
        toolchain = build.local_toolchain()
    except (build.CompileError, ValueError) as e:
        print(f"ptnative: nothing built: {e}", file=sys.stderr)
        return False
    version = toolchain.version.splitlines()[0] if toolchain.version else "?"
    print(f"ptnative: building {count} libraries (cpu) with {toolchain.compiler} ({version}), CPU target "
          f"{' '.join(toolchain.target)}, {jobs} at a time", file=sys.stderr, flush=True)
    if record:
        with open(record, "wb") as f:
            f.write(prebuilt.manifest_data(toolchain.compiler, toolchain.version,
                                           [Level(toolchain.target, frozenset())]))
    return True


def build_all(device: str, jobs: int | None = None, progress: str = "bar", record: str | None = None) -> int:
    """Build every catalogue variant for ``device``, and JAX mode's XLA FFI handler where jax is installed, with
    ``jobs`` compilers at a time (threads: the compilers are subprocesses, and the cache's file locks keep
    concurrent builds of one library apart).  ``progress``: ``"bar"`` (tqdm) or ``"lines"`` (:class:`_Lines`).
    ``record``: a file to write the toolchain to (``toolchain.json``, for the prebuilt step)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from . import build, catalogue
    from .backends.ffi_source import installed_handler_variant

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        tqdm = _Bar

    jobs = max(1, jobs or os.cpu_count() or 1)
    # (label, a function making the variant): variants are made in the threads too
    todo = [(f"{name} ({dtype})", partial(op.variant, dtype, device=device))
            for name, op, dtype in catalogue.variants(device)]
    if device == "cpu":
        from .blas_threads import pool_variant
        todo.append(("the worker pool (OpenBLAS and the kernels' threads)", pool_variant))
    handler = installed_handler_variant(device)
    if handler is not None:
        todo.append(("JAX mode's XLA FFI handler", lambda: handler))
    failures = 0
    start = time.time()
    if not _announce(device, len(todo), jobs, record):
        return 1

    lines = progress == "lines"
    with ThreadPoolExecutor(max_workers=jobs) as pool, \
            (_Lines if lines else tqdm)(total=len(todo), desc=f"building ({device}, -j {jobs})", unit="lib") as bar:
        futures = {pool.submit(_timed_build, build, make): label for label, make in todo}
        for future in as_completed(futures):
            seconds, failed = 0.0, False
            try:
                seconds = future.result()
            except (build.CompileError, build.CacheError, ValueError) as e:
                failures += 1
                failed = True
                print(f"\n{futures[future]}: {e}", file=sys.stderr)
            if lines:
                bar.update(1, label=futures[future] + (" FAILED" if failed else ""), seconds=seconds)
            else:
                bar.update(1)
    print(f"{len(todo) - failures} of {len(todo)} libraries ready in {build.cache_dir()} "
          f"({time.time() - start:.1f} s, {jobs} job(s))")
    return 1 if failures else 0


def demo() -> None:
    import numpy as np
    import pytensor
    import pytensor.tensor as pt

    from . import build
    from .ops import LstmGenericBase

    T, B, n = 20, 4, 8
    rng = np.random.default_rng(0)
    Z, V_h, c = pt.tensor3("Z"), pt.matrix("V_h"), pt.matrix("c")
    mask = pt.matrix("mask")
    op = LstmGenericBase.make_op()
    Y, H, d = op(Z, V_h, c, mask)
    loss = (Y ** 2).sum()
    grad_V = pytensor.grad(loss, V_h)
    f = pytensor.function([Z, V_h, c, mask], [loss, grad_V])
    lengths = np.array([20, 17, 9, 1])
    mask_v = (np.arange(T)[:, None] < lengths[None, :]).astype(pytensor.config.floatX)
    values = [rng.normal(size=(T, B, 4 * n)), 0.3 * rng.normal(size=(n, 4 * n)), np.zeros((B, n)), mask_v]
    values = [v.astype(pytensor.config.floatX) for v in values]
    t0 = time.perf_counter()
    loss_v, grad_v = f(*values)
    first = time.perf_counter() - t0
    lib = build.library_path(op.variant(str(Z.dtype)))
    print("ptnative demo: LSTM (LstmGenericBase) over 4 sequences of lengths", lengths.tolist())
    print(f"  loss = sum(Y**2) = {float(loss_v):.6f}")
    print(f"  |d loss / d V_h| = {float(np.linalg.norm(grad_v)):.6f}")
    print(f"  mode: {pytensor.config.mode!r} (the default; linker {type(f.maker.linker).__name__}), dtype {Z.dtype}")
    print(f"  kernels compiled by: {_first_line([build.cxx(), '--version'])}")
    print(f"  library: {lib}")
    print(f"  first call {first * 1e3:.1f} ms (includes JIT); ", end="")
    t0 = time.perf_counter()
    for _ in range(10):
        f(*values)
    print(f"then {(time.perf_counter() - t0) / 10 * 1e3:.2f} ms per call")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ptnative", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, compilers, GPU, BLAS and the kernel cache")
    b = sub.add_parser("build", help="build every catalogue op ahead of time")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    b.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                   help="compile N libraries at a time (default: the number of CPUs, %(default)s here)")
    b.add_argument("--progress", choices=["bar", "lines"], default=None,
                   help="a progress bar, or one line per library on stderr (default: a bar on a terminal)")
    b.add_argument("--toolchain-record", default=None, metavar="FILE", help=argparse.SUPPRESS)
    sub.add_parser("demo", help="run a short PyTensor program using a native op")
    args = parser.parse_args(argv)
    if args.command == "info":
        info()
    elif args.command == "build":
        progress = args.progress or ("bar" if sys.stderr.isatty() else "lines")
        return build_all(args.device, args.jobs, progress=progress, record=args.toolchain_record)
    elif args.command == "demo":
        demo()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
