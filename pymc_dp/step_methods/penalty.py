"""DPPenaltyMetropolis: the DP penalty algorithm as a PyMC step.

References
----------
.. [1] Yildirim, S. and Ermis, B. (2019). Exact MCMC with differentially private moves.
   Statistics and Computing 29(5), 947-963. [YildirimErmis2019]
.. [2] Räisä, O. (2021). Differentially Private Markov Chain Monte Carlo. MSc thesis,
   Sec. 3.1, Theorems 6-7. [Raisa2021]
.. [3] Räisä, Koskela, Honkela. Differentially Private Hamiltonian Monte Carlo, Sec. 3.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pymc_dp._validation import check_positive, check_positive_vector, check_unit_interval
from pymc_dp.accounting import GaussianEvent, calibrate_noise_multiplier
from pymc_dp.kernels.penalty import (
    accept,
    penalty_log_acceptance,
    penalty_noise_std,
    shared_penalty_log_acceptance,
)
from pymc_dp.step_methods.base import (
    NONPRIVATE_SUFFIX,
    WALK_STATS,
    DPStep,
    ScaleAdaptation,
    noise_or_target,
    scalar_stats,
)
from pymc_dp.step_methods.parts import (
    LikelihoodSettings,
    PrivacySettings,
    require_clip_bound,
    resolve_parts,
)
from pymc_dp.step_methods.proposals import (
    WALKS,
    ControlVariate,
    Coordinates,
    CoordinateWalk,
    Independent,
    RandomWalk,
)

__all__ = ["DPPenaltyMetropolis"]

_PROPOSALS = ("gaussian", "coordinate", "guided", "independent")
_TARGET_ACCEPT = {"gaussian": 0.234, "coordinate": 0.44, "guided": 0.44, "independent": 0.44}


class DPPenaltyMetropolis(ScaleAdaptation, DPStep):
    r"""Differentially private random-walk Metropolis with the penalty test.

    Each iteration proposes $\theta' = \theta + s\,S \odot \xi$ (full vector, one
    coordinate, or a guided one-coordinate walk), computes the per-record log-likelihood
    ratios $r_i = \log p(x_i|\theta') - \log p(x_i|\theta)$ clipped to
    $\pm b\|\theta'-\theta\|_2$, and accepts if

    $$
    \log u < \sum_i \mathrm{clip}(r_i) + \xi + \log\frac{p(\theta')}{p(\theta)}
    + \log\frac{q(\theta|\theta')}{q(\theta'|\theta)} - \frac{\sigma^2}{2},
    \quad \xi \sim N(0, \sigma^2),\ \sigma = z\,2b\,\|\theta'-\theta\|_2
    $$

    (Yildirim & Ermis 2019; thesis Sec. 3.1). Each iteration is one Gaussian mechanism with
    privacy-loss parameter $\mu = 1/(2z^2)$ under replace-one neighbours (thesis
    Theorem 7); a run of $k$ iterations over all chains composes to
    $\mu = k/(2z^2)$ (Sommer et al. 2019, Lemma 12). With clipping inactive the chain is
    exact (the penalty correction).

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables of the model).
    privacy : PrivacySettings
        The noise and what it is calibrated to (`PrivacySettings`); the fields this
        step reads:

        - ``clip_bound`` (float): ``b``: per-record log-likelihood ratios are clipped to ``+-b
          ||theta' - theta||``. Choose it from knowledge of the model (e.g. a Lipschitz bound of the
          log-likelihood), not by looking at the data: tuning it on the private data costs privacy.
        - ``noise_multiplier`` (float, optional): ``z`` (noise std over sensitivity). Give either
          this or ``epsilon``/``delta`` with the planned ``draws``, ``tune`` and ``chains``.
        - ``epsilon``, ``delta`` (float, optional): Target privacy of the whole planned run (all
          chains, warmup included); ``z`` is calibrated so that the run's epsilon never exceeds the
          target.
        - ``draws``, ``tune``, ``chains`` (int, optional): The planned run. A chain asked to run
          more than ``draws + tune`` iterations stops with `BudgetExceededError` before it reads the
          data again.
        - ``nonprivate_diagnostics`` (bool): Also emit ``clip_fraction_NONPRIVATE``, the fraction of
          clipped ratios, computed from the data WITHOUT noise. Not differentially private; the
          privacy report flags the run.
    proposal : RandomWalk, CoordinateWalk, GuidedWalk or Independent, optional
        The proposal (`pymc_dp.RandomWalk`, the default: a full-vector Gaussian random walk
        with per-coordinate scales or a public covariance; `pymc_dp.CoordinateWalk`, one
        coordinate at a time; `pymc_dp.GuidedWalk`, one coordinate, direction flipped after a
        rejection, Gustafson 1998, Yildirim & Ermis 2019; `pymc_dp.Independent`,
        $\theta' \sim N(m, s^2 \Sigma)$, e.g. a private Laplace approximation, whose Hastings
        ratio $\log q(\theta)/q(\theta')$ enters the test, Yildirim & Ermis 2019 Sec. 3, with
        optional local random-walk moves and data-free moves of the likelihood-free
        coordinates). The walks' global scale ``s`` is adapted during warmup from the
        acceptance decisions only (post-processing of DP outputs) toward their
        ``target_accept`` (default 0.234 for the full vector, 0.44 for one coordinate); an
        independence proposal's is not (it is calibrated: shrinking it toward a target rate
        freezes the chain). Choose every setting from public knowledge or from DP outputs,
        never from the data.
    control_variate : ControlVariate, optional
        A first-order control variate (`pymc_dp.ControlVariate`): the test uses
        $\sum_i \mathrm{clip}(r_i - c_i\cdot\Delta\theta) + \tilde G\cdot\Delta\theta$ with
        $c_i$ the per-record gradient at ``anchor`` clipped to ``grad_bound`` and
        $\tilde G$ = ``grad_sum``, which must be a *released* (noisy, accounted) value of
        $\sum_i c_i$, e.g. from the automatic warm start. The clipped residuals have the
        same sensitivity ``2 b ||dtheta||`` as the ratios but are second order in the step,
        so a far smaller ``clip_bound`` leaves them unclipped ([Bardenet2017],
        Sec. 6, Taylor proxies). The chain then targets the posterior tilted by the noise of
        ``grad_sum`` (exactly ``exp(xi . theta)`` with ``xi`` that noise). The step records
        that it used such a release (stat ``dp_needs_presample``): `pymc_dp.privacy_report`
        refuses to vouch for a result that does not carry that release's account (the
        ``dp_presample_mu`` attribute `pymc_dp.sample` writes in automatic mode; set it
        yourself, with ``dp_presample_releases``, for a release of your own). The tuple
        ``(anchor, grad_sum, grad_bound)`` is accepted too (deprecated).
    coordinates : Coordinates, optional
        The coordinates the proposal works in (`Coordinates`): the identity (None or
        ``Coordinates()``, default) or a data-free bijection ``y = T(theta)``
        (``Coordinates(transform)``, e.g. with `pymc_dp.auto.recentre.Recentring`: the
        recentred and shifted blocks; a bare transform is taken as ``Coordinates(transform)``):
        ``y' = y + ...`` for the walks,
        ``y' ~ N(m, s^2 Sigma)`` for `Independent` (its mean and covariance are then in
        ``y``), and ``theta' = T^{-1}(y')``. The Hastings ratio gains
        ``log |det J(theta)| - log |det J(theta')|`` (the proposal's density in ``theta``),
        so the chain still targets the posterior of ``theta``. With ``control_variate`` the
        linearisation is in ``y`` too: ``c_i`` are the per-record gradients in ``y`` at the
        anchor (``J^{-T}`` applied before clipping) and the step is ``T(theta') - T(theta)``;
        ``grad_sum`` must then be the released sum of those ``c_i``. Its ``likelihood_free``
        mask (from the model's graph: e.g. ``mu`` and ``log tau`` once ``a = mu + tau z``
        replaces ``z``) is what the proposal's ``free_moves`` move.
    clip_metric : array, optional
        A public matrix ``M`` ``(k, d)`` (from public knowledge or DP outputs): the step's
        length is ``s = ||M dy||``, with ``dy`` the step in the proposal's coordinates (``y``
        with ``coordinates``), instead of ``||theta' - theta||``; the ratios (or
        residuals) are clipped to ``+-b s`` and the noise is ``z 2 b s``. Any data-free
        length keeps the test a Gaussian mechanism with sensitivity ``2 b s`` and the same
        privacy; a length that follows what the likelihood reads (e.g. whitened steps of the
        coordinates the likelihood reads, zero on the others) clips fewer records at a given
        noise. Default: the Euclidean length of ``theta' - theta``.
    likelihood : LikelihoodSettings, optional
        How the records are read (`LikelihoodSettings`); its fields:

        - ``tempering`` (float): Likelihood temperature ``T`` (thesis Sec. 3.2).
        - ``chunk_size`` (int, optional): Records per call of the compiled likelihood (bounded
          memory for large ``n``).
        - ``data_free_potentials`` (bool): Declare that every ``pm.Potential`` of the model is free
          of the data.
        - ``records`` (pymc_dp.distributed.DaskRecords, optional): The records on a Dask cluster
          (default: the model's data, in memory). With data owners (``DaskRecords(...,
          owners=...)``) the step runs the data-sharing scheme of Yildirim & Ermis (2019), Sec.
          3.2.2, Algorithm 2: each of the ``K`` owners adds its own ``N(0, sigma^2)`` to its own
          clipped sum, the test's penalty correction is ``K sigma^2 / 2`` and ``noise_std`` is the
          total ``sqrt(K) sigma``; each owner's privacy against the curator and the other owners is
          that of the central scheme at the same ``z`` (``dp_owners`` records ``K``).
    **deprecated
        The keywords above by their former names (``clip_bound=``, ``epsilon=``,
        ``tempering=``, ...), folded into ``privacy`` and ``likelihood``, and the proposal's
        (a kind string ``proposal="gaussian"``, ``"coordinate"``, ``"guided"`` or
        ``"independent"`` with ``proposal_scale``, ``proposal_cov``, ``proposal_mean``,
        ``local_moves``, ``free_moves``, ``scaling``, ``target_accept``),
        ``control_variate_basis`` and ``reparametrization`` (``coordinates``): deprecated,
        kept for the 0.1 releases (docs/api.md).
    """

    name = "dp_penalty_metropolis"
    remote_records = True
    data_sharing = True
    stats_dtypes_shapes = {
        **DPStep.stats_dtypes_shapes,
        **WALK_STATS,
        **scalar_stats("clip_fraction" + NONPRIVATE_SUFFIX),
    }

    def __init__(
        self,
        vars=None,
        *,
        privacy: PrivacySettings | None = None,
        proposal: RandomWalk | CoordinateWalk | Independent | None = None,
        control_variate: ControlVariate | None = None,
        coordinates: Coordinates | None = None,
        clip_metric=None,
        likelihood: LikelihoodSettings | None = None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **deprecated: Any,
    ) -> None:
        privacy, likelihood, old = resolve_parts(
            type(self), privacy, likelihood, deprecated, extra=_OLD_KEYWORDS
        )
        # Validate everything before the data is touched.
        p = _proposal_settings(proposal, old)
        cv, basis, coordinates = _other_parts(control_variate, coordinates, old)
        self.clip_bound = require_clip_bound(type(self), privacy.clip_bound)
        given = proposal is not None and not isinstance(proposal, str)
        #: the proposal object (built from the deprecated keywords when they were used)
        self.proposal = proposal if given else _proposal_object(p)
        self._kind = p["kind"]
        try:
            self.local_moves = float(p["local_moves"])
        except (TypeError, ValueError):
            self.local_moves = float("nan")
        if not 0.0 <= self.local_moves < 1.0:
            raise ValueError(
                f"local_moves must be a probability in [0, 1); got {p['local_moves']!r}"
            )
        if self.local_moves and self._kind != "independent":
            raise ValueError("local_moves goes with proposal='independent'")
        self._local = False
        self.scaling = check_positive(p["scaling"], "scaling", coerce=True)
        target_accept = p["target_accept"]
        self.target_accept = check_unit_interval(
            _TARGET_ACCEPT[self._kind] if target_accept is None else target_accept,
            "target_accept",
        )
        z, plan, self.epsilon, delta = noise_or_target(
            privacy,
            noise_given=privacy.noise_multiplier is not None,
            noise=lambda: check_positive(privacy.noise_multiplier, "noise_multiplier", coerce=True),
            calibrate=lambda run, eps, d: calibrate_noise_multiplier(eps, d, run.iterations),
        )
        self.noise_multiplier = float(z)
        self._mu_per_iteration = GaussianEvent(self.noise_multiplier).mu
        self._releases_per_iteration = 1
        self._reset_scaling()
        self._setup(
            vars, privacy, likelihood, plan, delta, model=model, rng=rng,
            initial_point=initial_point, compile_kwargs=compile_kwargs, blocked=blocked,
        )  # fmt: skip
        d = self._fns.ndim
        self.proposal_scale = check_positive_vector(p["scale"], "proposal_scale", d)
        self._chol, self.proposal_mean = _check_proposal_shape(
            self._kind, p["cov"], p["mean"], self.proposal_scale, d
        )
        self.control_variate = _check_control_variate(cv, d)
        # its gradient sum is a release made before the chains: the report needs its account
        self._needs_presample = self.control_variate is not None
        #: the coordinates the proposal works in (`Coordinates`; the identity by default)
        self.coordinates = coordinates
        self.local_scaling = 2.38 / np.sqrt(d)
        self._cv_map, self._cv_dir = _control_variate_maps(
            self.control_variate, basis, coordinates, d
        )
        self.clip_metric = _check_clip_metric(clip_metric, d)
        self.free_moves, self._free = _check_free_moves(p["free_moves"], coordinates, self._chol, d)
        self._reset_chain_state()

    @staticmethod
    def _parts_from_keywords(keywords: dict[str, Any]) -> dict[str, Any]:
        """The parts of a call written with the older keywords (`parts.from_keywords`)."""
        old = {k: keywords[k] for k in _OLD_KEYWORDS if k in keywords}
        named = ("proposal", "control_variate")
        rest = {k: v for k, v in keywords.items() if k not in old and k not in named}
        p = _proposal_settings(keywords.get("proposal"), old)
        cv, basis, coordinates = _other_parts(keywords.get("control_variate"), None, old)
        rest["proposal"] = _proposal_object(p)
        if cv is not None:
            rest["control_variate"] = ControlVariate(*cv, basis=basis)
        if not coordinates.identity:
            rest["coordinates"] = coordinates
        return rest

    def _reset_chain_state(self) -> None:
        d = self._fns.ndim
        self._direction = np.ones(d)
        self._reset_scaling()

    def _propose(self, q: np.ndarray) -> tuple[np.ndarray, int | None]:
        """A proposal in the sampler's coordinates (``y`` with a reparametrization)."""
        d = q.size
        if self._kind == "independent":
            if self.local_moves and self.rng.uniform() < self.local_moves:
                # a random-walk move with the same covariance (a mixture of two kernels that
                # each keep the target, chosen independently of the state)
                self._local = True
                return q + self.local_scaling * (self._chol @ self.rng.normal(size=d)), None
            self._local = False
            if self._free is not None:  # the free coordinates stay: y_L ~ N(. | y_F)
                f = self._free
                y1 = q.copy()
                y1[f.read] = f.mean(q, self.proposal_mean) + self.scaling * (
                    f.chol_read @ self.rng.normal(size=f.chol_read.shape[0])
                )
                return y1, None
            return self.proposal.propose(self.rng, q, self.scaling), None
        if self._kind == "gaussian":
            return self.proposal.propose(self.rng, q, self.scaling), None
        direction = self._direction if self._kind == "guided" else None
        return self.proposal.propose(self.rng, q, self.scaling, direction)

    def _log_q_ratio(self, q: np.ndarray, q1: np.ndarray) -> float:
        """``log q(q | q1) - log q(q1 | q)`` in the proposal's coordinates: 0 for the
        symmetric walks (data-free)."""
        if self._kind != "independent" or self._local:
            return 0.0
        if self._free is not None:  # the conditional density of y_L given the same y_F
            f = self._free
            m = f.mean(q, self.proposal_mean)
            w0 = np.linalg.solve(f.chol_read, q[f.read] - m) / self.scaling
            w1 = np.linalg.solve(f.chol_read, q1[f.read] - m) / self.scaling
            return float(0.5 * (w1 @ w1 - w0 @ w0))
        w0 = np.linalg.solve(self._chol, q - self.proposal_mean) / self.scaling
        w1 = np.linalg.solve(self._chol, q1 - self.proposal_mean) / self.scaling
        return float(0.5 * (w1 @ w1 - w0 @ w0))

    def _dp_astep(self, q0):
        q = q0.data
        rp = self.coordinates
        if rp.identity:
            q1, j = self._propose(q)
            log_q = self._log_q_ratio(q, q1)
            dy = q1 - q
        else:
            # propose in y = T(q); the proposal's density in q carries |det J| (change of
            # variables), so the chain still targets the posterior of q
            y, log_det = rp.forward_with_log_det(q)
            y1, j = self._propose(y)
            q1 = rp.inverse(y1)
            log_det1 = rp.log_det_jacobian(q1)
            log_q = self._log_q_ratio(y, y1) + log_det - log_det1
            dy = y1 - y
        # the step's length: any data-free function of (q, q1) (the sensitivity is 2 b norm)
        step = q1 - q if self.clip_metric is None else self.clip_metric @ dy
        norm = float(np.linalg.norm(step))
        bound = self.clip_bound * norm
        lp0 = self._prior_logp(q)
        lp1 = self._fns.prior_logp(q1)
        sigma = penalty_noise_std(self.noise_multiplier, self.clip_bound, norm)
        # -- the one data access of the iteration: a Gaussian mechanism ------------------------
        if self._owners:  # data-sharing: every owner adds its own noise (Algorithm 2)
            noisy = self._fns.shared_clipped_loglik_ratio_sum(q1, q, bound, sigma)
            log_a = shared_penalty_log_acceptance(noisy, lp1 - lp0, log_q, sigma, self._owners)
            n_clipped, sigma = np.nan, float(np.sqrt(self._owners) * sigma)
        else:
            if self.control_variate is None:
                llr, n_clipped = self._fns.clipped_loglik_ratio_sum(q1, q, bound)
            else:
                anchor, grad_sum, grad_bound = self.control_variate
                dc = dy if self._cv_dir is None else self._cv_dir @ dy
                llr, n_clipped = self._fns.clipped_residual_ratio_sum(
                    q1, q, bound, anchor, grad_bound, self._cv_map, dc
                )
                llr += float(grad_sum @ dc)  # post-processing of a released sum
            log_a = penalty_log_acceptance(llr, lp1 - lp0, log_q, sigma, self.rng)
        # -- everything below is post-processing of the noisy ratio -----------------------------
        accepted = accept(log_a, self.rng)
        if self._kind == "guided" and not accepted:
            self._direction[j] = -self._direction[j]
        q_out, lp_out = (q1, lp1) if accepted else (q, lp0)
        if self.free_moves:  # data-free: the prior of y along what the likelihood ignores
            y_out, ld_out = (y1, log_det1) if accepted else (y, log_det)
            q_out, lp_out = self._free_moves(q_out, y_out, lp_out, ld_out)
        self._remember_prior(q_out, lp_out)
        if self.tune and self._kind != "independent":
            # an independence proposal is calibrated (e.g. a private Laplace approximation):
            # its scale is not adapted. Driven toward a target acceptance rate from the low
            # acceptance of a noisy test it shrinks without bound (to ~1e-6 over 300
            # iterations), and the Hastings ratio of a state far from the proposal's mean in
            # those units then rejects every proposal: the chain freezes.
            self._adapt_scaling(accepted)
        stats = {
            "accepted": float(accepted),
            "accept": float(np.exp(min(0.0, log_a))) if np.isfinite(log_a) else 0.0,
            "scaling": self.scaling,
            "step_norm": norm,
            "noise_std": sigma,
            "clip_fraction" + NONPRIVATE_SUFFIX: n_clipped / self._fns.n_records,
        }
        return q_out, stats

    def _free_moves(
        self, q: np.ndarray, y: np.ndarray, lp: float, log_det: float
    ) -> tuple[np.ndarray, float]:
        """``free_moves`` random-walk Metropolis moves of the likelihood-free coordinates of
        ``y = T(q)``, targeting the density of ``y``, ``p(q) / |det J(q)|`` (no record is
        read: the log-likelihood does not change along these coordinates). ``y``, the log
        prior ``lp`` and ``log_det`` at ``q`` come from the test's own evaluations. Returns
        the new ``q`` and its log prior."""
        rp, f = self.coordinates, self._free
        target = lp - log_det
        for _ in range(self.free_moves):
            y1 = y.copy()
            y1[f.free] += f.chol_free @ self.rng.normal(size=f.chol_free.shape[0])
            q1 = rp.inverse(y1)
            lp1 = self._fns.prior_logp(q1)
            target1 = lp1 - rp.log_det_jacobian(q1)
            if np.log(self.rng.uniform()) < target1 - target:
                y, q, lp, target = y1, q1, lp1, target1
        return q, lp


#: The older keywords that the proposal, control variate and coordinates objects replace
#: (deprecated; folded into the objects by `_proposal_settings` and `_other_parts`).
_OLD_PROPOSAL = (
    "proposal_scale",
    "proposal_cov",
    "proposal_mean",
    "local_moves",
    "free_moves",
    "scaling",
    "target_accept",
)
_OLD_KEYWORDS = (*_OLD_PROPOSAL, "control_variate_basis", "reparametrization")


def _proposal_settings(proposal, old: dict[str, Any]) -> dict[str, Any]:
    """The proposal's settings as one flat dict (``kind``, ``scale``, ``cov``, ``mean``,
    ``local_moves``, ``free_moves``, ``scaling``, ``target_accept``): from a proposal object,
    or from the older keywords (a kind string and ``proposal_*``, deprecated)."""
    given = [k for k in _OLD_PROPOSAL if k in old]
    if proposal is None or isinstance(proposal, str):
        kind = "gaussian" if proposal is None else proposal
        if kind not in _PROPOSALS:
            raise ValueError(
                f"proposal must be a proposal object (pymc_dp.RandomWalk, CoordinateWalk, "
                f"GuidedWalk, Independent) or, deprecated, one of {_PROPOSALS}; got {proposal!r}"
            )
        return {
            "kind": kind,
            "scale": old.get("proposal_scale", 1.0),
            "cov": old.get("proposal_cov"),
            "mean": old.get("proposal_mean"),
            "local_moves": old.get("local_moves", 0.0),
            "free_moves": old.get("free_moves", 0),
            "scaling": old.get("scaling", 1.0),
            "target_accept": old.get("target_accept"),
        }
    if not isinstance(proposal, RandomWalk | CoordinateWalk | Independent):
        raise TypeError(
            "proposal must be pymc_dp.RandomWalk, CoordinateWalk, GuidedWalk or Independent; "
            f"got {type(proposal).__name__}"
        )
    if given:
        raise TypeError(f"{given}: give them in the proposal object, not as keywords")
    if isinstance(proposal, RandomWalk) and proposal.max_step is not None:
        raise ValueError("RandomWalk max_step is DPFastMH's truncation; leave it None here")
    return {
        "kind": proposal.kind,
        "scale": getattr(proposal, "scale", 1.0),
        "cov": getattr(proposal, "cov", None),
        "mean": getattr(proposal, "mean", None),
        "local_moves": getattr(proposal, "local_moves", 0.0),
        "free_moves": getattr(proposal, "free_moves", 0),
        "scaling": proposal.scaling,
        "target_accept": getattr(proposal, "target_accept", None),
    }


def _proposal_object(p: dict[str, Any]) -> RandomWalk | CoordinateWalk | Independent:
    """The proposal object of flat settings (`_proposal_settings`)."""
    if p["kind"] == "independent":
        return Independent(p["mean"], p["cov"], p["scaling"], p["local_moves"], p["free_moves"])
    if p["kind"] == "gaussian":
        return RandomWalk(
            p["scale"], p["cov"], p["scaling"], p["target_accept"], free_moves=p["free_moves"]
        )
    return WALKS[p["kind"]](p["scale"], p["scaling"], p["target_accept"])


def _other_parts(control_variate, coordinates, old: dict[str, Any]):
    """``(control variate tuple or None, its basis, Coordinates)`` from the objects or the
    older keywords (a tuple ``control_variate``, ``control_variate_basis``,
    ``reparametrization``; deprecated). A bare transform (or None) is wrapped in
    `Coordinates` (checked here, before any data is read)."""
    basis = old.get("control_variate_basis")
    if isinstance(control_variate, ControlVariate):
        if "control_variate_basis" in old:
            raise TypeError("control_variate_basis: give it as ControlVariate(basis=...)")
        basis, control_variate = control_variate.basis, control_variate.as_tuple()
    if "reparametrization" in old:
        if coordinates is not None:
            raise TypeError("give coordinates= (reparametrization= is its deprecated name)")
        coordinates = old["reparametrization"]
    return control_variate, basis, Coordinates(coordinates)


def _check_proposal_shape(proposal, cov, mean, scale, d):
    """Cholesky factor of ``proposal_cov`` and the independence mean, validated."""
    if cov is None:
        if proposal == "independent" or mean is not None:
            raise ValueError(
                "proposal='independent' needs proposal_cov=(d, d) and proposal_mean=(d,); "
                "proposal_mean goes only with proposal='independent'"
            )
        return None, None
    if proposal not in ("gaussian", "independent"):
        raise ValueError(
            f"proposal_cov goes with proposal='gaussian' or 'independent'; got {proposal!r}"
        )
    if np.any(scale != 1.0):
        raise ValueError("give proposal_cov or proposal_scale, not both")
    cov = np.asarray(cov, dtype=float)
    if cov.shape != (d, d) or not np.all(np.isfinite(cov)) or not np.allclose(cov, cov.T):
        raise ValueError(f"proposal_cov must be a finite symmetric ({d}, {d}) matrix")
    try:
        chol = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        raise ValueError("proposal_cov must be positive definite") from None
    if proposal == "gaussian":
        if mean is not None:
            raise ValueError("proposal_mean goes only with proposal='independent'")
        return chol, None
    mean = np.asarray(mean, dtype=float) if mean is not None else None
    if mean is None or mean.shape != (d,) or not np.all(np.isfinite(mean)):
        raise ValueError(f"proposal='independent' needs a finite proposal_mean of shape ({d},)")
    return chol, mean


def _control_variate_maps(cv, basis, coordinates: Coordinates, d):
    """``(M, D)``: the control variate's gradients ``M g_i`` and steps ``D dy`` (public)."""
    if basis is None:
        m = None if cv is None else coordinates.gradient_map(cv[0])
        return m, None
    if cv is None:
        raise ValueError("control_variate_basis goes with control_variate")
    basis = np.asarray(basis, dtype=float)
    if basis.shape != (d, d) or not np.all(np.isfinite(basis)):
        raise ValueError(f"control_variate_basis must be a finite ({d}, {d}) matrix")
    try:
        m = np.linalg.inv(basis)
    except np.linalg.LinAlgError:
        raise ValueError("control_variate_basis must be invertible") from None
    if not coordinates.identity:
        m = m @ coordinates.gradient_map(cv[0])
    return m, basis.T


class _FreeBlock:
    """The likelihood-free coordinates ``free`` of ``y`` and the others, ``read``: the
    independence proposal's Gaussian conditioned on ``y_free`` (mean map and Cholesky factor)
    and the free moves' random-walk factor (all public: from ``proposal_cov``)."""

    def __init__(self, free: np.ndarray, chol: np.ndarray) -> None:
        self.free, self.read = free, ~free
        prec = np.linalg.inv(chol @ chol.T)
        p_rr = prec[np.ix_(self.read, self.read)]
        self._gain = np.linalg.solve(p_rr, prec[np.ix_(self.read, self.free)])
        self.chol_read = np.linalg.cholesky(np.linalg.inv(p_rr))
        cov_ff = np.linalg.inv(prec[np.ix_(self.free, self.free)])
        self.chol_free = 2.38 / np.sqrt(free.sum()) * np.linalg.cholesky(cov_ff)

    def mean(self, y: np.ndarray, m: np.ndarray) -> np.ndarray:
        """Mean of ``y_read`` given ``y_free`` under ``N(m, s^2 Sigma)`` (any ``s``)."""
        return m[self.read] - self._gain @ (y[self.free] - m[self.free])


def _check_free_moves(k, coordinates: Coordinates, chol, d):
    """``(free_moves, _FreeBlock or None)`` validated."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"free_moves must be a non-negative integer; got {k!r}")
    if not k:
        return 0, None
    free = coordinates.likelihood_free
    if free is None:
        raise ValueError(
            "free_moves needs a reparametrization with a likelihood_free mask "
            "(coordinates=Coordinates(transform), e.g. with pymc_dp.auto.recentre.Recentring): "
            "the coordinates no record's log-likelihood reads"
        )
    free = np.asarray(free, dtype=bool)
    if free.shape != (d,) or not free.any() or free.all():
        raise ValueError(
            "free_moves: the reparametrization's likelihood_free mask must have shape "
            f"({d},) and mark some but not all coordinates"
        )
    if chol is None:
        raise ValueError("free_moves needs proposal_cov (the moves' covariance comes from it)")
    return int(k), _FreeBlock(free, chol)


def _check_clip_metric(metric, d):
    """``clip_metric`` as a finite ``(k, d)`` array, or None."""
    if metric is None:
        return None
    try:
        m = np.asarray(metric, dtype=float)
    except (TypeError, ValueError):
        raise ValueError("clip_metric must be a (k, d) array of numbers") from None
    if m.ndim != 2 or m.shape[1] != d or m.shape[0] < 1 or not np.all(np.isfinite(m)):
        raise ValueError(
            f"clip_metric must be a finite (k, {d}) array (k >= 1): the public matrix M of the "
            f"step's length ||M dy||; got shape {m.shape}"
        )
    if not np.any(m):
        raise ValueError("clip_metric must not be all zeros (every step would have length 0)")
    return m


def _check_control_variate(cv, d):
    """``(anchor, grad_sum, grad_bound)`` validated, or None."""
    if cv is None:
        return None
    try:
        anchor, grad_sum, grad_bound = cv
    except (TypeError, ValueError):
        raise ValueError("control_variate must be (anchor, grad_sum, grad_bound)") from None
    anchor = np.asarray(anchor, dtype=float)
    grad_sum = np.asarray(grad_sum, dtype=float)
    if anchor.shape != (d,) or grad_sum.shape != (d,):
        raise ValueError(f"control_variate: anchor and grad_sum must have shape ({d},)")
    if not (np.all(np.isfinite(anchor)) and np.all(np.isfinite(grad_sum))):
        raise ValueError("control_variate: anchor and grad_sum must be finite")
    return anchor, grad_sum, check_positive(grad_bound, "control_variate grad_bound", coerce=True)
