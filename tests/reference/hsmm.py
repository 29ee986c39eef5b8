"""Independent references for the explicit-duration HMM ops: enumeration of every segmentation on tiny models, and
the equivalent HMM on K * D expanded states (state, time spent in it so far) for ptnative's HMM functions."""

import itertools

import numpy as np
from scipy.special import logsumexp


def survival(log_d):
    """log L_k(d) = log sum_{d' >= d} p_k(d') along the last axis."""
    log_d = np.asarray(log_d, np.float64)
    return np.logaddexp.accumulate(log_d[..., ::-1], axis=-1)[..., ::-1]


def compositions(L, D):
    """Every tuple of durations in 1..D summing to L."""
    if L == 0:
        yield ()
        return
    for d in range(1, min(D, L) + 1):
        for rest in compositions(L - d, D):
            yield (d, *rest)


def segmentations(L, K, D):
    """Every (states, durations) of a series of L frames: consecutive states differ."""
    for durs in compositions(L, D):
        for states in itertools.product(range(K), repeat=len(durs)):
            if all(a != b for a, b in zip(states, states[1:])):
                yield states, durs


def _per_sequence(x, b, ndim):
    x = np.asarray(x, np.float64)
    return x[b] if x.ndim == ndim + 1 else x


def segmentation_log_weight(le_b, lA, ld, lpi, states, durs, censored):
    """log weight of one segmentation of one sequence (le_b: (T, K))."""
    lW = survival(ld) if censored else ld
    v, t = lpi[states[0]], 0
    for j, (k, d) in enumerate(zip(states, durs)):
        last = j == len(states) - 1
        v += (lW if last else ld)[k, d - 1] + le_b[t:t + d, k].sum()
        if not last:
            v += lA[k, states[j + 1]]
        t += d
    return v


def brute_force(le, lA, ld, lpi, lens, censored=True):
    """By enumeration: log-likelihood (B,), Viterbi score (B,) and the set of best paths per sequence (a list of
    sets of tuples)."""
    le = np.asarray(le, np.float64)
    T, B, K = le.shape
    lA = np.asarray(lA, np.float64)
    ll, score, best = np.zeros(B), np.zeros(B), []
    for b in range(B):
        L = int(lens[b])
        ldb, lpib = _per_sequence(ld, b, 2), _per_sequence(lpi, b, 1)
        if L == 0:
            best.append({()})
            continue
        vals, paths = [], []
        for states, durs in segmentations(L, K, ldb.shape[-1]):
            vals.append(segmentation_log_weight(le[:, b], lA, ldb, lpib, states, durs, censored))
            paths.append(tuple(k for k, d in zip(states, durs) for _ in range(d)))
        vals = np.array(vals)
        ll[b] = logsumexp(vals) if len(vals) else -np.inf
        score[b] = vals.max() if len(vals) else -np.inf
        best.append({p for p, v in zip(paths, vals) if v == score[b]} if score[b] > -np.inf else set())
    return ll, score, best


def expanded_hmm(lA, ld, lpi, censored=True, K=None, D=None, xp=np):
    """The HMM over (state k, time spent r = 1..D) equal to the HSMM (state index k * D + r - 1): it starts in
    (k, 1) with pi(k) L_k(1), goes on to (k, r + 1) with L_k(r + 1) / L_k(r), leaves for (j, 1), j != k, with
    p_k(r) / L_k(r) A(k, j) L_j(1), and ends in (k, r) with weight 1 (censored) or p_k(r) / L_k(r): one path per
    segmentation, of the segmentation's weight.  On numpy arrays, or (xp=pytensor.tensor, K and D given) on symbols
    of (K, K), (K, D), (K,) with finite durations.  Returns (log_transitions, log_initial, log_final)."""
    symbolic = xp is not np
    if not symbolic:
        lA, ld, lpi = (np.asarray(a, np.float64) for a in (lA, ld, lpi))
        K, D = ld.shape
        lL = survival(ld)
        with np.errstate(invalid="ignore"):
            hazard = np.where(np.isfinite(lL), ld - lL, -np.inf)  # log p(r) / L(r)
            stay = np.where(np.isfinite(lL[:, :-1]), lL[:, 1:] - lL[:, :-1], -np.inf)  # log L(r+1) / L(r)
        lA_off = np.where(np.eye(K) > 0, -np.inf, lA)
    else:
        lL = xp.log(xp.cumsum(xp.exp(ld)[:, ::-1], axis=1))[:, ::-1]
        hazard = ld - lL
        stay = lL[:, 1:] - lL[:, :-1]
        lA_off = xp.where(xp.eye(K) > 0, -np.inf, lA)
    leave = hazard[:, :, None] + lA_off[:, None, :] + lL[None, None, :, 0]  # (k, r) -> (j, 1): (K, D, K)
    if not symbolic:
        big = np.full((K, D, K, D), -np.inf)
        big[:, :, :, 0] = leave
        for k in range(K):
            big[k, np.arange(D - 1), k, np.arange(1, D)] = stay[k]
        init = np.full((K, D), -np.inf)
        init[:, 0] = lpi + lL[:, 0]
    else:
        big = xp.full((K, D, K, D), -np.inf, dtype=ld.dtype)
        big = xp.set_subtensor(big[:, :, :, 0], leave)
        for k in range(K):
            big = xp.set_subtensor(big[k, np.arange(D - 1), k, np.arange(1, D)], stay[k])
        init = xp.set_subtensor(xp.full((K, D), -np.inf, dtype=ld.dtype)[:, 0], lpi + lL[:, 0])
    log_final = xp.zeros(K * D) if censored else hazard.reshape((K * D,))
    return big.reshape((K * D, K * D)), init.reshape((K * D,)), log_final
