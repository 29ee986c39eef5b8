"""The translation unit of an op variant's XLA FFI handler, for JAX mode.

The handler's C++ lives in ``c_code/xla_ffi_handler.cc`` (named ``//@section``\\ s); this module fills it with plain
substitutions (the op's tables, symbol and name; :func:`ptnative.source.fill_glue`) and appends it to the variant's
own translation unit (dialect, kernels, entry point; see :mod:`ptnative.source`).
"""

from __future__ import annotations

import numpy as np

from ..source import Variant, c_string_literal, fill_glue, glue_sections

HANDLER_FILE = "xla_ffi_handler.cc"


def c_array(values) -> str:
    """A C array initialiser of ints, with a trailing 0 so that it is never empty."""
    return "{" + ", ".join(str(int(v)) for v in [*values, 0]) + "}"


def generate_ffi(op, float_dtype: str, device: str, include_dir: str) -> Variant:
    """The translation unit of ``op``'s variant (``float_dtype``, ``device``) with its XLA FFI handler
    ``<symbol>_ffi``: a host handler for ``"cpu"``, one on XLA's CUDA stream for ``"cuda"``.  ``include_dir`` holds
    ``xla/ffi/api/ffi.h`` (``jax.ffi.include_dir()``)."""
    base = op.variant(float_dtype, device)
    infos = op.in_info + op.out_info
    source_of = [-1] * len(op.out_info)
    for i, info in enumerate(op.in_info):
        if info.get("want_inplace", -1) >= 0:
            source_of[info["want_inplace"]] = i
    handler = fill_glue(glue_sections(HANDLER_FILE)["handler"], {
        "SYM": base.symbol,
        "N_IN": str(len(op.in_info)),
        "N_OUT": str(len(op.out_info)),
        "ITEMSIZES": c_array(np.dtype(op.array_dtype(info, float_dtype)).itemsize for info in infos),
        "SOURCE_OF": c_array(source_of),
        "HOST_MEMORY": c_array(bool(info.get("host_memory")) for info in op.in_info),
        "NAME": c_string_literal(op.name),
    })
    return Variant(symbol=base.symbol, source=base.source + "\n" + handler, device=device,
                   include_dirs=(include_dir,))
