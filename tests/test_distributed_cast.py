"""DaskRecords casts integer records to the model's integer dtype, values outside its range
clipped to it without reading the data (PyMC stores an int64 ``pm.Data`` array as int32;
issue 27, the friction list)."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

distributed = pytest.importorskip(
    "distributed", reason="dask[distributed] is not installed (pip install pymc_dp[distributed])"
)
da = pytest.importorskip("dask.array", reason="dask[array] is not installed")

import pymc_dp  # noqa: E402
from pymc_dp.distributed import DaskRecords  # noqa: E402


def _model(g, y):
    with pm.Model() as model:
        gd = pm.Data("g", g)  # int64 numpy: PyMC stores it as int32
        z = pm.Normal("z", 0, 1, shape=4)
        pm.Normal("y", z[gd], 1.0, observed=y)
    return model


def test_int64_records_are_cast_to_the_models_int32():
    rng = np.random.default_rng(0)
    g = rng.integers(0, 4, 400).astype(np.int64)
    y = rng.normal(size=400)
    model = _model(g, y)
    assert model["g"].dtype == "int32" and g.dtype == np.int64
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as client:  # fmt: skip
        records = DaskRecords(
            client, {"g": da.from_array(g, chunks=200), "y": da.from_array(y, chunks=200)}
        )
        kw = dict(clip_bound=5.0, noise_multiplier=1.0, model=model)
        remote = pymc_dp.DPPenaltyMetropolis(records=records, **kw)
        local = pymc_dp.DPPenaltyMetropolis(chunk_size=200, **kw)
        q0, q1 = np.zeros(4), np.array([0.1, -0.2, 0.05, 0.3])
        np.testing.assert_allclose(
            remote._fns.clipped_loglik_ratio_sum(q1, q0, 5.0)[0],
            local._fns.clipped_loglik_ratio_sum(q1, q0, 5.0)[0],
            rtol=1e-12,
        )
        big = g.copy()
        big[7] = 2**40  # does not fit in int32: clipped to its range, decided without a read
        clipped = DaskRecords(
            client, {"g": da.from_array(big, chunks=200), "y": da.from_array(y, chunks=200)}
        )
        with pm.Model() as counts:  # the integer column as a covariate (not an index)
            gd = pm.Data("g", g)
            b = pm.Normal("b", 0, 1)
            pm.Normal("y", b * gd, 1.0, observed=y)
        kw["model"] = counts
        pymc_dp.DPPenaltyMetropolis(records=clipped, **kw)
        stored = clipped._arrays["g"].compute()
        assert stored.dtype == np.int32 and stored[7] == np.iinfo(np.int32).max
        np.testing.assert_array_equal(np.delete(stored, 7), np.delete(g, 7))
