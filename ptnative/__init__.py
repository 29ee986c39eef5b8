"""ptnative: PyTensor ops from CUDA-style C kernel specs, and a catalogue of
fast sequence kernels."""

from .build import CompileError
from .errors import KernelRuntimeError, KernelValueError
from .settings import config
from .op import NativeOp, NativeOpGenBase
from .spec import NativeOpBase

from . import rewrites  # noqa: E402,F401  (registers the inplace rewrite)
from .backends import numba as _numba_backend  # noqa: E402,F401  (registers the Numba implementation)
from .backends import jax as _jax_backend  # noqa: E402
from . import ops  # noqa: E402
from . import eager  # noqa: E402,F401  (ptnative.eager.<function>: the catalogue on numpy arrays)

_jax_backend.install()  # registers the JAX implementation lazily: no JAX import, no import hook

# The catalogue's functions at the top level (ptnative.ctc_loss, ptnative.lstm, ...); op classes stay in ptnative.ops.
globals().update(ops.FUNCTIONS)

__version__ = "0.1.0"

__all__ = ["NativeOp", "NativeOpGenBase", "NativeOpBase", "CompileError", "KernelValueError", "KernelRuntimeError",
           "config", "ops", "eager", "__version__", *ops.FUNCTIONS]
