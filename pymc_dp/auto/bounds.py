"""Public bounds of the data, declared by the user (``data_bounds``).

Bounds are public knowledge (a questionnaire's range, a sensor's limits), never computed
from the data. They are checked against the model's *names* and shapes only: no data value
is read, so a bad declaration fails before anything is touched.
"""

from __future__ import annotations

import math

import pymc as pm

__all__ = ["check_data_bounds"]


def check_data_bounds(model: pm.Model, data_bounds) -> dict[str, tuple[float, float]]:
    """Validate ``{name: (low, high)}`` against the model's observed variables and data.

    Parameters
    ----------
    model : pm.Model
    data_bounds : dict
        Keys: names of observed variables or ``pm.Data`` containers; values: finite
        ``(low, high)`` with ``low < high``.

    Returns
    -------
    dict
        The bounds as floats.

    Raises
    ------
    ValueError
        A name that matches nothing in the model, or a bound that is not a finite pair with
        ``low < high``; the message names the parameter and the fix.
    """
    if not isinstance(data_bounds, dict):
        raise ValueError(
            "data_bounds must be a dict {name: (low, high)}, e.g. {'X': (-1, 1), 'y': (0, 1)}"
        )
    names = {rv.name for rv in model.observed_RVs} | {v.name for v in model.data_vars}
    out = {}
    for name, bound in data_bounds.items():
        if name not in names:
            raise ValueError(
                f"data_bounds names {name!r}, which is neither an observed variable nor a "
                f"pm.Data container of the model; known names: {sorted(names)}"
            )
        try:
            low, high = (float(b) for b in bound)
        except (TypeError, ValueError):
            raise ValueError(
                f"data_bounds[{name!r}] must be a pair (low, high) of numbers; got {bound!r}"
            ) from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"data_bounds[{name!r}] must be finite with low < high; got {bound!r}")
        out[name] = (low, high)
    return out
