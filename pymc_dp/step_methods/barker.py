r"""DPBarker: the DP Barker minibatch test as a PyMC step (thesis Sec. 3.2, Algorithm 2).

References
----------
.. [1] Heikkilä, M., Jälkö, J., Dikmen, O. and Honkela, A. (2019). Differentially private
   Markov chain Monte Carlo. NeurIPS.
.. [2] Räisä, O. (2021). Differentially Private Markov Chain Monte Carlo. MSc thesis,
   Sec. 3.2, Algorithm 2, Theorem 8. [Raisa2021]
.. [3] Seita, D., Pan, X., Chen, H. and Canny, J. (2017). An efficient minibatch acceptance
   test for Metropolis-Hastings. UAI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pymc_dp._validation import (
    check_positive,
    check_positive_vector,
)
from pymc_dp.accounting import DPBarkerEvent
from pymc_dp.kernels.barker import (
    barker_clip_bound,
    barker_log_test,
    calibrate_barker_batch_size,
)
from pymc_dp.kernels.subsampled_penalty import (
    clipped_moments,
    merge_moments,
    minibatch_estimate,
    moments_estimate,
)
from pymc_dp.step_methods.base import (
    NONPRIVATE_SUFFIX,
    DPStep,
    ScaleAdaptation,
    n_records_of,
    noise_or_target,
    scalar_stats,
)
from pymc_dp.step_methods.parts import LikelihoodSettings, PrivacySettings, resolve_parts
from pymc_dp.step_methods.proposals import WALK_KEYWORDS, RandomWalk, walk_from_keywords, walk_parts

__all__ = ["DPBarker", "barker_runner"]


class DPBarker(ScaleAdaptation, DPStep):
    r"""Differentially private random-walk Metropolis with the DP Barker minibatch test.

    Each iteration proposes $\theta' = \theta + s\,S\odot\xi$, draws ``batch_size``
    records without replacement, clips the tempered ratios
    $T(\log p(x_j|\theta') - \log p(x_j|\theta))$ to $\pm\sqrt b/n$ (thesis
    Theorem 8), and accepts if

    $$
    \frac{n}{b}\sum_{j\in B} r_j + \log\frac{p(\theta')}{p(\theta)} + s + c > 0,
    \quad s\sim N(0, 2 - \sigma_b^2),\ c \sim \hat V_{corr}
    $$

    (Algorithm 2), $\sigma_b^2$ the batch variance (`minibatch_estimate`, at most 1 after
    clipping) and
    $\hat V_{corr}$ the shipped Gaussian-mixture correction
    (`pymc_dp.kernels.barker`).

    **Privacy.** No noise multiplier: Theorem 8 fixes the per-iteration RDP
    $\epsilon'(\alpha)$ from the batch size alone, amplified by sampling without
    replacement (Wang, Balle, Kasiviswanathan 2019, Theorem 9) and composed over all
    iterations of all chains (`pymc_dp.kernels.barker.dp_barker_epsilon`). A target
    epsilon therefore calibrates the batch size
    (`calibrate_barker_batch_size`). Every iteration records the
    data-free stats ``dp_barker_batch = b`` and ``dp_barker_n = n``; ``dp_mu`` is 0.

    **Approximation.** With ``b = n`` the test is the Barker test (exact: detailed balance
    with respect to the tempered posterior) up to the correction's error, at most
    ``sup_cdf_error`` (5.9e-4) per acceptance probability. With ``b < n`` it also relies on
    the CLT for the minibatch estimate (Seita et al. 2017). Ratios clipped to
    $\sqrt b/n$ bias the chain: choose the temperature ``T`` so that
    $T|r_j| \le \sqrt b/n$ holds for the steps the chain makes (the thesis uses
    $T = n_0/n$).

    Parameters
    ----------
    vars : list, optional
        Value variables to sample.
    batch_size : int, optional
        ``b`` (``11 <= b <= n``). Give either this or a target ``epsilon``/``delta`` with the
        planned ``draws``, ``tune``, ``chains`` (then the largest feasible ``b`` is used).
    privacy : PrivacySettings
        The noise and what it is calibrated to (`PrivacySettings`); the fields this
        step reads:

        - ``epsilon``, ``delta`` (float, optional): Target privacy of the whole planned run.
        - ``draws``, ``tune``, ``chains`` (int, optional): The planned run; a chain never runs
          longer.
        - ``nonprivate_diagnostics`` (bool): Emit ``clip_fraction_NONPRIVATE`` and
          ``batch_var_NONPRIVATE`` (NOT private).
    likelihood : LikelihoodSettings, optional
        How the records are read (`LikelihoodSettings`); its fields:

        - ``tempering`` (float): Likelihood temperature ``T`` (required in practice: the bound is
          ``sqrt(b) / n``).
        - ``chunk_size`` (int, optional): Records per chunk of the in-memory records (a minibatch is
          evaluated chunk by chunk); with ``records=`` the partitions are the chunks.
        - ``data_free_potentials`` (bool): Declare that every ``pm.Potential`` is free of the data.
        - ``records`` (pymc_dp.distributed.DaskRecords, optional): The records on a Dask cluster
          (default: the model's data, in memory): the minibatch indices are drawn here (the same
          random stream as in memory), each partition holding some of them evaluates only those rows
          and returns their sums, and the driver combines the partition sums in partition order and
          adds the noise.
    proposal : RandomWalk, optional
        The Gaussian random walk (`pymc_dp.RandomWalk`; default ``RandomWalk()``), its fields:

        - ``scale`` (float or array): Per-coordinate proposal std ``S``, as in
          `DPPenaltyMetropolis`.
        - ``scaling`` (float): Initial global scale ``s``; adapted in warmup from the DP accept
          decisions.
        - ``target_accept`` (float): Target acceptance rate of the warmup adaptation.
    **deprecated
        The keywords above by their former names (``clip_bound=``, ``epsilon=``,
        ``tempering=``, ...), folded into ``privacy`` and ``likelihood``, and the walk's
        (``proposal_scale``, ``scaling``, ``target_accept``): deprecated,
        kept for the 0.1 releases (docs/api.md).
    """

    remote_records = True
    name = "dp_barker"
    stats_dtypes_shapes = {
        **DPStep.stats_dtypes_shapes,
        **scalar_stats("scaling", "step_norm"),
        **scalar_stats("dp_barker_batch", "dp_barker_n", dtype=np.int64),
        **scalar_stats("clip_fraction" + NONPRIVATE_SUFFIX, "batch_var" + NONPRIVATE_SUFFIX),
    }

    #: DP Barker's privacy is set by its batch size: no clip bound, no noise multiplier
    _privacy_keywords: dict = {}

    _parts_from_keywords = staticmethod(walk_parts)

    def __init__(
        self,
        vars=None,
        *,
        privacy: PrivacySettings | None = None,
        batch_size: int | None = None,
        proposal: RandomWalk | None = None,
        likelihood: LikelihoodSettings | None = None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **deprecated: Any,
    ) -> None:
        privacy, likelihood, old = resolve_parts(
            type(self), privacy, likelihood, deprecated, extra=WALK_KEYWORDS
        )
        walk = walk_from_keywords(type(self).__name__, proposal, old)
        proposal_scale = self._set_walk(walk, 0.234)
        check_positive(likelihood.tempering, "tempering", coerce=True)
        n = n_records_of(type(self), model, likelihood.records, privacy.nonprivate_diagnostics)

        def given_batch() -> int:
            b = check_positive(batch_size, "batch_size", integer=True, coerce=True)
            if not 11 <= b <= n:
                raise ValueError(
                    f"batch_size must be between 11 (Theorem 8 needs order 2 < b/5) and the "
                    f"number of records n = {n}; got {batch_size!r}"
                )
            return b

        b, plan, epsilon, delta = noise_or_target(
            privacy,
            noise_given=batch_size is not None,
            message="give exactly one of batch_size or epsilon (with delta, draws, tune, chains): "
            "DP Barker's privacy is set by its batch size (thesis Theorem 8)",
            noise=given_batch,
            calibrate=lambda run, eps, d: calibrate_barker_batch_size(eps, d, n, run.iterations),
        )
        self.batch_size = int(b)
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
        self.clip_bound = barker_clip_bound(n, self.batch_size)

    def released_events(self) -> list:
        return [DPBarkerEvent(self._fns.n_records, self.batch_size, self._releases())]

    def _reset_chain_state(self) -> None:
        self._reset_scaling()

    def _dp_astep(self, q0):
        q = q0.data
        q1 = self.proposal.propose(self.rng, q, self.scaling)
        n, b = self._fns.n_records, self.batch_size
        lpr = self._fns.prior_logp(q1) - self._fns.prior_logp(q)
        # -- the one data access: Algorithm 2 on a minibatch drawn without replacement --------
        idx = np.sort(self.rng.choice(n, size=b, replace=False))
        moments, (n_clipped,) = self._fns.ratio_subset_terms(
            q1, q, idx, clipped_moments, merge_moments, params=(self.clip_bound,)
        )
        lam, var = moments_estimate(moments, n)
        accepted = barker_log_test(lam, var, lpr, self.rng)
        # -- post-processing of the released decision -----------------------------------------
        if self.tune:
            self._adapt_scaling(accepted)
        stats = {
            "accepted": float(accepted),
            "scaling": self.scaling,
            "step_norm": float(np.linalg.norm(q1 - q)),
            "dp_barker_batch": b,
            "dp_barker_n": n,
            "clip_fraction" + NONPRIVATE_SUFFIX: n_clipped / b,
            "batch_var" + NONPRIVATE_SUFFIX: float(var),
        }
        return (q1 if accepted else q), stats


def barker_runner(
    fns_d,
    fns_d2,
    q: np.ndarray,
    q_new: np.ndarray,
    *,
    batch_size: int,
    clip: bool = True,
    correction: bool = True,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPBarker iteration (fixed state and proposal) on D and D' (for the audit).

    Real per-record (tempered) ratios of the two neighbouring datasets; every trial draws its
    own minibatch without replacement, noise and correction, vectorised. Published output: the
    accept bit (the step publishes nothing else computed from the data). ``clip=False`` and
    ``correction=False`` (no Gaussian noise and no V_corr: a deterministic test) are the
    deliberately broken variants the audit must catch.
    """
    n = fns_d.n_records
    bound = barker_clip_bound(n, batch_size) if clip else np.inf
    ratios = {False: fns_d.loglik_ratio(q_new, q), True: fns_d2.loglik_ratio(q_new, q)}
    lpr = fns_d.prior_logp(q_new) - fns_d.prior_logp(q)

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        idx = np.argsort(rng.uniform(size=(trials, n)), axis=1)[:, :batch_size]
        lam, var = minibatch_estimate(ratios[on_d2][idx], n, bound)
        if correction:
            return {"accepted": barker_log_test(lam, var, lpr, rng)}
        return {"accepted": lam + lpr > 0}

    return run
