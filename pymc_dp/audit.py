"""Empirical privacy audit: a statistical lower bound on a mechanism's epsilon.

One iteration of a step's mechanism is run many times from a fixed state on two
neighbouring datasets D and D' that differ in one adversarially chosen record. For every
event the published output reveals (accept/reject; threshold events on a published
continuous value), Clopper-Pearson bounds on the event's probabilities give a lower bound

.. math:: \\hat\\epsilon = \\ln \\frac{\\underline{p}_D - \\delta}{\\overline{p}_{D'}}

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
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPPenaltyMetropolis iteration (fixed state and proposal) on D and D'.

    The clipped log-likelihood ratios are computed by the real per-record model functions of
    the two datasets (:class:`pymc_dp.model.RecordFunctions`); the noise and the decision by
    the step's kernel. Published outputs: the accept bit and the ``accept`` stat (the noisy
    acceptance probability). ``noise_scale`` and ``clip`` exist to build deliberately broken
    variants (noise smaller than claimed; clipping removed) that the audit must catch.
    """
    from pymc_dp.kernels.penalty import accept, penalty_log_acceptance, penalty_noise_std

    norm = float(np.linalg.norm(q_new - q))
    bound = clip_bound * norm if clip else np.inf
    llr = {
        False: fns_d.clipped_loglik_ratio_sum(q_new, q, bound)[0],
        True: fns_d2.clipped_loglik_ratio_sum(q_new, q, bound)[0],
    }
    lpr = fns_d.prior_logp(q_new) - fns_d.prior_logp(q)
    sigma = penalty_noise_std(noise_multiplier, clip_bound, norm) * noise_scale

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        log_a = penalty_log_acceptance(np.full(trials, llr[on_d2]), lpr, 0.0, sigma, rng)
        return {"accepted": accept(log_a, rng), "accept": np.exp(np.minimum(0.0, log_a))}

    return run
