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


def _per_frame(log_A, log_pi, T, B, K):
    """log_A broadcast to (T-1, B, K, K) (from (K, K), (B, K, K) or (T-1, B, K, K)), log_pi to (B, K)."""
    log_A = np.broadcast_to(np.asarray(log_A, np.float64), (max(T - 1, 0), B, K, K))
    return log_A, np.broadcast_to(np.asarray(log_pi, np.float64), (B, K))


def _log_forward(log_e_b, log_A_b, log_pi_b, L):
    """The log-space forward vectors (L, K) of one sequence (log_e_b (T, K), log_A_b (T-1, K, K))."""
    la = np.zeros((L, log_e_b.shape[1]))
    la[0] = log_pi_b + log_e_b[0]
    for t in range(1, L):
        la[t] = logsumexp(la[t - 1][:, None] + log_A_b[t - 1], axis=0) + log_e_b[t]
    return la


def path_log_probs(log_e_b, log_A_b, log_pi, log_f, L):
    """{path: log p(x, path)} over all K**L state paths of one sequence (log_e_b: (T, K); log_A_b: (K, K), or
    (T-1, K, K) with entry t-1 the transition into frame t)."""
    K = log_e_b.shape[1]
    log_A_b = np.broadcast_to(log_A_b, (max(L - 1, 0), K, K)) if np.ndim(log_A_b) == 2 else log_A_b
    out = {}
    for z in itertools.product(range(K), repeat=L):
        v = log_pi[z[0]] + log_e_b[0, z[0]] + log_f[z[-1]]
        for t in range(1, L):
            v += log_A_b[t - 1, z[t - 1], z[t]] + log_e_b[t, z[t]]
        out[z] = v
    return out


def brute_force(log_e, log_A, log_pi, log_f=None, lens=None):
    """By enumeration: log-likelihood (B,), marginals (T, B, K), counts (B, K, K), Viterbi path (T, B) int32
    (-1 padded; ties: the path smallest when read from the last frame backwards) and score (B,).  log_A: (K, K),
    (B, K, K) or (T-1, B, K, K) (frame t uses log_A[t-1, b]); log_pi: (K,) or (B, K)."""
    log_e, log_f, lens = _args(log_e, log_f, lens)
    T, B, K = log_e.shape
    log_A, log_pi = _per_frame(log_A, log_pi, T, B, K)
    ll, score = np.zeros(B), np.zeros(B)
    gamma, xi = np.zeros((T, B, K)), np.zeros((B, K, K))
    path = np.full((T, B), -1, np.int32)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        lp = path_log_probs(log_e[:, b], log_A[:, b], log_pi[b], log_f, L)
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
    """Numpy log-space Viterbi: path (T, B) int32 (-1 padded) and score (B,); ties to the lowest state.  log_A,
    log_pi as in :func:`brute_force`."""
    log_e, log_f, lens = _args(log_e, log_f, lens)
    T, B, K = log_e.shape
    log_A, log_pi = _per_frame(log_A, log_pi, T, B, K)
    path = np.full((T, B), -1, np.int32)
    score = np.zeros(B)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        delta = log_pi[b] + log_e[0, b]
        bps = []
        for t in range(1, L):
            cand = delta[:, None] + log_A[t - 1, b]
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


def forward_backward(log_e, log_A, log_pi, log_f=None, lens=None):
    """Numpy log-space forward-backward: marginals (T, B, K) (0 on padded frames) and counts (B, K, K) summed over
    the frames; log_A, log_pi as in :func:`brute_force`."""
    log_e, log_f, lens = _args(log_e, log_f, lens)
    T, B, K = log_e.shape
    log_A, log_pi = _per_frame(log_A, log_pi, T, B, K)
    gamma, xi = np.zeros((T, B, K)), np.zeros((B, K, K))
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        la = _log_forward(log_e[:, b], log_A[:, b], log_pi[b], L)
        lb = np.zeros((L, K))
        lb[L - 1] = log_f
        for t in range(L - 1, 0, -1):
            lb[t - 1] = logsumexp(log_A[t - 1, b] + (log_e[t, b] + lb[t])[None, :], axis=1)
        ll = logsumexp(la[L - 1] + log_f)
        gamma[:L, b] = np.exp(la + lb - ll)
        for t in range(1, L):
            xi[b] += np.exp(la[t - 1][:, None] + log_A[t - 1, b] + (log_e[t, b] + lb[t])[None, :] - ll)
    return gamma, xi


def sample(log_e, log_A, log_pi, log_f, lens, uniforms):
    """Forward filtering, backward sampling in log space driven by ``uniforms`` (T, B): frame T_b - 1 first, then
    each earlier frame given the next; with uniform u the state is the first whose cumulative weight exceeds u
    times the total.  Path (T, B) int32, -1 on padded frames and for sequences without a path.  log_A, log_pi as in
    :func:`brute_force`."""
    log_e, log_f, lens = _args(log_e, log_f, lens)
    T, B, K = log_e.shape
    log_A, log_pi = _per_frame(log_A, log_pi, T, B, K)
    path = np.full((T, B), -1, np.int32)

    def pick(logw, u):
        w = np.exp(logw - logw.max())
        return int(np.argmax(np.cumsum(w) > u * w.sum()))

    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        la = _log_forward(log_e[:, b], log_A[:, b], log_pi[b], L)
        if logsumexp(la[L - 1] + log_f) == -np.inf:
            continue
        z = pick(la[L - 1] + log_f, uniforms[L - 1, b])
        path[L - 1, b] = z
        for t in range(L - 2, -1, -1):
            z = pick(la[t] + log_A[t, b][:, z], uniforms[t, b])
            path[t, b] = z
    return path


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
    log_A, log_pi = _per_frame(log_A, log_pi, T, B, K)
    out = np.zeros(B)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        out[b] = logsumexp(_log_forward(log_e[:, b], log_A[:, b], log_pi[b], L)[-1] + log_f)
    return out
