"""Argument checks shared by every op family's functions, and the spec-entry vocabulary of their ops.

One rule for every catalogue function (``fn`` is its name, ``name`` the argument's):

* not convertible to a tensor -> ``TypeError("fn: name must be <kind>, got <python type>")``;
* a wrong number of dimensions -> ``ValueError("fn: name must have ndim N, got M (<type>)")``;
* a wrong kind of dtype -> ``TypeError("fn: name must have <kind> dtype, got <dtype>")``: an integer
  argument (labels, lengths, indices, counts) takes int/uint dtypes and refuses ``bool``; a flag or a
  mask takes bool too;
* a Python number out of range -> ``ValueError("fn: name must be >= m, got v")`` (and the like);
* a symbolic size out of range -> ``ValueError("fn: name must be >= m")`` when the graph runs.

Integer tensors are cast to int32 (the kernels' index type); a Python int must then fit in int32.

Every family writes its ops' ``in_info`` / ``out_info`` with the same few words: :func:`input_entry`,
:func:`output_entry`, :func:`hidden_output`, :func:`host_int32_scalar` and :func:`dims_of`.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import pytensor.tensor as pt
from pytensor.raise_op import CheckAndRaise

__all__ = ["tensor", "int_tensor", "float_tensor", "real_tensor", "int32_scalar", "flag", "int_size",
           "python_int", "real_number", "input_entry", "output_entry", "hidden_output", "host_int32_scalar", "dims_of"]

_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1


def _is_python_int(value) -> bool:
    """A Python or NumPy integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _ndims_text(ndim) -> str:
    if isinstance(ndim, int):
        return str(ndim)
    return " or ".join(str(n) for n in ndim)


def tensor(fn: str, name: str, x, ndim, kind: str = "a tensor", layout: str = ""):
    """``x`` as a tensor variable with ``ndim`` dimensions (an int, a tuple of allowed ints, or None: any).

    ``kind`` words the ``TypeError`` when ``x`` is not array-like; ``layout`` (e.g. ``"(B, T, D)"``)
    follows the expected ndim in the ``ValueError`` for a wrong ndim."""
    try:
        v = pt.as_tensor_variable(x)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise TypeError(f"{fn}: {name} must be {kind}, got {type(x).__name__} {x!r:.60}") from e
    if ndim is not None and v.ndim not in ((ndim,) if isinstance(ndim, int) else tuple(ndim)):
        shape = f" {layout}" if layout else ""
        raise ValueError(f"{fn}: {name} must have ndim {_ndims_text(ndim)}{shape}, got {v.ndim} ({v.type})")
    return v


def int_tensor(fn: str, name: str, x, ndim, allow_bool: bool = False, layout: str = ""):
    """``x`` as an int32 tensor of ``ndim`` dimensions (other integer dtypes are cast).

    ``ValueError`` for a wrong ndim; ``TypeError`` for a dtype that is not an integer one (``bool``
    included unless ``allow_bool``, for 0/1 flags) or for a value that is not array-like."""
    v = tensor(fn, name, x, ndim, "an integer tensor", layout)
    if not (v.dtype.startswith(("int", "uint")) or (allow_bool and v.dtype == "bool")):
        kinds = "an integer or bool" if allow_bool else "an integer"
        raise TypeError(f"{fn}: {name} must have {kinds} dtype, got {v.dtype}")
    return v if v.dtype == "int32" else pt.cast(v, "int32")


def float_tensor(fn: str, name: str, x, ndim, layout: str = "", cast_int: bool = False):
    """``x`` as a floating tensor of ``ndim`` dimensions, dtype unchanged (the ops compute in float32 or
    float64); with ``cast_int``, integer and bool tensors are accepted and cast to float64.

    ``ValueError`` for a wrong ndim, ``TypeError`` for any other dtype."""
    v = tensor(fn, name, x, ndim, "a float tensor", layout)
    if v.dtype.startswith("float"):
        return v
    if cast_int and (v.dtype.startswith(("int", "uint")) or v.dtype == "bool"):
        return pt.cast(v, "float64")
    kinds = "a real or bool dtype" if cast_int else "a float dtype (float32 or float64)"
    raise TypeError(f"{fn}: {name} must have {kinds}, got {v.dtype}")


def real_tensor(fn: str, name: str, x, ndim, dtype: str | None = None, layout: str = ""):
    """An index, mask or weight array of any real or bool dtype, cast to ``dtype`` (None: kept).

    ``ValueError`` for a wrong ndim, ``TypeError`` for a complex (or non-numeric) dtype."""
    v = tensor(fn, name, x, ndim, "a real tensor", layout)
    if not (v.dtype.startswith(("float", "int", "uint")) or v.dtype == "bool"):
        raise TypeError(f"{fn}: {name} must have a real or bool dtype, got {v.dtype}")
    return v if dtype is None or v.dtype == dtype else pt.cast(v, dtype)


def python_int(fn: str, name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """A Python/NumPy int (not a bool) in ``[minimum, maximum]``, returned as ``int``.

    ``TypeError`` for anything else, ``ValueError`` outside the range."""
    if not _is_python_int(value):
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__} {value!r:.60}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{fn}: {name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{fn}: {name} must be <= {maximum}, got {value}")
    return value


def real_number(fn: str, name: str, value, minimum: float | None = None) -> float:
    """A finite Python/NumPy real (not a bool) ``>= minimum``, returned as ``float``.

    ``TypeError`` for anything else, ``ValueError`` for NaN, inf or a value below ``minimum``."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(value).__name__} {value!r:.60}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{fn}: {name} must be finite, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{fn}: {name} must be >= {minimum}, got {value}")
    return value


def int32_scalar(fn: str, name: str, value):
    """An int32 scalar tensor from a Python int (which must fit in int32: else ``ValueError``) or an
    integer scalar tensor (``ValueError`` for ndim != 0, ``TypeError`` for a non-integer dtype)."""
    if _is_python_int(value):
        return pt.constant(np.int32(python_int(fn, name, value, _INT32_MIN, _INT32_MAX)))
    return int_tensor(fn, name, value, 0)


def flag(fn: str, name: str, value):
    """A 0/1 int32 scalar tensor: a Python bool or int (nonzero is true), or a real or bool scalar tensor
    (compared with 0 when the graph runs).  ``ValueError`` for ndim != 0, ``TypeError`` for a complex
    or non-numeric value."""
    if isinstance(value, bool | np.bool_) or _is_python_int(value):
        return pt.constant(np.int32(bool(value)))
    return pt.cast(pt.neq(real_tensor(fn, name, value, 0), 0), "int32")


def int_size(fn: str, name: str, value, minimum: int):
    """A Python int ``>= minimum`` (returned as int), or a symbolic integer scalar (returned as a tensor
    that raises ``ValueError`` when it is computed below ``minimum``).

    ``ValueError`` for a too small int or a tensor of ndim != 0, ``TypeError`` for anything else."""
    if _is_python_int(value):
        return python_int(fn, name, value, minimum)
    if isinstance(value, bool | np.bool_ | numbers.Number):
        raise TypeError(f"{fn}: {name} must be an int >= {minimum} or an integer scalar tensor, "
                        f"got {type(value).__name__} {value!r}")
    v = tensor(fn, name, value, 0, f"an int >= {minimum} or an integer scalar tensor")
    if not v.dtype.startswith(("int", "uint")):
        raise TypeError(f"{fn}: {name} must have an integer dtype, got {v.dtype}")
    return CheckAndRaise(ValueError, f"{fn}: {name} must be >= {minimum}")(v, pt.ge(v, minimum))


# ------------------------------------------------------------------------------------------ spec entries
#: The ``fully_written`` flag of an entry (or of an input's ``bw_out_var``, for its gradient): the kernel writes every
#: element of the output, padded and unvisited frames included, so the entry point does not zero it first.
WRITTEN = {"fully_written": True}


def input_entry(name: str, ndim: int, *, shape=None, dtype: str | None = None, differentiable: bool = False,
                contiguous: bool = True, batch_axis: int | None = None, **keys) -> dict:
    """The ``in_info`` entry of input ``name``: ``ndim`` dimensions, of any size unless ``shape`` says (per
    dimension a size, ``None`` or a ref ``(input, dim)``); of the exact ``dtype`` if given, else the op's floating
    type; made C-contiguous unless ``contiguous=False``; without a gradient unless ``differentiable``; its
    sequences along ``batch_axis`` if given (docs/scaling.md).  ``keys``: any other spec key (``want_inplace``,
    ``host_memory``, ``bw_out_var``, ...), as is."""
    info = {"name": name, "ndim": ndim, "shape": shape if shape is not None else (None,) * ndim}
    if dtype is not None:
        info["dtype"] = dtype
    if contiguous:
        info["need_contiguous"] = True
    if not differentiable:
        info["gradient"] = "disconnected"
    if batch_axis is not None:
        info["batch_axis"] = batch_axis
    info.update(keys)
    return info


def output_entry(name: str, shape, *, dtype: str | None = None, contiguous: bool = True,
                 batch_axis: int | None = None, **keys) -> dict:
    """The ``out_info`` entry of output ``name`` of shape ``shape`` (per dimension a size or a ref ``(input,
    dim)``; see :func:`dims_of`): of the exact ``dtype`` if given, else the op's floating type; declared
    C-contiguous unless ``contiguous=False``; its sequences along ``batch_axis`` if given.  ``keys``: any other spec
    key (``fully_written``, ``bw_grad_var``, ...), as is."""
    info = {"name": name, "ndim": len(shape), "shape": shape}
    if dtype is not None:
        info["dtype"] = dtype
    if contiguous:
        info["need_contiguous"] = True
    if batch_axis is not None:
        info["batch_axis"] = batch_axis
    info.update(keys)
    return info


def hidden_output(name: str, shape, batch_axis: int | None = None, **keys) -> dict:
    """A float64 output that calling the op does not return (``dummy``: it feeds the gradient op)."""
    return output_entry(name, shape, dtype="float64", batch_axis=batch_axis, dummy=True, **keys)


def host_int32_scalar(name: str) -> dict:
    """The ``in_info`` entry of an int32 scalar input that the kernel reads on the host (a size, an index
    or a flag; no gradient)."""
    return input_entry(name, 0, shape=(), dtype="int32", host_memory=True)


def dims_of(k: int, ndim: int) -> tuple:
    """The shape refs of input ``k``'s first ``ndim`` dimensions: an output shaped like that input."""
    return tuple((k, d) for d in range(ndim))
