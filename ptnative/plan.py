"""The argument plan of a variant: what every glue does around the entry point, derived once from the spec.

Each mode calls a variant's entry point (the ABI is in :mod:`ptnative.source`) through a glue of its own: the
Python/Numba driver (:mod:`ptnative.backends.driver`), PyTensor's C module (:mod:`ptnative.backends.c`), the XLA
FFI handler (``c_code/glue/xla_ffi_handler.cc``, given the plan by :mod:`ptnative.backends.jax`) and the entry point
itself (``c_code/dialect/native_op_entry.h``).  They all do the same steps from the same facts, and those facts are this
plan's fields, so that no glue reads the spec again:

1. make the ``contiguous`` inputs C-contiguous;
2. hand the entry point each array's rank and element type (``types``, see :func:`dtype_code`): the entry point
   checks them and the fixed input sizes (``size_checks``) against this plan before it touches a buffer, the one
   place every mode's arguments are checked (``ptn::check_arguments`` in ``c_code/dialect/native_op_entry.h``, also
   exported as ``<symbol>_check_arguments`` for glues that check before they allocate, as JAX mode does when it
   traces a call);
3. allocate the outputs in ``out_dtypes`` and ``out_shapes`` (sizes, and refs ``(input, dim)`` into the inputs'
   shapes; :meth:`ArgumentPlan.output_shapes` resolves them);
4. initialise them: output ``k`` starts as a copy of input ``source_of[k]`` (that input's own buffer when the op
   destroys it, see :meth:`ArgumentPlan.destroys`), or at zero when ``source_of[k] == -1`` (zeroed by the entry
   point, on either target), unless ``fully_written[k]``: the kernel writes every element, so the entry point
   leaves it as allocated;
5. call the entry point and turn a status into ``KernelValueError`` / ``KernelRuntimeError``.

A plan is made per (spec, floating type, device), with the variant that carries it (see
:func:`ptnative.source.generate`): the floating type fixes the dtypes, the device the contiguity (the CUDA build
copies device inputs whole, so those must be C-contiguous).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .spec import MAX_NDIM, array_dtype, resolve_shape


def dtype_code(dtype) -> int:
    """How the entry point's ABI names an element type: ``ord(kind) << 8 | itemsize`` of the numpy dtype (float64 is
    ``ord("f") << 8 | 8``); ``ptn::dtype_name`` in ``c_code/dialect/native_op_entry.h`` reads it back."""
    dt = np.dtype(dtype)
    return ord(dt.kind) << 8 | dt.itemsize


@dataclass(frozen=True)
class SizeCheck:
    """Input ``input`` must have ``size`` elements in dimension ``dim`` (the entry point's message:
    ``input 'x' must have size 4 in dim 1``)."""

    input: int
    dim: int
    size: int


@dataclass(frozen=True)
class ArgumentPlan:
    """How a glue calls one variant's entry point (see the module docstring).  Per-array tuples list the inputs,
    then the outputs (dummy ones included)."""

    name: str  #: the op's name
    n_in: int
    n_out: int
    ndims: tuple[int, ...]  #: per array
    dtypes: tuple[str, ...]  #: per array, exact (the floating type resolved)
    contiguous: tuple[bool, ...]  #: per input: made C-contiguous before the call
    host_memory: tuple[bool, ...]  #: per input: read on the host also by the CUDA build
    source_of: tuple[int, ...]  #: per output: the input it starts as a copy of, or -1 (starts at zero)
    fully_written: tuple[bool, ...]  #: per output: the kernel writes every element (not zeroed first)
    out_shapes: tuple[tuple[Any, ...], ...]  #: per output: an int size or an ``(input, dim)`` ref per dimension
    array_labels: tuple[str, ...]  #: per array: how messages name it (``input 'x'``, ``output 'y'``)
    size_checks: tuple[SizeCheck, ...]

    @classmethod
    def of(cls, spec, float_dtype: str, device: str) -> ArgumentPlan:
        """The plan of ``spec`` (a :class:`ptnative.spec.NativeOpBase`) computing in ``float_dtype`` on ``device``
        (``"cpu"`` or ``"cuda"``)."""
        in_info, out_info = spec.in_info, spec.out_info
        source_of = [-1] * len(out_info)
        for i, k in spec.want_inplace_map.items():
            source_of[k] = i
        return cls(
            name=spec.name,
            n_in=len(in_info),
            n_out=len(out_info),
            ndims=tuple(info["ndim"] for info in in_info + out_info),
            dtypes=tuple(array_dtype(info, float_dtype) for info in in_info + out_info),
            contiguous=tuple(info["ndim"] > 0 and bool(info.get("need_contiguous") or (
                device == "cuda" and not info.get("host_memory"))) for info in in_info),
            host_memory=tuple(bool(info.get("host_memory")) for info in in_info),
            source_of=tuple(source_of),
            fully_written=tuple(bool(info.get("fully_written")) for info in out_info),
            out_shapes=tuple(tuple(info["shape"]) for info in out_info),
            array_labels=tuple(f"input {info.get('name', i)!r}" for i, info in enumerate(in_info))
            + tuple(f"output {info.get('name', k)!r}" for k, info in enumerate(out_info)),
            size_checks=tuple(SizeCheck(i, d, s) for i, info in enumerate(in_info)
                              for d, s in enumerate(info.get("shape") or ()) if isinstance(s, int)),
        )

    @property
    def label(self) -> str:
        """``NativeOp '<name>'``: how every message names the op."""
        return f"NativeOp {self.name!r}"

    @property
    def out_dtypes(self) -> tuple[str, ...]:
        return self.dtypes[self.n_in:]

    @property
    def dtype_codes(self) -> tuple[int, ...]:
        """Per array, its element type as the entry point's ABI names it (:func:`dtype_code`)."""
        return tuple(dtype_code(d) for d in self.dtypes)

    @property
    def out_dim_codes(self) -> tuple[int, ...]:
        """The outputs' shapes as the C glues read them: ``MAX_NDIM`` entries per output, each a size ``>= 0`` or
        ``-1 - (input * MAX_NDIM + dim)`` for a ref ``(input, dim)`` (unused entries 0)."""
        codes = []
        for shape in self.out_shapes:
            dims = [s if isinstance(s, int) else -1 - (s[0] * MAX_NDIM + s[1]) for s in shape]
            codes += dims + [0] * (MAX_NDIM - len(dims))
        return tuple(codes)

    @property
    def itemsizes(self) -> tuple[int, ...]:
        """Bytes per element, per array."""
        return tuple(np.dtype(d).itemsize for d in self.dtypes)

    @property
    def inplace_of(self) -> tuple[int, ...]:
        """Per input: the output that starts as its copy (``want_inplace``), or -1."""
        result = [-1] * self.n_in
        for k, i in enumerate(self.source_of):
            if i >= 0:
                result[i] = k
        return tuple(result)

    def destroys(self, inplace: Sequence[int]) -> tuple[bool, ...]:
        """Per output: whether it may be its source input's own buffer, for an op destroying the inputs
        ``inplace`` (``NativeOp.inplace``; not part of the variant, which the inplace op shares)."""
        return tuple(i >= 0 and i in inplace for i in self.source_of)

    def output_shapes(self, input_shapes: Sequence[Sequence[Any]]) -> list[tuple]:
        """Every output's shape (dummy ones included) from the inputs' shapes."""
        return [resolve_shape(shape, input_shapes) for shape in self.out_shapes]
