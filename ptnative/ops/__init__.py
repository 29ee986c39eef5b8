"""The op catalogue: one module per family, each with its op classes (``NativeOpGenBase`` subclasses)
and its functional API, listed in its ``__all__``.

``ptnative.ops.<family>`` is always the family's module (``ptnative.ops.lstm``, ``ptnative.ops.fsa``,
...).  Everything the families export is also re-exported here, except a function named like a family
module: ``lstm`` and ``edit_distance`` are ``ptnative.lstm`` / ``ptnative.ops.lstm.lstm`` and
``ptnative.edit_distance`` / ``ptnative.ops.edit_distance.edit_distance``.  Every function of the
catalogue is at the top level (``ptnative.<name>``).
"""

from . import chunking, edit_distance, fsa, hmm, hsmm, lstm, rnnt, sparse

#: The family modules, in the order of the documentation.
FAMILIES = (lstm, fsa, hmm, hsmm, rnnt, edit_distance, chunking, sparse)

_family_names = {family.__name__.rpartition(".")[2] for family in FAMILIES}
_exports = {name: getattr(family, name) for family in FAMILIES for name in family.__all__}

#: Every function of the catalogue by name; ``ptnative`` exports them at its top level.
FUNCTIONS = {name: obj for name, obj in _exports.items() if not isinstance(obj, type)}

globals().update({name: obj for name, obj in _exports.items() if name not in _family_names})

__all__ = [*sorted(_family_names), *(name for name in _exports if name not in _family_names)]
