"""A CTC acoustic model's training step: ptnative against torch, same weights, same data, alternating turns.

The model (issue 32): a 2-layer LSTM 40 -> 256 -> 256 (``ptnative.lstm`` with a mask for ragged lengths), a linear
layer to 31 classes, ``ptnative.ctc_loss`` summed over the batch, plain SGD through ``pytensor.function(updates=...)``;
float32, T=200, B=16.  With ``--bidirectional`` each layer is a forward and a backward LSTM of 256 cells whose
outputs are concatenated (40 -> 2x256 -> 2x256 -> 31).

torch runs the same model (``nn.LSTM``, ``F.ctc_loss``, ``optim.SGD``) two ways:
  * padded: the LSTM also runs over the padding, as many CTC recipes do.  Unidirectional only this gives the same
    step (the padding is trailing, so it reaches no valid frame); a backward LSTM would start in the padding, so for
    ``--bidirectional`` the padded variant is timed but not compared.
  * packed: ``pack_padded_sequence``, the same step as ptnative's masked layers in both variants.
Before timing, one step of each from the same weights must give the same loss and the same updated weights (to
1e-5 in absolute terms; the weights are at most 0.16); the timed steps then keep updating their own copies.

Usage:  python bench/train_ctc.py [--threads N] [--reps R] [--bidirectional] [--profile]
(``--profile`` prints PyTensor's profile of ptnative's step (CVM mode) instead of timing torch.)
"""

from __future__ import annotations

import argparse
import os

ARGS = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ARGS.add_argument("--threads", type=int, default=2)
ARGS.add_argument("--reps", type=int, default=15)
ARGS.add_argument("--bidirectional", action="store_true")
ARGS.add_argument("--profile", action="store_true")
opts = ARGS.parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "PTNATIVE_NUM_THREADS"):
    os.environ[var] = str(opts.threads)

import numpy as np  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import ptnative  # noqa: E402
import _torch_lstm  # noqa: E402  (bench/_torch_lstm.py)
from _common import load_average as _load  # noqa: E402
from timing import measure_interleaved, record  # noqa: E402  (bench/timing.py)

T, B, N_FEAT, N, N_CLASSES, N_LABELS = 200, 16, 40, 256, 31, 40
LR = 1e-4
DTYPE = "float32"
DIRS = (1, -1) if opts.bidirectional else (1,)
CASE = (f"CTC training step, {'bi' if opts.bidirectional else ''}LSTM 2x{N} T={T} B={B} {N_FEAT}->{N_CLASSES} "
        f"{DTYPE}, {opts.threads} thr")


def make_data(seed=0):
    """Features (T, B, 40), lengths (the first T, the others in [0.7 T, T]), labels (B, 40) in 1..30 (0 = blank)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(int(0.7 * T), T + 1, size=B).astype(np.int32)
    lens[0] = T
    lens = np.sort(lens)[::-1].copy()  # pack_padded_sequence's default wants them sorted
    tlens = rng.integers(N_LABELS // 2, N_LABELS + 1, size=B).astype(np.int32)
    labels = rng.integers(1, N_CLASSES, size=(B, N_LABELS)).astype(np.int32)
    x = rng.normal(size=(T, B, N_FEAT)).astype(DTYPE)
    mask = (np.arange(T)[:, None] < lens[None, :]).astype(DTYPE)
    x *= mask[:, :, None]
    return dict(x=x, mask=mask, lens=lens, labels=labels, tlens=tlens)


def make_weights(seed=1):
    """ptnative's layout: per layer and direction (W_in (n_in, 4n), W_rec (n, 4n), b (4n)); then W_out, b_out."""
    rng = np.random.default_rng(seed)
    u = lambda *s, scale: rng.uniform(-scale, scale, size=s).astype(DTYPE)  # noqa: E731
    k = 1 / np.sqrt(N)
    layers, n_in = [], N_FEAT
    for _ in range(2):
        layers.append([(u(n_in, 4 * N, scale=k), u(N, 4 * N, scale=k), u(4 * N, scale=k)) for _ in DIRS])
        n_in = N * len(DIRS)
    return layers, (u(n_in, N_CLASSES, scale=1 / np.sqrt(n_in)), u(N_CLASSES, scale=1 / np.sqrt(n_in)))


def flat(layers, out):
    return [a for layer in layers for d in layer for a in d] + list(out)


# ------------------------------------------------------------------------------------------------ ptnative
def ptnative_step(layers, out):
    """The compiled training step (returns the summed loss; updates the shared weights) and the shared weights."""
    shared = [pytensor.shared(a.copy()) for a in flat(layers, out)]
    x, mask = pt.tensor3("x", dtype=DTYPE), pt.matrix("mask", dtype=DTYPE)
    lens, labels, tlens = pt.ivector("lens"), pt.imatrix("labels"), pt.ivector("tlens")
    h, k = x, 0
    for _ in range(2):
        ys = []
        for direction in DIRS:
            W_in, W_rec, b = shared[k:k + 3]
            k += 3
            ys.append(ptnative.lstm(h, W_in, W_rec, b, mask=mask, direction=direction)[0])
        h = ys[0] if len(ys) == 1 else pt.concatenate(ys, axis=2)
    W_out, b_out = shared[k:]
    logits = pt.dot(h, W_out) + b_out
    loss = ptnative.ctc_loss(logits, lens, labels, tlens, blank_index=0).sum()
    grads = pytensor.grad(loss, shared)
    updates = [(p, p - np.asarray(LR, DTYPE) * g) for p, g in zip(shared, grads)]
    mode = "CVM" if opts.profile else None  # PyTensor's profiler times each node's thunk there
    fn = pytensor.function([x, mask, lens, labels, tlens], loss, updates=updates, profile=opts.profile or None,
                           mode=mode)
    return fn, shared


# ------------------------------------------------------------------------------------------------ torch
def torch_model(layers, out):
    import torch
    lstm = torch.nn.LSTM(N_FEAT, N, num_layers=2, bidirectional=len(DIRS) == 2)
    linear = torch.nn.Linear(N * len(DIRS), N_CLASSES)
    for li, layer in enumerate(layers):
        for di, weights in enumerate(layer):
            _torch_lstm.load_layer(lstm, f"l{li}" + ("_reverse" if di else ""), *weights)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(out[0].T.copy()))
        linear.bias.copy_(torch.from_numpy(out[1].copy()))
    return lstm, linear


def torch_step(layers, out, d, packed):
    """A closure running one SGD step of the torch model (returns the loss) and the model's modules."""
    import torch
    import torch.nn.functional as F
    lstm, linear = torch_model(layers, out)
    params = list(lstm.parameters()) + list(linear.parameters())
    opt = torch.optim.SGD(params, lr=LR)
    x, lens = torch.from_numpy(d["x"]), torch.from_numpy(d["lens"]).long()
    labels, tlens = torch.from_numpy(d["labels"]).long(), torch.from_numpy(d["tlens"]).long()

    def step():
        opt.zero_grad()
        h = _torch_lstm.run(lstm, x, lens, packed)
        logp = F.log_softmax(linear(h), dim=-1)
        loss = F.ctc_loss(logp, labels, lens, tlens, blank=0, reduction="sum", zero_infinity=False)
        loss.backward()
        opt.step()
        return float(loss)

    return step, (lstm, linear)


def torch_weights(modules):
    """The torch model's weights in ptnative's layout (flat, as ``flat``)."""
    lstm, linear = modules
    res = [a for li in range(2) for di in range(len(DIRS))
           for a in _torch_lstm.layer_weights(lstm, f"l{li}" + ("_reverse" if di else ""))]
    return res + [linear.weight.detach().numpy().T, linear.bias.detach().numpy()]


def weight_diffs(ours, theirs, before):
    """The largest absolute difference of the updated weights, and the largest as a fraction of each array's
    largest update (how closely the gradients agree)."""
    absolute = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
    of_update = max(float(np.abs(a - b).max() / max(1e-30, np.abs(b - w).max()))
                    for a, b, w in zip(ours, theirs, before))
    return absolute, of_update


def main():
    import warnings
    warnings.simplefilter("ignore")
    d = make_data()
    layers, out = make_weights()
    args = [d[k] for k in ("x", "mask", "lens", "labels", "tlens")]
    fn, shared = ptnative_step(layers, out)
    print(f"{CASE}; load average {_load()}")
    if opts.profile:
        for _ in range(3):
            fn(*args)
        fn.profile.summary()
        return
    try:
        import torch
    except ImportError:
        print("torch not installed: ptnative alone")
        t = measure_interleaved({"ptnative": lambda: fn(*args)}, opts.reps, rounds=5)["ptnative"]
        print(f"ptnative {t.median * 1e3:.1f} ms (min {t.best * 1e3:.1f})")
        return
    torch.set_num_threads(opts.threads)
    # One step of each from the same weights: the same loss and the same updated weights.
    loss = float(fn(*args))
    ours = [s.get_value() for s in shared]
    calls = {"ptnative": lambda: fn(*args)}
    for packed in (False, True):
        name = f"torch {'packed' if packed else 'padded'}"
        step, modules = torch_step(layers, out, d, packed)
        t_loss = step()
        if packed or len(DIRS) == 1:
            w_err, g_err = weight_diffs(ours, torch_weights(modules), flat(layers, out))
            l_err = abs(loss - t_loss) / abs(t_loss)
            print(f"  {name}: loss {t_loss:.6g} vs ptnative {loss:.6g} (rel. diff {l_err:.1e}); updated weights "
                  f"differ by {w_err:.1e} at most ({g_err:.1e} of an array's largest update)")
            assert l_err < 1e-5 and w_err < 1e-5, f"{name} and ptnative disagree"
        else:
            print(f"  {name}: loss {t_loss:.6g} (the backward LSTM starts in the padding: not the same model)")
        calls[name] = step
    timings = measure_interleaved(calls, opts.reps, rounds=5)
    base = timings["ptnative"]
    print(f"\n{'':<16} {'median ms':>10} {'min ms':>8} {'CPU ms':>8} {'ptnative / it (median, min, CPU)':>34}")
    for name, t in timings.items():
        print(f"{name:<16} {t.median * 1e3:10.1f} {t.best * 1e3:8.1f} {t.cpu * 1e3:8.1f} "
              f"{base.median / t.median:16.2f} {base.best / t.best:8.2f} {base.cpu / t.cpu:8.2f}")
        record("train_ctc", CASE, name, t.median, ours=name == "ptnative", best=t.best, cpu=t.cpu)
    print(f"load average after the turns: {_load()}")


if __name__ == "__main__":
    main()
