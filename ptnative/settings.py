"""Run-time settings: ``ptnative.config.device`` and ``ptnative.config.numba_graph_cache``."""

from __future__ import annotations

import os

DEVICES = ("cpu", "cuda", "auto")


class Config:
    """``device``: where native ops run — ``"cpu"``, ``"cuda"`` or ``"auto"`` (the default: the GPU
    when a CUDA driver and device are present and the op supports it, else the CPU).  The
    environment variable ``PTNATIVE_DEVICE`` sets the default; an op's own ``device`` overrides it.
    The choice is made when a function is compiled."""

    def __init__(self):
        self._device = None
        self._numba_graph_cache = None

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


config = Config()
