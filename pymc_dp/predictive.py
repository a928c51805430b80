"""Posterior predictive draws from a pymc_dp result, without the raw data.

``pm.sample_posterior_predictive`` on a DP result returns (and with
``extend_inferencedata=True`` adds to the DP result) the ``observed_data`` and
``constant_data`` groups: the raw data. Its draws of an observed variable are made at the
model's current covariates: at the records' own covariates ``x_i``, draw ``i`` is a function of
the DP posterior and ``x_i`` without noise (averaged over the draws it gives
``E[y | theta, x_i]``, for a linear regression ``a + x_i b``, from which ``x_i`` follows).
`sample_posterior_predictive` removes the raw-data groups and refuses draws that read record
data the caller has not replaced by public values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pymc as pm
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable

from pymc_dp.records.graph_facts import count_records, record_data_read, value_ancestors
from pymc_dp.report import RAW_DATA_GROUPS, _get_group, _groups
from pymc_dp.sampling import _drop_groups

__all__ = ["sample_posterior_predictive", "PUBLIC_DATA_ATTR"]

#: Groups PyMC's predictive sampling adds that hold data values, not draws: the raw data
#: (``observed_data``, ``constant_data``) and the data containers' values at prediction time
#: (``predictions_constant_data``; dropped too: with a partial ``public_data`` it holds the
#: records' other containers).
DATA_GROUPS = RAW_DATA_GROUPS

#: Groups of draws `sample_posterior_predictive` returns.
DRAW_GROUPS = ("posterior_predictive", "predictions")

#: Attribute of a draw group naming the ``pm.Data`` containers set to public values for the
#: draws (comma-separated names); `pymc_dp.privacy_report` does not count them as record data.
PUBLIC_DATA_ATTR = "dp_public_data"


def _reads(var, model: pm.Model, n: int, public: set) -> list[str]:
    """Record data a predictive draw of ``var`` reads, other than the ``public`` containers.

    Judged from the graph and static shapes (`pymc_dp.records.graph_facts.record_data_read`),
    never from data values. A draw of an observed variable reads its distribution's inputs (not
    its observed value); a Deterministic reads its whole graph. Every ``pm.Data`` array not in
    ``public`` counts as record data, whatever its length (conservative, as the report's
    Deterministic check).
    """
    graphs = list(var.owner.inputs) if var in model.observed_RVs else [var]
    exclude = frozenset(model[name] for name in public)
    names = set(record_data_read(graphs, model, n, exclude=exclude))
    for a in value_ancestors(graphs):
        if (
            a not in exclude
            and isinstance(a, SharedVariable)
            and isinstance(a.type, pt.TensorType)
            and a.ndim >= 1
        ):
            names.add(a.name or "an unnamed shared array")
    return sorted(names)


def _privacy_attrs(idata) -> dict[str, Any]:
    """The ``dp_*`` attributes of a result and of its posterior (the report's, if it ran)."""
    out = {}
    post = _get_group(idata, "posterior")
    for src in (getattr(post, "attrs", {}), getattr(idata, "attrs", {})):
        out.update({k: v for k, v in src.items() if str(k).startswith("dp_")})
    return out


def _set_group(target, name: str, source) -> None:
    """Put group ``name`` of ``source`` into ``target`` (InferenceData or DataTree)."""
    if callable(getattr(target, "groups", None)):  # arviz.InferenceData
        target.extend(source.__class__(**{name: source[name]}), join="right")
    else:  # xarray.DataTree
        target[name] = source[name]


def sample_posterior_predictive(
    idata,
    *,
    model: pm.Model | None = None,
    public_data: Mapping[str, Any] | None = None,
    **kwargs: Any,
):
    """``pm.sample_posterior_predictive`` for a pymc_dp result, without the raw data.

    The predictive draws are post-processing of the DP posterior: they spend no further
    privacy budget and carry the run's (epsilon, delta) (Dwork & Roth 2014, Proposition 2.1),
    provided they read no record data without noise. So this function

    * refuses (``ValueError``, before anything is returned) draws that read record data: a
      draw of an observed variable whose distribution reads the records' covariates (a numpy
      array with one row per record, or a ``pm.Data`` container), or a stored Deterministic
      that reads the data. Draw ``i`` at the records' own covariates is a function of the DP
      posterior and ``x_i`` without noise: averaged over the draws it gives
      ``E[y | theta, x_i]`` (for a linear regression ``a + x_i b``, from which ``x_i``
      follows), so publishing it reveals the covariates. A warning would not make the output
      private, hence the refusal. Predictions at public covariates go through
      ``public_data``; covariates written into the model as numpy arrays cannot be replaced
      (wrap them in ``pm.Data``). Draws whose distribution reads no record data (no
      covariates) are allowed as they are;
    * removes every group that holds data values (``observed_data``, ``constant_data``,
      ``log_likelihood``, ``predictions_constant_data``) from what it returns and, with
      ``extend_inferencedata=True``, adds only the draw group to ``idata``;
    * copies the result's privacy attributes (``dp_*``, from the result and its posterior:
      what `pymc_dp.privacy_report` attached) onto the returned object, and records the
      containers set to public values in the draw group's ``dp_public_data`` attribute
      (`pymc_dp.privacy_report` then does not count them as record data).

    Which variables read data is judged from the model's graph and static shapes, never from
    data values, so the refusal itself reveals nothing about the records.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
        What `pymc_dp.sample` (or ``pm.sample`` with pymc_dp steps) returned: PyMC 5.x gives an
        InferenceData, PyMC 6.x a DataTree.
    model : pm.Model, optional
        The model that was sampled (default: the model of the enclosing ``with`` context).
    public_data : mapping of str to array, optional
        Public values for ``pm.Data`` containers (by name), set with ``pm.set_data`` before
        the draws: new covariates (from a codebook grid, another public dataset), and, when the
        number of rows changes, a placeholder of the new length for the observed container.
        Every container the draws read must be in it. The model keeps these values after the
        call (as after ``pm.set_data``); set the records back before sampling it again.
    **kwargs
        Passed to ``pm.sample_posterior_predictive`` (``var_names``, ``predictions``,
        ``random_seed``, ``extend_inferencedata``, ...). ``return_inferencedata=False`` is
        refused (a dict of arrays carries no privacy attributes).

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        The ``posterior_predictive`` group (``predictions`` with ``predictions=True``) with the
        DP result's privacy attributes; no data group.

    Raises
    ------
    ValueError
        ``idata`` is not a pymc_dp result, or the draws read record data not in
        ``public_data``.
    """
    model = pm.modelcontext(model)
    stats = _get_group(idata, "sample_stats")
    if stats is None or "dp_mu" not in stats:
        raise ValueError(
            "pymc_dp.sample_posterior_predictive takes a pymc_dp result (its sample_stats hold "
            "dp_mu); this one has no pymc_dp privacy stats"
        )
    if not kwargs.get("return_inferencedata", True):
        raise ValueError(
            "return_inferencedata=False is not supported: the draws would carry no privacy "
            "attributes"
        )
    extend = bool(kwargs.pop("extend_inferencedata", False))
    public = dict(public_data or {})
    unknown = sorted(k for k in public if k not in model.named_vars)
    not_data = sorted(
        k for k in public if k in model.named_vars and not isinstance(model[k], SharedVariable)
    )
    bad = sorted(unknown + not_data)
    if bad:
        raise ValueError(f"public_data names must be pm.Data containers of the model: {bad}")
    # n of the records (shapes only), before the public values may change it
    n = count_records(model)
    with model:
        if public:
            pm.set_data(public)
        pp = pm.sample_posterior_predictive(idata, **kwargs)
    for group in DRAW_GROUPS:
        ds = _get_group(pp, group)
        if ds is None:
            continue
        read = {}
        for name in ds.data_vars:
            var = model.named_vars.get(name)
            if var is None:
                continue
            hits = _reads(var, model, n, set(public))
            if hits:
                read[name] = hits
        if read:
            raise ValueError(
                f"the predictive draws of {sorted(read)} read record data "
                f"{sorted({h for v in read.values() for h in v})} without noise: draw i at "
                "record i's covariates reveals them (averaged over draws it is "
                "E[y | theta, x_i]). Pass public covariates as public_data={name: array} "
                "(pm.Data containers; wrap numpy covariates in pm.Data), or ask only for "
                "variables whose distribution reads no record data (var_names=...)"
            )
    _drop_groups(pp, [g for g in DATA_GROUPS if g in _groups(pp)])
    attrs = _privacy_attrs(idata)
    pp.attrs.update(attrs)
    tag = ",".join(sorted(public))
    for group in DRAW_GROUPS:
        if group in _groups(pp):
            pp[group].attrs[PUBLIC_DATA_ATTR] = tag
            if extend:
                _set_group(idata, group, pp)
    return pp
