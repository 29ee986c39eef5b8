"""The op spec: ``in_info`` / ``out_info`` parsing, validation, shape refs and the
derivation of the gradient op's spec.

This module knows nothing about PyTensor; :class:`NativeOpBase` is the
backend-neutral half of :class:`ptnative.NativeOp` (the seed's
``NativeOpBaseMixin``).
"""

from __future__ import annotations

import difflib
import functools
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

#: The most dimensions an array of a spec may have; the entry point's ABI (:mod:`ptnative.source`) reserves this
#: many shape and stride entries per array (the dialect's PTN_MAX_NDIM; tests/test_constants.py ties them).
MAX_NDIM = 8
#: ``"float32"`` is the generic floating type: the op runs in float32 or float64,
#: whichever its inputs have.  The others are exact.
FLOAT_GENERIC = "float32"
DTYPES = ("float32", "float64", "int32", "int64", "uint8")
INFO_KEYS = {
    "name", "ndim", "shape", "dtype", "need_contiguous", "want_inplace", "is_inplace", "gradient", "bw_input",
    "bw_in_var", "bw_out_var", "bw_grad_var", "host_memory", "dummy", "batch_axis", "fully_written",
}
#: Keys whose value is a dict of overrides applied when deriving the gradient op.
_OVERRIDE_KEYS = ("bw_in_var", "bw_out_var", "bw_grad_var")


class FrozenDict(dict):
    """A hashable, immutable dict (spec entries are part of the op's identity)."""

    __slots__ = ("_hash",)

    def _immutable(self, *args, **kwargs):
        raise TypeError("spec entries are immutable; copy with dict(entry)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _immutable

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:  # computed once: an op's identity is hashed on every variant look-up
            self._hash = hash(tuple(sorted(self.items())))
            return self._hash

    def __reduce__(self):
        return FrozenDict, (dict(self),)


def make_hashable(obj: Any) -> Any:
    """Dicts become :class:`FrozenDict`, lists and tuples become tuples, recursively."""
    if isinstance(obj, dict):
        return FrozenDict({k: make_hashable(v) for k, v in obj.items()})
    if isinstance(obj, list | tuple):
        return tuple(make_hashable(v) for v in obj)
    return obj


def array_dtype(info: Mapping, float_dtype: str) -> str:
    """The exact dtype of a spec entry when the op computes in ``float_dtype``: ``float_dtype`` for the generic
    floating type (:data:`FLOAT_GENERIC`), the entry's own dtype otherwise."""
    dtype = info.get("dtype", FLOAT_GENERIC)
    return float_dtype if dtype == FLOAT_GENERIC else dtype


def resolve_shape(shape: Sequence[Any], input_shapes: Sequence[Sequence[Any]]) -> tuple:
    """An output's ``shape`` entry with each ref ``(in_idx, dim)`` replaced by ``input_shapes[in_idx][dim]`` (ints,
    PyTensor variables or static sizes alike); the one place shape refs are resolved in Python."""
    return tuple(s if isinstance(s, int) else input_shapes[s[0]][s[1]] for s in shape)


def join_support_code(code: str | dict | Sequence[str] | None) -> str:
    """Support code as one string: dict values in sorted key order, sequences in order."""
    if code is None:
        return ""
    if isinstance(code, str):
        return code
    if isinstance(code, dict):
        code = [code[k] for k in sorted(code)]
    return "\n".join(part + "\n\n" for part in code)


def resolve_want_inplace_dummy(in_info, out_info):
    """Add one output per ``want_inplace="dummy_out"`` input; return (in_info, out_info, n_dummy)."""
    in_info = [dict(info) for info in in_info]
    out_info = [dict(info) for info in out_info]
    n_dummy = 0
    for i, info in enumerate(in_info):
        if info.get("want_inplace") != "dummy_out":
            continue
        n_dummy += 1
        ndim = info.get("ndim")
        out_info.append({
            "name": "dummy_out_%i" % n_dummy,
            "ndim": ndim,
            "shape": tuple((i, d) for d in range(ndim if isinstance(ndim, int) else 0)),
            "dtype": info.get("dtype", FLOAT_GENERIC),
            "dummy": True,
            **({"batch_axis": info["batch_axis"]} if "batch_axis" in info else {}),
        })
        info["want_inplace"] = len(out_info) - 1
    return in_info, out_info, n_dummy


def _is_int(value) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _is_flag(value) -> bool:
    return isinstance(value, bool | np.bool_) or (_is_int(value) and value in (0, 1))


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _closest_key(key) -> str:
    close = difflib.get_close_matches(str(key), sorted(INFO_KEYS), n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    return f"unknown key; the keys are {', '.join(sorted(INFO_KEYS))}"


def _value_problem(key, value) -> str | None:
    """What is wrong with ``value`` for the per-entry ``key`` alone, or None (cross-entry checks come later)."""
    if key == "name":
        return None if isinstance(value, str) else f"must be a str, got {_short(value)}"
    if key == "ndim":
        if not _is_int(value) or value < 0:
            return f"a non-negative int is required, got {_short(value)}"
        if value > MAX_NDIM:
            return f"at most {MAX_NDIM} dimensions are supported, got {value}"
        return None
    if key == "dtype":
        if isinstance(value, str) and value in DTYPES:
            return None
        return f"unknown dtype {_short(value)}; known: {', '.join(DTYPES)}"
    if key in ("need_contiguous", "host_memory", "dummy", "is_inplace", "bw_input", "fully_written"):
        return None if _is_flag(value) else f"must be True or False, got {_short(value)}"
    if key == "want_inplace":
        if value == "dummy_out" or (_is_int(value) and value >= -1):
            return None
        return f"must be -1, 'dummy_out' or an output index, got {_short(value)}"
    if key == "batch_axis":
        return None if _is_int(value) and value >= 0 else f"a non-negative int (a dimension) is required, " \
                                                            f"got {_short(value)}"
    if key == "gradient":
        return None if value in ("", "disconnected") else f"only 'disconnected' is allowed, got {_short(value)}"
    if key in ("bw_in_var", "bw_out_var", "bw_grad_var"):
        if value is None:
            return None
        if not isinstance(value, Mapping):
            return f"must be a dict of overrides, got {_short(value)}"
        for k, v in value.items():
            if k not in INFO_KEYS or k in _OVERRIDE_KEYS:
                return f"override {k!r}: " + (_closest_key(k) if k not in INFO_KEYS else "overrides do not nest")
            problem = None if k == "shape" else _value_problem(k, v)
            if problem:
                return f"override {k!r}: {problem}"
        return None
    return None  # "shape" is checked with its entry (it depends on ndim and on the other entries)


def _check_shape_entry(err, kind, s, d, n_in: int, in_ndims: Sequence[Any]) -> None:
    """One entry of a ``shape``: an int >= 0, a ref ``(in_idx, dim)``, or (inputs only) None."""
    if _is_int(s):
        if s < 0:
            err("shape", f"dim {d}: negative size {s}")
        return
    if s is None and kind == "in_info":
        return
    if not isinstance(s, tuple | list):
        expected = "an int, None" if kind == "in_info" else "an int"
        err("shape", f"dim {d}: expected {expected} or an (in_idx, dim) ref, got {_short(s)}")
    if len(s) != 2 or not all(_is_int(v) for v in s):
        err("shape", f"dim {d}: a ref is a pair of ints (in_idx, dim), got {_short(s)}")
    if kind == "in_info":
        return  # refs on inputs are documentation only (a gradient op keeps its forward op's)
    i, j = s
    if not 0 <= i < n_in:
        err("shape", f"dim {d}: ref {tuple(s)!r} names input {i}, but there are {n_in} inputs")
    if _is_int(in_ndims[i]) and not 0 <= j < in_ndims[i]:
        err("shape", f"dim {d}: ref {tuple(s)!r} names dim {j} of input {i}, which has ndim {in_ndims[i]}")


def check_info_lists(name: str, in_info, out_info) -> tuple[list[dict], list[dict]]:
    """``in_info`` / ``out_info`` as lists of plain dicts, each entry checked on its own.

    Raises :class:`ValueError` naming the op, the entry and the key: a container that is not a list or
    tuple of dicts, an unknown key (with the closest valid one), a value of the wrong type or range,
    a malformed ``shape`` or ref.  Cross-entry rules (``want_inplace`` targets) are :func:`validate`'s."""
    lists = []
    for kind, infos in (("in_info", in_info), ("out_info", out_info)):
        what = "input" if kind == "in_info" else "output"
        if not isinstance(infos, list | tuple):
            raise ValueError(f"NativeOp {name!r}: {kind} must be a list or tuple of dicts (one per {what}), "
                             f"got {type(infos).__name__} {_short(infos)}")
        for idx, info in enumerate(infos):
            if not isinstance(info, Mapping):
                raise ValueError(f"NativeOp {name!r}: {kind} #{idx} must be a dict describing {what} {idx}, "
                                 f"got {type(info).__name__} {_short(info)}")
        lists.append([dict(info) for info in infos])
    if not lists[1]:
        raise ValueError(f"NativeOp {name!r}: out_info is empty; an op needs at least one output")
    in_ndims = [info.get("ndim") for info in lists[0]]
    for kind, infos in (("in_info", lists[0]), ("out_info", lists[1])):
        for idx, info in enumerate(infos):
            err = functools.partial(_raise, name, kind, idx, info)
            if not isinstance(info.get("name", ""), str):
                raise ValueError(f"NativeOp {name!r}: {kind} #{idx}, key 'name': must be a str, "
                                 f"got {_short(info['name'])}")
            for key, value in info.items():
                if key not in INFO_KEYS:
                    err(key, _closest_key(key))
                problem = _value_problem(key, value)
                if problem:
                    err(key, problem)
            if kind == "in_info" and "fully_written" in info:
                err("fully_written", "only outputs are written by the kernel; for the gradient of this input "
                                     "give bw_out_var={'fully_written': True}")
            if "ndim" not in info:
                err("ndim", "missing; every entry needs its number of dimensions")
            ndim = info["ndim"] = int(info["ndim"])
            if "batch_axis" in info and not info["batch_axis"] < ndim:
                err("batch_axis", f"{info['batch_axis']} is not a dimension of this {ndim}-d array")
            shape = info.get("shape")
            if shape is None:
                if kind == "out_info":
                    err("shape", "outputs need a shape (ints or (in_idx, dim) refs)")
                continue
            if not isinstance(shape, tuple | list) or len(shape) != ndim:
                err("shape", f"must be a list or tuple of length ndim={ndim}, got {_short(shape)}")
            for d, s in enumerate(shape):
                _check_shape_entry(err, kind, s, d, len(lists[0]), in_ndims)
            info["shape"] = tuple(s if s is None else int(s) if _is_int(s) else (int(s[0]), int(s[1]))
                                  for s in shape)
    return lists[0], lists[1]


def _raise(name, kind, idx, info, key, msg):
    entry = info.get("name", "#%i" % idx) if isinstance(info, dict) else "#%i" % idx
    raise ValueError(f"NativeOp {name!r}: {kind} {entry!r} (#{idx}), key {key!r}: {msg}")


def convert_grad_input_map(gi_map, n: int, name: str = "<anonNativeOp>") -> tuple[int, ...]:
    """``None`` -> all ``n``; a callable is called with the indices ``0..n-1``; each entry an int in ``[0, n)``."""
    if gi_map is None:
        return tuple(range(n))
    if callable(gi_map):
        try:
            gi_map = gi_map(*range(n))
        except Exception as e:
            raise ValueError(f"NativeOp {name!r}: grad_input_map, called with the indices 0..{n - 1} of "
                             f"inputs + outputs + output grads, raised {type(e).__name__}: {e}") from e
    if not isinstance(gi_map, list | tuple | range):
        raise ValueError(f"NativeOp {name!r}: grad_input_map must be a sequence of ints or a callable returning "
                         f"one, got {_short(gi_map)}")
    for pos, i in enumerate(gi_map):
        if not _is_int(i):
            raise ValueError(f"NativeOp {name!r}: grad_input_map[{pos}] must be an int, got {_short(i)}")
        if not 0 <= i < n:
            raise ValueError(f"NativeOp {name!r}: grad_input_map[{pos}] = {i} is out of range "
                             f"(inputs + outputs + output grads = {n})")
    if len(set(gi_map)) != len(gi_map):
        raise ValueError(f"NativeOp {name!r}: grad_input_map names an index twice: {tuple(gi_map)!r}")
    return tuple(int(i) for i in gi_map)


def validate(name: str, in_info, out_info) -> None:
    """Raise :class:`ValueError` naming the op, the entry and the key for any malformed spec.

    Each entry is checked on its own (see :func:`check_info_lists`), then the ``want_inplace``
    targets across entries (after ``"dummy_out"`` resolution)."""
    in_info, out_info = check_info_lists(name, in_info, out_info)
    claimed = {}
    for idx, info in enumerate(in_info):
        k = info.get("want_inplace", -1)
        if k == -1:
            continue
        err = functools.partial(_raise, name, "in_info", idx, info, "want_inplace")
        if not _is_int(k) or not 0 <= k < len(out_info):
            err(f"must be -1, 'dummy_out' or an output index < {len(out_info)}, got {k!r}")
        if k in claimed:
            err(f"output {k} is already claimed by input {claimed[k]}")
        claimed[k] = idx
        out = out_info[k]
        if out.get("ndim") != info["ndim"]:
            err(f"output {k} has ndim {out.get('ndim')}, the input has {info['ndim']}")
        if out.get("dtype", FLOAT_GENERIC) != info.get("dtype", FLOAT_GENERIC):
            err(f"output {k} has another dtype than the input")
        if out.get("batch_axis") != info.get("batch_axis"):
            err(f"output {k} has batch_axis {out.get('batch_axis')}, the input has {info.get('batch_axis')}")
    for idx, info in enumerate(out_info):
        if "batch_axis" in info and not _sized_by_batch_axis(info, in_info):
            _raise(name, "out_info", idx, info, "batch_axis",
                   f"dim {info['batch_axis']} has size {info['shape'][info['batch_axis']]!r}, which is not the "
                   "batch axis of an input (its size must be a ref (in_idx, dim) to an input whose batch_axis is dim)")


def _sized_by_batch_axis(out: Mapping, in_info: Sequence[Mapping]) -> bool:
    """Whether output entry ``out``'s size along its ``batch_axis`` is a ref to an input's batch axis (so that
    folding a vmapped axis into the inputs' batch axes folds it into the output's; see backends/jax.py)."""
    shape, axis = out.get("shape"), out["batch_axis"]
    if not isinstance(shape, tuple | list) or not axis < len(shape):
        return False
    ref = shape[axis]
    return (isinstance(ref, tuple | list) and len(ref) == 2 and _is_int(ref[0]) and 0 <= ref[0] < len(in_info)
            and in_info[ref[0]].get("batch_axis") == ref[1])


_FORMAT_SPEC = re.compile(r"%(?:%|\(fail\)s)")


def check_code(name: str, key: str, code, optional: bool = False) -> None:
    """``c_fw_code`` / ``c_bw_code`` must be a str whose only ``%`` directives are ``%%`` and ``%(fail)s``."""
    if code is None and optional:
        return
    if not isinstance(code, str):
        raise ValueError(f"NativeOp {name!r}: {key} must be a str{' or None' if optional else ''}, "
                         f"got {type(code).__name__}")
    pos = 0
    while (pos := code.find("%", pos)) >= 0:
        m = _FORMAT_SPEC.match(code, pos)
        if m:
            pos = m.end()
            continue
        line = code.count("\n", 0, pos) + 1
        start = code.rfind("\n", 0, pos) + 1
        end = code.find("\n", pos)
        text = code[start: end if end >= 0 else len(code)].strip()
        named = re.match(r"%\(([^)]*)\)\w?", code[pos:])
        if not named:
            what = "a lone '%'"
        elif named.group(1) == "fail":
            what = f"{named.group()!r} is not a substitution (did you mean '%(fail)s'?)"
        else:
            what = f"unknown substitution {named.group()!r} (only '%(fail)s' is defined)"
        raise ValueError(f"NativeOp {name!r}: {key} line {line}: {what} in {_short(text, 80)}; the code is "
                         "%-formatted: write '%%' for a literal percent sign ('%(fail)s' bails out)")


def check_support_code(name: str, code) -> None:
    """``c_extra_support_code``: None, a str, a dict of str or a list/tuple of str."""
    if code is None or isinstance(code, str):
        return
    if isinstance(code, Mapping):
        items = list(code.items())
        if not all(isinstance(k, str) for k, _ in items):
            raise ValueError(f"NativeOp {name!r}: c_extra_support_code keys must be str (they set the order), "
                             f"got {sorted(map(repr, code))}")
    elif isinstance(code, list | tuple):
        items = list(enumerate(code))
    else:
        raise ValueError(f"NativeOp {name!r}: c_extra_support_code must be a str, a dict of str or a list of str, "
                         f"got {type(code).__name__}")
    for k, part in items:
        if not isinstance(part, str):
            raise ValueError(f"NativeOp {name!r}: c_extra_support_code[{k!r}] must be a str, "
                             f"got {type(part).__name__}")


def check_code_version(name: str, code_version) -> tuple[int, ...]:
    """``None``, an int or a sequence of ints, as a tuple."""
    if code_version is None:
        return ()
    if _is_int(code_version):
        return (int(code_version),)
    if isinstance(code_version, list | tuple) and all(_is_int(v) for v in code_version):
        return tuple(int(v) for v in code_version)
    raise ValueError(f"NativeOp {name!r}: code_version must be an int or a tuple of ints, got {_short(code_version)}")


class NativeOpBase:
    """The backend-neutral half of a native op (the seed's ``NativeOpBaseMixin``).

    Parameters are those of :class:`ptnative.NativeOp`.  After construction,
    ``in_info`` / ``out_info`` are hashable tuples of :class:`FrozenDict` with
    ``"dummy_out"`` requests resolved into extra outputs (``num_dummy_outs``).
    """

    def __init__(self, in_info, out_info, c_fw_code, c_bw_code=None, c_extra_support_code=None,
                 code_version=None, cpu_support=True, grad_input_map=None, name=None):
        if name is not None and not isinstance(name, str):
            raise ValueError(f"NativeOp: name must be a str or None, got {_short(name)}")
        self.name = name or "<anonNativeOp>"
        # Every entry on its own first, so that resolving "dummy_out" and the refs below see well-formed dicts.
        in_info, out_info = check_info_lists(self.name, in_info, out_info)
        in_info, out_info, _ = resolve_want_inplace_dummy(in_info, out_info)
        n_grad_inputs = len(in_info) + 2 * len(out_info)
        gi_map = convert_grad_input_map(grad_input_map, n_grad_inputs, self.name)
        validate(self.name, in_info, out_info)
        check_code(self.name, "c_fw_code", c_fw_code)
        check_code(self.name, "c_bw_code", c_bw_code, optional=True)
        check_support_code(self.name, c_extra_support_code)
        if not _is_flag(cpu_support):
            raise ValueError(f"NativeOp {self.name!r}: cpu_support must be True or False, got {_short(cpu_support)}")
        self.in_info = make_hashable(in_info)
        self.out_info = make_hashable(out_info)
        self.num_dummy_outs = sum(1 for o in self.out_info if o.get("dummy"))
        self.c_fw_code = c_fw_code
        self.c_bw_code = c_bw_code
        self.c_extra_support_code = join_support_code(c_extra_support_code)
        self.code_version = check_code_version(self.name, code_version)
        self.cpu_support = bool(cpu_support)
        self.grad_input_map = gi_map

    @property
    def variant_identity(self) -> tuple:
        """What this spec's variants are made of (:func:`ptnative.source.variant`): equal for specs whose
        variants are equal, whatever else an op adds to the spec (its ``inplace`` inputs, its device setting)."""
        return (self.name, self.in_info, self.out_info, self.c_fw_code, self.c_extra_support_code)

    @property
    def want_inplace_map(self) -> dict[int, int]:
        """``{input: output}`` for every input with a ``want_inplace``: that output starts as the input's copy, or
        is the input's own buffer in an op that destroys it."""
        return {i: info["want_inplace"] for i, info in enumerate(self.in_info) if info.get("want_inplace", -1) >= 0}

    # ---- shapes
    def output_shapes(self, input_shapes: Sequence[Sequence[Any]]) -> list[tuple]:
        """The shape of every output (dummy ones included) from the inputs' shapes."""
        return [resolve_shape(info["shape"], input_shapes) for info in self.out_info]

    # ---- gradient spec
    def filter_grad_inputs(self, values: Sequence[Any]) -> list[Any]:
        n = len(self.in_info) + 2 * len(self.out_info)
        if len(values) != n:
            raise ValueError(f"NativeOp {self.name!r}: expected {n} gradient candidates, got {len(values)}")
        return [values[i] for i in self.grad_input_map]

    @staticmethod
    def _with(info, key):
        info = dict(info)
        overrides = info.pop(key, None) or {}
        if ("ndim" in overrides or "shape" in overrides) and "batch_axis" not in overrides:
            info.pop("batch_axis", None)  # another array: its batch axis is not the forward entry's
        info.update(overrides)
        return info

    def kwargs_for_grad_op(self) -> dict[str, Any]:
        """The kwargs of the gradient op ``GradOf<name>``: its inputs are
        ``filter_grad_inputs(inputs + outputs + output grads)``; its outputs are
        one gradient per connected input."""
        # A forward input's want_inplace targets a forward output; in the gradient op only
        # bw_in_var (and an output's own want_inplace, as in the seed) may ask for inplace.
        fw_inputs = [{k: v for k, v in i.items() if k != "want_inplace"} for i in self.in_info]
        grad_in_info = (
            [self._with(i, "bw_in_var") for i in fw_inputs]
            + [self._with(o, "bw_in_var") for o in self.out_info]
            + [dict(self._with(o, "bw_grad_var"), name="D_" + o.get("name", "out%i" % k))
               for k, o in enumerate(self.out_info)]
        )
        for info in grad_in_info:
            info.pop("dummy", None)
            info.pop("fully_written", None)  # an output's flag; these are the gradient op's inputs
        grad_in_info = self.filter_grad_inputs(grad_in_info)
        pos = {orig: new for new, orig in enumerate(self.grad_input_map)}
        grad_out_info = []
        for idx, info in enumerate(self.in_info):
            if info.get("gradient") == "disconnected":
                continue
            out = self._with({k: v for k, v in info.items() if k != "shape"}, "bw_out_var")
            out.pop("want_inplace", None)
            out.pop("is_inplace", None)
            if "shape" not in out:
                if idx not in pos:
                    raise ValueError(
                        f"NativeOp {self.name!r}: the gradient of input {info.get('name', idx)!r} needs a shape: "
                        "add the input to grad_input_map or give it bw_out_var={'shape': ...}")
                out["shape"] = tuple((pos[idx], d) for d in range(info["ndim"]))
            if "batch_axis" in out and not _sized_by_batch_axis(out, grad_in_info):
                del out["batch_axis"]  # its size is no longer the batch size of a gradient op input
            grad_out_info.append(out)
        return dict(
            name="GradOf%s" % self.name, in_info=grad_in_info, out_info=grad_out_info, c_fw_code=self.c_bw_code,
            c_extra_support_code=self.c_extra_support_code, code_version=self.code_version,
            cpu_support=self.cpu_support,
        )

    def make_results_of_gradient(self, grad_op_outputs: Sequence[Any], disconnected_type: Callable | None = None):
        """One gradient per forward input: ``disconnected_type()`` for disconnected ones."""
        outputs = list(grad_op_outputs)
        result = []
        for info in self.in_info:
            if info.get("gradient") == "disconnected":
                result.append(disconnected_type() if disconnected_type else None)
            else:
                result.append(outputs.pop(0))
        if outputs:
            raise ValueError(f"NativeOp {self.name!r}: {len(outputs)} unused gradient outputs")
        return result
