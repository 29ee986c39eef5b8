"""The op catalogue as a list, for ``python -m ptnative build`` and ``info``."""

from __future__ import annotations

import inspect

from .op import NativeOpGenBase


def catalogue() -> list[type[NativeOpGenBase]]:
    """Every ``NativeOpGenBase`` spec (with kernel code) that a family of ``ptnative.ops.FAMILIES`` defines, in the
    families' order: the one list of families, which ``tests/test_ops_namespace.py`` ties to ``ptnative/ops/``."""
    from . import ops

    found = []
    for family in ops.FAMILIES:
        for _, obj in inspect.getmembers(family, inspect.isclass):
            if (issubclass(obj, NativeOpGenBase) and obj is not NativeOpGenBase and obj.__module__ == family.__name__
                    and obj.c_fw_code is not None and obj not in found):
                found.append(obj)
    return found


def variants(device: str = "cpu"):
    """(name, op, dtype) for every op of the catalogue and its gradient op, in float32 and float64."""
    for gen in catalogue():
        op = gen.make_op()
        ops = [op] + ([op.grad_op()] if op.c_bw_code else [])
        for o in ops:
            if device == "cpu" and not o.cpu_support:
                continue
            for dtype in o.float_dtypes:
                yield o.name, o, dtype
