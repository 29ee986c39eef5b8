"""The inplace rewrite: a NativeOp whose ``want_inplace`` inputs may be
destroyed becomes its inplace variant (``destroy_map``), wherever PyTensor's
destroy handler allows; protected graph inputs and values needed later keep
their copy."""

from __future__ import annotations

from pytensor.compile import optdb
from pytensor.graph.destroyhandler import inplace_candidates
from pytensor.graph.rewriting.basic import WalkingGraphRewriter, dfs_rewriter, node_rewriter

from .op import NativeOp


@node_rewriter([NativeOp], inplace=True)
def native_op_inplace(fgraph, node):
    op = node.op
    wanted = [i for i in op.want_inplace_map if i not in op.inplace]
    if not wanted:
        return False
    candidates = set(inplace_candidates(fgraph, [node.inputs[i] for i in wanted]))
    allowed = [i for i in wanted if node.inputs[i] in candidates]
    if not allowed:
        return False
    new_op = op.inplace_on_inputs(allowed)
    if new_op is op:
        return False
    return new_op.make_node(*node.inputs).outputs


optdb.register(
    "ptnative_inplace",
    dfs_rewriter(native_op_inplace, ignore_newtrees=True, failure_callback=WalkingGraphRewriter.warn_inplace),
    "fast_run", "inplace",
    position=50.3,
)
