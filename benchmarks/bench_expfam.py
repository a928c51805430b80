"""DPExpFamilyPenalty: per-iteration time vs n, and accuracy vs DPPenaltyMetropolis.

Bayesian linear regression with unknown noise scale, ``k`` covariates uniform on [-1, 1],
responses clipped to the public range [-4, 4] (so the statistics' clipping is inactive):

    a, b_j ~ N(0, 3^2),  sigma ~ HalfNormal(2),  y_i ~ N(a + x_i^T b, sigma^2).

Part 1, time: the step computes ``S = sum_i clip_C(T(x_i))`` once (construction, one chunked
pass over the records) and then every iteration costs the same whatever ``n``: printed are
the construction time, the milliseconds per iteration (median of blocks of
``step.step(point)`` calls) and its ratio to the first size (expected near 1).

Part 2, accuracy: at the same (epsilon, delta) for the whole run, DPExpFamilyPenalty and
DPPenaltyMetropolis (clip bound ``--penalty-clip`` on the per-record log-likelihood ratio,
fixed in advance), both with the same random walk (``--proposal``, default the guided
one-coordinate walk), sample the same model; their posterior means and sds are compared with a
NUTS reference (non-private) in units of the NUTS posterior sd, printed side by side.

Part 3, goal (``--goal``): the centred statistics (`pymc_dp.StatCentre`) with correlated
releases (`pymc_dp.CorrelatedNoise`; both the defaults with a target epsilon) on a linear
regression with unknown sigma, ``X ~ U(-1, 1)^3``, public bounds ``X`` in [-1, 1] and ``y``
in [-10, 10] (the magnitude bound on ``T(x)`` is then about 102, from ``y^2``): 4 chains
through `pymc_dp.sample` at each n and epsilon, against ``pm.sample`` NUTS on the same
data; per parameter the error of the mean in NUTS sds, the sd ratio and R-hat, then the worst
of each.

Usage::

    python benchmarks/bench_expfam.py                       # n = 1e4, 1e6, 1e7; accuracy at 1e5
    python benchmarks/bench_expfam.py --sizes 300 600 --acc-n 300 --acc-draws 100  # smoke
    python benchmarks/bench_expfam.py --goal --goal-n 100000 --goal-eps 10 3  # the goal table
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pymc as pm

import pymc_dp

Y_BOUND = 4.0
TRUE_B = np.array([1.0, -0.5, 0.25, 0.0, 0.7, -1.0])


def make_data(n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Covariates on [-1, 1]^k and clipped responses, generated in chunks (bounded memory)."""
    rng = np.random.default_rng(seed)
    X = np.empty((n, k))
    y = np.empty(n)
    b = np.resize(TRUE_B, k)
    for s in range(0, n, 1_000_000):
        m = min(1_000_000, n - s)
        X[s : s + m] = rng.uniform(-1, 1, size=(m, k))
        y[s : s + m] = 0.5 + X[s : s + m] @ b + 0.8 * rng.normal(size=m)
    np.clip(y, -Y_BOUND, Y_BOUND, out=y)
    return X, y


def regression(X: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3, size=X.shape[1])
        s = pm.HalfNormal("s", 2)
        pm.Normal("y", a + pm.math.dot(X, b), s, observed=y)
    return model


BOUNDS = {"X": (-1.0, 1.0), "y": (-Y_BOUND, Y_BOUND)}


def time_per_iteration(n: int, k: int, iters: int, blocks: int) -> tuple[float, float]:
    X, y = make_data(n, k)
    model = regression(X, y)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        step = pymc_dp.DPExpFamilyPenalty(
            data_bounds=BOUNDS, noise_multiplier=1.0, chunk_size=1_000_000
        )
        setup = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    if int(pm.__version__.split(".")[0]) >= 6:  # PyMC 6 starts a chain with its length
        step.setup_chain(rng, 0, 50 + iters * blocks)
    else:
        step.set_rng(rng)
    point = model.initial_point()
    for _ in range(50):  # warm up
        point, _ = step.step(point)
    times = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(iters):
            point, _ = step.step(point)
        times.append((time.perf_counter() - t0) / iters)
    del X, y, model, step
    return setup, float(np.median(times))


def posterior_matrix(idata, k: int) -> np.ndarray:
    post = idata.posterior
    cols = [post["a"].values.reshape(-1)]
    cols += [post["b"].values.reshape(-1, k)[:, j] for j in range(k)]
    cols.append(post["s"].values.reshape(-1))
    return np.column_stack(cols)


def accuracy(args) -> None:
    n, k = args.acc_n, args.k
    X, y = make_data(n, k, seed=1)
    delta = 0.1 / n
    kw = dict(
        draws=args.acc_draws, tune=args.acc_draws, chains=2, cores=1, progressbar=False,
        compute_convergence_checks=False,
    )  # fmt: skip
    with regression(X, y), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = posterior_matrix(pm.sample(random_seed=0, **kw), k)
        runs = {}
        for name, cls, step_kwargs in (
            (
                "DPExpFamilyPenalty",
                pymc_dp.DPExpFamilyPenalty,
                {"data_bounds": BOUNDS, "proposal": args.proposal},
            ),
            (
                "DPPenaltyMetropolis",
                pymc_dp.DPPenaltyMetropolis,
                {"clip_bound": args.penalty_clip, "proposal": args.proposal},
            ),
        ):
            t0 = time.perf_counter()
            idata = pymc_dp.sample(
                step=cls, epsilon=args.epsilon, delta=delta, step_kwargs=step_kwargs,
                random_seed=2, **kw,
            )  # fmt: skip
            secs = time.perf_counter() - t0
            rep = pymc_dp.privacy_report(idata)
            runs[name] = (posterior_matrix(idata, k), secs, rep.epsilon)
    names = ["a", *[f"b[{j}]" for j in range(k)], "s"]
    m_ref, sd_ref = ref.mean(0), ref.std(0)
    print(
        f"\n-- accuracy: n = {n:,}, epsilon = {args.epsilon:g}, delta = {delta:.1e} (whole run: "
        f"2 chains x {2 * args.acc_draws} iterations), errors in NUTS posterior sds --"
    )
    header = f"{'param':<8} {'NUTS mean':>10} {'NUTS sd':>9}"
    for name in runs:
        header += f" | {name + ' |dmean|/sd':>30} {'sd/sd_NUTS':>10}"
    print(header)
    for j, p in enumerate(names):
        line = f"{p:<8} {m_ref[j]:>10.4f} {sd_ref[j]:>9.4f}"
        for post, _, _ in runs.values():
            line += (
                f" | {abs(post[:, j].mean() - m_ref[j]) / sd_ref[j]:>30.3f} "
                f"{post[:, j].std() / sd_ref[j]:>10.3f}"
            )
        print(line)
    for name, (post, secs, eps) in runs.items():
        err_m = np.abs(post.mean(0) - m_ref) / sd_ref
        err_s = np.abs(post.std(0) / sd_ref - 1)
        print(
            f"summary {name:<20} max |dmean|/sd {err_m.max():.3f}  mean {err_m.mean():.3f}  "
            f"max |sd ratio - 1| {err_s.max():.3f}  epsilon spent {eps:.3f}  "
            f"wall {secs:.1f} s"
        )


def goal(args) -> None:
    """The centred statistics against NUTS (module docstring, part 3)."""
    import arviz as az

    k, chains = 3, 4
    bounds = {"X": (-1.0, 1.0), "y": (-10.0, 10.0)}
    names = ["a", *[f"b[{j}]" for j in range(k)], "s"]
    print(
        f"\n-- goal: linear regression, unknown sigma, X ~ U(-1,1)^{k}, data_bounds X in "
        f"[-1, 1], y in [-10, 10]; {chains} chains x ({args.goal_tune} tune + "
        f"{args.goal_draws} draws), delta = 1e-6; NUTS: pm.sample, {chains} x (1000 + 1000) --"
    )
    print(
        f"{'n':>8} {'eps':>5} {'param':<6} {'NUTS mean':>10} {'NUTS sd':>9} "
        f"{'|dmean|/sd':>10} {'sd ratio':>8} {'R-hat':>6}"
    )
    for n in args.goal_n:
        rng = np.random.default_rng(0)
        X = rng.uniform(-1, 1, size=(n, k))
        y = np.clip(0.5 + X @ TRUE_B[:k] + 0.8 * rng.normal(size=n), -10, 10)
        model = regression(X, y)
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            ref = pm.sample(
                1000, tune=1000, chains=chains, cores=1, random_seed=2, progressbar=False,
                compute_convergence_checks=False,
            )  # fmt: skip
            t_nuts = time.perf_counter() - t0
        m_ref = posterior_matrix(ref, k)
        for eps in args.goal_eps:
            with model, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                idata = pymc_dp.sample(
                    args.goal_draws, tune=args.goal_tune, chains=chains, cores=1,
                    step=pymc_dp.DPExpFamilyPenalty, epsilon=eps, delta=1e-6,
                    step_kwargs={"data_bounds": bounds}, random_seed=args.goal_seed,
                    progressbar=False,
                )  # fmt: skip
                t_dp = time.perf_counter() - t0
            post = posterior_matrix(idata, k)
            rhat = az.rhat(idata)
            rh = np.r_[float(rhat["a"]), np.ravel(rhat["b"].values), float(rhat["s"])]
            err = np.abs(post.mean(0) - m_ref.mean(0)) / m_ref.std(0)
            ratio = post.std(0) / m_ref.std(0)
            for j, p in enumerate(names):
                print(
                    f"{n:>8} {eps:>5g} {p:<6} {m_ref[:, j].mean():>10.4f} "
                    f"{m_ref[:, j].std():>9.4f} {err[j]:>10.2f} {ratio[j]:>8.2f} {rh[j]:>6.3f}"
                )
            rep = pymc_dp.privacy_report(idata)
            stats = idata.sample_stats
            print(
                f"summary n={n} eps={eps:g}: max |dmean|/sd {err.max():.2f}, max R-hat "
                f"{rh.max():.3f}, sd ratio {ratio.min():.2f}-{ratio.max():.2f}; epsilon spent "
                f"{rep.epsilon:.3f}; median noise std {float(np.median(stats['noise_std'])):.2f}; "
                f"acceptance {float(stats['accepted'].mean()):.3f}; wall {t_dp:.1f} s "
                f"(NUTS {t_nuts:.1f} s)",
                flush=True,
            )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000, 10_000_000])
    p.add_argument("--k", type=int, default=3, help="number of covariates")
    p.add_argument("--iters", type=int, default=1000, help="iterations per timing block")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--acc-n", type=int, default=100_000)
    p.add_argument("--acc-draws", type=int, default=2000, help="draws (= tune) per chain")
    p.add_argument("--epsilon", type=float, default=8.0)
    p.add_argument("--proposal", default="guided", help="random walk of both DP steps")
    p.add_argument("--penalty-clip", type=float, default=5.0)
    p.add_argument("--goal", action="store_true", help="only the goal table (part 3)")
    p.add_argument("--goal-n", type=int, nargs="+", default=[100_000])
    p.add_argument("--goal-eps", type=float, nargs="+", default=[10.0, 3.0])
    p.add_argument("--goal-draws", type=int, default=5000)
    p.add_argument("--goal-tune", type=int, default=500)
    p.add_argument("--goal-seed", type=int, default=1, help="random_seed of the DP runs")
    args = p.parse_args(argv)
    if args.goal:
        print(f"PyMC {pm.__version__}")
        goal(args)
        return
    print(f"PyMC {pm.__version__}; linear regression, k = {args.k} covariates, unknown sigma")
    print(f"\n-- time per iteration vs n --\n{'n':>12} {'setup s':>9} {'ms/iter':>9} {'ratio':>7}")
    first = None
    for n in args.sizes:
        setup, per_iter = time_per_iteration(n, args.k, args.iters, args.blocks)
        first = first or per_iter
        print(
            f"{n:>12,d} {setup:>9.2f} {per_iter * 1e3:>9.4f} {per_iter / first:>7.2f}", flush=True
        )
    accuracy(args)


if __name__ == "__main__":
    main()
