"""The per-record graphs of a model, as data.

From a PyMC model and the value variables one step samples, build (symbolically, reading no
data value) the graphs every route compiles: the prior plus log-Jacobian, the log-likelihoods
of a batch of records, and the log-likelihood of one record, all as functions of one flat
parameter vector ``q`` in the order PyMC's ``ArrayStepShared`` uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.logprob.basic import transformed_conditional_logp
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.graph.replace import clone_replace, graph_replace
from pytensor.graph.traversal import ancestors

from pymc_dp.records.errors import ModelNotSupportedError
from pymc_dp.records.graph_facts import count_records, data_nodes, record_data_read
from pymc_dp.records.rewrite import (
    canonicalize,
    canonicalize_records,
    drop_shape_pins,
    inline_op_from_graph,
    record_position_indices,
)

__all__ = ["RecordGraphs", "per_record_graphs"]


@dataclass(frozen=True)
class RecordGraphs:
    """Symbolic per-record graphs of one step (data-free).

    Attributes
    ----------
    x : TensorVariable
        The flat parameter vector ``q``.
    prior : TensorVariable
        Log prior plus log-Jacobian at ``q`` (reads no record data: checked).
    batch : list of TensorVariable
        Stand-in inputs for a chunk of every data array (record axis first, any length).
    ll_batch : TensorVariable
        The (tempered) log-likelihoods of the records of ``batch``, one per record.
    rows : list of TensorVariable
        Stand-in inputs for one row of every data array.
    one_record : TensorVariable
        The (tempered) log-likelihood of the record ``rows`` (a scalar).
    data_nodes : list
        The model's data nodes the likelihood reads, in the order of ``batch`` and ``rows``.
    shared : dict
        The shared replacements of the free variables this step does not sample.
    n_records : int
    n_params : int or None
        Dimension ``d`` of ``q`` (from the initial point: ``x``'s static shape can be unknown
        when a variable's length is a shared dimension).
    """

    x: Any
    prior: Any
    batch: list
    ll_batch: Any
    rows: list
    one_record: Any
    data_nodes: list
    shared: dict
    n_records: int
    n_params: int | None = None

    @property
    def ndim(self) -> int:
        """Dimension ``d`` of ``q``."""
        return int(self.n_params if self.n_params is not None else self.x.type.shape[0])


def _record_logps(model: pm.Model, n: int) -> list:
    """``model.logp(vars=model.observed_RVs, sum=False)`` with every constant array of ``n``
    rows in the observed variables' graphs (a numpy covariate) held as an opaque input while
    PyMC derives the log-probabilities, then put back.

    PyMC's log-probability rewrites read a constant whose entries are all equal as one
    scalar: with a covariate column ``x`` of all ones, ``b0 + b1 * x`` became ``b0 + b1``
    (``x`` left only as a shape), with ``x`` all zeros the term ``b1 * x`` vanished (and a
    gradient in ``b1`` raised ``DisconnectedInputError``). Whether ``x`` was a data node, the
    per-record graphs, the affine bypass (`pymc_dp.records.affine.affine_in_data`) and
    whether the model ran then depended on whether the column was constant in the data
    (issue 26, helper 247). Held as inputs of their static type (``n`` and the trailing
    shape are public), the graphs are the same for any data values of the same shape.
    """
    obs = list(model.observed_RVs)
    if n <= 1:
        # one record: every length-1 constant has "n" rows (see
        # `pymc_dp.records.rewrite.canonicalize_records`): nothing is hidden
        return model.logp(vars=obs, sum=False)
    hidden: dict = {}
    # not past a free variable: its prior keeps its graph (a prior reading record data is
    # refused below); a rebuilt free variable would not be the model's
    for v in ancestors(obs, blockers=[rv for rv in model.basic_RVs if rv not in obs]):
        if (
            isinstance(v, pt.TensorConstant)
            and v.type.ndim >= 1
            and v.type.shape[0] == n
            and v not in hidden
        ):
            hidden[v] = v.type(name=f"record_covariate{len(hidden)}")
    if not hidden:
        return model.logp(vars=obs, sum=False)
    new = graph_replace(obs, replace=hidden, strict=False)
    rvs_to_values = {rv: val for rv, val in model.rvs_to_values.items() if rv not in obs}
    rvs_to_values.update({nv: model.rvs_to_values[ov] for ov, nv in zip(obs, new, strict=True)})
    terms = transformed_conditional_logp(
        rvs=new,
        rvs_to_values=rvs_to_values,
        rvs_to_transforms=model.rvs_to_transforms,
        jacobian=True,
    )
    back = {h: c for c, h in hidden.items()}
    return [clone_replace(t, replace=back, rebuild_strict=False) for t in terms]


def per_record_graphs(
    model: pm.Model,
    vars: Sequence,
    initial_point: dict[str, np.ndarray],
    *,
    tempering: float = 1.0,
    data_free_potentials: bool = False,
) -> RecordGraphs:
    """Build the per-record graphs of ``model`` for the value variables ``vars``.

    The likelihood's terms are summed over every axis but the record axis, the observed
    variables' terms added along it; shape pins to ``n`` and ``OpFromGraph`` nodes are
    removed; the data nodes (arrays of leading length ``n``) are replaced by batch inputs
    (and by one row for the one-record graph). Reads no data value.

    Raises
    ------
    ModelNotSupportedError
        A scalar log-likelihood term; a prior that reads record data.
    """
    n = count_records(model)
    shared = make_shared_replacements(initial_point, vars, model)
    ll_terms = _record_logps(model, n)
    per_record = []
    for t in ll_terms:
        if t.ndim == 0:
            raise ModelNotSupportedError(
                "an observed variable's log-likelihood is a scalar; pymc_dp needs one term per "
                "record (a leading record axis)"
            )
        per_record.append(pt.sum(t, axis=tuple(range(1, t.ndim))) if t.ndim > 1 else t)
    ll_vec = per_record[0] if len(per_record) == 1 else pt.add(*per_record)
    prior_terms = list(model.free_RVs)
    if data_free_potentials:
        prior_terms += list(model.potentials)
    prior = model.logp(vars=prior_terms, jacobian=True)

    [ll_vec, prior], x = join_nonshared_inputs(initial_point, [ll_vec, prior], vars, shared)
    x.name = "q"
    ll_vec = drop_shape_pins(inline_op_from_graph(ll_vec))
    ll_vec = record_position_indices(drop_shape_pins(canonicalize_records(ll_vec, n)), n)
    if tempering != 1.0:
        ll_vec = ll_vec * tempering

    exclude = set(shared.values())
    nodes = data_nodes(ll_vec, n, exclude)
    # Second line of defence after check_model_supported: the compiled prior (prior,
    # log-Jacobian and declared data-free Potentials, joined) reads no record data.
    if record_data_read([prior], model, n, exclude):
        raise ModelNotSupportedError(
            "the prior (or a pm.Potential declared data-free) reads an array with one row per "
            "record; it would bypass the privacy mechanism"
        )
    batch = [
        pt.tensor(dtype=d.dtype, shape=(None, *d.type.shape[1:]), name=f"data{i}")
        for i, d in enumerate(nodes)
    ]
    rows = [
        pt.tensor(dtype=d.dtype, shape=d.type.shape[1:], name=f"row{i}")
        for i, d in enumerate(nodes)
    ]
    ll_batch = drop_shape_pins(
        clone_replace(ll_vec, replace=dict(zip(nodes, batch, strict=True)), rebuild_strict=False)
    )
    try:
        one = clone_replace(
            ll_vec,
            replace={d: r[None] for d, r in zip(nodes, rows, strict=True)},
            rebuild_strict=False,
        )
    except ValueError as err:  # a static shape check of n rows against one record
        raise ModelNotSupportedError(
            "the likelihood combines per-record values with an array of n rows (the number of "
            "records) computed from constants, not data (e.g. a multinomial logit's reference "
            "column pm.math.zeros((X.shape[0], 1)) with a numpy X, concatenated to X @ B); "
            "pymc_dp evaluates the likelihood on batches of records, which such an array does "
            "not follow. Put the constant in the parameters (B_full = pt.concatenate("
            "[pt.zeros((k, 1)), B], axis=1), then X @ B_full) or build it from a per-record "
            f"expression (pt.zeros_like(eta[:, :1])). PyTensor said: {err}"
        ) from err
    one = canonicalize(drop_shape_pins(one).sum())
    return RecordGraphs(
        x=x,
        prior=prior,
        batch=batch,
        ll_batch=ll_batch,
        rows=rows,
        one_record=one,
        data_nodes=nodes,
        shared=shared,
        n_records=n,
        n_params=int(sum(np.size(initial_point[v.name]) for v in vars)),
    )
