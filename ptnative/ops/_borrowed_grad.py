"""The base of ops that run another op's kernel in another shape (without its hidden outputs, or fused with its
gradient) and take that op's gradient."""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, disconnected_type, grad_not_implemented

from ..op import NativeOp

__all__ = ["BorrowedGradientOp"]


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
