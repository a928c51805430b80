"""Orchestration: model -> checks -> per-record graphs -> compiled routes -> runtime functions.

The data flows one way: the model is checked (`guards`), its
per-record graphs are built (`graphs`) and compiled
(`routes` through `backend`), the separability
of the likelihood is checked on stand-in records (`fakes`), and only
then are the data values read, once, into a store (`store`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pymc as pm
from pytensor.compile.sharedvalue import SharedVariable

from pymc_dp.records.errors import ModelNotSupportedError
from pymc_dp.records.fakes import check_separable
from pymc_dp.records.graph_facts import observed_data
from pymc_dp.records.graphs import per_record_graphs
from pymc_dp.records.guards import check_model_supported
from pymc_dp.records.routes import compile_likelihood, compile_prior
from pymc_dp.records.runtime import RecordFunctions, _Compiled
from pymc_dp.records.store import InMemoryRecords, node_shape

__all__ = ["build_record_functions"]


def build_record_functions(
    model: pm.Model,
    vars: Sequence,
    initial_point: dict[str, np.ndarray],
    *,
    tempering: float = 1.0,
    chunk_size: int | None = None,
    data_free_potentials: bool = False,
    compile_kwargs: dict | None = None,
    records=None,
) -> tuple[RecordFunctions, dict]:
    """Compile the per-record functions of ``model`` for the value variables ``vars``.

    Parameters
    ----------
    model : pm.Model
        The model.
    vars : sequence
        Value variables (transformed space) the step samples.
    initial_point : dict
        A point of the model (used for shapes and for the shared replacements of the free
        variables this step does not sample; never for data).
    tempering : float
        Likelihood temperature ``T > 0`` (thesis Sec. 3.1); the per-record log-likelihoods are
        ``T * log p(x_i | theta)``.
    chunk_size : int, optional
        Records per call; bounds the memory of per-record gradients to ``chunk_size x d``.
    data_free_potentials : bool
        Declare that every ``pm.Potential`` is a function of the parameters only.
    compile_kwargs : dict, optional
        Passed to `pymc.pytensorf.compile` (e.g. ``{"mode": "NUMBA"}``).
    records : optional
        Where the records live when not in the model (`pymc_dp.distributed.DaskRecords`):
        an object with ``check_names`` and ``store_for``. The model's data nodes are then
        matched to its arrays by name, and only their dtypes and trailing shapes are taken
        from the model (its data may be a small stand-in); ``n`` is that of the records.

    Returns
    -------
    (RecordFunctions, dict)
        The functions and the shared replacements (for ``ArrayStepShared``).

    Raises
    ------
    ModelNotSupportedError
        For models that cannot be mapped to records (checked before any data value is read).
    """
    if not (np.isfinite(tempering) and tempering > 0):
        raise ValueError(f"tempering must be a finite number > 0; got {tempering!r}")
    if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive integer or None; got {chunk_size!r}")
    check_model_supported(model, vars, data_free_potentials=data_free_potentials)
    compile_kwargs = dict(compile_kwargs or {})
    graphs = per_record_graphs(
        model,
        vars,
        initial_point,
        tempering=tempering,
        data_free_potentials=data_free_potentials,
    )
    f_prior = compile_prior(graphs, compile_kwargs)
    f_ll, f_llr = compile_likelihood(graphs, compile_kwargs)

    x = graphs.x
    q0 = np.concatenate([np.ravel(initial_point[v.name]) for v in vars]).astype(x.dtype)
    observed = {observed_data(model, rv) for rv in model.observed_RVs}
    if records is None:
        store = InMemoryRecords.from_nodes(graphs.data_nodes, chunk_size)
    else:
        if chunk_size is not None:
            raise ValueError(
                "chunk_size is set by the partitions of the records (DaskRecords); leave "
                "chunk_size=None"
            )
        # names and public shapes only: no data value is read before the checks pass
        keys = records.check_names(_node_names(model, graphs.data_nodes, observed))
        shapes = [(node.dtype, node_shape(node)[1:]) for node in graphs.data_nodes]
        store = records.store_for(keys, shapes)
        # the workers' copies of the free variables this step does not sample follow the
        # driver's values (another step of a CompoundStep changes them): parameters only
        store.follow(list(graphs.shared.values()))
    # The separability check runs on stand-in records with only the data's dtypes and
    # trailing shapes (public); no data value enters it.
    templates = [np.zeros((1, *shape[1:]), dtype=dt) for dt, shape in store.dtypes_and_shapes]
    try:
        check_separable(f_ll, q0, templates, store.n_records)
    except ModelNotSupportedError as err:
        other = _data_of_another_length(model, store.n_records) if records is None else {}
        if not other:
            raise
        raise ModelNotSupportedError(
            f"{err} Here the pm.Data containers {other} (their numbers of rows) read by the "
            f"likelihood do not have the {store.n_records} rows of the observed data: after "
            "pm.set_data, give every array with one row per record the new records, the "
            "observed values too (observed=pm.Data('y', y), with shape=X.shape[0] on the "
            "observed variable)"
        ) from None
    # Only arrays the user supplied (observed values, pm.Data): PyMC may also fold a
    # constant such as an all -inf bound into an array of n rows, which is not data.
    # The outcome of this check is one bit about the data, shown to the analyst who runs
    # the sampler (the trusted curator); no value, count or position is reported.
    user_data = [node in observed or isinstance(node, SharedVariable) for node in graphs.data_nodes]
    if not store.all_finite(user_data):
        raise ValueError(
            "the observed data (or a covariate array with one row per record) contains NaN "
            "or infinite values; pymc_dp needs complete, finite data: drop or impute those "
            "records before sampling"
        )
    # A numpy covariate is folded into the graph as a constant: an infinite entry there can
    # be a bound (a per-record censoring point), but a NaN is a missing value, which PyMC
    # imputes only in observed variables; left in, it makes that record's log-likelihood
    # NaN, which the clipped releases would silently turn into a bounded value.
    others = [not flag for flag in user_data]
    if any(others) and store.any_nan(others):
        raise ValueError(
            "a covariate array with one row per record (a numpy array in the model) contains "
            "NaN (missing values); pymc_dp needs complete data: drop or impute those records "
            "before sampling (PyMC imputes missing values only in observed variables; a "
            "pm.Data container refuses NaN itself)"
        )

    fns = RecordFunctions(
        compiled=_Compiled(prior_and_grad=f_prior, ll_chunk=f_ll, llr_clipped=f_llr),
        records=store,
        n_records=store.n_records,
        ndim=int(q0.size),
        chunk_size=store.chunk_size,
        tempering=float(tempering),
        graphs=graphs,
        compile_kwargs=compile_kwargs,
    )
    return fns, graphs.shared


def _data_of_another_length(model: pm.Model, n: int) -> dict[str, int]:
    """The ``pm.Data`` containers the likelihood reads whose leading length is not ``n`` (e.g.
    after ``pm.set_data`` of the covariates only): ``{name: rows}``. Shapes only (public, like
    ``n``); used to explain a likelihood that failed on stand-in records. A container of
    another length may be legitimate (group-level data), so this only explains a failure."""
    from pytensor.graph.traversal import ancestors

    inputs = [i for rv in model.observed_RVs for i in rv.owner.inputs]
    read = set(ancestors(inputs))
    out = {}
    for var in model.data_vars:
        if var in read and var.ndim >= 1:
            rows = node_shape(var)[0]
            if rows != n:
                out[var.name] = int(rows)
    return out


def _node_names(model: pm.Model, nodes: list, observed: set) -> list[list[str]]:
    """The names every data node is known by: the observed variables bound to it and, for a
    ``pm.Data`` container, its own name. Structure only; no data value is read."""
    out = []
    for node in nodes:
        names = [rv.name for rv in model.observed_RVs if observed_data(model, rv) is node]
        if isinstance(node, SharedVariable) and node.name:
            names.append(node.name)
        if not names:
            raise ValueError(
                f"the likelihood reads an unnamed array with one row per record "
                f"({node.type}); records given by name (DaskRecords) need every such array "
                "to be an observed variable or a pm.Data container: wrap it in "
                "pm.Data('name', ...)"
            )
        out.append(list(dict.fromkeys(names)))
    return out
