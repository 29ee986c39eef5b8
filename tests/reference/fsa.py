"""Independent numpy references for the automaton ops: brute-force path
enumeration, a log-space forward-backward over an edge list, Graves' CTC
recursion over the extended label sequence, and a log-space HMM forward."""

from __future__ import annotations

import itertools

import numpy as np
from scipy.special import logsumexp


def lengths_from_mask(mask):
    return np.asarray(mask).sum(axis=0).astype(int)


# ------------------------------------------------------------------ edge-list automata
def enumerate_paths(edges, start, end, seq, length, max_paths=200000):
    """All edge sequences of ``length`` from ``start`` to ``end`` using edges of sequence ``seq``."""
    own = [e for e in range(edges.shape[1]) if edges[3, e] == seq]
    out_edges = {}
    for e in own:
        out_edges.setdefault(int(edges[0, e]), []).append(e)
    paths = []

    def rec(state, prefix):
        if len(prefix) == length:
            if state == end:
                paths.append(tuple(prefix))
            return
        for e in out_edges.get(state, ()):
            prefix.append(e)
            rec(int(edges[1, e]), prefix)
            prefix.pop()
            if len(paths) > max_paths:
                raise RuntimeError("too many paths")

    rec(int(start), [])
    return paths


def brute_force_bw(am_scores, edges, weights, start_end, lens, end_list=None):
    """-log p and posteriors by enumerating every path (tiny cases only).

    ``am_scores`` / ``weights`` in -log space.  ``end_list``: optional list of
    (seq, state, -log weight) replacing ``start_end[1]``.  Returns ``nll`` (B,)
    (inf without a path) and ``post`` (T, B, D) probabilities (0 without a path)."""
    T, B, D = am_scores.shape
    nll = np.full(B, np.inf)
    post = np.zeros((T, B, D))
    for b in range(B):
        ends = [(s, w) for (sb, s, w) in end_list if sb == b] if end_list is not None else [(start_end[1, b], 0.0)]
        scores, paths = [], []
        for end, end_w in ends:
            for p in enumerate_paths(edges, start_end[0, b], end, b, lens[b]):
                scores.append(sum(weights[e] + am_scores[t, b, edges[2, e]] for t, e in enumerate(p)) + end_w)
                paths.append(p)
        scores = np.array(scores, dtype=float)
        if not len(scores) or np.all(np.isinf(scores)):
            continue
        nll[b] = -logsumexp(-scores)
        probs = np.exp(-(scores - nll[b]))
        for pr, p in zip(probs, paths):
            for t, e in enumerate(p):
                post[t, b, edges[2, e]] += pr
    return nll, post


def forward_backward_edges(am_scores, edges, weights, start_end, lens):
    """Log-space forward-backward over the edge list (float64), one sequence at a time."""
    T, B, D = am_scores.shape
    n_states = int(max(edges[:2].max(initial=-1), start_end.max(initial=-1))) + 1
    nll = np.full(B, np.inf)
    post = np.zeros((T, B, D))
    for b in range(B):
        own = np.nonzero(edges[3] == b)[0]
        fr, to, em = edges[0, own], edges[1, own], edges[2, own]
        w = weights[own].astype(float)
        L = lens[b]
        la = np.full((L + 1, n_states), -np.inf)
        la[0, start_end[0, b]] = 0.0
        for t in range(L):
            v = la[t, fr] - w - am_scores[t, b, em]
            for k in range(len(own)):
                la[t + 1, to[k]] = np.logaddexp(la[t + 1, to[k]], v[k])
        lb = np.full((L + 1, n_states), -np.inf)
        lb[L, start_end[1, b]] = 0.0
        for t in range(L - 1, -1, -1):
            v = lb[t + 1, to] - w - am_scores[t, b, em]
            for k in range(len(own)):
                lb[t, fr[k]] = np.logaddexp(lb[t, fr[k]], v[k])
        logp = la[L, start_end[1, b]]
        if logp == -np.inf:
            continue
        nll[b] = -logp
        for t in range(L):
            xi = la[t, fr] - w - am_scores[t, b, em] + lb[t + 1, to] - logp
            for k in range(len(own)):
                post[t, b, em[k]] += np.exp(xi[k])
    return nll, post


def viterbi_brute(am_scores, edges, weights, start_end, lens):
    """Best path by enumeration (+log scores); ties: the backtrace's lowest edge index
    at every frame from the last one, i.e. the smallest reversed edge sequence."""
    T, B, D = am_scores.shape
    scores = np.full(B, -np.inf)
    align = np.zeros((T, B), dtype=np.int32)
    for b in range(B):
        best = None
        for p in enumerate_paths(edges, start_end[0, b], start_end[1, b], b, lens[b]):
            s = sum(float(weights[e]) + float(am_scores[t, b, edges[2, e]]) for t, e in enumerate(p))
            key = (-s, tuple(reversed(p)))
            if best is None or key < best[0]:
                best = (key, p, s)
        if best is not None and best[2] > -np.inf:
            scores[b] = best[2]
            for t, e in enumerate(best[1]):
                align[t, b] = edges[2, e]
    return align, scores


# ------------------------------------------------------------------ CTC
def ctc_fsa_seed_slots(targets, tlens, blank, label_loop=True):
    """The CTC automaton's edge list (4, E) and start/end states (2, B), slot by slot as the seed's
    GetCtcFsaFastBwOp lays them out (written from its description): per sequence 5 (N - 1) + 10 slots, states
    offset (2N + 3) b, local states 2k blank, 2k + 1 label k, 2L + 1 dummy, 2L + 2 end.  A slot that is not
    used is dummy -> dummy with the blank."""
    targets = np.asarray(targets)
    B, N = targets.shape
    per_seq = 5 * (N - 1) + 10
    edges = np.zeros((4, B * per_seq), np.int64)
    start_end = np.zeros((2, B), np.int64)
    for b in range(B):
        L, off, y = int(tlens[b]), (2 * N + 3) * b, [int(v) for v in targets[b]]
        dummy, end = 2 * L + 1, 2 * L + 2
        slots = []

        def label_state_edges(k, nxt):
            """The 3 (or, for the second-last label, 4) edges out of label state 2k + 1."""
            own = 2 * k + 1
            skip = y[k] != y[k + 1] or not label_loop
            return [(own, own if label_loop else dummy, y[k]), (own, own + 1, blank),
                    (own, nxt, y[k + 1]) if skip else (own, dummy, blank)]

        if L == 0:
            slots = [(0, 0, blank), (0, end, blank)]
        elif L == 1:
            slots = [(0, 0, blank), (0, 1, y[0]), (0, end, y[0]),
                     (1, 1 if label_loop else dummy, y[0]), (1, 2, blank), (1, end if label_loop else dummy, y[0]),
                     (1, end, blank),
                     (2, 2, blank), (2, end, blank)]
        else:
            for k in range(L - 1):
                slots += [(2 * k, 2 * k, blank), (2 * k, 2 * k + 1, y[k])] + label_state_edges(k, 2 * k + 3)
            slots.append(label_state_edges(L - 2, end)[2])  # second-last label: skip to the end
            last_blank, last_label = 2 * L - 2, 2 * L - 1
            slots += [(last_blank, last_blank, blank), (last_blank, last_label, y[L - 1]),
                      (last_blank, end, y[L - 1]),
                      (last_label, last_label if label_loop else dummy, y[L - 1]), (last_label, 2 * L, blank),
                      (last_label, end if label_loop else dummy, y[L - 1]), (last_label, end, blank),
                      (2 * L, 2 * L, blank), (2 * L, end, blank)]
        slots += [(dummy, dummy, blank)] * (per_seq - len(slots))
        for i, (fr, to, em) in enumerate(slots):
            edges[:, b * per_seq + i] = (off + fr, off + to, em, b)
        start_end[:, b] = (off, off + end)
    return edges, start_end


def ctc_collapse(path, blank):
    out = []
    prev = None
    for s in path:
        if s != prev and s != blank:
            out.append(s)
        prev = s
    return out


def rna_collapse(path, blank):
    return [s for s in path if s != blank]


def log_softmax(x, axis=-1):
    return x - logsumexp(x, axis=axis, keepdims=True)


def ctc_graves(logits, lens, targets, tlens, blank, normalized=False):
    """Graves' alpha-beta over the extended label sequence (log space, float64).

    Returns ``nll`` (B,) (inf without a path; 0 for an empty target over zero frames) and
    ``grad`` (T, B, D) = d nll / d logits (0 on padded frames; ``softmax`` on valid frames of
    sequences without a path)."""
    logits = np.asarray(logits, dtype=np.float64)
    T, B, D = logits.shape
    lp = logits if normalized else log_softmax(logits)
    nll = np.full(B, np.inf)
    grad = np.zeros_like(logits)
    for b in range(B):
        L, U = int(lens[b]), int(tlens[b])
        ext = [blank]
        for u in range(U):
            ext += [int(targets[b, u]), blank]
        S = len(ext)
        la = np.full((L, S), -np.inf)
        lb = np.full((L, S), -np.inf)
        if L > 0:
            la[0, 0] = lp[0, b, ext[0]]
            if S > 1:
                la[0, 1] = lp[0, b, ext[1]]
            for t in range(1, L):
                for s in range(S):
                    v = la[t - 1, s]
                    if s >= 1:
                        v = np.logaddexp(v, la[t - 1, s - 1])
                    if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                        v = np.logaddexp(v, la[t - 1, s - 2])
                    la[t, s] = v + lp[t, b, ext[s]]
            lb[L - 1, S - 1] = lp[L - 1, b, ext[S - 1]]
            if S > 1:
                lb[L - 1, S - 2] = lp[L - 1, b, ext[S - 2]]
            for t in range(L - 2, -1, -1):
                for s in range(S):
                    v = lb[t + 1, s]
                    if s + 1 < S:
                        v = np.logaddexp(v, lb[t + 1, s + 1])
                    if s + 2 < S and ext[s] != blank and ext[s] != ext[s + 2]:
                        v = np.logaddexp(v, lb[t + 1, s + 2])
                    lb[t, s] = v + lp[t, b, ext[s]]
            logp = np.logaddexp(la[L - 1, S - 1], la[L - 1, S - 2]) if S > 1 else la[L - 1, S - 1]
        else:
            logp = 0.0 if U == 0 else -np.inf  # zero frames: only the empty alignment of an empty target
        soft = np.exp(lp[:L, b]) if not normalized else np.zeros((L, D))
        if logp == -np.inf:
            grad[:L, b] = soft
            continue
        nll[b] = -logp
        gamma = np.zeros((L, D))
        for t in range(L):
            for s in range(S):
                v = la[t, s] + lb[t, s] - lp[t, b, ext[s]] - logp
                gamma[t, ext[s]] += np.exp(v)
        grad[:L, b] = soft - gamma
    return nll, grad


# ------------------------------------------------------------------ HMM
def hmm_forward(log_e, log_A, log_pi, log_f=None, lens=None):
    """Log-space forward algorithm (float64): log p(x_b) per sequence (0 for the empty series)."""
    log_e = np.asarray(log_e, dtype=np.float64)
    T, B, K = log_e.shape
    log_f = np.zeros(K) if log_f is None else np.asarray(log_f, dtype=np.float64)
    lens = np.full(B, T) if lens is None else lens
    out = np.zeros(B)
    for b in range(B):
        L = int(lens[b])
        if L == 0:  # no state at all: probability 1
            continue
        la = log_pi + log_e[0, b]
        for t in range(1, L):
            la = logsumexp(la[:, None] + log_A, axis=0) + log_e[t, b]
        out[b] = logsumexp(la + log_f)
    return out


def hmm_posteriors(log_e, log_A, log_pi, log_f=None, lens=None):
    """State posteriors (T, B, K) and expected transition counts (B, K, K), log space."""
    log_e = np.asarray(log_e, dtype=np.float64)
    T, B, K = log_e.shape
    log_f = np.zeros(K) if log_f is None else np.asarray(log_f, dtype=np.float64)
    lens = np.full(B, T) if lens is None else lens
    gamma = np.zeros((T, B, K))
    xi = np.zeros((B, K, K))
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        la = np.zeros((L, K))
        lb = np.zeros((L, K))
        la[0] = log_pi + log_e[0, b]
        for t in range(1, L):
            la[t] = logsumexp(la[t - 1][:, None] + log_A, axis=0) + log_e[t, b]
        lb[L - 1] = log_f
        for t in range(L - 2, -1, -1):
            lb[t] = logsumexp(log_A + (log_e[t + 1, b] + lb[t + 1])[None, :], axis=1)
        logp = logsumexp(la[L - 1] + log_f)
        gamma[:L, b] = np.exp(la + lb - logp)
        for t in range(1, L):
            xi[b] += np.exp(la[t - 1][:, None] + log_A + (log_e[t, b] + lb[t])[None, :] - logp)
    return gamma, xi


# ------------------------------------------------------------------ segmental
def segment_brute_force(am, batch_idxs, edges, weights, length_models, start_end, index, scale,
                        segmentwise_normalization=False):
    """Enumerate every segmentation path (tiny cases).  Returns output, normalization_factors,
    posterior_weights as documented for SegmentFastBaumWelchOp."""
    L, Nb, D = am.shape
    F, B = batch_idxs.shape
    E = edges.shape[1]
    out = np.full((L, Nb, D), np.inf)
    nf_out = np.zeros((L, Nb))
    pw = np.zeros((L, Nb))
    for b in range(B):
        segs = [(t, i) for t in range(F) for i in range(L)
                if batch_idxs[t, b] >= 0 and index[i, batch_idxs[t, b]] != 0 and t + i + 1 <= F]
        Tb = max((t + i + 1 for t, i in segs), default=0)
        paths = []  # list of (score, [(t, i, e), ...])

        def rec(t, state, acc, used):
            if t == Tb:
                if state == start_end[1, b]:
                    paths.append((acc, list(used)))
                return
            n = batch_idxs[t, b] if t < F else -1
            if n < 0:
                return
            for e in range(E):
                if edges[4, e] != b or edges[0, e] != state:
                    continue
                for i in range(L):
                    if t + i + 1 > Tb or index[i, n] == 0:
                        continue
                    s = weights[e] + scale * am[i, n, edges[2, e]] + length_models[edges[3, e], i]
                    used.append((t, i, e))
                    rec(t + i + 1, edges[1, e], acc + s, used)
                    used.pop()

        rec(0, start_end[0, b], 0.0, [])
        if not paths:
            continue
        scores = np.array([p[0] for p in paths])
        nll = -logsumexp(-scores)
        joint = {}  # (i, n) -> list of (score, emission)
        for s, used in paths:
            for t, i, e in used:
                joint.setdefault((i, batch_idxs[t, b]), []).append((s, edges[2, e]))
        nf = {k: -logsumexp(-np.array([s for s, _ in v])) for k, v in joint.items()}
        if segmentwise_normalization:
            by_col = {}
            for (i, n), v in nf.items():
                by_col.setdefault(n, []).append(v)
            merged = {n: -logsumexp(-np.array(v)) for n, v in by_col.items()}
            for t, i in segs:
                n = batch_idxs[t, b]
                if n in merged:
                    nf[(i, n)] = merged[n]
        for (i, n), f in nf.items():
            nf_out[i, n] = f
            pw[i, n] = np.exp(-(f - nll))
        for (i, n), v in joint.items():
            for d in range(D):
                sel = [s for s, em in v if em == d]
                if sel:
                    out[i, n, d] = -logsumexp(-np.array(sel)) - nf[(i, n)]
    return out, nf_out, pw


def all_sequences(T, D):
    return itertools.product(range(D), repeat=T)
