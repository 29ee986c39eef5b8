"""PyMC helpers for hidden Markov models (PyMC is imported only when a helper is called).

* :func:`hmm_marginal`: adds an HMM's marginal log-likelihood (states summed out by
  :func:`ptnative.hmm_log_likelihood`) to a PyMC model.
* :func:`recover_states`: per posterior draw of an ``InferenceData``, the smoothed state marginals, the Viterbi
  path and a path drawn from ``p(z | x, theta)`` (:func:`ptnative.hmm_posteriors`, :func:`ptnative.hmm_viterbi`,
  :func:`ptnative.hmm_sample_states`).

See ``docs/hmm.md`` ("With PyMC").
"""

from __future__ import annotations

import numpy as np

from .ops.hmm import hmm_log_likelihood, hmm_posteriors, hmm_sample_states, hmm_viterbi


def hmm_marginal(name, log_emissions, log_transitions, log_initial, log_final=None, mask=None, model=None):
    """Add ``sum_b log p(x_b)`` of the HMM to the PyMC model as ``pm.Potential(name, ...)`` and return it.

    The arguments are those of :func:`ptnative.hmm_log_likelihood` (graphs of the model's variables: the
    emissions' log-densities of the observed data, (K, K), (B, K, K) or (T-1, B, K, K) log-transitions, (K,) or
    (B, K) log-initial weights); ``model`` defaults to the model in context.  NUTS and the other gradient-based
    samplers get the gradient through the op.  A potential is not an observed variable: it is part of the model's
    logp but not of ``pm.compute_log_likelihood`` (for LOO / WAIC write a ``pm.CustomDist`` whose logp is
    ``hmm_log_likelihood``, as ``examples/hmm_pymc.py`` does).
    """
    import pymc as pm

    model = pm.modelcontext(model)
    with model:
        ll = hmm_log_likelihood(log_emissions, log_transitions, log_initial, log_final, mask)
        return pm.Potential(name, ll.sum())


def recover_states(idata, log_emissions, log_transitions, log_initial, log_final=None, mask=None, *, model=None,
                   random_seed=None, marginals=True, viterbi=True, samples=True):
    """The hidden states behind each posterior draw of ``idata``, as an ``xarray.Dataset``.

    ``log_emissions`` ... ``mask`` are the graphs given to :func:`hmm_marginal` (or to
    ``hmm_log_likelihood`` in a model of your own), built from the model's free random variables, with
    ``log_transitions`` (K, K), (B, K, K) or (T-1, B, K, K) and ``log_initial`` (K,) or (B, K) (the shapes of
    :func:`ptnative.hmm_posteriors`); for each ``(chain, draw)`` of ``idata.posterior`` they are evaluated at that
    draw's values and the selected results computed:

    * ``hmm_marginals`` (chain, draw, time, series, state): ``p(z_t = k | x, theta_draw)`` (0 on padded frames);
    * ``hmm_viterbi`` (chain, draw, time, series) int32 and ``hmm_viterbi_logp`` (chain, draw, series): the most
      likely path given the draw (-1 on padded frames) and its log joint probability;
    * ``hmm_sample`` (chain, draw, time, series) int32: a path drawn from ``p(z | x, theta_draw)`` (forward
      filtering, backward sampling) with uniforms from ``numpy.random.default_rng(random_seed)``, so that the
      draws of ``hmm_sample`` together are draws of the states from their posterior.

    Averaging ``hmm_marginals`` over chain and draw gives the posterior state probabilities with the parameter
    uncertainty integrated out.  ``model`` defaults to the model in context.  Raises ``ValueError`` if a free
    variable the graphs need is missing from ``idata.posterior``.
    """
    import pymc as pm
    import pytensor
    import pytensor.tensor as pt
    import xarray as xr
    from pytensor.graph.replace import clone_replace

    try:
        from pytensor.graph.traversal import ancestors
    except ImportError:  # PyTensor < 2.31
        from pytensor.graph.basic import ancestors

    model = pm.modelcontext(model)
    if not (marginals or viterbi or samples):
        raise ValueError("recover_states: nothing to compute (marginals, viterbi and samples are all False)")
    args = (log_emissions, log_transitions, log_initial, log_final, mask)
    le = pt.as_tensor_variable(log_emissions)
    uniforms = pt.matrix("uniforms", dtype=le.dtype)
    outputs, names = [le.shape[0], le.shape[1]], []
    if marginals:
        outputs.append(hmm_posteriors(*args)[0])
        names.append("hmm_marginals")
    if viterbi:
        outputs += list(hmm_viterbi(*args))
        names += ["hmm_viterbi", "hmm_viterbi_logp"]
    if samples:
        outputs.append(hmm_sample_states(*args, uniforms=uniforms))
        names.append("hmm_sample")
    post = idata.posterior
    if hasattr(post, "to_dataset"):  # ArviZ >= 1: a DataTree node
        post = post.to_dataset()
    used = set(ancestors(outputs))
    rvs = [rv for rv in model.free_RVs if rv in used]
    missing = [rv.name for rv in rvs if rv.name not in post.data_vars]
    if missing:
        raise ValueError(f"recover_states: idata.posterior has no draws of {missing}, which the HMM's graphs need")
    inputs = [rv.type(name=rv.name) for rv in rvs]
    outputs = clone_replace(outputs, dict(zip(rvs, inputs)))
    n_chain, n_draw = post.sizes["chain"], post.sizes["draw"]
    # Every draw's value is checked against its variable's type once, here; the functions then skip PyTensor's
    # per-call input checks (trust_input), which cost about as much as a short series' kernel.
    values = [np.ascontiguousarray(post[rv.name].values, dtype=rv.type.dtype) for rv in rvs]
    for rv, v in zip(rvs, values):
        if n_chain * n_draw:
            rv.type.filter(v[0, 0, ...], strict=True)
    fn = pytensor.function(inputs + [uniforms], outputs[2:], on_unused_input="ignore", trust_input=True)
    uniforms_shape = _uniforms_shape(pytensor, ancestors, inputs, outputs[:2]) if samples else lambda *point: (0, 0)
    rng = np.random.default_rng(random_seed)
    results = {name: [] for name in names}
    for c in range(n_chain):
        for d in range(n_draw):
            point = [v[c, d, ...] for v in values]  # arrays, also for scalar variables
            u = rng.random(uniforms_shape(*point)) if samples else np.zeros((0, 0))
            for name, value in zip(names, fn(*point, u.astype(uniforms.dtype))):
                results[name].append(value)
    dims = {"hmm_marginals": ("time", "series", "state"), "hmm_viterbi": ("time", "series"),
            "hmm_viterbi_logp": ("series",), "hmm_sample": ("time", "series")}
    data = {}
    for name, vals in results.items():
        arr = np.stack(vals).reshape((n_chain, n_draw) + np.shape(vals[0]))
        data[name] = (("chain", "draw") + dims[name], arr)
    return xr.Dataset(data, coords={"chain": post.coords["chain"], "draw": post.coords["draw"]})


def _uniforms_shape(pytensor, ancestors, inputs, shape):
    """``(T, B)`` of a draw's uniforms, as a function of the draw's values: computed once where the compiled shape
    graph no longer depends on any variable (the usual case: the series' shape is the data's), else per draw."""
    fn = pytensor.function(inputs, shape, on_unused_input="ignore", trust_input=True)
    graph = fn.maker.fgraph
    per_draw = bool(set(graph.inputs) & set(ancestors(graph.outputs)))
    known = []

    def uniforms_shape(*point):
        if per_draw or not known:
            known[:] = [tuple(int(s) for s in fn(*point))]
        return known[0]

    return uniforms_shape
