"""The op catalogue: one module per family, each with its op classes
(``NativeOpGenBase`` subclasses) and its functional API."""

from .edit_distance import __all__ as _edit_distance_all
from .edit_distance import *  # noqa: F401,F403
from .lstm import LstmGenericBase, NativeLstm
from .rnnt import __all__ as _rnnt_all
from .rnnt import *  # noqa: F401,F403

__all__ = ["LstmGenericBase", "NativeLstm", *_edit_distance_all, *_rnnt_all]
