"""Empirical privacy audit: a statistical lower bound on a mechanism's epsilon.

One iteration of a step's mechanism is run many times from a fixed state on two
neighbouring datasets D and D' that differ in one adversarially chosen record. For every
event the published output reveals (accept/reject; threshold events on a published
continuous value), Clopper-Pearson bounds on the event's probabilities give a lower bound

$$
\\hat\\epsilon = \\ln \\frac{\\underline{p}_D - \\delta}{\\overline{p}_{D'}}
$$

that holds with the stated confidence; it is maximised over events and both directions
(Jagielski, Ullman & Oprea 2020; Nasr et al. 2021). Confidence is Bonferroni-corrected over
all events tested, so the bound is sound simultaneously for all of them. A correct
mechanism never has ``eps_lb`` above its claimed epsilon (up to the confidence level); a
broken one (clipping removed, noise too small, the noise-free "privacy for free" rule)
does, which is what the tests check.

References
----------
.. [1] Jagielski, M., Ullman, J. and Oprea, A. (2020). Auditing differentially private
   machine learning: how private is private SGD? NeurIPS.
.. [2] Nasr, M., Song, S., Thakurta, A., Papernot, N. and Carlini, N. (2021). Adversary
   instantiation: lower bounds for differentially private machine learning. IEEE S&P.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "AuditResult",
    "clopper_pearson",
    "empirical_epsilon",
    "audit_mechanism",
    "stats_runner",
    "stats_scenarios",
    "groupstats_scenarios",
]


def clopper_pearson(k: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided exact (Clopper-Pearson) ``1 - alpha`` interval for a binomial proportion."""
    k = np.asarray(k, dtype=float)
    lo = np.where(k > 0, stats.beta.ppf(alpha / 2, k, n - k + 1), 0.0)
    hi = np.where(k < n, stats.beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return lo, hi


@dataclass(frozen=True)
class AuditResult:
    """Outcome of an audit.

    Attributes
    ----------
    eps_lb : float
        Lower bound on epsilon at ``delta`` holding with confidence ``1 - alpha`` (0 when no
        event separates the two datasets).
    event : str
        The event that attains it.
    delta, alpha : float
    trials : int
        Runs of the mechanism per dataset.
    n_events : int
        Events tested (Bonferroni factor).
    """

    eps_lb: float
    event: str
    delta: float
    alpha: float
    trials: int
    n_events: int


def _threshold_events(
    a: np.ndarray, b: np.ndarray, n_thresholds: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Events {x <= t} and {x > t} for thresholds at quantiles of the pooled outputs."""
    pooled = np.concatenate([a, b])
    pooled = pooled[np.isfinite(pooled)]
    if pooled.size == 0:
        return {}
    qs = np.unique(np.quantile(pooled, np.linspace(0.0005, 0.9995, n_thresholds)))
    out = {}
    for t in qs:
        out[f"<= {t:.6g}"] = (a <= t, b <= t)
        out[f"> {t:.6g}"] = (a > t, b > t)
    return out


def empirical_epsilon(
    outputs_d: Mapping[str, np.ndarray],
    outputs_d2: Mapping[str, np.ndarray],
    delta: float,
    *,
    alpha: float = 0.05,
    n_thresholds: int = 64,
) -> AuditResult:
    """Lower bound on epsilon from the outputs of a mechanism on two neighbouring datasets.

    Parameters
    ----------
    outputs_d, outputs_d2 : mapping of name -> array of shape (trials,)
        What the mechanism published in each trial on D and on D'. Boolean arrays are events
        themselves (and their complements); other arrays give threshold events.
    delta : float
        The delta of the claim being audited.
    alpha : float
        One minus the confidence level, shared by all events (Bonferroni).
    """
    events: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    trials = None
    for name, a in outputs_d.items():
        a = np.asarray(a)
        b = np.asarray(outputs_d2[name])
        trials = a.size if trials is None else trials
        if a.size != trials or b.size != trials:
            raise ValueError("every output needs the same number of trials on D and D'")
        if a.dtype == bool:
            events[f"{name}"] = (a, b)
            events[f"not {name}"] = (~a, ~b)
        else:
            for ev, pair in _threshold_events(
                a.astype(float), b.astype(float), n_thresholds
            ).items():
                events[f"{name} {ev}"] = pair
    if not events:
        raise ValueError("no outputs to audit")
    n_tests = 2 * len(events)  # both directions
    best, best_event = 0.0, "none"
    for name, (ea, eb) in events.items():
        ka, kb = int(ea.sum()), int(eb.sum())
        for k1, k2, label in ((ka, kb, "D vs D'"), (kb, ka, "D' vs D")):
            # one-sided bounds at level alpha / n_tests each, for p1 (lower) and p2 (upper)
            lo, _ = clopper_pearson(np.array(k1), trials, 2 * alpha / (2 * n_tests))
            _, hi = clopper_pearson(np.array(k2), trials, 2 * alpha / (2 * n_tests))
            num = float(lo) - delta
            if num > 0 and hi > 0:
                eps = float(np.log(num / float(hi)))
                if eps > best:
                    best, best_event = eps, f"{name} ({label})"
    return AuditResult(
        eps_lb=best,
        event=best_event,
        delta=float(delta),
        alpha=float(alpha),
        trials=int(trials),
        n_events=n_tests,
    )


def audit_mechanism(
    run: Callable[[bool, int, np.random.Generator], Mapping[str, np.ndarray]],
    delta: float,
    *,
    trials: int = 200_000,
    seed: int = 0,
    alpha: float = 0.05,
) -> AuditResult:
    """Run ``run(on_d2, trials, rng)`` on D (False) and D' (True) and bound epsilon.

    ``run`` performs ``trials`` independent iterations of the mechanism from a fixed state
    (vectorised) and returns the published outputs.
    """
    rng = np.random.default_rng(seed)
    rng_d, rng_d2 = rng.spawn(2)
    return empirical_epsilon(
        run(False, trials, rng_d), run(True, trials, rng_d2), delta, alpha=alpha
    )


# -- mechanisms of the step methods, one iteration from a fixed state -----------------------------


def penalty_runner(
    fns_d,
    fns_d2,
    q: np.ndarray,
    q_new: np.ndarray,
    *,
    clip_bound: float,
    noise_multiplier: float,
    noise_scale: float = 1.0,
    clip: bool = True,
    control_variate: tuple | None = None,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPPenaltyMetropolis iteration (fixed state and proposal) on D and D'.

    With ``control_variate=(anchor, grad_sum, grad_bound)`` the test is the automatic mode's:
    clipped residuals after the first-order control variate plus ``grad_sum . dq`` (a
    released value, the same on D and D').

    The clipped log-likelihood ratios are computed by the real per-record model functions of
    the two datasets (`pymc_dp.records.RecordFunctions`); the noise and the decision by
    the step's kernel. Published outputs: the accept bit and the ``accept`` stat (the noisy
    acceptance probability). ``noise_scale`` and ``clip`` exist to build deliberately broken
    variants (noise smaller than claimed; clipping removed) that the audit must catch.
    """
    from pymc_dp.kernels.penalty import accept, penalty_log_acceptance, penalty_noise_std

    norm = float(np.linalg.norm(q_new - q))
    bound = clip_bound * norm if clip else np.inf
    if control_variate is None:
        llr = {
            False: fns_d.clipped_loglik_ratio_sum(q_new, q, bound)[0],
            True: fns_d2.clipped_loglik_ratio_sum(q_new, q, bound)[0],
        }
    else:
        anchor, grad_sum, grad_bound = control_variate
        lin = float(np.asarray(grad_sum) @ (q_new - q))
        llr = {
            k: f.clipped_residual_ratio_sum(q_new, q, bound, anchor, grad_bound)[0] + lin
            for k, f in ((False, fns_d), (True, fns_d2))
        }
    lpr = fns_d.prior_logp(q_new) - fns_d.prior_logp(q)
    sigma = penalty_noise_std(noise_multiplier, clip_bound, norm) * noise_scale

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        log_a = penalty_log_acceptance(np.full(trials, llr[on_d2]), lpr, 0.0, sigma, rng)
        return {"accepted": accept(log_a, rng), "accept": np.exp(np.minimum(0.0, log_a))}

    return run


def hmc_runner(
    fns_d,
    fns_d2,
    q: np.ndarray,
    p: np.ndarray,
    *,
    step_size: float,
    n_leapfrog: int,
    grad_clip_bound: float,
    llr_clip_bound: float,
    grad_noise_multiplier: float,
    llr_noise_multiplier: float,
    noise_scale: float = 1.0,
    clip: bool = True,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPHMC iteration (fixed position and momentum, unit mass) on D and D'.

    Runs the step's own kernels (`pymc_dp.kernels.hmc.noisy_leapfrog`, the penalty
    test) with the real clipped per-record gradient and ratio sums of the two datasets, once
    per trial (the trajectory depends on each trial's noise, so trials are a loop; keep
    ``n_leapfrog`` small). Published outputs: the next position (coordinate 0), the proposal's
    step length (the ``step_norm`` stat), the accept bit and the noisy acceptance probability.
    """
    from pymc_dp.kernels.hmc import gradient_noise_std, kinetic_energy, noisy_leapfrog
    from pymc_dp.kernels.penalty import accept, penalty_log_acceptance, penalty_noise_std

    inv_mass = np.ones_like(q)
    g_bound = grad_clip_bound if clip else np.inf
    sigma_g = gradient_noise_std(grad_noise_multiplier, grad_clip_bound) * noise_scale

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        fns = fns_d2 if on_d2 else fns_d

        def grad_fn(x: np.ndarray) -> np.ndarray:
            return fns.clipped_grad_sum(x, g_bound)[0] + fns.prior_logp_and_grad(x)[1]

        out = {k: np.empty(trials) for k in ("q0", "step_norm", "accept")}
        acc = np.empty(trials, dtype=bool)
        lp0 = fns.prior_logp(q)
        for t in range(trials):
            traj = noisy_leapfrog(q, p, step_size, n_leapfrog, grad_fn, inv_mass, sigma_g, rng)
            norm = float(np.linalg.norm(traj.q - q))
            bound = llr_clip_bound * norm if clip else np.inf
            llr = fns.clipped_loglik_ratio_sum(traj.q, q, bound)[0]
            sigma_l = penalty_noise_std(llr_noise_multiplier, llr_clip_bound, norm) * noise_scale
            dk = kinetic_energy(p, inv_mass) - kinetic_energy(traj.p, inv_mass)
            log_a = penalty_log_acceptance(llr, fns.prior_logp(traj.q) - lp0, dk, sigma_l, rng)
            acc[t] = accept(log_a, rng)
            out["q0"][t] = traj.q[0] if acc[t] else q[0]
            out["step_norm"][t] = norm
            out["accept"][t] = np.exp(min(0.0, log_a))
        out["accepted"] = acc
        return out

    return run


def fastmh_runner(
    step_d, step_d2, q: np.ndarray, q_new: np.ndarray
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPFastMH iteration (fixed state and proposal) on D and D'.

    ``step_d`` and ``step_d2`` are `pymc_dp.DPFastMH` steps with identical settings
    built on the two neighbouring datasets; the runner calls the step's own transition kernel
    (`pymc_dp.kernels.fastmh.fastmh_transition`) with each step's data access, once per
    trial. Published outputs: the accept bit and the ``accept`` stat (NaN in noise-free
    iterations, where it is not published).
    """
    from pymc_dp.kernels.fastmh import fastmh_transition

    M = min(float(np.linalg.norm(q_new - q)), step_d.max_step)
    lpr = step_d._fns.prior_logp(q_new) - step_d._fns.prior_logp(q)

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        step = step_d2 if on_d2 else step_d
        acc = np.empty(trials, dtype=bool)
        stat = np.empty(trials)
        for t in range(trials):
            info = fastmh_transition(
                rng,
                step._settings,
                step._sampler,
                step_norm=M,
                log_prior_ratio=lpr,
                log_proposal_ratio=0.0,
                minibatch_ratios=lambda idx, s=step: s._minibatch_ratios(q_new, q, idx),
                fullbatch_clipped_sum=lambda m, s=step: s._fullbatch_clipped_sum(q_new, q, m),
                n_records=step._fns.n_records,
            )
            acc[t] = info.accepted
            stat[t] = np.nan if info.noise_free else np.exp(min(0.0, info.log_accept))
        return {"accepted": acc, "accept": stat}

    return run


# -- the standard audit scenarios (used by the tests and by benchmarks/audit_table.py) ----------


@dataclass(frozen=True)
class Scenario:
    """One audit: a step's mechanism (or a deliberately broken variant) and its claim.

    Attributes
    ----------
    step, variant : str
    claimed_epsilon, delta : float
        The per-iteration guarantee the accountant claims (for a broken variant: the claim of
        the correct mechanism it pretends to be).
    must_hold : bool
        True for a correct mechanism (``eps_lb <= claimed_epsilon``), False for a broken one
        (the audit must find ``eps_lb > claimed_epsilon``).
    make_runner : callable
        Builds the runner (compiles the model functions; a few seconds).
    trials : int
        Default number of trials per dataset.
    """

    step: str
    variant: str
    claimed_epsilon: float
    delta: float
    must_hold: bool
    make_runner: Callable[[], Callable]
    trials: int


def _normal_record_functions(first_record: float):
    """A 1-parameter normal model on 10 records whose record 0 is the one that differs."""
    import pymc as pm

    from pymc_dp.records import build_record_functions

    x = np.linspace(-1.0, 1.0, 10)
    x[0] = first_record
    with pm.Model() as model:
        t = pm.Normal("t", 0, 3)
        pm.Normal("x", t, 1, observed=x)
    return build_record_functions(model, model.value_vars, model.initial_point())[0]


def _fastmh_steps(**kwargs):
    import warnings

    import pymc as pm

    from pymc_dp.step_methods.fastmh import DPFastMH

    steps = []
    for first in (-100.0, 100.0):
        x = np.linspace(-1.0, 1.1, 10)  # the others sit around the proposal's midpoint
        x[0] = first
        with pm.Model(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = pm.Normal("t", 0, 3)
            pm.Normal("x", t, 1, observed=x)
            steps.append(
                DPFastMH(clip_bound=3.0, iter_epsilon=1.0, iter_delta=1e-5, max_step=0.1, **kwargs)
            )
    return steps


def standard_scenarios() -> list[Scenario]:
    """Every step's mechanism and the broken variants the audit must catch.

    Neighbouring datasets: record 0 is +100 in D and -100 in D' (its clipped ratio and
    gradient sit at +bound in D and at -bound in D' for a proposal that moves upward).
    """
    from pymc_dp.accounting import gaussian_epsilon

    delta = 1e-5
    q, q_new = np.array([0.0]), np.array([0.3])

    def neighbours():
        return _normal_record_functions(100.0), _normal_record_functions(-100.0)

    def penalty(**broken):
        return lambda: penalty_runner(
            *neighbours(), q, q_new, clip_bound=2.0, noise_multiplier=1.0, **broken
        )

    z_hmc = 2.0
    hmc_kw = dict(step_size=0.05, n_leapfrog=1, grad_clip_bound=2.0, llr_clip_bound=2.0)

    def hmc(**broken):
        return lambda: hmc_runner(
            *neighbours(), np.array([0.0]), np.array([0.5]),
            grad_noise_multiplier=z_hmc, llr_noise_multiplier=z_hmc, **hmc_kw, **broken,
        )  # fmt: skip

    def fastmh(**kwargs):
        def make():
            d, d2 = _fastmh_steps(**kwargs)
            return fastmh_runner(d, d2, np.array([0.0]), np.array([0.1]))

        return make

    pen_claim = gaussian_epsilon(1 / (2 * 1.0**2), delta)
    hmc_claim = gaussian_epsilon(1 / (2 * z_hmc**2) + 2 / (2 * z_hmc**2), delta)
    return [
        Scenario("DPPenaltyMetropolis", "as shipped", pen_claim, delta, True, penalty(), 400_000),
        Scenario(
            "DPPenaltyMetropolis", "noise scale halved", pen_claim, delta, False,
            penalty(noise_scale=0.5), 400_000,
        ),
        Scenario(
            "DPPenaltyMetropolis", "clipping removed", pen_claim, delta, False,
            penalty(clip=False), 400_000,
        ),
        Scenario("DPHMC", "as shipped (L = 1)", hmc_claim, delta, True, hmc(), 20_000),
        Scenario("DPHMC", "clipping removed", hmc_claim, delta, False, hmc(clip=False), 20_000),
        Scenario(
            "DPFastMH", "as shipped, full batch", 1.0, delta, True, fastmh(max_batch=1), 50_000
        ),
        Scenario("DPFastMH", "as shipped, minibatch", 1.0, delta, True, fastmh(), 50_000),
        Scenario(
            "DPFastMH", "paper's privacy for free", 1.0, delta, False,
            fastmh(max_batch=1, privacy_for_free=True), 50_000,
        ),
        *expfam_scenarios(),
        *auto_scenarios(),
        *stats_scenarios(),
        *groupstats_scenarios(),
    ]  # fmt: skip


# -- the automatic mode's pre-sampling mechanisms ----------------------------------------------


def histogram_runner(
    fns_d, fns_d2, q: np.ndarray, grid: np.ndarray, *, noise_multiplier: float, noise_scale=1.0
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """The clip-selection histogram of the gradient norms at ``q`` on D and D'.

    The exact bins come from the real record functions (`clipped_grad_sum` counts); the
    noise from `pymc_dp.kernels.warmstart`. Published: every noisy bin and the chosen bound;
    the audit's best event is a threshold on the difference of the two bins record 0 moves
    between (the likelihood-ratio test of a Gaussian mechanism).
    """
    from pymc_dp.kernels.warmstart import HISTOGRAM_SENSITIVITY, histogram_from_counts

    hists = {
        k: histogram_from_counts(
            f.n_records, np.array([f.clipped_grad_sum(q, float(b))[1] for b in grid])
        )
        for k, f in ((False, fns_d), (True, fns_d2))
    }
    moved = np.nonzero(hists[False] != hists[True])[0]
    std = noise_multiplier * HISTOGRAM_SENSITIVITY * noise_scale

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        noisy = hists[on_d2] + rng.normal(size=(trials, grid.size + 1)) * std
        out = {f"bin {j}": noisy[:, j] for j in moved}
        if moved.size == 2:
            out["bin difference"] = noisy[:, moved[0]] - noisy[:, moved[1]]
        return out

    return run


def outer_runner(
    fns_d,
    fns_d2,
    q: np.ndarray,
    *,
    bound: float,
    noise_multiplier: float,
    noise_scale=1.0,
    centred: bool = False,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """The warm start's clipped gradient and outer-product sums at ``q`` on D and D'.

    Published: the noisy gradient sum and the noisy outer-product sum (1 x 1 here), each a
    Gaussian release with noise multiplier ``noise_multiplier``; the auditor also thresholds
    their likelihood-ratio statistic (the optimal test of the pair). With ``centred`` the
    second release is the one of the warm start's Newton steps
    (`pymc_dp.kernels.warmstart.private_laplace`): its outer products are of ``c_i - m``,
    ``m`` the first release over ``n`` (adaptive: a new centre in every trial), clipped at
    ``min(b + |m|, 2 b)``, with the noise of that bound; the likelihood-ratio statistic is
    then that of the second release given the first.
    """
    from pymc_dp.kernels.warmstart import OUTER_SENSITIVITY

    sums = {k: f.clipped_grad_moments(q, bound) for k, f in ((False, fns_d), (True, fns_d2))}
    std1 = noise_multiplier * 2.0 * bound * noise_scale
    std2 = noise_multiplier * OUTER_SENSITIVITY * bound * bound * noise_scale

    diff1 = float(sums[True][0][0] - sums[False][0][0]) / std1**2
    diff2 = float(sums[True][1][0, 0] - sums[False][1][0, 0]) / std2**2
    # the records' clipped gradients (1-d): the centred sums are recomputed per trial
    clipped = {
        k: np.clip(f.per_record_grad(q)[:, 0], -bound, bound)
        for k, f in ((False, fns_d), (True, fns_d2))
    }

    def centred_sum(c: np.ndarray, m: np.ndarray, b2: np.ndarray) -> np.ndarray:
        e = np.clip(c[None, :] - m[:, None], -b2[:, None], b2[:, None])
        return np.sum(e * e, axis=1)

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        s1, s2 = sums[on_d2]
        g = float(s1[0]) + rng.normal(size=trials) * std1
        if not centred:
            o = float(s2[0, 0]) + rng.normal(size=trials) * std2
            return {
                "gradient sum": g, "outer-product sum": o, "LR statistic": diff1 * g + diff2 * o
            }  # fmt: skip
        m = g / clipped[on_d2].size
        b2 = np.minimum(bound + np.abs(m), 2.0 * bound)
        mu0, mu1 = (centred_sum(clipped[k], m, b2) for k in (False, True))
        sd2 = noise_multiplier * OUTER_SENSITIVITY * b2 * b2 * noise_scale
        o = (mu1 if on_d2 else mu0) + rng.normal(size=trials) * sd2
        lr = diff1 * g + (mu1 - mu0) / sd2**2 * (o - 0.5 * (mu0 + mu1))
        return {"gradient sum": g, "centred outer-product sum": o, "LR statistic": lr}

    return run


def oneshot_runner(
    fns_d, fns_d2, q: np.ndarray, *, bound: float, noise_multiplier: float
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """The one-shot strategy's last release on D and D', through the library's own call
    (`pymc_dp.auto.oneshot.release_gradient_sum`): a change of its noise shows here.

    Published: the noisy clipped gradient sum (1-d here); the auditor also thresholds its
    likelihood-ratio statistic.
    """
    from pymc_dp.auto.oneshot import release_gradient_sum

    exact = {k: f.clipped_grad_moments(q, bound)[0] for k, f in ((False, fns_d), (True, fns_d2))}
    diff = float(exact[True][0] - exact[False][0])

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        fns = fns_d2 if on_d2 else fns_d
        g = release_gradient_sum(fns, q, bound, None, noise_multiplier, rng, size=trials)[:, 0]
        return {"gradient sum": g, "LR statistic": diff * g}

    return run


def tail_runner(
    fns_d, fns_d2, q: np.ndarray, *, bound: float, noise_multiplier: float
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """The one-shot strategy's release of the gradient norms' excess beyond its clip bound
    on D and D', through the library's own call (`pymc_dp.auto.oneshot.release_tail_excess`).

    Published: the noisy levels; the auditor also thresholds their likelihood-ratio
    statistic (the levels' difference between D and D' dotted with the release).
    """
    from pymc_dp.auto.oneshot import release_tail_excess

    rng0 = np.random.default_rng(0)
    exact = {
        k: release_tail_excess(f, q, bound, None, 0.0, rng0)
        for k, f in ((False, fns_d), (True, fns_d2))
    }
    diff = exact[True] - exact[False]

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        fns = fns_d2 if on_d2 else fns_d
        x = release_tail_excess(fns, q, bound, None, noise_multiplier, rng, size=trials)
        return {"level 0": x[:, 0], "LR statistic": x @ diff}

    return run


def _student_record_functions(first_record: float):
    """A 1-parameter Student-t location model (nu = 3, sigma 1) on 10 records whose record 0
    is the one that differs: its per-record curvature ``4 (3 - r^2) / (3 + r^2)^2`` is
    positive at the location (``r = 0``: 4/3) and negative beyond ``sqrt 3`` (-1/6 at ``r =
    3``)."""
    import pymc as pm

    from pymc_dp.records import build_record_functions

    x = np.linspace(-1.0, 1.0, 10)
    x[0] = first_record
    with pm.Model() as model:
        t = pm.Normal("t", 0, 3)
        pm.StudentT("x", nu=3.0, mu=t, sigma=1.0, observed=x)
    return build_record_functions(model, model.value_vars, model.initial_point())[0]


def hessian_runner(
    fns_d, fns_d2, q: np.ndarray, *, bound: float, noise_multiplier: float, noise_scale=1.0
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """The one-shot warm start's clipped per-record Hessians' sum at ``q`` on D and D' (1 x 1
    here), through the library's own sum (`pymc_dp.auto.configure._Coordinates.hessians`)
    and noise (`pymc_dp.kernels.warmstart.hessian_noise_std`, symmetric noise as the warm
    start adds it). Published: the noisy sum; the auditor also thresholds its
    likelihood-ratio statistic. ``noise_scale`` builds the broken variant.
    """
    from pymc_dp.auto.configure import _Coordinates
    from pymc_dp.kernels.warmstart import _sym_noise, hessian_noise_std

    exact = {
        k: float(_Coordinates(f, None).hessians(q, bound)[0, 0])
        for k, f in ((False, fns_d), (True, fns_d2))
    }
    std = hessian_noise_std(noise_multiplier, bound) * noise_scale
    diff = (exact[True] - exact[False]) / std**2

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        noise = np.array([_sym_noise(1, std, rng)[0, 0] for _ in range(trials)])
        h = exact[on_d2] + noise
        return {"Hessian sum": h, "LR statistic": diff * h}

    return run


def auto_scenarios() -> list[Scenario]:
    """The automatic mode's mechanisms as shipped, and with the noise halved (caught).

    Neighbours: record 0 is 0.3 in D and 100 in D' (its gradient norm moves across the grid,
    and it is clipped in D' only).
    """
    from pymc_dp.accounting import gaussian_epsilon
    from pymc_dp.kernels.warmstart import clip_grid

    delta = 1e-5
    grid = clip_grid(0.1, 1000.0, 9)

    def neighbours():
        return _normal_record_functions(0.3), _normal_record_functions(100.0)

    def hist(**broken):
        return lambda: histogram_runner(
            *neighbours(), np.array([0.0]), grid, noise_multiplier=1.0, **broken
        )

    def outer(**broken):
        # record 0 at -100 / +100: its clipped gradient is -b / +b (the sum's sensitivity);
        # ``centred=True``: the Newton steps' centred outer products
        return lambda: outer_runner(
            _normal_record_functions(-100.0), _normal_record_functions(100.0), np.array([0.0]),
            bound=2.0, noise_multiplier=np.sqrt(2.0), **broken,
        )  # fmt: skip

    def cv_penalty(**broken):
        def make():
            d, d2 = neighbours()
            cv = (np.array([0.1]), np.array([1.0]), 2.0)
            return penalty_runner(
                d, d2, np.array([0.0]), np.array([0.3]), clip_bound=2.0, noise_multiplier=1.0,
                control_variate=cv, **broken,
            )  # fmt: skip

        return make

    def oneshot(claimed_z: float = 1.0):
        # record 0 at -100 / +100: its clipped gradient is -b / +b (the sensitivity 2 b);
        # ``claimed_z`` below 1: the release runs with less noise than the claim's
        return lambda: oneshot_runner(
            _normal_record_functions(-100.0), _normal_record_functions(100.0), np.array([0.0]),
            bound=2.0, noise_multiplier=claimed_z,
        )  # fmt: skip

    def tail(claimed_z: float = 1.0):
        # record 0 at 0.3 / 100: below the bound 2 in D, beyond 2, 4 and 8 times it in D'
        # (it counts 1 in each level: the sensitivity sqrt(3))
        return lambda: tail_runner(
            *neighbours(), np.array([0.0]), bound=2.0, noise_multiplier=claimed_z
        )

    def hessian(**broken):
        # record 0 at the location / 3 sds out: its curvature 4/3 / -1/6, clipped at 0.1 to
        # +0.1 / -0.1 (the sensitivity 2 B, attained)
        return lambda: hessian_runner(
            _student_record_functions(0.0), _student_record_functions(3.0), np.array([0.0]),
            bound=0.1, noise_multiplier=1.0, **broken,
        )  # fmt: skip

    one = gaussian_epsilon(1 / (2 * 1.0**2), delta)
    # two releases (gradient sum, outer-product sum) with noise multiplier sqrt(2) each
    two = gaussian_epsilon(2 / (2 * 2.0), delta)
    return [
        Scenario("auto: clip histogram", "as shipped", one, delta, True, hist(), 400_000),
        Scenario(
            "auto: clip histogram", "noise scale halved", one, delta, False,
            hist(noise_scale=0.5), 400_000,
        ),
        Scenario("auto: warm-start sums", "as shipped", two, delta, True, outer(), 400_000),
        # in one dimension record 0 moves only the gradient sum (c = -b or +b, c^2 = b^2 in
        # both), so the audit sees half the claimed loss; noise / 3 is caught, / 2 is not
        Scenario(
            "auto: warm-start sums", "noise scale divided by 3", two, delta, False,
            outer(noise_scale=1 / 3), 400_000,
        ),
        # centred on the first release, the outer products move with record 0 too: the
        # audit sees more of the claimed loss (noise / 2 is found at 4.34, just under it)
        Scenario(
            "auto: warm-start sums, centred", "as shipped", two, delta, True,
            outer(centred=True), 400_000,
        ),
        Scenario(
            "auto: warm-start sums, centred", "noise scale divided by 3", two, delta, False,
            outer(centred=True, noise_scale=1 / 3), 400_000,
        ),
        Scenario(
            "auto: control-variate penalty test", "as shipped", one, delta, True, cv_penalty(),
            400_000,
        ),
        Scenario(
            "auto: one-shot gradient sum", "as shipped", one, delta, True, oneshot(), 400_000
        ),
        Scenario(
            "auto: one-shot gradient sum", "noise scale halved", one, delta, False,
            oneshot(0.5), 400_000,
        ),
        Scenario(
            "auto: one-shot tail excess", "as shipped", one, delta, True, tail(), 400_000
        ),
        Scenario(
            "auto: one-shot tail excess", "noise scale halved", one, delta, False,
            tail(0.5), 400_000,
        ),
        Scenario(
            "auto: control-variate penalty test", "clipping removed", one, delta, False,
            cv_penalty(clip=False), 400_000,
        ),
        Scenario(
            "auto: one-shot Hessian sum", "as shipped", one, delta, True, hessian(), 400_000
        ),
        Scenario(
            "auto: one-shot Hessian sum", "noise scale halved", one, delta, False,
            hessian(noise_scale=0.5), 400_000,
        ),
    ]  # fmt: skip


# -- DPExpFamilyPenalty --------------------------------------------------------------------------


def expfam_runner(
    step_d, step_d2, q: np.ndarray, q_new: np.ndarray, *, noise_scale: float = 1.0
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPExpFamilyPenalty iteration (fixed state and proposal) on D and D'.

    ``step_d`` and ``step_d2`` are `pymc_dp.DPExpFamilyPenalty` steps with identical
    settings built on the two neighbouring datasets (each computed its clipped statistic
    ``S`` in its own data pass); the runner draws ``trials`` fresh releases of ``S`` through
    the step's kernel (`pymc_dp.kernels.expfam.expfam_log_acceptance`). Published
    outputs: the accept bit and the ``accept`` stat. ``noise_scale`` builds the deliberately
    broken variant (noise smaller than claimed).
    """
    from pymc_dp.kernels.expfam import expfam_log_acceptance
    from pymc_dp.kernels.penalty import accept

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        step = step_d2 if on_d2 else step_d
        eta0, a0, lp0 = step._point(q)
        eta1, a1, lp1 = step._point(q_new)
        log_a = expfam_log_acceptance(
            step._stat_sum,
            eta1 - eta0,
            step._expfam.n_records * (a1 - a0),
            lp1 - lp0,
            0.0,
            step.stat_noise_std * noise_scale,
            rng,
            size=trials,
        )
        return {"accepted": accept(log_a, rng), "accept": np.exp(np.minimum(0.0, log_a))}

    return run


def _expfam_steps(noise_multiplier: float = 1.0, stat_clip_bound: float = 2.0):
    """Two DPExpFamilyPenalty steps on a 2-d MvNormal mean, 10 records; record 0 is
    (+100, 0) in D and (-100, 0) in D' (its statistic T = x is clipped to (+-C, 0))."""
    import warnings

    import pymc as pm

    from pymc_dp.step_methods.expfam import DPExpFamilyPenalty

    steps = []
    for first in (100.0, -100.0):
        x = np.column_stack([np.linspace(-1.0, 1.0, 10), np.linspace(0.5, -0.5, 10)])
        x[0] = (first, 0.0)
        with pm.Model(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mu = pm.Normal("mu", 0, 3, size=2)
            pm.MvNormal("x", mu=mu, cov=np.eye(2), observed=x)
            steps.append(
                DPExpFamilyPenalty(
                    noise_multiplier=noise_multiplier, stat_clip_bound=stat_clip_bound
                )
            )
    return steps


def expfam_scenarios() -> list[Scenario]:
    """DPExpFamilyPenalty as shipped and with its noise halved (must be caught).

    The proposal moves along the first axis, the direction in which the clipped statistic of
    record 0 differs by ``2C`` between D and D', so the audit can approach the claim.
    """
    from pymc_dp.accounting import gaussian_epsilon

    delta = 1e-5
    q, q_new = np.array([0.0, 0.0]), np.array([0.3, 0.0])

    def expfam(**broken):
        def make():
            d, d2 = _expfam_steps()
            return expfam_runner(d, d2, q, q_new, **broken)

        return make

    claim = gaussian_epsilon(1 / (2 * 1.0**2), delta)
    return [
        Scenario("DPExpFamilyPenalty", "as shipped", claim, delta, True, expfam(), 400_000),
        Scenario(
            "DPExpFamilyPenalty", "noise scale halved", claim, delta, False,
            expfam(noise_scale=0.5), 400_000,
        ),
    ]  # fmt: skip


# -- the automatic mode's sufficient-statistics strategy ----------------------------------------


def _linear_passes(first: tuple[float, float]):
    """The statistics' passes of a 1-covariate linear regression on 10 records whose record
    0 is ``first`` = (y, x), and the statistics' ranges in the box y in [-6, 6], x in [-1, 1]
    (`pymc_dp.auto.suffstats.linear_stats_model`)."""
    import warnings

    import pymc as pm

    from pymc_dp.auto.suffstats import linear_stats_model

    x = np.linspace(-1.0, 1.0, 10)
    y = 0.5 * x + np.linspace(0.3, -0.3, 10)
    y[0], x[0] = first
    with pm.Model() as model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        X = pm.Data("X", x[:, None])
        b = pm.Normal("b", 0, 3, shape=1)
        pm.Normal("y", pm.Normal("a", 0, 3) + pm.math.dot(X, b), 1.0, observed=y)
    bounds = {"y": (-6.0, 6.0), "X": (-1.0, 1.0)}
    fm, box = linear_stats_model(model, model.value_vars, model.initial_point(), bounds)
    return fm.passes(), box


def stats_runner(
    first_d: tuple[float, float],
    first_d2: tuple[float, float],
    *,
    which: str,
    noise_multiplier: float,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """A release of the sufficient-statistics strategy on D and D', through the library's
    own calls (`pymc_dp.auto.suffstats.release_box_centre` for ``which="centre"``,
    `release_whitened_sum` for ``which="sum"``, `pymc_dp.kernels.expfam.private_tail_excess`
    on the strategy's ``STATS_TAIL_LEVELS`` levels of a bound 1 for ``which="tail"``): a
    change of their noise shows here.

    Published: every coordinate of the release; the auditor also thresholds its
    likelihood-ratio statistic. The whitened sum's centre is public and fixed halfway between
    record 0's statistics in D and in D', so that their clipped deviations are opposite and
    the sum moves by its full sensitivity ``2 b``. For the tail's excess the centre is record
    0's statistics in D' (it adds nothing to any level there) and record 0 in D lies beyond
    every level's twice (it adds 1 to each): the excess moves by its full ``sqrt(J)``.
    """
    from pymc_dp.auto.suffstats import (
        STATS_TAIL_LEVELS,
        release_box_centre,
        release_whitened_sum,
    )
    from pymc_dp.kernels.expfam import Whitening, normal_linear_stats, private_tail_excess

    (p_d, box), (p_d2, _) = _linear_passes(first_d), _linear_passes(first_d2)
    rows = [
        normal_linear_stats(np.array([f[0]]), np.array([[f[1]]]))[0] for f in (first_d, first_d2)
    ]
    centre = rows[1] if which == "tail" else 0.5 * (rows[0] + rows[1])
    wh = Whitening(centre=centre, scale=np.eye(rows[0].size), clip=1.0, releases=0)
    levels = 2.0 ** np.arange(STATS_TAIL_LEVELS)

    def release(passes, z, rng, size=None):
        if which == "centre":
            return release_box_centre(passes, box, 10, z, rng, size=size)[0]
        if which == "tail":
            return private_tail_excess(passes, wh.centre, wh.scale, levels, z, rng, size=size)
        return release_whitened_sum(passes, wh, z, rng, size=size)

    zero = np.random.default_rng(0)
    exact = {k: release(p, 0.0, zero) for k, p in ((False, p_d), (True, p_d2))}
    _, sd = release_box_centre(p_d, box, 10, 1.0, zero)
    if which == "centre":
        std = sd
    else:
        sens = np.sqrt(levels.size) if which == "tail" else 2.0 * wh.clip
        std = np.full(exact[False].size, sens)
    diff = (exact[True] - exact[False]) / std**2

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = release(p_d2 if on_d2 else p_d, noise_multiplier, rng, size=trials)
        res = {f"statistic {j}": out[:, j] for j in range(out.shape[1])}
        res["LR statistic"] = out @ diff
        return res

    return run


def stats_scenarios() -> list[Scenario]:
    """The sufficient-statistics strategy's box-scaled centre, whitened sum and tail excess as
    shipped, and with less noise than claimed (caught). Record 0 is (6, 1) in D and (-6, -1) in D'
    for the centre (a corner of the box and its opposite: the scaled deviations differ by
    ``2 sqrt 2`` of the claimed ``2 sqrt 5``, since no record reaches opposite ends of ``y``
    and ``y^2`` together), (100, 50) and (-100, -50) for the whitened sum (both far outside
    and clipped, opposite about the public centre: its full ``2 b``)."""
    from pymc_dp.accounting import gaussian_epsilon

    delta = 1e-5

    def centre(z: float = 1.0):
        return lambda: stats_runner((6.0, 1.0), (-6.0, -1.0), which="centre", noise_multiplier=z)

    def whitened(z: float = 1.0):
        return lambda: stats_runner((100.0, 50.0), (-100.0, -50.0), which="sum", noise_multiplier=z)

    def tail(z: float = 1.0):
        return lambda: stats_runner((100.0, 50.0), (0.0, 0.0), which="tail", noise_multiplier=z)

    one = gaussian_epsilon(1 / (2 * 1.0**2), delta)
    return [
        Scenario("auto: statistics' centre", "as shipped", one, delta, True, centre(), 400_000),
        Scenario(
            "auto: statistics' centre", "noise scale divided by 3", one, delta, False,
            centre(1 / 3), 400_000,
        ),
        Scenario("auto: whitened statistics", "as shipped", one, delta, True, whitened(), 400_000),
        Scenario(
            "auto: whitened statistics", "noise scale halved", one, delta, False, whitened(0.5),
            400_000,
        ),
        Scenario("auto: tail excess", "as shipped", one, delta, True, tail(), 400_000),
        Scenario(
            "auto: tail excess", "noise scale halved", one, delta, False, tail(0.5), 400_000,
        ),
    ]  # fmt: skip


# -- the per-group statistics strategy (pymc_dp.auto.groupstats) --------------------------------


def _worst_group_pair(groups: int, b: float) -> tuple[tuple[float, int], tuple[float, int]]:
    """Record 0's ``(y, group)`` in D and in D' whose released statistics differ most (a grid
    over the clip range and the stationary points of `group_stats_sensitivity`, both groups):
    the audit's neighbours are the worst case the sensitivity claims."""
    from pymc_dp.auto.groupstats import group_stats_of_records

    ys = np.unique(np.concatenate([np.linspace(-b, b, 41), [-b / 3, b / 3, -2 * b / 3, 2 * b / 3]]))
    cands = [(float(y), g) for y in ys for g in (0, 1)]
    stats = {
        c: group_stats_of_records(np.array([c[0]]), np.array([c[1]]), groups, 0.0, b) for c in cands
    }
    pairs = ((c, d) for c in cands for d in cands)
    return max(pairs, key=lambda cd: float(np.sum((stats[cd[0]] - stats[cd[1]]) ** 2)))


def groupstats_runner(
    noise_multiplier: float,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One release of the per-group statistics (`pymc_dp.auto.groupstats.release_group_stats`,
    through the library's own call: a change of its noise or of `group_stats_sensitivity`
    shows here) on 10 records in 3 groups, centre 0, clip bound 1, record 0 the worst pair of
    `_worst_group_pair` in D and D'. Published: every released statistic, and the
    likelihood-ratio statistic of the difference."""
    from pymc_dp.auto.groupstats import (
        _weights,
        group_stats_of_records,
        group_stats_sensitivity,
        release_group_stats,
    )

    groups, b = 3, 1.0
    y = np.linspace(-0.8, 0.8, 10)
    g = np.arange(10) % groups
    (y0, g0), (y1, g1) = _worst_group_pair(groups, b)
    data = {}
    for on_d2, (yy, gg) in ((False, (y0, g0)), (True, (y1, g1))):
        yd, gd = y.copy(), g.copy()
        yd[0], gd[0] = yy, gg
        data[on_d2] = (yd, gd)
    w = _weights(b)
    exact = {k: group_stats_of_records(*v, groups, 0.0, b) for k, v in data.items()}
    std = group_stats_sensitivity(b)
    diff = (exact[True] - exact[False]) / std**2

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        yd, gd = data[on_d2]
        out = np.empty((trials, 2 * groups + 1))
        for t in range(trials):
            r = release_group_stats(yd, gd, groups, 0.0, b, noise_multiplier, rng)
            out[t] = np.concatenate([r.counts * w[0], r.sums * w[1], [r.squares * w[2]]])
        res = {f"statistic {j}": out[:, j] for j in range(out.shape[1])}
        res["LR statistic"] = out @ diff
        return res

    return run


def groupstats_scenarios() -> list[Scenario]:
    """The per-group statistics' one release as shipped, and with less noise than claimed
    (caught)."""
    from pymc_dp.accounting import gaussian_epsilon

    delta = 1e-5
    one = gaussian_epsilon(1 / (2 * 1.0**2), delta)
    return [
        Scenario(
            "auto: per-group statistics", "as shipped", one, delta, True,
            lambda: groupstats_runner(1.0), 200_000,
        ),
        Scenario(
            "auto: per-group statistics", "noise scale halved", one, delta, False,
            lambda: groupstats_runner(0.5), 200_000,
        ),
    ]  # fmt: skip
