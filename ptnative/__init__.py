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
from .ops.edit_distance import (  # noqa: E402
    edit_distance, next_edit_distance_reduce, next_edit_distance_row, optimal_completion_edit_distance,
    optimal_completion_edit_distance_per_successor,
)
from .ops.rnnt import multiblank_rnnt_lattice, multiblank_rnnt_loss, rnnt_loss  # noqa: E402

_jax_backend.install()  # the JAX implementation registers when PyTensor's JAX backend is imported

__version__ = "0.1.0"

__all__ = ["NativeOp", "NativeOpGenBase", "NativeOpBase", "CompileError", "KernelValueError", "KernelRuntimeError",
           "config", "ops", "__version__",
           "edit_distance", "optimal_completion_edit_distance", "optimal_completion_edit_distance_per_successor",
           "next_edit_distance_row", "next_edit_distance_reduce",
           "rnnt_loss", "multiblank_rnnt_loss", "multiblank_rnnt_lattice"]
