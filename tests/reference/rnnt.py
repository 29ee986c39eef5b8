"""Float64 numpy reference of the (multi-blank) RNN-T lattice, written from the
math as a generic DAG: every arc is listed explicitly, alphas and betas are
log-sum-exps over incoming / outgoing arcs, and the gradient is accumulated
from arc posteriors.  ``brute_force_loglik`` enumerates whole paths instead.

Lattice of one sequence (T frames, U labels): nodes (t, u), t < T, u <= U.
  blank        (t, u) -> (t+1, u)    class blank
  big blank i  (t, u) -> (t+d_i, u)  class blank-1-i
  label        (t, u) -> (t, u+1)    class labels[u]
A blank arc reaching frame T from u = U ends the path ("final" arc; None as
destination).  Arc weight: log_softmax(acts)[t, u, k] - sigma.
"""

from __future__ import annotations

import numpy as np


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    z = np.log(np.exp(x - m).sum(axis=-1, keepdims=True)) + m
    return x - z, z[..., 0]


def lattice_arcs(T, U, labels, blank, durations):
    """[(src, k, dst, is_label)] with dst None for the arcs that end a path."""
    arcs = []
    blanks = [(blank, 1)] + [(blank - 1 - i, d) for i, d in enumerate(durations)]
    for t in range(T):
        for u in range(U + 1):
            for k, d in blanks:
                if t + d < T:
                    arcs.append(((t, u), k, (t + d, u), False))
                elif t + d == T and u == U:
                    arcs.append(((t, u), k, None, False))
            if u < U:
                arcs.append(((t, u), int(labels[u]), (t, u + 1), True))
    return arcs


def sequence_lattice(acts, labels, T, U, blank, durations=(), sigma=0.0, fastemit_lambda=0.0, clamp=-1.0):
    """One sequence.  acts (T', U'+1, K) (only [:T, :U+1] is used).
    Returns dict: loglik, cost, alphas, betas (T, U+1), lognorm (T, U+1), grads (T, U+1, K)."""
    acts = np.asarray(acts, dtype=np.float64)[:T, :U + 1]
    K = acts.shape[-1]
    logp, lognorm = log_softmax(acts)
    if T == 0:  # no frame: only the empty alignment of an empty label sequence (probability 1)
        loglik = 0.0 if U == 0 else -np.inf
        return dict(loglik=loglik, cost=-(1.0 + fastemit_lambda) * loglik, alphas=np.zeros((0, U + 1)),
                    betas=np.zeros((0, U + 1)), lognorm=lognorm, grads=np.zeros((0, U + 1, K)))
    arcs = lattice_arcs(T, U, labels, blank, durations)
    w = {(src, k, dst): logp[src][k] - sigma for src, k, dst, _ in arcs}
    # alphas: nodes in lexicographic (t, u) order are topologically sorted.
    incoming, outgoing = {}, {}
    for src, k, dst, is_label in arcs:
        outgoing.setdefault(src, []).append((k, dst, is_label))
        if dst is not None:
            incoming.setdefault(dst, []).append((src, k))
    alphas = np.full((T, U + 1), -np.inf)
    for t in range(T):
        for u in range(U + 1):
            if (t, u) == (0, 0):
                alphas[t, u] = 0.0
                continue
            terms = [alphas[src] + w[(src, k, (t, u))] for src, k in incoming.get((t, u), [])]
            alphas[t, u] = np.logaddexp.reduce(terms) if terms else -np.inf
    betas = np.full((T, U + 1), -np.inf)
    for t in reversed(range(T)):
        for u in reversed(range(U + 1)):
            terms = [w[((t, u), k, dst)] + (0.0 if dst is None else betas[dst])
                     for k, dst, _ in outgoing.get((t, u), [])]
            betas[t, u] = np.logaddexp.reduce(terms) if terms else -np.inf
    final = [alphas[src] + w[(src, k, None)] for src, k, dst, _ in arcs if dst is None]
    loglik = np.logaddexp.reduce(final)
    # Gradient w.r.t. the logits.  For arc a = (src, k): post_a = P(paths through a).
    # d(-loglik)/dx[src, j] = sum_a post_a * (p[src, j] - [j == k]); FastEmit adds
    # lambda * post_a * (p - e_k) on label arcs only, i.e. label arcs count 1 + lambda
    # in the one-hot part and lambda extra in the posterior part.
    grads = np.zeros((T, U + 1, K))
    occupancy = np.zeros((T, U + 1))
    p = np.exp(logp)
    for src, k, dst, is_label in arcs:
        post = np.exp(alphas[src] + w[(src, k, dst)] + (0.0 if dst is None else betas[dst]) - loglik)
        scale = 1.0 + fastemit_lambda if is_label else 1.0
        grads[src][k] -= scale * post
        occupancy[src] += scale * post
    grads += p * occupancy[..., None]
    if clamp > 0:
        grads = np.clip(grads, -clamp, clamp)
    return dict(loglik=loglik, cost=-(1.0 + fastemit_lambda) * loglik, alphas=alphas, betas=betas,
                lognorm=lognorm, grads=grads)


def batch_lattice(acts, labels, act_lens, label_lens, blank, durations=(), sigma=0.0, fastemit_lambda=0.0,
                  clamp=-1.0):
    """The whole batch, padded like the op's outputs (0 on padding):
    (costs, grads, loglik, alphas, betas, lognorm)."""
    acts = np.asarray(acts, dtype=np.float64)
    B, T, U1, K = acts.shape
    costs, loglik = np.zeros(B), np.zeros(B)
    grads = np.zeros((B, T, U1, K))
    alphas, betas, lognorm = np.zeros((B, T, U1)), np.zeros((B, T, U1)), np.zeros((B, T, U1))
    for b in range(B):
        Tb, Ub = int(act_lens[b]), int(label_lens[b])
        r = sequence_lattice(acts[b], labels[b], Tb, Ub, blank, durations, sigma, fastemit_lambda, clamp)
        costs[b], loglik[b] = r["cost"], r["loglik"]
        grads[b, :Tb, :Ub + 1] = r["grads"]
        alphas[b, :Tb, :Ub + 1] = r["alphas"]
        betas[b, :Tb, :Ub + 1] = r["betas"]
        lognorm[b, :Tb, :Ub + 1] = r["lognorm"]
    return costs, grads, loglik, alphas, betas, lognorm


def brute_force_loglik(acts, labels, T, U, blank, durations=(), sigma=0.0):
    """log of the sum over every complete path of exp(sum of arc weights), by
    depth-first enumeration (tiny T and U only)."""
    logp, _ = log_softmax(np.asarray(acts, dtype=np.float64)[:T, :U + 1])
    blanks = [(blank, 1)] + [(blank - 1 - i, d) for i, d in enumerate(durations)]
    totals = []

    def walk(t, u, acc):
        if u < U:
            walk(t, u + 1, acc + logp[t, u, labels[u]] - sigma)
        for k, d in blanks:
            if t + d < T:
                walk(t + d, u, acc + logp[t, u, k] - sigma)
            elif t + d == T and u == U:
                totals.append(acc + logp[t, u, k] - sigma)

    if T > 0:
        walk(0, 0, 0.0)
    elif U == 0:
        totals.append(0.0)  # the empty alignment
    return np.logaddexp.reduce(totals) if totals else -np.inf
