"""Which flags the C++ compiler gets for a CPU library, on this platform and as the user asked.

* The CPU target: ``-march=native`` by default (``-mcpu=native`` for clang on Apple silicon), replaced by the
  user's flags when set (``$PTNATIVE_CXXFLAGS`` or ``ptnative.config.cxxflags``, e.g. ``-march=x86-64-v3`` for a
  wheel or a cluster of mixed CPUs).  The user's flags take the place of the default one in the command, after
  the optimisation level, so ``-O2`` there wins over ptnative's ``-O3``.
* The shared-library flags: on Linux (and other systems whose linker is GNU ld or lld) ``-shared`` and
  ``-Wl,-Bsymbolic``; on macOS ``-dynamiclib`` and no ``-Bsymbolic`` (Apple's linker has none: its two-level
  namespace already binds a library's own symbols to itself).  No ``-undefined dynamic_lookup``: the kernel
  libraries refer to no Python symbol (``tests/test_flags.py`` checks a built one).

A module of its own, importing nothing of ptnative but the settings, so that the build and the prebuilt step ask
the same place.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from .settings import config

__all__ = ["NATIVE", "Toolchain", "default_target", "target_flags", "user_set", "for_platform", "targets_this_cpu"]

#: The default CPU target, the placeholder in ``ptnative.build.CXX_FLAGS`` that :func:`for_platform` replaces.
NATIVE = "-march=native"


def default_target(system: str | None = None, machine: str | None = None) -> list[str]:
    """The CPU target when the user sets none: this CPU.  Apple's clang on arm64 takes ``-mcpu=native``, not
    ``-march=native`` (never built nor run here: docs/install.md, "Platforms")."""
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    if system == "Darwin" and machine in ("arm64", "aarch64"):
        return ["-mcpu=native"]
    return [NATIVE]


def user_set() -> bool:
    """Whether the user set the CPU target (``ptnative.config.cxxflags`` or ``$PTNATIVE_CXXFLAGS``)."""
    return config.cxxflags is not None


def target_flags() -> list[str]:
    """The CPU target flags in force: the user's, else :func:`default_target`."""
    flags = config.cxxflags
    return list(flags) if flags is not None else default_target()


def for_platform(template: list[str], target: list[str], system: str | None = None) -> list[str]:
    """``template`` (``ptnative.build.CXX_FLAGS``) with :data:`NATIVE` replaced by ``target`` and the
    shared-library flags of ``system`` (default: this one).  On Linux with the default target the result is
    ``template`` itself, flag for flag."""
    system = platform.system() if system is None else system
    out = []
    for flag in template:
        if flag == NATIVE:
            out.extend(target)
        elif system == "Darwin" and flag == "-shared":
            out.append("-dynamiclib")
        elif system == "Darwin" and flag == "-Wl,-Bsymbolic":
            continue  # GNU ld and lld only
        else:
            out.append(flag)
    return out


def targets_this_cpu(flags: list[str]) -> bool:
    """Whether ``flags`` ask for this machine's CPU (``-march=native``, ``-mcpu=native``, ``-mtune=native``): then a
    library's name also hashes the CPU model, and it is never used on another CPU."""
    return any(flag.startswith(("-march=", "-mcpu=", "-mtune=")) and flag.split("=", 1)[1] == "native"
               for flag in flags)


@dataclass(frozen=True)
class Toolchain:
    """What a CPU library's name hashes besides its source: the compiler command as configured (``g++``), its
    ``--version`` text, the CPU target flags, and the CPU model when those flags target this CPU ("" otherwise,
    so that a library built for a portable target has the same name on every machine)."""

    compiler: str
    version: str
    target: tuple[str, ...]
    cpu: str
