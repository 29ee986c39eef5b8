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

The folder also holds ``toolchain.json``: the compiler command, its version and the CPU levels the libraries were
built for, best first, each with its target flags and the CPU features its code may use (one level with the
``PTNATIVE_CXXFLAGS`` of the build; ``make wheel`` sets ``PTNATIVE_PREBUILT_LEVELS=portable`` and builds every level
of :mod:`ptnative.cpu_levels` for the architecture: x86-64-v4, -v3 and -v2 on x86-64).  Libraries built for portable
levels (no ``native`` in the flags) are used on any machine whose user has set no CPU target of their own
(:func:`ptnative.build.resolve`), whatever compiler, if any, that machine has, as long as the compiler command
(``PTNATIVE_CXX``, ``CXX`` or ``g++``) is the one named there: each kernel from the best level whose features the
CPU has (:func:`portable_toolchains`), so the AVX-512 or AVX2 code of a kernel is chosen when it is loaded.

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
from . import cpu_levels, flags
from .cpu_levels import Level
from .flags import Toolchain, targets_this_cpu
from .settings import Config

__all__ = ["prebuilt_dir", "enabled", "packaged", "portable_toolchains", "ships", "main", "LEVELS_ENV"]

log = logging.getLogger("ptnative.prebuilt")

MANIFEST = "toolchain.json"
MANIFEST_FORMAT = 2
#: ``portable``: the prebuild step builds every level of :func:`ptnative.cpu_levels.levels_for` (``make wheel``).
LEVELS_ENV = "PTNATIVE_PREBUILT_LEVELS"
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


def manifest_data(compiler: str, version: str, levels) -> bytes:
    """``toolchain.json``'s content for libraries built by ``compiler`` (its ``--version`` text ``version``) for
    ``levels`` (:class:`ptnative.cpu_levels.Level`, best first)."""
    return (json.dumps({"format": MANIFEST_FORMAT, "compiler": compiler, "version": version,
                        "levels": [{"target": list(level.target), "requires": sorted(level.requires)}
                                   for level in levels]}, indent=1) + "\n").encode()


def _portable(target) -> tuple[str, ...] | None:
    try:
        checked = Config._check_flags(target, MANIFEST)
    except ValueError:
        return None
    return checked if checked and not targets_this_cpu(list(checked)) else None


def parse_manifest(data: bytes) -> list[tuple[Toolchain, frozenset[str]]] | None:
    """The levels ``toolchain.json`` names, best first, each as the toolchain its libraries are named for and the
    CPU features it requires, if the file is well formed and every level's flags are a portable CPU target
    (nothing ``native``: the CPU model is then no part of the libraries' names); None otherwise.  Format 1 (one
    ``target``, no features) is read as one level."""
    try:
        record = json.loads(data.decode()) if len(data) <= _MANIFEST_MAX_BYTES else None
    except (UnicodeDecodeError, ValueError):
        return None
    if not (isinstance(record, dict) and isinstance(record.get("compiler"), str) and record["compiler"]
            and isinstance(record.get("version"), str)):
        return None
    if record.get("format") == 1 and isinstance(record.get("target"), list):
        raw = [{"target": record["target"], "requires": []}]
    elif record.get("format") == MANIFEST_FORMAT and isinstance(record.get("levels"), list) and record["levels"]:
        raw = record["levels"]
    else:
        return None
    levels = []
    for level in raw:
        if not (isinstance(level, dict) and isinstance(level.get("target"), list)
                and isinstance(level.get("requires"), list) and all(isinstance(f, str) for f in level["requires"])):
            return None
        target = _portable(level["target"])
        if target is None:
            return None
        levels.append((Toolchain(record["compiler"], record["version"], target, ""), frozenset(level["requires"])))
    return levels


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """Logs ``message`` as a warning the first time in this process (the manifest is read at every library load)."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def portable_toolchains(compiler: str, features: frozenset[str] | None = None) -> list[Toolchain]:
    """The toolchains of the package's prebuilt libraries that this CPU runs (``features``, default
    :func:`ptnative.cpu_levels.cpu_features`), best first, if they were built for portable CPU levels with the
    compiler command ``compiler`` (this process's), the lookup is on (:func:`enabled`) and the folder and its
    ``toolchain.json`` pass :class:`~ptnative.cache.PackagedDirectory`'s checks; [] otherwise (then only a library
    named exactly for this process's toolchain is taken from the package)."""
    if not enabled():
        return []
    try:
        with packaged() as folder:
            fd, _ = folder.open_checked(MANIFEST)
            try:
                data = os.pread(fd, _MANIFEST_MAX_BYTES + 1, 0)
            finally:
                os.close(fd)
    except Missing:
        return []
    except Untrusted as e:
        _warn_once(f"ignoring {prebuilt_dir() / MANIFEST}: it {e}")
        return []
    levels = parse_manifest(data)
    if levels is None:
        _warn_once(f"ignoring {prebuilt_dir() / MANIFEST}: it is malformed or names a native CPU target")
        return []
    have = cpu_levels.cpu_features() if features is None else features
    return [toolchain for toolchain, requires in levels if toolchain.compiler == compiler and requires <= have]


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


def _levels_to_build() -> list[Level]:
    """The CPU levels the prebuild step builds: every portable level of this architecture where
    ``$PTNATIVE_PREBUILT_LEVELS`` is ``portable``, else the one CPU target in force (:func:`ptnative.flags.
    target_flags`: ``-march=native`` or the user's).  ValueError for bad flags or an architecture without levels."""
    if os.environ.get(LEVELS_ENV, "").strip().lower() == "portable":
        levels = list(cpu_levels.levels_for())
        if not levels:
            raise ValueError(f"{LEVELS_ENV}=portable: no portable CPU levels are known for this architecture "
                             "(set PTNATIVE_CXXFLAGS instead)")
        return levels
    return [Level(tuple(flags.target_flags()), frozenset())]


def main(argv: list[str] | None = None) -> int:
    """Build every CPU variant of the catalogue (and JAX mode's CPU handler where jax is importable) into ``DEST``
    (emptied first) with ``-j`` compilers at a time, once per CPU level (:func:`_levels_to_build`), and record the
    levels in ``toolchain.json``.  Returns 0 also when no compiler is found or some libraries fail (those compile
    on first use)."""
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
        levels = _levels_to_build()
    except ValueError as e:
        print(f"ptnative: no prebuilt libraries ({e}); the catalogue's kernels will compile on first use",
              file=sys.stderr)
        return 0
    targets = ", ".join(" ".join(level.target) for level in levels)
    print(f"ptnative: compiling the catalogue's CPU kernels (about 90 libraries per CPU target; "
          f"{'CPU target' if len(levels) == 1 else 'CPU targets'} {targets}) into the package: about "
          f"{3 * len(levels)} minutes on 2 cores (PTNATIVE_PREBUILD=0 skips this; they then compile on first use)",
          file=sys.stderr, flush=True)
    start = time.monotonic()
    dest.mkdir(mode=0o700, parents=True)
    failed = False
    built: list[Level] = []
    toolchain: tuple[str, str] | None = None
    for i, level in enumerate(levels):
        record = dest / f".level-{i}.json"
        env = dict(os.environ, PTNATIVE_CACHE_DIR=str(dest), PTNATIVE_PREBUILT="0",
                   PTNATIVE_CXXFLAGS=" ".join(level.target))
        proc = subprocess.run([sys.executable, "-m", "ptnative", "build", "-j", str(args.jobs), "--progress",
                               "lines", "--toolchain-record", str(record)], env=env, stdout=sys.stderr)
        failed |= proc.returncode != 0
        if record.is_file():  # the build's own record: its compiler and version
            recorded = json.loads(record.read_text())
            record.unlink()
            built.append(level)
            toolchain = toolchain or (recorded["compiler"], recorded["version"])
    if toolchain is not None:
        (dest / MANIFEST).write_bytes(manifest_data(*toolchain, built))
    kept = _prune(dest)
    elapsed = time.monotonic() - start
    print(f"ptnative: {kept} prebuilt libraries in {dest}, built in {elapsed // 60:.0f} min {elapsed % 60:.0f} s"
          + ("" if not failed else " (some failed to build: they will compile on first use)"),
          file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
