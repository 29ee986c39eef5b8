"""Argument checks shared by the catalogue's functions."""

from __future__ import annotations

import numbers

import pytensor.tensor as pt
from pytensor.raise_op import CheckAndRaise


def int_size(name: str, value, minimum: int):
    """A Python int ``>= minimum`` (returned as int), or a symbolic integer scalar (returned as a tensor that
    raises ``ValueError`` when it is computed below ``minimum``).

    Raises ``ValueError`` for a too small int and ``TypeError`` for anything else."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
        return int(value)
    v = pt.as_tensor_variable(value)
    if v.ndim != 0 or not v.dtype.startswith(("int", "uint")):
        raise TypeError(f"{name} must be an int >= {minimum} or an integer scalar tensor, got {v.type}")
    return CheckAndRaise(ValueError, f"{name} must be >= {minimum}")(v, pt.ge(v, minimum))


def float_tensor(name: str, x, ndim: int):
    """``x`` as a float32/float64 tensor of ``ndim`` dimensions (``ValueError`` / ``TypeError`` otherwise)."""
    x = pt.as_tensor_variable(x)
    if x.ndim != ndim:
        raise ValueError(f"{name} must have ndim {ndim}, got {x.ndim} ({x.type})")
    if not x.dtype.startswith("float"):
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    return x
