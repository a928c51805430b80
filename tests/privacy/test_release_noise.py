"""The noise each release actually carries, measured at the call site the library uses.

Issue 31: a test of a sensitivity constant, or of a mechanism called with noise ~0, lets a
halved or mis-scaled noise through. Here every release is measured as *released minus
exact*: the exact clipped sums come from spies on the callables (or record functions) the
library reads the data through, the released values from what the library passes on
(the centre of the outer products, the next iterate, the released precision, the returned
histogram, the log acceptance ratio). Standardised by ``multiplier x sensitivity`` (the
sensitivity from its first principles: ``sqrt 2`` for a histogram, ``2 b`` for a sum of
vectors clipped to norm ``b``, ``sqrt 2 b'^2`` for a sum of their outer products, all
under replace-one), the noise must be a standard normal sample: the sum of squares is
checked against its chi-square quantiles (two-sided, 1e-6) and the mean against 5 standard
errors. Where a release is not observable (DPBarker's decision, the last warm-start gradient
sum, every release of an automatic run) the generator is traced instead (`_TracingGenerator`:
each normal draw records the scalar factors it is multiplied by, the std of the noise it
becomes). The automatic run's epsilon is composed here, from first principles, from the
noise multipliers so measured. Every test is seeded; `dev/mutants.py` plants the mis-scaled
noises they catch.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import pymc_dp.kernels.warmstart as warmstart
from pymc_dp.auto.oneshot import ONESHOT_TAIL_LEVELS, TAIL_POINTS
from pymc_dp.kernels.warmstart import clip_grid, private_laplace

SQRT2 = float(np.sqrt(2.0))


def assert_standard_normal(u, label: str) -> None:
    """``u`` should be an iid N(0, 1) sample: chi-square test of its sum of squares
    (two-sided at 1e-6, df = its size) and a z-test of its mean (5 standard errors).

    Parameters
    ----------
    u : array_like
        The standardised noise (released minus exact, over its claimed std).
    label : str
        Names the release in the failure message.
    """
    u = np.ravel(np.asarray(u, dtype=float))
    n = u.size
    assert n >= 200, f"{label}: only {n} draws, too few for the test"
    lo, hi = stats.chi2.ppf([1e-6, 1.0 - 1e-6], n)
    ss = float(u @ u)
    assert lo < ss < hi, (
        f"{label}: sum of squares {ss:.1f} of {n} standardised draws outside "
        f"[{lo:.1f}, {hi:.1f}]: the noise variance is {ss / n:.3f} times the claimed one"
    )
    assert abs(u.mean()) < 5.0 / np.sqrt(n), f"{label}: mean {u.mean():.4f} of {n} draws"


# -- a quadratic log-likelihood, exact clipped sums given directly ------------------------------
# The warm start never sees the data: it calls ``clipped_moments`` and ``grad_counts_above``
# and adds the noise itself. These fakes return fixed "exact" values (every record's gradient
# norm 1.5 times the grid's bound a third of the way up, the gradient sum of a quadratic
# log-likelihood with curvature ``H``, the outer-product sum ``H``); they also record what the
# kernel passed.
D, N = 6, 10_000
C = 0.7 * np.eye(D) + 0.3  # correlations: every off-diagonal entry far above its noise
H = N * C
MU = np.linspace(-0.3, 0.3, D)  # the likelihood's mode (Newton steps stay in the trust region)
PRIOR_PREC = 0.01  # N(0, 10^2) prior on every coordinate, data-free
Z_HIST, Z_GRAD, Z_OUTER = 2.0, 1.5, 0.8


class _Fakes:
    """The data callables of `private_laplace`, recording every call."""

    def __init__(self) -> None:
        self.moments: list[dict] = []
        self.counts: list[dict] = []

    def clipped_moments(self, q, b, b_outer, m, centre=None):
        s1 = m @ (H @ (MU - q))  # whitened coordinates: sums of M g_i
        self.moments.append(
            {"q": q.copy(), "b": b, "b_outer": b_outer, "m": m.copy(), "centre": centre, "s1": s1}
        )
        return s1.copy(), H.copy()

    def grad_counts_above(self, q, grid, m):
        norm = 1.5 * grid[grid.size // 3]  # every record's gradient norm: one bin of the grid
        out = np.where(grid < norm, N, 0)
        self.counts.append({"grid": grid.copy(), "counts": out})
        return out


def _laplace(fakes, seed, *, centred=True, newton_steps=2, z_outer=Z_OUTER, z_hist=Z_HIST):
    # The fakes' outer-product sum ``H`` is fixed, not a sum of outer products clipped at the
    # bound the kernel chose: its eigenvalues (up to 2.5e4) exceed what N records clipped
    # there could give (`warmstart.curvature_cap`, N b'^2), so the kernel would cap the
    # released curvature and the read-back below would measure the cap, not the noise. The
    # cap (post-processing, tested in tests/kernels/test_warmstart_steps.py) is switched off
    # for these fakes; the noise is what is measured here.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warmstart, "curvature_cap", lambda n, per_record: float("inf"))
        return private_laplace(
            q0=np.zeros(D), n=N, prior_grad=lambda q: -PRIOR_PREC * q,
            prior_curvature=lambda q: PRIOR_PREC * np.eye(D),
            clipped_moments=fakes.clipped_moments, grad_counts_above=fakes.grad_counts_above,
            grid=clip_grid(1e-3, 1e4, 29), quantile=0.995,
            grad_noise_multiplier=Z_GRAD, outer_noise_multiplier=z_outer,
            hist_noise_multiplier=z_hist, newton_steps=newton_steps,
            rng=np.random.default_rng(seed), centred=centred,
        )  # fmt: skip


@pytest.fixture(scope="module")
def laplace_runs():
    """60 seeded runs of the warm start (3 iterations each, centred Newton steps first),
    with a spy on the noisy-histogram release it calls."""
    histograms = []
    real = warmstart.noisy_histogram_quantile

    def spy(hist, grid, quantile, noise_multiplier, rng, *rest):
        bound, noisy = real(hist, grid, quantile, noise_multiplier, rng, *rest)
        histograms.append((np.array(hist, dtype=float), np.array(noisy)))
        return bound, noisy

    runs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warmstart, "noisy_histogram_quantile", spy)
        for seed in range(60):
            fakes = _Fakes()
            info = _laplace(fakes, seed)
            runs.append((fakes, info))
    return runs, histograms


def test_warm_start_histograms_carry_noise_z_sqrt2(laplace_runs):
    """Each gradient-norm histogram the warm start releases is the exact one plus
    N(0, (z sqrt 2)^2) per bin, ``z`` the ``hist_noise_multiplier`` it was given (replace-one
    moves one record between two bins: L2 sensitivity sqrt 2)."""
    runs, histograms = laplace_runs
    assert len(histograms) == 3 * len(runs)  # one per iteration
    exact_from_counts = [warmstart.histogram_from_counts(N, c["counts"]) for c in runs[0][0].counts]
    np.testing.assert_array_equal([h for h, _ in histograms[:3]], exact_from_counts)
    noise = np.concatenate([noisy - hist for hist, noisy in histograms])
    assert_standard_normal(noise / (Z_HIST * SQRT2), "warm-start gradient-norm histograms")


def test_newton_gradient_sums_carry_noise_z_2b(laplace_runs):
    """Newton branch: the released gradient sum is passed back, as ``n`` times the centre of
    the outer products; minus the exact clipped sum it is N(0, (z_g 2 b)^2) per coordinate,
    ``b`` the clip bound the sum was taken at (replace-one changes one clipped vector of
    norm <= b: sensitivity 2 b)."""
    runs, _ = laplace_runs
    u = []
    for fakes, _ in runs:
        calls = fakes.moments
        for first, second in zip(calls, calls[1:], strict=False):
            if first["centre"] is None and second["centre"] is not None:
                assert second["b"] == first["b"] and np.array_equal(second["q"], first["q"])
                noise = N * second["centre"] - first["s1"]
                u.append(noise / (Z_GRAD * 2.0 * first["b"]))
    assert len(u) >= 100  # most iterations are Newton steps
    assert_standard_normal(np.concatenate(u), "warm-start gradient sums (Newton branch)")


def test_outer_product_sums_carry_noise_z_sqrt2_b_outer_squared(laplace_runs):
    """The last iteration's outer-product sum is read back from the released precision
    ``L (S2 + E) L^T + P`` (``L`` the whitening that iteration used, ``P`` the prior's
    curvature; every entry of this ``S2`` is far above the thresholds, so nothing is floored
    or dropped): its upper triangle minus the exact sum is N(0, (z_F sqrt 2 b'^2)^2), ``b'``
    the outer products' clip bound (Frobenius sensitivity sqrt 2 b'^2)."""
    runs, _ = laplace_runs
    u = []
    iu = np.triu_indices(D)
    for fakes, info in runs:
        last = fakes.moments[-1]
        m = last["m"]
        s2 = m @ (info.precision - PRIOR_PREC * np.eye(D)) @ m.T
        noise = (s2 - H)[iu]
        u.append(noise / (Z_OUTER * SQRT2 * last["b_outer"] ** 2))
    assert_standard_normal(np.concatenate(u), "warm-start outer-product sums")


def test_uncentred_gradient_sums_carry_noise_z_2b():
    """Uncentred branch (``centred=False``): the released gradient sum sets the first step,
    ``q1 = q0 + (S2 + P)^-1 (S1 + E + grad log prior(q0))`` (outer-product noise ~0 here so
    that ``S2 + P`` is known exactly, no damping): ``(S2 + P)(q1 - q0) - grad log prior -
    S1`` is the noise, N(0, (z_g 2 b)^2) per coordinate."""
    u = []
    for seed in range(150):
        fakes = _Fakes()
        _laplace(fakes, 1000 + seed, centred=False, newton_steps=1, z_outer=1e-9)
        first, second = fakes.moments
        assert first["centre"] is None and second["centre"] is None
        step = second["q"] - first["q"]
        released = (H + PRIOR_PREC * np.eye(D)) @ step - (-PRIOR_PREC * first["q"])
        u.append((released - first["s1"]) / (Z_GRAD * 2.0 * first["b"]))
    assert_standard_normal(np.concatenate(u), "warm-start gradient sums (uncentred branch)")


def test_anchor_bound_lets_an_empty_bin_through_at_most_at_bonferronis_rate():
    """The control variate's clip bound is a 0.9999 quantile of the last released histogram,
    whose bins are thresholded at Bonferroni's level over the bins (a 1e-3 chance that noise
    alone passes anywhere). Every record lies in one bin here; a bound above that bin is noise
    passing the threshold in an empty bin. Over 2000 seeded runs the count of such runs must
    be within the binomial 1 - 1e-6 quantile at rate 1e-3 (3 sds would let about 3 % through)."""
    runs, passed = 2000, 0
    for seed in range(runs):
        fakes = _Fakes()
        info = _laplace(fakes, 5000 + seed, newton_steps=1, z_hist=2.0)
        grid = fakes.counts[-1]["grid"]
        top_record = 1.5 * grid[grid.size // 3]
        edge = grid[np.searchsorted(grid, top_record)]  # the bin holding every record
        passed += info.anchor_bound > edge
    limit = stats.binom.ppf(1.0 - 1e-6, runs, 1e-3)
    assert passed <= limit, f"{passed} of {runs} runs took a bound from an empty bin's noise"


# -- an automatic run: every release's noise traced, the epsilon composed independently ------------
class _Draw(np.ndarray):
    """A standard normal draw that records the scalar factors it is multiplied by.

    ``draw * z * 2.0 * b`` keeps a `_Draw` whose ``event["scale"]`` is ``z 2 b``: the std of
    the noise the draw becomes. Any other operation returns a plain array (a proposal's
    ``chol @ draw`` is not scaled by a scalar: not a release).
    """

    def __array_finalize__(self, obj) -> None:
        self.event = getattr(obj, "event", None)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        events = [x.event for x in inputs if isinstance(x, _Draw) and x.event is not None]
        plain = tuple(x.view(np.ndarray) if isinstance(x, _Draw) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(
                o.view(np.ndarray) if isinstance(o, _Draw) else o for o in kwargs["out"]
            )
        result = getattr(ufunc, method)(*plain, **kwargs)
        if method == "__call__" and ufunc is np.multiply and len(events) == 1:
            other = plain[1] if isinstance(inputs[0], _Draw) else plain[0]
            if np.ndim(other) == 0:
                events[0]["scale"] *= float(other)
                events[0]["scaled"] = True
                out = np.asarray(result).view(_Draw)
                out.event = events[0]
                return out
        return result


class _TracingGenerator:
    """Wraps a numpy Generator: ``normal`` returns `_Draw` s (the same stream) and logs them."""

    def __init__(self, rng: np.random.Generator, log: list) -> None:
        self._rng, self._log = rng, log

    def normal(self, loc=0.0, scale=1.0, size=None):
        z = self._rng.normal(0.0, 1.0, size)
        event = {"shape": np.shape(z), "scale": float(scale), "scaled": scale != 1.0}
        self._log.append(("draw", event))
        if np.ndim(loc) or loc != 0.0:
            return loc + scale * z
        out = np.asarray(z, dtype=float).view(_Draw)
        out.event = event
        return out if scale == 1.0 else out * 1.0  # the event already carries the scale

    def __getattr__(self, name):
        return getattr(self._rng, name)


def _gdp_epsilon(mu: float, delta: float) -> float:
    """Epsilon of mu-GDP at ``delta`` (Dong, Roth & Su 2022, Corollary 2.13):
    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``, solved for eps."""
    from scipy.optimize import brentq

    def excess(eps: float) -> float:
        a = stats.norm.cdf(-eps / mu + mu / 2)
        b = np.exp(eps + stats.norm.logcdf(-eps / mu - mu / 2))
        return a - b - delta

    return float(brentq(excess, 0.0, 100.0 * mu + 100.0, xtol=1e-14, rtol=1e-14))


def _gdp_mu(epsilon: float, delta: float) -> float:
    """The mu of mu-GDP whose epsilon at ``delta`` is ``epsilon`` (inverse of `_gdp_epsilon`)."""
    from scipy.optimize import brentq

    return float(brentq(lambda mu: _gdp_epsilon(mu, delta) - epsilon, 1e-3, 50.0, xtol=1e-14))


def _traced_automatic_run(
    monkeypatch, method: str, epsilon: float, delta: float, hierarchical: bool = False
):
    """``pymc_dp.sample(step=None)`` on a tiny model (``hierarchical``: a normal model of
    4 group means, 6 coordinates, the penalty chain's kind) with every normal draw of its
    mechanisms traced (`_TracingGenerator`) and each release's sensitivity from the data read
    just before it (spies on the record functions): a histogram's ``sqrt 2``, a clipped sum's
    ``2 b``, an outer-product sum's ``sqrt 2 b'^2``, a sum of per-record Hessians each clipped
    to Frobenius norm ``B`` (the one-shot curvature, counted with the outer products): ``2 B``,
    a ratio clipped to ``[-B, B]``: ``2 B``. Returns ``(z, idata, report)``, ``z`` the noise
    multipliers actually used by kind, in order (``std / sensitivity``)."""
    import pymc as pm

    import pymc_dp
    import pymc_dp.auto as auto
    import pymc_dp.step_methods.penalty as penalty_step
    from pymc_dp.records.runtime import RecordFunctions

    log: list = []
    real_auto = auto.auto_configure

    def traced_auto(*args, rng, **kwargs):
        return real_auto(*args, rng=_TracingGenerator(rng, log), **kwargs)

    monkeypatch.setattr(auto, "auto_configure", traced_auto)
    real_penalty = penalty_step.penalty_log_acceptance
    monkeypatch.setattr(
        penalty_step,
        "penalty_log_acceptance",
        lambda llr, lp, lq, sigma, rng: real_penalty(
            llr, lp, lq, sigma, _TracingGenerator(rng, log)
        ),
    )

    def spy(name, entry):
        real = getattr(RecordFunctions, name)

        def wrapped(self, *args, **kwargs):
            log.append(entry(*args, **kwargs))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(RecordFunctions, name, wrapped)

    spy(
        "grad_norm_counts",
        lambda q, grid, *a, **k: (
            "counts",
            "tail" if np.size(grid) == ONESHOT_TAIL_LEVELS * TAIL_POINTS else None,
        ),
    )
    spy(
        "clipped_grad_moments",
        lambda q, bound, transform=None, outer_bound=None, centre=None: (
            "moments",
            (bound, bound if outer_bound is None else outer_bound),
        ),
    )
    spy("clipped_residual_ratio_sum", lambda q1, q0, bound, *a, **k: ("ratio", bound))
    # the one-shot warm start's curvature: the clipped per-record Hessians' sum, each
    # record's matrix clipped to Frobenius norm B, sensitivity 2 B (an indefinite matrix)
    spy("clipped_hessian_sum", lambda points, maps, step, bound, *a, **k: ("hessian", bound))

    x = np.random.default_rng(0).normal(1.5, 1.0, 500)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        if hierarchical:
            group = np.arange(x.size) % 4
            a = pm.Normal("a", mu, pm.HalfNormal("s", 1.0), shape=4)
            pm.Normal("x", a[group], 1.0, observed=x + 0.5 * (group - 1.5))
        else:
            pm.Normal("x", mu, 1.0, observed=x)
        idata = pymc_dp.sample(
            epsilon=epsilon, delta=delta, chains=2, cores=1, random_seed=3, progressbar=False,
            compute_convergence_checks=False,
            auto_kwargs={"max_iterations": 400, "method": method},
        )  # fmt: skip
    report = pymc_dp.privacy_report(idata, model=model, attach=False)

    # every scaled draw is a release; its sensitivity from the data read just before it
    z = {
        "histogram": [],
        "gradient sum": [],
        "outer-product sum": [],
        "penalty test": [],
        "tail excess": [],
    }
    last, latest = {}, None
    for kind, what in log:
        if kind != "draw":
            last[kind], latest = what, kind
            continue
        if not what["scaled"]:
            continue  # a proposal's or a start's draw, not a release
        shape = what["shape"]
        if shape == ():  # one ratio sum clipped to [-B, B]
            z["penalty test"].append(what["scale"] / (2.0 * last["ratio"]))
        elif shape == (30,):  # the public grid's 29 bounds make 30 bins
            z["histogram"].append(what["scale"] / SQRT2)
        elif shape == (ONESHOT_TAIL_LEVELS,) and last.get("counts") == "tail":
            # the one-shot excess beyond b, 2b, 4b: each record moves each level by at
            # most 1, sensitivity sqrt(J)
            z["tail excess"].append(what["scale"] / np.sqrt(ONESHOT_TAIL_LEVELS))
        elif len(shape) == 1 and latest == "moments":
            z["gradient sum"].append(what["scale"] / (2.0 * last["moments"][0]))
        elif latest == "hessian":
            assert len(shape) == 2 and shape[0] == shape[1], shape
            z["outer-product sum"].append(what["scale"] / (2.0 * last["hessian"]))
        else:
            assert len(shape) == 2 and shape[0] == shape[1], shape
            z["outer-product sum"].append(what["scale"] / (SQRT2 * last["moments"][1] ** 2))
    return {k: np.array(v) for k, v in z.items()}, idata, report


def _composed_epsilon(z: dict, delta: float) -> float:
    """Gaussian mechanisms with multipliers ``z_k`` compose to mu-GDP with ``mu^2 = sum_k
    z_k^-2`` (Dong, Roth & Su 2022, Corollary 3.3): its epsilon at ``delta``."""
    return _gdp_epsilon(float(np.sqrt(sum(np.sum(v**-2.0) for v in z.values()))), delta)


def test_automatic_run_epsilon_is_the_composition_of_the_noise_it_added(monkeypatch):
    """The penalty chain (``method="chain"``), every release traced (`_traced_automatic_run`).
    The report's epsilon must be the composition of the multipliers actually used, to 1e-6
    relative, and each warm-start release's multiplier the one of its share of the budget,
    computed here from (epsilon, delta) by the same closed form: iteration ``j`` of the
    warm start gets ``w_j`` of each of its phases, shares growing by ``WARM_START_GROWTH``."""
    from pymc_dp.auto import BudgetSplit
    from pymc_dp.auto.configure import NEWTON_STEPS, WARM_START_GROWTH

    epsilon, delta = 3.0, 1e-5
    z, idata, report = _traced_automatic_run(monkeypatch, "chain", epsilon, delta)
    assert report.epsilon == pytest.approx(_composed_epsilon(z, delta), rel=1e-6)
    assert report.epsilon <= epsilon and _composed_epsilon(z, delta) <= epsilon * (1 + 1e-9)

    # the release counts: the warm start's iterations (a histogram, a gradient sum and an
    # outer-product sum each), the clip selection's histogram, the control variate's
    # gradient sum, one penalty test per iteration of every chain
    k = NEWTON_STEPS + 1
    iterations = idata.posterior.sizes["chain"] * idata.posterior.sizes["draw"]
    assert (z["histogram"].size, z["outer-product sum"].size) == (k + 1, k)
    assert z["gradient sum"].size == k + 1 and z["penalty test"].size == iterations
    # the warm start's and the clip selection's multipliers: their shares of the budget
    # (the library's mu, the loss's mean, is half the GDP mu squared: shares of mu_gdp^2)
    mu2, split = _gdp_mu(epsilon, delta) ** 2, BudgetSplit()
    hist, clip = split.histograms * mu2, split.clip_selection * mu2
    sums = split.warm_start / 2 * mu2  # half to the gradient sums, half to the outer products
    w = WARM_START_GROWTH ** np.arange(k)
    w /= w.sum()
    assert WARM_START_GROWTH > 1.0 and w[-1] > 2.0 * w[0]  # the budget grows over the iterations
    np.testing.assert_allclose(z["histogram"][:k], np.sqrt(1 / (w * hist)), rtol=1e-9)
    np.testing.assert_allclose(z["histogram"][k], np.sqrt(1 / clip), rtol=1e-9)
    np.testing.assert_allclose(z["gradient sum"][:k], np.sqrt(1 / (w * sums)), rtol=1e-9)
    np.testing.assert_allclose(z["outer-product sum"], np.sqrt(1 / (w * sums)), rtol=1e-9)


def test_one_shot_epsilon_is_the_composition_of_the_noise_it_added(monkeypatch):
    """The one-shot strategy (``method="laplace"``), every release traced. Its warm start's
    iterations share each phase equally: every histogram, gradient sum and outer-product sum
    must carry the multiplier of its share, computed here from (epsilon, delta); the last
    releases' clip histogram its own share; the two last gradient sums share what is left
    equally; the report's epsilon is the composition of
    all of them, and the whole budget."""
    from pymc_dp.auto.configure import ONESHOT_CLIP_SHARE, ONESHOT_SPLIT, ONESHOT_TAIL_SHARE
    from pymc_dp.auto.oneshot import ONESHOT_NEWTON_STEPS

    epsilon, delta = 3.0, 1e-5
    z, idata, report = _traced_automatic_run(monkeypatch, "laplace", epsilon, delta)
    assert idata.attrs["dp_method"] == "laplace"
    assert report.epsilon == pytest.approx(_composed_epsilon(z, delta), rel=1e-6)
    assert report.epsilon == pytest.approx(epsilon, rel=1e-6)

    k = ONESHOT_NEWTON_STEPS + 1
    # the warm start's k histograms and the last releases' own clip histogram
    assert z["histogram"].size == k + 1 and z["outer-product sum"].size == k
    assert z["gradient sum"].size == k + 2 and z["penalty test"].size == 0
    w = np.full(k, 1.0 / k)
    mu2, split = _gdp_mu(epsilon, delta) ** 2, ONESHOT_SPLIT
    sums = split.warm_start / 2 * mu2
    np.testing.assert_allclose(
        z["histogram"][:k], np.sqrt(1 / (w * split.histograms * mu2)), rtol=1e-9
    )
    np.testing.assert_allclose(
        z["histogram"][k], np.sqrt(1 / (ONESHOT_CLIP_SHARE * mu2)), rtol=1e-9
    )
    np.testing.assert_allclose(z["gradient sum"][:k], np.sqrt(1 / (w * sums)), rtol=1e-9)
    np.testing.assert_allclose(z["outer-product sum"], np.sqrt(1 / (w * sums)), rtol=1e-9)
    # the report names what the curvature phase released: per-record Hessians, not outer
    # products (the traced "outer-product sum" draws above are the Hessian release's noise)
    from pymc_dp.auto.configure import HESSIAN_PHASE, OUTER_PHASE, hessian_curvature_phase

    phases = str(idata.attrs["dp_phases"])
    if hessian_curvature_phase("laplace"):
        assert f"{HESSIAN_PHASE}: {k} Gaussian releases" in phases and OUTER_PHASE not in phases
    else:
        assert f"{OUTER_PHASE}: {k} Gaussian releases" in phases and HESSIAN_PHASE not in phases
    # the excess beyond the last releases' bound: its own share
    assert z["tail excess"].size == 1
    np.testing.assert_allclose(z["tail excess"], np.sqrt(1 / (ONESHOT_TAIL_SHARE * mu2)), rtol=1e-9)
    left = 1.0 - split.warm_start - split.histograms - ONESHOT_CLIP_SHARE - ONESHOT_TAIL_SHARE
    left *= mu2
    # (calibrated to the target to 1e-6: its multiplier nudged up until the composition fits)
    np.testing.assert_allclose(z["gradient sum"][k:], np.sqrt(2 / left), rtol=1e-6)
    assert np.all(z["gradient sum"][k:] >= np.sqrt(2 / left) * (1 - 1e-12))


def test_chain_fallback_epsilon_is_the_composition_of_the_noise_it_added(monkeypatch):
    """The penalty chain's one-shot fallback after its control variate (`configure._one_shot`
    with ``first``), every release traced, on the hierarchical model the automatic mode
    gives the chain. The fallback is forced where the run decides it (the independence
    proposal predicted off the target's mode, `configure._off_centre`: its effective sample
    size set below the threshold; the releases are the run's own). The excess beyond the
    control variate's bound must be released once, with its share's multiplier; the last
    gradient sum (one release, the first end being the control variate's) with all that is
    left; the report's epsilon the composition of all of them, and the whole budget. Before
    the fallback released its tail, it made no excess release."""
    import pymc_dp.auto.configure as configure
    from pymc_dp.auto.configure import NEWTON_STEPS, ONESHOT_TAIL_SHARE
    from pymc_dp.auto.predict import Prediction

    real = configure._off_centre
    forced = []

    def off_centre(pred, best, step, centre):
        p, b, offset = real(pred, best, step, centre)
        forced.append(p.proposal)
        stuck = [Prediction(x.proposal, x.iterations, x.noise_multiplier, 1e3, 0.0, -1.0)
                 for x in (p, b)]  # fmt: skip
        return stuck[0], stuck[1], offset

    monkeypatch.setattr(configure, "_off_centre", off_centre)
    # below every real prediction (>= 0) and above the forced one: only this path gives way
    monkeypatch.setattr(configure, "ONESHOT_FALLBACK_ESS", -0.5)
    epsilon, delta = 3.0, 1e-5
    z, idata, report = _traced_automatic_run(monkeypatch, "auto", epsilon, delta, True)
    assert forced == ["independent"] and idata.attrs["dp_method"] == "laplace"
    assert "control variate's release as its first end" in idata.attrs["dp_auto_strategy"]
    assert report.epsilon == pytest.approx(_composed_epsilon(z, delta), rel=1e-6)
    assert report.epsilon == pytest.approx(epsilon, rel=1e-6)

    k = NEWTON_STEPS + 1
    # the chain's warm start (k histograms, gradient and outer-product sums), its clip
    # selection's histogram, the control variate's sum; then the excess and one last sum
    assert z["histogram"].size == k + 1 and z["outer-product sum"].size == k
    assert z["gradient sum"].size == k + 2 and z["penalty test"].size == 0
    mu2 = _gdp_mu(epsilon, delta) ** 2
    assert z["tail excess"].size == 1
    np.testing.assert_allclose(z["tail excess"], np.sqrt(1 / (ONESHOT_TAIL_SHARE * mu2)), rtol=1e-9)
    used = sum(float(np.sum(v[:-1] ** -2.0)) if name == "gradient sum" else float(np.sum(v**-2.0))
               for name, v in z.items())  # fmt: skip
    # the last sum: all that is left (calibrated to the target to 1e-6)
    np.testing.assert_allclose(z["gradient sum"][-1], np.sqrt(1 / (mu2 - used)), rtol=1e-6)
    phases = str(idata.attrs["dp_phases"])
    assert "one-shot: noisy excess of the whitened gradient norms" in phases
    assert "one-shot: noisy gradient-norm histogram" not in phases  # no fresh histogram


@pytest.mark.parametrize("n", [600, 150])
def test_stats_strategy_epsilon_is_the_composition_of_the_noise_it_added(monkeypatch, n):
    """The sufficient-statistics strategy (``method="stats"``, a linear regression with
    declared bounds), every normal draw traced and each release's sensitivity from the data
    pass just before it (spies on the statistics' passes): a box-scaled or whitened clipped
    sum's ``2 b``, an absolute-deviation sum's ``2 b``, an outer-product sum's
    ``sqrt 2 b^2``, a histogram's ``sqrt 2``. Each multiplier must be its phase's share of
    the budget, computed here from (epsilon, delta), and the report's epsilon their
    composition and the whole budget: a release with less noise than its share fails.
    At n = 150 the whitening's histograms cannot locate the records on any grid
    (`pymc_dp.auto.suffstats.whitening_grid_bins`, public facts): two releases only, the
    box-scaled centre and the last sum with the rest; no other data pass is made."""
    import pymc as pm

    import pymc_dp
    import pymc_dp.auto as auto
    from pymc_dp.auto.suffstats import (
        STATS_CENTRE_SHARE,
        STATS_CLIP_SHARE,
        STATS_TAIL_LEVELS,
        STATS_TAIL_SHARE,
        STATS_WHITENING_SHARE,
    )
    from pymc_dp.kernels.expfam import TAIL_EXCESS_POINTS
    from pymc_dp.records.expfam import ExpFamilyModel

    log: list = []
    real_auto = auto.auto_configure
    monkeypatch.setattr(
        auto,
        "auto_configure",
        lambda *a, rng, **k: real_auto(*a, rng=_TracingGenerator(rng, log), **k),
    )
    real_sum, real_counts = ExpFamilyModel.centred_clip_sum, ExpFamilyModel.deviation_counts

    def centred(self, centre, bound, *a, absolute=False, outer=False, **k):
        kind = "outer" if outer else "sum"
        log.append(("read", (kind, bound)))
        return real_sum(self, centre, bound, *a, absolute=absolute, outer=outer, **k)

    def counts(self, centre, grid, *a, **k):
        # the tail's excess (`private_tail_excess`) counts on its levels' midpoints
        tail = np.size(grid) == STATS_TAIL_LEVELS * TAIL_EXCESS_POINTS
        log.append(("read", ("tail" if tail else "histogram", None)))
        return real_counts(self, centre, grid, *a, **k)

    monkeypatch.setattr(ExpFamilyModel, "centred_clip_sum", centred)
    monkeypatch.setattr(ExpFamilyModel, "deviation_counts", counts)

    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, (n, 2))
    y = np.clip(0.3 + x @ np.array([1.0, -0.5]) + rng.normal(0.0, 0.7, n), -4.0, 4.0)
    epsilon, delta = 3.0, 1e-5
    with pm.Model() as model:
        X = pm.Data("X", x)
        a = pm.Normal("a", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 5.0, shape=2)
        pm.Normal("y", a + pm.math.dot(X, b), pm.HalfNormal("sigma", 2.0), observed=y)
        idata = pymc_dp.sample(
            100, epsilon=epsilon, delta=delta, chains=2, random_seed=3, progressbar=False,
            data_bounds={"y": (-4.0, 4.0), "X": (-1.0, 1.0)}, compute_convergence_checks=False,
        )  # fmt: skip
    report = pymc_dp.privacy_report(idata, model=model, attach=False)
    assert idata.attrs["dp_method"] == "stats"

    z = []  # (kind, multiplier) of every release, in order
    last = None
    for kind, what in log:
        if kind == "read":
            last = what
            continue
        if not what["scaled"]:
            continue
        read, bound = last
        if read == "histogram":
            z.append(("histogram", what["scale"] / SQRT2))
        elif read == "tail":
            z.append(("tail", what["scale"] / np.sqrt(STATS_TAIL_LEVELS)))
        elif read == "outer":
            z.append(("outer", what["scale"] / (SQRT2 * bound**2)))
        else:
            z.append(("sum", what["scale"] / (2.0 * bound)))
    kinds = [k for k, _ in z]
    zs = np.array([v for _, v in z])
    mu2 = _gdp_mu(epsilon, delta) ** 2
    if n == 150:  # the centre; the last sum (its clip the box's)
        assert kinds == ["sum", "sum"]
        assert [what[0] for kind, what in log if kind == "read"] == ["sum", "sum"]
        np.testing.assert_allclose(zs[0], np.sqrt(1 / (STATS_CENTRE_SHARE * mu2)), rtol=1e-9)
        np.testing.assert_allclose(zs[1], np.sqrt(1 / ((1 - STATS_CENTRE_SHARE) * mu2)), rtol=1e-6)
        composed = _gdp_epsilon(float(np.sqrt(np.sum(zs**-2.0))), delta)
        assert report.epsilon == pytest.approx(composed, rel=1e-6)
        assert report.epsilon == pytest.approx(epsilon, rel=1e-6) and report.epsilon <= epsilon
        return
    # the centre; the whitening's quantile, spread, quantile, second moment; the clip
    # bound's quantile; the tail's excess beyond it; the last sum
    assert kinds == ["sum", "histogram", "sum", "histogram", "outer", "histogram", "tail", "sum"]
    np.testing.assert_allclose(zs[0], np.sqrt(1 / (STATS_CENTRE_SHARE * mu2)), rtol=1e-9)
    np.testing.assert_allclose(zs[1:5], np.sqrt(4 / (STATS_WHITENING_SHARE * mu2)), rtol=1e-9)
    np.testing.assert_allclose(zs[5], np.sqrt(1 / (STATS_CLIP_SHARE * mu2)), rtol=1e-9)
    np.testing.assert_allclose(zs[6], np.sqrt(1 / (STATS_TAIL_SHARE * mu2)), rtol=1e-9)
    left = (
        1.0 - STATS_CENTRE_SHARE - STATS_WHITENING_SHARE - STATS_CLIP_SHARE - STATS_TAIL_SHARE
    ) * mu2
    np.testing.assert_allclose(zs[7], np.sqrt(1 / left), rtol=1e-6)
    composed = _gdp_epsilon(float(np.sqrt(np.sum(zs**-2.0))), delta)
    assert report.epsilon == pytest.approx(composed, rel=1e-6)
    assert report.epsilon == pytest.approx(epsilon, rel=1e-6) and report.epsilon <= epsilon


# -- the exponential-family statistic ------------------------------------------------------------
def test_exponential_family_statistic_carries_noise_z_2c(monkeypatch):
    """DPExpFamilyPenalty releases ``S + N(0, (z 2 C)^2 I)`` each iteration (the statistics
    clipped to norm ``C``: replace-one sensitivity ``2 C``); the test reads it through its
    log acceptance ratio, ``d_eta . S~ - n dA + log prior ratio - (z 2 C)^2 ||d_eta||^2 / 2``.
    A spy at the step's call of `expfam_log_acceptance` takes the exact parts; the rest,
    over ``z 2 C ||d_eta||`` (``z`` and ``C`` the values given here), must be N(0, 1) over
    the iterations of a run: a halved noise, or a penalty correction of another size, fails."""
    import pymc as pm

    import pymc_dp.step_methods.expfam as expfam_step
    from pymc_dp import DPExpFamilyPenalty

    calls = []
    real = expfam_step.expfam_log_acceptance

    def spy(stat_sum, d_eta, n_d_a, lp_ratio, lq_ratio, *args, **kwargs):
        out = real(stat_sum, d_eta, n_d_a, lp_ratio, lq_ratio, *args, **kwargs)
        calls.append((np.array(stat_sum), np.array(d_eta), n_d_a, lp_ratio, lq_ratio, out))
        return out

    monkeypatch.setattr(expfam_step, "expfam_log_acceptance", spy)
    z, c = 0.7, 4.0
    y = np.random.default_rng(4).normal(1.0, 2.0, 200)
    with pm.Model():
        pm.Normal("y", pm.Normal("mu", 0, 5), pm.HalfNormal("s", 2), observed=y)
        step = DPExpFamilyPenalty(noise_multiplier=z, stat_clip_bound=c)
        pm.sample(
            draws=600, tune=0, chains=1, cores=1, step=step, random_seed=2, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    std = z * 2.0 * c
    u = []
    for s, d_eta, n_d_a, lp, lq, log_a in calls:
        norm = float(np.sqrt(d_eta @ d_eta))
        exact = s @ d_eta - n_d_a + lp + lq - 0.5 * std**2 * norm**2
        if np.isfinite(log_a) and norm > 0:
            u.append((log_a - exact) / (std * norm))
    assert len(u) >= 550
    assert_standard_normal(u, "exponential-family statistic")


def test_correlated_exponential_family_releases_carry_their_noise(monkeypatch):
    """DPExpFamilyPenalty with `CorrelatedNoise` releases, per chain, ``Y_0 = S + sigma
    (sigma psi + xi)`` and then ``Y' = r Y + (1 - r) S + sigma sqrt(1 - r^2) xi`` (``S`` the
    statistic clipped to norm ``C``). ``sigma = z0 2C`` and ``r`` are recomputed here from
    the ``z``, plan and refreshes given (`correlated_noise_schedule`); a spy at the step's
    releases takes ``S`` and the previous release: the rest, over its claimed std, must be
    N(0, 1). A smaller noise or a weaker correlation than accounted fails."""
    import pymc as pm

    import pymc_dp.step_methods.expfam as expfam_step
    from pymc_dp import CorrelatedNoise, DPExpFamilyPenalty
    from pymc_dp.kernels.expfam import correlated_noise_schedule

    calls = []
    real = expfam_step.correlated_release

    def spy(previous, stat_sum, r, noise_std, rng, *, start=None):
        out = real(previous, stat_sum, r, noise_std, rng, start=start)
        calls.append((previous, np.array(stat_sum), start, out))
        return out

    monkeypatch.setattr(expfam_step, "correlated_release", spy)
    z, c, draws = 0.7, 4.0, 600
    y = np.random.default_rng(4).normal(1.0, 2.0, 200)
    with pm.Model():
        pm.Normal("y", pm.Normal("mu", 0, 5), pm.HalfNormal("s", 2), observed=y)
        step = DPExpFamilyPenalty(
            noise_multiplier=z, stat_clip_bound=c, draws=draws, tune=0, chains=1,
            noise=CorrelatedNoise(refreshes=30),
        )  # fmt: skip
        pm.sample(
            draws=draws, tune=0, chains=1, cores=1, step=step, random_seed=2, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    z0, r = correlated_noise_schedule(z, draws, 30)
    sigma = z0 * 2.0 * c
    u = []
    for previous, s, start, out in calls:
        if previous is None:
            u.append((out - s) / sigma - start)
        else:
            u.append((out - r * previous - (1 - r) * s) / (sigma * np.sqrt(1 - r * r)))
    assert sum(p is None for p, *_ in calls) == 1 and len(calls) >= draws - 1
    assert_standard_normal(np.concatenate(u), "correlated exponential-family statistic")


# -- the penalty tests and DP-HMC's gradients ------------------------------------------------------
def _spy_penalty_tests(monkeypatch, module) -> list:
    """Record every penalty test ``module`` makes, with the pair of points its ratio sum was
    taken at: ``(q_new, q_old, clipped sum, log prior ratio, log q ratio, log acceptance)``."""
    from pymc_dp.records.runtime import LoglikMemo, RecordFunctions

    pairs, tests = [], []
    real_sum = RecordFunctions.clipped_loglik_ratio_sum
    real_test = module.penalty_log_acceptance

    def spy_sum(self, q_new, q_old, bound):
        out = real_sum(self, q_new, q_old, bound)
        pairs.append((np.array(q_new), np.array(q_old), out[0]))
        return out

    def spy_test(llr, log_prior_ratio, log_q_ratio, sigma, rng):
        out = real_test(llr, log_prior_ratio, log_q_ratio, sigma, rng)
        assert pairs and pairs[-1][2] == llr  # the test of the sum just taken
        tests.append((*pairs[-1], log_prior_ratio, log_q_ratio, out))
        return out

    monkeypatch.setattr(RecordFunctions, "clipped_loglik_ratio_sum", spy_sum)
    # DPHMC's ratio releases from the kept per-record log-likelihoods (the same release)
    real_kept = LoglikMemo.__call__

    def spy_kept(self, q_new, q_old, bound):
        out = real_kept(self, q_new, q_old, bound)
        pairs.append((np.array(q_new), np.array(q_old), out[0]))
        return out

    monkeypatch.setattr(LoglikMemo, "__call__", spy_kept)
    # DPHMC's ratio releases computed with the last gradient of the trajectory (one pass)
    from pymc_dp.records import FusedLastPass

    real_fused = FusedLastPass.__call__

    def spy_fused(self, q_new, grad_bound, q_old, bound):
        out = real_fused(self, q_new, grad_bound, q_old, bound)
        pairs.append((np.array(q_new), np.array(q_old), out[2]))
        return out

    monkeypatch.setattr(FusedLastPass, "__call__", spy_fused)
    monkeypatch.setattr(module, "penalty_log_acceptance", spy_test)
    return tests


def _penalty_noise(tests, z: float, b: float) -> np.ndarray:
    """Each test's noise over ``z 2 b ||q' - q||`` (the ratio sum clipped to ``+- b ||q' -
    q||``: sensitivity ``2 b ||q' - q||``); the exact part, penalty correction included,
    computed here from the same std."""
    u = []
    for q1, q0, llr, lp, lq, log_a in tests:
        s = z * 2.0 * b * float(np.linalg.norm(q1 - q0))
        if s > 0 and np.isfinite(log_a):
            u.append((log_a - (llr + lp + lq - 0.5 * s * s)) / s)
    return np.array(u)


def test_penalty_tests_carry_noise_z_2b_step(monkeypatch):
    """DPPenaltyMetropolis: each iteration's noisy ratio, read through its log acceptance,
    minus the exact clipped sum, log prior and proposal ratios and the penalty correction,
    is N(0, (z 2 b ||q' - q||)^2) (``z`` and ``b`` the values given here)."""
    import pymc as pm
    from conftest import normal_mean_model

    import pymc_dp
    import pymc_dp.step_methods.penalty as penalty_step

    tests = _spy_penalty_tests(monkeypatch, penalty_step)
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=2.0, noise_multiplier=0.6)
        pm.sample(
            500, tune=0, chains=1, cores=1, step=step, random_seed=3, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    u = _penalty_noise(tests, 0.6, 2.0)
    assert u.size >= 450
    assert_standard_normal(u, "penalty tests (DPPenaltyMetropolis)")


@pytest.mark.parametrize("fused", [True, False])
def test_dphmc_gradients_and_penalty_tests_carry_their_noise(monkeypatch, fused):
    """DPHMC: each of the ``L + 1`` gradient releases of a trajectory is read back from the
    leapfrog's positions (``p_{i+1/2} = (q_{i+1} - q_i) / (eta M^-1)``, the half-step
    momenta) minus the exact gradient at the point (a spy on the gradient the kernel
    evaluates): N(0, (z_g 2 b_g)^2) per coordinate. The penalty test at the end of the
    trajectory: N(0, (z_l 2 b_l ||q' - q||)^2), its exact part the kinetic-energy change.
    ``fused``: the last gradient release and the ratio release from one pass over the
    records (issue 28; the default here), or two."""
    import pymc as pm
    from conftest import normal_mean_model

    import pymc_dp
    import pymc_dp.kernels.hmc as hmc

    trajectories = []
    real_leapfrog = hmc.noisy_leapfrog

    def spy_leapfrog(q, p, step_size, n_steps, grad_fn, inv_mass, noise_std, rng):
        points, grads = [], []

        def exact(x):
            g = grad_fn(x)
            points.append(np.array(x))
            grads.append(np.array(g))
            return g

        out = real_leapfrog(q, p, step_size, n_steps, exact, inv_mass, noise_std, rng)
        trajectories.append((np.array(p), step_size, inv_mass.copy(), points, grads, out.p))
        return out

    monkeypatch.setattr(hmc, "noisy_leapfrog", spy_leapfrog)
    tests = _spy_penalty_tests(monkeypatch, hmc)
    z_g, b_g, z_l, b_l = 0.4, 3.0, 0.7, 2.0
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = pymc_dp.DPHMC(
            grad_clip_bound=b_g, llr_clip_bound=b_l, grad_noise_multiplier=z_g,
            llr_noise_multiplier=z_l, n_leapfrog=3, step_size=0.05,
        )  # fmt: skip
        step.reuse_loglik = True  # the ratio releases from kept log-likelihoods (as a GLM's)
        step.fuse_ratio_pass = fused
        assert step.fuses_ratio_pass == fused
        pm.sample(
            250, tune=0, chains=1, cores=1, step=step, random_seed=4, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    u, first, released_first = [], [], []
    for p0, eta, inv_mass, points, grads, p_end in trajectories:
        # half-step momenta from the positions, then each gradient's noise from the momenta
        half = [(b - a) / (eta * inv_mass) for a, b in zip(points, points[1:], strict=False)]
        momenta = [p0, *half, p_end]
        weights = [0.5 * eta] + [eta] * (len(points) - 2) + [0.5 * eta]
        for k, g in enumerate(grads):
            u.append(((momenta[k + 1] - momenta[k]) / weights[k] - g) / (z_g * 2.0 * b_g))
        first.append(u[-len(grads)])
        released_first.append((points[0], (momenta[1] - momenta[0]) / weights[0]))
    assert len(trajectories) == 250 and len(u) == 1000
    assert_standard_normal(np.concatenate(u), "DPHMC gradient releases")
    # the first release of every trajectory after the first is the kept noise-free sum at the
    # current state (computed in the previous trajectory) plus fresh noise: the same std
    assert step._grad_memo.reused == 249
    if fused:  # every trajectory's last gradient and its ratio from one pass
        assert step._fused[1].calls == 250
    assert_standard_normal(np.concatenate(first[1:]), "DPHMC releases of a kept sum")
    # two releases at the same point (a rejected trajectory, then the next one) differ
    same = [
        (a[1], b[1])
        for a, b in zip(released_first, released_first[1:], strict=False)
        if np.array_equal(a[0], b[0])
    ]
    assert len(same) >= 10 and all(np.all(a != b) for a, b in same)
    u = _penalty_noise(tests, z_l, b_l)
    assert u.size >= 225
    assert_standard_normal(u, "DPHMC penalty tests")


@pytest.mark.filterwarnings("ignore:DPFastMH. the expected minibatch")
def test_fastmh_releases_carry_noise_z_times_their_sensitivity(monkeypatch):
    """DPFastMH, both branches (Zhang et al. 2023, Lemma 1): a minibatch sum of TunaMH terms,
    sensitivity ``2 log(1 + C M / lambda)`` (``C = n c``), noise ``z_1`` times it; a full-batch
    ratio sum clipped to ``+- c M``, sensitivity ``2 c M``, noise ``z_2`` times it. A spy at
    the step's call of the transition takes the exact sum (from the data callables it
    passes) and the log acceptance; their difference, less the penalty correction, over
    that std is N(0, 1) in each branch."""
    import pymc as pm
    from conftest import normal_mean_model

    import pymc_dp
    import pymc_dp.step_methods.fastmh as fastmh_step

    records = []
    real = fastmh_step.fastmh_transition

    def spy(rng, settings, sampler, **kw):
        exact = []
        mini, full = kw["minibatch_terms"], kw["fullbatch_clipped_sum"]

        def mini_spy(*a):
            out = mini(*a)
            exact.append(out[0][0])
            return out

        def full_spy(*a):
            out = full(*a)
            exact.append(out[0])
            return out

        kw.update(minibatch_terms=mini_spy, fullbatch_clipped_sum=full_spy)
        info = real(rng, settings, sampler, **kw)
        ell = exact[0] if exact else 0.0  # an empty minibatch sums to 0
        lp, lq, m = kw["log_prior_ratio"], kw["log_proposal_ratio"], kw["step_norm"]
        records.append((info.full_batch, ell, lp, lq, m, info.log_accept))
        return info

    monkeypatch.setattr(fastmh_step, "fastmh_transition", spy)
    n, c, lam, z1, z2 = 50, 5.0, 3000.0, 20.0, 0.3
    model, *_ = normal_mean_model(n=n, d=1)
    with model:
        step = pymc_dp.DPFastMH(
            clip_bound=c, max_step=0.5, lam=lam, max_batch=3090, noise_multiplier=(z1, z2),
            iter_delta=1e-6, proposal_scale=0.3,
        )  # fmt: skip
        pm.sample(
            1000, tune=0, chains=1, cores=1, step=step, random_seed=6, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    u = {True: [], False: []}
    for full, ell, lp, lq, m, log_a in records:
        s = z2 * 2.0 * c * m if full else z1 * 2.0 * np.log1p(n * c * m / lam)
        if s > 0 and np.isfinite(log_a):
            u[full].append((log_a - (ell + lp + lq - 0.5 * s * s)) / s)
    assert_standard_normal(u[True], "DPFastMH full-batch releases")
    assert_standard_normal(u[False], "DPFastMH minibatch releases")


def test_dpbarker_noise_tops_the_batch_variance_up_to_two(monkeypatch):
    """DPBarker (Heikkilä et al. 2019, thesis Theorem 8): the test's Gaussian noise has
    variance ``2 - sigma_b^2``, ``sigma_b^2`` the minibatch estimate's variance (at most 1
    after clipping), so that the total is the 2 the privacy theorem assumes. The generator
    the step passes to its test is traced (`_TracingGenerator`): the first normal draw of
    each test is that noise, its scale read off the factors it is multiplied by."""
    import pymc as pm
    from conftest import normal_mean_model

    import pymc_dp
    import pymc_dp.step_methods.barker as barker_step

    seen = []
    real = barker_step.barker_log_test

    def spy(lam, batch_var, log_prior_ratio, rng):
        log: list = []
        out = real(lam, batch_var, log_prior_ratio, _TracingGenerator(rng, log))
        draws = [e for kind, e in log if kind == "draw"]
        seen.append((float(batch_var), draws[0]["scale"], draws[0]["scaled"]))
        return out

    monkeypatch.setattr(barker_step, "barker_log_test", spy)
    model, *_ = normal_mean_model(n=200, d=1)
    with model:
        step = pymc_dp.DPBarker(tempering=0.05, batch_size=40)
        pm.sample(
            200, tune=0, chains=1, cores=1, step=step, random_seed=7, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    var, scale, scaled = map(np.array, zip(*seen, strict=True))
    assert len(seen) == 200 and scaled.all() and np.all(var <= 1.0 + 1e-12)
    assert var.max() > 0.1  # batch variances far from 0: a noise of variance 2 would fail
    np.testing.assert_allclose(scale**2 + var, 2.0, rtol=1e-12)


def test_dpsgld_gradient_releases_carry_noise_z_c(monkeypatch):
    """DPSGLD: each Poisson-minibatch gradient sum, clipped to norm ``C``, is released with
    N(0, (z C)^2) noise (add/remove neighbours: sensitivity ``C``) and divided by the
    sampling rate ``q``. A spy at the step's call reads the exact clipped sum, the prior
    gradient and the returned estimate: ``q (g - grad log prior) - sum`` over ``z C`` is
    N(0, 1) per coordinate."""
    import pymc as pm
    from conftest import normal_mean_model

    import pymc_dp.step_methods.sgmcmc as sgmcmc_step
    from pymc_dp import DPSGLD

    seen = []
    real = sgmcmc_step.noisy_gradient

    def spy(clipped_sum, prior_grad, sampling_rate, noise_std, rng):
        out = real(clipped_sum, prior_grad, sampling_rate, noise_std, rng)
        seen.append((np.array(clipped_sum), np.array(prior_grad), sampling_rate, np.array(out)))
        return out

    monkeypatch.setattr(sgmcmc_step, "noisy_gradient", spy)
    z, c, q = 0.8, 2.0, 0.2
    model, *_ = normal_mean_model(n=100, d=2)
    with model:
        step = DPSGLD(clip_bound=c, step_size=1e-3, sampling_rate=q, noise_multiplier=z)
        pm.sample(
            300, tune=0, chains=1, cores=1, step=step, random_seed=8, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    assert len(seen) == 300 and all(rate == q for _, _, rate, _ in seen)
    u = [(rate * (g - prior) - s) / (z * c) for s, prior, rate, g in seen]
    assert_standard_normal(np.concatenate(u), "DPSGLD gradient releases")


def test_subsampled_penalty_tests_carry_noise_z_c(monkeypatch):
    """DPSubsampledPenalty (thesis Sec. 4.1, Theorem 9): the released ``lambda^ -
    sigma_b^2 / 2 + xi`` has ``xi ~ N(0, (z c)^2)``, ``c = 2 n L h / b + kappa (n / b)^2
    L^2 h^2 (|1 - 1/b| + 2 (b - 1) / b)`` (ratios clipped to ``+- L h``, ``h`` the step's
    length, ``kappa = 1 - b / n``), written out here from the theorem. Spies at the
    transition (``h``) and at its log acceptance (``lambda^``, ``sigma_b^2``, the prior ratio)
    give the noise; over ``z c`` it is N(0, 1)."""
    import pymc as pm
    from conftest import normal_mean_model

    import pymc_dp.kernels.subsampled_penalty as sp_kernel
    import pymc_dp.step_methods.subsampled_penalty as sp_step
    from pymc_dp import DPSubsampledPenalty

    norms, tests = [], []
    real_transition = sp_step.subsampled_penalty_transition
    real_test = sp_kernel.subsampled_penalty_log_acceptance

    def spy_transition(rng, **kw):
        norms.append(kw["step_norm"])
        return real_transition(rng, **kw)

    def spy_test(lam, batch_var, log_prior_ratio, sigma, rng):
        out = real_test(lam, batch_var, log_prior_ratio, sigma, rng)
        tests.append((float(lam), float(batch_var), log_prior_ratio, float(out)))
        return out

    monkeypatch.setattr(sp_step, "subsampled_penalty_transition", spy_transition)
    monkeypatch.setattr(sp_kernel, "subsampled_penalty_log_acceptance", spy_test)
    n, b, clip, z = 200, 50, 20.0, 0.4  # L h ~ 1: the variance term is most of c
    model, *_ = normal_mean_model(n=n, d=1)
    with model:
        step = DPSubsampledPenalty(
            batch_size=b, clip_bound=clip, noise_multiplier=z, proposal_scale=0.05
        )
        pm.sample(
            400, tune=0, chains=1, cores=1, step=step, random_seed=9, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    assert len(norms) == len(tests) == 400
    kappa = 1.0 - b / n
    u = []
    for h, (lam, var, lp, log_a) in zip(norms, tests, strict=True):
        lh = clip * h
        c = 2.0 * n * lh / b + kappa * (n / b) ** 2 * lh**2 * (abs(1 - 1 / b) + 2 * (b - 1) / b)
        s = z * c
        if s > 0 and np.isfinite(log_a):
            u.append((log_a - (lam - 0.5 * var + lp - 0.5 * s * s)) / s)
    assert_standard_normal(u, "DPSubsampledPenalty tests")
