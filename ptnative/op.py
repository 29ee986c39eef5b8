"""``NativeOp``: a PyTensor Op made from a spec (see :mod:`ptnative.spec`), and
``NativeOpGenBase``, the class-attribute form of a spec used by the catalogue."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytensor.tensor as pt
from pytensor.configdefaults import config
from pytensor.gradient import DisconnectedType, disconnected_type, grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.link.c.op import COp
from pytensor.link.c.type import generic
from pytensor.tensor.type import TensorType

from . import source
from .device import resolve as resolve_device
from .settings import DEVICES
from .spec import FLOAT_GENERIC, NativeOpBase, array_dtype

FLOAT_DTYPES = ("float32", "float64")

#: The glues that PyTensor reaches through the op's own methods, by kind: ``"c"`` (PyTensor's C backend;
#: ``get_params`` and the ``c_*`` methods hand over to its ``params``, ``support_code``, ``support_code_struct``,
#: ``init_code_struct``, ``c_code`` and ``cache_version``) and ``"python"`` (``perform`` hands over to its
#: ``perform``).  The modules of :mod:`ptnative.backends` register themselves here when ptnative is imported
#: (:func:`register_glue`); this module imports no backend.  The default (Numba) and JAX modes find their glue through PyTensor's own dispatch.
GLUES: dict[str, Any] = {}


def register_glue(kind: str, glue: Any) -> None:
    """Make ``glue`` (an object with the functions listed at :data:`GLUES`) NativeOp's glue of ``kind``."""
    GLUES[kind] = glue


def _glue(kind: str) -> Any:
    glue = GLUES.get(kind)
    if glue is None:  # only if ptnative.backends failed to import
        raise RuntimeError(f"ptnative: no {kind!r} glue is registered for NativeOp (ptnative.backends was not "
                           "imported)")
    return glue


class NativeOp(COp, NativeOpBase):
    """A PyTensor Op from a spec: ``in_info``, ``out_info`` and C kernel code.

    Parameters
    ----------
    in_info, out_info : sequence of dict
        One dict per input / output; see ``docs/writing-ops.md`` for the keys.
    c_fw_code : str
        Body of the forward pass.  It sees ``int n_inputs, n_outputs``,
        ``Ndarray* inputs[]`` and ``Ndarray** outputs[]`` (allocated, zeroed;
        a ``want_inplace`` input *is* its output buffer).  %-formatted: ``%%`` is
        a literal ``%``, ``%(fail)s`` bails out.
    c_bw_code : str, optional
        Body of the gradient op (see :meth:`kwargs_for_grad_op`).  Without it,
        requesting a gradient raises ``NullTypeGradError``.
    c_extra_support_code : str | dict | list, optional
        Kernels and helpers, used verbatim (dict values in sorted key order).
    code_version : tuple of int, optional
    cpu_support : bool
        False for GPU-only kernels.
    grad_input_map : tuple of int | callable, optional
        Which of ``inputs + outputs + output grads`` the gradient op receives.
    name : str, optional
    float_dtypes : tuple of str
        Floating types the kernel text compiles for.  Code that hard-codes
        ``float`` (like RETURNN's) passes ``("float32",)``: its op computes in
        float32, casting float64 inputs down.
    inplace : tuple of int
        Inputs this op destroys (set by the inplace rewrite).
    device : {"cpu", "cuda", "auto"} or None
        Where this op runs; None follows ``ptnative.config.device``.

    Calling the op returns its outputs (one variable, or a list), without
    dummy outputs.
    """

    __props__ = ("in_info", "out_info", "c_fw_code", "c_bw_code", "c_extra_support_code", "code_version",
                 "cpu_support", "grad_input_map", "name", "float_dtypes", "inplace", "device")

    def __init__(self, in_info, out_info, c_fw_code, c_bw_code=None, c_extra_support_code=None, code_version=None,
                 cpu_support=True, grad_input_map=None, name=None, float_dtypes=FLOAT_DTYPES, inplace=(),
                 device=None):
        NativeOpBase.__init__(self, in_info, out_info, c_fw_code, c_bw_code=c_bw_code,
                              c_extra_support_code=c_extra_support_code, code_version=code_version,
                              cpu_support=cpu_support, grad_input_map=grad_input_map, name=name)
        float_dtypes = tuple(float_dtypes)
        if not float_dtypes or any(d not in FLOAT_DTYPES for d in float_dtypes):
            raise ValueError(f"NativeOp {self.name!r}: float_dtypes must be a non-empty subset of {FLOAT_DTYPES}")
        self.float_dtypes = float_dtypes
        inplace = tuple(sorted(set(int(i) for i in inplace)))
        for i in inplace:
            if i not in self.want_inplace_map:
                raise ValueError(f"NativeOp {self.name!r}: input {i} has no want_inplace and cannot be destroyed")
        self.inplace = inplace
        if device is not None and device not in DEVICES:
            raise ValueError(f"NativeOp {self.name!r}: device must be one of {DEVICES} or None, got {device!r}")
        self.device = device
        self.destroy_map = {self.want_inplace_map[i]: [i] for i in inplace}

    def __str__(self):
        return f"NativeOp{{{self.name}{',inplace' if self.inplace else ''}}}"

    # ------------------------------------------------------------ graph
    array_dtype = staticmethod(array_dtype)

    def _node_float_dtype(self, variables) -> str:
        dtypes = {v.dtype for info, v in zip(self.in_info, variables)
                  if info.get("dtype", FLOAT_GENERIC) == FLOAT_GENERIC and v.dtype.startswith("float")}
        dtype = "float64" if "float64" in dtypes else "float32" if dtypes else config.floatX
        if dtype not in FLOAT_DTYPES:
            dtype = "float32"
        return dtype if dtype in self.float_dtypes else self.float_dtypes[0]

    def float_dtype_of(self, node) -> str:
        """The floating type ``node`` computes in."""
        for info, v in zip(self.in_info + self.out_info, node.inputs + node.outputs):
            if info.get("dtype", FLOAT_GENERIC) == FLOAT_GENERIC:
                return v.dtype
        return self.float_dtypes[0]

    def make_node(self, *inputs):
        if len(inputs) != len(self.in_info):
            raise TypeError(f"NativeOp {self.name!r}: expected {len(self.in_info)} inputs, got {len(inputs)}")
        variables = [pt.as_tensor_variable(x) for x in inputs]
        float_dtype = self._node_float_dtype(variables)
        converted = []
        for idx, (info, v) in enumerate(zip(self.in_info, variables)):
            label = f"NativeOp {self.name!r}: input {info.get('name', idx)!r} (#{idx})"
            if v.ndim != info["ndim"]:
                raise TypeError(f"{label} must have ndim {info['ndim']}, got {v.ndim} ({v.type})")
            want = array_dtype(info, float_dtype)
            if v.dtype != want:
                if not want.startswith("float") and not (v.dtype.startswith(("int", "uint")) or v.dtype == "bool"):
                    raise TypeError(f"{label} must be {want}, got {v.dtype}")
                v = pt.cast(v, want)
            converted.append(v)
        static_shapes = self.output_shapes([v.type.shape for v in converted])
        outputs = [TensorType(array_dtype(info, float_dtype), shape=shape)()
                   for info, shape in zip(self.out_info, static_shapes)]
        return Apply(self, converted, outputs)

    def __call__(self, *inputs, **kwargs):
        kwargs.pop("return_list", None)
        outputs = super().__call__(*inputs, return_list=True, **kwargs)
        visible = outputs[: len(outputs) - self.num_dummy_outs]
        return visible[0] if len(visible) == 1 else visible

    def infer_shape(self, *args):
        """The output shapes from the shape refs.  PyTensor >= 3.3.7 calls ``infer_shape(node, input_shapes)``
        (and warns about an ``fgraph`` parameter), earlier ones ``infer_shape(fgraph, node, input_shapes)``:
        this signature takes both."""
        return self.output_shapes(args[-1])

    def connection_pattern(self, node):
        return [[info.get("gradient") != "disconnected"] * len(node.outputs) for info in self.in_info]

    def inplace_on_inputs(self, allowed_inplace_inputs):
        wanted = tuple(i for i in allowed_inplace_inputs if i in self.want_inplace_map)
        if not wanted or wanted == self.inplace:
            return self
        return self.clone_with(inplace=tuple(set(self.inplace) | set(wanted)))

    def clone_with(self, **changes):
        props = {k: getattr(self, k) for k in self.__props__}
        props.update(changes)
        return type(self)(**props)

    # ------------------------------------------------------------ gradient
    def grad_op(self) -> NativeOp:
        """The NativeOp computing this op's gradient (from ``c_bw_code``)."""
        return _grad_op_of(self.clone_with(inplace=()))

    def pullback(self, inputs, outputs, cotangents):
        if not self.c_bw_code:
            return [
                disconnected_type() if info.get("gradient") == "disconnected"
                else grad_not_implemented(self, i, inputs[i], f"NativeOp {self.name!r} has no c_bw_code")
                for i, info in enumerate(self.in_info)
            ]
        shapes = self.output_shapes([v.shape for v in inputs])
        cotangents = [
            pt.zeros(shape, dtype=out.dtype) if isinstance(g.type, DisconnectedType) else g
            for g, out, shape in zip(cotangents, outputs, shapes)
        ]
        grad_op = self.grad_op()
        grad_outputs = grad_op.make_node(*self.filter_grad_inputs(list(inputs) + list(outputs) + cotangents)).outputs
        visible = grad_outputs[: len(grad_outputs) - grad_op.num_dummy_outs]
        results = self.make_results_of_gradient(visible, disconnected_type)
        return [r if isinstance(r.type, DisconnectedType) or r.type.dtype == inp.type.dtype else pt.cast(r, inp.dtype)
                for r, inp in zip(results, inputs)]

    def L_op(self, inputs, outputs, cotangents):
        # PyTensor's entry point; a subclass changes the gradient by overriding ``pullback`` alone.
        return self.pullback(inputs, outputs, cotangents)

    # ------------------------------------------------------------ backends
    def variant(self, float_dtype: str, device: str = "cpu") -> source.Variant:
        """The variant computing in ``float_dtype`` on ``device`` (``"cpu"`` or ``"cuda"``): translation unit,
        entry point and argument plan, made once per spec (see :func:`ptnative.source.variant`; the ``inplace``
        and ``device`` props do not change it)."""
        return source.variant(self, float_dtype, device)

    def target(self, node) -> tuple[str, str]:
        """(floating dtype, device) that ``node`` runs with; see :func:`ptnative.device.resolve`."""
        return self.float_dtype_of(node), resolve_device(self)

    def node_variant(self, node) -> source.Variant:
        """The variant that ``node`` runs: :meth:`variant` of :meth:`target`.  What every glue starts from."""
        return self.variant(*self.target(node))

    def perform(self, node, inputs, output_storage):
        _glue("python").perform(self, node, inputs, output_storage)

    #: The C modes get the node's variant as a constant (see :func:`ptnative.backends.c.params`), not in the code.
    params_type = generic

    def get_params(self, node):
        return _glue("c").params(self, node)

    def c_support_code(self, **kwargs):
        return _glue("c").support_code()

    def c_support_code_struct(self, node, name):
        return _glue("c").support_code_struct(name)

    def c_init_code_struct(self, node, name, sub):
        return _glue("c").init_code_struct(name, sub)

    def c_code(self, node, name, inputs, outputs, sub):
        return _glue("c").c_code(node, name, inputs, outputs, sub)

    def c_code_cache_version_apply(self, node):
        return _glue("c").cache_version()

    def c_code_cache_version(self):
        return (source.GLUE_VERSION, *self.code_version)


@cache
def _grad_op_of(op: NativeOp) -> NativeOp:
    return NativeOp(**op.kwargs_for_grad_op(), float_dtypes=op.float_dtypes, device=op.device)


class NativeOpGenBase:
    """A spec as class attributes; :meth:`make_op` turns it into a :class:`NativeOp`.

    Subclasses set ``in_info``, ``out_info``, ``c_fw_code`` and optionally
    ``c_bw_code``, ``c_extra_support_code`` (dict, joined in sorted key order),
    ``code_version``, ``grad_input_map``, ``cpu_support``, ``float_dtypes``, ``op_class``.
    """

    in_info: tuple = None
    out_info: tuple = None
    c_fw_code: str = None
    c_bw_code: str = None
    c_extra_support_code: dict = None
    code_version = None
    grad_input_map = None
    theano_custom_grad = None
    cpu_support = True
    float_dtypes = FLOAT_DTYPES
    #: The Op class made by :meth:`make_op`; a family may use a NativeOp subclass (e.g. for a custom pullback).
    op_class = NativeOp

    @classmethod
    def map_layer_inputs_to_op(cls, *inputs):
        return inputs

    @classmethod
    def map_layer_output_from_op(cls, *outputs):
        return outputs[0]

    @classmethod
    def make_op(cls, **kwargs) -> NativeOp:
        """The :class:`NativeOp` of this spec; ``kwargs`` override attributes."""
        spec = dict(
            in_info=cls.in_info, out_info=cls.out_info, c_fw_code=cls.c_fw_code, c_bw_code=cls.c_bw_code,
            c_extra_support_code=cls.c_extra_support_code, code_version=cls.code_version,
            cpu_support=cls.cpu_support, grad_input_map=cls.grad_input_map, name=cls.__name__,
            float_dtypes=cls.float_dtypes,
        )
        spec.update(kwargs)
        return cls.op_class(**spec)
