"""The README's quickstart runs as written and meets its target."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_quickstart_runs():
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python block"
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    idata = ns["idata"]
    assert idata.attrs["dp_epsilon"] <= 4.0
    assert idata.attrs["dp_delta"] == 1e-6
    assert idata.attrs["dp_iterations"] == 2 * 2000
    # the private posterior is close to the exact one (sd 0.0032): a sanity check, not a
    # statistical test (those live in step_methods/test_penalty.py)
    exact = ns["x"].mean() * 100_000 / (100_000 + 0.01)
    assert abs(float(idata["posterior"]["mu"].mean()) - exact) < 0.01


def test_readme_automatic_mode_runs_within_its_budget():
    """The second python block (automatic mode) runs as written: the whole budget, every
    phase in the report, and the chains agree (a seeded run; R-hat is a check of this run,
    the statistical tests of the mechanism are in test_auto.py)."""
    import arviz as az

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[1]
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    idata = ns["idata"]
    assert 9.9 < idata.attrs["dp_epsilon"] <= 10.0
    # with the covariates' and the response's ranges declared, the linear regression's
    # sufficient statistics are released once (no warm start, no bounds hint)
    assert idata.attrs["dp_method"] == "stats"
    assert "sufficient statistics" in idata.attrs["dp_phases"]
    rhat = az.rhat(idata)
    rhat = rhat.to_dataset() if hasattr(rhat, "to_dataset") else rhat  # DataTree (ArviZ 1.x)
    assert max(float(v.max()) for v in rhat.data_vars.values()) < 1.1
