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


def marginals_brute_force(le, lA, ld, lpi, lens, censored=True):
    """p(z_t = k | x_b) (T, B, K) by enumeration of every segmentation (0 on padded frames and for a sequence
    without a path)."""
    le = np.asarray(le, np.float64)
    T, B, K = le.shape
    out = np.zeros((T, B, K))
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        ldb, lpib = _per_sequence(ld, b, 2), _per_sequence(lpi, b, 1)
        vals, paths = [], []
        for states, durs in segmentations(L, K, ldb.shape[-1]):
            vals.append(segmentation_log_weight(le[:, b], lA, ldb, lpib, states, durs, censored))
            paths.append([k for k, d in zip(states, durs) for _ in range(d)])
        if not logsumexp(vals) > -np.inf:
            continue
        w = np.exp(np.array(vals) - logsumexp(vals))
        for p, wp in zip(paths, w):
            out[np.arange(L), b, p] += wp
    return out


def segment_path_posterior(le_b, lA, ld, lpi, L, censored=True):
    """{path tuple: posterior probability} of one sequence (le_b: (T, K)) by enumeration."""
    K, D = np.shape(ld)
    vals, paths = [], []
    for states, durs in segmentations(L, K, D):
        vals.append(segmentation_log_weight(le_b, lA, ld, lpi, states, durs, censored))
        paths.append(tuple(k for k, d in zip(states, durs) for _ in range(d)))
    vals = np.array(vals)
    return dict(zip(paths, np.exp(vals - logsumexp(vals))))


def _pick(x, u):
    """The index drawn with uniform u from the weights exp(x - max x), summed in index order (as the kernel does):
    the first whose cumulative weight exceeds u times the total; -1 if every x is -inf."""
    top = np.max(x)
    if not top > -np.inf:
        return -1
    w = np.exp(x - top)
    total = 0.0
    for v in w:
        total += v
    acc, target = 0.0, u * total
    for i, v in enumerate(w):
        acc += v
        if acc > target and v > 0:
            return i
    return int(np.flatnonzero(w > 0)[-1])


def sample_states(le, lA, ld, lpi, lens, uniforms, censored=True):
    """Paths (T, B) int32 drawn by backward filtering, forward sampling with the kernel's use of the uniforms: the
    segment starting at frame s is the pair (k, d), flat index k * n + d - 1 over n = min(D, L - s) durations,
    drawn with uniforms[s, b] from its posterior given the previous segment's state.  -1 on padded frames and for
    a sequence without a path."""
    le = np.asarray(le, np.float64)
    T, B, K = le.shape
    lA_off = np.where(np.eye(K) > 0, -np.inf, np.asarray(lA, np.float64))
    path = np.full((T, B), -1, np.int32)
    for b in range(B):
        L = int(lens[b])
        ldb, lpib = _per_sequence(ld, b, 2), _per_sequence(lpi, b, 1)
        D = ldb.shape[-1]
        lW = survival(ldb) if censored else ldb

        def segment(k, s, d, after):
            """log weight of a segment of k over frames s..s+d-1 with everything after it (after: (L,) of k)."""
            e = s + d - 1
            tail = lW[k, d - 1] if e == L - 1 else ldb[k, d - 1] + after[e]
            return le[s:e + 1, b, k].sum() + tail

        # after[e, k]: log weight of every continuation after a segment of k ending at frame e (0 at e = L - 1)
        after = np.full((L, K), -np.inf)
        begin = np.full((L, K), -np.inf)  # begin[s, k]: a segment of k starts at s, with everything after it
        for s in range(L - 1, -1, -1):
            if s < L - 1:
                after[s] = logsumexp(lA_off + begin[s + 1][None, :], axis=1)
            for k in range(K):
                begin[s, k] = logsumexp([segment(k, s, d, after[:, k]) for d in range(1, min(D, L - s) + 1)])
        s, prev = 0, None
        while s < L:
            n = min(D, L - s)
            x = np.array([(lpib[k] if prev is None else lA_off[prev, k]) + segment(k, s, d, after[:, k])
                          for k in range(K) for d in range(1, n + 1)])
            i = _pick(x, uniforms[s, b])
            if i < 0:
                path[:, b] = -1
                break
            prev, d = divmod(i, n)
            path[s:s + d + 1, b] = prev
            s += d + 1
    return path
