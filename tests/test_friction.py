"""What a new user meets following the README and docs (issue 27, the friction list): the
printed report, the README's numbers and commands, the quickstart's report."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pymc_dp.report import REPORT_WIDTH, PrivacyReport

ROOT = Path(__file__).resolve().parents[1]

PHASES = "; ".join(
    f"warm start: noisy clipped gradient sums {i}: 33 Gaussian releases, noise multiplier "
    f"{100 + i:.4g}, {3.1 * i:.1f}% of mu"
    for i in range(6)
)


def test_the_printed_report_is_a_short_block_of_short_lines():
    mechanism = (
        "36 Gaussian-mechanism releases composed by the tight bound (privacy loss N(mu, 2mu); "
        f"Sommer et al. 2019 Lemma 12, DP-HMC paper Thm 2.4); phases: {PHASES}"
    )
    rep = PrivacyReport(
        epsilon=10.0, delta=1e-6, mu=3.0, mechanism=mechanism, releases=36, chains=4,
        iterations=400, tuning_iterations=0, draws=100, model_checked=False,
        convergence="NOT CONVERGED (R-hat 3.58 > 1.1; bulk ESS 2 < 100): max R-hat 3.58 "
        "(sigma), min bulk ESS 2 (sigma), acceptance per chain 0.03, 0.03",
    )  # fmt: skip
    lines = str(rep).splitlines()
    assert lines[0].startswith("NOT CONVERGED (R-hat 3.58 > 1.1; bulk ESS 2 < 100)")
    assert max(len(line) for line in lines) <= REPORT_WIDTH, max(lines, key=len)
    # one line (or block) per part of the mechanism; a "; " inside parentheses is kept
    assert any("(privacy loss N(mu, 2mu); Sommer" in line for line in lines)
    for i in range(6):
        part = f"warm start: noisy clipped gradient sums {i}:"
        starts = [line.lstrip().removeprefix("phases: ").startswith(part) for line in lines]
        assert sum(starts) == 1, part
    # nothing lost: the words of the one-line form, in order

    def words(t: str) -> str:
        return " ".join(t.replace(";", " ").split())

    assert words(mechanism) in words(str(rep))
    assert words(str(rep)).endswith("(pass model=... or call inside the model context)")


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_quotes_the_measured_main_job_as_docs_auto_has_it():
    """The README's main-job ESS range is the min and max of the three seeds in
    docs/auto-measured.md."""
    auto = " ".join((ROOT / "docs" / "auto-measured.md").read_text().split())
    first = re.search(r"printed `max r_hat [\d.]+, min ess_bulk (\d+)`", auto)
    others = re.search(r"Seeds 1 and 2: max r_hat [\d./ ]+, min ess_bulk (\d+) / (\d+)\.", auto)
    assert first and others, "docs/auto-measured.md no longer states the main job's three seeds"
    ess = [int(first.group(1)), int(others.group(1)), int(others.group(2))]
    readme = " ".join(_readme().split())
    m = re.search(r"min bulk ESS of (\d+)-(\d+) \(three seeds", readme)
    assert m, "the README no longer quotes the main job's ESS range"
    assert (int(m.group(1)), int(m.group(2))) == (min(ess), max(ess))


def test_readme_and_docs_index_give_the_same_commands():
    index = (ROOT / "docs" / "index.md").read_text()
    for cmd in ("bash dev/test.sh", "bash dev/run_example.sh", "bash dev/docs.sh"):
        assert cmd in _readme() and cmd in index, cmd
    assert "mkdocs build" not in index  # the docs command is dev/docs.sh, as in the README


def test_readme_blocks_report_with_the_model():
    """Every README block that prints a report passes the model (no "no model was given")."""
    blocks = re.findall(r"```python\n(.*?)```", _readme(), flags=re.S)
    reports = [b for b in blocks if "privacy_report(" in b]
    assert len(reports) >= 2
    for b in reports:
        assert "as model:" in b and "privacy_report(idata, model=model)" in b


def test_one_record_is_not_refused_for_an_ordinary_model():
    """With n = 1 the constants PyMC makes for ``shape=3`` (``[3]``, ``[0]``, ``[5]``) have
    one row, like a record: the model used to be refused ("the prior of 'b' reads record
    data"). A pm.Data container of one row in a prior is still refused."""
    import pymc as pm

    from pymc_dp.records import ModelNotSupportedError, check_model_supported

    X, y = np.array([[0.3, -0.2, 0.5]]), np.array([1.0])
    with pm.Model() as model:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5, shape=3)
        pm.Normal("y", a + pm.math.dot(X, b), pm.HalfNormal("sigma", 2), observed=y)
    check_model_supported(model, [], data_free_potentials=False)
    with pm.Model() as leaky:
        w = pm.Data("w", np.array([0.7]))
        b = pm.Normal("b", w, 5, shape=1)
        pm.Normal("y", b, 1.0, observed=y)
    with pytest.raises(ModelNotSupportedError, match="the prior of 'b' reads record data"):
        check_model_supported(leaky, [], data_free_potentials=False)


def test_clip_sources_give_only_advice_that_changes_something():
    """By default (derive_clips=False) declared bounds are checked, not used for the clips:
    the sources say so and give no advice; with derive_clips=True the reason names the data
    in the user's terms (no PyTensor types or op names)."""
    import pymc as pm
    import pytensor.tensor as pt

    from pymc_dp.auto.bounds import clip_plan

    rng = np.random.default_rng(3)
    X, y = rng.uniform(-1, 1, (50, 2)), rng.integers(0, 2, 50)
    with pm.Model() as model:  # X a numpy constant: no name to declare bounds by
        b = pm.Normal("b", 0, 3, shape=2)
        pm.Bernoulli("y", logit_p=pt.dot(X, b), observed=y)
    ip, q0 = model.initial_point(), np.zeros(2)
    _, off = clip_plan(model, model.value_vars, ip, {"y": (0, 1)}, q0)
    assert set(off.values()) == {"DP histogram (derive_clips=False)"}
    _, on = clip_plan(model, model.value_vars, ip, {"y": (0, 1)}, q0, derive_clips=True)
    text = on["warm-start gradient clip"]
    assert "1 unnamed array(s) of one row per record (float64, 2-d)" in text
    assert "wrap it in pm.Data('name', ...)" in text
    for internal in ("Matrix(", "Vector(", "TensorType", "declare their bounds"):
        assert internal not in text, internal


def test_indexing_by_data_is_named_in_the_users_terms():
    import pytensor.tensor as pt

    from pymc_dp.auto.intervals import IntervalUnsupported, interval_eval

    z, g = pt.dvector("z"), pt.lvector("g")
    with pytest.raises(IntervalUnsupported) as err:
        interval_eval(
            [z[g]],
            {z: (np.zeros(3), np.ones(3)), g: (np.zeros(2, int), np.full(2, 2))},
        )
    assert "indexing by a data array (e.g. a group index, z[g])" in str(err.value)
    assert "AdvancedSubtensor" not in str(err.value)
