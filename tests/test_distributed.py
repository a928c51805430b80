"""Records on a Dask cluster (pymc_dp.distributed): same draws as in memory, bad input, the
data-sharing scheme (Yildirim & Ermis 2019, Algorithm 2) and lost workers.

The tests run on real ``dask.distributed`` ``LocalCluster``s: in-process workers
(``processes=False``) except for the fault tests, which kill a worker process.
"""

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

N, PART = 1200, 300
RUN = dict(draws=12, tune=8, chains=2, progressbar=False, compute_convergence_checks=False)


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = np.clip(rng.normal(size=(n, 2)), -3, 3)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(X @ [1.0, -0.5])))).astype("int64")
    return X, y


def _model(X, y):
    with pm.Model() as m:
        Xd = pm.Data("X", X)
        b = pm.Normal("b", 0.0, 3.0, shape=2)
        pm.Bernoulli("y", logit_p=Xd @ b, observed=y)
    return m


def _records(client, X, y, chunk=PART, **kw):
    return DaskRecords(
        client,
        {"X": da.from_array(X, chunks=(chunk, 2)), "y": da.from_array(y, chunks=chunk)},
        **kw,
    )


@pytest.fixture(scope="module")
def client():
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


STEPS = [
    (pymc_dp.DPPenaltyMetropolis, {"clip_bound": 5.0}),
    (pymc_dp.DPHMC, {"llr_clip_bound": 5.0, "grad_clip_bound": 5.0, "n_leapfrog": 3}),
]


@pytest.mark.parametrize("step,kwargs", STEPS, ids=["penalty", "dphmc"])
def test_dask_draws_equal_the_in_memory_run_with_the_same_chunks(client, step, kwargs):
    X, y = _data()
    with _model(X, y):
        local = pymc_dp.sample(
            step,
            epsilon=5.0,
            delta=1e-5,
            step_kwargs={**kwargs, "chunk_size": PART},
            random_seed=7,
            **RUN,
        )
    # the model holds a 10-record stand-in; the records live on the cluster
    with _model(X[:10], y[:10]):
        remote = pymc_dp.sample(
            step,
            epsilon=5.0,
            delta=1e-5,
            step_kwargs=kwargs,
            records=_records(client, X, y),
            random_seed=7,
            **RUN,
        )
    np.testing.assert_array_equal(local.posterior["b"].values, remote.posterior["b"].values)
    a, b = pymc_dp.privacy_report(local), pymc_dp.privacy_report(remote)
    assert (a.epsilon, a.releases, a.iterations) == (b.epsilon, b.releases, b.iterations)
    assert b.owners == 0 and b.noise_variance_factor == 1
    assert "observed_data" not in remote.groups() and "constant_data" not in remote.groups()


def test_a_different_partitioning_gives_different_sums_only_by_rounding(client):
    """The partition sums are combined in partition order: a different chunking changes the
    sum by rounding only (the equality above is not an accident of one chunk)."""
    X, y = _data()
    with _model(X[:10], y[:10]) as m:
        s1 = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y, chunk=300)
        )
        s2 = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y, chunk=250)
        )
    with _model(X, y):
        s0 = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=1.0)
    q0, q1 = np.array([0.1, 0.2]), np.array([0.3, -0.1])
    r0 = s0._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)[0]
    r1 = s1._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)[0]
    r2 = s2._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)[0]
    assert r1 == pytest.approx(r0, rel=1e-12) and r2 == pytest.approx(r0, rel=1e-12)
    del m


def _poison(shape, dtype):
    """A dask array whose every read raises: errors must come before any data is read."""

    def boom(block_info=None):
        raise AssertionError("the records were read")

    return da.map_blocks(lambda x: boom(), da.zeros(shape, chunks=(PART,) + shape[1:]), dtype=dtype)


def test_bad_input_is_refused_before_any_data_is_read(client):
    X = _poison((N, 2), "float64")
    y = _poison((N,), "int64")
    with pytest.raises(ValueError, match="different numbers of rows"):
        DaskRecords(client, {"X": X, "y": _poison((N - 1,), "int64")})
    with pytest.raises(ValueError, match="partitions differently"):
        DaskRecords(client, {"X": X, "y": y.rechunk(400)})
    with pytest.raises(ValueError, match="rechunk"):
        DaskRecords(client, {"X": X.rechunk((PART, 1)), "y": y})
    with pytest.raises(TypeError, match="not a dask array"):
        DaskRecords(client, {"X": np.zeros((N, 2)), "y": y})
    with pytest.raises(TypeError, match="dict"):
        DaskRecords(client, [X, y])
    with pytest.raises(ValueError, match="owners"):
        DaskRecords(client, {"X": X, "y": y}, owners=[0, 1])
    Xs, ys = _data(10)
    with _model(Xs, ys):
        with pytest.raises(ValueError, match=r"\['Z'\] match no observed variable"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=5.0,
                noise_multiplier=1.0,
                records=DaskRecords(client, {"X": X, "y": y, "Z": X}),
            )
        with pytest.raises(ValueError, match="no array for it"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=5.0, noise_multiplier=1.0, records=DaskRecords(client, {"X": X})
            )
        with pytest.raises(ValueError, match="dtype"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=5.0,
                noise_multiplier=1.0,
                records=DaskRecords(client, {"X": X, "y": y.astype("float64")}),
            )
        with pytest.raises(ValueError, match="per-record values on the driver"):
            pymc_dp.sample(
                pymc_dp.DPSGLD,
                epsilon=1.0,
                delta=1e-5,
                step_kwargs={"clip_bound": 1.0, "sampling_rate": 0.1, "step_size": 1e-3},
                records=DaskRecords(client, {"X": X, "y": y}),
                **RUN,
            )
        with pytest.raises(ValueError, match="data-sharing"):
            pymc_dp.DPHMC(
                llr_clip_bound=1.0,
                grad_clip_bound=1.0,
                llr_noise_multiplier=1.0,
                grad_noise_multiplier=1.0,
                records=DaskRecords(client, {"X": X, "y": y}, owners="partition"),
            )
        with pytest.raises(ValueError, match="cores=2"):
            pymc_dp.sample(
                pymc_dp.DPPenaltyMetropolis,
                epsilon=1.0,
                delta=1e-5,
                step_kwargs={"clip_bound": 1.0},
                records=_records(client, *_data()),
                cores=2,
                **RUN,
            )
    closed = distributed.Client(client.cluster, set_as_default=False)
    closed.close()
    with pytest.raises(ValueError, match="not running"):
        DaskRecords(closed, {"X": X, "y": y})
