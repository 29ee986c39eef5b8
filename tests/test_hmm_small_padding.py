"""hmm_posteriors' one-sequence path (B = 1, K <= 4) reads the log-emissions four entries at a time where the array
has them, so a frame's read also takes the first entries of the next frame: those must not count.  Padded frames
full of NaN and +inf right after the last valid one (and a series that ends at the array's end, where the last
frames are read entry by entry), against the same sequence in a batch of two (the general path) and the numpy
log-space reference."""

import numpy as np
import pytest

from .reference import fsa as ref_fsa
from .test_hmm import mask_of, model
from .test_hmm_small import posteriors_with_gradient, twice


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_posteriors_one_sequence_ignores_entries_past_the_frame(K, dtype):
    rng = np.random.default_rng(700 + K)
    T = 37
    le, lA, lpi, lf = model(rng, T, 1, K, 1.5)
    f = posteriors_with_gradient(dtype)
    rtol, atol = (1e-10, 1e-12) if dtype == "float64" else (2e-4, 2e-5)
    for length in (T, T - 1, T - 2, 5, 2, 1):
        padded = le.copy()
        padded[length:, 0, 0::2] = np.inf  # +inf and NaN on every padded frame (not read: ignored)
        padded[length:, 0, 1::2] = np.nan
        mask = mask_of([length], T).astype(dtype)
        args = (padded.astype(dtype), lA.astype(dtype), lpi.astype(dtype), lf.astype(dtype), mask)
        gamma, xi, d = f(*args)
        g2, x2, d2 = f(*twice(args[0]), *args[1:4], *twice(args[4]))
        assert np.isfinite(gamma).all() and np.isfinite(xi).all() and np.isfinite(d).all()
        np.testing.assert_allclose(gamma[:, 0], g2[:, 0], rtol=rtol, atol=atol)
        np.testing.assert_allclose(xi[0], x2[0], rtol=rtol, atol=atol * T)
        np.testing.assert_allclose(d[:, 0], d2[:, 0], rtol=rtol * 100, atol=atol * 100 * T)
        want_gamma, want_xi = ref_fsa.hmm_posteriors(le, lA, lpi, lf, [length])
        np.testing.assert_allclose(gamma, want_gamma, rtol=rtol * 10, atol=atol * 10)
        np.testing.assert_allclose(xi, want_xi, rtol=rtol * 10, atol=atol * 10 * T)
        assert np.all(gamma[length:] == 0)
