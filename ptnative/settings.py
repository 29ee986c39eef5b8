"""Run-time settings: ``ptnative.config.device``, ``ptnative.config.numba_graph_cache``,
``ptnative.config.allow_tf32`` and ``ptnative.config.cxxflags``."""

from __future__ import annotations

import os
import shlex

DEVICES = ("cpu", "cuda", "auto")


class Config:
    """``device``: where native ops run — ``"cpu"``, ``"cuda"`` or ``"auto"`` (the default: the GPU
    when a CUDA driver and device are present and the op supports it, else the CPU).  The
    environment variable ``PTNATIVE_DEVICE`` sets the default; an op's own ``device`` overrides it.
    The choice is made when a function is compiled."""

    def __init__(self):
        self._device = None
        self._numba_graph_cache = None
        self._cxxflags = None

    @staticmethod
    def _check(value: str) -> str:
        if value not in DEVICES:
            raise ValueError(f"ptnative: device must be one of {DEVICES}, got {value!r}")
        return value

    @property
    def device(self) -> str:
        if self._device is not None:
            return self._device
        return self._check(os.environ.get("PTNATIVE_DEVICE", "auto").strip().lower() or "auto")

    @device.setter
    def device(self, value: str | None) -> None:
        self._device = None if value is None else self._check(value)

    @property
    def numba_graph_cache(self) -> bool:
        """Default (Numba) mode: give native ops a cache key, so PyTensor reuses compiled graphs across
        processes.  Off by default (``PTNATIVE_NUMBA_GRAPH_CACHE=1`` turns it on): with it, every call that
        fails in a kernel pins the arrays the compiled graph holds at that moment for the rest of the
        process (numba/numba#1549); without it, a graph holding a native op is compiled in each process.
        Read when a function is compiled."""
        if self._numba_graph_cache is not None:
            return self._numba_graph_cache
        return os.environ.get("PTNATIVE_NUMBA_GRAPH_CACHE", "").strip().lower() in ("1", "true", "yes", "on")

    @numba_graph_cache.setter
    def numba_graph_cache(self, value: bool | None) -> None:
        self._numba_graph_cache = None if value is None else bool(value)

    @property
    def allow_tf32(self) -> bool:
        """CUDA: float32 matrix products (cuBLAS, e.g. the LSTMs' recurrent products) on TF32 tensor cores, as
        torch's ``torch.backends.cudnn.allow_tf32`` (on by default, as there).  Kept in the environment variable
        ``PTNATIVE_ALLOW_TF32`` (``0``: strict float32), which the kernels read at every product."""
        return os.environ.get("PTNATIVE_ALLOW_TF32", "") != "0"

    @allow_tf32.setter
    def allow_tf32(self, value: bool | None) -> None:
        if value is None:
            os.environ.pop("PTNATIVE_ALLOW_TF32", None)
        else:
            os.environ["PTNATIVE_ALLOW_TF32"] = "1" if value else "0"

    @staticmethod
    def _check_flags(value, source: str) -> tuple[str, ...] | None:
        """``value`` (a string, split as a shell would, or a sequence of strings) as a tuple of flags; None when
        empty.  ValueError (naming ``source``) unless every item is a compiler option (starts with ``-``, no NUL)
        other than ``-o``, which would redirect the library."""
        if isinstance(value, str):
            try:
                value = shlex.split(value)
            except ValueError as e:
                raise ValueError(f"ptnative: {source} cannot be split into flags ({e}): {value!r}") from None
        if not isinstance(value, (list, tuple)) or not all(isinstance(f, str) for f in value):
            raise ValueError(f"ptnative: {source} must be a string or a list of strings, got {value!r}")
        for flag in value:
            if not flag.startswith("-") or "\0" in flag or flag.startswith("-o"):
                raise ValueError(f"ptnative: {source} may hold only compiler options (each starting with '-', "
                                 f"not -o), got {flag!r} in {value!r}")
        return tuple(value) or None

    @property
    def cxxflags(self) -> tuple[str, ...] | None:
        """The CPU target flags of every CPU library ptnative compiles, in place of ``-march=native`` (e.g.
        ``"-march=x86-64-v3"`` for a wheel or a cluster of mixed CPUs); None (the default) keeps ``-march=native``
        and lets the package's prebuilt libraries be used.  ``PTNATIVE_CXXFLAGS`` sets the default (split as a
        shell would; empty means unset).  Part of each library's name, so changing it never loads a library
        built with other flags.  Read when a library is looked up (docs/install.md, "Compiler flags")."""
        if self._cxxflags is not None:
            return self._cxxflags
        return self._check_flags(os.environ.get("PTNATIVE_CXXFLAGS", ""), "PTNATIVE_CXXFLAGS")

    @cxxflags.setter
    def cxxflags(self, value) -> None:
        self._cxxflags = None if value is None else self._check_flags(value, "ptnative.config.cxxflags")


config = Config()
