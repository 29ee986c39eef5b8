"""Glues between a :class:`ptnative.NativeOp` and PyTensor's backends.

Each glue starts from the variant of a node (``NativeOp.node_variant``: translation unit, entry point and argument
plan, made once per spec, floating type and device; see :mod:`ptnative.source` and :mod:`ptnative.plan`) and only
renders that plan in its own language.  Dependencies run one way: the backends import :mod:`ptnative.op`, never the
reverse.  Importing this package registers them:

* :mod:`.driver`: the Python driver (allocate outputs, call the compiled entry
  point), NativeOp's ``perform`` (Python mode, FAST_COMPILE, constant folding)
  and, compiled by Numba, the default mode's.
* :mod:`.numba`: the ``numba_funcify`` registration (imported by ``import ptnative``).
* :mod:`.c`: the ``c_code`` of PyTensor's C backend (modes ``"C"`` and ``"CVM"``).
* :mod:`.jax` and :mod:`.ffi_source`: JAX mode (registered lazily, see :func:`ptnative.backends.jax.install`).
* :mod:`.jax_dispatch`: the one lazy registration with ``jax_funcify`` that JAX mode and any other op use.
* :mod:`.lstm_shape_check`: the C, Numba and JAX code of :class:`ptnative.ops.lstm.LstmShapeCheck`, which the op
  registers (it is no NativeOp: its code is its own).
"""

from . import c, driver  # noqa: F401  (register NativeOp's C-backend and perform glues)
