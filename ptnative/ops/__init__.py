"""The op catalogue: one module per family, each with its functional API."""

from .lstm import LstmGenericBase, NativeLstm

__all__ = ["LstmGenericBase", "NativeLstm"]
