"""Run-time settings: ``ptnative.config.device``."""

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


config = Config()
