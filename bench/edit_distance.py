"""Benchmark: ptnative.edit_distance against editdistance, rapidfuzz and a numpy DP.

Run: /work/venv/bin/python bench/edit_distance.py [--reps N]

Workloads (vocabulary 30, int32 labels): 1000 pairs of length ~50, 100 pairs
of length ~500, 10 pairs of length ~5000, and (unless --no-sweep) around the last:
3 and 30 pairs of length ~5000, 10 pairs of length ~2000 and ~10000, 1 pair of
length ~5000; then the long pairs one or two at a time (where a pair cannot share
the vector lanes with others and the band around the diagonal decides the work):
1 and 2 pairs of length ~1000 to ~20000, "noisy" (b = a with ~20% of the labels
replaced), "similar" (~1% of the labels substituted, inserted or deleted) and
"different" (a and b independent).  ptnative gets the whole batch as
padded (B, T) arrays in one compiled PyTensor call (default mode and "C");
the peers are called once per pair in a Python loop on lists of ints, as a user
would.  Times are the best of --reps runs; ratios are peer time / ptnative time
(> 1: ptnative is faster).  A peer that is not installed is skipped; in the
one-or-two-pair sweep editdistance (O(m n), seconds a call) runs up to length ~2000.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import ptnative  # noqa: F401
from ptnative.ops.edit_distance import edit_distance, optimal_completion_edit_distance
from timing import measure, measure_interleaved, record  # noqa: E402  (bench/timing.py)


def make_batch(n_pairs, length, vocab, rng, kind="noisy"):
    """(a, a_len, b, b_len): lengths uniform in [0.8, 1.2] * length; b is a with ~20% of the labels replaced
    ("noisy", the distances are realistic, not ~length), a with ~1% of its labels substituted, inserted or deleted
    ("similar"), or independent of a ("different")."""
    lens_a = rng.integers(int(length * 0.8), int(length * 1.2) + 1, size=n_pairs).astype(np.int32)
    lens_b = rng.integers(int(length * 0.8), int(length * 1.2) + 1, size=n_pairs).astype(np.int32)
    a = rng.integers(0, vocab, size=(n_pairs, lens_a.max())).astype(np.int32)
    if kind == "similar":
        rows = []
        for i in range(n_pairs):
            x = list(a[i, :lens_a[i]])
            for _ in range(max(1, len(x) // 100)):
                pos, op = int(rng.integers(0, len(x))), int(rng.integers(0, 3))
                if op == 0:
                    x[pos] = int(rng.integers(0, vocab))
                elif op == 1:
                    x.insert(pos, int(rng.integers(0, vocab)))
                else:
                    del x[pos]
            rows.append(x)
        lens_b = np.array([len(x) for x in rows], np.int32)
        b = np.zeros((n_pairs, lens_b.max()), np.int32)
        for i, x in enumerate(rows):
            b[i, :len(x)] = x
        return a, lens_a, b, lens_b
    if kind == "different":
        return a, lens_a, rng.integers(0, vocab, size=(n_pairs, lens_b.max())).astype(np.int32), lens_b
    b = a.copy() if a.shape[1] >= lens_b.max() else np.pad(a, ((0, 0), (0, lens_b.max() - a.shape[1])))
    b = b[:, :lens_b.max()].copy()
    noise = rng.random(b.shape) < 0.2
    b[noise] = rng.integers(0, vocab, size=noise.sum())
    return a, lens_a, b, lens_b


def numpy_dp(x, y):
    """Row-wise Levenshtein DP, vectorised over the row with a prefix-min scan."""
    ar = np.arange(len(y) + 1)
    row = ar.copy()
    for i in range(1, len(x) + 1):
        new = np.empty_like(row)
        new[0] = i
        np.minimum(row[:-1] + (y != x[i - 1]), row[1:] + 1, out=new[1:])
        row = np.minimum.accumulate(new - ar) + ar
    return int(row[-1])


def best_of(fn, reps):
    t = measure(fn, reps, warmup=0)
    return t.best, t.result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-sweep", dest="sweep", action="store_false", help="only the three main workloads")
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    peers, missing = {}, []
    try:
        import editdistance

        peers["editdistance"] = lambda xs, ys: [editdistance.eval(x, y) for x, y in zip(xs, ys)]
    except ImportError:
        print("note: editdistance is not installed; skipped (pip install editdistance)")
        missing.append("editdistance")
    try:
        from rapidfuzz.distance import Levenshtein

        peers["rapidfuzz"] = lambda xs, ys: [Levenshtein.distance(x, y) for x, y in zip(xs, ys)]
    except ImportError:
        print("note: rapidfuzz is not installed; skipped (pip install rapidfuzz)")
        missing.append("rapidfuzz")

    a, al, b, bl = pt.imatrix("a"), pt.ivector("a_len"), pt.imatrix("b"), pt.ivector("b_len")
    fns = {
        "ptnative (default mode)": pytensor.function([a, al, b, bl], edit_distance(a, al, b, bl)),
        "ptnative (C mode)": pytensor.function([a, al, b, bl], edit_distance(a, al, b, bl), mode="C"),
    }
    f_ocd = pytensor.function([a, al, b, bl], optimal_completion_edit_distance(a, al, b, bl))

    workloads = [(1000, 50), (100, 500), (10, 5000)]
    if args.sweep:
        workloads += [(3, 5000), (30, 5000), (10, 2000), (10, 10000), (1, 5000)]
    print(f"edit distance, vocabulary 30, best of {args.reps} runs in alternating turns (ratio = other / ptnative "
          "default mode)")
    for n_pairs, length in workloads:
        A, AL, B, BL = make_batch(n_pairs, length, 30, rng)
        xs = [A[i, :AL[i]].tolist() for i in range(n_pairs)]
        ys = [B[i, :BL[i]].tolist() for i in range(n_pairs)]
        print(f"\n{n_pairs} pairs of length ~{length} ({int((AL.astype(np.int64) * BL).sum()):,} DP cells)")
        case = f"{n_pairs} pairs of length ~{length}"
        calls = {name: (lambda f=f: f(A, AL, B, BL)) for name, f in fns.items()}
        calls["ptnative OCD (default)"] = lambda: f_ocd(A, AL, B, BL)
        calls.update({name: (lambda peer=peer: peer(xs, ys)) for name, peer in peers.items()})
        times = measure_interleaved(calls, args.reps, rounds=min(3, args.reps), settle=0.1)  # alternating turns
        ref_time, ref_out = times["ptnative (default mode)"].best, times["ptnative (default mode)"].result
        for name, t in times.items():
            if name != "ptnative OCD (default)":
                np.testing.assert_array_equal(t.result, ref_out)
            r = t.best / ref_time
            verdict = "" if name.startswith("ptnative") else \
                f"  (ptnative {r:.1f}x faster)" if r >= 1 else f"  (ptnative {1 / r:.1f}x slower)"
            print(f"  {name:26s} {t.best * 1e3:10.3f} ms   ratio {r:6.2f}{verdict}")
            record("edit_distance", case, name, t.median, ours=name.startswith("ptnative"), best=t.best, cpu=t.cpu)
        for name in missing:
            record("edit_distance", case, name, None, note="not installed")
        xa = [A[i, :AL[i]] for i in range(n_pairs)]
        ya = [B[i, :BL[i]] for i in range(n_pairs)]
        if (n_pairs, length) not in workloads[:3]:
            continue  # the numpy DP only at the main workloads (seconds a call)
        np_reps = 1 if length >= 500 else min(args.reps, 2)
        t, out = best_of(lambda: [numpy_dp(x, y) for x, y in zip(xa, ya)], np_reps)
        np.testing.assert_array_equal(out, ref_out)
        print(f"  {'numpy row-wise DP':26s} {t * 1e3:10.3f} ms   ratio {t / ref_time:6.2f}")
        record("edit_distance", case, f"numpy row-wise DP (best of {np_reps})", t, best=t)
    if args.sweep:
        pair_sweep(fns["ptnative (default mode)"], peers, args.reps, rng)


def pair_sweep(f, peers, reps, rng):
    """One or two long pairs per call (no other pair to share the vector lanes with; the band around the diagonal
    sets the work): ptnative (default mode) against the peers, best of ``reps`` in alternating turns."""
    names = list(peers)
    print(f"\none or two long pairs per call, best of {reps} (ms; ratio = peer / ptnative)")
    print(f"  {'case':38s} {'ptnative':>10s}" + "".join(f" {n:>13s} {'ratio':>6s}" for n in names))
    for kind in ("noisy", "similar", "different"):
        for n_pairs in (1, 2):
            for length in (1000, 2000, 5000, 10000, 20000):
                if kind != "noisy" and length in (2000, 10000):
                    continue
                A, AL, B, BL = make_batch(n_pairs, length, 30, rng, kind)
                xs = [A[i, :AL[i]].tolist() for i in range(n_pairs)]
                ys = [B[i, :BL[i]].tolist() for i in range(n_pairs)]
                calls = {"ptnative": lambda: f(A, AL, B, BL)}
                calls.update({n: (lambda p=peers[n]: p(xs, ys)) for n in names
                              if n != "editdistance" or length <= 2000})
                times = measure_interleaved(calls, reps, rounds=min(3, reps), settle=0.1)
                ours = times["ptnative"]
                dist = ours.result
                case = f"{n_pairs} {'pair' if n_pairs == 1 else 'pairs'} of length ~{length}, {kind}"
                line = f"  {case + ' (d ' + ','.join(str(int(v)) for v in dist) + ')':38s} {ours.best * 1e3:10.3f}"
                record("edit_distance", case, "ptnative (default mode)", ours.median, ours=True, best=ours.best,
                       cpu=ours.cpu)
                for n in names:
                    if n not in times:
                        line += f" {'-':>13s} {'':>6s}"
                        continue
                    t = times[n]
                    np.testing.assert_array_equal(t.result, dist)
                    line += f" {t.best * 1e3:13.3f} {t.best / ours.best:6.2f}"
                    record("edit_distance", case, n, t.median, best=t.best, cpu=t.cpu)
                print(line, flush=True)


if __name__ == "__main__":
    main()
