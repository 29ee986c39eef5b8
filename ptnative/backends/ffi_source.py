"""The translation unit of an op variant's XLA FFI handler, for JAX mode.

The handler's C++ lives in ``c_code/xla_ffi_handler.cc`` (named ``//@section``\\ s); this module fills it with plain
substitutions (the op's tables, symbol and name) and appends it to the variant's own translation unit (dialect,
kernels, entry point; see :mod:`ptnative.source`).
"""

from __future__ import annotations

import re
from functools import cache

import numpy as np

from ..source import Variant, c_string_literal, read_kernel_file

HANDLER_FILE = "xla_ffi_handler.cc"
_SECTION = re.compile(r"^//@section (\w+)[ \t]*\n", re.M)
_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


@cache
def sections(filename: str = HANDLER_FILE) -> dict[str, str]:
    """The named sections of a glue file in ``c_code/``: ``{name: text}`` (the text before the first is dropped)."""
    parts = _SECTION.split(read_kernel_file(filename))
    return dict(zip(parts[1::2], parts[2::2]))


def fill(template: str, fields: dict[str, str]) -> str:
    """``template`` with every ``@KEY@`` of ``fields`` replaced; an unknown ``@KEY@`` left over is an error."""
    text = template
    for key, value in fields.items():
        text = text.replace(f"@{key}@", value)
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        raise ValueError(f"unfilled placeholders in a glue template: {', '.join(left)}")
    return text


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
    handler = fill(sections()["handler"], {
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
