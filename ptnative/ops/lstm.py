"""LSTM ops (kernels in ``c_code/lstm.cu``)."""

from __future__ import annotations

from ..op import NativeOpGenBase
from ..source import read_kernel_file


class LstmGenericBase(NativeOpGenBase):
    """LSTM over precomputed input projections, without peepholes or y0.

    Inputs:
      * ``Z`` (T, B, 4n): input projections, gates ``[cell-in | input | forget | output]``;
      * ``V_h`` (n, 4n): recurrent matrix;
      * ``c`` (B, n): initial cell state;
      * ``i`` (T, B): mask, 1 on valid frames and 0 on padding (no gradient).

    Outputs:
      * ``Y`` (T, B, n): ``o * tanh(s) * i``; 0 on masked frames (and that 0 is the
        recurrent input of the next frame);
      * ``H`` (T, B, 4n): per frame ``[s, input gate, forget gate, output gate]``
        (the state, then the activated gates); Z's buffer when inplace;
      * ``d`` (B, n): the cell state after the last frame (masked frames carry it).

    At frame t: ``H[t] = Z[t] + Y[t-1] . V_h`` (no recurrent term at t = 0),
    ``s = (ig * tanh(z) + fg * s_prev) * i + s_prev * (1 - i)``.  T = 0 gives
    ``d = c``.  Gradients flow to Z, V_h and c from Y and d; a gradient into H is
    ignored (as in the seed).  Float32 and float64.  Shape mismatches raise
    ``ValueError``.
    """

    in_info = (
        {"name": "Z", "ndim": 3, "shape": (None, None, None), "need_contiguous": True, "want_inplace": 1,
         "bw_out_var": {"shape": ((2, 0), (2, 1), (0, 1))}},
        {"name": "V_h", "ndim": 2, "shape": (None, None), "need_contiguous": True},
        {"name": "c", "ndim": 2, "shape": (None, None), "need_contiguous": True},
        {"name": "i", "ndim": 2, "shape": (None, None), "need_contiguous": True, "gradient": "disconnected"},
    )
    out_info = (
        {"name": "Y", "ndim": 3, "shape": ((0, 0), (0, 1), (1, 0)), "need_contiguous": True,
         "bw_grad_var": {"want_inplace": "dummy_out"}},
        {"name": "H", "ndim": 3, "shape": ((0, 0), (0, 1), (0, 2)), "need_contiguous": True,
         "bw_in_var": {"want_inplace": 0}},
        {"name": "d", "ndim": 2, "shape": ((2, 0), (2, 1)), "need_contiguous": True},
    )

    @classmethod
    def grad_input_map(cls, Z, V_h, c, i, Y, H, d, DY, DH, Dd):
        return V_h, c, i, Y, H, DY, Dd

    c_extra_support_code = {"lstm": read_kernel_file("lstm.cu")}
    c_fw_code = "lstm_generic_fw(n_inputs, inputs, n_outputs, outputs);"
    c_bw_code = "lstm_generic_bw(n_inputs, inputs, n_outputs, outputs);"
    code_version = (1,)


#: RETURNN's name for :class:`LstmGenericBase`.
NativeLstm = LstmGenericBase
