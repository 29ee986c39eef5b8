"""JAX mode: each NativeOp becomes an XLA FFI call (``jax.ffi.ffi_call``), so it runs inside XLA on the device JAX
uses (CPU, or CUDA), with no host round trip.  One generic handler library per device (``c_code/glue/xla_ffi_handler.cc``,
:mod:`ptnative.backends.ffi_source`; built by nvcc for CUDA) serves every op: each op variant is registered with it
once per process (its entry point, in the variant's own library that every mode loads, and its argument plan), and
each call names the variant by the string attribute ``symbol`` (a hash of its source, the same in every process).
``want_inplace`` inputs are aliased to their outputs.  Under ``jax.vmap`` the
mapped axis is folded into the op's declared batch axes (spec key ``batch_axis``; one FFI call, see
:func:`fold_vmap`) where every output and every mapped input has one, else the call runs once per element.

Each op is a ``jax.custom_vjp``: ``jax.grad`` (numpyro, blackjax, PyMC's JAX samplers) gets the op's own PyTensor
pullback (its gradient op, or a family's custom pullback), jaxified, so JAX's gradients equal PyTensor's.  Output
cotangents that are zero are handed to the pullback as disconnected, as ``pytensor.grad`` does; inputs that are not
being differentiated are skipped.  A gradient the op does not have (no ``c_bw_code``) raises ``NullTypeGradError``
naming the op and the input when JAX asks for it.  The pullback graph holds gradient ops that are NativeOps too, so a
second derivative works where the spec has one (the LSTM cell).

Registration is lazy, so that importing ptnative does not import JAX: :func:`install` (run by ``import ptnative``)
hands the implementation to :func:`ptnative.backends.jax_dispatch.register_lazily`, whose graph rewrite tagged
``"jax"`` registers it; it runs only when a graph is rewritten for JAX (``pytensor.function(..., mode="JAX")``,
PyMC's ``get_jaxified_graph``).  Code that calls ``jax_funcify`` on a graph it did not rewrite for JAX calls
:func:`register` first (nothing else is needed when PyTensor's JAX dispatch was already imported before ptnative).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from .jax_dispatch import register_all, register_lazily

#: How ``jax.vmap`` maps a NativeOp's FFI call that cannot be folded into the op's batch axis (see
#: :func:`fold_vmap`): one call per element of the mapped axis.
VMAP_METHOD = "sequential"
_INTS = ctypes.POINTER(ctypes.c_int)
#: Per device, the registration function of its loaded handler library (see :func:`handler_library`).
_handlers: dict[str, ctypes._CFuncPtr] = {}
#: The (symbol, device) of every op variant registered with a handler in this process.
_variants_registered: set[tuple[str, str]] = set()
_lock = threading.Lock()


def target_name(device: str) -> str:
    """The FFI target of ``device``'s handler (one per device, shared by every op)."""
    return f"ptnative_{device}"


def handler_library(device: str):
    """Build if needed (cached like every library, :func:`ptnative.build.open_library`), load and register with
    XLA, once per process, the generic XLA FFI handler of ``device``; return its registration function
    (``ptn_xla_ffi_register``, see ``c_code/glue/xla_ffi_handler.cc``)."""
    register = _handlers.get(device)
    if register is not None:
        return register
    import jax

    from ..build import open_library
    from .ffi_source import HANDLER_SYMBOL, REGISTER_SYMBOL, handler_variant

    with _lock:
        register = _handlers.get(device)
        if register is None:
            lib = open_library(handler_variant(device, jax.ffi.include_dir()))
            register = getattr(lib, REGISTER_SYMBOL)
            register.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, _INTS,
                                 _INTS, ctypes.c_char_p]
            register.restype = ctypes.c_int
            handler = jax.ffi.pycapsule(getattr(lib, HANDLER_SYMBOL))
            jax.ffi.register_ffi_target(target_name(device), handler, platform="cpu" if device == "cpu" else "CUDA")
            _handlers[device] = register
    return register


def entry_point(variant) -> tuple[int, int]:
    """The addresses of ``variant``'s entry point in its own library (the one every mode loads: built or taken
    from the package's prebuilt libraries, checked, loaded once; BLAS set up on the CPU, cuBLAS found on CUDA),
    ``<symbol>`` on the CPU and ``ptn_<symbol>_run_on_device`` (on a given stream) on CUDA, and of its argument
    check ``<symbol>_check_arguments``."""
    from ..build import load, open_library

    if variant.device == "cpu":
        function = load(variant).run
    else:
        from ..device import load_cublas

        load_cublas()  # where the kernels' dlopen("libcublas.so.13") finds it
        function = getattr(open_library(variant), f"ptn_{variant.symbol}_run_on_device")
    check = getattr(open_library(variant), f"{variant.symbol}_check_arguments")
    return ctypes.cast(function, ctypes.c_void_p).value, ctypes.cast(check, ctypes.c_void_p).value


def _ints(values) -> ctypes.Array:
    return (ctypes.c_int * max(1, len(values)))(*map(int, values))


def ffi_target(variant) -> str:
    """Register ``variant`` (once per process) with the XLA FFI handler of its device; return the handler's target
    name.  Each FFI call then names the variant by its symbol (the attribute ``symbol``)."""
    key = (variant.symbol, variant.device)
    if key not in _variants_registered:
        # No lock: the handler's registry is thread-safe and keeps a symbol's first registration.
        register = handler_library(variant.device)
        plan = variant.plan
        name = plan.name.encode("utf-8", "surrogatepass").replace(b"\0", b"\\0")
        status = register(variant.symbol.encode(), *entry_point(variant), plan.n_in, plan.n_out,
                          _ints(plan.source_of), _ints(plan.host_memory), name)
        if status != 0:
            raise RuntimeError(f"NativeOp {plan.name!r}: the XLA FFI handler refused its argument plan")
        _variants_registered.add(key)
    return target_name(variant.device)


def ffi_forward(op, node):
    """``f(*inputs) -> tuple of every output`` (dummy ones included): the op's FFI call on JAX's device."""
    import jax

    device = "cuda" if jax.default_backend() == "gpu" else "cpu"
    if device == "cpu" and not op.cpu_support:
        raise RuntimeError(f"NativeOp {op.name!r} has no CPU implementation (cpu_support=False) and JAX runs "
                           "on the CPU")
    variant = op.variant(op.float_dtype_of(node), device)  # JAX's device, not the op's setting
    target = ffi_target(variant)
    plan = variant.plan
    aliases = {i: k for i, k in enumerate(plan.inplace_of) if k >= 0}

    wide = wide_dtypes(plan)

    def call(*inputs):
        if wide and not jax.config.jax_enable_x64:
            raise TypeError(f"{plan.label} computes with {' and '.join(wide)} arrays, but JAX runs with "
                            "jax_enable_x64 off, so it would get 32-bit ones: turn it on "
                            "(jax.config.update('jax_enable_x64', True); PyTensor does when floatX is float64) or "
                            "give the op float32 inputs")
        check_traced_call(variant, inputs)
        shapes = plan.output_shapes([np.shape(x) for x in inputs])
        result_types = [jax.ShapeDtypeStruct(tuple(shape), dt) for shape, dt in zip(shapes, plan.out_dtypes)]
        return tuple(jax.ffi.ffi_call(target, result_types, input_output_aliases=aliases,
                                      vmap_method=VMAP_METHOD)(*inputs, symbol=variant.symbol))

    mapped = fold_vmap(call, batch_axes(op.in_info), batch_axes(op.out_info))

    def forward(*inputs):
        axes = varying_axes(*inputs)
        return tuple(make_varying(o, axes) for o in mapped(*inputs))

    return forward


def check_traced_call(variant, inputs) -> None:
    """Raise the ``KernelValueError`` that ``variant``'s entry point would (its argument check, the same in every
    mode: ranks, element types, the op's fixed sizes) for a call of ``inputs``, whose shapes and dtypes are known
    when JAX traces the call.  The handler runs the same check again on every call."""
    from ..build import argument_error
    from ..errors import KernelValueError

    plan = variant.plan
    shapes = [tuple(np.shape(x)) for x in inputs]
    try:
        shapes += plan.output_shapes(shapes)
    except IndexError:  # an input has too few dimensions, which the check reports before it reads an output
        shapes += [(0,) * n for n in plan.ndims[plan.n_in:]]
    dtypes = [np.dtype(x.dtype) for x in inputs] + list(plan.out_dtypes)
    message = argument_error(variant, shapes, dtypes)
    if message is not None:
        raise KernelValueError(f"{plan.label}: {message}")


def wide_dtypes(plan) -> list[str]:
    """The 64-bit dtypes (float64, int64) among ``plan``'s arrays: JAX hands an op 32-bit ones instead when
    ``jax_enable_x64`` is off (PyTensor turns it off when ``floatX`` is float32), so tracing the op then raises."""
    return sorted({dt for dt in plan.dtypes if np.dtype(dt).itemsize == 8})


def batch_axes(infos) -> tuple:
    """Each spec entry's declared ``batch_axis``, or None."""
    return tuple(info.get("batch_axis") for info in infos)


def foldable(in_axes, out_axes, in_batched) -> bool:
    """Whether ``jax.vmap`` can fold its axis into the op's batch axis for inputs batched as ``in_batched``: every
    output has a batch axis, and so has every input that ``vmap`` maps (the others are shared by all elements, or
    have a batch axis and are repeated along it)."""
    return (all(a is not None for a in out_axes) and any(in_batched)
            and all(a is not None for a, b in zip(in_axes, in_batched) if b))


def fold_vmap(call, in_axes, out_axes):
    """``call`` (``f(*arrays) -> tuple of arrays``, one FFI call) for ``jax.vmap``: where :func:`foldable`, the
    mapped axis (size N) is folded into each entry's batch axis (size B): inputs (..., B, ...) mapped to (N, ...,
    B, ...) become (..., N * B, ...) (element n's sequence b at n * B + b), unmapped ones with a batch axis are
    repeated N times along it, one call runs, and each output (..., N * B, ...) is split back into (N, ..., B,
    ...).  Otherwise one call per element (:data:`VMAP_METHOD`).  Nested maps fold again."""
    if any(a is None for a in out_axes) or all(a is None for a in in_axes):
        return call
    import jax
    import jax.numpy as jnp
    from jax.custom_batching import custom_vmap

    folded = custom_vmap(call)

    def rule(axis_size, in_batched, *args):
        in_batched = list(in_batched)
        if not foldable(in_axes, out_axes, in_batched):
            outs = jax.vmap(call, in_axes=[0 if b else None for b in in_batched])(*args)
            return outs, (True,) * len(outs)
        merged, batch = [], None
        for x, a, b in zip(args, in_axes, in_batched):
            if a is None:
                merged.append(x)
                continue
            if not b:
                x = jnp.broadcast_to(x, (axis_size, *x.shape))
            batch = x.shape[a + 1]
            x = jnp.moveaxis(x, 0, a)
            merged.append(x.reshape(*x.shape[:a], axis_size * batch, *x.shape[a + 2:]))
        outs = []
        for y, a in zip(folded(*merged), out_axes):
            y = y.reshape(*y.shape[:a], axis_size, batch, *y.shape[a + 1:])
            outs.append(jnp.moveaxis(y, a, 0))
        return tuple(outs), (True,) * len(outs)

    folded.def_vmap(rule)
    return folded


def varying_axes(*arrays) -> frozenset:
    """The mesh axes along which any of ``arrays`` varies inside ``shard_map`` (empty outside)."""
    import jax

    axes = set()
    for x in arrays:
        aval = jax.typeof(x)
        mat = getattr(aval, "mat", None)  # JAX >= 0.9; "vma" before
        axes |= set(mat.varying if mat is not None else getattr(aval, "vma", ()))
    return frozenset(axes)


def make_varying(x, axes: frozenset):
    """``x`` marked as varying along ``axes`` too (inside ``shard_map``: each device computes its own value; JAX
    transposes the cast into the sum over devices that the gradient of a replicated input needs)."""
    import jax

    missing = tuple(sorted(axes - varying_axes(x), key=str))
    if not missing:
        return x
    return jax.lax.pcast(x, missing, to="varying") if hasattr(jax.lax, "pcast") else jax.lax.pvary(x, missing)


def _perturbation_flags(primals) -> np.ndarray:
    # Which inputs JAX differentiates, for the backward rule: in the *shape* of an empty array, so that it stays
    # static under jit and vmap (the last len(primals) dimensions: 2 perturbed, 1 not).
    return np.zeros((0, *[2 if p.perturbed else 1 for p in primals]), np.int8)


def _is_zero(cotangent) -> bool:
    from jax.custom_derivatives import SymbolicZero
    from jax.dtypes import float0

    return isinstance(cotangent, SymbolicZero) or getattr(cotangent, "dtype", None) == float0


def jaxify_graph(inputs, outputs):
    """A JAX function of ``inputs`` computing ``outputs`` (PyTensor variables), as PyMC builds one: the graph
    rewritten for JAX, then ``jax_funcify``.  It returns a sequence of arrays."""
    from pytensor.compile.mode import get_mode
    from pytensor.graph.fg import FunctionGraph
    from pytensor.link.jax.dispatch import jax_funcify

    register()
    fgraph = FunctionGraph(inputs=inputs, outputs=outputs, clone=True)
    get_mode("JAX").optimizer.rewrite(fgraph)
    return jax_funcify(fgraph)


def pullback_function(op, node, live: tuple[bool, ...], perturbed: tuple[bool, ...]):
    """``(f, positions)``: ``f(*inputs, *outputs, *live cotangents)`` returns the gradients of the inputs at
    ``positions`` (those perturbed that have one), from the op's PyTensor pullback; outputs whose cotangent is not
    ``live`` are disconnected.  Raises ``NullTypeGradError`` for a perturbed input without a gradient."""
    from pytensor.gradient import DisconnectedType, NullType, NullTypeGradError, disconnected_type

    inputs = [v.type() for v in node.inputs]
    outputs = [v.type() for v in node.outputs]
    cotangents = [v.type() if on else disconnected_type() for v, on in zip(node.outputs, live)]
    grads = op.L_op(inputs, outputs, cotangents)
    positions, wanted = [], []
    for i, (g, x) in enumerate(zip(grads, inputs)):
        if not perturbed[i] or isinstance(g.type, DisconnectedType) or not x.dtype.startswith("float"):
            continue
        if isinstance(g.type, NullType):
            name = op.in_info[i].get("name", i)
            raise NullTypeGradError(f"NativeOp {op.name!r} has no gradient with respect to input {name!r} (#{i}), "
                                    f"which JAX differentiates: {g.type.why_null}")
        positions.append(i)
        wanted.append(g if g.dtype == x.dtype else g.astype(x.dtype))
    if not wanted:
        return None, ()
    graph_inputs = inputs + outputs + [c for c, on in zip(cotangents, live) if on]
    return jaxify_graph(graph_inputs, wanted), tuple(positions)


def differentiable(op, node, forward):
    """``forward`` as a ``jax.custom_vjp`` whose backward pass is ``op``'s pullback (see the module docstring)."""
    import jax

    pullbacks = {}

    def backward(residuals, cotangents):
        values, outputs, flags = residuals
        perturbed = tuple(d == 2 for d in flags.shape[flags.ndim - len(values):])
        live = tuple(not _is_zero(c) for c in cotangents)
        key = (live, perturbed)
        if key not in pullbacks:
            # Built while JAX traces the backward pass, kept for later traces: constants that jax_funcify makes
            # with jax.numpy must be concrete arrays, not tracers of this trace (they would leak into the next).
            with jax.ensure_compile_time_eval():
                pullbacks[key] = pullback_function(op, node, live, perturbed)
        fn, positions = pullbacks[key]
        result = [None] * len(values)
        if fn is not None:
            grads = fn(*values, *outputs, *(c for c, on in zip(cotangents, live) if on))
            for i, g in zip(positions, grads):
                result[i] = make_varying(g, varying_axes(values[i]))
        return tuple(result)

    def forward_with_residuals(*primals):
        values = [p.value for p in primals]
        outputs = native_op(*values)  # itself, not the bare FFI call: a second derivative differentiates this rule
        return outputs, (values, outputs, _perturbation_flags(primals))

    native_op = jax.custom_vjp(forward)
    native_op.defvjp(forward_with_residuals, backward, symbolic_zeros=True)
    return native_op


def funcify_native_op(op, node=None, **kwargs):
    """PyTensor's ``jax_funcify`` for a NativeOp: its FFI call, differentiable, returning its outputs as the
    node has them (one array, or a tuple)."""
    import jax.numpy as jnp

    native_op = differentiable(op, node, ffi_forward(op, node))
    in_dtypes = [v.type.dtype for v in node.inputs]
    single = len(node.outputs) == 1

    def call(*inputs):
        # Constants may come as Python scalars, and an array may be of a type that converts without loss: the
        # kernel gets the exact dtypes of its node.  Any other array keeps its type, which the argument check
        # refuses (see check_traced_call).  Under shard_map one FFI call takes inputs that vary along the same
        # mesh axes.
        inputs = [jnp.asarray(x, dtype=dt) if exactly_convertible(x, dt) else x for x, dt in zip(inputs, in_dtypes)]
        axes = varying_axes(*inputs)
        outputs = native_op(*(make_varying(x, axes) for x in inputs))
        return outputs[0] if single else outputs

    return call


def exactly_convertible(x, dtype) -> bool:
    """Whether ``x`` may be handed to a kernel taking ``dtype`` converted: a Python scalar or a weakly typed JAX
    value (a literal), or an array whose every value ``dtype`` holds exactly (numpy's "safe" casting)."""
    if not hasattr(x, "dtype") or getattr(x, "weak_type", False):
        return True
    return np.can_cast(x.dtype, dtype, casting="safe")


def register() -> None:
    """Register NativeOp's JAX implementation (and every other pending one) with PyTensor's ``jax_funcify`` now
    (imports JAX; idempotent)."""
    install()
    register_all()


def install() -> None:
    """Make JAX mode find the NativeOp implementation without importing JAX now (see the module docstring and
    :mod:`ptnative.backends.jax_dispatch`)."""
    from ..op import NativeOp

    register_lazily(NativeOp, funcify_native_op)
