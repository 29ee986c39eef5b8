"""The seed graph's input projection fused into the layer op: ``X = dot(x, W_in) + b`` feeding NativeLstm2 becomes one
NativeLstm2Layer node, and its gradient graph (NativeLstm2's gradient op, then ``x``'s, ``W_in``'s and ``b``'s
gradients computed from its ``DX`` by PyTensor) one layer gradient node.  See docs/lstm.md, "The seed graph".

The rewrite recognises the projection and its gradients by construction, not by the forms of particular ops: ``X`` must
be exactly what ``pt.dot(x, W_in)`` (or ``pt.matmul``) builds, plus a bias broadcast over time and batch, for
variables ``x`` (3-d) and ``W_in`` (2-d) of the graph, and the gradients must be exactly what ``pytensor.grad`` builds
from ``DX`` for them.  It runs right after the first merge (before canonicalization changes the forms)."""

from __future__ import annotations

import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.compile import optdb
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply, Constant, equal_computations
from pytensor.graph.rewriting.basic import dfs_rewriter, node_rewriter
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.shape import Shape, Shape_i

from ..op import NativeOp

try:
    from pytensor.graph.traversal import io_toposort
except ImportError:  # PyTensor before the traversal module
    from pytensor.graph.basic import io_toposort

__all__ = ["REWRITE_NAME", "projection_fusion", "register"]

#: The rewrite's name and tag in ``pytensor.compile.optdb`` (``mode.excluding(REWRITE_NAME)`` turns it off).
REWRITE_NAME = "ptnative_lstm_projection_fusion"
#: Its position: after the first merge (0) and before PyTensor's "useless" pass (0.6) and canonicalization (1).
POSITION = 0.5

#: The functions whose graph of ``x . W_in`` (x 3-d, W_in 2-d) the rewrite recognises.
_PRODUCTS = (pt.dot, pt.matmul)
#: How deep below the projection its ``x`` and ``W_in`` are looked for (pt.dot: reshape(dot(reshape(x), W_in))).
_OPERAND_DEPTH = 4
#: How far below ``DX`` the gradient expressions are looked for.
_GRADIENT_DEPTH = 8


def _ancestors_upto(var, depth):
    """The variables of ``var``'s graph at most ``depth`` nodes above it (``var`` included), nearest first."""
    seen, level, found = {var}, [var], [var]
    for _ in range(depth):
        level = [i for v in level if v.owner is not None for i in v.owner.inputs if i not in seen]
        level = list(dict.fromkeys(level))
        seen.update(level)
        found += level
    return found


def _match_product(P):
    """``(x, W_in)`` when ``P`` is exactly what one of ``_PRODUCTS`` builds for a 3-d ``x`` and a 2-d ``W_in`` of its
    dtype; None otherwise."""
    if P.owner is None or P.ndim != 3:
        return None
    near = _ancestors_upto(P, _OPERAND_DEPTH)[1:]
    xs = [v for v in near if v.ndim == 3 and v.dtype == P.dtype]
    ws = [v for v in near if v.ndim == 2 and v.dtype == P.dtype]
    for product in _PRODUCTS:
        for x in xs:
            for W_in in ws:
                try:
                    built = product(x, W_in)
                except (TypeError, ValueError):
                    continue
                if built.type == P.type and equal_computations([P], [built]):
                    return x, W_in
    return None


def _is_add(var):
    return (var.owner is not None and isinstance(var.owner.op, Elemwise) and isinstance(var.owner.op.scalar_op, ps.Add)
            and len(var.owner.inputs) == 2)


def _is_bias(bias, X):
    """A term of X's dtype broadcast over time and batch, not over the gate columns."""
    return bias.ndim == 3 and bias.dtype == X.dtype and bias.type.broadcastable == (True, True, False)


def match_projection(X):
    """``(x, W_in, bias)`` when ``X`` is ``x . W_in`` (:func:`_match_product`) plus, in either order, a ``bias``
    broadcast over X's first two axes (the 3-d input of the add; None without a bias); None otherwise."""
    if _is_add(X):
        for P, bias in (X.owner.inputs, X.owner.inputs[::-1]):
            if _is_bias(bias, X) and P.type == X.type and (xw := _match_product(P)):
                return (*xw, bias)
        return None
    xw = _match_product(X)
    return (*xw, None) if xw else None


def _gradient_op_nodes(fgraph, node):
    """The nodes of ``node.op.grad_op()`` on ``node``'s inputs and outputs among the clients of ``node``'s outputs,
    each with its cotangent inputs per output of ``node`` (None where the gradient op does not take it)."""
    op = node.op
    grad_op = op.grad_op()
    n_in, n_out = len(node.inputs), len(node.outputs)
    candidates = list(range(n_in + 2 * n_out))
    expected = op.filter_grad_inputs(list(node.inputs) + list(node.outputs) + [None] * n_out)
    positions = op.filter_grad_inputs(candidates)
    found = []
    for out in node.outputs:
        for client, _ in fgraph.clients.get(out, ()):
            if not isinstance(client, Apply) or client.op != grad_op or client in (g for g, _ in found):
                continue
            if all(e is None or e is v for e, v in zip(expected, client.inputs)):
                cotangents = [None] * n_out
                for pos, v in zip(positions, client.inputs):
                    if pos >= n_in + n_out:
                        cotangents[pos - n_in - n_out] = v
                found.append((client, cotangents))
    return found


def _only_clients(fgraph, var, nodes):
    """Whether every client of ``var`` in ``fgraph`` is one of ``nodes`` (a graph output is not)."""
    return all(isinstance(c, Apply) and c in nodes for c, _ in fgraph.clients.get(var, ()))


def _find_in_graph(fgraph, start, expression):
    """A variable of ``fgraph`` below ``start`` (at most ``_GRADIENT_DEPTH`` nodes) that computes exactly
    ``expression``; None if there is none."""
    if expression.owner is None:
        return expression if expression is start else None
    level, seen = [start], {start}
    for _ in range(_GRADIENT_DEPTH):
        nxt = []
        for v in level:
            for client, _ in fgraph.clients.get(v, ()):
                if not isinstance(client, Apply):
                    continue
                for out in client.outputs:
                    if out in seen:
                        continue
                    seen.add(out)
                    nxt.append(out)
                    if (client.op == expression.owner.op and out.type == expression.type
                            and equal_computations([out], [expression])):
                        return out
        level = nxt
    return None


def _projection_gradients(fgraph, X, DX, operands):
    """``{operand: its gradient in fgraph}`` for the operands (x, W_in, bias) whose gradient, exactly as
    ``pytensor.grad`` builds it from ``DX`` for X's graph, is a variable of ``fgraph``; None when the graph uses ``DX``
    anywhere else (another gradient, a graph output), so that nothing computed from ``DX`` would be left."""
    wrt = [v for v in operands if v is not None and not isinstance(v, Constant)]
    built = pytensor.grad(None, wrt, known_grads={X: DX}, disconnected_inputs="ignore", return_disconnected="none")
    found = {}
    for v, g in zip(wrt, built):
        if g is not None and (match := _find_in_graph(fgraph, DX, g)) is not None:
            found[v] = match
    # every node between DX and the gradients found must serve them alone
    targets = set(found.values())
    between, reached = set(), {DX}
    for n in io_toposort([DX], list(targets)):
        if any(i in reached for i in n.inputs):
            between.add(n)
            reached.update(n.outputs)
    if not _only_clients(fgraph, DX, between):
        return None
    if not all(out in targets or _only_clients(fgraph, out, between) for n in between for out in n.outputs):
        return None
    return found


def _backward_replacements(fgraph, node, gradient_node, layer_op, layer_inputs, layer_outputs, X, operands):
    """What the backward rewrite of :func:`projection_fusion` replaces: the gradient node's outputs other than ``DX``
    and the operands' gradients computed from ``DX`` by the layer gradient's outputs; {} when the graph does not
    match."""
    grad_node, cotangents = gradient_node
    x, W_in, bias = operands
    found = _projection_gradients(fgraph, X, grad_node.outputs[0], operands)
    if not found or W_in not in found:
        return {}  # the layer's gradient would compute W_in's (and x's) gradient for nothing: more than it saves
    cotangents = [disconnected_type() if c is None else c for c in cotangents]
    layer_grads = layer_op.pullback(layer_inputs, layer_outputs, cotangents)
    visible = grad_node.outputs[:len(grad_node.outputs) - grad_node.op.num_dummy_outs]
    value_grads = node.op.make_results_of_gradient(visible)
    # the value op's inputs after X are the layer's after (x, W_in): W at 2, then (after b) the rest from 4
    replacements = {old: layer_grads[2 if k == 1 else k + 2] for k, old in enumerate(value_grads)
                    if k and old is not None}
    dx, dW_in, _, db = layer_grads[:4]
    ours = {x: dx, W_in: dW_in}
    if bias is not None:
        ours[bias] = db.dimshuffle("x", "x", 0)
    replacements.update((old, ours[operand]) for operand, old in found.items())
    return replacements


def projection_fusion(value_spec, layer_spec):
    """The node rewriter putting ``layer_spec``'s op (inputs ``x, W_in, W, b`` then ``value_spec``'s inputs after its
    first two, the same outputs) where ``value_spec``'s op (first input ``X``, second ``W``) takes
    ``X = x . W_in (+ b)`` (:func:`match_projection`) that nothing else uses.

    Forward: the value node's outputs become the layer node's, when every client of its ``H`` output (the gates'
    workspace, which the layer holds without the bias on frames not visited) is the value op's gradient op.  Backward:
    when the graph has one such gradient node and every use of its ``DX`` is the gradient of ``x``, ``W_in`` or ``b``
    exactly as ``pytensor.grad`` builds it, they and the gradient node's other outputs become the layer gradient's;
    otherwise the gradient node stays (it reads the layer's gates as it read the value op's)."""
    value_name = value_spec.__name__

    @node_rewriter([NativeOp])
    def fuse(fgraph, node):
        op = node.op
        if op.name != value_name or op.inplace:
            return None
        X = node.inputs[0]
        # the gradient graph takes X's shape (for the zeros of disconnected cotangents): the layer's H has that shape
        shape_of_X = {c for c, _ in fgraph.clients.get(X, ())
                      if isinstance(c, Apply) and isinstance(c.op, Shape | Shape_i)}
        if not _only_clients(fgraph, X, {node, *shape_of_X}):
            return None
        matched = match_projection(X)
        if matched is None:
            return None
        x, W_in, bias = matched
        gradient_nodes = _gradient_op_nodes(fgraph, node)
        H = node.outputs[2]
        if not _only_clients(fgraph, H, {g for g, _ in gradient_nodes}):
            return None
        W = node.inputs[1]
        b = bias.dimshuffle(2) if bias is not None else pt.zeros((W.shape[1],), dtype=X.dtype)
        layer_op = layer_spec.make_op(device=op.device, float_dtypes=op.float_dtypes)
        layer_inputs = [x, W_in, W, b, *node.inputs[2:]]
        layer_outputs = layer_op(*layer_inputs)
        replacements = dict(zip(node.outputs, layer_outputs))
        replacements.update((c.outputs[0], c.op(layer_outputs[2])) for c in shape_of_X)
        if len(gradient_nodes) == 1:
            replacements.update(_backward_replacements(fgraph, node, gradient_nodes[0], layer_op, layer_inputs,
                                                       layer_outputs, X, (x, W_in, bias)))
        try:
            return {old: old.type.filter_variable(new, allow_convert=True) for old, new in replacements.items()}
        except TypeError:
            return None

    fuse.__name__ = f"fuse_{value_name}_input_projection"
    return fuse


def register(value_spec, layer_spec):
    """Registers :func:`projection_fusion` of the two specs in ``optdb`` as ``REWRITE_NAME`` (``fast_run``,
    ``fast_compile``)."""
    if REWRITE_NAME not in optdb:
        optdb.register(REWRITE_NAME, dfs_rewriter(projection_fusion(value_spec, layer_spec), ignore_newtrees=True),
                       "fast_run", "fast_compile", position=POSITION)
