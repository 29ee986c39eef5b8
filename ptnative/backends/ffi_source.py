"""The translation unit of JAX mode's XLA FFI handler library: one per device, holding no op's code.

The handler's C++ lives in ``c_code/glue/xla_ffi_handler.cc``; this module fills its two constants of the entry point's
ABI (plain substitutions, :func:`ptnative.source.fill_glue`) and makes it a :class:`~ptnative.source.Variant`
that :mod:`ptnative.build` compiles and caches like a kernel library (g++ for ``"cpu"``, nvcc for ``"cuda"``),
with jaxlib's ``xla/ffi/api/ffi.h`` on the include path.  :mod:`ptnative.backends.jax` registers each op
variant with it at run time (the variant's own library provides the entry point).
"""

from __future__ import annotations

import hashlib
from functools import cache

from ..source import STATUS_VALUE, Variant, fill_glue, glue_sections
from ..spec import MAX_NDIM

HANDLER_FILE = "glue/xla_ffi_handler.cc"
#: What the handler library exports: the XLA FFI handler, and the function that registers an op variant with it.
HANDLER_SYMBOL = "ptn_xla_ffi_handler"
REGISTER_SYMBOL = "ptn_xla_ffi_register"


@cache
def handler_variant(device: str, include_dir: str) -> Variant:
    """The handler library's translation unit for ``device`` (``"cpu"``: a host handler; ``"cuda"``: one that
    runs on XLA's CUDA stream), compiled with ``-I include_dir`` (``jax.ffi.include_dir()``, holding
    ``xla/ffi/api/ffi.h``).  Its symbol (``ptn_xla_ffi_<hash of the text>``) only names the library file."""
    source = fill_glue(glue_sections(HANDLER_FILE)["handler"], {
        "MAX_NDIM": str(MAX_NDIM),
        "STATUS_VALUE": str(STATUS_VALUE),
    })
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return Variant(symbol=f"ptn_xla_ffi_{digest}", source=source, device=device, include_dirs=(include_dir,))


def installed_handler_variant(device: str) -> Variant | None:
    """:func:`handler_variant` for the installed jax (what JAX mode loads), or None when jax cannot be imported;
    for ahead-of-time builds (``python -m ptnative build``)."""
    try:
        import jax.ffi
    except ImportError:
        return None
    return handler_variant(device, jax.ffi.include_dir())
