"""The example dataset: breast-cancer diagnosis, bundled with scikit-learn (no download).

Wisconsin Diagnostic Breast Cancer data (569 patients, Street, Wolberg & Mangasarian 1993),
as shipped by ``sklearn.datasets.load_breast_cancer``. Four features, each mapped to
[-1, 1] by a fixed affine map of a range fixed in advance (below), after clipping to that
range. The transform is per record and does not depend on the data, so it costs no privacy:
standardising with the sample mean and standard deviation instead would be a data access
outside any privacy mechanism.

With every feature in [-1, 1] and an intercept, the per-record logistic log-likelihood is
Lipschitz in the coefficients with constant ||(1, x_i)||_2 <= sqrt(1 + 4) = sqrt(5): a clip
bound of sqrt(5) never clips (the penalty and HMC chains are then exact), and it was chosen
without looking at the data.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FEATURES", "RANGES", "load_example_data", "logistic_model"]

#: Features used and the ranges fixed in advance (clinical plausibility, rounded outward from
#: the public dataset documentation; in a real study fix them before seeing the data).
FEATURES = ("mean radius", "mean texture", "mean smoothness", "mean concavity")
RANGES = {
    "mean radius": (5.0, 30.0),
    "mean texture": (5.0, 40.0),
    "mean smoothness": (0.05, 0.17),
    "mean concavity": (0.0, 0.45),
}
#: Lipschitz constant of each record's log-likelihood in the coefficients: ||(1, x_i)||.
LIPSCHITZ_BOUND = float(np.sqrt(1 + len(FEATURES)))


def load_example_data() -> tuple[np.ndarray, np.ndarray]:
    """Return ``(X, y)``: X of shape (569, 4) in [-1, 1], y = 1 for a malignant tumour."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    names = list(data.feature_names)
    cols = []
    for f in FEATURES:
        lo, hi = RANGES[f]
        x = np.clip(data.data[:, names.index(f)], lo, hi)
        cols.append(2.0 * (x - lo) / (hi - lo) - 1.0)
    X = np.column_stack(cols)
    y = (data.target == 0).astype(np.int64)  # sklearn codes malignant as 0
    return X, y


def logistic_model(X: np.ndarray, y: np.ndarray):
    """Bayesian logistic regression with N(0, 5^2) priors on the intercept and coefficients."""
    import pymc as pm

    with pm.Model(coords={"feature": list(FEATURES)}) as model:
        intercept = pm.Normal("intercept", 0.0, 5.0)
        beta = pm.Normal("beta", 0.0, 5.0, dims="feature")
        pm.Bernoulli("malignant", logit_p=intercept + pm.math.dot(X, beta), observed=y)
    return model
