"""PyTensor's C backend (modes ``"C"`` and ``"CVM"``): a thin trampoline.

PyTensor's C module for a NativeOp node holds no kernel code.  The kernel is compiled once, by ptnative's own
build with its own flags (:mod:`ptnative.build`), and the module calls its entry point, exactly as the CUDA
build and the Numba and Python drivers do.  So flags in ``pytensor.config.gcc__cxxflags`` (PyMC adds
``-fno-exceptions``; users add ``-ffast-math``) never reach a kernel, and each node's module compiles in a
fraction of a second.

The module's C text is ``c_code/glue/pytensor_c_glue.c`` (sections that start with ``//@section <name>``, filled by
plain substitution), the same for every op: the node's params (:func:`params`, a constant that PyTensor hands to
the module) name the variant, and when the module's struct is initialised it asks :func:`layout_address` for the
variant's :class:`Layout` (entry point and argument plan).  PyTensor reuses a module whose text and version it
has compiled before, so nodes of different ops with the same input and output types share one module.
"""

from __future__ import annotations

import ctypes
import hashlib
import sys
import zlib
from functools import cache

import numpy as np

from ..build import build, load
from ..op import register_glue
from ..source import MAX_NDIM, STATUS_VALUE, Variant, fill_glue, glue_sections, read_kernel_file

GLUE_FILE = "glue/pytensor_c_glue.c"
#: Bumped when the way the glue file is filled changes (the file's own text is in the cache key too).
TRAMPOLINE_VERSION = 3

_INTS = ctypes.POINTER(ctypes.c_int)
_INT64S = ctypes.POINTER(ctypes.c_int64)


class Layout(ctypes.Structure):
    """``ptn_glue_layout`` of ``c_code/glue/pytensor_c_glue.c``: how the module calls one variant."""

    _fields_ = [("entry", ctypes.c_void_p), ("label", ctypes.c_char_p), ("n_in", ctypes.c_int),
                ("n_out", ctypes.c_int), ("ndim", _INTS), ("contiguous", _INTS), ("source_of", _INTS),
                ("destroys", _INTS), ("typenum", _INTS), ("out_dims", _INT64S)]


#: The variants whose layouts this process may hand out, by (symbol, plan key) (see :func:`params`).
_prepared: dict[tuple[str, str], Variant] = {}
#: The layouts handed out, by params; kept for the life of the process (modules hold their addresses).
_layouts: dict[tuple[str, str, tuple[int, ...]], Layout] = {}


def fill(section: str, fields: dict[str, object]) -> str:
    """One section of ``c_code/glue/pytensor_c_glue.c``, filled (see :func:`ptnative.source.fill_glue`)."""
    return fill_glue(glue_sections(GLUE_FILE)[section], fields)


@cache
def plan_key(variant: Variant) -> str:
    """A digest of ``variant``'s argument plan.  The symbol alone does not fix the plan: specs that differ only in
    what the glue does (which inputs it makes contiguous) compile to the same translation unit and symbol."""
    return hashlib.sha256(repr(variant.plan).encode()).hexdigest()[:16]


def params(op, node) -> tuple[str, str, tuple[int, ...]]:
    """``node``'s params: ``(symbol, plan key, inplace)`` of its variant, whose library is built here (if not
    cached).  PyTensor asks for them whenever it compiles or reuses the node's module, before the module is
    loaded."""
    variant = op.node_variant(node)
    key = (variant.symbol, plan_key(variant))
    if key not in _prepared:
        build(variant)
        _prepared[key] = variant
    return (*key, tuple(op.inplace))


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _array(ctype, values):
    values = [int(v) for v in values]
    return (ctype * max(len(values), 1))(*values)


def _layout(variant: Variant, inplace: tuple[int, ...]) -> Layout:
    plan = variant.plan
    # The structure keeps every array and string it points to (ctypes' _objects).
    return Layout(entry=ctypes.cast(load(variant).run, ctypes.c_void_p).value, label=_utf8(plan.label),
                  n_in=plan.n_in, n_out=plan.n_out, ndim=_array(ctypes.c_int, plan.ndims),
                  contiguous=_array(ctypes.c_int, plan.contiguous), source_of=_array(ctypes.c_int, plan.source_of),
                  destroys=_array(ctypes.c_int, plan.destroys(inplace)),
                  typenum=_array(ctypes.c_int, (np.dtype(d).num for d in plan.out_dtypes)),
                  out_dims=_array(ctypes.c_int64, plan.out_dim_codes))


def layout_address(node_params: tuple[str, str, tuple[int, ...]]) -> int:
    """The address of the :class:`Layout` for ``node_params`` (see :func:`params`); its library is loaded through
    :func:`ptnative.build.load` (which also sets its BLAS).  Called by the C module when its struct is
    initialised.  Raises ``ImportError`` for params that no op of this process has made, ``CompileError`` when
    the library cannot be built."""
    layout = _layouts.get(node_params)
    if layout is None:
        symbol, plan, inplace = node_params
        variant = _prepared.get((symbol, plan))
        if variant is None:
            raise ImportError(f"ptnative: a PyTensor C module asks for the kernel {symbol}, which no NativeOp of "
                              "this process has prepared (compile the function again)")
        # setdefault: of two threads making the same layout at once, both hand out the one that is kept.
        layout = _layouts.setdefault(node_params, _layout(variant, inplace))
    return ctypes.addressof(layout)


def support_code() -> str:
    """The helpers every NativeOp node of a module shares (PyTensor includes them once)."""
    return fill("support_code", {"MAX_NDIM": MAX_NDIM, "STATUS_VALUE": STATUS_VALUE})


def support_code_struct(name: str) -> str:
    """The struct member holding the node's layout."""
    return fill("support_code_struct", {"NAME": name})


def init_code_struct(name: str, sub: dict) -> str:
    """When the module's struct is initialised: find the node's layout (a Python exception when that fails)."""
    return fill("init_code_struct", {"NAME": name, "PARAMS": sub["params"], "FAIL": sub["fail"]})


def c_code(node, name: str, inputs: list[str], outputs: list[str], sub: dict) -> str:
    """One call: wrap the arrays, allocate the outputs and call the entry point (see ``ptn_glue_run``)."""
    n_in, n_out = len(node.inputs), len(node.outputs)
    return fill("code", {"NAME": name, "N_IN": n_in, "N_OUT": n_out, "N": n_in + n_out,
                         "INPUTS": "".join(f"{v}, " for v in inputs) + "NULL",
                         "OUTPUTS": "".join(f"&{v}, " for v in outputs) + "NULL", "FAIL": sub["fail"]})


def cache_version() -> tuple[int, ...]:
    """The module's version: the glue's file text and filling (the variant is a params value, not code)."""
    return TRAMPOLINE_VERSION, zlib.crc32(read_kernel_file(GLUE_FILE).encode())


register_glue("c", sys.modules[__name__])
