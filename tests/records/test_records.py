"""The records package: store, runtime Protocol, routes (the layers of the per-record glue)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.records import (
    InMemoryRecords,
    RecordComputationError,
    RecordSource,
    build_record_functions,
)

PKG = Path(pymc_dp.__file__).parent


def test_store_chunks_take_and_map_reduce():
    a = np.arange(10.0)
    b = np.arange(20).reshape(10, 2)
    store = InMemoryRecords([a, b], chunk_size=4)
    chunks = list(store.chunks())
    assert [len(c[0]) for c in chunks] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([c[1] for c in chunks]), b)
    rows = store.take(np.array([9, 0, 9]))
    np.testing.assert_array_equal(rows[0], [9.0, 0.0, 9.0])
    total = store.map_reduce(lambda x, y: x.sum() + y.sum(), lambda s, v: s + v, 0.0)
    assert total == a.sum() + b.sum()
    assert store.all_finite([True, True])
    assert not InMemoryRecords([np.array([1.0, np.nan])]).all_finite([True])
    assert InMemoryRecords([np.array([1.0, np.nan])]).all_finite([False])
    assert InMemoryRecords([np.array([1.0, np.nan])]).any_nan([True])
    assert not InMemoryRecords([np.array([1.0, np.nan])]).any_nan([False])
    assert not InMemoryRecords([np.array([1.0, np.inf])]).any_nan([True])


def test_one_chunk_clipped_grad_sum_is_the_store_path_bit_for_bit():
    """Records in memory in one chunk: `clipped_grad_sum` calls the route's compiled function
    directly (issue 28); the same bits as the store's `map_reduce` over that chunk, the same
    release count, and a non-finite sum (records whose gradient overflows) still goes
    through the route's masked function (those records contribute 0, counted as clipped)."""
    rng = np.random.default_rng(3)
    x1, x2 = rng.normal(0.0, 3.0, size=50), rng.normal(1.0, 3.0, size=50)
    x2[[5, 17]] = [1e308, -1e308]  # their gradients overflow where t[0] is not small
    with pm.Model() as model:
        t = pm.Normal("t", 0.0, 10.0, shape=2)
        pm.Normal("x1", t[0], 1.0, observed=x1)
        pm.Normal("x2", t[1] + 0.5 * t[0] ** 2, 1.0, observed=x2)
    ip = model.initial_point()
    one, _ = build_record_functions(model, model.value_vars, ip)
    via_store, _ = build_record_functions(model, model.value_vars, ip, chunk_size=50)
    chunked, _ = build_record_functions(model, model.value_vars, ip, chunk_size=7)
    assert via_store.records.whole() is not None and chunked.records.whole() is None
    via_store.records.whole = lambda: None  # this instance: the map_reduce path, one chunk
    overflowed = 0
    for q in (np.array([0.3, -0.2]), np.array([2.0, 1.0]), np.zeros(2)):
        for b in (0.5, 4.0, 1e3):
            g1, k1 = one.clipped_grad_sum(q, b)
            g2, k2 = via_store.clipped_grad_sum(q, b)
            g3, k3 = chunked.clipped_grad_sum(q, b)
            assert g1.tobytes() == g2.tobytes() and k1 == k2 == k3
            assert np.all(np.isfinite(g1))
            with np.errstate(over="ignore", invalid="ignore"):
                grads = one.per_record_grad(q)
                lengths = np.minimum(np.sqrt(np.sum(grads * grads, axis=1)), b)
            overflowed += int(np.sum(~np.all(np.isfinite(grads), axis=1)))
            # other chunks: another summation order, and a clipped record's float32 weight
            # may round differently in a loop's remainder (within the route's margin)
            slack = 2.0 * one._c.grad_clipped["route"].weight_margin * np.nansum(lengths)
            np.testing.assert_allclose(g1, g3, rtol=1e-12, atol=1e-12 + slack)
    assert overflowed > 0  # the masked function was needed somewhere
    assert one.released["grad"] == via_store.released["grad"] == 9
    # an error on the direct path leaves as on the store's: its type only

    def failing(*args):
        raise FloatingPointError(f"bad input {args[-1]!r}")

    # the route's Numba function called directly (set up by the calls above; issue 28,
    # twelfth session), then the route's compiled function (the direct call unset)
    assert one._direct is not None
    one._direct = (failing, *one._direct[1:])
    for _ in range(2):
        with pytest.raises(RecordComputationError, match=r"\(FloatingPointError\)") as err:
            one.clipped_grad_sum(np.zeros(2), 1.0)
        assert err.value.__context__ is None and "bad input" not in str(err.value)
        one._direct, one._direct_off = None, True
        one._c.grad_clipped["route"].fast = failing


def test_record_functions_satisfy_the_protocol_the_steps_use(logistic_model):
    model, *_ = logistic_model
    with model:
        fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    assert isinstance(fns, RecordSource)
    steps_use = set()
    for path in (PKG / "step_methods").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "_fns"
            ):
                steps_use.add(node.attr)
    protocol = {n for n in dir(RecordSource) if not n.startswith("_")}
    protocol |= set(RecordSource.__annotations__)  # the data attributes (n_records, ...)
    assert steps_use <= protocol, steps_use - protocol


def test_raw_data_enters_only_in_the_store():
    """Only records/store.py reads values of data nodes (get_value / .data of a constant)."""
    readers = []
    for path in (PKG / "records").glob("*.py"):
        text = path.read_text()
        if ".get_value(" in text and path.name != "store.py":
            readers.append(path.name)
    assert readers == []


def test_glm_route_matches_generic_on_a_glm_and_generic_elsewhere(logistic_model):
    model, X, y = logistic_model
    with model:
        fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    q = np.array([0.2, -0.4, 0.3])
    g_fast, k_fast = fns.clipped_grad_sum(q, 0.5)
    assert fns.gradient_route == "GLM fast"
    g = fns.per_record_grad(q)
    norms = np.linalg.norm(g, axis=1)
    ref = (g * np.minimum(1.0, 0.5 / norms)[:, None]).sum(axis=0)
    np.testing.assert_allclose(g_fast, ref, rtol=1e-9)
    assert k_fast == int(np.sum(norms > 0.5))
    with pm.Model() as banana:
        t = pm.Normal("t", 0, 1, shape=2)
        pm.Normal("x", t[0] + t[1] ** 2, 1, observed=np.linspace(-1, 1, 30))
        fb, _ = build_record_functions(banana, banana.value_vars, banana.initial_point())
    fb.clipped_grad_sum(np.array([0.1, 0.2]), 1.0)
    assert fb.gradient_route == "blocks"  # no block factorises: per-block sums


def test_binomial_numpy_observed_is_accepted_and_exact_whatever_the_values():
    """PyTensor 3 folds support checks over a numpy observed array into the graph (an
    ``Alloc(False, n)`` when every record passes); the glue must neither refuse the model
    depending on the data values nor change its per-record log-likelihoods."""
    from scipy import stats

    for seed in range(4):
        y = np.random.default_rng(seed).binomial(5, 0.3, size=40)
        with pm.Model() as model:
            pm.Beta("p", 1, 1)
            pm.Binomial("y", n=5, p=model["p"], observed=y)
            fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
        q = np.array([-0.4])  # log-odds of p
        p = 1 / (1 + np.exp(0.4))
        np.testing.assert_allclose(fns.loglik(q), stats.binom.logpmf(y, 5, p), rtol=1e-10)


def _count_ops(graph, name: str) -> int:
    from pytensor.graph.traversal import ancestors

    ops = [v.owner.op for v in ancestors([graph]) if v.owner is not None]
    return sum(1 for op in ops if name in type(getattr(op, "scalar_op", op)).__name__)


def test_lift_switches_evaluates_the_branch_function_once_with_the_same_values():
    import pytensor
    import pytensor.tensor as pt

    from pymc_dp.records.rewrite import lift_switches

    c = pt.vector("c", dtype="bool")
    a, b = pt.vector("a"), pt.vector("b")
    out = pt.switch(c, pt.exp(pt.log1p(a) * 2.0), pt.exp(pt.log1p(b) * 2.0))
    lifted = lift_switches(out)
    assert _count_ops(out, "Exp") == 2 and _count_ops(lifted, "Exp") == 1
    assert _count_ops(lifted, "Log1p") == 1
    rng = np.random.default_rng(0)
    cv = rng.uniform(size=50) < 0.5
    av = np.concatenate([rng.normal(size=46), [np.nan, np.inf, -1.0, -2.0]])
    bv = np.concatenate([rng.normal(size=46), [0.0, np.nan, np.inf, -np.inf]])
    f0 = pytensor.function([c, a, b], out, mode="FAST_COMPILE")
    f1 = pytensor.function([c, a, b], lifted, mode="FAST_COMPILE")
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(f1(cv, av, bv), f0(cv, av, bv))
    # a branch with another client stays: lifting would not save its evaluation
    shared = pt.exp(a)
    kept = lift_switches(pt.switch(c, shared, pt.exp(b)) + shared)
    assert _count_ops(kept, "Exp") == 2


def test_bernoulli_logit_loglik_has_one_softplus_and_matches_pymc_at_extreme_logits():
    """PyMC's Bernoulli-logit log-density is switch(y, -softplus(-eta), -softplus(eta)): the
    per-record functions compute one softplus per record and give PyMC's values."""
    from pymc_dp.records.rewrite import lift_switches

    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 2)) * np.array([1.0, 400.0])  # logits up to ~1e3 in size
    y = rng.integers(0, 2, 300)
    with pm.Model() as model:
        w = pm.Normal("w", 0, 2, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, w), observed=y)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    assert _count_ops(lift_switches(fns._graphs.ll_batch), "Softplus") == 1
    pointwise = model.compile_fn(
        model.logp(vars=model.observed_RVs, sum=False), inputs=model.value_vars
    )
    for wv in ([0.3, -0.8], [-1.5, 2.0], [0.0, 0.0]):
        q = np.array(wv)
        np.testing.assert_allclose(fns.loglik(q), pointwise({"w": q})[0], rtol=1e-12, atol=0)
        q2 = q + 0.01
        r = pointwise({"w": q2})[0] - pointwise({"w": q})[0]
        s, k = fns.clipped_loglik_ratio_sum(q2, q, 0.5)
        assert k == int(np.sum(np.abs(r) > 0.5))
        np.testing.assert_allclose(s, np.clip(r, -0.5, 0.5).sum(), rtol=1e-12)


def test_compiled_functions_skip_the_input_filter_only_for_exact_arguments():
    """`_TrustedCall`: exact arguments skip PyTensor's filter (``trust_input``); anything else
    is filtered as before (same conversions, same errors); picklable."""
    import pickle

    import pytensor.tensor as pt
    import pytest

    from pymc_dp.records.backend import compile_function

    q = pt.tensor("q", dtype="float64", shape=(3,))
    b = pt.dscalar("b")
    data = pt.tensor("data", dtype="int64", shape=(None,))
    f = compile_function([q, b, data], pt.sum(q) * b + pt.sum(data))
    qv, dv = np.array([1.0, 2.0, 3.0]), np.arange(4)
    assert f._exact((qv, 2.0, dv)) is not None
    assert float(f(qv, 2.0, dv)) == 18.0 and f._f.trust_input
    # not exact: PyTensor's filter converts (a list, an int array) or refuses, as without us
    converted = (([1.0, 2.0, 3.0], 2.0, dv), (qv.astype("float32"), np.float64(2.0), [0, 1, 2, 3]))
    for args in converted:
        assert f._exact(args) is None
        assert float(f(*args)) == 18.0 and not f._f.trust_input
    for bad in ((np.ones(4), 2.0, dv), (qv, 2.0, np.arange(4.0)), (qv, "2", dv)):
        assert f._exact(bad) is None
        with pytest.raises((TypeError, ValueError)):
            f(*bad)
    g = pickle.loads(pickle.dumps(f))
    assert float(g(qv, 2.0, dv)) == 18.0


def _multinomial_logit(reference_in_parameters: bool):
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(40, 2))
    y = rng.integers(0, 3, size=40)
    with pm.Model() as model:
        B = pm.Normal("B", 0, 1, shape=(2, 2))
        if reference_in_parameters:
            eta = pm.math.dot(X, pm.math.concatenate([pm.math.zeros((2, 1)), B], axis=1))
        else:
            zeros = pm.math.zeros((X.shape[0], 1))
            eta = pm.math.concatenate([zeros, pm.math.dot(X, B)], axis=1)
        pm.Categorical("y", p=pm.math.softmax(eta, axis=1), observed=y)
    return model


def test_a_constant_column_of_n_rows_joined_to_the_records_is_refused_clearly():
    """A multinomial logit written as PyMC users do, its reference category's column
    ``pm.math.zeros((X.shape[0], 1))`` with a numpy X (issue-26 sweep): a bare PyTensor
    ValueError before; now a refusal naming the cause and the fix, raised while the step
    builds its graphs (before any data is read)."""
    with _multinomial_logit(False):
        with pytest.raises(pymc_dp.ModelNotSupportedError, match="an array of n rows") as err:
            pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=5.0)
    assert "pt.zeros((k, 1))" in str(err.value)


def test_a_constant_joined_to_the_parameters_is_kept():
    """``pt.concatenate([pt.zeros((k, 1)), B], axis=1)``: the shape-pin removal made the
    Alloc of 0 a (1, 1) constant, which a Join does not broadcast (PyTensor's ValueError,
    issue-26 sweep); an Alloc of a constant is now made broadcastable only where every use is
    elementwise. On PyTensor 3 the categorical's ``p[arange(n)[:, None], value[:, None]]``
    made it look inseparable (an xfail until the fourteenth session:
    `pymc_dp.records.rewrite.record_position_indices`)."""
    with _multinomial_logit(True):
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=5.0)
        idata = pm.sample(
            3,
            tune=0,
            chains=1,
            step=step,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert idata["posterior"]["B"].shape == (1, 3, 2, 2)
