"""A DP step in a ``CompoundStep`` evaluates its per-record functions at the *current* values
of the free variables it does not sample (issue 28, twelfth session).

PyMC hands a step the other free variables as PyTensor shared variables
(``ArrayStepShared``), set on the driver before every step. A function pickled to a Dask
worker carries its own copies of them: unless the driver's values travel with every call,
the workers would evaluate the likelihood at the values the other variables had when the
function was shipped. The same holds for the copy of a step that PyMC pickles into each
worker process of an in-memory ``cores=2`` run. The tests compare the sums and the draws with
an in-memory run in this process, where the functions read the step's own shared variables.
"""

from __future__ import annotations

import contextlib
import warnings

import cloudpickle
import numpy as np
import pymc as pm
import pytest

import pymc_dp

N, PART = 1200, 300
RNG = np.random.default_rng(0)
NU = 5.0
#: a Student-t likelihood: its per-record log-likelihood is costly (a log per record), so the
#: in-memory DPHMC keeps it and fuses its ratio pass like the cluster does (the same compiled
#: functions on both sides: the draws are equal to the bit)
Y = 1.0 + 2.0 * RNG.standard_t(NU, size=N)
HMC = dict(
    llr_clip_bound=5.0, grad_clip_bound=5.0, n_leapfrog=3, step_size=0.02,
    llr_noise_multiplier=0.01, grad_noise_multiplier=0.01,
)  # fmt: skip


def _model(y):
    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 5.0)
        sigma = pm.HalfNormal("sigma", 5.0)
        pm.StudentT("y", nu=NU, mu=mu, sigma=sigma, observed=y)
    return m


def _set_sigma(step, value: float) -> None:
    """What PyMC's ``ArrayStepShared.step`` does before the step: the driver's value of the
    variable another step samples (here sigma, in its log-transformed space)."""
    step.shared["sigma_log__"].set_value(np.float64(np.log(value)))


def _sums(fns, q0, q1):
    """Released sums of every protocol path at fixed public arguments (the counts dropped)."""
    from pymc_dp.kernels.subsampled_penalty import clipped_moments, merge_moments

    idx = np.random.default_rng(5).integers(0, N, size=300)
    out = {
        "llr": fns.clipped_loglik_ratio_sum(q1, q0, 0.3)[0],
        "grad": fns.clipped_grad_sum(q1, 0.4)[0],
        "ratio_rows": fns.ratio_subset_terms(
            q1, q0, idx, clipped_moments, merge_moments, params=(0.05,)
        )[0],
    }
    if fns.fusable:  # the kept log-likelihoods (on the workers) and the fused pass
        g, _, s, _, _ = fns.clipped_grad_and_ratio_sum_kept(q1, 0.4, fns.loglik_chunks(q0), 0.3)
        out["fused"] = (g, s)
    return out


def _flat(v):
    if isinstance(v, tuple | list):
        return np.concatenate([_flat(x) for x in v]) if len(v) else np.zeros(0)
    return np.ravel(np.asarray(v, dtype=float))


# -- in memory: a step pickled into a worker process (pm.sample(cores=2)) -----------------------


def test_a_pickled_step_reads_the_other_variables_it_is_given():
    """PyMC pickles the step into every worker process of a ``cores > 1`` run (cloudpickle
    with spawn / forkserver) and sets the copy's shared variables there: the copy's functions
    must read those, not values frozen at pickling time."""
    with _model(Y):
        step = pymc_dp.DPHMC([pm.modelcontext(None)["mu"]], **HMC)
    q0, q1 = np.array([0.8]), np.array([1.1])
    _set_sigma(step, 1.5)
    copy = cloudpickle.loads(cloudpickle.dumps(step))
    _set_sigma(step, 2.5)
    _set_sigma(copy, 2.5)
    want, got = _sums(step._fns, q0, q1), _sums(copy._fns, q0, q1)
    _set_sigma(step, 1.5)
    before = _sums(step._fns, q0, q1)
    for key in want:
        np.testing.assert_array_equal(_flat(got[key]), _flat(want[key]), err_msg=key)
        assert not np.array_equal(_flat(before[key]), _flat(want[key])), key


@pytest.mark.slow
def test_compound_step_in_worker_processes_draws_equal_the_sequential_run():
    """``cores=2`` against ``cores=1``, the same seed: the same draws (tune=0: PyMC 5's
    sequential sampler does not set ``tune`` on the methods of a ``CompoundStep`` for its
    second chain, so tuned runs differ there for reasons unrelated to this test)."""

    def run(cores):
        with _model(Y) as m, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps = [
                pymc_dp.DPHMC([m["mu"]], **HMC),
                pymc_dp.DPPenaltyMetropolis([m["sigma"]], clip_bound=5.0, noise_multiplier=0.01),
            ]
            return pm.sample(
                draws=40, tune=0, chains=2, cores=cores, step=steps, random_seed=3,
                progressbar=False, compute_convergence_checks=False,
            )  # fmt: skip

    a, b = run(1), run(2)
    for v in ("mu", "sigma"):
        np.testing.assert_array_equal(a.posterior[v].values, b.posterior[v].values, err_msg=v)
    assert np.ptp(a.posterior["sigma"].values) > 0  # sigma moved: the test can fail


# -- on a Dask cluster ---------------------------------------------------------------------------

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")


@contextlib.contextmanager
def _cluster():
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def client():
    with _cluster() as c:
        yield c


def _records(client, owners=None):
    from pymc_dp.distributed import DaskRecords

    kw = {} if owners is None else {"owners": owners, "owner_seeds": [1, 2, 3, 4]}
    return DaskRecords(client, {"y": da.from_array(Y, chunks=PART)}, **kw)


def test_dask_workers_evaluate_at_the_current_value_of_the_other_variable(client):
    """The driver changes sigma (as the other step of a CompoundStep does) after the
    functions were shipped: every release path (a map, the minibatch rows, the kept
    log-likelihoods with the fused pass, the owners' tasks of the data-sharing mode) gives
    the in-memory number at the new sigma, not the shipped one."""
    with _model(Y) as m:
        local = pymc_dp.DPHMC([m["mu"]], chunk_size=PART, **HMC)
    with _model(Y[:10]) as m:
        remote = pymc_dp.DPHMC([m["mu"]], records=_records(client), **HMC)
    with _model(Y[:10]) as m:
        owned = pymc_dp.DPPenaltyMetropolis(
            [m["mu"]], records=_records(client, owners="partition"), clip_bound=5.0,
            noise_multiplier=0.01,
        )  # fmt: skip
    q0, q1 = np.array([0.8]), np.array([1.1])
    seen = []
    for sigma in (1.5, 2.5, 1.5):
        for s in (local, remote, owned):
            _set_sigma(s, sigma)
        want, got = _sums(local._fns, q0, q1), _sums(remote._fns, q0, q1)
        assert set(want) == set(got) and "fused" in got
        for key in want:
            np.testing.assert_array_equal(_flat(got[key]), _flat(want[key]), err_msg=key)
        # the data-sharing mode's owner tasks, without noise: the exact clipped sum
        shared = owned._fns.shared_clipped_loglik_ratio_sum(q1, q0, 0.3, 0.0)
        assert shared == pytest.approx(want["llr"], rel=1e-12)
        seen.append(want["llr"])
    assert seen[0] != seen[1] and seen[0] == seen[2]  # the sums depend on sigma


def test_compound_step_on_dask_draws_equal_the_in_memory_run(client):
    """DPHMC on mu and DPPenaltyMetropolis on sigma, both reading the records on the cluster,
    against the same CompoundStep in memory with the same partitions and seed: the same draws
    (before the workers followed the driver's values, mu's draws differed by up to 0.20). The
    in-memory run itself targets the posterior (clipping inactive, tiny noise): its means are
    checked against a grid posterior."""

    def run(records):
        y = Y if records is None else Y[:10]
        chunk = PART if records is None else None
        with _model(y) as m, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps = [
                pymc_dp.DPHMC([m["mu"]], chunk_size=chunk, records=records, **HMC),
                pymc_dp.DPPenaltyMetropolis(
                    [m["sigma"]], chunk_size=chunk, records=records, clip_bound=5.0,
                    noise_multiplier=0.01,
                ),
            ]  # fmt: skip
            return pm.sample(
                draws=400, tune=100, chains=1, cores=1, step=steps, random_seed=3,
                initvals={"mu": 1.0, "sigma": 2.0}, progressbar=False,
                compute_convergence_checks=False,
            )  # fmt: skip

    local, remote = run(None), run(_records(client))
    for v in ("mu", "sigma"):
        np.testing.assert_array_equal(
            local.posterior[v].values, remote.posterior[v].values, err_msg=v
        )
    # the grid posterior of (mu, sigma) (priors N(0, 5), HalfNormal(5))
    import arviz as az
    from scipy import stats

    mu = np.linspace(0.5, 1.5, 101)[:, None]
    sd = np.linspace(1.5, 2.6, 111)[None, :]
    ll = np.array([stats.t.logpdf(Y[:, None], NU, m, sd[0]).sum(axis=0) for m in mu[:, 0]])
    lp = ll - mu**2 / 50 - sd**2 / 50
    w = np.exp(lp - lp.max())
    w /= w.sum()
    edges = w[[0, -1], :].sum() + w[:, [0, -1]].sum()
    assert edges < 1e-6  # the grid holds the posterior

    for v, grid in (("mu", mu), ("sigma", sd)):
        draws = local.posterior[v].values
        truth = float((w * grid).sum())
        mcse = float(az.mcse(local, var_names=[v])[v])
        assert np.ptp(draws) > 0
        assert abs(draws.mean() - truth) < 4 * mcse, (v, draws.mean(), truth, mcse)
