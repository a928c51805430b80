"""The per-record glue between a PyMC model and the DP steps.

A *record* is index ``i`` along the leading axis of every observed variable (and of every
covariate array of the same leading length that the likelihood reads). The step methods
need three things from a model, all in the transformed (unconstrained) space PyMC's step
methods work in, as functions of one flat parameter vector ``q``:

1. per-record log-likelihoods ``l_i(q)`` (length ``n``), from which the clipped
   log-likelihood ratios of the penalty test are formed;
2. the prior plus log-Jacobian ``log p(q)``, exact and un-noised (it reads no record data:
   checked), and its gradient;
3. per-record gradients ``grad l_i(q)`` and, on the hot path of DP-HMC, the sum of their
   clipped versions.

The modules follow the data flow, and raw data values enter only in the store:

=================== ========================================================================
``errors``          `ModelNotSupportedError`
``graph_facts``     graph facts from structure and static shapes (data nodes, ``n``, reads)
``guards``          what is refused and why (model support, privacy policy)
``rewrite``         graph -> graph (``OpFromGraph`` inlining, shape pins, canonicalize,
                    ``switch(c, f(a), f(b)) -> f(switch(c, a, b))``)
``graphs``          the per-record graphs as frozen data (`RecordGraphs`)
``fakes``           data-free stand-in records and the separability check
``backend``         the one compile call; the backend (C / Numba / JAX): automatic per kind of
                    function, or ``compile_kwargs["mode"]``; no input filter for exact
                    arguments
``clipping``        the clipping layout every route shares, `ClipRoute`, the numpy
                    reference of the clipped sum, the check of a route on stand-ins
``gathers``         ``theta[g_i]`` kept one vectorised gather (lift, un-Blockwise)
``segment``         the indexed route (group-indexed models: segment sums)
``sorted_segments`` the sorted route (records sorted by group once per chunk, one
                    vectorised loop per group: a generated Numba loop nest)
``routes``          graphs -> compiled functions: generic, GLM, sorted, indexed and blocks
                    routes (registry)
``store``           where records live (`InMemoryRecords`: chunks, take, map-reduce)
``runtime``         `RecordFunctions` (routes mapped over a store), `RecordSource`
``build``           orchestration: `build_record_functions`
``expfam``          exponential-family structure from the graph (sufficient statistics,
                    natural parameters) and its chunked clipped-statistic passes, for
                    `pymc_dp.DPExpFamilyPenalty`
=================== ========================================================================

Per-record gradients are built without ``pytensor.gradient.jacobian`` (which needs ``n x n``
memory or a scan over records): the likelihood graph is rewritten to the graph of a single
record, differentiated, and vectorised over the data rows with ``vectorize_graph``; a gather
``theta[g_i]`` stays one batched index (never a per-record ``Blockwise``), and group-indexed
models sum their group blocks with segment sums instead of an ``n x J`` matrix.
Models that cannot be mapped to records are refused with `ModelNotSupportedError`
before any data value is read.
"""

from __future__ import annotations

from pymc_dp.records.build import build_record_functions
from pymc_dp.records.errors import ModelNotSupportedError, RecordComputationError
from pymc_dp.records.graph_facts import (
    count_records,
    deterministics_reading_data,
    imputed_variables,
)
from pymc_dp.records.graphs import RecordGraphs, per_record_graphs
from pymc_dp.records.guards import check_model_supported
from pymc_dp.records.runtime import (
    FusedLastPass,
    FusedTwoPointPass,
    GradSumMemo,
    LoglikMemo,
    RecordFunctions,
    RecordSource,
)
from pymc_dp.records.store import InMemoryRecords

__all__ = [
    "FusedLastPass",
    "FusedTwoPointPass",
    "GradSumMemo",
    "InMemoryRecords",
    "LoglikMemo",
    "ModelNotSupportedError",
    "RecordFunctions",
    "RecordComputationError",
    "RecordGraphs",
    "RecordSource",
    "build_record_functions",
    "check_model_supported",
    "count_records",
    "deterministics_reading_data",
    "imputed_variables",
    "per_record_graphs",
]
