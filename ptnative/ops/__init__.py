"""The op catalogue: one module per family, each with its op classes
(``NativeOpGenBase`` subclasses) and its functional API."""

from . import edit_distance, lstm
from .edit_distance import *  # noqa: F401,F403
from .lstm import LstmGenericBase, NativeLstm

__all__ = ["LstmGenericBase", "NativeLstm", *edit_distance.__all__]
