"""Run the papers' experiment protocol with pymc_dp's step methods.

Protocol of the DP-HMC paper (Räisä, Koskela & Honkela, Sec. 4; settings in
docs/results.md): for each (method, epsilon, repeat), 4 chains that
share one privacy budget start around the true parameter (std = mean of the reference
posterior's componentwise sds); the second halves of the chains are pooled and compared with
1000 exact reference draws by the MMD and the distance of the means.

Two ways of spending the budget:

- ``protocol="paper"`` (the paper's): the noise is fixed by the paper's ``tau``
  (noise std ``tau sqrt(n) 2 b``, i.e. pymc_dp noise multiplier ``z = tau sqrt(n)``, privacy
  loss ``mu = 1 / (2 tau^2 n)`` per release) and the chains run as many iterations as the
  budget allows: ``k = floor(mu*(epsilon, delta) / (chains * mu_iteration))`` per chain, where
  ``mu*`` is the largest total ``mu`` with tight Gaussian epsilon <= target
  (`pymc_dp.accounting.gaussian_mu_for_epsilon`). No warmup, no adaptation.
- ``protocol="calibrated"`` (pymc_dp's): the run length is fixed (``draws``, ``tune``) and
  `pymc_dp.sample` calibrates the noise for it; warmup adaptation is on.
- ``protocol="auto"`` (method ``"auto"`` only): the automatic mode,
  ``pymc_dp.sample(step=None)`` (docs/auto.md), given nothing but public information: the
  model, epsilon, delta, the chains and a cap on the total number of penalty-test iterations,
  the paper's DP penalty run length at this epsilon (`auto_iteration_budget`). It chooses its
  clip bound, proposal, run length and starting points privately; every phase is in the
  privacy report.

Either way the privacy report of the finished run (`pymc_dp.privacy_report`) gives the
epsilon that is recorded, and the runner checks it is at most the target.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import pymc_dp
from pymc_dp.accounting import GaussianEvent, gaussian_epsilon, gaussian_mu_for_epsilon
from pymc_dp.experiments.metrics import convergence, mean_error, mmd, mmd_paper_scale
from pymc_dp.experiments.models import MODELS, ExperimentModel, posterior_matrix

__all__ = [
    "CSV_FIELDS",
    "METHODS",
    "MethodSetting",
    "MethodSpec",
    "AUTO",
    "RunResult",
    "auto_iteration_budget",
    "comparison_table",
    "merge_results",
    "paper_iterations_per_chain",
    "register_method",
    "run_experiment",
    "run_one",
    "summary_table",
]

#: Columns of the results CSV, in order. ``mmd2_u`` is the unbiased squared MMD (what
#: `pymc_dp.experiments.mmd` returns); ``mmd_paper`` is ``sqrt(|mmd2_u|)``, the number the
#: DP-HMC paper's code reports and its Figure 1 plots. CSVs written before these two columns
#: existed have one column ``mmd`` (= ``mmd2_u``); `read_results` reads both layouts.
CSV_FIELDS = [
    "model",
    "method",
    "protocol",
    "n",
    "epsilon_target",
    "epsilon_reported",
    "delta",
    "chains",
    "iterations_per_chain",
    "tune",
    "repeat",
    "seed",
    "mmd2_u",
    "mmd_paper",
    "mean_error",
    "rhat",
    "ess",
    "accept_rate",
    "noise",
    "settings",
    "seconds",
]
#: The columns of `CSV_FIELDS` that hold text; `read_results` reads the others as numbers.
_TEXT_FIELDS = ("model", "method", "protocol", "noise", "settings")


@dataclass(frozen=True)
class MethodSetting:
    """Hyperparameters of one method on one model.

    Attributes
    ----------
    step_kwargs : dict
        Data-free arguments of the step class (clip bounds, step sizes, ...), used by both
        protocols.
    paper_noise : dict, optional
        The paper's fixed noise as step arguments (e.g. ``{"noise_multiplier": z}``); with
        ``paper_mu`` it enables ``protocol="paper"``. Built from the paper's ``tau`` and ``n``.
    paper_mu : float, optional
        Privacy-loss parameter ``mu`` of one iteration at ``paper_noise``.
    paper_kwargs : dict
        Extra step arguments for the paper protocol only (e.g. adaptation switched off).
    draws, tune : int
        Run length of ``protocol="calibrated"``.
    """

    step_kwargs: dict
    paper_noise: dict | None = None
    paper_mu: float | None = None
    paper_kwargs: dict = field(default_factory=dict)
    draws: int = 1000
    tune: int = 500


@dataclass
class MethodSpec:
    """A sampler of the comparison: a step class and its settings per model.

    Attributes
    ----------
    name : str
    step_class : type
        A `pymc_dp.DPStep` subclass (or any callable building a step from
        ``model=``, the settings' kwargs and ``delta``, ``draws``, ``tune``, ``chains``).
    settings : dict
        Model name -> callable ``(ExperimentModel) -> MethodSetting``.
    """

    name: str
    step_class: type
    settings: dict[str, Callable[[ExperimentModel], MethodSetting]]

    def setting(self, exp: ExperimentModel) -> MethodSetting:
        if exp.name not in self.settings:
            raise ValueError(
                f"method {self.name!r} has no settings for model {exp.name!r}; it supports "
                f"{sorted(self.settings)}"
            )
        return self.settings[exp.name](exp)


def _hmc_mu(z_l: float, z_g: float, n_leapfrog: int) -> float:
    """mu of one DP-HMC iteration: one ratio release + (L + 1) gradient releases (Thm 3.5)."""
    return GaussianEvent(z_l).mu + GaussianEvent(z_g, n_leapfrog + 1).mu


def _dphmc_setting(
    tau_l: float, tau_g: float, eta: float, n_leapfrog: int, llr_clip: float, grad_clip: float
) -> Callable[[ExperimentModel], MethodSetting]:
    def make(exp: ExperimentModel) -> MethodSetting:
        z_l, z_g = tau_l * math.sqrt(exp.n), tau_g * math.sqrt(exp.n)
        return MethodSetting(
            step_kwargs={
                "llr_clip_bound": llr_clip,
                "grad_clip_bound": grad_clip,
                "n_leapfrog": n_leapfrog,
                "step_size": eta,
                "tempering": exp.info.get("tempering", 1.0),
            },
            paper_noise={"llr_noise_multiplier": z_l, "grad_noise_multiplier": z_g},
            paper_mu=_hmc_mu(z_l, z_g, n_leapfrog),
            paper_kwargs={"adapt_step_size": False, "adapt_mass_matrix": False},
            draws=500,
            tune=250,
        )

    return make


def _penalty_setting(
    tau: float, proposal_sd: float, clip: float
) -> Callable[[ExperimentModel], MethodSetting]:
    def make(exp: ExperimentModel) -> MethodSetting:
        z = tau * math.sqrt(exp.n)
        return MethodSetting(
            step_kwargs={
                "clip_bound": clip,
                "proposal": "gaussian",
                "proposal_scale": proposal_sd,
                "tempering": exp.info.get("tempering", 1.0),
            },
            paper_noise={"noise_multiplier": z},
            paper_mu=GaussianEvent(z).mu,
            draws=2000,
            tune=1000,
        )

    return make


def _fastmh_mixture(exp: ExperimentModel) -> MethodSetting:
    # As examples/fastmh_mixture.py: the paper's c_i at the public truncation bound.
    return MethodSetting(
        step_kwargs={
            "clip_bound": exp.info["clip_bound"],
            "max_step": 0.5,
            "lam": 5000.0,
            "proposal_scale": 0.1,
            "target_accept": 0.3,
            "tempering": exp.info["tempering"],
        },
        draws=2500,
        tune=500,
    )


def _logistic_penalty(exp: ExperimentModel) -> MethodSetting:
    return MethodSetting(
        step_kwargs={"clip_bound": exp.info["clip_bound"], "proposal": "guided"},
        draws=1500,
        tune=500,
    )


def _logistic_dphmc(exp: ExperimentModel) -> MethodSetting:
    b = exp.info["clip_bound"]
    return MethodSetting(
        step_kwargs={"llr_clip_bound": b, "grad_clip_bound": b, "n_leapfrog": 5},
        draws=300,
        tune=200,
    )


def _logistic_fastmh(exp: ExperimentModel) -> MethodSetting:
    return MethodSetting(
        step_kwargs={
            "clip_bound": exp.info["clip_bound"],
            "max_step": 0.2,
            "lam": 2000.0,
            "proposal_scale": 0.03,
        },
        draws=1500,
        tune=500,
    )


#: Method registry: name -> MethodSpec. Register further samplers with
#: `register_method` (e.g. ``sgld``, ``sgnht``).
METHODS: dict[str, MethodSpec] = {
    "dphmc": MethodSpec(
        "dphmc",
        pymc_dp.DPHMC,
        {
            # DP-HMC paper code: tau_l, tau_g, eta, L, LLR clip, gradient clip.
            "banana": _dphmc_setting(0.10, 0.55, 0.006, 25, 0.1, 0.05),
            "gaussian": _dphmc_setting(0.1, 0.25, 1.5e-4, 12, 6.0, 10.0),
            "logistic": _logistic_dphmc,
        },
    ),
    "penalty": MethodSpec(
        "penalty",
        pymc_dp.DPPenaltyMetropolis,
        {
            # DP-HMC paper code: tau, proposal std, LLR clip.
            "banana": _penalty_setting(0.17, 0.06, 0.15),
            "gaussian": _penalty_setting(0.05, 7e-4, 10.0),
            "logistic": _logistic_penalty,
        },
    ),
    "fastmh": MethodSpec(
        "fastmh",
        pymc_dp.DPFastMH,
        {"mixture": _fastmh_mixture, "logistic": _logistic_fastmh},
    ),
}


def _sg_setting(
    clip: float, eta_paper: float, diffusion: float | None = None
) -> Callable[[ExperimentModel], MethodSetting]:
    """DP-SGLD (``diffusion=None``) or DP-SGNHT (diffusion ``A``) as the DP-HMC paper's
    baselines: batch 1000, the paper's clip and step size.

    The paper's code takes steps ``eta_p / n`` on the average gradient. pymc_dp's DP-SGLD
    drifts by ``step_size / 2`` times the summed gradient (docs/steps/sgmcmc.md), hence
    ``step_size = 2 eta_p / n``; its DP-SGNHT takes the paper's ``step_size = eta_p / n``.
    """
    thermostat = {} if diffusion is None else {"diffusion": diffusion}
    factor = 2.0 if diffusion is None else 1.0

    def make(exp: ExperimentModel) -> MethodSetting:
        return MethodSetting(
            step_kwargs={
                "clip_bound": clip,
                "step_size": factor * eta_paper / exp.n,
                **thermostat,
                "batch_size": min(1000, exp.n),
                "tempering": exp.info.get("tempering", 1.0),
            },
            draws=2000,
            tune=500,
        )

    return make


METHODS["sgld"] = MethodSpec(
    "sgld",
    pymc_dp.DPSGLD,
    # DP-HMC paper's baseline settings: clip / eta = 0.2 / 1 (banana), 15 / 0.008 (Gaussian).
    {"banana": _sg_setting(0.2, 1.0), "gaussian": _sg_setting(15.0, 0.008)},
)
METHODS["sgnht"] = MethodSpec(
    "sgnht",
    pymc_dp.DPSGNHT,
    # clip / eta / A = 0.2 / 100 / 50 (banana), 12 / 0.2 / 30 (Gaussian).
    {"banana": _sg_setting(0.2, 100.0, 50.0), "gaussian": _sg_setting(12.0, 0.2, 30.0)},
)


class AutoMode:
    """Marker ``step_class`` of the ``"auto"`` method: ``pymc_dp.sample(step=None)``.

    Not a step class: `run_one` calls the automatic mode (`pymc_dp.auto.auto_configure`, then
    `pymc_dp.DPPenaltyMetropolis`) instead of constructing a step.
    """


#: The ``step_class`` of the ``"auto"`` method.
AUTO = AutoMode


def _auto_setting(exp: ExperimentModel) -> MethodSetting:
    # Nothing to set by hand: the automatic mode chooses everything privately.
    return MethodSetting(step_kwargs={}, draws=0, tune=0)


METHODS["auto"] = MethodSpec(
    "auto",
    AUTO,
    {"banana": _auto_setting, "gaussian": _auto_setting, "mixture": _auto_setting},
)

#: Cap on the automatic mode's total iterations (all chains) where the paper ran no DP
#: penalty (the automatic mode's own default, `pymc_dp.auto.auto_configure`).
AUTO_DEFAULT_ITERATIONS = 20_000


def auto_iteration_budget(exp: ExperimentModel, epsilon: float, delta: float, chains: int) -> int:
    """Largest total number of penalty-test iterations the ``"auto"`` method may choose.

    The draw budget of the DP-HMC paper's own DP penalty run on this model at this epsilon
    (Räisä, Koskela & Honkela, Sec. 4: ``chains * k``, ``k`` from the paper's fixed noise and
    the budget, `paper_iterations_per_chain`), so that the automatic mode runs no more
    penalty tests than the hand-tuned DP penalty run it is compared with; at least
    ``chains * 50`` (the automatic mode's shortest chains). A model without the paper's DP
    penalty setting gets `AUTO_DEFAULT_ITERATIONS`. Data-free: a function of the public
    model size, epsilon, delta and chains.

    Parameters
    ----------
    exp : ExperimentModel
    epsilon, delta : float
        Target of the whole run.
    chains : int

    Returns
    -------
    int
    """
    spec = METHODS["penalty"]
    if exp.name not in spec.settings:
        return AUTO_DEFAULT_ITERATIONS
    setting = spec.setting(exp)
    if setting.paper_mu is None:
        return AUTO_DEFAULT_ITERATIONS
    k = paper_iterations_per_chain(setting.paper_mu, epsilon, delta, chains)
    return int(chains * max(k, 50))


def register_method(spec: MethodSpec) -> None:
    """Add (or replace) a method of the registry."""
    if not isinstance(spec, MethodSpec):
        raise ValueError(f"register_method needs a MethodSpec; got {type(spec).__name__}")
    METHODS[spec.name] = spec


def paper_iterations_per_chain(mu_iteration: float, epsilon: float, delta: float, chains: int):
    """Iterations per chain the budget allows at a fixed per-iteration ``mu`` (tight bound).

    ``k = floor(mu*(epsilon, delta) / (chains * mu_iteration))``, lowered while the tight
    Gaussian epsilon of ``chains * k * mu_iteration`` exceeds the target (rounding).
    """
    mu_star = gaussian_mu_for_epsilon(epsilon, delta)
    k = int(math.floor(mu_star / (chains * mu_iteration)))
    while k > 0 and gaussian_epsilon(chains * k * mu_iteration, delta) > epsilon:
        k -= 1
    return k


@dataclass
class RunResult:
    """One run: the CSV row and the pooled second-half draws."""

    row: dict
    draws: np.ndarray


def _run_seed(base_seed: int, model: str, method: str, epsilon: float, repeat: int) -> int:
    """Seed derived from (base seed, model, method, epsilon, repeat)."""
    tag = [ord(c) for c in f"{model}/{method}"]
    ss = np.random.SeedSequence([int(base_seed), int(round(epsilon * 1000)), int(repeat), *tag])
    return int(ss.generate_state(1)[0])


def _initvals(exp: ExperimentModel, points: np.ndarray) -> list[dict]:
    """Flat starting points -> per-chain initvals dicts keyed by variable name."""
    ip = exp.model.initial_point()
    rvs = {rv.name: rv for rv in exp.model.free_RVs}
    out = []
    for p in points:
        d, k = {}, 0
        for name in exp.var_names:
            value_name = exp.model.rvs_to_values[rvs[name]].name
            shape = np.shape(ip[value_name])
            size = int(np.prod(shape, dtype=int))
            d[name] = p[k : k + size].reshape(shape)
            k += size
        out.append(d)
    return out


def run_one(
    exp: ExperimentModel,
    method: str,
    epsilon: float,
    *,
    delta: float = 1e-6,
    chains: int = 4,
    repeat: int = 0,
    protocol: str = "paper",
    base_seed: int = 0,
    reference_draws: int = 1000,
    start_sd: float | None = None,
    draws: int | None = None,
    tune: int | None = None,
) -> RunResult:
    """One run of the protocol; returns the CSV row and the pooled second-half draws.

    Parameters
    ----------
    exp : ExperimentModel
    method : str
        A key of `METHODS`.
    epsilon : float
        Target epsilon of the whole run (all chains).
    delta : float
        Target delta of the whole run.
    chains : int
        Chains sharing the budget (paper: 4).
    repeat : int
        Repeat index (with ``base_seed``, ``method`` and ``epsilon`` it sets the seed).
    protocol : {"paper", "calibrated"}
        See the module docstring; ``"paper"`` needs the method's ``paper_noise``. Ignored by
        ``method="auto"``, which always runs ``protocol="auto"``: the automatic mode with
        nothing but public information (the model, epsilon, delta, ``chains`` and the
        iteration cap `auto_iteration_budget`); it chooses its own starting points (the
        paper's starts around the true theta are not public) and run length.
    base_seed : int
    reference_draws : int
        Exact reference draws (paper: 1000).
    start_sd : float, optional
        Spread of the starting points; default the mean of the reference posterior's
        componentwise sds (paper).
    draws, tune : int, optional
        Override the calibrated protocol's run length (with ``method="auto"``: fix the run
        length instead of letting the automatic mode choose it).

    Returns
    -------
    RunResult
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {sorted(METHODS)}")
    spec = METHODS[method]
    is_auto = spec.step_class is AUTO
    if is_auto:
        protocol = "auto"  # the automatic mode spends its budget its own way
    elif protocol not in ("paper", "calibrated"):
        raise ValueError(f"protocol must be 'paper' or 'calibrated'; got {protocol!r}")
    setting = spec.setting(exp)
    if protocol == "paper" and (setting.paper_noise is None or setting.paper_mu is None):
        raise ValueError(
            f"method {method!r} has no paper noise level for model {exp.name!r}; use "
            "protocol='calibrated'"
        )
    seed = _run_seed(base_seed, exp.name, method, epsilon, repeat)
    rng = np.random.default_rng(seed)
    ref = exp.reference(reference_draws, rng)
    if start_sd is None:
        start_sd = float(np.mean(exp.reference_sd()))
    starts = exp.true_theta + start_sd * rng.standard_normal((chains, exp.dim))
    sample_kwargs = {
        "chains": chains,
        "cores": 1,
        "progressbar": False,
        "compute_convergence_checks": False,
        "random_seed": seed % (2**31),
        "model": exp.model,
    }
    if not is_auto:
        # the paper's starts, around the true theta; the automatic mode starts its chains at
        # draws from its private Laplace approximation instead (the true theta is not public)
        sample_kwargs["initvals"] = _initvals(exp, starts)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if is_auto:
            max_iterations = auto_iteration_budget(exp, epsilon, delta, chains)
            setting = MethodSetting(step_kwargs={"max_iterations": max_iterations})
            idata = pymc_dp.sample(
                step=None,
                epsilon=epsilon,
                delta=delta,
                draws=draws,
                tune=tune,
                auto_kwargs={"max_iterations": max_iterations},
                **sample_kwargs,
            )
            n_tune = None  # chosen by the automatic mode: read from the report below
        elif protocol == "paper":
            k = paper_iterations_per_chain(setting.paper_mu, epsilon, delta, chains)
            if k < 2:
                raise ValueError(
                    f"epsilon={epsilon} allows {k} iteration(s) per chain of {method} at the "
                    f"paper's noise on {exp.name} (n={exp.n}): raise epsilon or n, or use "
                    "protocol='calibrated'"
                )
            n_draws, n_tune = k, 0
            with exp.model:
                step = spec.step_class(
                    model=exp.model,
                    delta=delta,
                    draws=n_draws,
                    tune=n_tune,
                    chains=chains,
                    **setting.step_kwargs,
                    **setting.paper_kwargs,
                    **setting.paper_noise,
                )
            idata = pymc_dp.sample(step=step, draws=n_draws, tune=n_tune, **sample_kwargs)
        else:
            n_draws = int(draws if draws is not None else setting.draws)
            n_tune = int(tune if tune is not None else setting.tune)
            idata = pymc_dp.sample(
                step=spec.step_class,
                epsilon=epsilon,
                delta=delta,
                draws=n_draws,
                tune=n_tune,
                step_kwargs=setting.step_kwargs,
                **sample_kwargs,
            )
    seconds = time.perf_counter() - t0
    report = pymc_dp.privacy_report(idata)
    if report.epsilon > epsilon * (1 + 1e-9):
        raise RuntimeError(
            f"the privacy report says epsilon={report.epsilon} > target {epsilon}: "
            "please report this"
        )
    post = posterior_matrix(idata, exp.var_names)
    if n_tune is None:
        n_tune = int(report.iterations // report.chains) - post.shape[1]
    half = post[:, post.shape[1] // 2 :, :]
    pooled = half.reshape(-1, exp.dim)
    finite = bool(np.all(np.isfinite(pooled)))
    ok = finite and half.shape[1] >= 4
    rhat, ess = convergence(half) if ok else (math.nan, math.nan)
    mmd2_u = mmd(pooled, ref, rng=rng) if finite else math.nan
    acc = float(np.asarray(idata["sample_stats"]["accepted"].values).mean())
    if protocol == "paper":
        noise = setting.paper_noise
    elif is_auto:  # the automatic mode's choices: DP outputs or data-free, safe to record
        noise = {"phases": str(idata.attrs.get("dp_phases", ""))}
    else:
        noise = {}
    row = {
        "model": exp.name,
        "method": method,
        "protocol": protocol,
        "n": exp.n,
        "epsilon_target": float(epsilon),
        "epsilon_reported": float(report.epsilon),
        "delta": float(report.delta),
        "chains": int(report.chains),
        "iterations_per_chain": int(report.iterations // report.chains),
        "tune": n_tune,
        "repeat": int(repeat),
        "seed": seed,
        # A diverged chain (e.g. DP-SGLD with too large a step) is a result, recorded as NaN.
        "mmd2_u": mmd2_u,
        "mmd_paper": mmd_paper_scale(mmd2_u),
        "mean_error": mean_error(pooled, ref) if finite else math.nan,
        "rhat": rhat,
        "ess": ess,
        "accept_rate": acc,
        "noise": json.dumps(noise),
        "settings": json.dumps({k: _jsonable(v) for k, v in setting.step_kwargs.items()}),
        "seconds": round(seconds, 3),
    }
    return RunResult(row=row, draws=pooled)


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.floating | np.integer):
        return v.item()
    return v


def run_experiment(
    model: str,
    methods: Sequence[str],
    epsilons: Sequence[float],
    *,
    repeats: int = 10,
    first_repeat: int = 0,
    n: int | None = None,
    out: str | Path,
    delta: float = 1e-6,
    chains: int = 4,
    protocol: str = "paper",
    seed: int = 0,
    draws: int | None = None,
    tune: int | None = None,
    reference_draws: int = 1000,
    model_kwargs: dict | None = None,
    stop_at: float | None = None,
    log=None,
) -> Path:
    """Run every (method, epsilon, repeat); write ``results.csv`` and the draws to ``out``.

    Rows are appended to ``out/results.csv`` as runs finish (one progress line per run on
    ``log``); the pooled draws of each run go to ``out/draws/<method>_eps<e>_rep<r>.npy`` and
    ``reference_draws`` exact reference draws to ``out/draws/reference.npy`` (for the figures).
    A method without the paper's noise for this model runs with ``protocol="calibrated"``.
    Repeats are the outer loop; with ``stop_at`` (a ``time.time()`` value) no run is started
    after that time, so a time-limited reproduction still covers every (method, epsilon).
    Runs are numbered ``first_repeat, ..., first_repeat + repeats - 1``; each run's seed
    depends only on (``seed``, model, method, epsilon, repeat number), so a reproduction can
    be split over processes or machines and its CSVs merged (`merge_results`).

    Returns
    -------
    pathlib.Path
        The CSV file.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose from {sorted(MODELS)}")
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {sorted(METHODS)}")
    if int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats must be a positive integer; got {repeats!r}")
    if int(first_repeat) != first_repeat or first_repeat < 0:
        raise ValueError(
            f"first_repeat must be a non-negative integer (0 starts at the first run); "
            f"got {first_repeat!r}"
        )
    kwargs = dict(model_kwargs or {})
    if n is not None:
        kwargs["n"] = n
    exp = MODELS[model](seed=seed, **kwargs)
    out = Path(out)
    (out / "draws").mkdir(parents=True, exist_ok=True)
    np.save(out / "draws" / "reference.npy", exp.reference(4000, np.random.default_rng(seed)))
    path = out / "results.csv"
    start_sd = float(np.mean(exp.reference_sd()))
    log = sys.stderr if log is None else log
    protocols = {}
    for method in methods:
        setting = METHODS[method].setting(exp)
        if METHODS[method].step_class is AUTO:
            protocols[method] = "auto"
        else:
            protocols[method] = protocol if setting.paper_noise is not None else "calibrated"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        # Repeats outermost: a run stopped early still covers every (method, epsilon).
        for r in range(int(first_repeat), int(first_repeat) + int(repeats)):
            for method in methods:
                for eps in epsilons:
                    if stop_at is not None and time.time() >= stop_at:
                        done = r - int(first_repeat)
                        msg = f"stop time reached: {done} full repeat(s) done"
                        print(msg, file=log, flush=True)
                        return path
                    res = run_one(
                        exp,
                        method,
                        float(eps),
                        delta=delta,
                        chains=chains,
                        repeat=r,
                        protocol=protocols[method],
                        base_seed=seed,
                        reference_draws=reference_draws,
                        start_sd=start_sd,
                        draws=draws,
                        tune=tune,
                    )
                    writer.writerow(res.row)
                    fh.flush()
                    np.save(out / "draws" / f"{method}_eps{eps:g}_rep{r}.npy", res.draws)
                    row = res.row
                    print(
                        f"[{time.strftime('%H:%M:%S')}] {model} {method} eps={eps:g} "
                        f"rep={r}: eps_reported={row['epsilon_reported']:.4g} "
                        f"iters/chain={row['iterations_per_chain']} mmd2_u={row['mmd2_u']:.4g} "
                        f"mean_error={row['mean_error']:.4g} accept={row['accept_rate']:.2f} "
                        f"({row['seconds']:.1f} s)",
                        file=log,
                        flush=True,
                    )
    return path


def read_results(path: str | Path) -> list[dict]:
    """Rows of a results CSV with numeric columns converted.

    Both layouts are read: the current one (columns ``mmd2_u`` and ``mmd_paper``) and the
    earlier one, whose single column ``mmd`` held the unbiased squared MMD. For the latter
    ``mmd`` is renamed ``mmd2_u`` and ``mmd_paper = sqrt(|mmd2_u|)`` is derived, so every row
    returned has both keys.

    Parameters
    ----------
    path : str or pathlib.Path
        A ``results.csv`` written by `run_experiment`.

    Returns
    -------
    list of dict
        One dict per run, keyed by the `CSV_FIELDS` names.
    """
    # every column but the text ones is a number (and the earlier layout's "mmd")
    numeric = {*CSV_FIELDS, "mmd"} - set(_TEXT_FIELDS)
    rows = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            r = {k: (float(v) if k in numeric else v) for k, v in row.items()}
            if "mmd2_u" not in r and "mmd" in r:  # the earlier layout
                r["mmd2_u"] = r.pop("mmd")
            if "mmd_paper" not in r and "mmd2_u" in r:
                r["mmd_paper"] = mmd_paper_scale(r["mmd2_u"])
            rows.append(r)
    return rows


def _run_key(row: dict) -> tuple:
    """What identifies one run: the same key means the same seed and settings."""
    return (
        row["model"],
        row["method"],
        row["protocol"],
        int(row["n"]),
        float(row["epsilon_target"]),
        float(row["delta"]),
        int(row["chains"]),
        int(row["repeat"]),
    )


def merge_results(paths: Sequence[str | Path]) -> list[dict]:
    """Rows of several results CSVs of one model, each tagged with its file's directory.

    For a reproduction split over processes or sessions (``first_repeat``). Each row gets the
    key ``"_dir"``: the directory of its CSV, where its draws are. A run that appears twice
    (same model, method, protocol, n, epsilon, delta, chains and repeat, hence the same seed)
    must have the same seed and MMD in both files; it is kept once.

    Raises
    ------
    ValueError
        When no file is given, the files hold more than one model, or a run appears twice
        with different results.
    """
    if not paths:
        raise ValueError("paths is empty: give at least one results CSV")
    rows: dict[tuple, dict] = {}
    for p in paths:
        for row in read_results(p):
            row["_dir"] = str(Path(p).parent)
            key = _run_key(row)
            old = rows.get(key)
            if old is None:
                rows[key] = row
            elif old["seed"] != row["seed"] or not np.isclose(
                old["mmd2_u"], row["mmd2_u"], rtol=1e-9, equal_nan=True
            ):
                raise ValueError(
                    f"run {key} appears in {old['_dir']} and {row['_dir']} with different "
                    "results; merge CSVs made with the same code and base seed"
                )
    models = sorted({r["model"] for r in rows.values()})
    if len(models) > 1:
        raise ValueError(f"the CSVs hold several models {models}; merge one model at a time")
    return sorted(
        rows.values(),
        key=lambda r: (r["method"], float(r["epsilon_target"]), int(r["repeat"])),
    )


def summary_table(rows: Sequence[dict]) -> str:
    """The Markdown table of ``docs/results.md``: one line per (method, epsilon).

    Columns: runs, iterations per chain (a range when runs differ), the largest epsilon any
    run's privacy report gave, and mean +- sd over the runs of the unbiased squared MMD
    (``mmd2_u``), of the same on the DP-HMC paper's scale (``mmd_paper``:
    ``sqrt(|mmd2_u|)`` of each run, then mean +- sd, as the paper's Figure 1) and of the
    mean error (NaN results, i.e. diverged runs, are counted in ``runs`` and reported as
    ``nan runs``).

    Parameters
    ----------
    rows : sequence of dict
        Rows of `read_results` or `merge_results` (either CSV layout).

    Returns
    -------
    str
        The Markdown table, one line per (method, epsilon), ending with a newline.
    """
    if not rows:
        raise ValueError("rows is empty: there is nothing to summarise")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], float(r["epsilon_target"])), []).append(r)

    def _paper(r: dict) -> float:
        return r["mmd_paper"] if "mmd_paper" in r else mmd_paper_scale(r["mmd2_u"])

    def mean_sd(vals: list[float]) -> str:
        v = np.asarray(vals, dtype=float)
        ok = v[np.isfinite(v)]
        if ok.size == 0:
            return "nan"
        sd = ok.std(ddof=1) if ok.size > 1 else float("nan")
        text = f"{ok.mean():.4f} ± {sd:.4f}" if ok.size > 1 else f"{ok.mean():.4f}"
        return text if ok.size == v.size else f"{text} ({v.size - ok.size} nan)"

    lines = [
        "| method | epsilon | runs | iterations / chain | max reported epsilon "
        "| `mmd2_u` = MMD^2_u (mean ± sd) | `mmd_paper` = sqrt(\\|MMD^2_u\\|) (mean ± sd) "
        "| mean error (mean ± sd) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (method, eps), rs in sorted(groups.items()):
        its = sorted({int(r["iterations_per_chain"]) for r in rs})
        it_text = str(its[0]) if len(its) == 1 else f"{its[0]}-{its[-1]}"
        max_eps = max(float(r["epsilon_reported"]) for r in rs)
        lines.append(
            f"| {method} | {eps:g} | {len(rs)} | {it_text} | {max_eps:.4g} "
            f"| {mean_sd([r['mmd2_u'] for r in rs])} "
            f"| {mean_sd([_paper(r) for r in rs])} "
            f"| {mean_sd([r['mean_error'] for r in rs])} |"
        )
    return "\n".join(lines) + "\n"


def _mean_sd(vals: Sequence[float]) -> tuple[float, float, int, int]:
    """(mean, sd, finite runs, all runs) of the finite values (sd nan below 2 runs)."""
    v = np.asarray(vals, dtype=float)
    ok = v[np.isfinite(v)]
    if ok.size == 0:
        return math.nan, math.nan, 0, v.size
    sd = float(ok.std(ddof=1)) if ok.size > 1 else math.nan
    return float(ok.mean()), sd, int(ok.size), int(v.size)


def comparison_table(
    rows: Sequence[dict], method: str = "auto", against: Sequence[str] = ("dphmc", "penalty")
) -> str:
    """Markdown table: one method against others, per epsilon, on both MMD scales.

    For each epsilon where ``method`` has runs: its runs, iterations per chain, largest
    reported epsilon, and mean ± sd over the runs of ``mmd2_u`` (the unbiased squared MMD)
    and of ``mmd_paper`` (``sqrt(|mmd2_u|)`` of each run, the DP-HMC paper's Figure 1 scale)
    for it and for each of ``against``; the column "no worse" says, per scale, whether the
    mean of ``method`` is at most the smallest mean of ``against`` (the best hand-tuned
    setting at that epsilon).

    Parameters
    ----------
    rows : sequence of dict
        Rows of `merge_results` (one model), holding ``method`` and ``against``.
    method : str
        The method compared (default ``"auto"``).
    against : sequence of str
        The methods it is compared with (default the DP-HMC paper's: ``dphmc``, ``penalty``).

    Returns
    -------
    str
        The Markdown table, ending with a newline.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], float(r["epsilon_target"])), []).append(r)
    eps_grid = sorted(e for (m, e) in groups if m == method)
    if not eps_grid:
        raise ValueError(f"no run of method {method!r} in the rows")

    def cell(m: str, e: float, key: str) -> tuple[str, float]:
        rs = groups.get((m, e), [])
        if not rs:
            return "-", math.nan
        mean, sd, ok, total = _mean_sd([r[key] for r in rs])
        text = f"{mean:.4f} ± {sd:.4f}" if ok > 1 else f"{mean:.4f}"
        return (text if ok == total else f"{text} ({total - ok} nan)"), mean

    head = ["epsilon", f"{method} runs", f"{method} iterations / chain", "max reported epsilon"]
    for key in ("mmd2_u", "mmd_paper"):
        head += [f"{m} `{key}`" for m in (method, *against)]
        head.append(f"no worse (`{key}`)")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for e in eps_grid:
        rs = groups[(method, e)]
        its = sorted({int(r["iterations_per_chain"]) for r in rs})
        it_text = str(its[0]) if len(its) == 1 else f"{its[0]}-{its[-1]}"
        max_eps = max(float(r["epsilon_reported"]) for r in rs)
        cells = [f"{e:g}", str(len(rs)), it_text, f"{max_eps:.4g}"]
        for key in ("mmd2_u", "mmd_paper"):
            text, mine = cell(method, e, key)
            cells.append(text)
            best = math.inf
            for m in against:
                t, v = cell(m, e, key)
                cells.append(t)
                if np.isfinite(v):
                    best = min(best, v)
            cells.append("-" if not np.isfinite(best) else ("yes" if mine <= best else "**no**"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
