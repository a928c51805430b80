r"""DPSubsampledPenalty: the DP penalty test on a minibatch drawn without replacement.

Räisä (2021), MSc thesis, Sec. 4.1 (Lemma 1, Theorem 9); the penalty method of Ceperley &
Dewing (1999) and Yildirim & Ermis (2019); subsampled RDP of Wang, Balle, Kasiviswanathan
(2019).

References
----------
.. [1] Räisä, O. (2021). Differentially Private Markov Chain Monte Carlo. MSc thesis,
   Sec. 4.1. [Raisa2021]
.. [2] Wang, Y.-X., Balle, B. and Kasiviswanathan, S. (2019). Subsampled Rényi differential
   privacy and analytical moments accountant. AISTATS (Theorem 9; dp-accounting implements
   the strengthened Theorem 27 for Gaussian mechanisms).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pymc_dp._validation import (
    check_positive,
    check_positive_vector,
)
from pymc_dp.accounting import WORSubsampledGaussian, calibrate_wor_subsampled_noise
from pymc_dp.kernels.penalty import accept
from pymc_dp.kernels.subsampled_penalty import (
    clipped_moments,
    merge_moments,
    minibatch_estimate,
    subsampled_penalty_log_acceptance,
    subsampled_penalty_sensitivity,
    subsampled_penalty_transition,
)
from pymc_dp.step_methods.base import (
    NONPRIVATE_SUFFIX,
    WALK_STATS,
    DPStep,
    ScaleAdaptation,
    n_records_of,
    noise_or_target,
    scalar_stats,
)
from pymc_dp.step_methods.parts import (
    LikelihoodSettings,
    PrivacySettings,
    require_clip_bound,
    resolve_parts,
)
from pymc_dp.step_methods.proposals import WALK_KEYWORDS, RandomWalk, walk_from_keywords, walk_parts

__all__ = [
    "DPSubsampledPenalty",
    "minibatch_estimate",
    "subsampled_penalty_sensitivity",
    "subsampled_penalty_log_acceptance",
    "subsampled_penalty_runner",
]


class DPSubsampledPenalty(ScaleAdaptation, DPStep):
    r"""DP random-walk Metropolis with the penalty test on a minibatch (thesis Sec. 4.1).

    Each iteration proposes $\theta' = \theta + s\,S\odot\xi$, draws a minibatch
    $B$ of ``batch_size`` records uniformly without replacement, computes the tempered
    ratios $r_j = T(\log p(x_j|\theta') - \log p(x_j|\theta))$ for $j \in B$ only,
    clipped to $\pm L\|\theta'-\theta\|_2$, and accepts if

    $$
    \log u < \frac{n}{b}\sum_{j\in B} r_j - \frac{\sigma_b^2}{2} + \xi
    + \log\frac{p(\theta')}{p(\theta)} - \frac{\sigma^2}{2},
    \quad \xi\sim N(0, \sigma^2),\ \sigma = z\,c(\theta,\theta')
    $$

    with $\sigma_b^2$ the batch variance (`minibatch_estimate`) and $c$ the
    sensitivity of Theorem 9 / Lemma 1 (`subsampled_penalty_sensitivity`).

    **Privacy.** Each iteration is a Gaussian mechanism with noise multiplier ``z`` (noise std
    over replace-one sensitivity) applied to a minibatch drawn without replacement: thesis
    Theorem 9 gives its RDP by Wang, Balle & Kasiviswanathan (2019); the report composes the
    iterations with dp-accounting's RDP accountant (``SampledWithoutReplacementDpEvent``, their
    Theorem 27, never looser than the Theorem 9 bound the thesis uses) and converts to
    (epsilon, delta). The step records ``dp_wor_sigma = z``, ``dp_wor_batch = b``,
    ``dp_wor_n = n`` in every iteration; ``dp_mu`` is 0.

    **Approximation.** The test is exact at ``b = n`` (then $\sigma_b^2 = 0$ and it is
    `DPPenaltyMetropolis` with sensitivity $2TLh$). With ``b < n`` it
    relies on $\hat\lambda$ being normal with the estimated variance (CLT), which needs
    $\sigma_b^2 \lesssim 1$ to be accurate; the noise grows like $n/b$ and
    $(n/b)^2$ (thesis: use tempering $T = n_0/n$ for large ``n``).

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables).
    batch_size : int
        ``b``, records per iteration (``1 < b <= n``).
    privacy : PrivacySettings
        The noise and what it is calibrated to (`PrivacySettings`); the fields this
        step reads:

        - ``clip_bound`` (float): ``L``: each tempered per-record ratio is clipped to ``+-L ||theta'
          - theta||``; choose it from the model (a Lipschitz bound), never from the data.
        - ``noise_multiplier`` (float, optional): ``z``; give either this or a target
          ``epsilon``/``delta`` with ``draws``, ``tune``, ``chains`` (then ``z`` comes from
          `pymc_dp.accounting.calibrate_wor_subsampled_noise`).
        - ``epsilon``, ``delta`` (float, optional): Target privacy of the whole planned run (all
          chains, warmup included).
        - ``draws``, ``tune``, ``chains`` (int, optional): The planned run; a chain never runs
          longer.
        - ``nonprivate_diagnostics`` (bool): Also emit ``clip_fraction_NONPRIVATE`` and
          ``batch_var_NONPRIVATE`` (computed from the data WITHOUT noise; the result is then not
          DP).
    proposal : RandomWalk, optional
        The Gaussian random walk (`pymc_dp.RandomWalk`; default ``RandomWalk()``), its fields:

        - ``scale`` (float or array): Per-coordinate proposal std ``S``, as in
          `DPPenaltyMetropolis`.
        - ``scaling`` (float): Initial global scale ``s``; adapted in warmup from the DP accept
          decisions.
        - ``target_accept`` (float): Target acceptance rate of the warmup adaptation.
    likelihood : LikelihoodSettings, optional
        How the records are read (`LikelihoodSettings`); its fields:

        - ``tempering`` (float): Likelihood temperature ``T`` (thesis Sec. 3.2: ``T = n_0 / n``).
        - ``chunk_size`` (int, optional): Records per chunk of the in-memory records (a minibatch is
          evaluated chunk by chunk); with ``records=`` the partitions are the chunks.
        - ``data_free_potentials`` (bool): Declare that every ``pm.Potential`` is free of the data.
        - ``records`` (pymc_dp.distributed.DaskRecords, optional): The records on a Dask cluster
          (default: the model's data, in memory): the minibatch indices are drawn here (the same
          random stream as in memory), each partition holding some of them evaluates only those rows
          and returns their sums, and the driver combines the partition sums in partition order and
          adds the noise.
    **deprecated
        The keywords above by their former names (``clip_bound=``, ``epsilon=``,
        ``tempering=``, ...), folded into ``privacy`` and ``likelihood``, and the walk's
        (``proposal_scale``, ``scaling``, ``target_accept``): deprecated,
        kept for the 0.1 releases (docs/api.md).
    """

    remote_records = True
    name = "dp_subsampled_penalty"
    stats_dtypes_shapes = {
        **DPStep.stats_dtypes_shapes,
        **WALK_STATS,
        **scalar_stats("dp_wor_sigma"),
        **scalar_stats("dp_wor_batch", "dp_wor_n", dtype=np.int64),
        **scalar_stats("clip_fraction" + NONPRIVATE_SUFFIX, "batch_var" + NONPRIVATE_SUFFIX),
    }

    _parts_from_keywords = staticmethod(walk_parts)

    def __init__(
        self,
        vars=None,
        *,
        privacy: PrivacySettings | None = None,
        batch_size: int,
        proposal: RandomWalk | None = None,
        likelihood: LikelihoodSettings | None = None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **deprecated: Any,
    ) -> None:
        # Validate everything before the data is touched (n is public: counted from shapes).
        privacy, likelihood, old = resolve_parts(
            type(self), privacy, likelihood, deprecated, extra=WALK_KEYWORDS
        )
        walk = walk_from_keywords(type(self).__name__, proposal, old)
        proposal_scale = self._set_walk(walk, 0.234)
        noise_multiplier = privacy.noise_multiplier
        self.clip_bound = require_clip_bound(type(self), privacy.clip_bound)
        self.batch_size = check_positive(batch_size, "batch_size", integer=True, coerce=True)
        check_positive(likelihood.tempering, "tempering", coerce=True)
        n = n_records_of(type(self), model, likelihood.records, privacy.nonprivate_diagnostics)
        if not 2 <= self.batch_size <= n:
            raise ValueError(
                f"batch_size must be between 2 and the number of records n = {n}; got "
                f"{batch_size!r}"
            )
        z, plan, epsilon, delta = noise_or_target(
            privacy,
            noise_given=noise_multiplier is not None,
            noise=lambda: check_positive(noise_multiplier, "noise_multiplier", coerce=True),
            calibrate=lambda run, eps, d: calibrate_wor_subsampled_noise(
                eps, d, n, self.batch_size, run.iterations
            ),
        )
        self.noise_multiplier = float(z)
        self.epsilon = epsilon
        self._mu_per_iteration = 0.0
        self._releases_per_iteration = 1
        self._reset_scaling()
        self._setup(
            vars, privacy, likelihood, plan, delta, model=model, rng=rng,
            initial_point=initial_point, compile_kwargs=compile_kwargs, blocked=blocked,
        )  # fmt: skip
        self.proposal_scale = check_positive_vector(
            proposal_scale, "proposal_scale", self._fns.ndim
        )

    def released_events(self) -> list:
        n = self._fns.n_records
        return [WORSubsampledGaussian(self.noise_multiplier, n, self.batch_size, self._releases())]

    def _reset_chain_state(self) -> None:
        self._reset_scaling()

    def _dp_astep(self, q0):
        q = q0.data
        q1 = self.proposal.propose(self.rng, q, self.scaling)
        norm = float(np.linalg.norm(q1 - q))
        n, b = self._fns.n_records, self.batch_size
        lpr = self._fns.prior_logp(q1) - self._fns.prior_logp(q)
        info = subsampled_penalty_transition(
            self.rng,
            n_records=n,
            batch_size=b,
            clip_bound=self.clip_bound,
            noise_multiplier=self.noise_multiplier,
            step_norm=norm,
            log_prior_ratio=lpr,
            minibatch_moments=lambda idx, bound: self._fns.ratio_subset_terms(
                q1, q, idx, clipped_moments, merge_moments, params=(bound,)
            ),
        )
        # -- post-processing of the noisy release ---------------------------------------------
        accepted = info.accepted
        if self.tune:
            self._adapt_scaling(accepted)
        log_a = info.log_accept
        stats = {
            "accepted": float(accepted),
            "accept": float(np.exp(min(0.0, log_a))) if np.isfinite(log_a) else 0.0,
            "scaling": self.scaling,
            "step_norm": norm,
            "noise_std": info.noise_std,
            "dp_wor_sigma": self.noise_multiplier,
            "dp_wor_batch": b,
            "dp_wor_n": n,
            "clip_fraction" + NONPRIVATE_SUFFIX: info.clip_fraction,
            "batch_var" + NONPRIVATE_SUFFIX: info.batch_var,
        }
        return (q1 if accepted else q), stats


def subsampled_penalty_runner(
    fns_d,
    fns_d2,
    q: np.ndarray,
    q_new: np.ndarray,
    *,
    batch_size: int,
    clip_bound: float,
    noise_multiplier: float,
    noise_scale: float = 1.0,
    clip: bool = True,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPSubsampledPenalty iteration (fixed state and proposal) on D and D' (for the audit).

    Per-record ratios come from the real model functions of the two neighbouring datasets
    (record 0 differs); each trial draws its own minibatch without replacement and its own
    noise, vectorised. Published outputs: the accept bit and the ``accept`` stat.
    ``noise_scale`` and ``clip`` build deliberately broken variants (less noise than claimed,
    clipping removed) that `pymc_dp.audit.audit_mechanism` must catch.
    """
    n = fns_d.n_records
    norm = float(np.linalg.norm(q_new - q))
    bound = clip_bound * norm if clip else np.inf
    ratios = {False: fns_d.loglik_ratio(q_new, q), True: fns_d2.loglik_ratio(q_new, q)}
    lpr = fns_d.prior_logp(q_new) - fns_d.prior_logp(q)
    sigma = noise_multiplier * subsampled_penalty_sensitivity(n, batch_size, clip_bound, norm)
    sigma *= noise_scale

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        idx = np.argsort(rng.uniform(size=(trials, n)), axis=1)[:, :batch_size]
        lam, var = minibatch_estimate(ratios[on_d2][idx], n, bound)
        log_a = subsampled_penalty_log_acceptance(lam, var, lpr, sigma, rng)
        return {"accepted": accept(log_a, rng), "accept": np.exp(np.minimum(0.0, log_a))}

    return run
