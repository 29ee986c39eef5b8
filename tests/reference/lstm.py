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


# ---------------------------------------------------------------- NativeLstm2, LstmLowMem, TwoDLSTM, lstm_cell
def visited_frames(T, start, step, lowmem=False):
    """The frames an op visits, in order (NativeLstm2's rule, or LstmLowMem's for step < 0)."""
    if T == 0:
        return []
    if step > 0:
        return list(range(start, T, step))
    stop = start if lowmem else 0
    return list(range(T - 1 - start, stop - 1, step))


def _gates4(a, n):
    return np.tanh(a[:, :n]), sigmoid(a[:, n:2 * n]), sigmoid(a[:, 2 * n:3 * n]), sigmoid(a[:, 3 * n:])


def native_lstm2_forward(X, W, y0, c0, i, start, step):
    """NativeLstm2: Y, C, H (activated gates on visited frames, 0 on their masked rows, X elsewhere), d."""
    X, W, y0, c0, i = (np.asarray(a, dtype=np.float64) for a in (X, W, y0, c0, i))
    T, B, n4 = X.shape
    n = n4 // 4
    Y, C, H = np.zeros((T, B, n)), np.zeros((T, B, n)), X.copy()
    y_prev, c_prev = y0.copy(), c0.copy()
    for t in visited_frames(T, start, step):
        a, ig, fg, og = _gates4(X[t] + y_prev @ W, n)
        m = i[t][:, None]
        c = (c_prev * fg + a * ig) * m + c_prev * (1 - m)
        y = np.tanh(c) * og * m
        H[t] = np.where(m != 0, np.concatenate([a, ig, fg, og], axis=1), 0.0)
        Y[t], C[t] = y, c
        y_prev = y + y_prev * (1 - m)
        c_prev = c
    return Y, C, H, c_prev


def lstm_lowmem_forward(X, W, b, y0, c0, i, start, step):
    """LstmLowMem: Y, C, d."""
    X, W, b, y0, c0, i = (np.asarray(a, dtype=np.float64) for a in (X, W, b, y0, c0, i))
    T, B, _ = X.shape
    n = y0.shape[1]
    Y, C = np.zeros((T, B, n)), np.zeros((T, B, n))
    y_prev, c_prev = y0.copy(), c0.copy()
    for t in visited_frames(T, start, step, lowmem=True):
        a, ig, fg, og = _gates4(np.concatenate([X[t], y_prev], axis=1) @ W + b, n)
        m = i[t][:, None]
        c = (c_prev * fg + a * ig) * m + c_prev * (1 - m)
        Y[t] = np.tanh(c) * og * m
        C[t] = c
        y_prev, c_prev = Y[t], c
    return Y, C, c_prev


def twod_lstm_forward(X, V_h, V_v, W, b, sizes, initial_state, initial_output=None, iteration=0.0):
    """TwoDLSTM, cell by cell: CompleteY (h,w,B,n), H (h,w,B,5n) = [i, f, lambda, o, state]."""
    X, V_h, V_v, W, b, sizes, initial_state = (np.asarray(a, dtype=np.float64)
                                               for a in (X, V_h, V_v, W, b, sizes, initial_state))
    h, w, B, _ = X.shape
    n = V_h.shape[0]
    Y = np.zeros((h, w, B, n))
    H = np.zeros((h, w, B, 5 * n))
    for y in range(h):
        for x in range(w):
            a = X[y, x] @ W + b
            if x > 0:
                a = a + Y[y, x - 1] @ V_h
            if y > 0:
                a = a + Y[y - 1, x] @ V_v
            elif iteration >= 1:
                a = a + np.asarray(initial_output, dtype=np.float64)[0, x] @ V_v
            ig, fg, lg, og = (sigmoid(a[:, k * n:(k + 1) * n]) for k in range(4))
            z = np.tanh(a[:, 4 * n:])
            s_up = H[y - 1, x, :, 4 * n:] if y > 0 else initial_state[0, x, :, 4 * n:]
            s_left = H[y, x - 1, :, 4 * n:] if x > 0 else 0.0
            v = ((y < sizes[:, 0]) & (x < sizes[:, 1])).astype(np.float64)[:, None]
            s = v * (ig * z + fg * lg * s_up + fg * (1 - lg) * s_left)
            Y[y, x] = v * og * np.tanh(s)
            H[y, x] = np.concatenate([ig, fg, lg, og, s], axis=1)
    return Y, H


def lstm_cell_forward(c_prev, x):
    """chainer's LSTM activation, straight from its definition (gates interleaved along axis 1)."""
    c_prev, x = np.asarray(c_prev, dtype=np.float64), np.asarray(x, dtype=np.float64)
    bx = x.shape[0]
    r = x.reshape((bx, x.shape[1] // 4, 4) + x.shape[2:])
    a, i, f, o = (r[:, :, k] for k in range(4))
    c = c_prev.copy()
    c[:bx] = np.tanh(a) * sigmoid(i) + sigmoid(f) * c_prev[:bx]
    h = sigmoid(o) * np.tanh(c[:bx])
    return c, h


def numeric_grad(f, args, wrt, eps=1e-6):
    """Central finite differences of the scalar ``f(*args)`` w.r.t. ``args[k]`` for k in ``wrt``."""
    args = [np.array(a, dtype=np.float64) for a in args]
    grads = []
    for k in wrt:
        g = np.zeros_like(args[k])
        flat, gflat = args[k].reshape(-1), g.reshape(-1)
        for j in range(flat.size):
            old = flat[j]
            flat[j] = old + eps
            fp = f(*args)
            flat[j] = old - eps
            fm = f(*args)
            flat[j] = old
            gflat[j] = (fp - fm) / (2 * eps)
        grads.append(g)
    return grads
