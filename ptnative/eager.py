"""Catalogue functions called on numpy arrays: ``ptnative.eager.<name>(...)`` returns numpy arrays.

``ptnative.eager.hmm_viterbi(log_e, log_A, log_pi)`` builds ``ptnative.hmm_viterbi``'s graph on symbolic inputs of
the arguments' dtypes and ranks, compiles it once (PyTensor's mode at that time, ``trust_input=True``) and calls it;
later calls whose arrays have the same dtypes and ranks, and whose other arguments are equal, call the compiled
function again: no graph and no PyTensor input check per call.  :func:`wrap` does the same for any function that
builds PyTensor outputs from tensors.  Where the compiled graph is one ptnative op reading the arrays as they are
(``hmm_viterbi``, ``hmm_posteriors``, ``edit_distance``, ...), its driver is called directly, without PyTensor's
function call: the same kernel, entry point and checks as the graph's (the Numba mode's driver).

What counts as data: numpy arrays and numpy scalars (anything else that is array-like, such as a list, is not:
it is passed to the function as it is and compiled in as a constant, so a new value compiles again).  An array
that is not aligned or not in the machine's byte order is copied first; every other layout (strided, negative
strides, Fortran order) is passed as it is.  Arrays are never modified, and each call returns new arrays.

Compiled functions are kept per thread (a PyTensor function is not safe to call from two threads at once), the
last :data:`CACHE_SIZE` signatures of each function; the first call of a signature in a thread compiles (from the
kernel cache: no C compile after the first time).  Errors are the function's own: its argument checks when the
graph is built, the kernels' when it runs.
"""

from __future__ import annotations

import inspect
import threading

import numpy as np

#: How many signatures (dtypes, ranks, other arguments) of one function each thread keeps compiled.
CACHE_SIZE = 32


class EagerFunction:
    """``build`` (a function of tensors returning a tensor, a tuple or list of them, or plain values) called on
    numpy arrays; see the module's documentation.  ``mode``: PyTensor's compile mode (default: PyTensor's mode
    when a signature is first compiled)."""

    def __init__(self, build, mode=None, name=None):
        self.build = build
        self.mode = mode
        self.__name__ = name or getattr(build, "__name__", type(build).__name__)
        self.__doc__ = (f"{self.__name__} on numpy arrays (ptnative.eager); the function's documentation:\n\n"
                        f"{inspect.getdoc(build) or ''}")
        self._local = threading.local()

    def __repr__(self):
        return f"<ptnative.eager function {self.__name__}>"

    def __call__(self, *args, **kwargs):
        local = self._local
        last = local.__dict__.get("last")
        if last is not None and not kwargs:
            # the thread's last signature, where it calls an op's driver compiled for those argument types alone:
            # Numba's dispatch checks every argument (a TypeError, before anything runs, for any other types)
            fn, layout = last
            try:
                out = fn(*args)
            except TypeError:  # the drivers raise no TypeError: another signature
                local.last = None
                local.misses = local.__dict__.get("misses", 0) + 1
            else:
                return out if layout is None else layout(out)
        # positional, aligned ndarrays: the key of their dtypes and ranks (a byte-swapped dtype is one that _call
        # never stores in arrays_only)
        key = []
        for a in args:
            if type(a) is not np.ndarray or not a.flags.aligned:
                return self._call(args, kwargs)
            key.append(a.dtype)
            key.append(a.ndim)
        try:
            fn, layout, typed = local.arrays_only[tuple(key)]
        except (AttributeError, KeyError):
            return self._call(args, kwargs)
        if kwargs:
            return self._call(args, kwargs)
        out = fn(*args) if layout is None else layout(fn(*args))
        self._first_try(typed, args, layout)
        return out

    def _call(self, args, kwargs):
        """Any call: the key of every argument, the compiled function of the key (compiled on a miss), the call."""
        key, arrays = [], []
        for a in args:
            key.append(_key(self.__name__, a, arrays))
        for k, a in kwargs.items():
            key.append(k)
            key.append(_key(self.__name__, a, arrays))
        key = tuple(key)
        local = self._local
        if not hasattr(local, "cache"):
            local.cache, local.arrays_only = {}, {}
        entry = local.cache.get(key)
        if entry is None:
            entry = _remember(local.cache, key, self._compile(args, kwargs, arrays))
            if not kwargs and all(type(a) is np.ndarray and a.dtype.isnative and a.flags.aligned for a in args):
                _remember(local.arrays_only, sum(key, ()), entry)
        fn, layout, typed = entry
        if fn is None:  # build returns no tensor for these arguments (a plain value): nothing to compile
            return self.build(*args, **kwargs)
        out = fn(*arrays) if layout is None else layout(fn(*arrays))
        if not kwargs and len(arrays) == len(args):
            self._first_try(typed, arrays, layout)
        return out

    def _first_try(self, typed, arrays, layout):
        """Where the call (of ``arrays`` alone) ran an op's driver: that driver compiled for these argument types
        becomes the thread's first try (after two misses in this thread, each a ~30 us TypeError from Numba, calls
        of mixed signatures no longer try it)."""
        local = self._local.__dict__
        if typed is not None and local.get("last") is None and local.get("misses", 0) < 2:
            local["last"] = (typed(arrays), layout)

    def _compile(self, args, kwargs, arrays):
        """(compiled function, a function turning its outputs into the results' structure or None where they have
        it already, the ``typed`` maker of :func:`_one_op` or None), or (None, None, None) where ``build`` returns
        no tensor."""
        import pytensor
        from pytensor.graph.basic import Variable

        names = _parameter_names(self.build, args, kwargs)
        inputs = [_symbol(self.__name__, a, name) for a, name in zip(arrays, names)]
        symbols = iter(inputs)
        sym_args = [next(symbols) if _is_data(a) else a for a in args]
        sym_kwargs = {k: next(symbols) if _is_data(a) else a for k, a in kwargs.items()}
        out = self.build(*sym_args, **sym_kwargs)
        single = isinstance(out, Variable)
        items = [out] if single else list(out) if isinstance(out, (tuple, list)) else None
        if items is None or not any(isinstance(o, Variable) for o in items):
            return None, None, None
        where = [k for k, o in enumerate(items) if isinstance(o, Variable)]
        fn = pytensor.function(inputs, [items[k] for k in where], mode=self.mode, trust_input=True,
                               on_unused_input="ignore")
        direct, typed = _one_op(fn) if self.mode is None else (None, None)  # direct returns a tuple
        fn = direct or _numpy_results(fn)
        if single:
            return fn, lambda results: results[0], typed
        if len(where) == len(items) and type(out) in (tuple, list):
            return fn, None if direct and type(out) is tuple else type(out), typed

        def layout(results):
            filled = list(items)
            for k, r in zip(where, results):
                filled[k] = r
            return type(out)(filled) if type(out) in (tuple, list) else type(out)._make(filled)

        return fn, layout, typed


def _numpy_results(fn):
    """``fn``, or where its linker returns arrays of another library (JAX's, PyTorch's: a ``JITLinker`` other than
    Numba's), ``fn`` with its results made numpy arrays."""
    from pytensor.link.basic import JITLinker
    from pytensor.link.numba.linker import NumbaLinker

    linker = fn.maker.linker
    if not isinstance(linker, JITLinker) or isinstance(linker, NumbaLinker):
        return fn
    return lambda *arrays: [np.asarray(r) for r in fn(*arrays)]


def _one_op(fn):
    """Where ``fn``'s graph is one ptnative op reading the inputs as they are and returning outputs of its own:
    (that op's driver called directly, taking ``fn``'s inputs and returning its outputs as a tuple, and a function
    of such inputs giving the driver compiled for their types alone, or None where inputs are reordered); else
    (None, None).  The driver is :func:`ptnative.backends.numba.python_callable`'s: the kernel of the graph,
    without PyTensor's function call around it."""
    import numba

    from .backends.numba import python_callable
    from .op import NativeOp

    fgraph = fn.maker.fgraph
    nodes = fgraph.toposort()
    if len(nodes) != 1 or not isinstance(nodes[0].op, NativeOp):
        return None, None
    node = nodes[0]
    take = [_position(v, fgraph.inputs) for v in node.inputs]
    give = [_position(o, node.outputs) for o in fgraph.outputs]
    if None in take or None in give:
        return None, None
    driver = python_callable(node.op, node)
    if take == list(range(len(fgraph.inputs))) and give == list(range(len(node.outputs))):
        return driver, lambda arrays: python_callable(node.op, node, tuple(numba.typeof(a) for a in arrays))
    return lambda *arrays: (lambda out: tuple([out[k] for k in give]))(driver(*[arrays[k] for k in take])), None


def _position(v, variables):
    """The index of ``v`` (the object itself) in ``variables``, or None."""
    return next((k for k, x in enumerate(variables) if x is v), None)


def _remember(cache, key, entry):
    """``cache[key] = entry``, dropping the oldest entry beyond :data:`CACHE_SIZE`; returns ``entry``."""
    cache[key] = entry
    if len(cache) > CACHE_SIZE:
        del cache[next(iter(cache))]
    return entry


def _key(function, a, arrays):
    """The key of one argument: (dtype, rank) for a numpy array or scalar, appended to ``arrays`` (aligned, in
    the machine's byte order), else the value itself as a hashable key."""
    if isinstance(a, (np.ndarray, np.generic)):
        a = np.asarray(a)
        if not a.dtype.isnative or not a.flags.aligned:
            a = np.require(a, a.dtype.newbyteorder("="), ["ALIGNED"])
        arrays.append(a)
        return (a.dtype, a.ndim)
    return ("=", type(a), _frozen(function, a))


def _is_data(a) -> bool:
    return isinstance(a, (np.ndarray, np.generic))


def _symbol(function, a, name):
    """A symbolic input of ``a``'s dtype and rank named ``name``."""
    import pytensor.tensor as pt

    try:
        var = pt.tensor(name=name, dtype=str(a.dtype), shape=(None,) * a.ndim)
    except TypeError as e:
        raise TypeError(f"{function}: argument {name!r} has dtype {a.dtype}, which PyTensor has no tensor of "
                        f"({e})") from None
    return var


def _parameter_names(build, args, kwargs):
    """The parameter name of each data argument (positional first, then keywords), for the symbols' names."""
    try:
        bound = inspect.signature(build).bind(*args, **kwargs).arguments
        by_id = {id(v): k for k, v in bound.items()}
    except (TypeError, ValueError):
        by_id = {}
    names = [by_id.get(id(a), f"arg{i}") for i, a in enumerate(args) if _is_data(a)]
    return names + [k for k, a in kwargs.items() if _is_data(a)]


def _frozen(function, value):
    """``value`` as a hashable key (lists and tuples element by element, dicts by sorted items)."""
    from pytensor.graph.basic import Variable

    if isinstance(value, Variable):
        raise TypeError(f"{function}: got the symbolic {value!r}; ptnative.eager takes numpy arrays (call "
                        f"ptnative.{function} to build a graph)")
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_frozen(function, v) for v in value))
    if isinstance(value, dict):
        return ("dict", *sorted((k, _frozen(function, v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"{function}: an argument of type {type(value).__name__} is neither a numpy array nor "
                        f"hashable: pass data as numpy arrays") from None
    return value


def wrap(build, mode=None):
    """``build`` (a function of tensors returning tensors) as a function of numpy arrays returning numpy arrays,
    compiled once per signature and thread in ``mode`` (PyTensor's default at compile time when None).  See the
    module's documentation for what is data and what is compiled in."""
    return EagerFunction(build, mode)


def __getattr__(name):
    from . import ops

    if name not in ops.FUNCTIONS:
        raise AttributeError(f"module 'ptnative.eager' has no attribute {name!r} (the catalogue's functions are "
                             f"{', '.join(sorted(ops.FUNCTIONS))})")
    fn = globals()[name] = EagerFunction(ops.FUNCTIONS[name], name=name)  # found without __getattr__ from now on
    return fn


def __dir__():
    from . import ops

    return sorted({*globals(), *ops.FUNCTIONS})

