"""Tests of pymc_dp.experiments: metrics, reference samplers, the paper's accounting, the CLI."""

from __future__ import annotations

import csv
import math
import warnings
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from pymc_dp.experiments import (
    METHODS,
    banana,
    correlated_gaussian,
    mean_error,
    median_heuristic,
    mmd,
    paper_iterations_per_chain,
    run_one,
)
from pymc_dp.experiments.cli import main

warnings.filterwarnings("ignore", message=".*BLAS.*")


# -- metrics ------------------------------------------------------------------------------------


def test_median_heuristic_all_pairs_hand_example():
    # distances |0-1|, |0-3|, |10-1|, |10-3| = 1, 3, 9, 7: median 5
    assert median_heuristic([[0.0], [10.0]], [[1.0], [3.0]], n_pairs=None) == 5.0
    # 2-d: distances from the origin to (3, 4), (6, 8), (0, 1) = 5, 10, 1: median 5
    x = np.zeros((1, 2))
    assert median_heuristic(x, [[3.0, 4.0], [6.0, 8.0], [0.0, 1.0]], n_pairs=None) == 5.0


def test_median_heuristic_random_pairs_matches_population_median():
    # X, Y ~ N(0, 1) independent: |X - Y| is half-normal with scale sqrt(2).
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20000, 1)), rng.normal(size=(20000, 1))
    dist = stats.halfnorm(scale=math.sqrt(2.0))
    m = dist.median()
    # sd of the median of 500 draws: 1 / (2 f(m) sqrt(500)) (asymptotic)
    sd = 1.0 / (2.0 * dist.pdf(m) * math.sqrt(500))
    w = median_heuristic(x, y, n_pairs=500, rng=1)
    assert abs(w - m) < 4 * sd


def test_mmd_hand_example_and_estimators():
    # one point each, width 1: biased MMD^2 = k(0,0) + k(1,1) - 2 k(0,1) = 2 - 2 e^{-1/2}
    assert mmd([[0.0]], [[1.0]], width=1.0, biased=True) == pytest.approx(2 - 2 * math.exp(-0.5))
    # two points each: unbiased drops the diagonal of kxx, kyy
    x, y = np.array([[0.0], [1.0]]), np.array([[0.0], [2.0]])
    k = lambda a, b: math.exp(-((a - b) ** 2) / 2)  # noqa: E731
    kxx = k(0, 1)
    kyy = k(0, 2)
    kxy = (k(0, 0) + k(0, 2) + k(1, 0) + k(1, 2)) / 4
    assert mmd(x, y, width=1.0) == pytest.approx(kxx + kyy - 2 * kxy)
    with pytest.raises(ValueError, match="width"):
        mmd(x, y, width=-1.0)
    with pytest.raises(ValueError, match="dimension"):
        mmd(x, np.zeros((3, 2)))


@pytest.mark.parametrize("metric", [median_heuristic, mmd])
def test_samples_of_different_dimension_are_refused_naming_both(metric):
    with pytest.raises(ValueError, match="x and y must have the same dimension; got 2, 3"):
        metric(np.zeros((4, 2)), np.zeros((5, 3)))
    with pytest.raises(ValueError, match="y must be an array of shape"):
        metric(np.zeros((4, 2)), np.zeros((0, 2)))


def test_mmd_paper_scale_is_the_square_root_of_the_absolute_value():
    """The DP-HMC paper's code reports sqrt(|MMD^2_u|): 0.0025 -> 0.05, -0.0004 -> 0.02."""
    from pymc_dp.experiments import mmd_paper_scale

    assert mmd_paper_scale(0.0025) == pytest.approx(0.05)
    assert mmd_paper_scale(-0.0004) == pytest.approx(0.02)
    assert math.isnan(mmd_paper_scale(float("nan")))


def test_read_results_reads_the_earlier_csv_layout(tmp_path):
    """A CSV with the earlier single ``mmd`` column (the committed ones) loads with both
    ``mmd2_u`` (its values) and ``mmd_paper`` (derived), and tables the same as the new
    layout with the same numbers."""
    from pymc_dp.experiments import summary_table
    from pymc_dp.experiments.runner import CSV_FIELDS, read_results

    assert "mmd" not in CSV_FIELDS and {"mmd2_u", "mmd_paper"} <= set(CSV_FIELDS)
    base = {f: "1" for f in CSV_FIELDS} | {"model": "m", "method": "a", "protocol": "paper"}
    new = [
        base | {"repeat": str(i), "mmd2_u": str(v), "mmd_paper": str(math.sqrt(abs(v)))}
        for i, v in enumerate([0.04, -0.0009])
    ]
    old = [
        {("mmd" if k == "mmd2_u" else k): v for k, v in r.items() if k != "mmd_paper"} for r in new
    ]
    for name, rows in (("new", new), ("old", old)):
        with open(tmp_path / f"{name}.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    got_old, got_new = read_results(tmp_path / "old.csv"), read_results(tmp_path / "new.csv")
    assert [r["mmd2_u"] for r in got_old] == [0.04, -0.0009]
    assert [r["mmd_paper"] for r in got_old] == pytest.approx([0.2, 0.03])
    assert "mmd" not in got_old[0]
    assert summary_table(got_old) == summary_table(got_new)


def test_mmd_is_zero_in_expectation_and_detects_a_shift():
    rng = np.random.default_rng(5)
    cov = np.array([[1.0, 0.6], [0.6, 2.0]])
    chol = np.linalg.cholesky(cov)

    def draw(m, shift=0.0):
        return rng.standard_normal((m, 2)) @ chol.T + shift

    null = np.array([mmd(draw(200), draw(300), rng=rng) for _ in range(40)])
    # unbiased estimator: mean 0 within 4 standard errors of the average
    assert abs(null.mean()) < 4 * null.std(ddof=1) / math.sqrt(null.size)
    biased = np.array([mmd(draw(200), draw(300), rng=rng, biased=True) for _ in range(10)])
    assert np.all(biased > 0)
    # a mean shift of one marginal sd is far outside the null spread
    shifted = np.array([mmd(draw(200, [1.0, 0.0]), draw(300), rng=rng) for _ in range(5)])
    assert shifted.min() > null.mean() + 6 * null.std(ddof=1)


def test_mean_error_hand_example():
    assert mean_error([[0.0, 0.0], [2.0, 0.0]], [[0.0, 3.0]]) == pytest.approx(math.sqrt(10.0))
    with pytest.raises(ValueError, match="NaN"):
        mean_error([[np.nan, 0.0]], [[0.0, 0.0]])


# -- reference samplers ---------------------------------------------------------------------------


@pytest.mark.slow
def test_banana_reference_matches_numerical_integration_of_the_pymc_model():
    """Thesis Theorem 5 (tempered): exact draws vs a grid integral of the PyMC model's density.

    The tempered log posterior T * loglik + log prior is evaluated from the PyMC model itself
    (so the model's prior parametrisation and likelihood are checked too) on a fine grid.
    Posterior expectations of theta1, theta2, theta1^2, theta2^2 and theta1 theta2 from the
    reference draws must agree with the grid within 4 Monte Carlo standard errors.
    """
    temper = 0.5
    exp = banana(n=200, seed=3, a=1.0, sigma1_sq=20.0, sigma2_sq=2.5, tempering=temper)
    model = exp.model
    ll = model.compile_logp(vars=model.observed_RVs, sum=True)
    lp = model.compile_logp(vars=model.free_RVs, sum=True)
    ref = exp.reference(400_000, np.random.default_rng(0))
    lo, hi = np.quantile(ref, 1e-5, axis=0), np.quantile(ref, 1 - 1e-5, axis=0)
    span = hi - lo
    g1 = np.linspace(lo[0] - 0.2 * span[0], hi[0] + 0.2 * span[0], 100)
    g2 = np.linspace(lo[1] - 0.2 * span[1], hi[1] + 0.2 * span[1], 100)
    logd = np.empty((g1.size, g2.size))
    for i, t1 in enumerate(g1):
        for j, t2 in enumerate(g2):
            pt_ = {"theta1": t1, "theta2": t2}
            logd[i, j] = temper * ll(pt_) + lp(pt_)
    w = np.exp(logd - logd.max())
    w /= w.sum()
    t1, t2 = np.meshgrid(g1, g2, indexing="ij")
    funcs = {
        "theta1": (t1, ref[:, 0]),
        "theta2": (t2, ref[:, 1]),
        "theta1^2": (t1**2, ref[:, 0] ** 2),
        "theta2^2": (t2**2, ref[:, 1] ** 2),
        "theta1*theta2": (t1 * t2, ref[:, 0] * ref[:, 1]),
    }
    for name, (on_grid, on_draws) in funcs.items():
        exact = float(np.sum(on_grid * w))
        mcse = on_draws.std() / math.sqrt(on_draws.size)
        err = on_draws.mean() - exact
        assert abs(err) < 4 * mcse, f"{name}: {on_draws.mean():.5f} vs grid {exact:.5f}"


def test_banana_reference_d_dimensional_shapes_and_transform():
    exp = banana(n=500, seed=1, dim=4)
    assert exp.var_names == ["theta1", "theta2", "theta_rest"]
    assert exp.dim == 4
    draws = exp.reference(1000, np.random.default_rng(0))
    assert draws.shape == (1000, 4)
    # theta2 + a theta1^2 is Gaussian (Definition 8): its skewness vanishes, theta2's does not
    u = draws[:, 1] + 20.0 * draws[:, 0] ** 2
    assert abs(stats.skew(u)) < 4 * math.sqrt(6 / draws.shape[0])


def test_correlated_gaussian_model_density_is_the_closed_form_posterior():
    """log p(theta | x) from the PyMC model minus the closed-form Gaussian log density is
    constant in theta (both are normalised up to a constant; conjugate posterior)."""
    exp = correlated_gaussian(n=300, dim=4, seed=2)
    model = exp.model
    logp = model.compile_logp(sum=True)
    mean, cov = exp.info["posterior_mean"], exp.info["posterior_cov"]
    rng = np.random.default_rng(0)
    pts = mean + rng.standard_normal((6, 4)) @ np.linalg.cholesky(cov).T * 3
    diffs = [logp({"theta": p}) - stats.multivariate_normal(mean, cov).logpdf(p) for p in pts]
    assert np.ptp(diffs) < 1e-6 * max(1.0, abs(np.mean(diffs)))
    draws = exp.reference(100_000, rng)
    se = np.sqrt(np.diag(cov) / draws.shape[0])
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 4 * se)


# -- the paper's accounting ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "method", "published"),
    [
        # iterations per chain at eps 2 / 4 / 12 / 15 (DP-HMC paper code; reference notes)
        ("banana", "dphmc", [27, 94, 620, 892]),
        ("banana", "penalty", [145, 507, 3337, 4795]),
        ("gaussian", "dphmc", [16, 56, 374, 538]),
        ("gaussian", "penalty", [12, 43, 288, 414]),
    ],
)
def test_paper_iterations_match_the_papers_code(model, method, published):
    class _Exp:  # only n and name are read by the settings
        name = model
        n = 100_000
        info: dict = {}

    setting = METHODS[method].setting(_Exp())
    got = [paper_iterations_per_chain(setting.paper_mu, e, 1e-6, 4) for e in (2, 4, 12, 15)]
    assert got == published


def test_bad_input_is_refused_before_sampling():
    exp = banana(n=200, seed=0)
    with pytest.raises(ValueError, match="unknown method"):
        run_one(exp, "nuts", 2.0)
    with pytest.raises(ValueError, match="protocol"):
        run_one(exp, "penalty", 2.0, protocol="fast")
    with pytest.raises(ValueError, match="no settings for model"):
        run_one(exp, "fastmh", 2.0)
    # n = 200 at the paper's noise: epsilon 0.01 buys no iteration
    with pytest.raises(ValueError, match="iteration"):
        run_one(exp, "dphmc", 0.01)
    with pytest.raises(SystemExit):
        main(["experiment", "banana", "--epsilons", "2,-1", "--out", "x"])


# -- the CLI end to end (tiny sizes) -------------------------------------------------------------


def _check_outputs(out, model, methods, n_eps=1, repeats=1):
    with open(out / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(methods) * n_eps * repeats
    assert sorted({r["method"] for r in rows}) == sorted(methods)
    for r in rows:
        for key in ("epsilon_reported", "mmd2_u", "mmd_paper", "mean_error", "accept_rate"):
            assert math.isfinite(float(r[key])), (key, r)
        # the paper's scale of the same run: sqrt(|MMD^2_u|)
        assert float(r["mmd_paper"]) == pytest.approx(math.sqrt(abs(float(r["mmd2_u"]))))
        assert float(r["epsilon_reported"]) <= float(r["epsilon_target"])
        assert int(r["iterations_per_chain"]) >= 2
        assert r["model"] == model
    assert (out / f"{model}_metrics.png").stat().st_size > 0
    assert (out / f"{model}_posterior_eps15.png").stat().st_size > 0
    return rows


@pytest.mark.parametrize(
    ("model", "methods"),
    [("banana", "dphmc,penalty"), ("gaussian", "dphmc,penalty"), ("mixture", "fastmh")],
)
def test_cli_quick_run_writes_csv_and_figures(tmp_path, model, methods, capsys):
    out = tmp_path / model
    assert main(["experiment", model, "--quick", "--methods", methods, "--out", str(out)]) == 0
    rows = _check_outputs(out, model, methods.split(","))
    err = capsys.readouterr().err
    assert err.count(f"{model} ") >= len(rows)  # one progress line per run
    if model == "banana":
        for r in rows:
            assert r["protocol"] == "paper" and int(r["tune"]) == 0
        # the plot subcommand re-makes the figures from the CSV
        (out / "banana_metrics.png").unlink()
        assert main(["plot", str(out / "results.csv"), "--out", str(out)]) == 0
        assert (out / "banana_metrics.png").stat().st_size > 0


def test_split_repeats_reproduce_one_run_and_merge(tmp_path, capsys):
    """Repeats run in separate processes (--first-repeat) give the rows of one run; the
    plot and table subcommands merge the CSVs; a conflicting duplicate run is refused."""
    from pymc_dp.experiments import merge_results, summary_table
    from pymc_dp.experiments.runner import read_results

    base = ["experiment", "banana", "--quick", "--methods", "penalty", "--epsilons", "4,15"]
    assert main([*base, "--repeats", "2", "--out", str(tmp_path / "all")]) == 0
    assert main([*base, "--repeats", "1", "--out", str(tmp_path / "a")]) == 0
    argv = [*base, "--repeats", "1", "--first-repeat", "1", "--out", str(tmp_path / "b")]
    assert main(argv) == 0
    one = read_results(tmp_path / "all" / "results.csv")
    split = merge_results([tmp_path / "a" / "results.csv", tmp_path / "b" / "results.csv"])
    assert len(one) == len(split) == 4
    key = ("method", "epsilon_target", "repeat")
    for r1, r2 in zip(sorted(one, key=lambda r: tuple(r[k] for k in key)), split, strict=True):
        for k in ("repeat", "seed", "epsilon_reported", "mmd2_u", "mmd_paper", "mean_error"):
            assert r1[k] == r2[k], k
    # the same file twice: each run kept once
    assert len(merge_results([tmp_path / "all" / "results.csv"] * 2)) == 4
    table = summary_table(split)
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 2  # header, rule, one line per epsilon
    mmd4 = np.array([r["mmd2_u"] for r in split if r["epsilon_target"] == 4.0])
    paper4 = np.sqrt(np.abs(mmd4))
    assert "| penalty | 4 | 2 |" in lines[2]
    assert f"{mmd4.mean():.4f} ± {mmd4.std(ddof=1):.4f}" in lines[2]
    assert f"{paper4.mean():.4f} ± {paper4.std(ddof=1):.4f}" in lines[2]
    assert "`mmd2_u`" in lines[0] and "`mmd_paper` = sqrt(\\|MMD^2_u\\|)" in lines[0]
    capsys.readouterr()
    csvs = [str(tmp_path / "a" / "results.csv"), str(tmp_path / "b" / "results.csv")]
    assert main(["table", *csvs]) == 0
    assert capsys.readouterr().out == table
    assert main(["plot", *csvs, "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "banana_metrics.png").stat().st_size > 0
    assert (tmp_path / "fig" / "banana_posterior_eps15.png").stat().st_size > 0
    # a run recorded twice with different results is refused, naming both places
    bad = tmp_path / "bad"
    bad.mkdir()
    text = (tmp_path / "a" / "results.csv").read_text().splitlines()
    head, row = text[0].split(","), text[1].split(",")
    row[head.index("mmd2_u")] = "0.123456"
    (bad / "results.csv").write_text("\n".join([text[0], ",".join(row)]) + "\n")
    with pytest.raises(ValueError, match="different results"):
        merge_results([tmp_path / "a" / "results.csv", bad / "results.csv"])
    with pytest.raises(ValueError, match="first_repeat"):
        from pymc_dp.experiments import run_experiment

        run_experiment("banana", ["penalty"], [4.0], first_repeat=-1, out=tmp_path / "x")


def test_cli_runs_the_stochastic_gradient_baselines(tmp_path):
    """DP-SGLD and DP-SGNHT (the paper's Figure 1 baselines) run through the same runner.

    At the paper's step sizes they need the paper's n (their steps scale as 1/n)."""
    out = tmp_path / "sg"
    argv = ["experiment", "banana", "--quick", "--methods", "sgld,sgnht", "--n", "100000"]
    argv += ["--draws", "60", "--tune", "20", "--out", str(out)]
    assert main(argv) == 0
    rows = _check_outputs(out, "banana", ["sgld", "sgnht"])
    for r in rows:
        assert r["protocol"] == "calibrated" and int(r["iterations_per_chain"]) == 80


def test_cli_stop_at_in_the_past_runs_nothing(tmp_path):
    out = tmp_path / "stopped"
    argv = ["experiment", "banana", "--quick", "--out", str(out), "--stop-at", "00:00"]
    assert main(argv) == 0
    with open(out / "results.csv", newline="") as fh:
        assert list(csv.DictReader(fh)) == []


@pytest.mark.slow  # a NUTS reference run
def test_cli_quick_logistic_calibrated(tmp_path, monkeypatch):
    pytest.importorskip("statsmodels")
    monkeypatch.setenv("PYMC_DP_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "logistic"
    argv = ["experiment", "logistic", "--quick", "--methods", "penalty", "--out", str(out)]
    assert main(argv) == 0
    rows = _check_outputs(out, "logistic", ["penalty"])
    assert rows[0]["protocol"] == "calibrated"
    # the NUTS reference was cached
    assert list((tmp_path / "cache").glob("logistic_reference_*.npy"))


def test_reproduce_script_refuses_bad_arguments():
    """scripts/reproduce_results.sh prints its usage without arguments and names the parts
    it knows for an unknown one (a real part runs the paper's n: too slow for CI)."""
    import pathlib
    import subprocess

    script = pathlib.Path(__file__).parents[2] / "scripts" / "reproduce_results.sh"
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert r.returncode == 2 and "PART FIRST_REPEAT REPEATS" in r.stdout
    r = subprocess.run(["bash", str(script), "nope", "0", "1"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown PART 'nope'" in r.stderr
    assert "banana_dphmc" in r.stderr


@pytest.mark.parametrize(
    ("model", "methods"),
    [
        ("banana", {"dphmc", "penalty", "sgld", "sgnht"}),
        ("gaussian", {"dphmc", "penalty", "sgld", "sgnht"}),
        ("mixture", {"fastmh"}),
    ],
)
def test_results_page_tables_are_the_committed_csvs(model, methods):
    """docs/results.md's tables are summary_table of the CSVs committed under
    docs/data/results (not typed in by hand), with the papers' 10 repeats of every cell."""
    import pathlib

    from pymc_dp.experiments import merge_results, summary_table

    root = pathlib.Path(__file__).parents[2] / "docs"
    csvs = sorted((root / "data" / "results").glob(f"{model}_*.csv"))
    assert csvs, "no committed results CSV"
    rows = merge_results(csvs)
    assert {r["method"] for r in rows} == methods
    per_cell = Counter((r["method"], r["epsilon_target"]) for r in rows)
    assert set(per_cell.values()) == {10}, per_cell  # the papers' 10 repeats, every cell
    page = (root / "results.md").read_text()
    table = summary_table(rows).strip()
    assert table in page
    # both scales, the paper's one being sqrt(|MMD^2_u|) per run, then mean over the runs
    assert "`mmd_paper` = sqrt(\\|MMD^2_u\\|)" in table.splitlines()[0]
    r0 = [r for r in rows if (r["method"], r["epsilon_target"]) == (sorted(methods)[0], 15.0)]
    paper = np.sqrt(np.abs([r["mmd2_u"] for r in r0]))
    assert f"{paper.mean():.4f} ± {paper.std(ddof=1):.4f}" in table
    for r in rows:  # every committed run met its privacy target
        assert r["epsilon_reported"] <= r["epsilon_target"]


# -- the automatic mode as a method of the runner ------------------------------------------------


def test_auto_iteration_budget_is_the_papers_penalty_run_length():
    """The "auto" method may run as many penalty tests as the paper's DP penalty run at the
    same epsilon (4 chains x the paper code's iterations), at least 4 x 50; a model without
    the paper's DP penalty setting gets the automatic mode's own cap."""
    from pymc_dp.experiments import auto_iteration_budget
    from pymc_dp.experiments.runner import AUTO_DEFAULT_ITERATIONS

    class _Exp:
        n = 100_000
        info: dict = {}

        def __init__(self, name):
            self.name = name

    got = [auto_iteration_budget(_Exp("banana"), e, 1e-6, 4) for e in (2, 4, 12, 15)]
    assert got == [4 * k for k in (145, 507, 3337, 4795)]
    # the Gaussian's paper penalty runs are shorter than the auto mode's 50 per chain
    got = [auto_iteration_budget(_Exp("gaussian"), e, 1e-6, 4) for e in (2, 4, 12, 15)]
    assert got == [4 * 50, 4 * 50, 4 * 288, 4 * 414]
    assert auto_iteration_budget(_Exp("mixture"), 4.0, 1e-6, 4) == AUTO_DEFAULT_ITERATIONS


@pytest.mark.parametrize("model", ["banana", "gaussian"])
def test_run_one_auto_end_to_end_within_the_target(model):
    """method="auto": pymc_dp.sample(step=None) under the runner's protocol; the pooled
    second halves have the right shape, the report (every phase) is within the target, the
    row says protocol "auto" with the iteration cap it was given."""
    import json

    from pymc_dp.experiments import auto_iteration_budget

    exp = banana(n=2000, seed=0) if model == "banana" else correlated_gaussian(n=2000, seed=0)
    res = run_one(exp, "auto", 4.0, chains=2, repeat=0, protocol="paper")
    row = res.row
    k = int(row["iterations_per_chain"])
    assert row["protocol"] == "auto" and row["method"] == "auto" and int(row["tune"]) == 0
    assert res.draws.shape == (2 * (k - k // 2), exp.dim)
    assert np.all(np.isfinite(res.draws))
    assert 0 < row["epsilon_reported"] <= 4.0
    assert row["chains"] == 2
    cap = auto_iteration_budget(exp, 4.0, 1e-6, 2)
    assert json.loads(row["settings"]) == {"max_iterations": cap}
    assert 50 <= k and 2 * k <= cap
    # the report lists the pre-sampling phases: the banana (a shifted block) is given the
    # chain (warm start, clip selection, control variate), which under the runner's iteration
    # cap is predicted too short to be usable and gives way to the one-shot strategy after
    # its clip selection (`ONESHOT_FALLBACK_ESS`); the Gaussian gets the one-shot strategy
    # (warm start, its two last releases)
    phases = json.loads(row["noise"])["phases"]
    assert "warm start" in phases
    if model == "banana":
        assert "clip selection" in phases, phases
    assert "one-shot" in phases and "sampling" not in phases
    assert "control variate" not in phases
    assert row["mmd_paper"] == pytest.approx(math.sqrt(abs(row["mmd2_u"])))
    # the same run (same seed) gives the same numbers
    again = run_one(exp, "auto", 4.0, chains=2, repeat=0)
    assert again.row["mmd2_u"] == row["mmd2_u"]
    np.testing.assert_array_equal(again.draws, res.draws)


def test_cli_runs_the_auto_method(tmp_path):
    out = tmp_path / "auto"
    argv = ["experiment", "banana", "--quick", "--methods", "auto,penalty", "--out", str(out)]
    assert main(argv) == 0
    rows = _check_outputs(out, "banana", ["auto", "penalty"])
    protocols = {r["method"]: r["protocol"] for r in rows}
    assert protocols == {"auto": "auto", "penalty": "paper"}


def _row(method, eps, rep, mmd2_u, its=10):
    return {
        "model": "banana",
        "method": method,
        "protocol": "auto" if method == "auto" else "paper",
        "n": 100.0,
        "epsilon_target": eps,
        "epsilon_reported": eps - 0.01,
        "delta": 1e-6,
        "chains": 4.0,
        "iterations_per_chain": its,
        "repeat": rep,
        "mmd2_u": mmd2_u,
        "mmd_paper": math.sqrt(abs(mmd2_u)),
    }


def test_comparison_table_hand_example(tmp_path, capsys):
    """Means and sds over the runs on both scales; "no worse" compares the mean with the
    best of the others per scale (which can differ: the mean of sqrt is not the sqrt of
    the mean); a cell without runs is "-"."""
    from pymc_dp.experiments import comparison_table

    rows = [
        _row("auto", 2.0, 0, 0.04),
        _row("auto", 2.0, 1, 0.0),
        _row("penalty", 2.0, 0, 0.01),
        _row("penalty", 2.0, 1, 0.04),
        _row("dphmc", 2.0, 0, 0.09),
        _row("auto", 4.0, 0, 0.01, its=20),
        _row("auto", 4.0, 1, 0.01, its=30),
        _row("penalty", 4.0, 0, 0.04),
    ]
    table = comparison_table(rows)
    lines = table.strip().splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("| epsilon | auto runs | auto iterations / chain |")
    c2 = [c.strip() for c in lines[2].strip("|").split("|")]
    # auto mmd2_u 0.02 ± 0.0283 vs penalty 0.025 (best): no worse; on the paper's scale
    # auto (0.2 + 0) / 2 = 0.1 vs penalty (0.1 + 0.2) / 2 = 0.15: no worse
    assert c2[:4] == ["2", "2", "10", "1.99"]
    assert c2[4] == f"0.0200 ± {np.std([0.04, 0.0], ddof=1):.4f}"
    assert c2[5] == "0.0900"  # dphmc, one run
    assert c2[6] == f"0.0250 ± {np.std([0.01, 0.04], ddof=1):.4f}"
    assert c2[7] == "yes" and c2[8] == "0.1000 ± 0.1414" and c2[11] == "yes"
    c4 = [c.strip() for c in lines[3].strip("|").split("|")]
    assert c4[2] == "20-30" and c4[5] == "-" and c4[7] == "yes"
    worse = comparison_table([_row("auto", 2.0, 0, 0.05), _row("penalty", 2.0, 0, 0.01)])
    assert worse.count("**no**") == 2
    with pytest.raises(ValueError, match="no run of method"):
        comparison_table([_row("penalty", 2.0, 0, 0.01)])
    # the CLI prints the same table from CSVs
    from pymc_dp.experiments.runner import CSV_FIELDS

    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**{k: 0 for k in CSV_FIELDS}, **r, "seed": 1})
    capsys.readouterr()
    assert main(["compare", str(path)]) == 0
    assert capsys.readouterr().out == table


@pytest.mark.parametrize("model", ["banana", "gaussian"])
def test_results_page_auto_tables_are_the_committed_csvs(model):
    """docs/results.md's automatic-mode tables are comparison_table of the committed auto
    runs (docs/data/results/auto/) with the committed hand-tuned runs, every auto run within
    its target and at least 3 repeats per epsilon."""
    import pathlib

    from pymc_dp.experiments import comparison_table, merge_results

    root = pathlib.Path(__file__).parents[2] / "docs"
    csvs = sorted((root / "data" / "results").glob(f"{model}_*.csv"))
    auto = root / "data" / "results" / "auto" / f"{model}.csv"
    rows = merge_results([*csvs, auto])
    mine = [r for r in rows if r["method"] == "auto"]
    assert mine and all(r["protocol"] == "auto" for r in mine)
    assert all(r["epsilon_reported"] <= r["epsilon_target"] for r in mine)
    per_cell = Counter(r["epsilon_target"] for r in mine)
    assert set(per_cell) == {2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0}
    assert min(per_cell.values()) >= 3
    page = (root / "results.md").read_text()
    assert comparison_table(rows).strip() in page
