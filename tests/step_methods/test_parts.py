"""Steps built from parts (issue 30): the same step as with the older keywords, draw for draw.

``dev/step_draws.py`` compares every public step's seeded draws with those recorded before
the constructors were reshaped; here each step built from parts is compared with the same
step built from the deprecated keywords, and the parts' refusals are checked.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.step_methods.parts import accepted_keywords, from_keywords

N = 30
PLAN = {"draws": 12, "tune": 6, "chains": 1}


def _model():
    y = np.random.default_rng(0).normal(0.5, 1.0, size=N)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 2.0)
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", mu, s, observed=y)
    return m


def _one_param_model():
    y = np.random.default_rng(1).normal(0.3, 1.0, size=N)
    with pm.Model() as m:
        pm.Normal("y", pm.Normal("mu", 0.0, 2.0), 1.0, observed=y)
    return m


COV = np.array([[0.05, 0.01], [0.01, 0.04]])
CASES = {
    "penalty_independent": (
        _model,
        pymc_dp.DPPenaltyMetropolis,
        {
            "clip_bound": 0.5,
            "noise_multiplier": 1.0,
            "proposal": "independent",
            "proposal_cov": COV,
            "proposal_mean": np.array([0.5, 0.0]),
            "local_moves": 0.3,
            "control_variate": (np.array([0.5, 0.0]), np.array([1.0, -2.0]), 3.0),
            "control_variate_basis": np.array([[1.0, 0.0], [0.2, 1.0]]),
        },
    ),
    "penalty_guided": (
        _model,
        pymc_dp.DPPenaltyMetropolis,
        {"clip_bound": 1.0, "epsilon": 5.0, "delta": 1e-3, **PLAN, "proposal": "guided"},
    ),
    "fastmh": (
        _model,
        pymc_dp.DPFastMH,
        {
            "clip_bound": 3.0,
            "max_step": 0.2,
            "lam": 20.0,
            "iter_epsilon": 1.0,
            "iter_delta": 1e-5,
            "proposal_scale": 0.1,
            **PLAN,
        },
    ),
    "hmc": (
        _model,
        pymc_dp.DPHMC,
        {
            "llr_clip_bound": 1.0,
            "grad_clip_bound": 2.0,
            "epsilon": 5.0,
            "delta": 1e-3,
            **PLAN,
            "grad_budget_fraction": 0.3,
            "n_leapfrog": 2,
        },
    ),
    "barker": (
        _model,
        pymc_dp.DPBarker,
        {"epsilon": 40.0, "delta": 1e-3, **PLAN, "proposal_scale": 0.1, "tempering": 2.0},
    ),
    "subsampled": (
        _model,
        pymc_dp.DPSubsampledPenalty,
        {"batch_size": 10, "clip_bound": 1.0, "noise_multiplier": 1.0, "scaling": 0.5},
    ),
    "sgnht": (
        _model,
        pymc_dp.DPSGNHT,
        {"clip_bound": 2.0, "step_size": 1e-3, "sampling_rate": 0.3, "noise_multiplier": 2.0},
    ),
    "expfam": (
        _one_param_model,
        pymc_dp.DPExpFamilyPenalty,
        {"stat_clip_bound": 5.0, "epsilon": 5.0, "delta": 1e-3, **PLAN, "proposal": "coordinate"},
    ),
}


def _draws(build, cls, kwargs) -> dict[str, np.ndarray]:
    with build(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = cls(rng=np.random.default_rng(7), **kwargs)
        idata = pm.sample(
            draws=PLAN["draws"], tune=PLAN["tune"], chains=1, cores=1, step=step,
            random_seed=3, progressbar=False, compute_convergence_checks=False,
            discard_tuned_samples=False,
        )  # fmt: skip
    post = idata["posterior"]
    out = {k: np.asarray(post[k].values) for k in post.data_vars}
    out["accepted"] = np.asarray(idata["sample_stats"]["accepted"].values)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_step_from_parts_draws_what_the_deprecated_keywords_draw(case):
    build, cls, old = CASES[case]
    parts = from_keywords(cls, old)
    assert "privacy" in parts and not set(parts) & {"epsilon", "clip_bound", "tempering"}
    a, b = _draws(build, cls, old), _draws(build, cls, parts)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    # the draws move (a step that never moves would pass the comparison trivially)
    assert np.unique(a["mu"]).size > 1


PUBLIC_STEPS = [
    pymc_dp.DPPenaltyMetropolis,
    pymc_dp.DPFastMH,
    pymc_dp.DPHMC,
    pymc_dp.DPBarker,
    pymc_dp.DPSubsampledPenalty,
    pymc_dp.DPSGLD,
    pymc_dp.DPSGNHT,
    pymc_dp.DPExpFamilyPenalty,
]


@pytest.mark.parametrize("cls", PUBLIC_STEPS, ids=lambda c: c.__name__)
def test_every_step_takes_the_shared_settings(cls):
    params = inspect.signature(cls.__init__).parameters
    assert {"privacy", "likelihood"} <= set(params)
    # the deprecated keywords are still accepted (checked before a step is built)
    assert {"epsilon", "delta", "draws", "tune", "chains", "records"} <= accepted_keywords(cls)


def test_a_setting_given_twice_or_unknown_is_refused_before_the_data_is_read():
    with _model():
        privacy = pymc_dp.PrivacySettings(clip_bound=1.0, noise_multiplier=1.0)
        with pytest.raises(ValueError, match="clip_bound given twice"):
            pymc_dp.DPPenaltyMetropolis(privacy=privacy, clip_bound=2.0)
        with pytest.raises(TypeError, match=r"unexpected keyword arguments \['clip_bond'\]"):
            pymc_dp.DPPenaltyMetropolis(privacy=privacy, clip_bond=2.0)
        with pytest.raises(TypeError, match="give them in the proposal object"):
            pymc_dp.DPPenaltyMetropolis(
                privacy=privacy, proposal=pymc_dp.RandomWalk(), proposal_scale=0.5
            )
        with pytest.raises(TypeError, match="privacy must be a pymc_dp.PrivacySettings"):
            pymc_dp.DPPenaltyMetropolis(privacy={"clip_bound": 1.0})
        with pytest.raises(ValueError, match="llr_clip_bound given twice"):
            pymc_dp.DPHMC(privacy=pymc_dp.PrivacySettings(clip_bound=1.0), llr_clip_bound=2.0)
        with pytest.raises(ValueError, match=r"unknown release kinds \['ratio'\]"):
            pymc_dp.DPHMC(
                privacy=pymc_dp.PrivacySettings(
                    clip_bound={"ratio": 1.0, "grad": 1.0}, noise_multiplier=1.0
                )
            )
        with pytest.raises(ValueError, match="does not temper"):
            pymc_dp.DPExpFamilyPenalty(
                privacy=pymc_dp.PrivacySettings(clip_bound=1.0, noise_multiplier=1.0),
                likelihood=pymc_dp.LikelihoodSettings(tempering=2.0),
            )


@pytest.mark.parametrize("cls", PUBLIC_STEPS, ids=lambda c: c.__name__)
def test_no_public_step_constructor_has_more_than_15_parameters(cls):
    """Issue 30's bound: a constructor a reader can hold in mind (the deprecated keywords
    live in the parts and in one ``**deprecated``, counted here as one parameter)."""
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert len(params) <= 15, params


def test_settings_spelled_as_keywords_for_pymc_dp_sample_step_classes():
    from pymc_dp.auto.steps import wants_configuration
    from pymc_dp.step_methods.parts import to_keywords

    privacy = pymc_dp.PrivacySettings(clip_bound={"llr": 1.0, "grad": 2.0})
    kw = to_keywords(pymc_dp.DPHMC, {"privacy": privacy, "n_leapfrog": 3})
    assert kw == {"llr_clip_bound": 1.0, "grad_clip_bound": 2.0, "n_leapfrog": 3}
    # both bounds given: DPHMC is configured by hand, not by the private phases
    assert not wants_configuration(pymc_dp.DPHMC, kw)
    one = to_keywords(pymc_dp.DPHMC, {"privacy": pymc_dp.PrivacySettings(clip_bound=1.5)})
    assert one == {"llr_clip_bound": 1.5, "grad_clip_bound": 1.5}
    half = to_keywords(pymc_dp.DPHMC, {"privacy": pymc_dp.PrivacySettings(clip_bound={"llr": 1})})
    assert wants_configuration(pymc_dp.DPHMC, half)
    lik = pymc_dp.LikelihoodSettings(chunk_size=50)
    assert to_keywords(pymc_dp.DPSGLD, {"likelihood": lik}) == {"chunk_size": 50}


def test_a_setting_the_step_does_not_read_is_refused():
    with _model():
        with pytest.raises(ValueError, match=r"does not read PrivacySettings \['clip_bound'\]"):
            pymc_dp.DPBarker(privacy=pymc_dp.PrivacySettings(clip_bound=1.0, epsilon=1.0))
        with pytest.raises(ValueError, match=r"does not read PrivacySettings \['data_bounds'\]"):
            pymc_dp.DPPenaltyMetropolis(
                privacy=pymc_dp.PrivacySettings(
                    clip_bound=1.0, noise_multiplier=1.0, data_bounds={"y": (0, 1)}
                )
            )


def _centred_model():
    rng = np.random.default_rng(6)
    g = np.arange(N) % 2
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        a = pm.Normal("a", mu, tau, shape=2)
        pm.Normal("y", a[g], 3.0, observed=rng.normal(size=N))
    return m


def test_coordinates_are_the_identity_by_default_and_a_transform_is_checked():
    ident = pymc_dp.Coordinates()
    q = np.array([0.5, -1.0])
    y, log_det = ident.forward_with_log_det(q)
    assert ident.identity and y is q and log_det == 0.0
    assert ident.inverse(q) is q and ident.log_det_jacobian(q) == 0.0
    assert ident.gradient_map(q) is None and ident.likelihood_free is None
    # a Coordinates of a Coordinates is the same coordinates
    assert pymc_dp.Coordinates(ident).identity
    with pytest.raises(TypeError, match=r"coordinates: the transform needs the methods"):
        pymc_dp.Coordinates(object())
    # the step wraps a bare transform, and refuses one that is not, before reading data
    with _model(), pytest.raises(TypeError, match="lacks"):
        pymc_dp.DPPenaltyMetropolis(clip_bound=1.0, noise_multiplier=1.0, coordinates=[1.0])


def test_a_recentring_as_coordinates_draws_what_the_reparametrization_keyword_draws():
    from pymc_dp.auto.recentre import Recentring, find_recentring

    model = _centred_model()
    rp = Recentring(model, find_recentring(model), model.value_vars, model.initial_point())
    assert not pymc_dp.Coordinates(rp).identity
    np.testing.assert_array_equal(pymc_dp.Coordinates(rp).likelihood_free, rp.likelihood_free)
    common = {
        "clip_bound": 0.5,
        "noise_multiplier": 1.0,
        "proposal": "independent",
        "proposal_cov": np.diag([0.3, 0.2, 0.2, 0.2]),
        "proposal_mean": np.zeros(4),
        "clip_metric": np.array([[0, 0, 1.0, 0], [0, 0, 0, 1.0]]),
        "free_moves": 2,
    }
    runs = [
        _draws(lambda: model, pymc_dp.DPPenaltyMetropolis, {**common, **extra})
        for extra in (
            {"reparametrization": rp},
            {"coordinates": rp},
            {"coordinates": pymc_dp.Coordinates(rp)},
        )
    ]
    for other in runs[1:]:
        assert sorted(other) == sorted(runs[0])
        for k in runs[0]:
            np.testing.assert_array_equal(other[k], runs[0][k])
    # the chain moves (mu and tau by the free moves, through the recentring's inverse)
    assert np.unique(runs[0]["mu"]).size > 1 and np.unique(runs[0]["tau"]).size > 1
    # the identity given explicitly is the default
    plain = {"clip_bound": 1.0, "noise_multiplier": 1.0}
    a = _draws(_model, pymc_dp.DPPenaltyMetropolis, plain)
    b = _draws(_model, pymc_dp.DPPenaltyMetropolis, {**plain, "coordinates": pymc_dp.Coordinates()})
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    # from_keywords writes the deprecated keyword as the part
    parts = from_keywords(pymc_dp.DPPenaltyMetropolis, {**common, "reparametrization": rp})
    assert isinstance(parts["coordinates"], pymc_dp.Coordinates)
    assert parts["coordinates"].transform is rp


def test_the_proposals_draw_their_documented_move_with_the_documented_rng_calls():
    """The steps' seeded draws stay bit-identical only if ``propose`` makes the same
    generator calls, in the same order, as the code it replaced: each draw is checked
    against its formula on a twin generator, which must end in the same state."""
    q = np.array([0.3, -1.2, 2.0])
    cov = np.array([[0.5, 0.1, 0.0], [0.1, 0.4, 0.05], [0.0, 0.05, 0.3]])
    chol = np.linalg.cholesky(cov)
    scale = np.array([0.1, 0.2, 0.3])

    def twins():
        return np.random.default_rng(11), np.random.default_rng(11)

    a, b = twins()
    np.testing.assert_array_equal(
        pymc_dp.RandomWalk(scale=scale, scaling=0.7).propose(a, q),
        q + 0.7 * scale * b.normal(size=3),
    )
    np.testing.assert_array_equal(
        pymc_dp.RandomWalk(cov=cov).propose(a, q, scaling=0.4), q + 0.4 * (chol @ b.normal(size=3))
    )
    mean = np.array([1.0, 0.0, -1.0])
    np.testing.assert_array_equal(
        pymc_dp.Independent(mean, cov, 1.2).propose(a, q), mean + 1.2 * (chol @ b.normal(size=3))
    )
    q1, j = pymc_dp.CoordinateWalk(scale=scale).propose(a, q, scaling=2.0)
    k = int(b.integers(3))
    expected = q.copy()
    expected[k] += 2.0 * scale[k] * b.normal()
    assert j == k
    np.testing.assert_array_equal(q1, expected)
    direction = np.array([-1.0, -1.0, -1.0])
    q1, j = pymc_dp.GuidedWalk(scale=scale).propose(a, q, direction=direction)
    k = int(b.integers(3))
    step = abs(scale[k] * b.normal())
    assert j == k and q1[j] == q[j] - step and np.array_equal(np.delete(q1, j), np.delete(q, j))
    # DPFastMH's increment, truncated by the step before it is added
    np.testing.assert_array_equal(
        pymc_dp.RandomWalk(scale=scale, scaling=0.7).move(a, 3), 0.7 * scale * b.normal(size=3)
    )
    # the twins consumed the same draws
    assert a.random() == b.random()


def test_a_random_walk_proposal_has_the_documented_covariance():
    """``theta' - theta ~ N(0, s^2 L L^T)``: the sample covariance of 20000 moves within 5
    standard errors of each entry (the entries' sd ``sqrt((S_ij^2 + S_ii S_jj) / n)``)."""
    cov = np.array([[0.5, 0.1], [0.1, 0.4]])
    s, n = 0.8, 20_000
    walk = pymc_dp.RandomWalk(cov=cov, scaling=s)
    rng = np.random.default_rng(4)
    q = np.array([1.0, -1.0])
    moves = np.array([walk.propose(rng, q) - q for _ in range(n)])
    target = s**2 * cov
    se = np.sqrt((target**2 + np.outer(np.diag(target), np.diag(target))) / n)
    assert np.all(np.abs(np.cov(moves.T) - target) < 5 * se)
    assert np.all(np.abs(moves.mean(axis=0)) < 5 * np.sqrt(np.diag(target) / n))


@pytest.mark.parametrize(
    "cls, extra",
    [
        (pymc_dp.DPHMC, {}),
        (pymc_dp.DPPenaltyMetropolis, {}),
        (pymc_dp.DPFastMH, {}),
        (pymc_dp.DPSubsampledPenalty, {"batch_size": 10}),
        (pymc_dp.DPSGLD, {"step_size": 1e-3, "batch_size": 10}),
    ],
    ids=lambda c: getattr(c, "__name__", ""),
)
def test_a_step_built_by_hand_without_clip_bounds_says_how_to_give_or_configure_them(cls, extra):
    """`pm.sample(step=pymc_dp.DPHMC(epsilon=3, delta=1e-6, ...))` with no clip bound, or
    with `pymc_dp.sample`'s `data_bounds`: the message names the clip bound, how to give it
    (PrivacySettings) and the class-level call that configures it privately (a new user
    got "llr_clip_bound must be a number; got None" and "unexpected keyword arguments")."""
    target = {"epsilon": 3.0, "delta": 1e-6, **PLAN}
    name = cls.__name__
    with _model():
        with pytest.raises(ValueError, match=r"no (llr_)?clip_bound given") as err:
            cls(privacy=pymc_dp.PrivacySettings(**target), **extra)
        assert "PrivacySettings(clip_bound=" in str(err.value)
        assert f"pymc_dp.sample(step=pymc_dp.{name}," in str(err.value)
        with pytest.raises(TypeError, match=r"\['data_bounds'\] is an argument of pymc_dp.sample"):
            cls(**target, data_bounds={"y": (-5.0, 5.0)}, **extra)
