"""torch.nn.LSTM with ptnative's weights (bench/lstm.py, bench/train_ctc.py): the two layouts and the copies between.

ptnative's layer: ``W_in`` (n_in, 4n), ``W_rec`` (n, 4n), ``b`` (4n), gate blocks [cell input, input, forget, output].
torch's layer ``sfx`` (``"l0"``, ``"l1_reverse"``, ...): ``weight_ih`` (4n, n_in), ``weight_hh`` (4n, n), two biases,
gate blocks [input, forget, cell input, output].  torch gets ``bias_ih = b`` and ``bias_hh = 0``.
"""

import numpy as np

GATES_TORCH = (1, 2, 0, 3)  # torch's gate blocks from ptnative's


def torch_rows(n):
    """The rows of torch's (4n, .) weights, as indices into ptnative's 4n columns."""
    return np.concatenate([np.arange(g * n, (g + 1) * n) for g in GATES_TORCH])


def load_layer(lstm, sfx, W_in, W_rec, b):
    """Copy ptnative's (W_in, W_rec, b) into torch's LSTM module ``lstm``, layer ``sfx``."""
    import torch
    rows = torch_rows(W_rec.shape[0])
    with torch.no_grad():
        getattr(lstm, f"weight_ih_{sfx}").copy_(torch.from_numpy(np.ascontiguousarray(W_in.T[rows])))
        getattr(lstm, f"weight_hh_{sfx}").copy_(torch.from_numpy(np.ascontiguousarray(W_rec.T[rows])))
        getattr(lstm, f"bias_ih_{sfx}").copy_(torch.from_numpy(np.ascontiguousarray(b[rows])))
        getattr(lstm, f"bias_hh_{sfx}").zero_()


def layer_weights(lstm, sfx):
    """torch's layer ``sfx`` in ptnative's layout: (W_in, W_rec, b), b from ``bias_ih`` alone (``bias_hh`` started
    at 0 but an optimiser moves it too: after one SGD step ``bias_ih`` is what ptnative's single bias became)."""
    get = lambda name: getattr(lstm, f"{name}_{sfx}").detach().numpy()  # noqa: E731
    inv = np.argsort(torch_rows(get("weight_hh").shape[1]))
    return get("weight_ih")[inv].T, get("weight_hh")[inv].T, get("bias_ih")[inv]


def run(lstm, x, lens, packed):
    """torch's LSTM over x (T, B, n_in): padded (over every frame) or packed (``lens``, sorted descending); the
    output (T, B, n), 0 on the padding when packed."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    if not packed:
        return lstm(x)[0]
    h, _ = lstm(pack_padded_sequence(x, lens))
    return pad_packed_sequence(h, total_length=x.shape[0])[0]
