"""The sorted route (issue 28): records sorted by group once per chunk, one loop per group.

Held to a loop over the records one at a time (each record's gradient clipped alone) for
every index pattern it serves, with the records in group order and shuffled (the clipped
sum does not depend on the order; only the summation order changes, so the two agree to
rounding), with non-finite records, with chunking, in another PyTensor mode, and to the
indexed route it replaces. The runs of the loop (one per cell of the gathers' indices)
are checked per pattern.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

from pymc_dp.records import build_record_functions
from pymc_dp.records.segment import build_segment_route
from pymc_dp.records.sorted_segments import SortedSegmentSum, build_sorted_route

N, J, H, S = 83, 6, 3, 2  # records, groups, crossed levels, states


def _data(seed: int = 1, order: str = "shuffled") -> dict:
    rng = np.random.default_rng(seed)
    D = {
        "g": rng.integers(0, J, N),
        "h": rng.integers(0, H, N),
        "x": rng.uniform(-1, 1, N),
        "y": rng.normal(size=N),
    }
    D["y"][[5, 40]] = 1e200  # (y - mu)^2 overflows: the gradient in log s is not finite
    if order == "sorted":  # the same records in group order
        perm = np.argsort(D["g"], kind="stable")
        D = {k: v[perm] for k, v in D.items()}
    D["state_of"] = np.array([0, 1, 1, 0, 1, 0])
    return D


def _model(pattern: str, D: dict) -> pm.Model:
    g, h, x, y = D["g"], D["h"], D["x"], D["y"]
    with pm.Model() as m:
        s = pm.HalfNormal("s", 1.0)
        if pattern == "intercepts":
            mu = pm.Normal("mu", 0, 1)
            a = pm.Normal("a", mu, 1.0, shape=J)
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
        elif pattern == "noncentred":
            mu = pm.Normal("mu", 0, 1)
            sd = pm.HalfNormal("sd", 1)
            z = pm.Normal("z", 0, 1, shape=J)
            gi = pm.Data("g", g)
            pm.Normal("y", (mu + sd * z)[gi] + 0.5 * x, s, observed=y)
        elif pattern == "same_source":
            a = pm.Normal("a", 0, 1, shape=J)
            pm.Normal("y", a[g] - 0.5 * a[h], s, observed=y)
        elif pattern == "negative_index":  # numpy semantics: -1 is the last group
            a = pm.Normal("a", 0, 1, shape=J)
            g_neg = np.where(np.arange(N) % 2 == 1, g - J, g)
            pm.Normal("y", a[g_neg] + 2.0 * a[g], s, observed=y)
    return m


#: Per pattern: the gathers of the likelihood (the records are sorted by all their indices).
GATHERS = {
    "intercepts": 1,
    "slopes": 2,
    "crossed": 2,
    "nested": 2,
    "noncentred": 1,
    "same_source": 2,
    "negative_index": 2,
}


def _fns(model, **kw):
    ip = model.initial_point()
    fns, _ = build_record_functions(model, model.value_vars, ip, **kw)
    q0 = np.concatenate([np.ravel(ip[v.name]) for v in model.value_vars])
    return fns, q0 + 0.3 * np.sin(np.arange(q0.size) + 1.0)


def _loop_reference(fns, q, bound):
    """Clip every record's gradient alone, in a Python loop over the records."""
    total, count = np.zeros(fns.ndim), 0
    arrays = fns._records._arrays
    for i in range(fns.n_records):
        g = np.asarray(fns._c.grad_chunk(q, *[a[i : i + 1] for a in arrays]))[0]
        with np.errstate(over="ignore", invalid="ignore"):
            norm = np.sqrt(np.sum(g * g))
        if not np.isfinite(norm):
            count += 1
            continue
        count += int(norm > bound)
        total += g * min(1.0, bound / norm)
    return total, count


def _assert_same(a, b):
    assert a[1] == b[1]
    np.testing.assert_allclose(a[0], b[0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("pattern", list(GATHERS))
def test_sorted_route_matches_a_per_record_loop_in_both_orders(pattern):
    got = {}
    for order in ("sorted", "shuffled"):
        fns, q = _fns(_model(pattern, _data(order=order)))
        assert fns.clipped_grad_sum(q, 1.0) is not None
        assert fns.gradient_route == "sorted"
        route = fns._c.grad_clipped["route"]
        (op,) = [
            n.op for n in route.fast.maker.fgraph.toposort() if isinstance(n.op, SortedSegmentSum)
        ]
        assert len(op.layout.gathers) == GATHERS[pattern]
        # every run is one cell of the gathers' indices, and no cell is split over two runs
        offs, *runs = route.prepared(list(fns._records._arrays))[: 1 + GATHERS[pattern]]
        assert offs[0] == 0 and offs[-1] == N and np.all(np.diff(offs) > 0)
        assert len(set(zip(*runs, strict=True))) == offs.size - 1
        for bound in (0.05, 1.0, 1e6):
            got[order, bound] = fns.clipped_grad_sum(q, bound)
            ref = _loop_reference(fns, q, bound)
            _assert_same(got[order, bound], ref)
            assert ref[1] >= 2  # the two non-finite records count as clipped
            assert np.all(np.isfinite(ref[0]))
        # chunks that do not divide n (each chunk sorted on its own)
        chunked, _ = _fns(_model(pattern, _data(order=order)), chunk_size=13)
        _assert_same(chunked.clipped_grad_sum(q, 0.5), _loop_reference(fns, q, 0.5))
        # a subsample with a repeated record
        idx = np.array([3, 3, 0, N - 1, 17, 40])
        sub = fns.clipped_grad_sum_subset(q, 0.5, idx)
        total, count = np.zeros(fns.ndim), 0
        for i in idx:
            with np.errstate(over="ignore", invalid="ignore"):
                g = np.asarray(fns._c.grad_chunk(q, *[a[i : i + 1] for a in fns._records._arrays]))
                norm = float(np.sqrt(np.sum(g * g)))
            if np.isfinite(norm):
                total += g[0] * min(1.0, 0.5 / norm)
            count += int(not norm <= 0.5)
        _assert_same(sub, (total, count))
    for bound in (0.05, 1.0, 1e6):  # the order of the records changes the sums by rounding
        _assert_same(got["sorted", bound], got["shuffled", bound])


@pytest.mark.parametrize("pattern", ["slopes", "crossed"])
def test_sorted_route_equals_the_indexed_route_and_runs_in_another_mode(pattern):
    fns, q = _fns(_model(pattern, _data()))
    fns._ensure_grad()
    chunk = list(fns._records._arrays)
    sorted_route = build_sorted_route(fns._graphs)
    indexed = build_segment_route(fns._graphs)
    cvm = build_sorted_route(fns._graphs, {"mode": "CVM"})  # the op's perform
    for bound in (0.1, 1e6):
        want = indexed(q, bound, indexed.prepared(chunk), chunk)
        _assert_same(sorted_route(q, bound, sorted_route.prepared(chunk), chunk), want)
        _assert_same(cvm(q, bound, cvm.prepared(chunk), chunk), want)


def test_models_the_sorted_route_does_not_serve_take_another_route():
    """A dot product over a record's covariates (a GLM with a random intercept: the GLM
    route) and a matrix-valued group parameter (the indexed route): not elementwise in one
    number per record and group."""
    rng = np.random.default_rng(3)
    g, X, y = rng.integers(0, J, N), rng.normal(size=(N, 2)), rng.normal(size=N)
    with pm.Model() as glm:
        beta = pm.Normal("beta", 0, 1, shape=2)
        a = pm.Normal("a", 0, 1, shape=J)
        pm.Normal("y", pm.math.dot(X, beta) + a[g], 1.0, observed=y)
    with pm.Model() as matrix:
        B = pm.Normal("B", 0, 1, shape=(J, 2))
        pm.Normal("y", (B[g] * X).sum(axis=-1), 1.0, observed=y)
    for model, route in ((glm, "GLM fast"), (matrix, "indexed")):
        fns, q = _fns(model)
        assert build_sorted_route(fns._graphs) is None
        _assert_same(fns.clipped_grad_sum(q, 0.5), _loop_reference(fns, q, 0.5))
        assert fns.gradient_route == route


def test_a_group_index_out_of_range_is_an_error_naming_no_value():
    from pymc_dp.records.errors import RecordComputationError

    fns, q = _fns(_model("intercepts", _data()))
    fns._ensure_grad()
    assert fns.gradient_route == "sorted"
    bad = list(fns._records._arrays)
    k = [i for i, a in enumerate(bad) if a.dtype.kind == "i"][0]
    bad[k] = bad[k].copy()
    bad[k][7] = J  # one past the last group
    fns._records._arrays = bad
    fns._records._prepared.clear()
    with pytest.raises(RecordComputationError, match="IndexError") as info:
        fns.clipped_grad_sum(q, 1.0)
    assert str(J) not in str(info.value).replace("IndexError", "")


def test_the_loop_nest_is_cached_on_disk_under_a_key_of_its_structure(monkeypatch):
    """Issue 28: the generated loop nest gets a PyTensor Numba cache key, a hash of its
    structure (the composite and the layout): different for different models, the same for
    the same model on other data (no record value enters it)."""
    from pymc_dp.records import sorted_segments

    def key_of(model):
        monkeypatch.setattr(sorted_segments, "_DRIVERS", {})
        fns, _ = _fns(model)
        fns._ensure_grad()
        assert fns.gradient_route == "sorted"
        keys = {k for _, k in sorted_segments._DRIVERS.values()}
        assert len(keys) == 1
        return keys.pop()

    keys = {p: key_of(_model(p, _data())) for p in ("intercepts", "slopes", "crossed")}
    assert all(isinstance(k, str) and len(k) == 64 for k in keys.values()), keys
    assert len(set(keys.values())) == 3
    assert key_of(_model("intercepts", _data(seed=7, order="sorted"))) == keys["intercepts"]


_CACHED_RUN = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_sorted_route import _data, _fns, _model
fns, q = _fns(_model("slopes", _data()))
g, k = fns.clipped_grad_sum(q, 0.5)
assert fns.gradient_route == "sorted"
print(repr((g.tolist(), int(k))))
"""


def test_a_process_that_loads_the_cached_loop_nest_gets_the_same_sums():
    """Two fresh processes (the second loads the loop nest from PyTensor's disk cache when
    the first wrote it) give the clipped sum of the per-record loop."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = _CACHED_RUN.format(tests=here)
    outs = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=here
        )
        outs.append(eval(run.stdout.strip().splitlines()[-1]))  # noqa: S307 - our own output
    fns, q = _fns(_model("slopes", _data()))
    fns._ensure_grad()
    want = _loop_reference(fns, q, 0.5)
    for g, k in outs:
        _assert_same((np.array(g), k), want)
