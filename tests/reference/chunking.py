"""Numpy references for chunking, written from the definitions with plain loops."""

import numpy as np


def n_chunks(T, size, step):
    """The smallest number of chunks, starting every ``step`` frames, whose last one reaches the end."""
    n = 1
    while (n - 1) * step + size < T:
        n += 1
    return n


def chunk(x, index, size, step):
    T, B, D = x.shape
    nc = n_chunks(T, size, step)
    out = np.zeros((size, B * nc, D))
    oindex = np.zeros((size, B * nc))
    for b in range(B):
        for c in range(nc):
            for i in range(size):
                t = c * step + i
                if t < T and index[t, b] > 0.1:
                    out[i, b * nc + c] = x[t, b]
                    oindex[i, b * nc + c] = 1
    return out, oindex


def unchunk(x, index, size, step, T, B):
    nc = n_chunks(T, size, step)
    D = x.shape[2]
    total = np.zeros((T, B, D))
    count = np.zeros((T, B))
    for b in range(B):
        for c in range(nc):
            for i in range(size):
                t = c * step + i
                if t < T and index[i, b * nc + c] > 0.1:
                    total[t, b] += x[i, b * nc + c]
                    count[t, b] += 1
    out = total / np.maximum(count, 1)[:, :, None]
    factors = np.where(count > 0, 1 / np.maximum(count, 1), 1.0)
    return out, (count > 0).astype(float), factors


def linear_map_transpose(fn, in_shape, d_out):
    """``J^T d_out`` for a linear ``fn`` (the gradient), from its Jacobian built column by column."""
    n = int(np.prod(in_shape))
    grad = np.zeros(n)
    for k in range(n):
        e = np.zeros(n)
        e[k] = 1
        grad[k] = np.sum(fn(e.reshape(in_shape)) * d_out)
    return grad.reshape(in_shape)
