"""Numbers one docs page quotes from another stay equal to their source (no drift).

docs/concepts.md quotes the README quickstart's settings (n, clip bound, epsilon, delta,
chains) and the bulk ESS of its run shown in docs/getting-started.md; the scale it derives
from them is recomputed here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_quickstart() -> dict[str, float]:
    code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)[0]

    def num(pattern: str) -> float:
        m = re.search(pattern, code)
        assert m, pattern
        return float(m.group(1).replace("_", ""))

    return {
        "n": num(r"size=([\d_]+)"),
        "b": num(r'"clip_bound":\s*([\d.]+)'),
        "epsilon": num(r"epsilon=([\d.]+)"),
        "delta": num(r"delta=([\d.e-]+)"),
        "chains": num(r"chains=(\d+)"),
        "draws": num(r"draws=(\d+)"),
    }


def _tex_number(t: str) -> float:
    t = t.replace("\\,", "").replace(" ", "")
    m = re.fullmatch(r"10\^\{(-?\d+)\}", t)
    return 10.0 ** int(m.group(1)) if m else float(t)


def test_concepts_quotes_the_readme_quickstart_as_it_is():
    from pymc_dp.accounting import gaussian_mu_for_epsilon

    q = _readme_quickstart()
    text = " ".join((ROOT / "docs" / "concepts.md").read_text().split())
    m = re.search(
        r"README quickstart \(\\\(n = ([^)]+)\\\), \\\(b = ([^)]+)\\\), \\\(I = 1\\\), "
        r"\\\(\\epsilon = ([^)]+)\\\), \\\(\\delta = ([^)]+)\\\), "
        r"so \\\(\\mu \\approx ([\d.]+)\\\)\) "
        r"gets \\\(\\mu n I / \(2b\^2\) \\approx (\d+)\\\) over all the iterations of its "
        r"(\d+) chains \(warmup included\), about (\d+) for the (\d+) draws it keeps, and "
        r"its bulk ESS is (\d+)",
        text,
    )
    assert m, "docs/concepts.md no longer quotes the quickstart in the checked form"
    n, b, eps, delta, mu, scale, chains, kept_scale, kept, ess = m.groups()
    assert _tex_number(n) == q["n"]
    assert float(b) == q["b"]
    assert float(eps) == q["epsilon"]
    assert _tex_number(delta) == pytest.approx(q["delta"])
    assert int(chains) == q["chains"] and int(kept) == q["chains"] * q["draws"]
    mu_true = gaussian_mu_for_epsilon(q["epsilon"], q["delta"])
    assert float(mu) == pytest.approx(mu_true, abs=0.005)
    s = mu_true * q["n"] / (2 * q["b"] ** 2)
    assert float(scale) == pytest.approx(s, rel=0.03)
    assert float(kept_scale) == pytest.approx(s / 2, rel=0.03)  # half the iterations kept
    # the ESS is the one of the run shown on the getting-started page
    gs = (ROOT / "docs" / "getting-started.md").read_text()
    table = re.search(r"```text\n\s+mean\s+sd.*?\n(.*?)\n```", gs, flags=re.S)
    assert table, "getting-started.md no longer shows the quickstart summary"
    header = re.search(r"```text\n(.*?)\n", gs[table.start() :]).group(1).split()
    row = table.group(1).split()
    assert float(row[1:][header.index("ess_bulk")]) == float(ess)
