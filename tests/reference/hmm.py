"""Independent references for the HMM inference ops: enumeration of every state path on tiny models, a numpy
log-space Viterbi for larger ones (the log-space forward-backward is ``reference.fsa.hmm_posteriors``), and
central finite differences."""

import itertools

import numpy as np
from scipy.special import logsumexp


def _args(log_e, log_f, lens):
    log_e = np.asarray(log_e, dtype=np.float64)
    T, B, K = log_e.shape
    log_f = np.zeros(K) if log_f is None else np.asarray(log_f, dtype=np.float64)
    lens = np.full(B, T) if lens is None else np.asarray(lens)
    return log_e, log_f, lens


def path_log_probs(log_e_b, log_A, log_pi, log_f, L):
    """{path: log p(x, path)} over all K**L state paths of one sequence (log_e_b: (T, K))."""
    K = log_e_b.shape[1]
    out = {}
    for z in itertools.product(range(K), repeat=L):
        v = log_pi[z[0]] + log_e_b[0, z[0]] + log_f[z[-1]]
        for t in range(1, L):
            v += log_A[z[t - 1], z[t]] + log_e_b[t, z[t]]
        out[z] = v
    return out


def brute_force(log_e, log_A, log_pi, log_f=None, lens=None):
    """By enumeration: log-likelihood (B,), marginals (T, B, K), counts (B, K, K), Viterbi path (T, B) int32
    (-1 padded; ties: the path smallest when read from the last frame backwards) and score (B,)."""
    log_e, log_f, lens = _args(log_e, log_f, lens)
    log_A, log_pi = np.asarray(log_A, np.float64), np.asarray(log_pi, np.float64)
    T, B, K = log_e.shape
    ll, score = np.zeros(B), np.zeros(B)
    gamma, xi = np.zeros((T, B, K)), np.zeros((B, K, K))
    path = np.full((T, B), -1, np.int32)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        lp = path_log_probs(log_e[:, b], log_A, log_pi, log_f, L)
        vals = np.array(list(lp.values()))
        ll[b] = logsumexp(vals)
        best = vals.max()
        score[b] = best
        if best > -np.inf:
            path[:L, b] = min((z for z, v in lp.items() if v == best), key=lambda z: z[::-1])
        for z, v in lp.items():
            w = np.exp(v - ll[b])
            for t in range(L):
                gamma[t, b, z[t]] += w
            for t in range(1, L):
                xi[b, z[t - 1], z[t]] += w
    return ll, gamma, xi, path, score


def viterbi(log_e, log_A, log_pi, log_f=None, lens=None):
    """Numpy log-space Viterbi: path (T, B) int32 (-1 padded) and score (B,); ties to the lowest state."""
    log_e, log_f, lens = _args(log_e, log_f, lens)
    T, B, K = log_e.shape
    path = np.full((T, B), -1, np.int32)
    score = np.zeros(B)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        delta = log_pi + log_e[0, b]
        bps = []
        for t in range(1, L):
            cand = delta[:, None] + log_A
            bps.append(np.argmax(cand, axis=0))  # argmax: the first (lowest) maximum
            delta = cand.max(axis=0) + log_e[t, b]
        final = delta + log_f
        score[b] = final.max()
        if score[b] == -np.inf:
            continue
        z = int(np.argmax(final))
        for t in range(L - 1, -1, -1):
            path[t, b] = z
            if t > 0:
                z = int(bps[t - 1][z])
    return path, score


def finite_difference(f, x, eps=1e-6):
    """Central differences of the scalar function f at x (float64 array), same shape as x."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def forward_varying(log_e, log_A, log_pi, log_f=None, lens=None):
    """Log-space forward with per-frame, per-sequence transitions: log_A broadcast to (T-1, B, K, K) (frame t uses
    log_A[t-1, b]), log_pi broadcast to (B, K).  log p(x_b) per sequence (0 for the empty series)."""
    log_e, log_f, lens = _args(log_e, log_f, lens)
    T, B, K = log_e.shape
    log_A = np.broadcast_to(np.asarray(log_A, np.float64), (max(T - 1, 0), B, K, K))
    log_pi = np.broadcast_to(np.asarray(log_pi, np.float64), (B, K))
    out = np.zeros(B)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        la = log_pi[b] + log_e[0, b]
        for t in range(1, L):
            la = logsumexp(la[:, None] + log_A[t - 1, b], axis=0) + log_e[t, b]
        out[b] = logsumexp(la + log_f)
    return out
