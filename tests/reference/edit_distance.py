"""Plain-Python references for the edit-distance family, written from the definitions.

``dp_table(x, y)[i][j]`` is the Levenshtein distance between ``x[:i]`` and
``y[:j]``; ``bfs_distance`` finds the same number by breadth-first search over
single edits (only for tiny inputs), as an independent check of ``dp_table``.
"""

from __future__ import annotations

import numpy as np


def dp_table(x, y):
    x, y = list(x), list(y)
    D = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]
    for i in range(len(x) + 1):
        for j in range(len(y) + 1):
            if i == 0 or j == 0:
                D[i][j] = i + j
            else:
                D[i][j] = min(D[i - 1][j] + 1, D[i][j - 1] + 1, D[i - 1][j - 1] + (x[i - 1] != y[j - 1]))
    return D


def levenshtein(x, y):
    return dp_table(x, y)[len(x)][len(y)]


def optimal_completion(x, y):
    """min over prefixes y[:n] of levenshtein(x, y[:n])."""
    return min(dp_table(x, y)[len(x)])


def bfs_distance(x, y):
    """The fewest single-symbol insertions, deletions and substitutions turning x into y."""
    x, y = tuple(x), tuple(y)
    alphabet = sorted(set(x) | set(y))
    limit = max(len(x), len(y))
    frontier, seen, d = {x}, {x}, 0
    while y not in frontier:
        nxt = set()
        for s in frontier:
            for i in range(len(s) + 1):
                cands = [s[:i] + (c,) + s[i:] for c in alphabet] if len(s) < limit else []
                if i < len(s):
                    cands.append(s[:i] + s[i + 1:])
                    cands += [s[:i] + (c,) + s[i + 1:] for c in alphabet if c != s[i]]
                for c in cands:
                    if c not in seen:
                        seen.add(c)
                        nxt.add(c)
        frontier, d = nxt, d + 1
    return d


def _pairs(a, a_len, b, b_len):
    return [(list(a[i, :a_len[i]]), list(b[i, :b_len[i]])) for i in range(len(a_len))]


def edit_distance(a, a_len, b, b_len):
    return np.array([levenshtein(x, y) for x, y in _pairs(a, a_len, b, b_len)], dtype=np.int32)


def optimal_completion_edit_distance(a, a_len, b, b_len):
    return np.array([optimal_completion(x, y) for x, y in _pairs(a, a_len, b, b_len)], dtype=np.int32)


def optimal_completion_edit_distance_per_successor(a, a_len, b, b_len, successors):
    out = [[optimal_completion(x + [s], y) for s in successors] for x, y in _pairs(a, a_len, b, b_len)]
    return np.array(out, dtype=np.int32).reshape(len(a_len), len(successors))


def next_row(last, label, a_n, ended, y, Tb):
    """One DP row step for one entry (any ``last`` row, not only true DP rows)."""
    n = len(y)
    if ended:
        row = [int(v) for v in last[:n + 1]]
    else:
        row = [a_n + 1]
        for t in range(1, n + 1):
            row.append(min(int(last[t]) + 1, row[t - 1] + 1, int(last[t - 1]) + (label != y[t - 1])))
    return row + [row[n]] * (Tb - n)


def next_edit_distance_row(last_row, a, a_n, a_ended, b, b_len):
    Tb = b.shape[1]
    rows = [next_row(last_row[i], a[i], int(a_n[i]), a_ended[i], list(b[i, :b_len[i]]), Tb)
            for i in range(len(b_len))]
    return np.array(rows, dtype=np.int32).reshape(len(b_len), Tb + 1)


def next_edit_distance_reduce(last_row, a, a_n, a_ended, b, b_len, optimal_completion, a_blank_idx):
    B, L, Tb = len(b_len), a.shape[1], b.shape[1]
    out = np.zeros((B, L), dtype=np.int32)
    for i in range(B):
        n = int(b_len[i])
        for k in range(L):
            label = a[0 if a.shape[0] == 1 else i, k]
            ended = a_ended[i] or label == a_blank_idx
            row = next_row(last_row[i], label, int(a_n[i]), ended, list(b[i, :n]), Tb)[:n + 1]
            out[i, k] = min(row) if optimal_completion else row[n]
    return out
