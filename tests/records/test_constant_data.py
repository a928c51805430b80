"""Per-record graphs that do not depend on the data's values (issue 26).

PyTensor's rewrites read a constant array whose entries are all equal as one scalar and
simplify by it. With a numpy observed array of all zeros (or all ones) the per-record graphs
lost their record axis, and `DPPenaltyMetropolis` / `DPHMC` failed with ``AxisError`` in the
gradient routes while the same model with mixed values ran: whether a run failed told
whether every record had the same value. The graphs must be the same for any values.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import graph_inputs, io_toposort

import pymc_dp
from pymc_dp.records import build_record_functions
from pymc_dp.records.graphs import per_record_graphs

N = 20


def _model(lik: str, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        if lik == "Normal":
            pm.Normal("obs", a, 1.0, observed=y)
        elif lik == "Bernoulli":
            pm.Bernoulli("obs", logit_p=a, observed=y)
        elif lik == "Poisson":
            pm.Poisson("obs", pm.math.exp(a), observed=y)
        else:
            pm.Binomial("obs", n=3, p=pm.math.sigmoid(a), observed=y)
    return model


def _values(lik: str) -> dict[str, np.ndarray]:
    out = {"zeros": np.zeros(N), "ones": np.ones(N), "mixed": np.r_[np.zeros(N - 1), 1.0]}
    if lik == "Binomial":
        out["all n"] = np.full(N, 3.0)
    if lik != "Normal":
        out = {k: v.astype("int64") for k, v in out.items()}
    return out


def _structure(graph) -> tuple:
    """The graph's operations and their inputs' kinds and static shapes (no constant value)."""
    nodes = io_toposort(list(graph_inputs([graph])), [graph])
    return tuple(
        (str(node.op), tuple((isinstance(i, Constant), i.type.shape) for i in node.inputs))
        for node in nodes
    )


def _reference_loglik(model, a: float) -> np.ndarray:
    [term] = model.logp(vars=model.observed_RVs, sum=False)
    return np.asarray(model.compile_fn(term, inputs=model.value_vars)({"a": np.array(a)}))


@pytest.mark.parametrize("lik", ["Normal", "Bernoulli", "Poisson", "Binomial"])
def test_per_record_graphs_do_not_depend_on_the_values(lik):
    structures = {}
    for name, y in _values(lik).items():
        model = _model(lik, y)
        g = per_record_graphs(model, model.value_vars, model.initial_point())
        structures[name] = (_structure(g.ll_batch), _structure(g.one_record), len(g.data_nodes))
        # the functions are right for these values: per-record log-likelihoods against
        # PyMC's, per-record gradients (n x 1) against central differences, and the clipped
        # gradient sum of the routes (where the all-zero data failed with AxisError)
        fns = build_record_functions(model, model.value_vars, model.initial_point())[0]
        q, h = np.array([0.3]), 1e-6
        np.testing.assert_allclose(fns.loglik(q), _reference_loglik(model, 0.3), rtol=1e-10)
        G = fns.per_record_grad(q)
        assert G.shape == (N, 1), name
        fd = (fns.loglik(q + h) - fns.loglik(q - h)) / (2 * h)
        np.testing.assert_allclose(G[:, 0], fd, atol=1e-6)
        s, k = fns.clipped_grad_sum(q, 0.5)
        assert k == int((np.abs(G[:, 0]) > 0.5).sum())
        # a route may form clip weights in float32, shortening a clipped record's gradient
        # (norm 0.5) by a factor in [1 - 2^-16 - 4 * 2^-24, 1] (`clipping.clip_weights`)
        atol = k * 0.5 * (2.0**-16 + 4 * 2.0**-24) + 1e-12
        np.testing.assert_allclose(s, np.clip(G[:, 0], -0.5, 0.5).sum(), rtol=0, atol=atol)
    first = next(iter(structures.values()))
    for name, s in structures.items():
        assert s == first, f"{lik}: the per-record graphs of {name!r} differ from the others'"


HMC_KW = {"llr_clip_bound": 2.0, "grad_clip_bound": 2.0, "n_leapfrog": 3}


def _short_run(model, cls, kw):
    """10 + 10 iterations of one chain of step class ``cls`` (hyperparameters ``kw``)."""
    with model:
        return pymc_dp.sample(
            step=cls, step_kwargs=kw, epsilon=4.0, delta=1e-6, draws=10, tune=10, chains=1,
            random_seed=1, progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip


@pytest.mark.parametrize("step", ["penalty", "hmc"])
@pytest.mark.parametrize("lik", ["Normal", "Bernoulli", "Poisson"])
def test_steps_run_on_all_zero_observed(lik, step):
    """The combinations that raised AxisError before (numpy observed, all zeros)."""
    model = _model(lik, _values(lik)["zeros"])
    if step == "penalty":
        cls, kw = pymc_dp.DPPenaltyMetropolis, {"clip_bound": 2.0}
    else:
        cls, kw = pymc_dp.DPHMC, HMC_KW
    idata = _short_run(model, cls, kw)
    assert idata.posterior["a"].shape == (1, 10)


def _glm(lik: str, x: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=2)
        eta = b[0] + b[1] * x
        if lik == "Normal":
            pm.Normal("obs", eta, 1.0, observed=y)
        else:
            pm.Poisson("obs", pm.math.exp(eta), observed=y)
    return model


@pytest.mark.parametrize("lik", ["Normal", "Poisson"])
def test_constant_covariate_column_takes_the_same_route(lik):
    """A numpy covariate column that is constant in the data (all 0, all 1, all 2) and a mixed
    one give the same per-record graphs, data nodes and affine-bypass decision (helper 247).

    PyMC's log-probability rewrites turned ``b0 + b1 * x`` with ``x`` all ones into
    ``b0 + b1`` (``x`` no data node; the Normal model then took the affine bypass, the
    mixed one did not), and with ``x`` all zeros dropped ``b1`` (``DisconnectedInputError``
    in the gradient).
    """
    from pymc_dp.records.affine import affine_in_data, ratio_affine_in_data

    rng = np.random.default_rng(3)
    y = rng.poisson(2.0, size=N).astype("float64" if lik == "Normal" else "int64")
    columns = {
        "zeros": np.zeros(N),
        "ones": np.ones(N),
        "twos": np.full(N, 2.0),
        "mixed": rng.normal(size=N),
    }
    seen = {}
    for name, x in columns.items():
        model = _glm(lik, x, y)
        g = per_record_graphs(model, model.value_vars, model.initial_point())
        seen[name] = (
            _structure(g.ll_batch),
            _structure(g.one_record),
            len(g.data_nodes),
            affine_in_data(g),
            ratio_affine_in_data(g),
        )
        # right for these values: per-record log-likelihoods against PyMC's and gradients
        # against central differences
        fns = build_record_functions(model, model.value_vars, model.initial_point())[0]
        q, h = np.array([0.2, -0.1]), 1e-6
        [term] = model.logp(vars=model.observed_RVs, sum=False)
        ref = model.compile_fn(term, inputs=model.value_vars)({"b": q})
        np.testing.assert_allclose(fns.loglik(q), ref, rtol=1e-10)
        G = fns.per_record_grad(q)
        assert G.shape == (N, 2), name
        for j in range(2):
            e = np.eye(2)[j] * h
            fd = (fns.loglik(q + e) - fns.loglik(q - e)) / (2 * h)
            np.testing.assert_allclose(G[:, j], fd, atol=1e-5)
    first = seen["mixed"]
    for name, s in seen.items():
        assert s == first, f"{lik}: covariate {name!r} differs from the mixed column"


def test_step_runs_with_an_all_zero_covariate():
    """DPHMC on a Poisson GLM whose covariate column is all zeros (before: PyMC dropped the
    column, the likelihood's compiled function did not read it: ``UnusedInputError``)."""
    y = np.random.default_rng(4).poisson(2.0, size=N)
    idata = _short_run(_glm("Poisson", np.zeros(N), y), pymc_dp.DPHMC, HMC_KW)
    assert idata.posterior["b"].shape == (1, 10, 2)


def test_group_index_equal_to_record_positions_is_data():
    """A group index column equal to ``0 .. n-1`` (one latent value a record, ``a[g]``) and a
    permuted one take the same route with the right per-record log-likelihoods (helper 247:
    `record_position_indices` took the former for PyTensor 3's folded ``arange(n)`` and the
    model was refused as not separable, the permuted column ran)."""
    rng = np.random.default_rng(5)
    y = rng.normal(size=N)
    q = np.linspace(-1.0, 1.0, N)
    seen = {}
    for name, g in {"positions": np.arange(N), "permuted": rng.permutation(N)}.items():
        with pm.Model() as model:
            a = pm.Normal("a", 0.0, 1.0, shape=N)
            pm.Normal("obs", a[g], 1.0, observed=y)
        g_ = per_record_graphs(model, model.value_vars, model.initial_point())
        seen[name] = (_structure(g_.ll_batch), _structure(g_.one_record), len(g_.data_nodes))
        fns = build_record_functions(model, model.value_vars, model.initial_point())[0]
        [term] = model.logp(vars=model.observed_RVs, sum=False)
        ref = model.compile_fn(term, inputs=model.value_vars)({"a": q})
        np.testing.assert_allclose(fns.loglik(q), ref, rtol=1e-10)
        assert fns.per_record_grad(q).shape == (N, N)
    assert seen["positions"] == seen["permuted"]
