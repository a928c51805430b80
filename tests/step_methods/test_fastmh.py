"""DPFastMH: exactness, data access, privacy accounting, reproducibility, pickling, errors."""

from __future__ import annotations

import math
import warnings

import cloudpickle
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import assert_matches_distribution, normal_mean_model, posterior_array
from scipy import special, stats

import pymc_dp
from pymc_dp.accounting import ApproxDPEvent, PrivacyLedger, gaussian_delta
from pymc_dp.kernels import fastmh as K

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)
# Small test data sets: the minibatch is larger than n, which the step points out.
pytestmark = pytest.mark.filterwarnings("ignore:DPFastMH. the expected minibatch:UserWarning")


def _no_clipping(idata) -> None:
    """The exactness tests need clipping inactive: check it (non-private diagnostic)."""
    assert np.nanmax(idata["sample_stats"]["clip_fraction_NONPRIVATE"].values) == 0.0


# -- exactness (clipping inactive, noise on) ----------------------------------------------------


@pytest.mark.slow
def test_exact_normal_mean_both_branches():
    """Conjugate normal model; minibatch and full-batch branches both taken, noise on both."""
    model, mean, sd = normal_mean_model(n=50, d=1)
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=5.0,
            max_step=0.5,
            lam=3000.0,
            max_batch=3090,
            noise_multiplier=(20.0, 0.3),
            iter_delta=1e-6,
            proposal_scale=0.3,
            nonprivate_diagnostics=True,
        )
        idata = pm.sample(3000, tune=500, chains=4, cores=1, step=step, random_seed=11, **SAMPLE)
    _no_clipping(idata)
    st = idata["sample_stats"]
    full = np.asarray(st["full_batch"].values, dtype=float)
    assert 0.1 < full.mean() < 0.9  # both branches are exercised
    noise = np.asarray(st["noise_std"].values)
    assert noise[full == 0].mean() > 0.3 and noise[full == 1].mean() > 0.3  # noise really on
    assert_matches_distribution(
        posterior_array(idata, "theta")[..., 0], stats.norm(mean[0], sd[0]), label="theta"
    )


class _GridMarginal:
    """A 1-D marginal from a midpoint-rule grid, with the interface the checks need."""

    def __init__(self, grid: np.ndarray, weights: np.ndarray) -> None:
        w = weights / weights.sum()
        h = grid[1] - grid[0]
        self._edges = np.append(grid - h / 2, grid[-1] + h / 2)
        self._cdf = np.append(0.0, np.cumsum(w))
        self._mean = float(np.sum(grid * w))
        self._std = float(np.sqrt(np.sum((grid - self._mean) ** 2 * w) + h * h / 12))

    def mean(self) -> float:
        return self._mean

    def std(self) -> float:
        return self._std

    def cdf(self, x):
        return np.interp(x, self._edges, self._cdf)


def _mixture_model(n: int = 50, seed: int = 0):
    """The paper's truncated two-component mixture (Sec. 6.1, App. E.1) at small n.

    x_i ~ 1/2 N(theta1, 2) + 1/2 N(theta1 + theta2, 2), truncated to [-3, 3], theta = (0, 1);
    prior N(0, 5^2) per coordinate (the paper's flat prior gives an improper posterior: the
    likelihood does not vanish as theta2 -> infinity). Returns the model, the data and the
    exact marginals on a fine grid.
    """
    rng = np.random.default_rng(seed)
    comp = rng.integers(2, size=4 * n)
    x = rng.normal(np.where(comp == 0, 0.0, 1.0), np.sqrt(2.0))
    x = x[np.abs(x) <= 3.0][:n]
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 5.0, shape=2)
        # pm.Data: with a numpy constant, PyTensor 3 (PyMC 6) constant-folds the observed
        # SpecifyShape(n) while pymc_dp.records rewrites the one-record graph, and fails.
        pm.NormalMixture(
            "x",
            w=[0.5, 0.5],
            mu=pt.stack([theta[0], theta[0] + theta[1]]),
            sigma=np.sqrt(2.0),
            observed=pm.Data("x_obs", x),
        )
    g1, g2 = np.linspace(-4.0, 5.0, 451), np.linspace(-6.0, 6.0, 601)
    t1, t2 = np.meshgrid(g1, g2, indexing="ij")
    lp = -(t1**2 + t2**2) / (2 * 25.0)
    for xi in x:
        lp += np.logaddexp(-((xi - t1) ** 2) / 4.0, -((xi - t1 - t2) ** 2) / 4.0)
    p = np.exp(lp - lp.max())
    return model, x, (_GridMarginal(g1, p.sum(axis=1)), _GridMarginal(g2, p.sum(axis=0)))


@pytest.mark.slow
def test_exact_truncated_mixture_against_grid_posterior():
    model, _, marginals = _mixture_model()
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=4.0,
            max_step=1.0,
            lam=3000.0,
            max_batch=10**8,
            noise_multiplier=(10.0, 1.0),
            iter_delta=1e-6,
            proposal_scale=0.3,
            nonprivate_diagnostics=True,
        )
        idata = pm.sample(2500, tune=500, chains=4, cores=1, step=step, random_seed=3, **SAMPLE)
    _no_clipping(idata)
    st = idata["sample_stats"]
    assert not np.any(st["full_batch"].values)
    assert np.mean(st["noise_std"].values) > 0.5
    draws = posterior_array(idata, "theta")
    for k in range(2):
        assert_matches_distribution(draws[..., k], marginals[k], label=f"theta{k}")


def _exact_acceptance(r, lam, max_batch, branching, smax=40):
    """Exact acceptance probability of one noise-free move on a 2-state space.

    c_i = 1, M = 1, uniform sampling. "paper": enumerate the (index, kept) outcomes of the
    B < K draws. "independent": the minibatch is untruncated, so the kept counts are
    independent Poisson(rate / n * keep_i) (Poisson thinning); sum over them.
    """
    n = len(r)
    C, M = float(n), 1.0
    rate = lam + C * M
    keep = (lam + C / 2 * (M - r)) / (lam + C * M)
    terms = 2 * np.arctanh(C * r / (2 * lam + C * M))
    p_full = stats.poisson.sf(max_batch - 1, rate)
    full = p_full * min(1.0, math.exp(r.sum()))
    if branching == "independent":
        s = np.arange(smax)
        grids = np.meshgrid(*[s] * n, indexing="ij")
        ell = sum(g * t for g, t in zip(grids, terms, strict=True))
        weight = np.prod(
            [stats.poisson.pmf(g, rate / n * kp) for g, kp in zip(grids, keep, strict=True)],
            axis=0,
        )
        return (1 - p_full) * float(np.sum(weight * np.minimum(1.0, np.exp(ell)))) + full
    probs = np.concatenate([keep / n, (1 - keep) / n])
    vals = np.concatenate([terms, np.zeros(n)])
    total, dist = 0.0, {0.0: 1.0}
    for b in range(max_batch):
        if b > 0:
            new = {}
            for acc, pr in dist.items():
                for pv, v in zip(probs, vals, strict=True):
                    key = round(acc + v, 12)
                    new[key] = new.get(key, 0.0) + pr * pv
            dist = new
        ev = sum(pr * min(1.0, math.exp(acc)) for acc, pr in dist.items())
        total += stats.poisson.pmf(b, rate) * ev
    return total + full


@pytest.mark.slow
def test_branching_rules_detailed_balance_two_states():
    """Algorithm 2's shared B breaks detailed balance; the independent branch draw does not.

    States 0 and 1, proposal flips the state (M = 1), three records with log-likelihood
    differences r (state 0 -> 1), flat prior: pi(1) / pi(0) = e^{sum r}. The kernel's acceptance
    rates match the exact enumeration for both rules, and the enumeration shows
    pi(0) a(0->1) = pi(1) a(1->0) for "independent" but not for "paper".
    """
    r = np.array([0.8, -0.3, 0.5])
    lam, max_batch, n_rep = 1.0, 5, 6000
    rng = np.random.default_rng(0)
    sampler = K.IndexSampler(1.0, 3)
    for branching in ("independent", "paper"):
        settings = K.FastMHSettings(
            c=1.0,
            C=3.0,
            c_max=1.0,
            lam=lam,
            max_batch=max_batch,
            branching=branching,
            z_minibatch=0.0,
            z_fullbatch=0.0,
        )
        exact = {}
        for sign in (1.0, -1.0):
            rr = sign * r
            exact[sign] = _exact_acceptance(rr, lam, max_batch, branching)
            hits = sum(
                K.fastmh_transition(
                    rng,
                    settings,
                    sampler,
                    step_norm=1.0,
                    log_prior_ratio=0.0,
                    log_proposal_ratio=0.0,
                    minibatch_ratios=lambda idx, rr=rr: rr[idx],
                    fullbatch_clipped_sum=lambda m, rr=rr: (float(np.clip(rr, -m, m).sum()), 0),
                    n_records=3,
                ).accepted
                for _ in range(n_rep)
            )
            se = math.sqrt(exact[sign] * (1 - exact[sign]) / n_rep)
            assert abs(hits / n_rep - exact[sign]) < 4.5 * se, (branching, sign)
        balance = exact[1.0] / (math.exp(r.sum()) * exact[-1.0]) - 1.0
        if branching == "independent":
            assert abs(balance) < 1e-9
        else:
            assert abs(balance) > 0.05  # the paper's rule: a 15 % violation at these settings


# -- kernel: Lemma 1 and the coupling argument ------------------------------------------------


def test_keep_probability_and_estimator_bounds():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = 7
        c = rng.uniform(0.1, 3.0, n)
        C, lam, M = c.sum(), rng.uniform(0.1, 50.0), rng.uniform(1e-4, 3.0)
        r = rng.uniform(-1.0, 1.0, n) * c * M
        r[0], r[1] = c[0] * M, -c[1] * M  # the extremes
        p = K.keep_probability(r, c, C, lam, M)
        assert np.all(p >= lam / (lam + C * M) - 1e-12) and np.all(p <= 1 + 1e-12)
        half = K.minibatch_sensitivity(C, lam, M) / 2
        for i in range(n):
            term = K.tuna_log_ratio(r[i : i + 1], c[i], C, lam, M)
            assert abs(term) <= half * (1 + 1e-12)
        assert K.fullbatch_sensitivity(c.max(), M) == pytest.approx(2 * c.max() * M)


def _coupled_run(r, seed, settings, c, M, drawn, kept) -> float:
    """One noise-free minibatch decision with a fixed seed; returns ell (log acceptance)."""

    def ratios(idx):
        drawn.append(idx.copy())
        return r[idx]

    info = K.fastmh_transition(
        np.random.default_rng(seed),
        settings,
        K.IndexSampler(c, c.size),
        step_norm=M,
        log_prior_ratio=0.0,
        log_proposal_ratio=0.0,
        minibatch_ratios=ratios,
        fullbatch_clipped_sum=lambda m: (0.0, 0),
        n_records=c.size,
    )
    kept.append(info.kept)
    return info.log_accept


def test_coupled_sensitivity_with_data_dependent_thinning():
    """Neighbours with coupled randomness: ell moves by at most k * Delta(l_1) (Lemma 1).

    The changed record can be kept under D and dropped under D'; that case must occur here.
    """
    rng = np.random.default_rng(2)
    flipped = 0
    for _ in range(400):
        n = 4
        c = rng.uniform(0.5, 2.0, n)
        C, lam, M = c.sum(), rng.uniform(0.2, 5.0), rng.uniform(0.05, 2.0)
        r = rng.uniform(-1.0, 1.0, n) * c * M
        r2 = r.copy()
        j = int(rng.integers(n))
        r[j], r2[j] = -c[j] * M, c[j] * M  # D: least likely kept; D': always kept
        seed = int(rng.integers(2**31))
        settings = K.FastMHSettings(
            c=c,
            C=C,
            c_max=c.max(),
            lam=lam,
            max_batch=10**9,
            branching="independent",
            z_minibatch=0.0,
            z_fullbatch=0.0,
        )
        drawn, kept = [], []

        la, lb = (_coupled_run(rr, seed, settings, c, M, drawn, kept) for rr in (r, r2))
        if not drawn:
            assert la == lb == 0.0
            continue
        np.testing.assert_array_equal(drawn[0], drawn[1])  # same draws (coupled)
        k = int(np.count_nonzero(drawn[0] == j))
        assert abs(la - lb) <= k * K.minibatch_sensitivity(C, lam, M) * (1 + 1e-12) + 1e-12
        flipped += kept[0] != kept[1]
    assert flipped > 20


def test_index_sampler_probabilities():
    rng = np.random.default_rng(3)
    c = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    idx = K.IndexSampler(c, 5)(rng, 200_000)
    freq = np.bincount(idx, minlength=5)
    assert stats.chisquare(freq, 200_000 * c / c.sum()).pvalue > 1e-3
    uni = K.IndexSampler(2.0, 7)(rng, 70_000)
    assert uni.min() >= 0 and uni.max() == 6
    assert stats.chisquare(np.bincount(uni, minlength=7)).pvalue > 1e-3


def test_truncated_proposal_is_symmetric_and_bounded():
    rng = np.random.default_rng(4)
    steps = np.array([K.truncate_step(rng.normal(size=3) * 2.0, 1.5) for _ in range(4000)])
    assert np.linalg.norm(steps, axis=1).max() <= 1.5 * (1 + 1e-12)
    np.testing.assert_allclose(K.truncate_step(-steps[0], 1.5), -K.truncate_step(steps[0], 1.5))
    assert abs(steps.mean(axis=0)).max() < 0.06  # symmetric law: mean 0


# -- kernel: privacy bounds -----------------------------------------------------------------


def test_vectorised_gaussian_delta_matches_accounting():
    mus = np.array([0.0, 1e-8, 1e-3, 0.3, 2.0, 50.0, 1e4])
    for eps in (0.0, 0.1, 1.0, 7.0, 60.0):
        got = K._gaussian_delta_many(mus, eps)
        want = [gaussian_delta(m, eps) for m in mus]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize(
    "law",
    [K.Multiplicity.poisson(0.01), K.Multiplicity.poisson(3.0), K.Multiplicity.binomial(59, 2e-5)],
    ids=["poisson-small", "poisson-large", "binomial"],
)
def test_minibatch_calibration_is_safe_and_tight(law):
    for eps, delta in ((0.05, 1e-5), (1.0, 1e-8), (5.0, 1e-3)):
        mu = K.minibatch_mu(law, eps, delta)
        assert K.minibatch_delta(law, mu, eps) <= delta
        assert K.minibatch_delta(law, mu * 1.001, eps) > delta * 0.999
        assert K.minibatch_epsilon(law, mu, delta) <= eps * (1 + 1e-9)


def test_amplification_bound_dominates_numerical_divergence():
    """Hockey-stick divergence of a sampled-with-replacement Gaussian, computed numerically,
    never exceeds the bound used by the step (Balle, Barthe & Gaboardi 2018, Theorem 2)."""
    y = np.linspace(-40.0, 40.0, 400_001)
    dy = y[1] - y[0]
    for trials, p, sens, sigma in ((5, 0.3, 1.0, 2.0), (20, 0.05, 2.0, 1.5), (3, 0.9, 0.5, 0.4)):
        k = np.arange(trials + 1)
        w = stats.binom.pmf(k, trials, p)
        dens_p = sum(
            wk * stats.norm.pdf(y, kk * sens / 2, sigma) for kk, wk in zip(k, w, strict=True)
        )
        dens_q = sum(
            wk * stats.norm.pdf(y, -kk * sens / 2, sigma) for kk, wk in zip(k, w, strict=True)
        )
        law = K.Multiplicity.binomial(trials, p)
        mu = sens**2 / (2 * sigma**2)  # per-copy parameter: sensitivity sens, std sigma
        for eps in (0.1, 0.5, 2.0):
            actual = np.sum(np.maximum(dens_p - np.exp(eps) * dens_q, 0.0)) * dy
            assert actual <= K.minibatch_delta(law, mu, eps) + 1e-9


def test_calibration_modes_are_consistent():
    kw = dict(C=1000.0, c_max=1.0, lam=100.0, max_step=0.1, max_batch=300)
    for branching in ("independent", "paper"):
        cal = K.calibrate_fastmh(branching=branching, iter_epsilon=0.5, iter_delta=1e-6, **kw)
        assert cal.iter_epsilon == 0.5 and cal.iter_delta == 1e-6
        assert gaussian_delta(1 / (2 * cal.z_fullbatch**2), 0.5) <= 1e-6
        assert K.minibatch_delta(cal.law, 1 / (2 * cal.z_minibatch**2), 0.5) <= 1e-6
        back = K.calibrate_fastmh(
            branching=branching,
            noise_multiplier=(cal.z_minibatch, cal.z_fullbatch),
            iter_delta=1e-6,
            **kw,
        )
        assert back.iter_epsilon == pytest.approx(0.5, rel=1e-6)
        run = K.calibrate_fastmh(
            branching=branching, epsilon=3.0, delta=1e-5, iterations=2000, **kw
        )
        eps_run = PrivacyLedger([ApproxDPEvent(run.iter_epsilon, run.iter_delta, 2000)]).epsilon(
            1e-5
        )
        assert 2.9 < eps_run <= 3.0


# -- data access ----------------------------------------------------------------------------


class _RecordingArray(np.ndarray):
    """A data array that logs every index it is read with."""

    def __getitem__(self, key):
        self.log.append(key)
        return np.asarray(self).__getitem__(key)


class _RecordingSampler:
    def __init__(self, inner):
        self.inner = inner
        self.log = []

    def __call__(self, rng, size):
        idx = self.inner(rng, size)
        self.log.append(idx.copy())
        return idx


@pytest.mark.parametrize("n", [400, 30], ids=["direct", "deduplicated"])
def test_minibatch_reads_only_the_sampled_rows(n):
    model, *_ = normal_mean_model(n=n, d=1)
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=1.0,
            max_step=0.05,
            lam=20.0,
            max_batch=10**8,
            iter_epsilon=1.0,
            iter_delta=1e-6,
            proposal_scale=0.02,
        )
    sampler = _RecordingSampler(step._sampler)
    step._sampler = sampler
    data = step._fns._records._arrays  # the in-memory store of the records
    recorders = []
    for a in data:
        rec = a.view(_RecordingArray)
        rec.log = []
        recorders.append(rec)
    step._fns._records._arrays = recorders
    with model:
        idata = pm.sample(40, tune=0, chains=1, cores=1, step=step, random_seed=5, **SAMPLE)
    batches = [b for b in sampler.log if b.size > 0]
    sizes = np.asarray(idata["sample_stats"]["batch_size"].values).ravel()
    assert [b.size for b in sampler.log] == list(sizes)
    assert batches
    for rec in recorders:
        assert len(rec.log) == len(batches)  # one read per iteration with B > 0, no other
        for key, sampled in zip(rec.log, batches, strict=True):
            key = np.asarray(key)
            assert key.dtype.kind == "i"  # an index array, never a slice of all records
            np.testing.assert_array_equal(key, np.unique(sampled))  # each distinct row once


# -- privacy accounting and the report ------------------------------------------------------


def _kov_closed_form(eps: float, delta: float, k: int, i: int) -> tuple[float, float]:
    """Kairouz, Oh & Viswanath (2017), Theorem 3.3: the i-th (epsilon, delta) pair."""
    s = sum(
        special.comb(k, ell, exact=True)
        * (math.exp((k - ell) * eps) - math.exp((k - 2 * i + ell) * eps))
        for ell in range(i)
    )
    delta_i = s / (1 + math.exp(eps)) ** k
    return (k - 2 * i) * eps, 1 - (1 - delta) ** k * (1 - delta_i)


def test_report_equals_kov_closed_form():
    model, *_ = normal_mean_model(n=50, d=1)
    eps_it, delta_it = 0.2, 1e-7
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=5.0,
            max_step=0.3,
            lam=500.0,
            max_batch=600,
            iter_epsilon=eps_it,
            iter_delta=delta_it,
            proposal_scale=0.1,
        )
        idata = pm.sample(20, tune=10, chains=2, cores=1, step=step, random_seed=2, **SAMPLE)
    st = idata["sample_stats"]
    assert np.all(st["dp_iter_epsilon"].values == eps_it)
    assert np.all(st["dp_iter_delta"].values == delta_it)
    assert np.all(st["dp_mu"].values == 0.0)
    k = 2 * (20 + 10)  # every chain, warmup included
    for i in (12, 16, 20):  # delta_i well above the floor 1 - (1 - delta)^k (no cancellation)
        eps_total, delta_total = _kov_closed_form(eps_it, delta_it, k, i)
        assert 1e-9 < delta_total < 0.5
        rep = pymc_dp.privacy_report(idata, delta=delta_total)
        assert rep.iterations == k
        assert rep.epsilon == pytest.approx(eps_total, rel=1e-6)
        assert "Kairouz, Oh, Viswanath" in rep.mechanism


def test_calibrated_run_meets_target():
    model, *_ = normal_mean_model(n=50, d=1)
    with model:
        idata = pymc_dp.sample(
            step=pymc_dp.DPFastMH,
            epsilon=2.0,
            delta=1e-5,
            draws=30,
            tune=20,
            chains=2,
            step_kwargs={"clip_bound": 5.0, "max_step": 0.3, "lam": 500.0, "max_batch": 600},
            cores=1,
            random_seed=4,
            **SAMPLE,
        )
    rep = pymc_dp.privacy_report(idata)
    assert 1.95 < rep.epsilon <= 2.0 and rep.delta == 1e-5 and rep.iterations == 100


def test_privacy_for_free_warns_and_reports_the_honest_delta():
    model, *_ = normal_mean_model(n=50, d=1)
    kw = dict(clip_bound=0.5, max_step=0.2, lam=50.0, max_batch=30, proposal_scale=0.1)
    kw.update(iter_epsilon=1.0, iter_delta=1e-6)
    with model:
        with pytest.warns(UserWarning, match=r"NOT differentially private.*1 - e\^-Delta"):
            step = pymc_dp.DPFastMH(privacy_for_free=True, **kw)
        idata = pm.sample(5, tune=0, chains=1, cores=1, step=step, random_seed=1, **SAMPLE)
        honest = pymc_dp.DPFastMH(**kw)
    st = idata["sample_stats"]
    assert np.all(st["noise_free"].values)  # the paper's rule skips the noise here
    assert np.all(np.isnan(st["accept"].values))  # an exact acceptance is never published
    # Full batch: Delta(l_2) <= 2 * 0.5 * 0.2 = 0.2 < epsilon, so the bit is (eps, 1 - e^-0.2)-DP;
    # minibatch: 1 - E[e^{-k s}] with s = 2 log(1 + C A / lam) = 2 log 1.1 is smaller.
    delta_it = -math.expm1(-0.2)
    assert np.all(st["dp_iter_delta"].values == pytest.approx(delta_it, rel=1e-12))
    assert honest.iter_delta == 1e-6  # the same settings with noise: the requested delta
    floor = 1 - (1 - delta_it) ** 5
    rep = pymc_dp.privacy_report(idata, delta=1e-5)
    assert rep.epsilon == math.inf  # at a meaningful delta there is no guarantee at all
    assert f"delta={delta_it:.3g}" in rep.mechanism
    assert math.isinf(pymc_dp.privacy_report(idata, delta=0.99 * floor).epsilon)
    assert math.isfinite(pymc_dp.privacy_report(idata, delta=min(1.01 * floor, 0.9)).epsilon)


def test_paper_branching_warns_when_its_defect_is_large():
    model, *_ = normal_mean_model(n=50, d=1)
    kw = dict(clip_bound=1.0, max_step=0.2, lam=20.0, iter_epsilon=1.0, iter_delta=1e-6)
    with model:
        with pytest.warns(UserWarning, match=r"reversible only up to P\(B >= K\)"):
            pymc_dp.DPFastMH(branching="paper", max_batch=25, **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pymc_dp.DPFastMH(branching="paper", max_batch=60, **kw)  # defect < 1e-3
    assert not [w for w in caught if "reversible only" in str(w.message)]


def test_privacy_for_free_cannot_meet_a_run_target():
    model, *_ = normal_mean_model(n=50, d=1)
    with model, pytest.raises(ValueError, match="1 - e\\^-Delta"):
        pymc_dp.DPFastMH(
            clip_bound=0.5,
            max_step=0.2,
            lam=50.0,
            max_batch=30,
            epsilon=2.0,
            delta=1e-5,
            draws=10,
            tune=0,
            chains=1,
            privacy_for_free=True,
        )


_PUBLIC_STATS = {
    "accepted",
    "accept",
    "scaling",
    "step_norm",
    "noise_std",
    "batch_size",
    "full_batch",
    "noise_free",
    "dp_mu",
    "dp_releases",
    "dp_target_delta",
    "dp_iter_epsilon",
    "dp_iter_delta",
    "dp_ndim",  # the step's dimension (data-free)
    "dp_plan_chains",  # the calibrated number of chains (data-free)
    "dp_iteration",  # the chain's iteration counter (data-free)
    "dp_plan_iterations",  # the calibrated iterations per chain (data-free)
    "dp_needs_presample",  # whether a pre-sampling release was used (data-free)
    "dp_owners",  # data owners of the data-sharing scheme (0 here; data-free)
}


def test_published_stats_are_data_free_or_labelled():
    model, *_ = normal_mean_model(n=50, d=1)
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=5.0,
            max_step=0.3,
            lam=500.0,
            max_batch=520,
            iter_epsilon=1.0,
            iter_delta=1e-6,
            proposal_scale=0.1,
        )
        idata = pm.sample(30, tune=0, chains=1, cores=1, step=step, random_seed=3, **SAMPLE)
    st = idata["sample_stats"]
    for name in st.data_vars:
        if name not in _PUBLIC_STATS:
            assert name.endswith("_NONPRIVATE"), name
            assert np.all(np.isnan(st[name].values)), name  # off unless asked for
    bs = np.asarray(st["batch_size"].values)
    full = np.asarray(st["full_batch"].values)
    assert np.all(bs[full] == 50) and full.any() and not full.all()


def test_per_record_bounds():
    model, *_ = normal_mean_model(n=40, d=1)
    c = np.linspace(1.0, 4.0, 40)
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=c,
            max_step=0.3,
            lam=200.0,
            max_batch=212,
            iter_epsilon=1.0,
            iter_delta=1e-6,
            proposal_scale=0.1,
        )
        idata = pm.sample(20, tune=0, chains=1, cores=1, step=step, random_seed=3, **SAMPLE)
    assert step._settings.C == pytest.approx(c.sum()) and step._settings.c_max == 4.0
    full = np.asarray(idata["sample_stats"]["full_batch"].values)
    assert full.any() and not full.all()  # per-record clipping in both branches ran


# -- reproducibility and pickling -------------------------------------------------------------


def _run(cores):
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=5.0,
            max_step=0.5,
            lam=300.0,
            max_batch=330,
            iter_epsilon=1.0,
            iter_delta=1e-6,
            proposal_scale=0.2,
        )
        return pm.sample(40, tune=20, chains=4, cores=cores, step=step, random_seed=7, **SAMPLE)


def test_same_draws_for_cores_1_and_2():
    a, b = _run(1), _run(2)
    np.testing.assert_array_equal(posterior_array(a, "theta"), posterior_array(b, "theta"))
    for name in ("accepted", "batch_size", "full_batch"):
        np.testing.assert_array_equal(
            a["sample_stats"][name].values, b["sample_stats"][name].values
        )


def test_step_pickles():
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=np.full(30, 5.0),
            max_step=0.5,
            lam=300.0,
            max_batch=330,
            iter_epsilon=1.0,
            iter_delta=1e-6,
        )
    clone = cloudpickle.loads(cloudpickle.dumps(step))
    assert clone.noise_multiplier == step.noise_multiplier
    assert clone.iter_delta == step.iter_delta
    point = model.initial_point()
    for s in (step, clone):  # what pm.sample does at the start of a chain (PyMC 5 and 6)
        if hasattr(pm.step_methods.arraystep.ArrayStepShared, "setup_chain"):
            s.setup_chain(np.random.default_rng(0), 0, 1)
        else:
            s.set_rng(np.random.default_rng(0))
    p1, s1 = step.step(point)
    p2, s2 = clone.step(point)
    np.testing.assert_array_equal(p1["theta"], p2["theta"])


# -- bad input: a clear error naming the parameter, before any data is read -----------------

_OK = dict(clip_bound=1.0, max_step=0.5, lam=10.0, max_batch=30, iter_epsilon=1.0, iter_delta=1e-6)
_RUN = dict(draws=1, tune=0, chains=1)


def _with(**kw):
    out = dict(_OK)
    for k, v in kw.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (_with(clip_bound=0.0), "clip_bound"),
        (_with(clip_bound=-1.0), "clip_bound"),
        (_with(clip_bound=np.inf), "clip_bound"),
        (_with(clip_bound=np.nan), "clip_bound"),
        (_with(clip_bound=np.r_[np.ones(9), 0.0]), "clip_bound"),
        (_with(clip_bound=np.ones(3)), "clip_bound.*one entry per record"),
        (_with(max_step=0.0), "max_step"),
        (_with(max_step=-1.0), "max_step"),
        (_with(max_step=np.inf), "max_step"),
        (_with(lam=0.0), "lam"),
        (_with(lam=-3.0), "lam"),
        (_with(lam=np.nan), "lam"),
        (_with(max_batch=0), "max_batch"),
        (_with(max_batch=-2), "max_batch"),
        (_with(max_batch=2.5), "max_batch"),
        (_with(iter_epsilon=0.0), "iter_epsilon"),
        (_with(iter_epsilon=-1.0), "iter_epsilon"),
        (_with(iter_delta=0.0), "iter_delta"),
        (_with(iter_delta=1.5), "iter_delta"),
        (_with(iter_delta=None), "needs iter_delta"),
        (_with(iter_epsilon=None), "exactly one of"),
        (_with(iter_epsilon=None, noise_multiplier=0.0), "noise_multiplier"),
        (_with(iter_epsilon=None, noise_multiplier=(1.0, -1.0)), "noise_multiplier"),
        (_with(iter_epsilon=None, noise_multiplier=np.nan), "noise_multiplier"),
        (_with(noise_multiplier=1.0), "exactly one of"),
        (_with(iter_epsilon=None, iter_delta=None, epsilon=1.0, delta=1e-5), "draws, tune"),
        (_with(iter_epsilon=None, iter_delta=None, epsilon=0.0, delta=1e-5, **_RUN), "epsilon"),
        (_with(iter_epsilon=None, iter_delta=None, epsilon=np.nan, delta=1e-5, **_RUN), "epsilon"),
        (_with(iter_epsilon=None, iter_delta=None, epsilon=1.0, delta=0.0, **_RUN), "delta"),
        (_with(iter_epsilon=None, iter_delta=None, epsilon=1.0, delta=1.5, **_RUN), "delta"),
        (_with(iter_epsilon=None, iter_delta=None, epsilon=1.0, **_RUN), "delta"),
        (_with(iter_delta=None, epsilon=1.0, delta=1e-5, **_RUN), "exactly one of"),
        (_with(delta=1e-5), "delta is the run target"),
        (_with(branching="shared"), "branching"),
        (_with(scaling=0.0), "scaling"),
        (_with(target_accept=1.5), "target_accept"),
        (_with(proposal_scale=-1.0), "proposal_scale"),
    ],
)
def test_bad_input_raises_before_reading_data(kwargs, match, monkeypatch):
    import pymc_dp.step_methods.base as base

    def fail(*a, **k):  # the data must not be touched
        raise AssertionError("record functions were built before the input was validated")

    monkeypatch.setattr(base, "build_record_functions", fail)
    model, *_ = normal_mean_model(n=10, d=1)
    with model, pytest.raises(ValueError, match=match):
        pymc_dp.DPFastMH(**kwargs)


def test_infeasible_run_target_names_smallest_feasible_delta():
    x = np.zeros(100)
    with pm.Model(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = pm.Normal("t", 0, 1)
        pm.Normal("x", t, 1, observed=x)
        with pytest.raises(ValueError, match=r"cannot be met.*smallest delta with a finite"):
            pymc_dp.DPFastMH(
                clip_bound=3.0,
                epsilon=1.0,
                delta=1e-5,
                draws=100,
                tune=0,
                chains=1,
                privacy_for_free=True,
            )
