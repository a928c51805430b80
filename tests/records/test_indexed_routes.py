"""The clipped-gradient routes against a reference per-record numpy loop (issue 16).

Every index pattern a PyMC user writes (varying intercepts, slopes, crossed ``a[g] + b[h]``,
nested ``a[g] + c[state_of[g]]``, non-centred ``mu + sd * z[g]``, indices in ``pm.Data``, a
matrix-valued group parameter, the same source read through two indices) takes the sorted
route (issue 28) where it applies and the indexed route otherwise, and each is held, with
the sorted route tried and without it, to the clipped sums and counts of a loop over the
records one at a time, keeping the gathers vectorised (no ``Blockwise`` in the compiled
function): with non-finite records and with chunking. The GLM and generic routes are held
to the same reference.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from pytensor.tensor.blockwise import Blockwise

import pymc_dp
from pymc_dp.records import build_record_functions
from pymc_dp.records.clipping import reference_clipped_sum

N, J, H, S = 61, 5, 3, 2  # records, groups, crossed levels, states


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "g": rng.integers(0, J, N),
        "h": rng.integers(0, H, N),
        "x": rng.uniform(-1, 1, N),
        "X": rng.uniform(-1, 1, (N, 2)),
        "y": rng.normal(size=N),
        "counts": rng.poisson(2.0, N),
        "state_of": np.array([0, 1, 1, 0, 1]),
    }


def _model(pattern: str, D: dict) -> pm.Model:
    g, h, x, y = D["g"], D["h"], D["x"], D["y"]
    with pm.Model(coords={"group": range(J)}) as m:
        s = pm.HalfNormal("s", 1.0)
        if pattern == "intercepts":
            mu = pm.Normal("mu", 0, 1)
            a = pm.Normal("a", mu, 1.0, dims="group")
            pm.Normal("y", a[g], s, observed=y)
        elif pattern == "slopes":
            a = pm.Normal("a", 0, 1, shape=J)
            b = pm.Normal("b", 0, 1, shape=J)
            pm.Normal("y", a[g] + b[g] * x, s, observed=y)
        elif pattern == "crossed":
            a = pm.Normal("a", 0, 1, shape=J)
            c = pm.Normal("c", 0, 1, shape=H)
            pm.Normal("y", a[g] + c[h], s, observed=y)
        elif pattern == "nested":
            a = pm.Normal("a", 0, 1, shape=J)
            c = pm.Normal("c", 0, 1, shape=S)
            pm.Normal("y", a[g] + c[D["state_of"][g]], s, observed=y)
        elif pattern == "noncentred_data":
            mu = pm.Normal("mu", 0, 1)
            sd = pm.HalfNormal("sd", 1)
            z = pm.Normal("z", 0, 1, dims="group")
            a = pm.Deterministic("a", mu + sd * z, dims="group")
            gi = pm.Data("g", g)
            hi = pm.Data("h", h)
            c = pm.Normal("c", 0, 1, shape=H)
            pm.Normal("y", a[gi] + c[hi], s, observed=y)
        elif pattern == "matrix_param":
            B = pm.Normal("B", 0, 1, shape=(J, 2))
            pm.Normal("y", (B[g] * D["X"]).sum(axis=-1), s, observed=y)
        elif pattern == "same_source":
            a = pm.Normal("a", 0, 1, shape=J)
            pm.Normal("y", a[g] - a[h], s, observed=y)
        elif pattern == "negative_index":  # numpy semantics: -1 is the last group
            a = pm.Normal("a", 0, 1, shape=J)
            g_neg = np.where(np.arange(N) % 2 == 1, g - J, g)
            pm.Normal("y", a[g_neg] + 2.0 * a[h], s, observed=y)
        elif pattern == "poisson":
            beta = pm.Normal("beta", 0, 1, shape=2)
            a = pm.Normal("a", 0, 1, shape=J)
            gi = pm.Data("g", g)
            pm.Poisson("y", pt.exp(pt.dot(D["X"], beta) + a[gi]), observed=D["counts"])
    return m


#: Patterns the sorted route (`pymc_dp.records.sorted_segments`) serves; the others (a
#: matrix-valued group parameter, a dot product over a record's covariates) take the
#: indexed route whichever routes are tried.
SORTED = (
    "intercepts",
    "slopes",
    "crossed",
    "nested",
    "noncentred_data",
    "same_source",
    "negative_index",
)

PATTERNS = (
    "intercepts",
    "slopes",
    "crossed",
    "nested",
    "noncentred_data",
    "matrix_param",
    "same_source",
    "negative_index",
    "poisson",
)


@pytest.fixture(params=["sorted", "indexed"])
def routes_tried(request, monkeypatch):
    """Every route (the sorted route first), or every route but the sorted one (so that the
    indexed route is held to the same reference on the patterns the sorted one serves)."""
    from pymc_dp.records import routes

    if request.param == "indexed":
        kept = tuple(r for r in routes.GRADIENT_ROUTES if r != "sorted")
        monkeypatch.setattr(routes, "GRADIENT_ROUTES", kept)
    return request.param


def _expected_route(pattern: str, routes_tried: str) -> str:
    return "sorted" if routes_tried == "sorted" and pattern in SORTED else "indexed"


def _fns(model, chunk_size=None):
    ip = model.initial_point()
    fns, _ = build_record_functions(model, model.value_vars, ip, chunk_size=chunk_size)
    q0 = np.concatenate([np.ravel(ip[v.name]) for v in model.value_vars])
    return fns, q0


def _loop_reference(fns, q, bound):
    """Clip every record's gradient alone, in a Python loop over the records, with the
    chosen route's clip weight: exact, or the float32 weight with its margin
    (`pymc_dp.records.clipping.clip_weights`), then within 4 float32 ulps per clipped
    record (fast-math may round its float32 operations differently): ``(total, count,
    slack)``."""
    fs = fns._c.grad_clipped
    m = fs["route"].weight_margin if fs is not None else 0.0
    total, count, slack = np.zeros(fns.ndim), 0, 0.0
    arrays = fns._records._arrays
    for i in range(fns.n_records):
        g = np.asarray(fns._c.grad_chunk(q, *[a[i : i + 1] for a in arrays]))[0]
        with np.errstate(over="ignore", invalid="ignore"):
            sq = np.sum(g * g)
            norm = np.sqrt(sq)
        if not np.isfinite(norm):
            count += 1
            continue
        if norm > bound:
            count += 1
        if not m:
            total += g * min(1.0, bound / norm)
        elif sq <= (bound * (1.0 - m)) ** 2:
            total += g
        else:
            inner = bound * (1.0 - m)
            r = np.float32(sq * (1.0 / (inner * inner)))
            w = float(min(np.float32(1.0), np.float32(1.0) / np.sqrt(r)))
            total += g * (w if w * w * sq <= bound * bound else 0.0)
            slack += 4 * 2.0**-24 * min(norm, bound)
    return total, count, slack


def _assert_same(a, b):
    assert a[1] == b[1]
    slack = b[2] if len(b) > 2 else 0.0
    np.testing.assert_allclose(a[0], b[0], rtol=1e-9, atol=1e-12 + slack)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_indexed_route_matches_a_per_record_loop(pattern, routes_tried):
    D = _data()
    model = _model(pattern, D)
    fns, q0 = _fns(model)
    q = q0 + 0.3 * np.sin(np.arange(q0.size) + 1.0)
    assert fns.clipped_grad_sum(q, 1.0) is not None
    assert fns.gradient_route == _expected_route(pattern, routes_tried)
    fast = fns._c.grad_clipped["route"].fast
    assert not [n for n in fast.maker.fgraph.toposort() if isinstance(n.op, Blockwise)]
    for bound in (0.05, 1.0, 1e6):
        _assert_same(fns.clipped_grad_sum(q, bound), _loop_reference(fns, q, bound))
    # the batch of per-record gradients (generic) agrees with the loop too
    _assert_same(reference_clipped_sum(fns.per_record_grad(q), 0.5), _loop_reference(fns, q, 0.5))
    # chunking (a chunk size that does not divide n) and a subsample
    chunked, _ = _fns(model, chunk_size=7)
    _assert_same(chunked.clipped_grad_sum(q, 0.5), fns.clipped_grad_sum(q, 0.5))
    idx = np.array([3, 3, 0, 60, 17])
    sub = fns.clipped_grad_sum_subset(q, 0.5, idx)
    full = reference_clipped_sum(fns.per_record_grad(q)[idx], 0.5)
    _assert_same(sub, full)


@pytest.mark.parametrize("pattern", ["intercepts", "noncentred_data", "crossed"])
def test_non_finite_records_contribute_zero_and_count_as_clipped(pattern, routes_tried):
    D = _data()
    D["y"] = D["y"].copy()
    D["y"][[4, 30]] = 1e200  # (y - mu)^2 overflows: the gradient in log s is inf
    model = _model(pattern, D)
    fns, q0 = _fns(model, chunk_size=20)
    q = q0 + 0.1
    g, k = fns.clipped_grad_sum(q, 1.0)
    assert np.all(np.isfinite(g))
    assert fns.gradient_route == _expected_route(pattern, routes_tried)
    _assert_same((g, k), _loop_reference(fns, q, 1.0))
    ref_g, ref_k, _ = _loop_reference(fns, q, 1e6)
    assert ref_k == 2  # only the two non-finite records exceed a huge bound
    _assert_same(fns.clipped_grad_sum(q, 1e6), (ref_g, ref_k))


def test_glm_blocks_and_generic_routes_match_the_loop_with_non_finite_records():
    D = _data()
    y = D["y"].copy()
    y[7] = 1e200
    with pm.Model() as glm:
        beta = pm.Normal("beta", 0, 1, shape=2)
        s = pm.HalfNormal("s", 1)
        pm.StudentT("y", nu=4, mu=pt.dot(D["X"], beta), sigma=s, observed=D["y"])
    with pm.Model() as banana:
        t = pm.Normal("t", 0, 1, shape=2)
        pm.Normal("y", t[1] + t[0] ** 2, 1.0, observed=y)
    with pm.Model() as generic:  # overlapping reads of q: no blocks route
        t = pm.Normal("t", 0, 1, shape=3)
        pm.Normal("y", t[:2].sum() + t[1:].prod() ** 2, 1.0, observed=y)
    for model, route in ((glm, "GLM fast"), (banana, "blocks"), (generic, "generic")):
        fns, q0 = _fns(model, chunk_size=25)
        q = q0 + 0.2
        for bound in (0.1, 1e6):
            _assert_same(fns.clipped_grad_sum(q, bound), _loop_reference(fns, q, bound))
        assert fns.gradient_route == route


def test_a_route_that_does_not_apply_falls_back_to_the_next():
    """A gather of a source that is not a selection of q (a sum-to-zero construction): not
    the indexed route; the blocks route (dense per-record blocks) serves it."""
    D = _data()
    with pm.Model() as m:
        raw = pm.Normal("raw", 0, 1, shape=J - 1)
        a = pt.concatenate([raw, -raw.sum(keepdims=True)])
        pm.Normal("y", a[D["g"]], 1.0, observed=D["y"])
    fns, q0 = _fns(m)
    q = q0 + 0.2
    _assert_same(fns.clipped_grad_sum(q, 0.5), _loop_reference(fns, q, 0.5))
    assert fns.gradient_route == "blocks"


@pytest.mark.slow
def test_non_centred_deterministic_is_sampled_and_a_data_deterministic_still_refused():
    """Issue 16: ``pm.Deterministic("a", mu_a + sd_a * z, dims="group")`` reads no record
    data (the group dimension's length is a shared scalar): ``pymc_dp.sample`` samples it and
    stores it. A Deterministic that reads a record-length array is still refused."""
    D = _data()
    kw = dict(
        epsilon=2.0,
        delta=1e-5,
        draws=5,
        tune=0,
        chains=1,
        step_kwargs={"clip_bound": 3.0},
        random_seed=1,
        progressbar=False,
        compute_convergence_checks=False,
    )
    with pm.Model(coords={"group": range(J)}):
        mu_a = pm.Normal("mu_a", 0, 1)
        sd_a = pm.HalfNormal("sd_a", 1)
        z = pm.Normal("z", 0, 1, dims="group")
        a = pm.Deterministic("a", mu_a + sd_a * z, dims="group")
        pm.Normal("y", a[D["g"]], 1.0, observed=D["y"])
        idata = pymc_dp.sample(step=pymc_dp.DPPenaltyMetropolis, **kw)
    assert idata["posterior"]["a"].shape[-1] == J
    with pm.Model(coords={"group": range(J)}):
        mu_a = pm.Normal("mu_a", 0, 1)
        sd_a = pm.HalfNormal("sd_a", 1)
        z = pm.Normal("z", 0, 1, dims="group")
        a = pm.Deterministic("a", mu_a + sd_a * z, dims="group")
        pm.Deterministic("a_i", a[D["g"]])  # one value per record: reads the group index
        pm.Normal("y", a[D["g"]], 1.0, observed=D["y"])
        with pytest.raises(pymc_dp.ModelNotSupportedError, match="'a_i' depends on the data"):
            pymc_dp.sample(step=pymc_dp.DPPenaltyMetropolis, **kw)


def test_pure_c_mode_works_or_says_what_to_use_instead():
    """``mode="C"`` (the C linker without Python fallbacks): PyTensor 2.38 and 3.3 have no C
    code for an indexed increment of these functions; the error then names the modes that
    work. Where it compiles, the sums are the loop's."""
    D = _data()
    model = _model("intercepts", D)
    ip = model.initial_point()
    fns, _ = build_record_functions(model, model.value_vars, ip, compile_kwargs={"mode": "C"})
    q = np.concatenate([np.ravel(ip[v.name]) for v in model.value_vars]) + 0.2
    try:
        got = fns.clipped_grad_sum(q, 0.5)
    except NotImplementedError as err:
        assert "pure C linker" in str(err) and 'mode="CVM"' in str(err)
    else:
        _assert_same(got, _loop_reference(fns, q, 0.5))


@pytest.mark.slow
def test_hierarchical_dphmc_step_ships_to_spawned_workers():
    """PyMC ships a step to ``spawn``/``forkserver`` workers with cloudpickle (its models
    do not pickle with the standard library's pickle, and neither do its own steps): a
    DPHMC step on a hierarchical model round-trips after use, continues identically, and
    ``pm.sample(cores=2, mp_ctx="spawn")`` gives the draws of ``cores=1``."""
    import multiprocessing

    import cloudpickle

    D = _data()
    model = _model("intercepts", D)
    kw = dict(
        llr_clip_bound=1.0,
        grad_clip_bound=1.0,
        llr_noise_multiplier=1.0,
        grad_noise_multiplier=1.0,
        n_leapfrog=3,
        step_size=0.05,
    )
    with model:
        step = pymc_dp.DPHMC(rng=np.random.default_rng(5), **kw)
    point = model.initial_point()
    for _ in range(3):
        point, _ = step.step(point)
    assert step._fns.gradient_route == "sorted"
    clone = cloudpickle.loads(cloudpickle.dumps(step))
    p1, p2 = dict(point), dict(point)
    for _ in range(3):
        p1, _ = step.step(p1)
        p2, _ = clone.step(p2)
        np.testing.assert_array_equal(p1["a"], p2["a"])
    if "spawn" not in multiprocessing.get_all_start_methods():
        return
    runs = []
    for cores, ctx in ((1, None), (2, "spawn")):
        with model:
            s = pymc_dp.DPHMC(**kw)
            runs.append(
                pm.sample(
                    draws=5,
                    tune=0,
                    chains=2,
                    cores=cores,
                    mp_ctx=ctx,
                    step=s,
                    random_seed=7,
                    progressbar=False,
                    compute_convergence_checks=False,
                )
            )
    # Equal to rounding, not bit for bit: the sorted route's Numba loop is compiled with
    # fastmath's ``reassoc`` and ``contract`` (`pymc_dp.records.sorted_segments._FASTMATH`), so
    # a worker that compiles it afresh, or loads it from the disk cache, may sum in another
    # order or fuse another multiply-add than the parent did. Measured once in CI (PyTensor
    # 3.3.8, a clean clone's first run): 6 of 50 entries differed by at most 3.5e-18 (2e-16
    # relative). A step shipped with the wrong generator state, or seeded per worker, gives
    # draws that differ at the first entry by the proposal's scale, far beyond this tolerance.
    np.testing.assert_allclose(
        runs[0].posterior["a"].values, runs[1].posterior["a"].values, rtol=1e-9, atol=1e-12
    )
