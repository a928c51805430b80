"""The example dataset: the 1974 Redbook survey on extramarital affairs, bundled with
statsmodels (``statsmodels.datasets.fair``; no download).

6366 married women answered a magazine survey (Fair 1978, *A Theory of Extramarital
Affairs*, J. Political Economy 86). Whether a respondent had an affair is exactly the kind
of answer differential privacy exists to protect. The model: Bayesian logistic regression
of "had an affair" on five survey answers.

Every feature is clipped to a range fixed in advance by the questionnaire's answer scale and
mapped to [-1, 1] by a fixed affine map. The transform is per record and does not depend on
the data, so it costs no privacy; standardising with the sample mean and standard deviation
instead would be a data access outside any privacy mechanism.

With every feature in [-1, 1] and an intercept, each record's logistic log-likelihood is
Lipschitz in the coefficients with constant ||(1, x_i)||_2 <= sqrt(1 + 5): that bound, known
without looking at the data, is the clip bound, so nothing is ever clipped.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FEATURES", "LIPSCHITZ_BOUND", "RANGES", "load_example_data", "logistic_model"]

#: Survey answers used, with the answer scale of the questionnaire (fixed in advance).
RANGES = {
    "rate_marriage": (1.0, 5.0),  # 1 = very poor ... 5 = very good
    "age": (17.5, 42.0),  # age brackets of the survey
    "yrs_married": (0.5, 23.0),  # years-married brackets
    "religious": (1.0, 4.0),  # 1 = not ... 4 = strongly
    "educ": (9.0, 20.0),  # years of education (grade school ... advanced degree)
}
FEATURES = tuple(RANGES)
#: Lipschitz constant of each record's log-likelihood in the coefficients: ||(1, x_i)||.
LIPSCHITZ_BOUND = float(np.sqrt(1 + len(FEATURES)))


def load_example_data() -> tuple[np.ndarray, np.ndarray]:
    """Return ``(X, y)``: X of shape (6366, 5) in [-1, 1]; y = 1 if the respondent had an affair."""
    from statsmodels.datasets import fair

    data = fair.load_pandas().data
    cols = []
    for f, (lo, hi) in RANGES.items():
        x = np.clip(data[f].to_numpy(dtype=float), lo, hi)
        cols.append(2.0 * (x - lo) / (hi - lo) - 1.0)
    X = np.column_stack(cols)
    y = (data["affairs"].to_numpy() > 0).astype(np.int64)
    return X, y


def logistic_model(X: np.ndarray, y: np.ndarray):
    """Logistic regression with N(0, 2.5^2) priors on the intercept and the coefficients."""
    import pymc as pm

    with pm.Model(coords={"feature": list(FEATURES)}) as model:
        intercept = pm.Normal("intercept", 0.0, 2.5)
        beta = pm.Normal("beta", 0.0, 2.5, dims="feature")
        pm.Bernoulli("affair", logit_p=intercept + pm.math.dot(X, beta), observed=y)
    return model
