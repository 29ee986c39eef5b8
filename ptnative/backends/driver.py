"""The driver of one op variant, as Python source that runs both as plain
Python (calling the entry point through ctypes) and under Numba (calling it
as an ``ExternalFunction``): one text, so both paths behave the same.

It is two functions.  ``ptn_run`` makes ``need_contiguous`` inputs contiguous,
allocates the outputs (uninitialised: the entry point zeroes them; a
``want_inplace`` output starts as a copy of its input, or is the input itself
when the op destroys it), calls the entry point and returns its status with the
outputs; it never raises.  ``ptn_driver`` checks int shape entries, calls
``ptn_run`` and raises :class:`~ptnative.KernelValueError` /
:class:`~ptnative.KernelRuntimeError` with the kernel's message.

Every ``raise`` is in ``ptn_driver``, whose only arrays are ``ptn_run``'s
results, because Numba releases a frame's references before a ``raise``
written in that frame, but not when an exception comes back from a call
(numba/numba#1549): the Numba backend inlines ``ptn_driver`` into PyTensor's
graph function (see :mod:`ptnative.backends.numba`) so that a failing call
releases everything the graph holds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..errors import FROM_KERNEL, KernelRuntimeError, KernelValueError
from ..source import MAX_NDIM, STATUS_VALUE


@dataclass(frozen=True)
class DriverSource:
    run_text: str  # def ptn_run(i0, ...): -> (status, o0, ...)
    driver_text: str  # def ptn_driver(i0, ...): -> the outputs; calls ptn_run
    digest: str
    function_name: str = "ptn_driver"
    run_name: str = "ptn_run"

    @property
    def text(self) -> str:
        """Both functions, for one namespace."""
        return self.run_text + "\n" + self.driver_text


def driver_source(op, float_dtype: str, device: str = "cpu", tuple_return: bool = True) -> DriverSource:
    """The driver's text; with ``tuple_return=False`` a single output is returned bare.
    Its globals: :data:`DRIVER_GLOBALS` and ``ext`` (the entry point); ``ptn_driver``'s also ``ptn_run``."""
    n_in, n_out = len(op.in_info), len(op.out_info)
    variant_symbol = op.variant(float_dtype, device).symbol
    args = ", ".join(f"i{i}" for i in range(n_in))
    arrays = [f"i{i}" for i in range(n_in)] + [f"o{k}" for k in range(n_out)]
    outs = ", ".join(f"o{k}" for k in range(n_out))
    run = [f"def ptn_run({args}):"]
    driver = [f"def ptn_driver({args}):"]
    prefix = f"NativeOp {op.name!r}: "
    for i, info in enumerate(op.in_info):
        if info["ndim"] > 0 and (info.get("need_contiguous") or (device == "cuda" and not info.get("host_memory"))):
            run.append(f"    i{i} = np.ascontiguousarray(i{i})")
        for d, s in enumerate(info.get("shape") or ()):
            if isinstance(s, int):
                msg = f"{prefix}input {info.get('name', i)!r} must have size {s} in dim {d}"
                driver.append(f"    if i{i}.shape[{d}] != {s}:")
                driver.append(f"        raise ValueError({msg!r})")  # static: Numba can raise it
    source_of = {info["want_inplace"]: i for i, info in enumerate(op.in_info) if info.get("want_inplace", -1) >= 0}
    for k, info in enumerate(op.out_info):
        if k in source_of:
            i = source_of[k]
            copy = f"np.ascontiguousarray(i{i})" if i in op.inplace else f"i{i}.copy()"
            run.append(f"    o{k} = {copy}")
        else:
            dims = [str(s) if isinstance(s, int) else f"i{s[0]}.shape[{s[1]}]" for s in info["shape"]]
            shape = "(" + "".join(d + ", " for d in dims) + ")"
            dtype = op.array_dtype(info, float_dtype)
            run.append(f"    o{k} = np.empty({shape}, dtype=np.{dtype})")  # zeroed by the entry point
    n = len(arrays)
    run += [
        f"    data = np.zeros({n}, dtype=np.int64)",
        f"    shapes = np.zeros({n * MAX_NDIM}, dtype=np.int64)",
        f"    strides = np.zeros({n * MAX_NDIM}, dtype=np.int64)",
    ]
    infos = list(op.in_info) + list(op.out_info)
    for j, (a, info) in enumerate(zip(arrays, infos)):
        run.append(f"    data[{j}] = {a}.ctypes.data")
        for d in range(info["ndim"]):
            run.append(f"    shapes[{j * MAX_NDIM + d}] = {a}.shape[{d}]")
            run.append(f"    strides[{j * MAX_NDIM + d}] = {a}.strides[{d}]")
    run += [
        "    status = ext(data.ctypes, shapes.ctypes, strides.ctypes, data.ctypes, 0)",
        f"    return status, {outs}",
    ]
    driver += [
        f"    status, {outs} = ptn_run({args})",
        f"    if status == {STATUS_VALUE}:",
        f"        raise KernelValueError(FROM_KERNEL, {op.name!r}, {variant_symbol!r})",
        "    if status != 0:",
        f"        raise KernelRuntimeError(FROM_KERNEL, {op.name!r}, {variant_symbol!r})",
        f"    return {outs}" + ("," if n_out == 1 and tuple_return else ""),
    ]
    run_text, driver_text = "\n".join(run) + "\n", "\n".join(driver) + "\n"
    digest = hashlib.sha256(f"{run_text}\0{driver_text}".encode()).hexdigest()[:16]
    return DriverSource(run_text, driver_text, digest)


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
