"""Figures of the experiments (matplotlib, Agg backend).

- `plot_metrics`: MMD and mean error against epsilon, one line per method, mean +- sd
  over repeats (DP-HMC paper, Figure 1).
- `plot_posteriors`: for one epsilon, the run with the median MMD of each method:
  marginal densities of the first two coordinates and a 2-D scatter, each against the
  reference draws (DP-HMC paper, Figure 2).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["plot_metrics", "plot_posteriors", "make_figures"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path, dpi: int) -> Path:
    """Lay out ``fig``, write it to ``path`` and close it; returns the path."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    _pyplot().close(fig)
    return path


def plot_metrics(rows: list[dict], path: str | Path) -> Path:
    """MMD (both scales) and mean error vs epsilon per method (mean +- sd); writes a PNG.

    Three panels: the unbiased squared MMD (``mmd2_u``), the same on the DP-HMC paper's scale
    (``mmd_paper = sqrt(|mmd2_u|)``, as its Figure 1) and the mean error.

    Parameters
    ----------
    rows : list of dict
        Rows of a results CSV (`pymc_dp.experiments.runner.read_results`).
    path : path
        Output PNG.

    Returns
    -------
    pathlib.Path
    """
    if not rows:
        raise ValueError("rows is empty: there is nothing to plot")
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    groups: dict[str, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[r["method"]][float(r["epsilon_target"])].append(r)
    for ax, key, label in zip(
        axes,
        ("mmd2_u", "mmd_paper", "mean_error"),
        (r"MMD$^2_u$", r"$\sqrt{|\mathrm{MMD}^2_u|}$ (paper's scale)", "mean error"),
        strict=True,
    ):
        for method, by_eps in sorted(groups.items()):
            eps = sorted(by_eps)
            vals = [np.array([float(r[key]) for r in by_eps[e]]) for e in eps]
            mean = [v.mean() for v in vals]
            sd = [v.std(ddof=1) if v.size > 1 else 0.0 for v in vals]
            ax.errorbar(eps, mean, yerr=sd, marker="o", capsize=3, label=method)
        ax.set_xlabel(r"$\epsilon$")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    model = rows[0]["model"]
    counts = sorted({len(v) for g in groups.values() for v in g.values()})
    reps = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    fig.suptitle(f"{model}: mean $\\pm$ sd over {reps} repeat(s)")
    return _save(fig, path, dpi=120)


def plot_posteriors(
    rows: list[dict], draws_dir: str | Path, epsilon: float, path: str | Path
) -> Path | None:
    """Median-MMD run of each method at ``epsilon`` against the reference (paper Figure 2).

    Needs ``draws_dir/reference.npy`` and ``<dir>/<method>_eps<e>_rep<r>.npy`` as written by
    `pymc_dp.experiments.runner.run_experiment`, where ``<dir>`` is ``draws_dir`` or,
    for rows from `merge_results`, the ``draws`` folder
    next to the row's CSV. Returns None when no run has that epsilon.
    """
    draws_dir = Path(draws_dir)
    sel = [r for r in rows if float(r["epsilon_target"]) == float(epsilon)]
    if not sel:
        return None
    ref = np.load(draws_dir / "reference.npy")
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in sel:
        by_method[r["method"]].append(r)
    plt = _pyplot()
    methods = sorted(by_method)
    fig, axes = plt.subplots(3, len(methods), figsize=(4 * len(methods), 10), squeeze=False)
    for j, method in enumerate(methods):
        runs = sorted(by_method[method], key=lambda r: float(r["mmd2_u"]))
        med = runs[(len(runs) - 1) // 2]
        where = Path(med["_dir"]) / "draws" if "_dir" in med else draws_dir
        f = where / f"{method}_eps{float(epsilon):g}_rep{int(float(med['repeat']))}.npy"
        x = np.load(f)
        for i in range(2):
            ax = axes[i, j]
            lo = min(np.quantile(ref[:, i], 0.001), np.quantile(x[:, i], 0.01))
            hi = max(np.quantile(ref[:, i], 0.999), np.quantile(x[:, i], 0.99))
            bins = np.linspace(lo, hi, 50)
            ax.hist(ref[:, i], bins=bins, density=True, alpha=0.5, label="reference")
            ax.hist(x[:, i], bins=bins, density=True, histtype="step", lw=2, label=method)
            ax.set_xlabel(f"$\\theta_{i + 1}$")
        axes[0, j].set_title(f"{method}, median MMD run (MMD$^2_u$ {float(med['mmd2_u']):.3g})")
        axes[0, j].legend()
        ax = axes[2, j]
        ax.scatter(ref[:, 0], ref[:, 1], s=2, alpha=0.3, label="reference")
        ax.scatter(x[:, 0], x[:, 1], s=2, alpha=0.5, label=method)
        ax.set_xlabel(r"$\theta_1$")
        ax.set_ylabel(r"$\theta_2$")
    fig.suptitle(f"{sel[0]['model']}: posterior draws at $\\epsilon$ = {float(epsilon):g}")
    return _save(fig, path, dpi=110)


def make_figures(
    csv_path: str | Path | Sequence[str | Path], out: str | Path, epsilon: float | None = None
) -> list[Path]:
    """Both figures from one or more results CSVs of one model (merged by
    `merge_results`; posteriors at ``epsilon``, default the
    largest). The reference draws are read from the first CSV's ``draws`` folder.

    Returns
    -------
    list of pathlib.Path
        The PNG files written.
    """
    from pymc_dp.experiments.runner import merge_results

    paths = [csv_path] if isinstance(csv_path, (str, Path)) else list(csv_path)
    rows = merge_results(paths)
    if not rows:
        raise ValueError(f"{', '.join(map(str, paths))}: no result rows")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = rows[0]["model"]
    written = [plot_metrics(rows, out / f"{model}_metrics.png")]
    if epsilon is None:
        epsilon = max(float(r["epsilon_target"]) for r in rows)
    draws_dir = Path(paths[0]).parent / "draws"
    if (draws_dir / "reference.npy").exists():
        p = plot_posteriors(rows, draws_dir, epsilon, out / f"{model}_posterior_eps{epsilon:g}.png")
        if p is not None:
            written.append(p)
    return written
