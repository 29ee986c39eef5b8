"""The op catalogue: one module per family, each with its op classes
(``NativeOpGenBase`` subclasses) and its functional API (listed in its ``__all__``)."""

from . import chunking as _chunking
from . import edit_distance as _edit_distance
from . import fsa as _fsa
from . import lstm as _lstm
from . import rnnt as _rnnt
from . import sparse as _sparse
from .chunking import *  # noqa: F401,F403
from .edit_distance import *  # noqa: F401,F403
from .fsa import *  # noqa: F401,F403
from .lstm import *  # noqa: F401,F403
from .rnnt import *  # noqa: F401,F403
from .sparse import *  # noqa: F401,F403

__all__ = [*_lstm.__all__, *_fsa.__all__, *_rnnt.__all__, *_edit_distance.__all__, *_chunking.__all__,
           *_sparse.__all__]
