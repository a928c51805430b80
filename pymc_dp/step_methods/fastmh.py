"""DPFastMH: DP-Fast MH (exact minibatch Metropolis-Hastings with Gaussian noise) as a PyMC step.

References
----------
.. [1] W. Zhang, R. Zhang, "DP-Fast MH: Private, Fast, and Accurate Metropolis-Hastings for
   Large-Scale Bayesian Inference", ICML 2023, Algorithm 2, Lemma 1, Theorems 2-3.
   [ZhangZhang2023]
.. [2] R. Zhang, A. F. Cooper, C. De Sa, "Asymptotically optimal exact minibatch
   Metropolis-Hastings", NeurIPS 2020 (TunaMH, the paper's Algorithm 1).
.. [3] B. Balle, G. Barthe, M. Gaboardi, "Privacy amplification by subsampling: tight analyses
   via couplings and divergences", NeurIPS 2018, Theorem 2.
.. [4] B. Balle, Y.-X. Wang, "Improving the Gaussian mechanism for differential privacy",
   ICML 2018, Theorem 8 and Algorithm 1.
.. [5] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for differential privacy",
   IEEE Trans. Inf. Theory 63(6), 2017, Theorem 3.3.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pymc as pm
from pymc.util import get_value_vars_from_user_vars
from scipy import stats

from pymc_dp import callscope
from pymc_dp._validation import check_positive, check_target, check_unit_interval
from pymc_dp.accounting import ApproxDPEvent
from pymc_dp.kernels.fastmh import (
    FastMHSettings,
    IndexSampler,
    calibrate_fastmh,
    clipped_sum_terms,
    default_max_batch,
    fastmh_transition,
    truncate_step,
    tuna_terms,
)
from pymc_dp.step_methods.base import (
    NONPRIVATE_SUFFIX,
    WALK_STATS,
    DPStep,
    ScaleAdaptation,
    make_plan,
    n_records_of,
    scalar_stats,
)
from pymc_dp.step_methods.parts import (
    LikelihoodSettings,
    PrivacySettings,
    require_clip_bound,
    resolve_parts,
)
from pymc_dp.step_methods.proposals import RandomWalk, TunaMHTest

__all__ = ["DPFastMH"]

#: Largest expected minibatch (record indices drawn per iteration) DPFastMH accepts: 1e8
#: int64 indices are 800 MB. Checked before anything is allocated.
_MAX_BATCH_INDICES = 10**8

_BRANCHING = ("independent", "paper")


def _dimension(model: pm.Model, vars, initial_point) -> int:
    """Length of the flat parameter vector the step samples (from shapes; no data)."""
    point = callscope.initial_point(model) if initial_point is None else initial_point
    vs = model.value_vars if vars is None else get_value_vars_from_user_vars(vars, model)
    return int(sum(np.size(point[v.name]) for v in vs))


#: The older keywords the proposal and test objects replace (deprecated).
_OLD_PROPOSAL = ("proposal_scale", "scaling", "target_accept", "max_step")
_OLD_TEST = ("lam", "max_batch", "branching", "privacy_for_free")
_OLD_KEYWORDS = (*_OLD_PROPOSAL, *_OLD_TEST)


def _fastmh_parts(proposal, test, old: dict[str, Any]) -> tuple[RandomWalk, TunaMHTest]:
    """The walk and the test, from the objects or the older keywords (deprecated)."""
    if proposal is None:
        proposal = RandomWalk(
            scale=old.get("proposal_scale", 1.0),
            scaling=old.get("scaling", 1.0),
            target_accept=old.get("target_accept"),
            max_step=old.get("max_step"),
        )
    elif not isinstance(proposal, RandomWalk):
        raise TypeError(f"DPFastMH takes a pymc_dp.RandomWalk proposal; got {proposal!r}")
    elif any(k in old for k in _OLD_PROPOSAL):
        raise TypeError("give proposal_scale, scaling, target_accept, max_step in RandomWalk")
    elif proposal.cov is not None or proposal.free_moves:
        raise ValueError("DPFastMH's RandomWalk takes scale (per coordinate), not cov/free_moves")
    if test is None:
        test = TunaMHTest(
            lam=old.get("lam"),
            max_batch=old.get("max_batch"),
            branching=old.get("branching", "independent"),
            privacy_for_free=old.get("privacy_for_free", False),
        )
    elif not isinstance(test, TunaMHTest):
        raise TypeError(f"DPFastMH takes a pymc_dp.TunaMHTest test; got {test!r}")
    elif any(k in old for k in _OLD_TEST):
        raise TypeError("give lam, max_batch, branching, privacy_for_free in TunaMHTest")
    return proposal, test


class DPFastMH(ScaleAdaptation, DPStep):
    r"""Differentially private minibatch Metropolis-Hastings (DP-Fast MH, Algorithm 2).

    Each iteration proposes a truncated Gaussian random walk $\theta' = \theta + \Delta$,
    $\Delta = s\,S \odot \zeta$ radially shrunk to $\|\Delta\|_2 \le A$ (symmetric,
    so the log proposal ratio is 0; Assumption 2), sets $M = \|\theta' - \theta\|_2$ and
    clips every record's log-likelihood difference to $\pm c_i M$ (Assumption 1 by
    construction). With $\Lambda = \lambda + CM$, $C = \sum_i c_i$:

    - **minibatch branch**: $B \sim \mathrm{Poisson}(\Lambda)$ indices drawn with
      replacement with probabilities $c_i / C$, each kept with TunaMH's probability,
      $\ell_1 = 2\sum_{\text{kept}}\operatorname{artanh}(\cdot)$, noise
      $\xi \sim N(0, \sigma_1^2)$, $\sigma_1 = z_1 \Delta(\ell_1)$,
      $\Delta(\ell_1) = 2\log(1 + CM/\lambda)$. Only the $B$ sampled rows are read.
    - **full-batch branch** (when the branch draw is $\ge K$): the clipped sum
      $\ell_2$ over all records, $\sigma_2 = z_2 \Delta(\ell_2)$,
      $\Delta(\ell_2) = 2\max_i c_i M$.

    Accept if $\log u < \ell + \xi - \sigma^2/2 + \log\frac{p(\theta')}{p(\theta)} +
    \log\frac{q(\theta|\theta')}{q(\theta'|\theta)}$ (the penalty correction keeps the chain
    exact when clipping is inactive).

    Privacy (replace-one neighbours; proofs in `pymc_dp.kernels.fastmh`):
    everything but the data (proposal, $M$, $B$, the branch, the sampled indices,
    the thinning uniforms) is data-free and coupled between neighbours. Full batch: by
    Lemma 1 (eq. 2) $\ell_2$ moves by at most $\Delta(\ell_2)$, a Gaussian
    mechanism with $\mu_2 = 1/(2z_2^2)$. Minibatch: by Lemma 1 (eq. 1) each drawn copy of
    the changed record moves $\ell_1$ by at most $\Delta(\ell_1)$ *whether it is
    kept or dropped* (both lie in $[-\Delta/2, \Delta/2]$), so $k$ copies move it
    by $k\Delta(\ell_1)$; $k$ is a data-free Poisson (or binomial) count, and
    privacy amplification by subsampling (Balle, Barthe & Gaboardi 2018, Thm 2, with the exact
    Gaussian curve of Balle & Wang 2018) gives a per-iteration (epsilon, delta) bound. The
    branch choice is data-free, so every iteration is (``iter_epsilon``, ``iter_delta``)-DP
    with constants computed at construction, and `pymc_dp.privacy_report` composes all
    iterations of all chains, warmup included, with the optimal homogeneous composition theorem
    of Kairouz, Oh & Viswanath (stats ``dp_iter_epsilon`` / ``dp_iter_delta``; ``dp_mu`` is 0:
    the minibatch branch is not a Gaussian mechanism, so it is not charged as one).

    Differences from the paper, each on purpose:

    - noise scales from the analytic Gaussian curve (valid for every epsilon), not
      $\sqrt{2\ln(1.25/\delta)}/\epsilon$; the amplification bound above replaces the
      paper's $6K\max c_i/C$ factor;
    - ``branching="independent"`` (default) chooses the branch with an independent Poisson
      draw: Algorithm 2's shared $B$ makes the chain reversible only up to
      $P(B \ge K)$ (see `pymc_dp.kernels.fastmh`); ``branching="paper"`` keeps it;
    - ``privacy_for_free`` is off by default and, when on, charged honestly;
    - the prior ratio is in the test (the reference code leaves it out); the $c_i$ must be
      data-free (the paper's $c_i = \|x_i\|$ would make the sampling probabilities
      depend on the private records).

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables of the model).
    privacy : PrivacySettings
        The noise and what it is calibrated to (`PrivacySettings`); the fields this
        step reads:

        - ``clip_bound`` (float or array of shape (n,)):
          The per-record bounds $c_i$ of the (tempered) log-likelihood differences:
          $|\log p(x_i|\theta') - \log p(x_i|\theta)| \le c_i \|\theta' - \theta\|_2$,
          enforced by clipping. A scalar means the same bound for every record. They must be
          **public**: a Lipschitz bound from the model and the public range of the data, never
          computed from the private records (they set the sampling probabilities).
        - ``noise_multiplier`` (float or (float, float), optional): $(z_1, z_2)$ given directly (a
          scalar is used for both); with ``iter_delta`` the per-iteration epsilon is then computed.
        - ``epsilon``, ``delta`` (float, optional): Target privacy of the whole planned run (all
          chains, warmup included); requires ``draws``, ``tune`` and ``chains``.
        - ``draws``, ``tune``, ``chains`` (int, optional): The planned run. A chain asked to run
          more than ``draws + tune`` iterations stops with `BudgetExceededError` before it reads the
          data again.
        - ``nonprivate_diagnostics`` (bool): Also emit ``kept_NONPRIVATE`` (the thinned minibatch
          size) and ``clip_fraction_NONPRIVATE``, computed from the data WITHOUT noise. Not
          differentially private; the privacy report flags the run.
    proposal : RandomWalk, optional
        The truncated Gaussian random walk (`pymc_dp.RandomWalk`; default ``RandomWalk()``),
        its fields:

        - ``scale`` (float or array): Per-coordinate proposal std ``S`` (transformed space), before
          truncation.
        - ``scaling`` (float): Initial global scale ``s``, adapted during warmup from the (DP)
          accept decisions.
        - ``target_accept`` (float): Target acceptance rate of the warmup adaptation.
        - ``max_step`` (float, optional): $A$: proposals are truncated to $\|\theta' - \theta\|_2
          \le A$
          (Assumption 2); the privacy bound is computed at $M = A$. Default: twice the norm
          of the initial proposal std, $2 s \|S\|_2$.
    test : TunaMHTest, optional
        The minibatch test (`pymc_dp.TunaMHTest`; default ``TunaMHTest()``), its fields:

        - ``lam`` (float, optional): $\lambda > 0$ of the batch size $B \sim
          \mathrm{Poisson}(\lambda + CM)$.
          TunaMH's efficiency needs roughly $\lambda \gtrsim (CM)^2$ (the spectral-gap factor
          $\exp(-C^2M^2/\lambda)$ of the paper's Theorem 4). Default
          $\max(10, (CA)^2)$; with global bounds $c_i$ this is often more than
          $n$ (the step warns): choose smaller steps or a smaller ``lam`` for speed.
        - ``max_batch`` (int, optional): $K$: the full-batch branch is taken when the branch draw
          is $\ge K$.
          Default: the smallest $K$ with $P(\mathrm{Poisson}(\lambda + CA) \ge K) \le
          10^{-3}$, i.e. the full batch in at most 0.1 % of the iterations.
        - ``branching`` ({"independent", "paper"}): How the full-batch branch is chosen (see above).
        - ``privacy_for_free`` (bool): Reproduce the paper's rule: no noise when the branch's
          sensitivity is below the
          per-iteration epsilon (times $C/(6K\max c_i)$ for the minibatch). Such an
          iteration's accept/reject bit is only $(\epsilon, 1 - e^{-\Delta})$-DP, and that is
          what is charged (with $\Delta$ at $M = A$, capped at the threshold): the
          report shows a large delta. Warns at construction. Off by default.
    iter_epsilon, iter_delta : float, optional
        The paper's per-iteration target (Theorem 2): both branches are calibrated to be
        (iter_epsilon, iter_delta)-DP.
    likelihood : LikelihoodSettings, optional
        How the records are read (`LikelihoodSettings`); its fields:

        - ``tempering`` (float): Likelihood temperature ``T`` (the $c_i$ bound the tempered
          log-likelihood).
        - ``chunk_size`` (int, optional): Records per call of the compiled likelihood in the
          full-batch branch.
        - ``data_free_potentials`` (bool): Declare that every ``pm.Potential`` of the model is free
          of the data.
        - ``records`` (pymc_dp.distributed.DaskRecords, optional): The records on a Dask cluster
          (default: the model's data, in memory): the minibatch indices are drawn here (the same
          random stream as in memory), each partition holding some of them evaluates only those rows
          and returns their sums (the TunaMH sum of the kept ones; their keep uniforms are sent
          along), and the driver combines the partition sums in partition order and adds the noise.
          The full-batch branch reads every partition's clipped sum.
    **deprecated
        The keywords above by their former names (``clip_bound=``, ``epsilon=``,
        ``tempering=``, ...), folded into ``privacy`` and ``likelihood``, and the walk's and
        the test's (``proposal_scale``, ``scaling``, ``target_accept``, ``max_step``;
        ``lam``, ``max_batch``, ``branching``, ``privacy_for_free``): deprecated,
        kept for the 0.1 releases (docs/api.md).

    Notes
    -----
    Published stats: ``batch_size`` ($B$, or $n$ in the full-batch branch),
    ``full_batch`` and ``noise_free`` are data-free; ``accept`` is a post-processing of the
    noisy release (NaN in noise-free iterations, where it would be exact). The thinned
    minibatch size depends on the data and is never published (except behind
    ``nonprivate_diagnostics``). The noise is an IEEE double; see Mironov (2012) on
    floating-point leakage.
    """

    remote_records = True
    name = "dp_fast_mh"
    stats_dtypes_shapes = {
        **DPStep.stats_dtypes_shapes,
        **scalar_stats("dp_iter_epsilon", "dp_iter_delta"),
        **WALK_STATS,
        **scalar_stats("batch_size", dtype=np.int64),
        **scalar_stats("full_batch", "noise_free", dtype=bool),
        **scalar_stats("kept" + NONPRIVATE_SUFFIX, "clip_fraction" + NONPRIVATE_SUFFIX),
    }

    def __init__(
        self,
        vars=None,
        *,
        privacy: PrivacySettings | None = None,
        proposal: RandomWalk | None = None,
        test: TunaMHTest | None = None,
        iter_epsilon: float | None = None,
        iter_delta: float | None = None,
        likelihood: LikelihoodSettings | None = None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **deprecated: Any,
    ) -> None:
        # -- validate everything before the data is touched (shapes only) --------------------
        privacy, likelihood, old = resolve_parts(
            type(self), privacy, likelihood, deprecated, extra=_OLD_KEYWORDS
        )
        epsilon, delta, noise_multiplier = privacy.epsilon, privacy.delta, privacy.noise_multiplier
        proposal, test = _fastmh_parts(proposal, test, old)
        max_step = proposal.max_step
        lam, max_batch, branching = test.lam, test.max_batch, test.branching
        privacy_for_free = test.privacy_for_free
        self.test = test
        if branching not in _BRANCHING:
            raise ValueError(f"branching must be one of {_BRANCHING}; got {branching!r}")
        self.branching = branching
        proposal_scale = self._set_walk(proposal, 0.234)
        s = np.asarray(proposal_scale, dtype=float)
        if s.size == 0 or not np.all(np.isfinite(s) & (s > 0)):
            raise ValueError("proposal_scale must be finite and > 0 in every coordinate")
        m = pm.modelcontext(model)
        n = n_records_of(type(self), m, likelihood.records, privacy.nonprivate_diagnostics)
        c = self._check_clip_bound(privacy.clip_bound, n)
        C = float(n * c) if np.ndim(c) == 0 else float(np.sum(c))
        c_max = float(np.max(c))
        if max_step is None:
            d = _dimension(m, vars, initial_point)
            s_full = np.broadcast_to(s.ravel(), (d,)) if s.size == 1 else s.ravel()
            max_step = 2.0 * self.scaling * float(np.linalg.norm(s_full))
        self.max_step = check_positive(max_step, "max_step", coerce=True)
        if lam is None:
            lam = max(10.0, (C * self.max_step) ** 2)
        self.lam = check_positive(lam, "lam", coerce=True)
        default_k = max_batch is None
        if default_k:
            max_batch = default_max_batch(self.lam + C * self.max_step)
        self.max_batch = check_positive(max_batch, "max_batch (K)", integer=True, coerce=True)
        modes = (
            ("iter_epsilon", iter_epsilon),
            ("noise_multiplier", noise_multiplier),
            ("epsilon", epsilon),
        )
        given = [k for k, v in modes if v is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of iter_epsilon (with iter_delta: the paper's per-iteration "
                "target), noise_multiplier (with iter_delta) or epsilon (with delta, draws, "
                f"tune, chains: a run target); got {given or 'none'}"
            )
        plan = make_plan(*privacy.plan(), epsilon=epsilon)
        kw: dict[str, Any] = {}
        if epsilon is not None:
            epsilon, delta = check_target(epsilon, delta)
            kw = {"epsilon": epsilon, "delta": delta, "iterations": plan.iterations}
        else:
            if delta is not None:
                raise ValueError(
                    "delta is the run target's delta and needs epsilon; the per-iteration "
                    "delta is iter_delta"
                )
            if iter_delta is None:
                raise ValueError(f"{given[0]} needs iter_delta (the per-iteration delta)")
            kw["iter_delta"] = check_unit_interval(iter_delta, "iter_delta")
            if iter_epsilon is not None:
                kw["iter_epsilon"] = check_positive(iter_epsilon, "iter_epsilon", coerce=True)
            else:
                z = np.broadcast_to(np.asarray(noise_multiplier, dtype=float), (2,))
                if not np.all(np.isfinite(z) & (z > 0)):
                    raise ValueError(
                        "noise_multiplier must be a finite number > 0 or a pair of them "
                        f"(minibatch, full batch); got {noise_multiplier!r}"
                    )
                kw["noise_multiplier"] = (float(z[0]), float(z[1]))
        if iter_epsilon is None and iter_delta is not None and "iter_delta" not in kw:
            raise ValueError("iter_delta goes with iter_epsilon or noise_multiplier")
        self.privacy_for_free = bool(privacy_for_free)
        rate = self.lam + C * self.max_step
        if default_k and rate > n:
            # The default K would let the minibatch read more rows than the full batch (and a
            # Poisson draw of this mean may not even fit in memory): cap K at n, so that any
            # B >= n takes the full-batch branch. Data-free; the accounting uses this K.
            self.max_batch = min(self.max_batch, n)
        expected = min(self.max_batch, rate + 6.0 * math.sqrt(rate))
        if branching == "independent" and stats.poisson.cdf(self.max_batch - 1, rate) > 1e-12:
            # the minibatch is a fresh Poisson(rate) draw, not bounded by K
            expected = rate + 6.0 * math.sqrt(rate)
        if expected > _MAX_BATCH_INDICES:
            raise ValueError(
                f"DPFastMH: the minibatch would draw about {expected:.3g} record indices per "
                f"iteration (lam + C * max_step = {rate:.4g} with C = {C:.4g}, max_batch K = "
                f"{self.max_batch}), more than fit in memory; choose a smaller lam or max_step, "
                f"or max_batch <= n = {n} (then the full batch is read instead)"
            )
        if rate > n:
            warnings.warn(
                f"DPFastMH: the expected minibatch at M = max_step, lam + C * max_step = "
                f"{rate:.4g}, exceeds the number of records n = {n}: the minibatch branch reads "
                "more rows than the full batch would"
                + (f" (the default max_batch K is capped at n = {n})" if default_k else "")
                + ". Smaller max_step / proposal steps, or smaller lam (at some loss of "
                "efficiency), make it cheaper; DPPenaltyMetropolis may be faster here",
                UserWarning,
                stacklevel=2,
            )
        if branching == "paper":
            defect = float(stats.poisson.sf(self.max_batch - 1, self.lam + C * self.max_step))
            if defect > 1e-3:
                warnings.warn(
                    f"DPFastMH(branching='paper'): Algorithm 2 decides the branch with the same "
                    f"B as the minibatch, so the chain is reversible only up to P(B >= K), here "
                    f"up to {defect:.3g} at M = max_step; branching='independent' is exact",
                    UserWarning,
                    stacklevel=2,
                )
        cal = calibrate_fastmh(
            C=C,
            c_max=c_max,
            lam=self.lam,
            max_step=self.max_step,
            max_batch=self.max_batch,
            branching=branching,
            privacy_for_free=self.privacy_for_free,
            **kw,
        )
        if self.privacy_for_free:
            warnings.warn(
                "DPFastMH(privacy_for_free=True) reproduces the paper's rule of adding NO noise "
                "when the sensitivity is below the per-iteration epsilon. That is NOT "
                "differentially private at the paper's (epsilon, 0): a noise-free accept/reject "
                "bit is only (epsilon, 1 - e^-Delta)-DP (the reject probability has no "
                "multiplicative bound). This run is charged honestly: every iteration is "
                f"({cal.iter_epsilon:.4g}, {cal.iter_delta:.3g})-DP, so the privacy report "
                "shows a large delta. Do not use it for private releases.",
                UserWarning,
                stacklevel=2,
            )
        self.calibration = cal
        self.clip_bound = c
        self.epsilon = epsilon
        self.iter_epsilon = cal.iter_epsilon
        self.iter_delta = cal.iter_delta
        self.noise_multiplier = (cal.z_minibatch, cal.z_fullbatch)
        self._settings = FastMHSettings(
            c=c,
            C=C,
            c_max=c_max,
            lam=self.lam,
            max_batch=self.max_batch,
            branching=branching,  # type: ignore[arg-type]
            z_minibatch=cal.z_minibatch,
            z_fullbatch=cal.z_fullbatch,
            free_minibatch=cal.free_minibatch,
            free_fullbatch=cal.free_fullbatch,
        )
        self._sampler = IndexSampler(c, n)
        self._mu_per_iteration = 0.0
        self._releases_per_iteration = 1
        self._reset_scaling()
        self._setup(
            vars, privacy, likelihood, plan, delta, model=model, rng=rng,
            initial_point=initial_point, compile_kwargs=compile_kwargs, blocked=blocked,
        )  # fmt: skip
        d = self._fns.ndim
        if s.size not in (1, d):
            raise ValueError(f"proposal_scale must be a scalar or have {d} entries")
        self.proposal_scale = np.broadcast_to(s.ravel(), (d,)).copy()
        self._reset_chain_state()

    @staticmethod
    def _parts_from_keywords(keywords: dict[str, Any]) -> dict[str, Any]:
        """The parts of a call written with the older keywords (`parts.from_keywords`)."""
        old = {k: keywords[k] for k in _OLD_KEYWORDS if k in keywords}
        proposal, test = _fastmh_parts(None, None, old)
        rest = {k: v for k, v in keywords.items() if k not in old}
        return {**rest, "proposal": proposal, "test": test}

    @classmethod
    def _check_clip_bound(cls, clip_bound, n: int) -> float | np.ndarray:
        if np.ndim(clip_bound) == 0:
            return require_clip_bound(cls, clip_bound)
        try:
            c = np.asarray(clip_bound, dtype=float)
        except (TypeError, ValueError):
            raise ValueError("clip_bound must be a number or an array of numbers") from None
        if c.shape != (n,):
            raise ValueError(
                f"clip_bound must be a scalar or have one entry per record, shape ({n},); "
                f"got shape {c.shape}"
            )
        if not np.all(np.isfinite(c) & (c > 0)):
            raise ValueError("clip_bound must be finite and > 0 for every record")
        return c

    # -- PyMC hooks ------------------------------------------------------------------------------
    def _reset_chain_state(self) -> None:
        self._reset_scaling()

    def released_events(self) -> list:
        # every iteration is one (iter_epsilon, iter_delta)-DP release, either branch
        return [ApproxDPEvent(self.iter_epsilon, self.iter_delta, self._releases())]

    def _privacy_stats(self) -> dict[str, Any]:
        out = super()._privacy_stats()
        out["dp_iter_epsilon"] = self.iter_epsilon
        out["dp_iter_delta"] = self.iter_delta
        return out

    def _minibatch_ratios(self, q1: np.ndarray, q: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Log-likelihood differences of the sampled records ``idx`` (with repeats).

        Reads the sampled rows only. When the batch is large compared to ``n`` (a data-free
        condition) each distinct row is evaluated once and the values are repeated.
        """
        n = self._fns.n_records
        if 4 * idx.size > n:  # O(n) = O(batch) here
            present = np.zeros(n, dtype=bool)
            present[idx] = True
            position = np.cumsum(present) - 1
            return self._fns.loglik_ratio_subset(q1, q, np.flatnonzero(present))[position[idx]]
        return self._fns.loglik_ratio_subset(q1, q, idx)

    def _minibatch_terms(self, q1, q, idx, c, u, M: float) -> tuple:
        """The TunaMH sum of the minibatch ``idx`` (with repeats), as sums where the records
        live: ``((ell,), (kept, n_clipped))`` (`pymc_dp.kernels.fastmh.tuna_terms`)."""
        s = self._settings
        return self._fns.ratio_subset_terms(
            q1, q, idx, tuna_terms, row_args=(c, u), params=(s.C, s.lam, M)
        )

    def _fullbatch_clipped_sum(self, q1: np.ndarray, q: np.ndarray, M: float):
        c = self.clip_bound
        if np.ndim(c) == 0:
            return self._fns.clipped_loglik_ratio_sum(q1, q, c * M)
        # per-record bounds (public): every record, its bound sent along with its index
        n = self._fns.n_records
        (total,), (n_clipped,) = self._fns.ratio_subset_terms(
            q1, q, np.arange(n), clipped_sum_terms, row_args=(c * M,)
        )
        return float(total), int(n_clipped)

    def _dp_astep(self, q0):
        q = q0.data
        q1 = q + truncate_step(self.proposal.move(self.rng, q.size, self.scaling), self.max_step)
        # |q1 - q| is symmetric in (q, q1) bit for bit; min() guards the last rounding.
        M = min(float(np.linalg.norm(q1 - q)), self.max_step)
        lp0 = self._fns.prior_logp(q)
        lp1 = self._fns.prior_logp(q1)
        info = fastmh_transition(
            self.rng,
            self._settings,
            self._sampler,
            step_norm=M,
            log_prior_ratio=lp1 - lp0,
            log_proposal_ratio=0.0,  # radially truncated symmetric random walk
            minibatch_terms=lambda idx, c, u, m: self._minibatch_terms(q1, q, idx, c, u, m),
            fullbatch_clipped_sum=lambda m: self._fullbatch_clipped_sum(q1, q, m),
            n_records=self._fns.n_records,
        )
        # -- everything below is post-processing of the (noisy) decision ----------------------
        accepted = info.accepted
        if self.tune:
            self._adapt_scaling(accepted)
        log_a = info.log_accept
        stats = {
            "accepted": float(accepted),
            "accept": (
                math.nan
                if info.noise_free
                else (float(np.exp(min(0.0, log_a))) if np.isfinite(log_a) else 0.0)
            ),
            "scaling": self.scaling,
            "step_norm": M,
            "noise_std": info.noise_std,
            "batch_size": info.batch_size,
            "full_batch": info.full_batch,
            "noise_free": info.noise_free,
            "kept" + NONPRIVATE_SUFFIX: float(info.kept),
            "clip_fraction" + NONPRIVATE_SUFFIX: info.n_clipped / max(info.batch_size, 1),
        }
        return (q1 if accepted else q), stats
