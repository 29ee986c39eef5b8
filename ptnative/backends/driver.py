"""The driver of one op variant, as Python source that runs both as plain
Python (calling the entry point through ctypes) and under Numba (calling it
as an ``ExternalFunction``): one text, so both paths behave the same.

It is two functions.  ``ptn_run`` makes ``need_contiguous`` inputs contiguous,
allocates the outputs (uninitialised: the entry point zeroes those not ``fully_written``; a
``want_inplace`` output starts as a copy of its input, or is the input itself
when the op destroys it), calls the entry point with every array's rank and element type and returns its status
with the outputs; it never raises.  The entry point checks the arguments (ranks, types, the fixed sizes of the
spec: ``ptn::check_arguments``, the same check in every mode).  ``ptn_driver`` calls ``ptn_run`` and raises
:class:`~ptnative.KernelValueError` / :class:`~ptnative.KernelRuntimeError` with the kernel's message.

Every ``raise`` is in ``ptn_driver``, whose only arrays are ``ptn_run``'s
results, because Numba releases a frame's references before a ``raise``
written in that frame, but not when an exception comes back from a call
(numba/numba#1549): the Numba backend inlines ``ptn_driver`` into PyTensor's
graph function (see :mod:`ptnative.backends.numba`) so that a failing call
releases everything the graph holds.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass

import numpy as np

from ..build import load
from ..errors import FROM_KERNEL, KernelRuntimeError, KernelValueError
from ..op import register_glue
from ..plan import dtype_code
from ..source import MAX_NDIM, STATUS_VALUE, Variant


def array_type_code(a) -> int:
    """``a``'s element type as the entry point's ABI names it (:func:`ptnative.plan.dtype_code`); under Numba a
    constant of the array's type (:mod:`ptnative.backends.numba` overloads it)."""
    return dtype_code(a.dtype)


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


def driver_source(variant: Variant, inplace: tuple[int, ...] = (), tuple_return: bool = True) -> DriverSource:
    """The driver of ``variant`` (its argument plan, :class:`ptnative.plan.ArgumentPlan`, written as Python) for an
    op destroying the inputs ``inplace``; with ``tuple_return=False`` a single output is returned bare.  Its
    globals: :data:`DRIVER_GLOBALS` and ``ext`` (the entry point); ``ptn_driver``'s also ``ptn_run``."""
    plan = variant.plan
    n_in, n_out = plan.n_in, plan.n_out
    args = ", ".join(f"i{i}" for i in range(n_in))
    arrays = [f"i{i}" for i in range(n_in)] + [f"o{k}" for k in range(n_out)]
    outs = ", ".join(f"o{k}" for k in range(n_out))
    run = [f"def ptn_run({args}):"]
    driver = [f"def ptn_driver({args}):"]
    run += [f"    i{i} = np.ascontiguousarray(i{i})" for i in range(n_in) if plan.contiguous[i]]
    destroys = plan.destroys(inplace)
    for k, (i, shape, dtype) in enumerate(zip(plan.source_of, plan.out_shapes, plan.out_dtypes)):
        if i >= 0:
            run.append(f"    o{k} = " + (f"np.ascontiguousarray(i{i})" if destroys[k] else f"i{i}.copy()"))
        else:
            dims = [str(s) if isinstance(s, int) else f"i{s[0]}.shape[{s[1]}]" for s in shape]
            run.append(f"    o{k} = np.empty(({''.join(d + ', ' for d in dims)}), dtype=np.{dtype})")  # zeroed by ext
    n = len(arrays)
    run += [  # one block (one allocation) for the four arrays of the entry point; types: 2 int32 per array
        f"    block = np.zeros({2 * n + 2 * n * MAX_NDIM}, dtype=np.int64)",
        f"    data = block[:{n}]",
        f"    types = block[{n}:{2 * n}].view(np.int32)",
        f"    shapes = block[{2 * n}:{2 * n + n * MAX_NDIM}]",
        f"    strides = block[{2 * n + n * MAX_NDIM}:]",
    ]
    for j, (a, ndim) in enumerate(zip(arrays, plan.ndims)):
        run.append(f"    data[{j}] = {a}.ctypes.data")
        run.append(f"    types[{2 * j}] = {a}.ndim")
        run.append(f"    types[{2 * j + 1}] = array_type_code({a})")
        for d in range(ndim):
            run.append(f"    shapes[{j * MAX_NDIM + d}] = {a}.shape[{d}]")
            run.append(f"    strides[{j * MAX_NDIM + d}] = {a}.strides[{d}]")
    run += [
        "    status = ext(data.ctypes, types.ctypes, shapes.ctypes, strides.ctypes, data.ctypes, 0)",
        f"    return status, {outs}",
    ]
    driver += [
        f"    status, {outs} = ptn_run({args})",
        f"    if status == {STATUS_VALUE}:",
        f"        raise KernelValueError(FROM_KERNEL, {plan.name!r}, {variant.symbol!r})",
        "    if status != 0:",
        f"        raise KernelRuntimeError(FROM_KERNEL, {plan.name!r}, {variant.symbol!r})",
        f"    return {outs}" + ("," if n_out == 1 and tuple_return else ""),
    ]
    run_text, driver_text = "\n".join(run) + "\n", "\n".join(driver) + "\n"
    digest = hashlib.sha256(f"{run_text}\0{driver_text}".encode()).hexdigest()[:16]
    return DriverSource(run_text, driver_text, digest)


DRIVER_GLOBALS = {"np": np, "KernelValueError": KernelValueError, "KernelRuntimeError": KernelRuntimeError,
                  "FROM_KERNEL": FROM_KERNEL, "array_type_code": array_type_code}
#: The Python drivers made in this process, by (variant, destroyed inputs).
_python_drivers: dict[tuple[Variant, tuple[int, ...]], object] = {}


def variant_driver(variant: Variant, inplace: tuple[int, ...] = ()):
    """``variant``'s driver as a plain Python function calling its library through ctypes (made once)."""
    key = (variant, inplace)
    fn = _python_drivers.get(key)
    if fn is None:
        src = driver_source(variant, inplace)
        env = dict(DRIVER_GLOBALS, ext=load(variant).run)
        exec(compile(src.text, f"<ptnative driver {variant.plan.name}>", "exec"), env)
        fn = _python_drivers[key] = env[src.function_name]
    return fn


def python_driver(op, float_dtype: str, device: str = "cpu"):
    """The driver of ``op``'s variant (``float_dtype``, ``device``) as a plain Python function."""
    return variant_driver(op.variant(float_dtype, device), op.inplace)


def perform(op, node, inputs, output_storage) -> None:
    """``NativeOp.perform``: run ``node`` through its Python driver (Python mode, FAST_COMPILE, constant
    folding)."""
    results = variant_driver(op.node_variant(node), op.inplace)(*inputs)
    for storage, value in zip(output_storage, results):
        storage[0] = value


register_glue("python", sys.modules[__name__])
