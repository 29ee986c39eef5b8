"""Numpy references for batched indexing and the sparse ops: dense formulations and plain loops."""

import math

import numpy as np


def index_of(v, n):
    """trunc(v) when -1 < v < n, else None."""
    if not (v > -1 and v < n):
        return None
    return int(math.trunc(v))


def subtensor_batched_index(x, idx):
    T, B, D = x.shape
    y = np.zeros((T, B))
    for t in range(T):
        for b in range(B):
            v = idx[t, b]
            k = D - 1 if v >= D else 0 if not v > -1 else int(math.trunc(v))
            y[t, b] = x[t, b, k]
    return y


def dense_targets(s0, s1, w, mask, T, D):
    """The dense (T, B, D) matrix of COO entries that count (mask >= 0.1, in range); duplicates add up."""
    N, B = s0.shape
    W = np.zeros((T, B, D))
    for i in range(N):
        for b in range(B):
            t, j = index_of(s0[i, b], T), index_of(s1[i, b], D)
            if mask[i, b] >= 0.1 and t is not None and j is not None:
                W[t, b, j] += w[i, b]
    return W


def sparse_to_dense_weight_grad(s0, s1, mask, dW):
    T, B, D = dW.shape
    N = s0.shape[0]
    g = np.zeros((N, B))
    for i in range(N):
        for b in range(B):
            t, j = index_of(s0[i, b], T), index_of(s1[i, b], D)
            if mask[i, b] >= 0.1 and t is not None and j is not None:
                g[i, b] = dW[t, b, j]
    return g


def max_and_argmax_sparse(s0, s1, w, mask, out_max, out_arg):
    out_max, out_arg = out_max.astype(float).copy(), out_arg.astype(float).copy()
    T = out_max.shape[0]
    N, B = s0.shape
    for b in range(B):
        for i in range(N):
            t = index_of(s0[i, b], T)
            if mask[i, b] >= 0.1 and t is not None and w[i, b] > out_max[t, b]:
                out_max[t, b] = w[i, b]
                out_arg[t, b] = math.trunc(s1[i, b])
    return out_max, out_arg


def crossentropy_softmax_sparse(z, z_mask, s0, s1, w, mask):
    """(ce, grad_z, d ce.sum() / dz, d ce.sum() / dw) from the dense target matrix."""
    T, B, D = z.shape
    y = dense_targets(s0, s1, w, mask, T, D)
    valid = (z_mask > 0.5)[:, :, None]
    zs = z - z.max(axis=2, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(axis=2, keepdims=True))
    p = np.exp(logp)
    ce = np.where(valid[:, :, 0], -(y * logp).sum(axis=2), 0.0)
    grad = np.where(valid, p - y, 0.0)
    dz = np.where(valid, y.sum(axis=2, keepdims=True) * p - y, 0.0)
    N = s0.shape[0]
    dw = np.zeros((N, B))
    for i in range(N):
        for b in range(B):
            t, j = index_of(s0[i, b], T), index_of(s1[i, b], D)
            if mask[i, b] >= 0.1 and t is not None and j is not None and z_mask[t, b] > 0.5:
                dw[i, b] = -logp[t, b, j]
    return ce, grad, dz, dw
