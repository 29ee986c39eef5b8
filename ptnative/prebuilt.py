"""The catalogue's CPU libraries, built when the package is built (``pip install .`` builds a wheel) and shipped
inside it, in ``ptnative/prebuilt/``: a first call of a catalogue function then waits for no compiler.  Where the
build environment can import jax (``pip install --no-build-isolation`` in an environment with jax), JAX mode's CPU
handler library (:mod:`ptnative.backends.ffi_source`) is built and shipped too.

They are named exactly like the kernel cache's libraries (:func:`ptnative.build.library_path`: the op's symbol, a
hash of the source, the compile command, the compiler's version and the CPU model), each with its integrity
record.  When the cache lacks a library, :func:`ptnative.build.build` looks here for one of the same name,
checks it (:class:`ptnative.cache.PackagedDirectory`) and installs its bytes in the cache; a library built with
another compiler, other flags, for another CPU or from other sources has another name and is compiled as before.
``PTNATIVE_PREBUILT=0`` turns the lookup off.

``python -m ptnative.prebuilt DEST [-j N]`` fills ``DEST`` (the build hook in ``setup.py`` runs it); without a
C++ compiler it builds nothing and says so, and the package installs without prebuilt libraries.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

from .cache import RECORD_SUFFIX, Missing, PackagedDirectory, Untrusted
from .compilers import cxx

__all__ = ["prebuilt_dir", "enabled", "packaged", "main"]


def prebuilt_dir() -> Path:
    """Where the installed package keeps its prebuilt libraries (the folder may be absent)."""
    return Path(__file__).resolve().parent / "prebuilt"


def enabled() -> bool:
    """False when ``PTNATIVE_PREBUILT`` is ``0`` (or false/no/off): every library is then compiled."""
    return os.environ.get("PTNATIVE_PREBUILT", "1").strip().lower() not in ("0", "false", "no", "off")


@cache
def _package_owner() -> int:
    return os.stat(Path(__file__).resolve().parent).st_uid


def packaged() -> PackagedDirectory:
    """The checked prebuilt directory; :class:`~ptnative.cache.Missing` if there is none, or
    :class:`~ptnative.cache.Untrusted` if it fails its checks.  The caller closes it (``with``)."""
    return PackagedDirectory(prebuilt_dir(), _package_owner())


def count() -> int | None:
    """How many libraries the package ships (None without a prebuilt directory)."""
    try:
        with packaged() as d:
            return sum(1 for name in os.listdir(d.fd) if name.endswith(".so"))
    except Untrusted:
        return None


def _prune(dest: Path) -> int:
    """Keep only the libraries with their records, readable by all and writable by none but the owner."""
    kept = 0
    for entry in list(dest.iterdir()):
        library = entry.name[:-len(RECORD_SUFFIX)] if entry.name.endswith(RECORD_SUFFIX) else entry.name
        if library.endswith(".so") and (dest / library).is_file() and (dest / (library + RECORD_SUFFIX)).is_file() \
                and not entry.is_symlink():
            entry.chmod(0o644)
            kept += entry.name == library
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    dest.chmod(0o755)
    return kept


def main(argv: list[str] | None = None) -> int:
    """Build every CPU variant of the catalogue (and JAX mode's CPU handler where jax is importable) into ``DEST``
    (emptied first) with ``-j`` compilers at a time.
    Returns 0 also when no compiler is found or some libraries fail (those compile on first use)."""
    parser = argparse.ArgumentParser(prog="python -m ptnative.prebuilt", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, metavar="N")
    args = parser.parse_args(argv)
    dest = args.dest.resolve()
    if dest.exists():
        shutil.rmtree(dest)
    if shutil.which(cxx()) is None:
        print(f"ptnative: no C++ compiler ({cxx()!r}) found: no prebuilt libraries; the catalogue's kernels "
              "will compile on first use", file=sys.stderr)
        return 0
    dest.mkdir(mode=0o700, parents=True)
    env = dict(os.environ, PTNATIVE_CACHE_DIR=str(dest), PTNATIVE_PREBUILT="0")
    proc = subprocess.run([sys.executable, "-m", "ptnative", "build", "-j", str(args.jobs)], env=env)
    kept = _prune(dest)
    print(f"ptnative: {kept} prebuilt libraries in {dest}" + ("" if proc.returncode == 0 else
          " (some failed to build: they will compile on first use)"), file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
