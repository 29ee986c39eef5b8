"""The portable CPU levels a wheel's kernels are built for, and which of them this CPU runs.

A wheel (``make wheel``) ships each catalogue library once per level of its architecture, best first (x86-64:
``x86-64-v4`` with AVX-512, ``x86-64-v3`` with AVX2 and FMA, ``x86-64-v2``; aarch64: ``armv8.2-a``, ``armv8-a``),
and a process takes the best level whose instructions its CPU has (:func:`runs`), so the vector code of a kernel is
chosen at run time, per machine.  Every aarch64 CPU runs some level; an x86-64 CPU without SSE4.2 (made before
about 2009) runs none and compiles its kernels itself, as a from-source install does.  A level's ``requires`` are CPU
feature names as Linux spells them in ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on arm); the features of
this CPU come from there, or on macOS from ``sysctl`` (:func:`cpu_features`).

Imports nothing of ptnative.
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass
from functools import cache

__all__ = ["Level", "LEVELS", "levels_for", "cpu_features", "parse_cpuinfo", "parse_sysctl_features", "runs"]


@dataclass(frozen=True)
class Level:
    """A CPU target for prebuilt libraries: the compiler flags and the CPU features its code may use."""

    target: tuple[str, ...]
    requires: frozenset[str]


def _level(march: str, *features: str) -> Level:
    return Level((f"-march={march}",), frozenset(features))


_X86_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_X86_V3 = _X86_V2 + ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_X86_V4 = _X86_V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")

#: The levels per architecture (``platform.machine()``), best first.
LEVELS: dict[str, tuple[Level, ...]] = {
    "x86_64": (_level("x86-64-v4", *_X86_V4), _level("x86-64-v3", *_X86_V3), _level("x86-64-v2", *_X86_V2)),
    "aarch64": (_level("armv8.2-a", "atomics", "asimdrdm", "dcpop"), _level("armv8-a")),
}
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def levels_for(machine: str | None = None) -> tuple[Level, ...]:
    """The levels of ``machine`` (default: this one), best first; () where none is known."""
    machine = platform.machine() if machine is None else machine
    return LEVELS.get(_ALIASES.get(machine.lower(), machine.lower()), ())


def parse_cpuinfo(text: str) -> frozenset[str]:
    """The features in ``/proc/cpuinfo``'s first ``flags`` (x86) or ``Features`` (arm) line."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


# macOS's names (sysctl machdep.cpu.features / leaf7_features, upper case) where Linux says otherwise.
_SYSCTL_NAMES = {"avx1.0": "avx", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "lahf": "lahf_lm", "lzcnt": "abm",
                 "cx16": "cx16", "avx512f": "avx512f"}


def parse_sysctl_features(text: str) -> frozenset[str]:
    """The features in macOS's ``sysctl -n machdep.cpu.features machdep.cpu.leaf7_features
    machdep.cpu.extfeatures`` output, in Linux's names."""
    return frozenset(_SYSCTL_NAMES.get(name, name) for name in text.lower().split())


@cache
def cpu_features() -> frozenset[str]:
    """This CPU's features in Linux's names: ``/proc/cpuinfo`` on Linux; ``sysctl`` on an Intel Mac; on Apple
    silicon every feature of the aarch64 levels (all its CPUs are armv8.4-a or later); elsewhere none (then only a
    level that requires nothing is taken)."""
    try:
        with open("/proc/cpuinfo") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        pass
    if platform.system() == "Darwin":
        if platform.machine() in ("arm64", "aarch64"):
            return frozenset().union(*(level.requires for level in LEVELS["aarch64"]))
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features",
                                  "machdep.cpu.extfeatures"], capture_output=True, text=True, timeout=30)
            return parse_sysctl_features(out.stdout)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return frozenset()


def runs(level: Level, features: frozenset[str] | None = None) -> bool:
    """Whether a CPU with ``features`` (default: this one's) has every instruction ``level`` may use."""
    return level.requires <= (cpu_features() if features is None else features)
