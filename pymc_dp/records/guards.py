"""What pymc_dp refuses to sample, and why (model support and privacy policy).

Every check here inspects the model's structure only and runs before any data value is
read; each refusal names what to change.
"""

from __future__ import annotations

from collections.abc import Sequence

import pymc as pm
import pytensor

from pymc_dp.records.errors import ModelNotSupportedError
from pymc_dp.records.graph_facts import count_records, imputed_variables, record_data_read

__all__ = ["check_model_supported"]

_record_data_read = record_data_read


def check_model_supported(
    model: pm.Model, vars: Sequence, *, data_free_potentials: bool = False
) -> None:
    """Refuse models that pymc_dp cannot sample privately; reads no data value.

    Parameters
    ----------
    model : pm.Model
    vars : sequence of value variables the step samples.
    data_free_potentials : bool
        The user declares that every ``pm.Potential`` in the model is free of the data.
    """
    imputed = imputed_variables(model)
    if imputed:
        raise ModelNotSupportedError(
            f"the observed data of {imputed} has missing values (NaN or masked entries): PyMC "
            "would impute them, storing every observed value in a Deterministic and revealing "
            "where the gaps are. pymc_dp needs complete data: drop or impute the incomplete "
            "records before building the model, by a rule that does not look at the other "
            "records (or model the missingness explicitly)"
        )
    n = count_records(model)
    if model.potentials and not data_free_potentials:
        names = ", ".join(repr(p.name) for p in model.potentials)
        raise ModelNotSupportedError(
            f"the model has pm.Potential terms ({names}); pymc_dp cannot tell whether a "
            "Potential reads the data, and one that does would bypass the privacy mechanism. "
            "If every Potential is a function of parameters only, pass data_free_potentials=True "
            "to the step (with pymc_dp.sample: step_kwargs={'data_free_potentials': True})"
        )
    # Everything outside the per-record likelihood enters the acceptance tests exactly (no
    # noise): the prior and log-Jacobian of every free variable, data-free Potentials, and
    # the initial values. None of them may read record data.
    outside = [(f"the prior of {rv.name!r}", rv) for rv in model.free_RVs]
    if data_free_potentials:
        outside += [(f"pm.Potential declared data-free ({p.name!r})", p) for p in model.potentials]
    for label, var in outside:
        graph = model.logp(vars=[var], jacobian=True) if var in model.free_RVs else var
        read = _record_data_read([graph], model, n)
        if read:
            raise ModelNotSupportedError(
                f"{label} reads record data ({', '.join(read)}); it would enter every "
                "acceptance test without noise and bypass the privacy mechanism. Priors and "
                "Potentials must be functions of the parameters and of public constants only "
                "(not of the observed data, a pm.Data array with one row per record, or an "
                "aggregate of one such as its mean)"
            )
    for rv, init in model.rvs_to_initial_values.items():
        if isinstance(init, pytensor.graph.basic.Variable) and _record_data_read([init], model, n):
            raise ModelNotSupportedError(
                f"the initial value of {rv.name!r} is computed from record data; the chains "
                "would start at a data-dependent point outside the privacy mechanism. Use a "
                "public initial value (initvals=..., or the default)"
            )
    for v in vars:
        if v.dtype in pm.vartypes.discrete_types:
            raise ModelNotSupportedError(
                f"free variable {v.name!r} is discrete; pymc_dp's step methods sample continuous "
                "parameters only (marginalise the discrete variable out of the model)"
            )
