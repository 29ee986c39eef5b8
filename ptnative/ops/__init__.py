"""The op catalogue: one module per family, each with its op classes
(``NativeOpGenBase`` subclasses) and its functional API (listed in its ``__all__``)."""

from . import edit_distance as _edit_distance
from . import fsa as _fsa
from . import rnnt as _rnnt
from .edit_distance import *  # noqa: F401,F403
from .fsa import *  # noqa: F401,F403
from .lstm import LstmGenericBase, NativeLstm
from .rnnt import *  # noqa: F401,F403

__all__ = ["LstmGenericBase", "NativeLstm", *_fsa.__all__, *_rnnt.__all__, *_edit_distance.__all__]
