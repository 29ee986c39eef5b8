"""The base of ops that run another op's kernel in another shape (without its hidden outputs, or fused with its
gradient) and take that op's gradient."""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, disconnected_type, grad_not_implemented

from ..op import NativeOp

__all__ = ["BorrowedGradientOp", "value_and_gradient_fusion"]


class BorrowedGradientOp(NativeOp):
    """A NativeOp whose first :attr:`shared_outputs` outputs are those of :attr:`gradient_spec`'s op on its first
    inputs, and whose gradient is that op's: the pullback builds that op's node on those inputs and calls its
    pullback with this op's cotangents of the shared outputs (its other outputs disconnected).  This op's further
    inputs get zeros (the shared outputs do not depend on them), or nothing where they are disconnected.  A
    cotangent on an output past the shared ones (e.g. a fused gradient: second derivatives) gives
    ``grad_not_implemented`` for every connected input, so ``pytensor.grad`` and JAX raise instead of returning
    zeros.  Rewrites put these ops in place of the donor op where a graph allows it; a family sets the two
    attributes in a subclass and names it as its generator's ``op_class``."""

    #: The spec (``NativeOpGenBase`` subclass) whose op computes the shared outputs and lends its gradient.
    gradient_spec = None
    #: How many leading outputs this op shares with the donor.
    shared_outputs = 1

    def pullback(self, inputs, outputs, cotangents):
        connected = [info.get("gradient") != "disconnected" for info in self.in_info]
        if any(not isinstance(g.type, DisconnectedType) for g in cotangents[self.shared_outputs:]):
            names = [info["name"] for info in self.out_info[:self.shared_outputs]]
            why = f"NativeOp {self.name!r}: only its outputs {names} have a gradient"
            return [grad_not_implemented(self, i, x, why) if on else disconnected_type()
                    for i, (x, on) in enumerate(zip(inputs, connected))]
        donor = self.gradient_spec.make_op(device=self.device, float_dtypes=self.float_dtypes)
        n = len(donor.in_info)
        node = donor.make_node(*inputs[:n])
        donor_cotangents = list(cotangents[:self.shared_outputs])
        donor_cotangents += [disconnected_type() for _ in node.outputs[self.shared_outputs:]]
        grads = donor.pullback(list(inputs[:n]), node.outputs, donor_cotangents)
        return grads + [pt.zeros_like(x) if on else disconnected_type() for x, on in zip(inputs[n:], connected[n:])]


def value_and_gradient_fusion(value_spec, fused_spec):
    """A node rewriter (for ``register_specialize``) that puts one ``fused_spec`` node in place of a node of
    ``value_spec``'s op and the node of its gradient op on the same inputs (the gradient op's inputs: the value op's
    inputs, then the upstream gradient of its one output), when the upstream gradient does not depend on the value
    (as for ``ll.sum()``).  ``fused_spec``'s op takes the gradient op's inputs and returns the value, then the
    gradients; its op class is a :class:`BorrowedGradientOp` lending ``value_spec``'s gradient."""
    from pytensor.graph.rewriting.basic import node_rewriter

    try:
        from pytensor.graph.traversal import ancestors
    except ImportError:  # PyTensor before the traversal module
        from pytensor.graph.basic import ancestors

    value_name, grad_name = value_spec.__name__, "GradOf" + value_spec.__name__
    n_inputs = len(value_spec.in_info)

    @node_rewriter([NativeOp])
    def fuse(fgraph, node):
        if node.op.name != grad_name or len(node.inputs) != n_inputs + 1:
            return None
        inputs = node.inputs[:n_inputs]
        forward = next((client for client, _ in fgraph.clients.get(inputs[0], ())
                        if client != "output" and isinstance(getattr(client, "op", None), NativeOp)
                        and client.op.name == value_name and client.inputs == inputs
                        and client.op.device == node.op.device and client.op.float_dtypes == node.op.float_dtypes),
                       None)
        if forward is None or forward.outputs[0] in set(ancestors([node.inputs[n_inputs]])):
            return None
        fused = fused_spec.make_op(device=node.op.device, float_dtypes=node.op.float_dtypes)(*node.inputs)
        replacements = {forward.outputs[0]: fused[0]}
        replacements.update(zip(node.outputs, fused[1:]))
        return replacements

    fuse.__name__ = f"fuse_{value_name}_value_and_gradient"
    return fuse
