"""Numpy LSTM references (float64), written from the math: forward and
backpropagation through time."""

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_generic_forward(Z, V_h, c, i):
    """LstmGenericBase: returns Y (T,B,n), H (T,B,4n) = [s, ig, fg, og], d (B,n)."""
    Z, V_h, c, i = (np.asarray(a, dtype=np.float64) for a in (Z, V_h, c, i))
    T, B, n4 = Z.shape
    n = n4 // 4
    Y = np.zeros((T, B, n))
    H = np.zeros((T, B, n4))
    s_prev, y_prev = c.copy(), np.zeros((B, n))
    for t in range(T):
        a = Z[t] + (y_prev @ V_h if t > 0 else 0.0)
        cell_in = np.tanh(a[:, :n])
        ig, fg, og = sigmoid(a[:, n:2 * n]), sigmoid(a[:, 2 * n:3 * n]), sigmoid(a[:, 3 * n:])
        m = i[t][:, None]
        s = (ig * cell_in + fg * s_prev) * m + s_prev * (1 - m)
        y = og * np.tanh(s) * m
        H[t] = np.concatenate([s, ig, fg, og], axis=1)
        Y[t] = y
        s_prev, y_prev = s, y
    return Y, H, s_prev


def lstm_generic_backward(Z, V_h, c, i, DY, Dd):
    """Gradients (DZ, DV_h, Dc) of sum(Y * DY) + sum(d * Dd)."""
    Z, V_h, c, i, DY, Dd = (np.asarray(a, dtype=np.float64) for a in (Z, V_h, c, i, DY, Dd))
    T, B, n4 = Z.shape
    n = n4 // 4
    Y, H, _ = lstm_generic_forward(Z, V_h, c, i)
    DZ = np.zeros_like(Z)
    DV = np.zeros_like(V_h)
    ds_next = Dd.copy()
    dy_rec = np.zeros((B, n))
    for t in reversed(range(T)):
        s_prev = H[t - 1][:, :n] if t > 0 else c
        y_prev = Y[t - 1] if t > 0 else np.zeros((B, n))
        a = Z[t] + (y_prev @ V_h if t > 0 else 0.0)
        cell_in = np.tanh(a[:, :n])
        ig, fg, og = sigmoid(a[:, n:2 * n]), sigmoid(a[:, 2 * n:3 * n]), sigmoid(a[:, 3 * n:])
        s = H[t][:, :n]
        m = i[t][:, None]
        dy = DY[t] + dy_rec
        ds = dy * og * (1 - np.tanh(s) ** 2) * m + ds_next
        da = np.concatenate([
            ds * ig * m * (1 - cell_in ** 2),
            ds * cell_in * m * ig * (1 - ig),
            ds * s_prev * m * fg * (1 - fg),
            dy * np.tanh(s) * m * og * (1 - og),
        ], axis=1)
        DZ[t] = da
        if t > 0:
            dy_rec = da @ V_h.T
            DV += y_prev.T @ da
        ds_next = ds * fg * m + ds * (1 - m)
    return DZ, DV, ds_next
