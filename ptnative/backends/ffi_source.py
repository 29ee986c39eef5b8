"""The translation unit of an op variant's XLA FFI handler, for JAX mode.

The handler's C++ lives in ``c_code/xla_ffi_handler.cc`` (named ``//@section``\\ s); this module fills it with plain
substitutions (the op's tables, symbol and name; :func:`ptnative.source.fill_glue`) and appends it to the variant's
own translation unit (dialect, kernels, entry point; see :mod:`ptnative.source`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from ..source import Variant, c_array, c_string_literal, fill_glue, glue_sections

HANDLER_FILE = "xla_ffi_handler.cc"


@cache
def ffi_variant(variant: Variant, include_dir: str) -> Variant:
    """``variant`` with its XLA FFI handler ``<symbol>_ffi`` appended (a host handler for a ``"cpu"`` variant, one on
    XLA's CUDA stream for ``"cuda"``), filled from its argument plan.  ``include_dir`` holds
    ``xla/ffi/api/ffi.h`` (``jax.ffi.include_dir()``).  Made once per variant."""
    plan = variant.plan
    handler = fill_glue(glue_sections(HANDLER_FILE)["handler"], {
        "SYM": variant.symbol,
        "N_IN": str(plan.n_in),
        "N_OUT": str(plan.n_out),
        "ITEMSIZES": c_array(plan.itemsizes),
        "SOURCE_OF": c_array(plan.source_of),
        "HOST_MEMORY": c_array(plan.host_memory),
        "NAME": c_string_literal(plan.name),
    })
    return replace(variant, source=variant.source + "\n" + handler, include_dirs=(include_dir,))


def generate_ffi(op, float_dtype: str, device: str, include_dir: str) -> Variant:
    """:func:`ffi_variant` of ``op``'s variant (``float_dtype``, ``device``)."""
    return ffi_variant(op.variant(float_dtype, device), include_dir)
