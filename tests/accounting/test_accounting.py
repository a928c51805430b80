"""Tests for pymc_dp.accounting (pure numpy/scipy privacy accounting)."""

from __future__ import annotations

import ast
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, special
from scipy.stats import norm

import pymc_dp.accounting as acc
from pymc_dp.accounting import (
    ApproxDPEvent,
    GaussianEvent,
    PrivacyLedger,
    analytic_gaussian_sigma,
    calibrate_noise_multiplier,
    compose_approx_dp,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu_for_epsilon,
    rdp_epsilon,
    zcdp_epsilon,
)

GOLDEN_MU = 1.059375  # 1000 x [1 release at z = 50 + 11 releases at z = 80]
GOLDEN_DELTA = 1e-5


def golden_ledger() -> PrivacyLedger:
    return PrivacyLedger([GaussianEvent(50.0, 1000), GaussianEvent(80.0, 11 * 1000)])


# --------------------------------------------------------------------------------------
# Package hygiene
# --------------------------------------------------------------------------------------


#: The only pymc_dp module the accounting may import: the shared argument checks (pure).
_ALLOWED_PYMC_DP = {"pymc_dp._validation"}


def _imported_modules(path: pathlib.Path, package: str) -> list[str]:
    """Absolute names of the modules a file imports (relative imports resolved)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                out.append(".".join(base + ([node.module] if node.module else [])))
            else:
                out.append(node.module or "")
    return out


def test_never_imports_pymc_or_pytensor():
    root = pathlib.Path(acc.__file__).parent
    for path in root.glob("*.py"):
        for name in _imported_modules(path, "pymc_dp.accounting"):
            top = name.split(".")[0]
            assert top not in {"pymc", "pytensor"}, (path.name, name)
            if top == "pymc_dp":
                assert name.startswith("pymc_dp.accounting") or name in _ALLOWED_PYMC_DP, (
                    path.name,
                    name,
                )
    # ... and the checks it shares with the steps import nothing of PyMC nor of pymc_dp.
    shared = root.parent / "_validation.py"
    for name in _imported_modules(shared, "pymc_dp"):
        assert name.split(".")[0] not in {"pymc", "pytensor", "pymc_dp"}, name


def _accounting_imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(accounting modules imported at module level, ... inside a function or class).

    Modules by file stem; an import of the package itself (``import pymc_dp.accounting``,
    ``from pymc_dp.accounting import compose_epsilon``) is an import of ``__init__``.
    """
    stems = {p.stem for p in path.parent.glob("*.py")}
    package = "pymc_dp.accounting"

    def resolve(dotted: str) -> str | None:
        """The accounting module an absolute dotted name lies in (None: outside)."""
        if dotted == package:
            return "__init__"
        if not dotted.startswith(package + "."):
            return None
        first = dotted[len(package) + 1 :].split(".")[0]
        return first if first in stems else "__init__"

    def named(node: ast.AST) -> set[str | None]:
        if isinstance(node, ast.Import):
            return {resolve(a.name) for a in node.names}
        if not isinstance(node, ast.ImportFrom):
            return set()
        if node.level > 1:
            return set()  # above the package: pymc_dp._validation and the like
        base = package if node.level == 1 else node.module or ""
        if node.level == 1 and node.module:
            return {resolve(f"{package}.{node.module}")}
        if base == package:  # ``from . import x`` / ``from pymc_dp.accounting import x``
            return {resolve(f"{package}.{a.name}") for a in node.names}
        return {resolve(base)}

    top: set[str | None] = set()
    nested: set[str | None] = set()
    tree = ast.parse(path.read_text())
    module_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        (top if id(node) in module_level else nested).update(named(node))
    return top - {None}, nested - {None}  # type: ignore[return-value]


def _import_circle(graph: dict[str, set[str]]) -> tuple[str, ...] | None:
    """A cycle of ``graph`` (module -> the modules it imports) as a path, or None."""
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        if name in path:
            return (*path[path.index(name) :], name)
        if name in done:
            return None
        for dep in sorted(graph.get(name, ())):
            found = visit(dep, (*path, name))
            if found:
                return found
        done.add(name)
        return None

    for name in sorted(graph):
        found = visit(name, ())
        if found:
            return found
    return None


def test_accounting_imports_form_no_circle():
    """Events are data, the calibrator knows no accountant, only the registry knows them all.

    Every import between accounting modules is at module level (none hidden in a function,
    the old way around a circle), and the graph of those imports has no cycle.
    """
    root = pathlib.Path(acc.__file__).parent
    graph = {}
    for path in root.glob("*.py"):
        top, nested = _accounting_imports(path)
        assert not nested, f"{path.name} imports {sorted(nested)} inside a function"
        graph[path.stem] = top
    assert {"events", "calibration", "registry", "__init__"} <= set(graph)
    assert not graph["events"], graph["events"]
    assert not graph["calibration"], graph["calibration"]
    assert all("registry" not in deps for name, deps in graph.items() if name != "__init__")

    circle = _import_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or ())


def test_the_circle_check_sees_every_form_of_import(tmp_path):
    """The parser behind the no-circle test reads every import that could close a circle."""
    for stem in ("events", "ledger", "gaussian", "registry", "subsampled", "barker"):
        (tmp_path / f"{stem}.py").write_text("")
    src = (
        "from __future__ import annotations\n"
        "import math\n"
        "from .._validation import check_delta\n"
        "from .events import GaussianEvent\n"
        "import pymc_dp.accounting.ledger\n"
        "from pymc_dp.accounting import gaussian\n"
        "def f():\n"
        "    from .registry import compose_epsilon\n"
        "    from . import subsampled\n"
        "    from pymc_dp.accounting.barker import dp_barker_epsilon\n"
        "class C:\n"
        "    from pymc_dp.accounting import compose_epsilon\n"
    )
    path = tmp_path / "m.py"
    path.write_text(src)
    top, nested = _accounting_imports(path)
    assert top == {"events", "ledger", "gaussian"}
    assert nested == {"registry", "subsampled", "barker", "__init__"}
    # ... and the cycle search finds the old circle, and none in a tree.
    old = {
        "registry": {"ledger", "subsampled", "barker", "events"},
        "ledger": {"gaussian", "events"},
        "gaussian": {"calibration", "events"},
        "calibration": {"registry"},
        "events": {"subsampled"},
        "subsampled": {"calibration", "events"},
    }
    circle = _import_circle(old)
    assert circle is not None and circle[0] == circle[-1]
    assert all(b in old[a] for a, b in zip(circle, circle[1:], strict=False))
    old["calibration"] = set()
    assert _import_circle(old) == ("events", "subsampled", "events")
    old["events"] = set()
    assert _import_circle(old) is None


def test_all_exports():
    for name in acc.__all__:
        assert hasattr(acc, name)


# --------------------------------------------------------------------------------------
# Golden values (shared/notes/pitfalls.md, "Composition of Gaussian mechanisms")
# --------------------------------------------------------------------------------------


def test_golden_mu_and_epsilon():
    ledger = golden_ledger()
    assert ledger.mu == pytest.approx(GOLDEN_MU, rel=1e-12)
    assert abs(ledger.epsilon(GOLDEN_DELTA) - 6.8027) < 1e-4
    assert abs(gaussian_epsilon(GOLDEN_MU, GOLDEN_DELTA) - 6.8027) < 1e-4
    assert ledger.delta(ledger.epsilon(GOLDEN_DELTA)) == pytest.approx(GOLDEN_DELTA, rel=1e-9)


def test_golden_zcdp_and_rdp_conversions():
    """Which conversions the notes' "zCDP 8.04" and "RDP 7.32" are.

    With rho = mu (a Gaussian with sensitivity D and std s is D^2/(2 s^2)-zCDP, Bun &
    Steinke 2016, Prop. 1.6, and D^2/(2 s^2) is exactly mu):

    * 8.04 is the classical zCDP conversion rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke
      Prop. 1.3) = 8.0441. Minimising the classical RDP conversion alpha mu +
      ln(1/delta)/(alpha - 1) over continuous alpha gives the same number.
    * 7.32 is the improved conversion of Canonne-Kamath-Steinke 2020 (Prop. 12 / Cor. 13) =
      Balle et al. 2020 (Thm 21), as used by dp_accounting's RdpAccountant: 7.3225.
      For the Gaussian (RDP exactly alpha mu) the CKS zCDP conversion gives the same
      7.3225, so `zcdp_epsilon` defaults to it and the notes' 8.04 needs
      `conversion="classical"`.
    """
    assert zcdp_epsilon(GOLDEN_MU, GOLDEN_DELTA, conversion="classical") == pytest.approx(
        GOLDEN_MU + 2 * math.sqrt(GOLDEN_MU * math.log(1 / GOLDEN_DELTA)), rel=1e-12
    )
    assert round(zcdp_epsilon(GOLDEN_MU, GOLDEN_DELTA, conversion="classical"), 2) == 8.04
    assert round(rdp_epsilon(GOLDEN_MU, GOLDEN_DELTA, conversion="classical"), 2) == 8.04
    rdp = rdp_epsilon(GOLDEN_MU, GOLDEN_DELTA)
    zcdp = zcdp_epsilon(GOLDEN_MU, GOLDEN_DELTA)
    assert round(rdp, 2) == 7.32
    assert abs(zcdp - 7.3225) < 1e-4
    assert zcdp <= rdp <= zcdp * (1 + 1e-5)  # grid of orders vs continuous optimum
    # the tight accountant beats both
    assert gaussian_epsilon(GOLDEN_MU, GOLDEN_DELTA) < zcdp


def test_golden_rdp_matches_dp_accounting():
    dpa = pytest.importorskip("dp_accounting")
    rdp_acc = dpa.rdp.RdpAccountant()
    rdp_acc.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(50.0), 1000))
    rdp_acc.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(80.0), 11000))
    ref = rdp_acc.get_epsilon(GOLDEN_DELTA)
    orders = list(rdp_acc._orders)  # same orders -> same number
    assert rdp_epsilon(GOLDEN_MU, GOLDEN_DELTA, orders) == pytest.approx(ref, rel=1e-9)
    assert rdp_epsilon(GOLDEN_MU, GOLDEN_DELTA) <= ref + 1e-9


# --------------------------------------------------------------------------------------
# Agreement with dp_accounting's PLD accountant
# --------------------------------------------------------------------------------------

PLD_GRID = [
    (0.8, 1, 1e-5),
    (1.0, 1, 1e-3),
    (2.0, 10, 1e-3),
    (5.0, 100, 1e-5),
    (20.0, 1000, 1e-6),
    (50.0, 1000, 1e-5),
    (80.0, 11000, 1e-5),
    (0.5, 3, 1e-2),
]


@pytest.mark.parametrize(("z", "count", "delta"), PLD_GRID)
def test_agrees_with_pld_accountant(z, count, delta):
    dpa = pytest.importorskip("dp_accounting")
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), count))
    ours = gaussian_epsilon(GaussianEvent(z, count).mu, delta)
    assert ours == pytest.approx(pld.get_epsilon(delta), abs=1e-3)
    ledger = PrivacyLedger([GaussianEvent(z, count)])
    assert ledger.epsilon(delta) == ours


def test_golden_agrees_with_pld_accountant():
    dpa = pytest.importorskip("dp_accounting")
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(50.0), 1000))
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(80.0), 11000))
    assert golden_ledger().epsilon(GOLDEN_DELTA) == pytest.approx(
        pld.get_epsilon(GOLDEN_DELTA), abs=1e-3
    )


# --------------------------------------------------------------------------------------
# gaussian_delta / gaussian_epsilon / gaussian_mu_for_epsilon
# --------------------------------------------------------------------------------------


def naive_delta(mu, eps):
    s = 2 * math.sqrt(mu)
    return 0.5 * (math.erfc((eps - mu) / s) - math.exp(eps) * math.erfc((eps + mu) / s))


@pytest.mark.parametrize("mu", [1e-4, 0.01, 0.5, 1.0, 3.0, 20.0])
def test_gaussian_delta_matches_naive_formula(mu):
    for eps in [0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0]:
        ref = naive_delta(mu, eps)
        assert gaussian_delta(mu, eps) == pytest.approx(ref, rel=1e-9, abs=1e-15)


def test_gaussian_delta_large_eps_stable():
    eps = np.linspace(50.0, 2000.0, 400)
    with np.errstate(all="raise"):
        d = gaussian_delta(1e3, eps)
    assert d.shape == eps.shape
    assert np.all(np.isfinite(d))
    assert np.all((d >= 0.0) & (d <= 1.0))
    assert np.all(np.diff(d) <= 0.0)
    assert d[-1] > 0.0  # ~1e-111, not flushed to zero
    # independent log-space reference: delta = Phi(-A) - e^eps Phi(-B) via norm.logsf
    for mu, eps in [(1e3, 1500.0), (1e3, 2000.0), (10.0, 200.0)]:
        big_a = (eps - mu) / math.sqrt(2 * mu)
        big_b = (eps + mu) / math.sqrt(2 * mu)
        l1, l2 = norm.logsf(big_a), eps + norm.logsf(big_b)
        ref = math.exp(l1) * -math.expm1(l2 - l1)
        assert gaussian_delta(mu, eps) == pytest.approx(ref, rel=1e-8)


def test_gaussian_delta_edge_cases():
    assert gaussian_delta(0.0, 1.0) == 0.0
    assert np.all(gaussian_delta(0.0, np.array([0.0, 1.0, 5.0])) == 0.0)
    assert isinstance(gaussian_delta(1.0, 1.0), float)
    out = gaussian_delta(1.0, np.array([[0.0, 1.0], [2.0, 3.0]]))
    assert out.shape == (2, 2)
    # delta(0) is the total variation distance 2 Phi(sqrt(mu/2)) - 1
    assert gaussian_delta(0.3, 0.0) == pytest.approx(2 * norm.cdf(math.sqrt(0.15)) - 1)
    assert gaussian_delta(1e-12, 1e3) == 0.0


@pytest.mark.parametrize("mu", np.logspace(-8, 4, 13))
@pytest.mark.parametrize("delta", [1e-12, 1e-5, 0.1, 0.6])
def test_gaussian_epsilon_is_tight_and_safe(mu, delta):
    eps = gaussian_epsilon(mu, delta)
    assert math.isfinite(eps) and eps >= 0.0
    assert gaussian_delta(mu, eps) <= delta
    if eps > 0.0:
        assert gaussian_delta(mu, eps * (1 - 1e-9)) > delta
        mu_back = gaussian_mu_for_epsilon(eps, delta)
        assert mu_back == pytest.approx(mu, rel=1e-8)
        assert gaussian_epsilon(mu_back, delta) <= eps
    else:
        assert gaussian_delta(mu, 0.0) <= delta


def test_gaussian_epsilon_edge_cases():
    assert gaussian_epsilon(0.0, 1e-5) == 0.0
    assert gaussian_epsilon(1e-12, 0.5) == 0.0


@pytest.mark.parametrize("epsilon", [1e-3, 0.1, 1.0, 10.0, 100.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 0.2])
def test_mu_for_epsilon_never_overshoots(epsilon, delta):
    mu = gaussian_mu_for_epsilon(epsilon, delta)
    assert gaussian_delta(mu, epsilon) <= delta
    assert gaussian_epsilon(mu, delta) <= epsilon
    assert gaussian_delta(mu * (1 + 1e-9), epsilon) > delta


# --------------------------------------------------------------------------------------
# calibrate_noise_multiplier
# --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    epsilon=st.floats(min_value=0.01, max_value=50.0),
    log10_delta=st.floats(min_value=-12.0, max_value=-1.0),
    releases=st.integers(min_value=1, max_value=10**6),
)
def test_calibrate_noise_multiplier_property(epsilon, log10_delta, releases):
    delta = 10.0**log10_delta
    z = calibrate_noise_multiplier(epsilon, delta, releases)
    achieved = gaussian_epsilon(GaussianEvent(z, releases).mu, delta)
    assert achieved <= epsilon
    assert achieved >= epsilon * (1 - 1e-6)
    # smallest: a slightly smaller multiplier overshoots
    assert gaussian_epsilon(GaussianEvent(z * (1 - 1e-7), releases).mu, delta) > epsilon


def test_calibrate_golden():
    z = calibrate_noise_multiplier(6.8027, GOLDEN_DELTA, 12000)
    assert gaussian_epsilon(GaussianEvent(z, 12000).mu, GOLDEN_DELTA) <= 6.8027
    assert GaussianEvent(z, 12000).mu == pytest.approx(GOLDEN_MU, rel=1e-4)


# --------------------------------------------------------------------------------------
# compose_approx_dp (Kairouz, Oh, Viswanath)
# --------------------------------------------------------------------------------------


def kov_delta_brute(eps, delta, k, eps_prime):
    """delta_total(eps') from the theorem's sum (O(k) per point, no log-space tricks)."""
    s = 0.0
    for m in range(k + 1):
        if (k - 2 * m) * eps > eps_prime:
            s += (
                math.comb(k, m)
                * (math.exp((k - m) * eps) - math.exp(eps_prime + m * eps))
                / (1 + math.exp(eps)) ** k
            )
    return 1 - (1 - delta) ** k * (1 - s)


def kov_grid_brute(eps, delta, k):
    """KOV Theorem 3.3 verbatim, O(k^2): [(eps_i, delta_total_i)] for i = 0..floor(k/2)."""
    out = []
    for i in range(k // 2 + 1):
        di = sum(
            math.comb(k, m)
            * (math.exp((k - m) * eps) - math.exp((k - 2 * i + m) * eps))
            / (1 + math.exp(eps)) ** k
            for m in range(i)
        )
        out.append(((k - 2 * i) * eps, 1 - (1 - delta) ** k * (1 - di)))
    return out


def kov_epsilon_brute(eps, delta, k, target):
    if target < 1 - (1 - delta) ** k - 1e-15:
        return math.inf
    if kov_delta_brute(eps, delta, k, 0.0) <= target:
        return 0.0
    lo, hi = 0.0, k * eps
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if kov_delta_brute(eps, delta, k, mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


@pytest.mark.parametrize("k", [1, 2, 3, 7, 10, 30])
@pytest.mark.parametrize(("eps", "delta"), [(0.1, 0.0), (0.5, 1e-7), (1.0, 1e-6)])
@pytest.mark.parametrize("target", [1e-5, 1e-3])
def test_kov_matches_brute_force(k, eps, delta, target):
    ours = compose_approx_dp(eps, delta, k, target)
    # Theorem 3.3 grid points: our curve passes through them exactly
    grid = kov_grid_brute(eps, delta, k)
    for e_i, d_i in grid:
        assert kov_delta_brute(eps, delta, k, e_i) == pytest.approx(d_i, rel=1e-9, abs=1e-15)
    feasible = [e_i for e_i, d_i in grid if d_i <= target]
    ref = kov_epsilon_brute(eps, delta, k, target)
    if not feasible:
        assert ours == math.inf
        return
    assert ours <= min(feasible) + 1e-12  # at least as good as the theorem's grid points
    assert ours == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert kov_delta_brute(eps, delta, k, ours) <= target * (1 + 1e-9)
    assert ours <= k * eps


def test_kov_special_cases():
    assert compose_approx_dp(0.7, 1e-6, 1, 1e-6) == 0.7
    assert compose_approx_dp(0.7, 1e-6, 1, 1e-4) < 0.7
    assert compose_approx_dp(0.7, 0.0, 0, 1e-6) == 0.0
    assert compose_approx_dp(0.0, 1e-6, 5, 1e-3) == 0.0
    # infeasible: 1 - (1 - delta)^k > target
    assert compose_approx_dp(0.1, 1e-6, 100, 1e-5) == math.inf
    # basic composition bound
    for k in [5, 50, 500]:
        assert compose_approx_dp(0.2, 1e-8, k, 1e-5) <= k * 0.2
    # much better than basic composition for many small-epsilon releases
    assert compose_approx_dp(0.01, 0.0, 10_000, 1e-5) < 0.2 * 10_000 * 0.01


def test_kov_large_count_is_fast_and_sane():
    eps = compose_approx_dp(0.01, 0.0, 200_000, 1e-6)
    # advanced composition (Dwork-Rothblum-Vadhan) is a valid, looser bound
    k = 200_000
    adv = 0.01 * math.sqrt(2 * k * math.log(1e6)) + k * 0.01 * math.expm1(0.01)
    assert 0 < eps < adv


# --------------------------------------------------------------------------------------
# analytic Gaussian mechanism
# --------------------------------------------------------------------------------------


def balle_wang_sigma(eps, delta, sens=1.0):
    """Balle & Wang (2018), Algorithm 1, implemented independently with brentq."""
    delta0 = norm.cdf(0.0) - math.exp(eps) * norm.cdf(-math.sqrt(2 * eps))
    if delta >= delta0:

        def b_plus(v):
            return (
                norm.cdf(math.sqrt(eps * v))
                - math.exp(eps) * norm.cdf(-math.sqrt(eps * (v + 2)))
                - delta
            )

        hi = 1.0
        while b_plus(hi) <= 0:
            hi *= 2
        v = optimize.brentq(b_plus, 0.0, hi, xtol=1e-14, rtol=1e-14)
        alpha = math.sqrt(1 + v / 2) - math.sqrt(v / 2)
    else:

        def b_minus(u):
            return (
                norm.cdf(-math.sqrt(eps * u))
                - math.exp(eps) * norm.cdf(-math.sqrt(eps * (u + 2)))
                - delta
            )

        hi = 1.0
        while b_minus(hi) > 0:
            hi *= 2
        u = optimize.brentq(b_minus, 0.0, hi, xtol=1e-14, rtol=1e-14)
        alpha = math.sqrt(1 + u / 2) + math.sqrt(u / 2)
    return alpha * sens / math.sqrt(2 * eps)


@pytest.mark.parametrize(
    ("eps", "delta"), [(0.1, 1e-5), (0.5, 1e-6), (1.0, 1e-5), (3.0, 1e-3), (8.0, 1e-8), (1.0, 0.3)]
)
def test_analytic_gaussian_matches_balle_wang(eps, delta):
    sigma = analytic_gaussian_sigma(eps, delta, sensitivity=2.0)
    assert sigma == pytest.approx(balle_wang_sigma(eps, delta, 2.0), rel=1e-6)
    mu = 2.0**2 / (2 * sigma**2)
    assert gaussian_delta(mu, eps) <= delta  # never below the threshold


@pytest.mark.parametrize("eps", [0.05, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("delta", [1e-8, 1e-5, 1e-3])
def test_analytic_gaussian_smaller_than_classical(eps, delta):
    classical = math.sqrt(2 * math.log(1.25 / delta)) / eps
    assert analytic_gaussian_sigma(eps, delta) < classical


# --------------------------------------------------------------------------------------
# Events and ledger
# --------------------------------------------------------------------------------------


def test_events():
    ev = GaussianEvent(2.0, 3)
    assert ev.mu == 3 / 8
    assert GaussianEvent(2.0).count == 1
    assert GaussianEvent(2.0, 0).mu == 0.0
    assert GaussianEvent(np.float64(2.0), np.int64(3)) == ev
    with pytest.raises(AttributeError):
        ev.count = 4  # type: ignore[misc]
    ap = ApproxDPEvent(0.5, 0.0, 4)
    assert (ap.epsilon, ap.delta, ap.count) == (0.5, 0.0, 4)
    assert hash(ap) == hash(ApproxDPEvent(0.5, 0.0, 4))


def test_ledger_basic():
    ledger = PrivacyLedger()
    assert ledger.mu == 0.0
    assert ledger.epsilon(1e-5) == 0.0
    assert ledger.delta(1.0) == 0.0
    ledger.add(GaussianEvent(50.0, 1000))
    ledger.add(GaussianEvent(80.0, 11000))
    assert len(ledger) == 2 and ledger.events[0] == GaussianEvent(50.0, 1000)
    assert ledger.epsilon(GOLDEN_DELTA) == gaussian_epsilon(GOLDEN_MU, GOLDEN_DELTA)
    assert ledger.delta(3.0) == gaussian_delta(ledger.mu, 3.0)
    with pytest.raises(TypeError, match="GaussianEvent"):
        ledger.add((1.0, 1e-5))  # type: ignore[arg-type]
    assert len(ledger) == 2
    with pytest.raises(TypeError):
        PrivacyLedger([GaussianEvent(1.0), "nope"])  # type: ignore[list-item]


def test_ledger_approx_only_matches_kov():
    ledger = PrivacyLedger([ApproxDPEvent(0.1, 1e-7, 60), ApproxDPEvent(0.1, 1e-7, 40)])
    assert ledger.epsilon(1e-4) == pytest.approx(compose_approx_dp(0.1, 1e-7, 100, 1e-4))
    assert PrivacyLedger([ApproxDPEvent(0.1, 1e-6, 100)]).epsilon(1e-5) == math.inf


def test_ledger_mixed_is_optimised_and_valid():
    gauss = GaussianEvent(5.0, 200)
    approx = ApproxDPEvent(0.05, 1e-8, 100)
    ledger = PrivacyLedger([gauss, approx])
    delta = 1e-5
    eps = ledger.epsilon(delta)
    floor = 1 - (1 - 1e-8) ** 100
    # any explicit split is a valid bound; the optimised one is at least as good
    for frac in [0.1, 0.5, 0.9]:
        slack = delta - floor
        split = gaussian_epsilon(gauss.mu, frac * slack) + compose_approx_dp(
            0.05, 1e-8, 100, floor + (1 - frac) * slack
        )
        assert eps <= split + 1e-9
    # worse than either part alone, better than the crude sum at delta/2 each
    assert eps > gaussian_epsilon(gauss.mu, delta)
    assert eps < gaussian_epsilon(gauss.mu, delta / 2) + 100 * 0.05
    # delta() is the (numerical) inverse
    assert ledger.delta(eps) == pytest.approx(delta, rel=1e-4)
    assert ledger.delta(eps * 1.01) < delta < ledger.delta(eps * 0.99)


def test_ledger_three_parts():
    ledger = PrivacyLedger(
        [GaussianEvent(10.0, 100), ApproxDPEvent(0.02, 1e-9, 50), ApproxDPEvent(0.5, 0.0, 2)]
    )
    eps = ledger.epsilon(1e-5)
    assert math.isfinite(eps)
    assert (
        eps
        <= gaussian_epsilon(ledger.mu, 1e-5 / 3)
        + compose_approx_dp(0.02, 1e-9, 50, 1e-5 / 3)
        + compose_approx_dp(0.5, 0.0, 2, 1e-5 / 3)
        + 1e-9
    )
    assert ledger.delta(eps) == pytest.approx(1e-5, rel=1e-3)


def test_ledger_ignores_zero_count_and_pure_zero_events():
    base = golden_ledger().epsilon(GOLDEN_DELTA)
    ledger = golden_ledger()
    ledger.add(GaussianEvent(1.0, 0))
    ledger.add(ApproxDPEvent(1.0, 1e-3, 0))
    ledger.add(ApproxDPEvent(0.0, 0.0, 10))
    assert ledger.epsilon(GOLDEN_DELTA) == base


# --------------------------------------------------------------------------------------
# zCDP / RDP
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mu", [1e-6, 1e-2, 1.0, 30.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-5])
def test_conversions_are_upper_bounds(mu, delta):
    tight = gaussian_epsilon(mu, delta)
    z = zcdp_epsilon(mu, delta)
    r = rdp_epsilon(mu, delta)
    assert tight <= z * (1 + 1e-12) + 1e-15
    assert z <= r * (1 + 1e-12) + 1e-15
    assert r <= z * (1 + 1e-4) + 1e-12
    assert z <= zcdp_epsilon(mu, delta, conversion="classical")
    assert r <= rdp_epsilon(mu, delta, conversion="classical")
    assert zcdp_epsilon(0.0, delta) == rdp_epsilon(0.0, delta) == 0.0


def test_rdp_custom_orders():
    val = rdp_epsilon(1.0, 1e-5, orders=[2.0, 4.0, 8.0])
    ref = min(
        a * 1.0 + math.log1p(-1 / a) - (math.log(1e-5) + math.log(a)) / (a - 1)
        for a in [2.0, 4.0, 8.0]
    )
    assert val == pytest.approx(ref)


# --------------------------------------------------------------------------------------
# Input validation: ValueError naming the parameter
# --------------------------------------------------------------------------------------

BAD_INPUTS = [
    (lambda: gaussian_delta(-1.0, 1.0), "mu"),
    (lambda: gaussian_delta(math.inf, 1.0), "mu"),
    (lambda: gaussian_delta(1.0, -0.5), "epsilon"),
    (lambda: gaussian_delta(1.0, np.array([1.0, np.nan])), "epsilon"),
    (lambda: gaussian_epsilon(-1.0, 1e-5), "mu"),
    (lambda: gaussian_epsilon(1.0, 0.0), "delta"),
    (lambda: gaussian_epsilon(1.0, 1.5), "delta"),
    (lambda: gaussian_epsilon(1.0, math.nan), "delta"),
    (lambda: gaussian_mu_for_epsilon(0.0, 1e-5), "epsilon"),
    (lambda: gaussian_mu_for_epsilon(-1.0, 1e-5), "epsilon"),
    (lambda: gaussian_mu_for_epsilon(math.inf, 1e-5), "epsilon"),
    (lambda: gaussian_mu_for_epsilon(1.0, 1.0), "delta"),
    (lambda: calibrate_noise_multiplier(0.0, 1e-5, 10), "epsilon"),
    (lambda: calibrate_noise_multiplier(1.0, -1e-5, 10), "delta"),
    (lambda: calibrate_noise_multiplier(1.0, 1e-5, 0), "releases"),
    (lambda: calibrate_noise_multiplier(1.0, 1e-5, 2.5), "releases"),
    (lambda: compose_approx_dp(-0.1, 1e-6, 10, 1e-5), "epsilon"),
    (lambda: compose_approx_dp(0.1, 1.0, 10, 1e-5), "delta"),
    (lambda: compose_approx_dp(0.1, 1e-6, -1, 1e-5), "count"),
    (lambda: compose_approx_dp(0.1, 1e-6, 10, 0.0), "target_delta"),
    (lambda: compose_approx_dp(0.1, 1e-6, 10, 2.0), "target_delta"),
    (lambda: GaussianEvent(0.0), "noise_multiplier"),
    (lambda: GaussianEvent(-1.0), "noise_multiplier"),
    (lambda: GaussianEvent(math.inf), "noise_multiplier"),
    (lambda: GaussianEvent(math.nan), "noise_multiplier"),
    (lambda: GaussianEvent(1.0, -1), "count"),
    (lambda: GaussianEvent(1.0, 1.5), "count"),  # type: ignore[arg-type]
    (lambda: ApproxDPEvent(-1.0, 1e-5), "epsilon"),
    (lambda: ApproxDPEvent(1.0, 1.0), "delta"),
    (lambda: ApproxDPEvent(1.0, 1e-5, -2), "count"),
    (lambda: PrivacyLedger().epsilon(0.0), "delta"),
    (lambda: PrivacyLedger().delta(-1.0), "epsilon"),
    (lambda: zcdp_epsilon(-1.0, 1e-5), "rho"),
    (lambda: zcdp_epsilon(1.0, 1.0), "delta"),
    (lambda: zcdp_epsilon(1.0, 1e-5, conversion="bogus"), "conversion"),  # type: ignore[arg-type]
    (lambda: rdp_epsilon(-1.0, 1e-5), "mu"),
    (lambda: rdp_epsilon(1.0, 0.0), "delta"),
    (lambda: rdp_epsilon(1.0, 1e-5, orders=[0.5, 2.0]), "orders"),
    (lambda: rdp_epsilon(1.0, 1e-5, orders=[]), "orders"),
    (lambda: analytic_gaussian_sigma(0.0, 1e-5), "epsilon"),
    (lambda: analytic_gaussian_sigma(1.0, 1.0), "delta"),
    (lambda: analytic_gaussian_sigma(1.0, 1e-5, sensitivity=0.0), "sensitivity"),
    (lambda: gaussian_epsilon("1", 1e-5), "mu"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("call", "name"), BAD_INPUTS)
def test_bad_inputs_raise_value_error(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        call()


def test_error_message_format():
    with pytest.raises(ValueError, match=r"^delta must be in \(0, 1\); got 1\.5$"):
        gaussian_epsilon(1.0, 1.5)


def test_special_functions_sanity():
    # the identity the stable formula relies on: e^eps erfc(b) = e^{-a^2} erfcx(b)
    mu, eps = 2.0, 3.0
    a, b = (eps - mu) / (2 * math.sqrt(mu)), (eps + mu) / (2 * math.sqrt(mu))
    assert math.exp(eps) * math.erfc(b) == pytest.approx(math.exp(-a * a) * special.erfcx(b))
