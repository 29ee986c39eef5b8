"""The op spec: ``in_info`` / ``out_info`` parsing, validation, shape refs and the
derivation of the gradient op's spec.

This module knows nothing about PyTensor; :class:`NativeOpBase` is the
backend-neutral half of :class:`ptnative.NativeOp` (the seed's
``NativeOpBaseMixin``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: ``"float32"`` is the generic floating type: the op runs in float32 or float64,
#: whichever its inputs have.  The others are exact.
FLOAT_GENERIC = "float32"
DTYPES = ("float32", "float64", "int32", "int64", "uint8")
INFO_KEYS = {
    "name", "ndim", "shape", "dtype", "need_contiguous", "want_inplace", "is_inplace", "gradient", "bw_input",
    "bw_in_var", "bw_out_var", "bw_grad_var", "host_memory", "dummy",
}


class FrozenDict(dict):
    """A hashable, immutable dict (spec entries are part of the op's identity)."""

    def _immutable(self, *args, **kwargs):
        raise TypeError("spec entries are immutable; copy with dict(entry)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _immutable

    def __hash__(self):
        return hash(tuple(sorted(self.items())))

    def __reduce__(self):
        return FrozenDict, (dict(self),)


def make_hashable(obj: Any) -> Any:
    """Dicts become :class:`FrozenDict`, lists and tuples become tuples, recursively."""
    if isinstance(obj, dict):
        return FrozenDict({k: make_hashable(v) for k, v in obj.items()})
    if isinstance(obj, list | tuple):
        return tuple(make_hashable(v) for v in obj)
    return obj


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
        })
        info["want_inplace"] = len(out_info) - 1
    return in_info, out_info, n_dummy


def convert_grad_input_map(gi_map, n: int) -> tuple[int, ...]:
    """``None`` -> all ``n``; a callable is called with the indices ``0..n-1``."""
    if gi_map is None:
        return tuple(range(n))
    if callable(gi_map):
        gi_map = gi_map(*range(n))
    return tuple(int(i) for i in gi_map)


def validate(name: str, in_info, out_info, grad_input_map: tuple[int, ...]) -> None:
    """Raise :class:`ValueError` naming the op, the entry and the key for any malformed spec."""

    def err(kind, idx, info, key, msg):
        entry = info.get("name", "#%i" % idx) if isinstance(info, dict) else "#%i" % idx
        raise ValueError(f"NativeOp {name!r}: {kind} {entry!r} (#{idx}), key {key!r}: {msg}")

    for kind, infos in (("in_info", in_info), ("out_info", out_info)):
        for idx, info in enumerate(infos):
            if not isinstance(info, dict):
                raise ValueError(f"NativeOp {name!r}: {kind} #{idx} must be a dict, got {type(info).__name__}")
            ndim = info.get("ndim")
            if not isinstance(ndim, int) or isinstance(ndim, bool) or ndim < 0:
                err(kind, idx, info, "ndim", f"a non-negative int is required, got {ndim!r}")
            if ndim > 8:
                err(kind, idx, info, "ndim", f"at most 8 dimensions are supported, got {ndim}")
            dtype = info.get("dtype", FLOAT_GENERIC)
            if dtype not in DTYPES:
                err(kind, idx, info, "dtype", f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
            if info.get("gradient", "") not in ("", "disconnected"):
                err(kind, idx, info, "gradient", "only 'disconnected' is allowed")
            shape = info.get("shape")
            if shape is None:
                if kind == "out_info":
                    err(kind, idx, info, "shape", "outputs need a shape (ints or (in_idx, dim) refs)")
                continue
            if not isinstance(shape, tuple | list) or len(shape) != ndim:
                err(kind, idx, info, "shape", f"must be a sequence of length ndim={ndim}, got {shape!r}")
            for d, s in enumerate(shape):
                if isinstance(s, int) and not isinstance(s, bool):
                    if s < 0:
                        err(kind, idx, info, "shape", f"dim {d}: negative size {s}")
                elif isinstance(s, tuple | list):
                    if kind == "in_info":
                        continue  # refs on inputs are documentation only
                    if len(s) != 2:
                        err(kind, idx, info, "shape", f"dim {d}: a ref is (in_idx, dim), got {s!r}")
                    i, j = s
                    if not (0 <= i < len(in_info)):
                        err(kind, idx, info, "shape", f"dim {d}: ref {tuple(s)!r} names input {i}, "
                                                      f"but there are {len(in_info)} inputs")
                    in_ndim = in_info[i].get("ndim")
                    if not (0 <= j < in_ndim):
                        err(kind, idx, info, "shape", f"dim {d}: ref {tuple(s)!r} names dim {j} of input {i}, "
                                                      f"which has ndim {in_ndim}")
                elif s is None and kind == "in_info":
                    continue
                else:
                    err(kind, idx, info, "shape", f"dim {d}: expected an int or an (in_idx, dim) ref, got {s!r}")

    claimed = {}
    for idx, info in enumerate(in_info):
        k = info.get("want_inplace", -1)
        if k == -1:
            continue
        if not isinstance(k, int) or isinstance(k, bool) or not (0 <= k < len(out_info)):
            err("in_info", idx, info, "want_inplace", f"must be -1, 'dummy_out' or an output index "
                                                      f"< {len(out_info)}, got {k!r}")
        if k in claimed:
            err("in_info", idx, info, "want_inplace", f"output {k} is already claimed by input {claimed[k]}")
        claimed[k] = idx
        out = out_info[k]
        if out.get("ndim") != info["ndim"]:
            err("in_info", idx, info, "want_inplace", f"output {k} has ndim {out.get('ndim')}, "
                                                      f"the input has {info['ndim']}")
        if out.get("dtype", FLOAT_GENERIC) != info.get("dtype", FLOAT_GENERIC):
            err("in_info", idx, info, "want_inplace", f"output {k} has another dtype than the input")

    n = len(in_info) + 2 * len(out_info)
    for i in grad_input_map:
        if not (0 <= i < n):
            raise ValueError(f"NativeOp {name!r}: grad_input_map entry {i} is out of range "
                             f"(inputs + outputs + output grads = {n})")


class NativeOpBase:
    """The backend-neutral half of a native op (the seed's ``NativeOpBaseMixin``).

    Parameters are those of :class:`ptnative.NativeOp`.  After construction,
    ``in_info`` / ``out_info`` are hashable tuples of :class:`FrozenDict` with
    ``"dummy_out"`` requests resolved into extra outputs (``num_dummy_outs``).
    """

    def __init__(self, in_info, out_info, c_fw_code, c_bw_code=None, c_extra_support_code=None,
                 code_version=None, cpu_support=True, grad_input_map=None, name=None):
        self.name = name or "<anonNativeOp>"
        in_info, out_info, _ = resolve_want_inplace_dummy(in_info, out_info)
        n_grad_inputs = len(in_info) + 2 * len(out_info)
        gi_map = convert_grad_input_map(grad_input_map, n_grad_inputs)
        validate(self.name, in_info, out_info, gi_map)
        if not isinstance(c_fw_code, str):
            raise ValueError(f"NativeOp {self.name!r}: c_fw_code must be a str")
        if c_bw_code is not None and not isinstance(c_bw_code, str):
            raise ValueError(f"NativeOp {self.name!r}: c_bw_code must be a str or None")
        self.in_info = make_hashable(in_info)
        self.out_info = make_hashable(out_info)
        self.num_dummy_outs = sum(1 for o in self.out_info if o.get("dummy"))
        self.c_fw_code = c_fw_code
        self.c_bw_code = c_bw_code
        self.c_extra_support_code = join_support_code(c_extra_support_code)
        if isinstance(code_version, int):
            code_version = (code_version,)
        self.code_version = tuple(code_version or ())
        self.cpu_support = bool(cpu_support)
        self.grad_input_map = gi_map

    # ---- shapes
    def output_shapes(self, input_shapes: Sequence[Sequence[Any]]) -> list[tuple]:
        """The shape of every output (dummy ones included) from the inputs' shapes."""
        result = []
        for info in self.out_info:
            result.append(tuple(s if isinstance(s, int) else input_shapes[s[0]][s[1]] for s in info["shape"]))
        return result

    # ---- gradient spec
    def filter_grad_inputs(self, values: Sequence[Any]) -> list[Any]:
        n = len(self.in_info) + 2 * len(self.out_info)
        if len(values) != n:
            raise ValueError(f"NativeOp {self.name!r}: expected {n} gradient candidates, got {len(values)}")
        return [values[i] for i in self.grad_input_map]

    @staticmethod
    def _with(info, key):
        info = dict(info)
        info.update(info.pop(key, None) or {})
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
        grad_in_info = self.filter_grad_inputs(grad_in_info)
        pos = {orig: new for new, orig in enumerate(self.grad_input_map)}
        grad_out_info = []
        for idx, info in enumerate(self.in_info):
            if info.get("gradient") == "disconnected":
                continue
            out = dict(info)
            out.pop("shape", None)
            out.update(out.pop("bw_out_var", None) or {})
            out.pop("want_inplace", None)
            out.pop("is_inplace", None)
            if "shape" not in out:
                if idx not in pos:
                    raise ValueError(
                        f"NativeOp {self.name!r}: the gradient of input {info.get('name', idx)!r} needs a shape: "
                        "add the input to grad_input_map or give it bw_out_var={'shape': ...}")
                out["shape"] = tuple((pos[idx], d) for d in range(info["ndim"]))
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
