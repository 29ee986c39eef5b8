"""Lazy registration with PyTensor's ``jax_funcify``, so that importing ptnative imports no JAX.

An op class's JAX implementation is handed over with :func:`register_lazily`.  It reaches ``jax_funcify`` at
once when PyTensor's JAX dispatch is already imported, else the first time a graph is rewritten for JAX (one
rewrite tagged ``"jax"``, ``ptnative_jax_dispatch``, that changes nothing: ``pytensor.function(..., mode="JAX")``,
PyMC's ``get_jaxified_graph``), or when :func:`register_all` is called (code that calls ``jax_funcify`` on a graph
it did not rewrite for JAX).  No import hook.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable

from pytensor.graph.rewriting.basic import GraphRewriter

DISPATCH_MODULE = "pytensor.link.jax.dispatch"
#: The name of the rewrite in ``pytensor.compile.optdb``.
REWRITE_NAME = "ptnative_jax_dispatch"

#: Op class -> its ``jax_funcify`` implementation, until registered.
_pending: dict[type, Callable] = {}
#: The op classes registered with ``jax_funcify`` in this process.
_registered: set[type] = set()
_lock = threading.Lock()


class RegisterJaxDispatch(GraphRewriter):
    """A rewrite run only when a graph is rewritten for JAX: it registers the pending implementations, changing
    nothing."""

    def apply(self, fgraph):
        register_all()


def register_lazily(op_class: type, funcify: Callable) -> None:
    """Make ``funcify`` ``op_class``'s ``jax_funcify`` implementation without importing JAX now (see the module
    docstring); nothing happens for a class already registered."""
    from pytensor.compile import optdb

    with _lock:
        if op_class not in _registered:
            _pending[op_class] = funcify
    if REWRITE_NAME not in optdb:
        optdb.register(REWRITE_NAME, RegisterJaxDispatch(), "jax", position=0)
    if DISPATCH_MODULE in sys.modules:
        register_all()


def register_all() -> None:
    """Register every pending implementation with PyTensor's ``jax_funcify`` (imports JAX when one is pending;
    idempotent)."""
    if not _pending:
        return
    from pytensor.link.jax.dispatch import jax_funcify

    with _lock:
        for op_class, funcify in list(_pending.items()):
            jax_funcify.register(op_class)(funcify)
            _registered.add(op_class)
            del _pending[op_class]
