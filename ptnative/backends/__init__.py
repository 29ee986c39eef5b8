"""Glues between a :class:`ptnative.NativeOp` and PyTensor's backends.

* :mod:`.driver`: the Python driver (allocate outputs, call the compiled entry
  point), used by ``perform`` (Python mode, FAST_COMPILE, constant folding) and,
  compiled by Numba, by the default mode.
* :mod:`.numba`: the ``numba_funcify`` registration.
* :mod:`.c`: ``c_code`` for PyTensor's C backend (modes ``"C"`` and ``"CVM"``).
"""
