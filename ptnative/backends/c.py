"""PyTensor's C backend (modes ``"C"`` and ``"CVM"``): a thin trampoline.

PyTensor's C module for a NativeOp node holds no kernel code.  The kernel is compiled once, by ptnative's own
build with its own flags (:mod:`ptnative.build`), and the module calls its entry point, exactly as the CUDA
build and the Numba and Python drivers do.  So flags in ``pytensor.config.gcc__cxxflags`` (PyMC adds
``-fno-exceptions``; users add ``-ffast-math``) never reach a kernel, and each node's module compiles in a
fraction of a second.

The module's C text is ``c_code/pytensor_c_glue.c`` (sections that start with ``//@section <name>``, filled by
plain substitution).  At import the module asks :func:`entry_address` for the entry point's address.  PyTensor may
import a module compiled by an earlier process without asking the op for its code, but it always computes the
node's cache key in the current process first: :func:`cache_version` builds the library there and registers the
variant under its symbol.
"""

from __future__ import annotations

import ctypes
import sys
import zlib
from functools import cache

from ..build import build, load
from ..op import register_glue
from ..source import (MAX_NDIM, STATUS_VALUE, Variant, c_array, c_string_literal, fill_glue, glue_sections,
                      read_kernel_file)

GLUE_FILE = "pytensor_c_glue.c"
#: Bumped when the way the glue file is filled changes (the file's own text is in the cache key too).
TRAMPOLINE_VERSION = 1

_NPY_TYPES = {"float32": "NPY_FLOAT32", "float64": "NPY_FLOAT64", "int32": "NPY_INT32", "int64": "NPY_INT64",
              "uint8": "NPY_UINT8"}

#: The variants whose C modules this process may import, by symbol (see :func:`prepare`).
_prepared: dict[str, Variant] = {}


def fill(section: str, fields: dict[str, object]) -> str:
    """One section of ``c_code/pytensor_c_glue.c``, filled (see :func:`ptnative.source.fill_glue`)."""
    return fill_glue(glue_sections(GLUE_FILE)[section], fields)


def prepare(op, node) -> Variant:
    """Build the library of ``node``'s variant (if not cached) and let this process's C modules find it."""
    variant = op.node_variant(node)
    if variant.symbol not in _prepared:
        build(variant)
        _prepared[variant.symbol] = variant
    return variant


def entry_address(symbol: str) -> int:
    """The address of ``symbol``'s entry point, its library loaded through :func:`ptnative.build.load` (which
    also sets its BLAS).  Called by the C module at import.  Raises ``ImportError`` for a symbol that no op of
    this process has prepared, ``CompileError`` when the library cannot be built."""
    variant = _prepared.get(symbol)
    if variant is None:
        raise ImportError(f"ptnative: a PyTensor C module asks for the kernel {symbol}, which no NativeOp of this "
                          "process has prepared (compile the function again)")
    return ctypes.cast(load(variant).run, ctypes.c_void_p).value


@cache
def layout_fields(variant: Variant, inplace: tuple[int, ...]) -> dict[str, object]:
    """The glue's fields for ``variant`` called by an op destroying the inputs ``inplace``: its argument plan as C
    tables (every field but the node's ``NAME``)."""
    plan = variant.plan
    out_dims = []
    for shape in plan.out_shapes:
        dims = [s if isinstance(s, int) else -1 - (s[0] * MAX_NDIM + s[1]) for s in shape]
        out_dims += dims + [0] * (MAX_NDIM - len(dims))
    checks = plan.size_checks
    return {
        "MAX_NDIM": MAX_NDIM, "STATUS_VALUE": STATUS_VALUE,
        "SYMBOL": c_string_literal(variant.symbol), "LABEL": c_string_literal(plan.label),
        "N_IN": plan.n_in, "N_OUT": plan.n_out, "N": plan.n_in + plan.n_out, "N_CHECKS": len(checks),
        "NDIM": c_array(plan.ndims),
        "CONTIGUOUS": c_array(plan.contiguous),
        "SOURCE_OF": c_array(plan.source_of),
        "DESTROYS": c_array(plan.destroys(inplace)),
        "TYPENUM": c_array(_NPY_TYPES[dtype] for dtype in plan.out_dtypes),
        "OUT_DIMS": c_array(out_dims),
        "CHECK_INPUT": c_array(c.input for c in checks), "CHECK_DIM": c_array(c.dim for c in checks),
        "CHECK_SIZE": c_array(c.size for c in checks),
        "CHECK_MESSAGE": c_array(c_string_literal(c.message) for c in checks),
    }


def _fields(op, node, name: str) -> dict[str, object]:
    return dict(layout_fields(prepare(op, node), op.inplace), NAME=name)


def support_code() -> str:
    """The helpers every NativeOp node of a module shares (PyTensor includes them once)."""
    return fill("support_code", {"MAX_NDIM": MAX_NDIM, "STATUS_VALUE": STATUS_VALUE})


def support_code_apply(op, node, name: str) -> str:
    """This node's tables and entry-point slot."""
    return fill("support_code_apply", _fields(op, node, name))


def init_code(op, node, name: str) -> str:
    """At the module's import: fetch the entry point (an import error when that fails)."""
    return fill("init_code_apply", _fields(op, node, name))


def c_code(op, node, name: str, inputs: list[str], outputs: list[str], sub: dict) -> str:
    """One call: wrap the arrays, allocate the outputs and call the entry point (see ``ptn_glue_run``)."""
    fields = _fields(op, node, name)
    fields.update(INPUTS="".join(f"{v}, " for v in inputs) + "NULL",
                  OUTPUTS="".join(f"&{v}, " for v in outputs) + "NULL", FAIL=sub["fail"])
    return fill("code", fields)


def cache_version(op, node) -> tuple[int, ...]:
    """The node's module version: the glue (file text and filling) and the variant.  Called for PyTensor's cache
    key in every process that compiles or reuses the module, so the library is built and registered here."""
    variant = prepare(op, node)
    return (TRAMPOLINE_VERSION, zlib.crc32(read_kernel_file(GLUE_FILE).encode()), int(variant.digest, 16))


register_glue("c", sys.modules[__name__])
