"""The driver of one op variant, as Python source that runs both as plain
Python (calling the entry point through ctypes) and under Numba (calling it
as an ``ExternalFunction``): one text, so both paths behave the same.

It makes ``need_contiguous`` inputs contiguous, checks int shape entries,
allocates the outputs (uninitialised: the entry point zeroes them; a
``want_inplace`` output starts as a copy of its input, or is the input itself
when the op destroys it), calls the entry point and raises ``ValueError`` / ``RuntimeError`` with the kernel's message.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..errors import FROM_KERNEL, KernelRuntimeError, KernelValueError
from ..source import MAX_NDIM, STATUS_VALUE


@dataclass(frozen=True)
class DriverSource:
    text: str
    function_name: str
    digest: str


def driver_source(op, float_dtype: str, device: str = "cpu", tuple_return: bool = True) -> DriverSource:
    """The driver's text; with ``tuple_return=False`` a single output is returned bare.
    Its globals: :data:`DRIVER_GLOBALS` and ``ext`` (the entry point)."""
    n_in, n_out = len(op.in_info), len(op.out_info)
    variant_symbol = op.variant(float_dtype, device).symbol
    args = [f"i{i}" for i in range(n_in)]
    lines = [f"def ptn_driver({', '.join(args)}):"]
    prefix = f"NativeOp {op.name!r}: "
    for i, info in enumerate(op.in_info):
        if info["ndim"] > 0 and (info.get("need_contiguous") or (device == "cuda" and not info.get("host_memory"))):
            lines.append(f"    i{i} = np.ascontiguousarray(i{i})")
        for d, s in enumerate(info.get("shape") or ()):
            if isinstance(s, int):
                msg = f"{prefix}input {info.get('name', i)!r} must have size {s} in dim {d}"
                lines.append(f"    if i{i}.shape[{d}] != {s}:")
                lines.append(f"        raise ValueError({msg!r})")  # static: Numba can raise it
    source_of = {info["want_inplace"]: i for i, info in enumerate(op.in_info) if info.get("want_inplace", -1) >= 0}
    for k, info in enumerate(op.out_info):
        if k in source_of:
            i = source_of[k]
            copy = f"np.ascontiguousarray(i{i})" if i in op.inplace else f"i{i}.copy()"
            lines.append(f"    o{k} = {copy}")
        else:
            dims = [str(s) if isinstance(s, int) else f"i{s[0]}.shape[{s[1]}]" for s in info["shape"]]
            shape = "(" + "".join(d + ", " for d in dims) + ")"
            dtype = op.array_dtype(info, float_dtype)
            lines.append(f"    o{k} = np.empty({shape}, dtype=np.{dtype})")  # zeroed by the entry point
    arrays = args + [f"o{k}" for k in range(n_out)]
    n = len(arrays)
    lines += [
        f"    data = np.zeros({n}, dtype=np.int64)",
        f"    shapes = np.zeros({n * MAX_NDIM}, dtype=np.int64)",
        f"    strides = np.zeros({n * MAX_NDIM}, dtype=np.int64)",
    ]
    infos = list(op.in_info) + list(op.out_info)
    for j, (a, info) in enumerate(zip(arrays, infos)):
        lines.append(f"    data[{j}] = {a}.ctypes.data")
        for d in range(info["ndim"]):
            lines.append(f"    shapes[{j * MAX_NDIM + d}] = {a}.shape[{d}]")
            lines.append(f"    strides[{j * MAX_NDIM + d}] = {a}.strides[{d}]")
    outs = ", ".join(f"o{k}" for k in range(n_out))
    lines += [
        "    status = ext(data.ctypes, shapes.ctypes, strides.ctypes, data.ctypes, 0)",
        f"    if status == {STATUS_VALUE}:",
        f"        raise KernelValueError(FROM_KERNEL, {op.name!r}, {variant_symbol!r})",
        "    if status != 0:",
        f"        raise KernelRuntimeError(FROM_KERNEL, {op.name!r}, {variant_symbol!r})",
        f"    return {outs}" + ("," if n_out == 1 and tuple_return else ""),
    ]
    text = "\n".join(lines) + "\n"
    return DriverSource(text, "ptn_driver", hashlib.sha256(text.encode()).hexdigest()[:16])


DRIVER_GLOBALS = {"np": np, "KernelValueError": KernelValueError, "KernelRuntimeError": KernelRuntimeError,
                  "FROM_KERNEL": FROM_KERNEL}
_python_drivers: dict[tuple[str, str], object] = {}


def python_driver(op, float_dtype: str, device: str = "cpu"):
    """The driver as a plain Python function calling the library through ctypes."""
    from ..build import load

    variant = op.variant(float_dtype, device)
    src = driver_source(op, float_dtype, device)
    key = (variant.symbol, src.digest)
    fn = _python_drivers.get(key)
    if fn is None:
        lib = load(variant)
        env = dict(DRIVER_GLOBALS, ext=lib.run)
        exec(compile(src.text, f"<ptnative driver {op.name}>", "exec"), env)
        fn = _python_drivers[key] = env[src.function_name]
    return fn
