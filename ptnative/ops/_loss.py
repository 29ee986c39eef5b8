"""The base of ops whose forward pass returns a per-sequence loss and its gradient."""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, disconnected_type, grad_not_implemented

from ..op import NativeOp

__all__ = ["LossWithGradOp"]


class LossWithGradOp(NativeOp):
    """A NativeOp whose output 0 is a per-sequence loss ``(B,)`` and output 1 the gradient of each
    ``loss[b]`` with respect to input 0, computed in the forward pass.

    The pullback is ``cotangent(loss)[b] * grad`` along :attr:`grad_batch_axis` (the batch axis of
    output 1), cast to input 0's dtype; with no cotangent on the loss it is zeros.  Only output 0 is
    differentiable (a cotangent on any other output gives ``grad_not_implemented``, so second
    derivatives are not implemented), and only with respect to input 0.  A family sets the batch
    axis in a subclass and names it as its generator's ``op_class``."""

    #: The batch axis of output 1 (the one ``loss`` runs over).
    grad_batch_axis = 0

    def pullback(self, inputs, outputs, cotangents):
        x = inputs[0]
        result = [disconnected_type() for _ in inputs]
        if any(not isinstance(g.type, DisconnectedType) for g in cotangents[1:]):
            result[0] = grad_not_implemented(
                self, 0, x, f"NativeOp {self.name!r}: only the {self.out_info[0]['name']!r} output has a gradient")
            return result
        g_loss = cotangents[0]
        if isinstance(g_loss.type, DisconnectedType):
            result[0] = pt.zeros_like(x)
            return result
        grad = outputs[1]
        pattern = ["x"] * grad.ndim
        pattern[self.grad_batch_axis] = 0
        scaled = g_loss.dimshuffle(*pattern) * grad
        result[0] = scaled if scaled.dtype == x.dtype else pt.cast(scaled, x.dtype)
        return result
