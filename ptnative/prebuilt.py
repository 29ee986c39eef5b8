"""The catalogue's CPU libraries, built when the package is built (``pip install .`` builds a wheel) and shipped
inside it, in ``ptnative/prebuilt/``: a first call of a catalogue function then waits for no compiler.  Where the
build environment can import jax (``pip install --no-build-isolation`` in an environment with jax), JAX mode's CPU
handler library (:mod:`ptnative.backends.ffi_source`) is built and shipped too.

They are named exactly like the kernel cache's libraries (:func:`ptnative.build.library_name`: the op's symbol, a
hash of the source, the compile command, the compiler's version and, for ``-march=native``, the CPU model), each
with its integrity record.  When the cache lacks a library, :func:`ptnative.build.build` looks here for one of the
same name, checks it (:class:`ptnative.cache.PackagedDirectory`) and installs its bytes in the cache; a library
built with another compiler, other flags, for another CPU or from other sources has another name and is compiled
as before.  ``PTNATIVE_PREBUILT=0`` turns the lookup off.

The folder also holds ``toolchain.json``: the compiler command, its version and the CPU target flags the libraries
were built with (``PTNATIVE_CXXFLAGS`` at build time; ``make wheel`` sets a portable one).  Libraries built for a
portable target (no ``native`` in the flags) are used on any machine whose user has set no CPU target of their own
(:func:`ptnative.build.resolve`), whatever compiler, if any, that machine has, as long as the compiler command
(``PTNATIVE_CXX``, ``CXX`` or ``g++``) is the one named there.

``python -m ptnative.prebuilt DEST [-j N]`` fills ``DEST`` (the build hook in ``setup.py`` runs it); without a
C++ compiler it builds nothing and says so, and the package installs without prebuilt libraries.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

from .cache import RECORD_SUFFIX, Missing, PackagedDirectory, Untrusted
from .compilers import cxx
from . import flags
from .flags import Toolchain, targets_this_cpu
from .settings import Config

__all__ = ["prebuilt_dir", "enabled", "packaged", "portable_toolchain", "ships", "main"]

log = logging.getLogger("ptnative.prebuilt")

MANIFEST = "toolchain.json"
MANIFEST_FORMAT = 1
_MANIFEST_MAX_BYTES = 16384


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


def manifest_data(toolchain: Toolchain) -> bytes:
    """``toolchain.json``'s content for libraries built with ``toolchain``."""
    return (json.dumps({"format": MANIFEST_FORMAT, "compiler": toolchain.compiler, "version": toolchain.version,
                        "target": list(toolchain.target)}, indent=1) + "\n").encode()


def parse_manifest(data: bytes) -> Toolchain | None:
    """The toolchain ``toolchain.json`` names, if it is well formed and its flags are a portable CPU target
    (nothing ``native``: the CPU model is then no part of the libraries' names); None otherwise."""
    try:
        record = json.loads(data.decode()) if len(data) <= _MANIFEST_MAX_BYTES else None
    except (UnicodeDecodeError, ValueError):
        return None
    if not (isinstance(record, dict) and record.get("format") == MANIFEST_FORMAT
            and isinstance(record.get("compiler"), str) and record["compiler"]
            and isinstance(record.get("version"), str) and isinstance(record.get("target"), list)):
        return None
    try:
        target = Config._check_flags(record["target"], MANIFEST)
    except ValueError:
        return None
    if not target or targets_this_cpu(list(target)):
        return None
    return Toolchain(record["compiler"], record["version"], target, "")


def portable_toolchain(compiler: str) -> Toolchain | None:
    """The toolchain of the package's prebuilt libraries if they were built for a portable CPU target with the
    compiler command ``compiler`` (this process's), the lookup is on (:func:`enabled`) and the folder and its
    ``toolchain.json`` pass :class:`~ptnative.cache.PackagedDirectory`'s checks; None otherwise (then only a
    library named exactly for this process's toolchain is taken from the package)."""
    if not enabled():
        return None
    try:
        with packaged() as folder:
            fd, _ = folder.open_checked(MANIFEST)
            try:
                data = os.pread(fd, _MANIFEST_MAX_BYTES + 1, 0)
            finally:
                os.close(fd)
    except Missing:
        return None
    except Untrusted as e:
        log.warning("ignoring %s: it %s", prebuilt_dir() / MANIFEST, e)
        return None
    toolchain = parse_manifest(data)
    return toolchain if toolchain is not None and toolchain.compiler == compiler else None


def ships(name: str) -> bool:
    """Whether the package's prebuilt folder has an entry ``name`` (not yet checked: :meth:`read_verified` does)."""
    return os.path.lexists(prebuilt_dir() / name)


def count() -> int | None:
    """How many libraries the package ships (None without a prebuilt directory)."""
    try:
        with packaged() as d:
            return sum(1 for name in os.listdir(d.fd) if name.endswith(".so"))
    except Untrusted:
        return None


def _prune(dest: Path) -> int:
    """Keep only the libraries with their records (and ``toolchain.json``), readable by all and writable by none
    but the owner."""
    kept = 0
    for entry in list(dest.iterdir()):
        library = entry.name[:-len(RECORD_SUFFIX)] if entry.name.endswith(RECORD_SUFFIX) else entry.name
        if entry.name == MANIFEST and entry.is_file() and not entry.is_symlink():
            entry.chmod(0o644)
        elif library.endswith(".so") and (dest / library).is_file() and (dest / (library + RECORD_SUFFIX)).is_file() \
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
    try:
        target = " ".join(flags.target_flags())
    except ValueError as e:
        print(f"ptnative: no prebuilt libraries ({e}); the catalogue's kernels will compile on first use",
              file=sys.stderr)
        return 0
    print(f"ptnative: compiling the catalogue's CPU kernels (about 90 libraries, CPU target {target}) into the "
          "package: about 3 minutes on 2 cores (PTNATIVE_PREBUILD=0 skips this; they then compile on first use)",
          file=sys.stderr, flush=True)
    start = time.monotonic()
    dest.mkdir(mode=0o700, parents=True)
    env = dict(os.environ, PTNATIVE_CACHE_DIR=str(dest), PTNATIVE_PREBUILT="0")
    proc = subprocess.run([sys.executable, "-m", "ptnative", "build", "-j", str(args.jobs), "--progress", "lines",
                           "--toolchain-record", str(dest / MANIFEST)], env=env, stdout=sys.stderr)
    kept = _prune(dest)
    elapsed = time.monotonic() - start
    print(f"ptnative: {kept} prebuilt libraries in {dest}, built in {elapsed // 60:.0f} min {elapsed % 60:.0f} s"
          + ("" if proc.returncode == 0 else " (some failed to build: they will compile on first use)"),
          file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
