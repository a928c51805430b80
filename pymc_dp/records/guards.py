"""What pymc_dp refuses to sample, and why (model support and privacy policy).

Every check here inspects the model's structure only and runs before any data value is
read; each refusal names what to change.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.replace import clone_replace

from pymc_dp.callscope import mark_model_checked, model_checked
from pymc_dp.records.errors import ModelNotSupportedError
from pymc_dp.records.fakes import fake_rows
from pymc_dp.records.graph_facts import (
    count_records,
    imputed_variables,
    record_data_read,
    static_leading_length,
    value_ancestors,
)
from pymc_dp.records.rewrite import drop_shape_pins

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

    Inside a `pymc_dp.callscope.call_scope` (one `pymc_dp.sample` call) the model's checks
    run once: a later check of the same model with the same or a looser
    ``data_free_potentials`` checks only ``vars``.
    """
    if not model_checked(model, data_free_potentials):
        _check_model(model, data_free_potentials)
        mark_model_checked(model, data_free_potentials)
    for v in vars:
        if v.dtype in pm.vartypes.discrete_types:
            raise ModelNotSupportedError(
                f"free variable {v.name!r} is discrete; pymc_dp's step methods sample continuous "
                "parameters only (marginalise the discrete variable out of the model)"
            )


def _check_model(model: pm.Model, data_free_potentials: bool) -> None:
    """`check_model_supported`'s checks of the model itself (its graph; no data value)."""
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
    _refuse_folded_aggregates(model, n)


def _is_record_constant(var, n: int) -> bool:
    """A numpy array written into the graph with one row per record (shape only)."""
    return (
        isinstance(var, pt.TensorConstant)
        and var.ndim >= 1
        and static_leading_length(var) == n
        and not (n == 1 and var.ndim == 1)  # as `record_data_read`: a length-1 vector is ambiguous
    )


def _refuse_folded_aggregates(model: pm.Model, n: int) -> None:
    """Refuse a likelihood that computes, from numpy arrays of one row per record written
    into the graph, a value that is not row-wise (an aggregate such as ``pt.as_tensor(y).mean()``,
    a centring ``x - x.mean()``, a sort, a shift).

    PyMC's log-probability folds every subgraph of constants into one constant
    (`pymc.logprob.rewriting`'s canonicalize pass), so the per-record graphs see the
    aggregate as a public number (or a folded array as per-record data) and the separability
    check cannot: measured, a normal likelihood with ``mu = pt.as_tensor(y).mean() + b * x``
    was sampled (its gradient sums used the full data's mean without noise) where the same
    model with ``pm.Data`` was refused. Here the observed variables' own input graphs (built by
    the user, not yet folded) are inspected: each variable computed from constants only, at
    least one of them an array of ``n`` rows, must keep the record axis and be row-wise,
    checked as the likelihood is (`pymc_dp.records.fakes.check_separable`) on data-free
    stand-in rows: evaluated on 8 stand-in rows together, each alone, and reversed. Reads
    no data value: the record arrays are replaced by stand-ins before anything is evaluated.
    """
    graphs = [i for rv in model.observed_RVs if rv.owner is not None for i in rv.owner.inputs]
    folded: dict = {}  # variable -> whether it is computed from constants only

    def constant_only(v) -> bool:
        if v in folded:
            return folded[v]
        if isinstance(v, Constant):
            folded[v] = True
        elif isinstance(v, SharedVariable) or v.owner is None:
            folded[v] = False
        else:
            folded[v] = False  # (a cycle cannot occur; set before recursing for safety)
            folded[v] = all(constant_only(i) for i in v.owner.inputs)
        return folded[v]

    # the largest such variables: an input of the observed variables, or of a node that is
    # not computed from constants only (what PyMC's folding turns into one constant)
    every = value_ancestors(graphs)
    tops = [v for v in graphs if v.owner is not None and constant_only(v)]
    for w in every:
        if w.owner is not None and not constant_only(w):
            tops += [i for i in w.owner.inputs if i.owner is not None and constant_only(i)]
    candidates, seen = [], set()
    for v in tops:
        if v in seen or not isinstance(v, pt.TensorVariable):
            continue
        seen.add(v)
        leaves = [a for a in value_ancestors([v]) if _is_record_constant(a, n)]
        if leaves:
            candidates.append((v, leaves))
    for v, leaves in candidates:
        ops = sorted(
            {str(a.owner.op) for a in value_ancestors([v]) if a.owner is not None}
            - {"ExpandDims{axis=0}"}
        )
        what = (
            "an aggregate of a numpy array with one row per record written into the model "
            f"(computed from constants before any parameter enters, by {', '.join(ops[:6])})"
        )
        if v.ndim == 0 or static_leading_length(v) not in (None, n):
            _raise_aggregate(what)
        m = 8
        stand_in = [
            pt.tensor(dtype=a.dtype, shape=(None, *a.type.shape[1:]), name="row") for a in leaves
        ]
        try:
            # the record count written as a shape (``pt.ones((n, 1))`` beside ``X``) follows
            # the stand-ins' count
            rows = stand_in[0].shape[0]
            pins = {
                a: pt.cast(rows, a.dtype)
                for a in value_ancestors([v])
                if isinstance(a, pt.TensorConstant)
                and a.ndim == 0
                and np.issubdtype(np.dtype(a.dtype), np.integer)
                and int(a.data) == n
            }
            replace = dict(zip(leaves, stand_in, strict=True)) | pins
            graph = drop_shape_pins(clone_replace(v, replace=replace, rebuild_strict=False))
            f = pytensor.function(stand_in, graph, on_unused_input="ignore", mode="FAST_COMPILE")
            fake = fake_rows([np.empty((1, *a.type.shape[1:]), dtype=a.dtype) for a in leaves], m)
            together = np.asarray(f(*fake))
            alone = np.concatenate([np.asarray(f(*[a[i : i + 1] for a in fake])) for i in range(m)])
            reverse = np.asarray(f(*[a[::-1] for a in fake]))
            ok = (
                together.shape[:1] == (m,)
                and alone.shape == together.shape
                and np.allclose(together, alone, equal_nan=True)
                and np.allclose(together[::-1], reverse, equal_nan=True)
            )
        except Exception:  # noqa: BLE001 - a graph pinned to n rows cannot be checked row-wise
            ok = False
        if not ok:
            _raise_aggregate(what)


def _raise_aggregate(what: str) -> None:
    raise ModelNotSupportedError(
        f"the likelihood reads {what}: each record's log-likelihood would depend on the other "
        "records through a number computed without noise, outside the privacy mechanism. "
        "Centre or scale with public values (e.g. the midpoint and half-range of the "
        "codebook's bounds); an aggregate of the data (its mean, sd, maximum, order) is "
        "refused in any form, a pm.Data array as well; model it with a parameter instead"
    )
