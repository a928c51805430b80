"""The models PyMC users write: pymc_dp's steps and per-record functions against PyMC and numpy.

Models (``n = 10^5`` records by default):

* ``hier50``, ``hier500``: hierarchical normal, ``y_i ~ N(a[g_i], s)``, ``a ~ N(mu, tau)`` with
  50 and 500 groups (varying intercepts; the group index a record-length integer array);
* ``slopes``: varying intercepts and slopes, ``y_i ~ N(a[g_i] + b[g_i] x_i, s)``, 50 groups;
* ``poisson``: Poisson GLM with a random intercept, ``y_i ~ Poisson(exp(x_i . beta + a[g_i]))``,
  ``d = 5`` covariates, 50 groups, the index in ``pm.Data``;
* ``studentt``: StudentT regression (``nu = 4``), ``d = 10``, scale ``s``;
* ``logistic``: logistic regression, ``d = 10``, rows of unit norm;
* ``banana``: the DP-HMC paper's banana likelihood (as in ``bench_vs_pymc.py``).

For each model, side by side in one process (interleaved blocks, medians, one BLAS thread):

1. ``DPHMC`` / ``pm.HamiltonianMC`` per iteration: the same ``L = 10`` leapfrog steps and step
   size (settings of ``bench_vs_pymc.py``); DPHMC keeps the clipped sum at the current point
   from the last trajectory (``L`` sums computed per iteration); with ``--l-plus-1`` a row
   for the same step computing all ``L + 1`` (``reuse_gradient_sums = False``) is timed in
   the same interleaved blocks; DPHMC also keeps the per-record log-likelihoods at the
   current point where that pays (``reuse_loglik``: one log-likelihood evaluation per ratio
   release; the row's note says whether they are kept), and with ``--two-point-ratio`` a
   row for the same step evaluating them at both points (``reuse_loglik = False``) is
   timed in the same blocks; DPHMC computes the last gradient sum of each trajectory and
   the ratio release in one pass over the records (``fuse_ratio_pass``; the row's note
   says whether it does), and with ``--unfused`` a row for the same step with two passes
   (``fuse_ratio_pass = False``, the log-likelihoods kept where ``reuse_loglik`` says) is
   timed in the same blocks; with ``--layered`` a row for the same step as before issue
   28's twelfth session (every compiled function called through PyTensor's layers, the
   clipped counts computed, no two-point fused pass) is timed in the same blocks;
2. ``DPPenaltyMetropolis`` / ``pm.Metropolis`` per proposal (``pm.Metropolis`` updates a vector
   variable one coordinate at a time: one of its iterations is ``d`` proposals);
3. each package per-record function (the clipped gradient sum of DP-HMC, the clipped
   log-likelihood-ratio sum of the penalty tests, and that sum with the log-likelihoods at
   the old point kept, as DPHMC releases it) against a hand-written numpy version of the
   same function on the same data and parameter vector (checked to agree before timing).

Per *iteration* is what is measured, not per effective sample. With ``--scaling`` the
script instead times the package functions at each ``--sizes`` value of ``n`` (default
10^4, 10^5, 10^6), without and with chunking (``chunk_size = n / 16``), and prints the
time per record and the peak of the temporaries of one call (`peak_mb`): linear
scaling in ``n`` and memory bounded by ``chunk_size``. Usage::

    python benchmarks/bench_models.py               # n = 100 000
    python benchmarks/bench_models.py --quick       # n = 5 000, short blocks
    python benchmarks/bench_models.py --models hier50 banana --mode NUMBA
    python benchmarks/bench_models.py --models hier50 logistic --steps DPHMC --l-plus-1
    python benchmarks/bench_models.py --models hier50 --steps DPHMC --two-point-ratio
    python benchmarks/bench_models.py --models hier50 banana --steps DPHMC --unfused
    python benchmarks/bench_models.py --models banana --steps DPHMC --layered
    python benchmarks/bench_models.py --scaling --models hier50 slopes banana
    python benchmarks/bench_models.py --floor       # against PyMC's gradient and Numba loops

With ``--floor`` (models ``hier50``, ``hier500``, ``slopes``, ``banana``) it times the
package's clipped gradient sum against the gradient function ``pm.HamiltonianMC`` calls in
each leapfrog step and against two hand-written Numba loops over the records, one with the
clip weight (the clipped sum, checked against the numpy version) and one without (the plain
gradient sum): the cost of clipping each record's gradient on its own, which no
per-record function avoids. For the banana a third loop has the blocks route's float32 clip
weight (its note says whether the loop's assembly has the packed float32 square root).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
import warnings

warnings.filterwarnings("ignore", message=".*BLAS.*")

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
from scipy.special import expit, gammaln  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_memory import _reset_peak_rss, _status_kb  # noqa: E402
from bench_vs_pymc import (  # noqa: E402
    N_LEAPFROG,
    STEP_SIZE,
    Runner,
    limit_blas,
    make_pymc_step,
    print_header,
    pymc_proposals_per_iteration,
    time_interleaved,
)

import pymc_dp  # noqa: E402
from pymc_dp.records import build_record_functions  # noqa: E402

NU = 4.0  # StudentT degrees of freedom (fixed)
BANANA_VAR1, BANANA_VAR2, BANANA_A = 2000.0, 2500.0, 20.0


# -- models: (pm.Model, data dict) ------------------------------------------------------------
def hier(n: int, groups: int, rng):
    g = rng.integers(0, groups, n)
    a_true = rng.normal(0.0, 1.0, groups)
    y = rng.normal(a_true[g], 1.0)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 10.0)
        tau = pm.HalfNormal("tau", 5.0)
        a = pm.Normal("a", mu, tau, shape=groups)
        s = pm.HalfNormal("s", 5.0)
        pm.Normal("y", a[g], s, observed=y)
    return m, {"g": g, "y": y, "J": groups}


def slopes(n: int, rng, groups: int = 50):
    g = rng.integers(0, groups, n)
    x = rng.uniform(-1.0, 1.0, n)
    y = rng.normal(rng.normal(size=groups)[g] + rng.normal(size=groups)[g] * x, 1.0)
    with pm.Model() as m:
        mu_a = pm.Normal("mu_a", 0.0, 10.0)
        mu_b = pm.Normal("mu_b", 0.0, 10.0)
        a = pm.Normal("a", mu_a, 1.0, shape=groups)
        b = pm.Normal("b", mu_b, 1.0, shape=groups)
        s = pm.HalfNormal("s", 5.0)
        pm.Normal("y", a[g] + b[g] * x, s, observed=y)
    return m, {"g": g, "x": x, "y": y, "J": groups}


def poisson(n: int, rng, groups: int = 50, d: int = 5):
    g = rng.integers(0, groups, n)
    X = rng.uniform(-1.0, 1.0, (n, d)) / np.sqrt(d)
    y = rng.poisson(np.exp(X @ rng.normal(size=d) + 0.3 * rng.normal(size=groups)[g]))
    with pm.Model() as m:
        beta = pm.Normal("beta", 0.0, 1.0, shape=d)
        sd_a = pm.HalfNormal("sd_a", 1.0)
        a = pm.Normal("a", 0.0, sd_a, shape=groups)
        gi = pm.Data("g", g)
        pm.Poisson("y", pm.math.exp(pm.math.dot(X, beta) + a[gi]), observed=y)
    return m, {"g": g, "X": X, "y": y, "J": groups, "x_sq": np.sum(X * X, axis=1)}


def studentt(n: int, rng, d: int = 10):
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    y = X @ rng.normal(size=d) + rng.standard_t(NU, n)
    with pm.Model() as m:
        beta = pm.Normal("beta", 0.0, 10.0, shape=d)
        s = pm.HalfNormal("s", 5.0)
        pm.StudentT("y", nu=NU, mu=pm.math.dot(X, beta), sigma=s, observed=y)
    return m, {"X": X, "y": y, "x_sq": np.sum(X * X, axis=1)}


def logistic(n: int, rng, d: int = 10):
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (rng.uniform(size=n) < expit(X @ rng.normal(scale=3.0, size=d))).astype(np.int8)
    with pm.Model() as m:
        b = pm.Normal("beta", 0.0, 10.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, b), observed=y)
    return m, {"X": X, "y": y, "x_sq": np.sum(X * X, axis=1)}


def banana(n: int, rng):
    x1 = rng.normal(0.0, np.sqrt(BANANA_VAR1), size=n)
    x2 = rng.normal(3.0, np.sqrt(BANANA_VAR2), size=n)
    with pm.Model() as m:
        theta = pm.Normal("theta", 0.0, np.sqrt(1000.0), shape=2)
        pm.Normal("x1", theta[0], np.sqrt(BANANA_VAR1), observed=x1)
        pm.Normal("x2", theta[1] + BANANA_A * theta[0] ** 2, np.sqrt(BANANA_VAR2), observed=x2)
    return m, {"x1": x1, "x2": x2}


MODELS = {
    "hier50": lambda n, rng: hier(n, 50, rng),
    "hier500": lambda n, rng: hier(n, 500, rng),
    "slopes": slopes,
    "poisson": poisson,
    "studentt": studentt,
    "logistic": logistic,
    "banana": banana,
}
GLMS = ("studentt", "logistic")


# -- hand-written numpy versions (transformed space, q in PyMC's value-variable order) --------
def _clip(sq, b):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        finite = sq <= np.finfo(float).max
        w = np.where(finite, np.minimum(1.0, b / np.sqrt(np.maximum(sq, 1e-300))), 0.0)
    return w, int(np.sum(~(sq <= b * b)))


def _llr(ll_new, ll_old, b):
    r = ll_new - ll_old
    nan = np.isnan(r)
    return float(np.sum(np.where(nan, 0.0, np.clip(r, -b, b)))), int(np.sum(nan | (np.abs(r) > b)))


class Numpy:
    """Hand-written numpy per-record functions of one model (``sl``: slices of q by name)."""

    def __init__(self, name: str, data: dict, sl: dict, d: int) -> None:
        self.name, self.D, self.sl, self.d = name, data, sl, d

    def p(self, q, name):
        return q[self.sl[name]]

    def loglik(self, q):
        D, p, nm = self.D, self.p, self.name
        if nm.startswith("hier") or nm == "slopes":
            s = np.exp(p(q, "s_log__")[0])
            mean = p(q, "a")[D["g"]]
            if nm == "slopes":
                mean = mean + p(q, "b")[D["g"]] * D["x"]
            r = (D["y"] - mean) / s
            return -0.5 * np.log(2 * np.pi) - np.log(s) - 0.5 * r * r
        if nm == "poisson":
            eta = D["X"] @ p(q, "beta") + p(q, "a")[D["g"]]
            return D["y"] * eta - np.exp(eta) - gammaln(D["y"] + 1.0)
        if nm == "studentt":
            s = np.exp(p(q, "s_log__")[0])
            r = (D["y"] - D["X"] @ p(q, "beta")) / s
            c = gammaln((NU + 1) / 2) - gammaln(NU / 2) - 0.5 * np.log(NU * np.pi)
            return c - np.log(s) - (NU + 1) / 2 * np.log1p(r * r / NU)
        if nm == "logistic":
            eta = D["X"] @ p(q, "beta")
            return D["y"] * eta - np.logaddexp(0.0, eta)
        t = p(q, "theta")
        r1, r2 = D["x1"] - t[0], D["x2"] - t[1] - BANANA_A * t[0] ** 2
        c = -0.5 * np.log(2 * np.pi * BANANA_VAR1) - 0.5 * np.log(2 * np.pi * BANANA_VAR2)
        return c - 0.5 * r1 * r1 / BANANA_VAR1 - 0.5 * r2 * r2 / BANANA_VAR2

    def clipped_llr_sum(self, q_new, q_old, b):
        return _llr(self.loglik(q_new), self.loglik(q_old), b)

    def clipped_grad_sum(self, q, b):
        D, p, nm, sl = self.D, self.p, self.name, self.sl
        out = np.zeros(self.d)
        if nm.startswith("hier") or nm == "slopes":
            s = np.exp(p(q, "s_log__")[0])
            mean = p(q, "a")[D["g"]]
            if nm == "slopes":
                mean = mean + p(q, "b")[D["g"]] * D["x"]
            r = (D["y"] - mean) / s
            e_a, e_s = r / s, r * r - 1.0
            sq = e_a * e_a * (1.0 + (D["x"] ** 2 if nm == "slopes" else 0.0)) + e_s * e_s
            w, k = _clip(sq, b)
            out[sl["a"]] = np.bincount(D["g"], w * e_a, minlength=D["J"])
            if nm == "slopes":
                out[sl["b"]] = np.bincount(D["g"], w * e_a * D["x"], minlength=D["J"])
            out[sl["s_log__"]] = w @ e_s
            return out, k
        if nm == "poisson":
            v = D["y"] - np.exp(D["X"] @ p(q, "beta") + p(q, "a")[D["g"]])
            w, k = _clip(v * v * (D["x_sq"] + 1.0), b)
            out[sl["beta"]] = (w * v) @ D["X"]
            out[sl["a"]] = np.bincount(D["g"], w * v, minlength=D["J"])
            return out, k
        if nm == "studentt":
            s = np.exp(p(q, "s_log__")[0])
            r = (D["y"] - D["X"] @ p(q, "beta")) / s
            u = (NU + 1) / (NU + r * r)
            v, e_s = u * r / s, u * r * r - 1.0
            w, k = _clip(v * v * D["x_sq"] + e_s * e_s, b)
            out[sl["beta"]] = (w * v) @ D["X"]
            out[sl["s_log__"]] = w @ e_s
            return out, k
        if nm == "logistic":
            v = D["y"] - expit(D["X"] @ p(q, "beta"))
            w, k = _clip(v * v * D["x_sq"], b)
            out[sl["beta"]] = (w * v) @ D["X"]
            return out, k
        t = p(q, "theta")
        r1 = (D["x1"] - t[0]) / BANANA_VAR1
        r2 = (D["x2"] - t[1] - BANANA_A * t[0] ** 2) / BANANA_VAR2
        g1 = r1 + r2 * 2 * BANANA_A * t[0]
        w, k = _clip(g1 * g1 + r2 * r2, b)
        out[sl["theta"]] = [w @ g1, w @ r2]
        return out, k


# -- measurements ---------------------------------------------------------------------------
def slices(model):
    ip = model.initial_point()
    sl, start = {}, 0
    for v in model.value_vars:
        size = int(np.size(ip[v.name]))
        sl[v.name] = slice(start, start + size)
        start += size
    q0 = np.concatenate([np.ravel(ip[v.name]) for v in model.value_vars])
    return sl, q0


def make_dp(kind: str, model, compile_kwargs):
    rng = np.random.default_rng(1)
    kw = {"compile_kwargs": compile_kwargs} if compile_kwargs else {}
    with model:
        if kind == "DPHMC":
            return pymc_dp.DPHMC(
                llr_clip_bound=1.0,
                grad_clip_bound=1.0,
                llr_noise_multiplier=1.0,
                grad_noise_multiplier=1.0,
                n_leapfrog=N_LEAPFROG,
                step_size=STEP_SIZE,
                adapt_step_size=False,
                adapt_mass_matrix=False,
                rng=rng,
                **kw,
            )
        return pymc_dp.DPPenaltyMetropolis(
            clip_bound=1.0, noise_multiplier=1.0, proposal_scale=1e-3, rng=rng, **kw
        )


def time_functions(fs: dict, blocks: int, block_seconds: float) -> dict:
    """Median seconds per call of each ``f()``, interleaved blocks."""
    reps = {}
    for k, f in fs.items():
        f()
        t = time.perf_counter()
        f()
        reps[k] = int(np.clip(block_seconds / max(time.perf_counter() - t, 1e-7), 2, 10_000))
    times = {k: [] for k in fs}
    for _ in range(blocks):
        for k, f in fs.items():
            t = time.perf_counter()
            for _ in range(reps[k]):
                f()
            times[k].append((time.perf_counter() - t) / reps[k])
    return {k: float(np.median(v)) for k, v in times.items()}


def run_model(
    name: str,
    n: int,
    blocks: int,
    block_s: float,
    compile_kwargs,
    kinds,
    l_plus_1: bool = False,
    two_point: bool = False,
    unfused: bool = False,
    layered: bool = False,
) -> list[str]:
    rng = np.random.default_rng(0)
    model, data = MODELS[name](n, rng)
    sl, q0 = slices(model)
    d = q0.size
    rows = []
    # 1. per-record functions against numpy (same data, same q)
    fns, _ = build_record_functions(
        model, model.value_vars, model.initial_point(), compile_kwargs=compile_kwargs
    )
    ref = Numpy(name, data, sl, d)
    q = q0 + 0.05 * np.sin(np.arange(d) + 1.0)
    q2 = q + 0.01 * np.cos(np.arange(d))
    bound = 1.0
    g_pkg, k_pkg = fns.clipped_grad_sum(q, bound)
    g_np, k_np = ref.clipped_grad_sum(q, bound)
    l_pkg, kl_pkg = fns.clipped_loglik_ratio_sum(q2, q, 0.01)
    l_np, kl_np = ref.clipped_llr_sum(q2, q, 0.01)
    l_q = fns.loglik_chunks(q)
    l1_pkg, kl1_pkg, _ = fns.clipped_loglik_ratio_sum_kept(q2, l_q, 0.01)
    agree = (
        np.allclose(g_pkg, g_np, rtol=1e-7, atol=1e-9)
        and np.isclose(l1_pkg, l_np, rtol=1e-7, atol=1e-9)
        and kl1_pkg == kl_np
        and k_pkg == k_np
        and np.isclose(l_pkg, l_np, rtol=1e-7, atol=1e-9)
        and kl_pkg == kl_np
    )
    t = time_functions(
        {
            "grad_pkg": lambda: fns.clipped_grad_sum(q, bound),
            "grad_np": lambda: ref.clipped_grad_sum(q, bound),
            "llr_pkg": lambda: fns.clipped_loglik_ratio_sum(q2, q, 0.01),
            "llr_np": lambda: ref.clipped_llr_sum(q2, q, 0.01),
            # DPHMC's ratio release with the log-likelihoods at q kept (one evaluation)
            "llr1_pkg": lambda: fns.clipped_loglik_ratio_sum_kept(q2, l_q, 0.01),
            # DPHMC's last gradient release and its ratio release in one pass
            "fused_pkg": lambda: fns.clipped_grad_and_ratio_sum_kept(q2, bound, l_q, 0.01),
        },
        blocks,
        block_s / 2,
    )
    g_f, k_f, l_f, kl_f, _ = fns.clipped_grad_and_ratio_sum_kept(q2, bound, l_q, 0.01)
    g2_pkg, k2_pkg = fns.clipped_grad_sum(q2, bound)
    agree_f = (
        np.allclose(g_f, g2_pkg, rtol=1e-12, atol=1e-14)
        and k_f == k2_pkg
        and np.isclose(l_f, l1_pkg, rtol=1e-12, atol=1e-14)
        and kl_f == kl1_pkg
    )
    route = fns.gradient_route
    t["llr1_np"] = t["llr_np"]
    for fn, key in (
        ("clipped grad sum", "grad"),
        ("clipped LLR sum", "llr"),
        ("clipped LLR sum, l(q) kept", "llr1"),
    ):
        a, b = t[f"{key}_pkg"], t[f"{key}_np"]
        rows.append(
            f"{'function':<20} {name:<9} {n:>8,d} {d:>4} | {fn:<28} {a * 1e3:>9.4f} "
            f"{b * 1e3:>9.4f} {a / b:>7.2f} | route {route}; agree {agree}"
        )
    # the fused pass against the two package passes it replaces (the ratio release as
    # DPHMC makes it unfused: kept log-likelihoods where `loglik_worth_keeping`)
    a = t["fused_pkg"]
    b = t["grad_pkg"] + (t["llr1_pkg"] if fns.loglik_worth_keeping else t["llr_pkg"])
    rows.append(
        f"{'function':<20} {name:<9} {n:>8,d} {d:>4} | {'grad + LLR fused / unfused':<28} "
        f"{a * 1e3:>9.4f} {b * 1e3:>9.4f} {a / b:>7.2f} | route {route}; ref: the two "
        f"package passes; agree {agree_f}"
    )
    # 2. steps against PyMC's (DP step and PyMC step interleaved)
    for kind in kinds:
        dp = make_dp(kind, model, compile_kwargs)
        pymc_step = make_pymc_step(kind, model, "logistic")
        runners = {"dp": Runner(dp, model), "pymc": Runner(pymc_step, model)}
        if kind == "DPHMC" and l_plus_1:
            # the same step computing all L + 1 clipped sums (no kept sum), interleaved
            dp_all = make_dp(kind, model, compile_kwargs)
            dp_all.reuse_gradient_sums = False
            runners["dp_all"] = Runner(dp_all, model)
        if kind == "DPHMC" and two_point:
            # the same step evaluating the log-likelihoods at both points of every ratio
            dp_two = make_dp(kind, model, compile_kwargs)
            dp_two.reuse_loglik = False
            runners["dp_two"] = Runner(dp_two, model)
        if kind == "DPHMC" and unfused:
            # the same step with the last gradient pass and the ratio pass apart
            dp_unf = make_dp(kind, model, compile_kwargs)
            dp_unf.fuse_ratio_pass = False
            runners["dp_unf"] = Runner(dp_unf, model)
        if kind == "DPHMC" and layered:
            # as before the twelfth session: PyTensor's call layers around every compiled
            # call, the clipped counts computed, no two-point fused pass
            dp_lay = make_dp(kind, model, compile_kwargs)
            dp_lay._fns._direct_off = True
            if dp_lay._fused_kind() == "two-point":
                dp_lay.fuse_ratio_pass = False
            runners["dp_lay"] = Runner(dp_lay, model)
        tt = time_interleaved(runners, block_s, blocks)
        props = pymc_proposals_per_iteration(pymc_step)
        ratio = tt["dp"] / (tt["pymc"] / props)
        what = "DPHMC/pm.HMC per iter" if kind == "DPHMC" else "Penalty/pm.Metropolis per prop"
        if "dp_all" in tt:
            rows.append(
                f"{kind:<20} {name:<9} {n:>8,d} {d:>4} | {'DPHMC L+1 sums/pm.HMC':<28} "
                f"{tt['dp_all'] * 1e3:>9.4f} {tt['pymc'] * 1e3:>9.4f} "
                f"{tt['dp_all'] / tt['pymc']:>7.2f} | route {dp._fns.gradient_route}; "
                "every sum computed"
            )
        if "dp_two" in tt:
            rows.append(
                f"{kind:<20} {name:<9} {n:>8,d} {d:>4} | {'DPHMC 2-point LLR/pm.HMC':<28} "
                f"{tt['dp_two'] * 1e3:>9.4f} {tt['pymc'] * 1e3:>9.4f} "
                f"{tt['dp_two'] / tt['pymc']:>7.2f} | route {dp._fns.gradient_route}; "
                "log-likelihoods at both points"
            )
        if "dp_unf" in tt:
            rows.append(
                f"{kind:<20} {name:<9} {n:>8,d} {d:>4} | {'DPHMC unfused/pm.HMC':<28} "
                f"{tt['dp_unf'] * 1e3:>9.4f} {tt['pymc'] * 1e3:>9.4f} "
                f"{tt['dp_unf'] / tt['pymc']:>7.2f} | route {dp._fns.gradient_route}; "
                "last gradient and ratio in two passes"
                + ("; log-likelihoods kept" if dp_unf.keeps_loglik else "")
            )
        if "dp_lay" in tt:
            rows.append(
                f"{kind:<20} {name:<9} {n:>8,d} {d:>4} | {'DPHMC layered/pm.HMC':<28} "
                f"{tt['dp_lay'] * 1e3:>9.4f} {tt['pymc'] * 1e3:>9.4f} "
                f"{tt['dp_lay'] / tt['pymc']:>7.2f} | route {dp._fns.gradient_route}; as "
                "before: PyTensor's call layers, counts, "
                + ("ratio fused" if dp_lay.fuses_ratio_pass else "ratio apart")
            )
        rows.append(
            f"{kind:<20} {name:<9} {n:>8,d} {d:>4} | {what:<28} {tt['dp'] * 1e3:>9.4f} "
            f"{tt['pymc'] / props * 1e3:>9.4f} {ratio:>7.2f} | "
            + (
                f"route {dp._fns.gradient_route}"
                + ("; sum at the current point kept" if dp.reuse_gradient_sums else "")
                + ("; ratio fused" if dp.fuses_ratio_pass else "")
                + ("; two-point" if dp._fused_kind() == "two-point" else "")
                + (
                    "; log-likelihoods kept"
                    if dp.keeps_loglik or dp._fused_kind() == "kept"
                    else ""
                )
                + ("; direct calls" if dp._fns._direct is not None else "")
                if kind == "DPHMC"
                else f"PyMC prop/it {props}"
            )
        )
    return rows


def peak_mb(f) -> float:
    """Peak memory of the temporaries of one ``f()`` call, MB: the larger of the growth of
    the process's peak resident set over its resident set before the call (VmHWM, reset
    through ``/proc/self/clear_refs``; catches Numba's own allocations) and the peak traced
    by ``tracemalloc`` (numpy and PyTensor buffers)."""
    reset = _reset_peak_rss()
    before = _status_kb("VmRSS")
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    f()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = (_status_kb("VmHWM") - before) / 1024 if reset else 0.0
    return max((peak - base) / 2**20, rss)


def scaling_rows(name: str, sizes, blocks: int, block_s: float, compile_kwargs) -> list[str]:
    """Time per call and per record, and the temporaries' peak, of the package functions."""
    rows = []
    for n in sizes:
        model, _ = MODELS[name](n, np.random.default_rng(0))
        sl, q0 = slices(model)
        d = q0.size
        q = q0 + 0.05 * np.sin(np.arange(d) + 1.0)
        q2 = q + 0.01 * np.cos(np.arange(d))
        fs, route = {}, ""
        for chunk in (None, max(n // 16, 1)):
            fns, _ = build_record_functions(
                model,
                model.value_vars,
                model.initial_point(),
                compile_kwargs=compile_kwargs,
                chunk_size=chunk,
            )
            fs[("grad", chunk)] = lambda fns=fns, q=q: fns.clipped_grad_sum(q, 1.0)
            fs[("llr", chunk)] = lambda fns=fns, q=q, q2=q2: fns.clipped_loglik_ratio_sum(
                q2, q, 0.01
            )
            fs[("grad", chunk)]()
            route = fns.gradient_route
        t = time_functions(fs, blocks, block_s / 2)
        for (key, chunk), f in fs.items():
            what = "clipped grad sum" if key == "grad" else "clipped LLR sum"
            ms = t[(key, chunk)] * 1e3
            rows.append(
                f"{'scaling':<20} {name:<9} {n:>9,d} {d:>4} | {what:<17} "
                f"{chunk or n:>9,d} {ms:>9.4f} {ms * 1e6 / n:>8.2f} {peak_mb(f):>8.2f} "
                f"| route {route}"
            )
    return rows


# -- the floor: hand-written Numba loops (``--floor``) -----------------------------------------
def numba_loops(name: str, data: dict, sl: dict, d: int):
    """``(clipped, unclipped)``: hand-written Numba versions of the model's clipped gradient
    sum (one fused loop over the records: gradient, clip weight, segment sums), and of the
    same loop without the clip weight (the plain gradient sum, PyMC's work); for ``hier*``,
    ``slopes`` and ``banana``. Compiled with PyTensor's fastmath flags and numpy's error
    model (so that the loop may vectorise where it has no segment sum)."""
    import numba

    fm = {"arcp", "contract", "afn", "reassoc", "nsz"}
    jit = numba.njit(fastmath=fm, error_model="numpy")
    huge = np.finfo(np.float64).max
    D = data
    if name == "banana":

        @jit
        def banana_loop(t0, t1, x1, x2, b, clip):
            s1 = s2 = 0.0
            k = 0
            for i in range(x1.size):
                r1 = (x1[i] - t0) / BANANA_VAR1
                r2 = (x2[i] - t1 - BANANA_A * t0 * t0) / BANANA_VAR2
                g1 = r1 + r2 * 2.0 * BANANA_A * t0
                sq = g1 * g1 + r2 * r2
                w = 1.0
                if clip:
                    w = min(1.0, b / np.sqrt(max(sq, 1e-300)))
                    w = w if sq <= huge else 0.0
                s1 += w * g1
                s2 += w * r2
                k += (sq > b * b) | (sq != sq)
            return s1, s2, k

        def run(q, b, clip):
            t = q[sl["theta"]]
            s1, s2, k = banana_loop(t[0], t[1], D["x1"], D["x2"], b, clip)
            out = np.zeros(d)
            out[sl["theta"]] = [s1, s2]
            return out, k

    else:
        x = D.get("x", np.zeros(D["y"].size))
        slopes_model = name == "slopes"

        @jit
        def group_loop(a, bb, s, g, x, y, J, b, clip, with_slopes):
            ga = np.zeros(J)
            gb = np.zeros(J)
            ss = 0.0
            k = 0
            inv = 1.0 / s
            for i in range(y.size):
                j = g[i]
                mean = a[j] + bb[j] * x[i] if with_slopes else a[j]
                r = (y[i] - mean) * inv
                ea = r * inv
                es = r * r - 1.0
                sq = ea * ea * (1.0 + x[i] * x[i]) + es * es if with_slopes else ea * ea + es * es
                w = 1.0
                if clip:
                    w = min(1.0, b / np.sqrt(max(sq, 1e-300)))
                    w = w if sq <= huge else 0.0
                ga[j] += w * ea
                if with_slopes:
                    gb[j] += w * ea * x[i]
                ss += w * es
                k += (sq > b * b) | (sq != sq)
            return ga, gb, ss, k

        def run(q, b, clip):
            a = q[sl["a"]]
            bb = q[sl["b"]] if slopes_model else a
            s = float(np.exp(q[sl["s_log__"]][0]))
            ga, gb, ss, k = group_loop(a, bb, s, D["g"], x, D["y"], D["J"], b, clip, slopes_model)
            out = np.zeros(d)
            out[sl["a"]] = ga
            if slopes_model:
                out[sl["b"]] = gb
            out[sl["s_log__"]] = ss
            return out, k

    return (lambda q, b: run(q, b, True)), (lambda q, b: run(q, b, False))


STRIP = 512  # records per strip of the strip-mined loop


def numba_strip_loop(name: str, data: dict, sl: dict, d: int):
    """A strip-mined hand-written Numba version of the clipped gradient sum of ``hier*``
    (None for the other models): per strip of `STRIP` records, the gather, then a loop
    without any indexed store (gradient, clip weight, the scalar sums: free to vectorise the
    square root and the division), then the segment sums. Same sums and counts as
    `numba_loops`'s fused loop; it tests whether vectorising the clip weight pays."""
    if not name.startswith("hier"):
        return None
    import numba

    fm = {"arcp", "contract", "afn", "reassoc", "nsz"}
    jit = numba.njit(fastmath=fm, error_model="numpy")
    huge = np.finfo(np.float64).max
    B = STRIP

    @jit
    def strip_loop(a, s, g, y, J, b):
        ga = np.zeros(J)
        ss = 0.0
        k = 0
        inv = 1.0 / s
        ea = np.empty(B)
        m = np.empty(B)
        for start in range(0, y.size, B):
            size = min(B, y.size - start)
            for t in range(size):
                m[t] = a[g[start + t]]
            for t in range(size):
                r = (y[start + t] - m[t]) * inv
                e1 = r * inv
                e2 = r * r - 1.0
                sq = e1 * e1 + e2 * e2
                w = min(1.0, b / np.sqrt(max(sq, 1e-300)))
                w = w if sq <= huge else 0.0
                k += (sq > b * b) | (sq != sq)
                ea[t] = w * e1
                ss += w * e2
            for t in range(size):
                ga[g[start + t]] += ea[t]
        return ga, ss, k

    def run(q, b):
        s = float(np.exp(q[sl["s_log__"]][0]))
        ga, ss, k = strip_loop(q[sl["a"]], s, data["g"], data["y"], data["J"], b)
        out = np.zeros(d)
        out[sl["a"]] = ga
        out[sl["s_log__"]] = ss
        return out, k

    return run


def numba_f32_loop(name: str, data: dict, sl: dict, d: int):
    """``(run, vectorised)`` for the banana (None for the other models): a hand-written
    Numba loop of the blocks route's clipped sum with its float32 clip weight
    (`pymc_dp.records.clipping.clip_weights` with ``float32_weight``: ``w = 1`` inside
    ``b (1 - m)``, else ``min(1, 1 / sqrt(r))`` in float32 with ``r = ||g||^2 / (b (1 -
    m))^2``, then the float64 check ``w^2 ||g||^2 <= b^2``), branch-free; ``vectorised``
    says whether its assembly has the packed float32 square root (``vrsqrtps`` /
    ``vsqrtps``) rather than the scalar one only."""
    if name != "banana":
        return None
    import re

    import numba

    from pymc_dp.records.clipping import F32_MARGIN

    fm = {"arcp", "contract", "afn", "reassoc", "nsz"}
    jit = numba.njit(fastmath=fm, error_model="numpy")
    keep = 1.0 - F32_MARGIN

    @jit
    def f32_loop(t0, t1, x1, x2, b):
        s1 = s2 = 0.0
        k = 0
        inner2 = (b * keep) * (b * keep)
        b2 = b * b
        scale = 1.0 / inner2
        for i in range(x1.size):
            r1 = (x1[i] - t0) / BANANA_VAR1
            r2 = (x2[i] - t1 - BANANA_A * t0 * t0) / BANANA_VAR2
            g1 = r1 + r2 * 2.0 * BANANA_A * t0
            sq = g1 * g1 + r2 * r2
            y = np.float64(np.float32(1.0) / np.sqrt(np.float32(sq * scale)))
            y = y if y < 1.0 else 1.0
            w = 1.0 if sq <= inner2 else y
            w = w if w * w * sq <= b2 else 0.0
            s1 += w * g1
            s2 += w * r2
            k += not (sq <= b2)
        return s1, s2, k

    def run(q, b):
        t = q[sl["theta"]]
        s1, s2, k = f32_loop(t[0], t[1], data["x1"], data["x2"], b)
        out = np.zeros(d)
        out[sl["theta"]] = [s1, s2]
        return out, k

    run(np.zeros(d), 1.0)  # compile
    asm = f32_loop.inspect_asm(f32_loop.signatures[0])
    return run, bool(re.search(r"\bv(r)?sqrtps\b", asm))


FLOOR_MODELS = ("hier50", "hier500", "slopes", "banana")


def floor_rows(name: str, n: int, blocks: int, block_s: float, compile_kwargs) -> list[str]:
    """The package's clipped gradient sum against PyMC's own gradient (the function
    ``pm.HamiltonianMC`` calls each leapfrog step, ``trust_input`` as PyMC sets it) and
    against hand-written Numba loops with and without the clip weight."""
    rng = np.random.default_rng(0)
    model, data = MODELS[name](n, rng)
    sl, q0 = slices(model)
    d = q0.size
    fns, _ = build_record_functions(
        model, model.value_vars, model.initial_point(), compile_kwargs=compile_kwargs
    )
    q = q0 + 0.05 * np.sin(np.arange(d) + 1.0)
    clipped, unclipped = numba_loops(name, data, sl, d)
    strip = numba_strip_loop(name, data, sl, d)
    f32 = numba_f32_loop(name, data, sl, d)
    g_ref, k_ref = Numpy(name, data, sl, d).clipped_grad_sum(q, 1.0)
    g_nb, k_nb = clipped(q, 1.0)
    agree = np.allclose(g_nb, g_ref, rtol=1e-7, atol=1e-9) and k_nb == k_ref
    if strip is not None:
        g_st, k_st = strip(q, 1.0)
        agree = agree and np.allclose(g_st, g_ref, rtol=1e-7, atol=1e-9) and k_st == k_ref
    if f32 is not None:  # (the float32 weight: within the margin of the exact one)
        g_32, k_32 = f32[0](q, 1.0)
        agree = agree and np.allclose(g_32, g_ref, rtol=1e-4, atol=1e-9) and k_32 == k_ref
    dlogp = model.logp_dlogp_function(ravel_inputs=True)
    dlogp.set_extra_values({})
    dlogp._pytensor_function.trust_input = True
    t = time_functions(
        {
            "pkg": lambda: fns.clipped_grad_sum(q, 1.0),
            "numba": lambda: clipped(q, 1.0),
            "numba_noclip": lambda: unclipped(q, 1.0),
            "pymc": lambda: dlogp(q),
            **({"strip": lambda: strip(q, 1.0)} if strip is not None else {}),
            **({"f32": lambda: f32[0](q, 1.0)} if f32 is not None else {}),
        },
        blocks,
        block_s / 2,
    )
    rows = []
    for key, what in (
        ("pkg", "pymc_dp clipped grad sum"),
        ("numba", "Numba loop, clipped"),
        ("numba_noclip", "Numba loop, no clip weight"),
        *([("strip", "Numba loop, clipped, strips")] if strip is not None else []),
        *([("f32", "Numba loop, float32 weight")] if f32 is not None else []),
    ):
        note = f"; packed float32 sqrt {f32[1]}" if key == "f32" else ""
        rows.append(
            f"{'floor':<20} {name:<9} {n:>8,d} {d:>4} | {what:<28} {t[key] * 1e3:>9.4f} "
            f"{t['pymc'] * 1e3:>9.4f} {t[key] / t['pymc']:>7.2f} | ref: PyMC logp+grad; "
            f"agree {agree}{note}"
        )
    return rows


SCALING_HEADER = (
    f"{'row':<20} {'model':<9} {'n':>9} {'d':>4} | {'what':<17} {'chunk':>9} {'ms':>9} "
    f"{'ns/rec':>8} {'peak MB':>8} | note"
)

HEADER = (
    f"{'row':<20} {'model':<9} {'n':>8} {'d':>4} | {'what':<28} {'pkg ms':>9} {'ref ms':>9} "
    f"{'ratio':>7} | note"
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 5 000, short blocks")
    ap.add_argument("--n", type=int, default=None, help="records (default 100 000)")
    ap.add_argument("--blocks", type=int, default=None, help="interleaved timed blocks")
    ap.add_argument("--block-seconds", type=float, default=None, help="target block length")
    ap.add_argument("--blas-threads", type=int, default=1, help="BLAS threads for both sides")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument(
        "--steps",
        nargs="*",
        default=["DPHMC", "DPPenaltyMetropolis"],
        choices=["DPHMC", "DPPenaltyMetropolis"],
    )
    ap.add_argument("--mode", default=None, help="compile_kwargs mode of the DP side")
    ap.add_argument(
        "--l-plus-1",
        action="store_true",
        help="also time DPHMC computing all L + 1 clipped sums per iteration (the sum at the "
        "current point not kept), interleaved with the two others",
    )
    ap.add_argument(
        "--two-point-ratio",
        action="store_true",
        help="also time DPHMC evaluating the log-likelihoods at both points of each ratio "
        "release (reuse_loglik = False), interleaved with the others",
    )
    ap.add_argument(
        "--unfused",
        action="store_true",
        help="also time DPHMC with its last gradient pass and its ratio pass apart "
        "(fuse_ratio_pass = False), interleaved with the others",
    )
    ap.add_argument(
        "--layered",
        action="store_true",
        help="also time DPHMC as before issue 28's twelfth session (compiled functions "
        "called through PyTensor's layers, counting, no two-point fused pass), interleaved",
    )
    ap.add_argument("--scaling", action="store_true", help="functions vs n, with chunking")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="clipped gradient sum vs PyMC's gradient and hand-written Numba loops "
        f"({', '.join(FLOOR_MODELS)})",
    )
    ap.add_argument(
        "--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="--scaling n"
    )
    args = ap.parse_args(argv)
    limit_blas(args.blas_threads)
    n = args.n or (5_000 if args.quick else 100_000)
    blocks = args.blocks or (3 if args.quick else 7)
    block_s = args.block_seconds or (0.05 if args.quick else 0.4)
    ck = {"mode": args.mode} if args.mode else None
    print_header("bench_models: the models PyMC users write, pymc_dp vs PyMC and numpy")
    if args.scaling:
        print(
            f"package functions vs n; medians of {blocks} interleaved blocks of ~{block_s / 2:g} "
            f"s; chunk = chunk_size (n: no chunking); peak MB: temporaries of one call "
            f"(peak RSS growth or tracemalloc); DP backend: {args.mode or 'automatic'}\n"
        )
        print(SCALING_HEADER, flush=True)
        for name in args.models:
            for row in scaling_rows(name, args.sizes, blocks, block_s, ck):
                print(row, flush=True)
        return
    if args.floor:
        print(
            f"clipped gradient sum per call; medians of {blocks} interleaved blocks of "
            f"~{block_s / 2:g} s; ratio = row / PyMC's logp+grad function (one leapfrog step "
            f"of pm.HamiltonianMC); DP backend: {args.mode or 'automatic'}\n"
        )
        print(HEADER.replace("pkg ms", "ms    ").replace("ref ms", "PyMC ms"), flush=True)
        for name in [m for m in args.models if m in FLOOR_MODELS]:
            for row in floor_rows(name, n, blocks, block_s, ck):
                print(row, flush=True)
        return
    print(
        f"HMC pair: L = {N_LEAPFROG}, step size {STEP_SIZE:g}; medians of {blocks} interleaved "
        f"blocks of ~{block_s:g} s; DP backend: {args.mode or 'automatic'}"
    )
    print("ratio = pkg / ref (ref: PyMC's step, per PyMC proposal for Metropolis; or numpy)\n")
    print(HEADER, flush=True)
    for name in args.models:
        for row in run_model(
            name,
            n,
            blocks,
            block_s,
            ck,
            args.steps,
            args.l_plus_1,
            args.two_point_ratio,
            args.unfused,
            args.layered,
        ):
            print(row, flush=True)


if __name__ == "__main__":
    main()
