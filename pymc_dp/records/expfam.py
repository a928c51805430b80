r"""Exponential-family structure of a PyMC model: sufficient statistics, natural parameters.

`pymc_dp.DPExpFamilyPenalty` needs the likelihood in the form
$\log p(x_i\mid\theta) = \eta(\theta)^\top T(x_i) - A(\theta) + h(x_i)$. This module
finds it from the PyMC graph, never from the data: it reads the observed variable's
distribution and its parameter graphs, compiles $\theta \mapsto (\eta, A)$ and verifies
the decomposition against PyMC's own log-density on data-free stand-in records at several
parameter values. The data are read only by `ExpFamilyStructure.check_data_finite`
(one bit: all finite or not) and by the chunked passes whose outputs are the inputs of
Gaussian mechanisms: `ExpFamilyModel.clipped_stat_sum`
($S = \sum_i \mathrm{clip}_C(T(x_i))$), `ExpFamilyModel.centred_clip_sum` (the clipped,
whitened deviations from a public centre, their absolute values or outer products) and
`ExpFamilyModel.deviation_counts` (the counts of a DP quantile's histogram).

Supported forms (see `SUPPORTED_FORMS`): a Normal likelihood whose mean is affine in
covariates, ``mu = a(theta) + x_i^T b(theta)``, with a scale ``sigma(theta)`` free of the
covariates; and, without covariates, Normal, Bernoulli, Binomial (known trials), Poisson,
Exponential, Gamma (known shape), Categorical and MvNormal (known covariance).

References
----------
.. [1] Yildirim, S. and Ermis, B. (2019). Exact MCMC with differentially private moves.
   Statistics and Computing 29(5), 947-963. doi:10.1007/s11222-018-9847-x;
   arXiv:1604.07177, Sec. 3.3 (exponential families), eq. (7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.pytensorf import join_nonshared_inputs
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors

from pymc_dp.kernels.expfam import (
    EXPFAM_FAMILIES,
    ExpFamily,
    centred_clip_sum,
    deviation_counts_above,
)
from pymc_dp.records.errors import ModelNotSupportedError
from pymc_dp.records.graph_facts import count_records
from pymc_dp.records.graph_facts import data_nodes as _data_nodes
from pymc_dp.records.graph_facts import observed_data as _observed_data
from pymc_dp.records.rewrite import UNSAFE_REWRITES
from pymc_dp.records.rewrite import drop_shape_pins as _drop_shape_pins
from pymc_dp.records.rewrite import inline_op_from_graph as _inline_op_from_graph
from pymc_dp.records.store import node_shape as _node_shape
from pymc_dp.records.store import node_value as _node_value

__all__ = [
    "SUPPORTED_FORMS",
    "ExpFamilyModel",
    "ExpFamilyStructure",
    "find_expfam_structure",
]

#: The model forms DPExpFamilyPenalty accepts (quoted in every refusal).
SUPPORTED_FORMS = (
    "DPExpFamilyPenalty supports one observed variable with i.i.d. records of one of these "
    "forms: Normal(mu, sigma) with mu = a + X @ b affine in covariates (one or more covariate "
    "arrays with one row per record, or none) and sigma a parameter or constant that does not "
    "depend on the covariates; without covariates: Normal, Bernoulli, Binomial (known number "
    "of trials), Poisson, Exponential, Gamma (known shape alpha), Categorical, MvNormal "
    "(known covariance)"
)

# RandomVariable op class -> family name (same ops on PyMC 5.x and 6.x)
_OPS = {
    "NormalRV": "normal_linear",
    "BernoulliRV": "bernoulli",
    "BinomialRV": "binomial",
    "PoissonRV": "poisson",
    "ExponentialRV": "exponential",
    "GammaRV": "gamma",
    "CategoricalRV": "categorical",
    "MvNormalRV": "mvnormal",
}
# names of the op's distribution parameters, in order; "const:" ones must be known constants
_PARAMS = {
    "normal_linear": ("mu", "sigma"),
    "bernoulli": ("p",),
    "binomial": ("const:trials", "p"),
    "poisson": ("mu",),
    "exponential": ("scale",),
    "gamma": ("const:shape", "scale"),
    "categorical": ("p",),
    "mvnormal": ("mu", "const:cov"),
}


def _refuse(reason: str) -> ModelNotSupportedError:
    return ModelNotSupportedError(f"{reason}. {SUPPORTED_FORMS}")


def _fake_response(family: str, m: int, trailing: tuple, constants: Mapping[str, Any]):
    """Data-free stand-in responses inside the support of the family."""
    k = np.arange(m)
    if family == "bernoulli":
        return k % 2
    if family == "binomial":
        return k % (int(constants["trials"]) + 1)
    if family == "poisson":
        return (3 * k) % 7
    if family == "categorical":
        return k % int(constants["n_categories"])
    if family in ("exponential", "gamma"):
        return 0.4 + 0.37 * k
    base = np.random.default_rng(20260519).normal(size=(m, *trailing))
    return base


@dataclass(frozen=True)
class _StatSumChunk:
    """``(sum_i clip_C(T(x_i)), n_clipped, finite)`` of one chunk ``(y, *covariates)``, or
    with a ``centre`` the clipped whitened deviations' sum (`centred_clip_sum`).

    Runs where the chunk lives (picklable: the family travels by name) and returns the
    chunk's clipped sum, the number of clipped records (0 unless ``counts``: computed without
    noise) and one bit, whether every statistic was finite (a non-finite chunk contributes
    0 and the driver refuses the data).
    """

    family: str
    constants: tuple
    counts: bool
    #: the centre ``c`` the deviations are taken from (None: ``c = 0``, the uncentred clip)
    centre: tuple | None = None
    #: public whitening ``w`` of the deviations (None: none) and whether to sum ``|w (T - c)|``
    scale: tuple | None = None
    absolute: bool = False
    outer: bool = False

    def stats(self, y, xs) -> np.ndarray:
        y = np.asarray(y)
        X = (
            np.column_stack([np.asarray(a, dtype=float).reshape(y.shape[0], -1) for a in xs])
            if xs
            else None
        )
        return EXPFAM_FAMILIES[self.family].stats(y, X, **dict(self.constants))

    def __call__(self, bound, y, *xs) -> tuple[np.ndarray, int, bool]:
        T = self.stats(y, xs)
        if not np.all(np.isfinite(T)):
            w = self.scale
            rows = T.shape[1] if w is None or np.ndim(w) == 1 else len(w)
            return np.zeros(rows**2 if self.outer else rows), 0, False
        c = None if self.centre is None else np.asarray(self.centre, dtype=float)
        w = None if self.scale is None else np.asarray(self.scale, dtype=float)
        s, k = centred_clip_sum(T, c, bound, w, self.absolute, self.outer)
        return s, int(k) if self.counts else 0, True


@dataclass(frozen=True)
class _DeviationCountChunk(_StatSumChunk):
    """``(counts above each grid bound of ||T(x_i) - c||, 0, finite)`` of one chunk: the
    exact query of the DP quantile of the deviations (never published without noise)."""

    def __call__(self, grid, y, *xs) -> tuple[np.ndarray, int, bool]:
        T = self.stats(y, xs)
        grid = np.asarray(grid, dtype=float)
        if not np.all(np.isfinite(T)):
            return np.zeros(grid.size, dtype=np.int64), 0, False
        w = None if self.scale is None else np.asarray(self.scale, dtype=float)
        return deviation_counts_above(T, np.asarray(self.centre, dtype=float), grid, w), 0, True


def _as_tuple(a) -> tuple | None:
    """A public vector or matrix as (nested) tuples: picklable, shipped with the chunk."""
    if a is None:
        return None
    a = np.asarray(a, dtype=float)
    return tuple(a) if a.ndim == 1 else tuple(map(tuple, a))


def _add_stat_sums(acc: tuple, part: tuple) -> tuple:
    return acc[0] + part[0], acc[1] + part[1], acc[2] and part[2]


@dataclass
class ExpFamilyStructure:
    """Data-free structure of a supported model (before compiling the parameter functions).

    Attributes
    ----------
    family : ExpFamily
    n_records : int
    response_name : str
        Name of the observed variable.
    covariate_names : list of str
        Names of the covariate data arrays (``pm.Data`` names; ``"X"`` for unnamed constants).
    """

    family: ExpFamily
    n_records: int
    response_name: str
    covariate_names: list[str]
    _model: Any = field(repr=False)
    _rv: Any = field(repr=False)
    _y_node: Any = field(repr=False)
    _x_nodes: list = field(repr=False)
    _params: dict = field(repr=False)

    # -- data-free: the covariates in the user's terms -----------------------------------------
    def indexing_covariates(self) -> dict[str, tuple[str | None, int | None]]:
        """The covariates that index a vector (a categorical predictor written ``a[idx]``):
        ``{covariate name: (name of the indexed vector or None, its length or None)}``.

        Data-free (the graph of the mean and the shapes of the parameters): an integer
        array with one row per record that is an index of an advanced indexing operation.
        """
        from pytensor.tensor.subtensor import AdvancedSubtensor

        try:
            from pytensor.tensor.subtensor import AdvancedSubtensor1
        except ImportError:  # PyTensor 3.x: one AdvancedSubtensor op
            AdvancedSubtensor1 = AdvancedSubtensor

        mu = self._params.get("mu")
        if mu is None:
            return {}
        out: dict[str, tuple[str | None, int | None]] = {}
        for v in ancestors([mu]):
            node = v.owner
            if node is None or not isinstance(node.op, (AdvancedSubtensor, AdvancedSubtensor1)):
                continue
            reach = set(ancestors(node.inputs[1:]))
            for name, x in zip(self.covariate_names, self._x_nodes, strict=True):
                if x in reach and name not in out:
                    out[name] = (node.inputs[0].name, self._length_of(node.inputs[0]))
        return out

    def _length_of(self, var) -> int | None:
        """The length of a parameter vector (public: its shape at the model's initial point)."""
        static = var.type.shape[0] if var.ndim >= 1 else None
        if static is not None:
            return int(static)
        try:
            from pymc_dp import callscope

            model = self._model
            (graph,) = model.replace_rvs_by_values([var.shape[0]])
            ip = callscope.initial_point(model)
            fn = pm.pytensorf.compile(model.value_vars, graph, on_unused_input="ignore")
            return int(fn(**{v.name: ip[v.name] for v in model.value_vars}))
        except Exception:  # noqa: BLE001 - the length is only for the message
            return None

    def unnamed_covariates(self) -> list[str]:
        """The covariates written into the model as numpy arrays (no ``pm.Data`` name to
        declare a range by), each described by its dtype and number of dimensions."""
        return [
            f"{x.dtype}, {x.ndim}-d"
            for x in self._x_nodes
            if not x.name or not isinstance(x, SharedVariable)
        ]

    # -- data reads ---------------------------------------------------------------------------
    def _arrays(self) -> tuple[np.ndarray, list[np.ndarray]]:
        return _node_value(self._y_node), [_node_value(x) for x in self._x_nodes]

    def check_data_finite(self, chunk_size: int = 1_000_000) -> None:
        """Refuse non-finite data (NaN, +-inf) in the response or a covariate.

        Reads the data once; the outcome is one bit for the analyst who runs the sampler. The
        error names no record, count or value.
        """
        y, xs = self._arrays()
        for a in (y, *xs):
            if not np.issubdtype(a.dtype, np.inexact):
                continue
            for start in range(0, a.shape[0], chunk_size):
                if not np.all(np.isfinite(a[start : start + chunk_size])):
                    raise ValueError(
                        "the observed data (or a covariate array with one row per record) "
                        "contains NaN or infinite values; DPExpFamilyPenalty needs complete, "
                        "finite data: drop or impute those records before sampling"
                    )

    # -- compile ------------------------------------------------------------------------------
    def compile(
        self,
        vars: Sequence,
        initial_point: dict[str, np.ndarray],
        shared: dict,
        compile_kwargs: dict | None = None,
    ) -> ExpFamilyModel:
        """Compile ``theta -> (eta, A)`` for the flat vector of ``vars`` and verify it.

        ``shared`` maps the value variables this step does not sample to the shared variables
        the step updates (as in `ArrayStepShared`).
        Verification uses data-free stand-in records only.
        """
        model, fam = self._model, self.family.name
        ck = dict(compile_kwargs or {})
        names = _PARAMS[fam]
        raw = [self._params[nm.removeprefix("const:")] for nm in names]
        # PyMC's own log-density of one batch of stand-in responses (a symbolic value, so that
        # no function of the observed data is folded into a constant)
        y_node = self._y_node
        yb = pt.tensor(dtype=self._rv.dtype, shape=(None, *y_node.type.shape[1:]), name="y_fake")
        graphs = model.replace_rvs_by_values([*raw, pm.logp(self._rv, yb)])
        ll = graphs.pop()
        outs, x = join_nonshared_inputs(initial_point, [*graphs, ll], vars, shared)
        graphs, ll = list(outs[:-1]), outs[-1]
        # known constants: no dependence on the parameters
        constants: dict[str, Any] = {}
        for nm, g in zip(names, graphs, strict=True):
            if nm.startswith("const:"):
                key = nm.removeprefix("const:")
                if x in ancestors([g]) or _data_nodes(g, self.n_records, set()):
                    raise _refuse(
                        f"the {key!r} of the {type(self._rv.owner.op).__name__[:-2]} likelihood "
                        "depends on the parameters or the data; it must be a known constant"
                    )
                constants[key] = np.asarray(pm.pytensorf.compile([], g, **ck)())
        if fam == "binomial":
            t = np.unique(constants["trials"])
            if t.size != 1 or t[0] < 1 or float(t[0]) != int(t[0]):
                raise _refuse("the number of Binomial trials must be one known integer >= 1")
            constants["trials"] = int(t[0])
        if fam == "gamma":
            s = np.unique(constants["shape"])
            if s.size != 1 or not (np.isfinite(s[0]) and s[0] > 0):
                raise _refuse("the Gamma shape alpha must be one known number > 0")
            constants["shape"] = float(s[0])
        if fam == "mvnormal":
            cov = np.asarray(constants.pop("cov"), dtype=float)
            if cov.ndim > 2:
                if cov.shape[0] != 1:
                    raise _refuse("the MvNormal covariance must be one known matrix")
                cov = cov.reshape(cov.shape[-2:])
            constants["precision"] = np.linalg.inv(cov)
        if fam == "categorical":
            K = graphs[0].type.shape[-1]
            if K is None:
                K = int(np.shape(_initial_point_eval(graphs[0], x, initial_point, vars, ck))[-1])
            constants["n_categories"] = int(K)

        # covariates -> batch inputs
        xb = [
            pt.tensor(dtype=n.dtype, shape=(None, *n.type.shape[1:]), name=f"cov{i}")
            for i, n in enumerate(self._x_nodes)
        ]
        trailing = [tuple(int(s) for s in _node_shape(n)[1:]) for n in self._x_nodes]
        k = int(sum(int(np.prod(t)) for t in trailing))
        free = [nm for nm in names if not nm.startswith("const:")]
        free_graphs = [
            g for nm, g in zip(names, graphs, strict=True) if not nm.startswith("const:")
        ]
        free_graphs = [
            _drop_shape_pins(
                clone_replace(
                    _drop_shape_pins(g),
                    replace=dict(zip(self._x_nodes, xb, strict=True)),
                    rebuild_strict=False,
                )
            )
            for g in free_graphs
        ]
        f_params = pm.pytensorf.compile([x, *xb], free_graphs, on_unused_input="ignore", **ck)

        def split_cols(M: np.ndarray) -> list[np.ndarray]:
            out, c = [], 0
            for node, t in zip(self._x_nodes, trailing, strict=True):
                w = int(np.prod(t))
                out.append(M[:, c : c + w].reshape(M.shape[0], *t).astype(node.dtype))
                c += w
            return out

        design = split_cols(np.vstack([np.zeros((1, k)), np.eye(k)]))
        fm = ExpFamilyModel(
            structure=self,
            constants=constants,
            f_params=f_params,
            free_names=free,
            design=design,
            n_covariates=k,
            ndim=int(x.type.shape[0]) if x.type.shape[0] is not None else None,
        )
        fm._verify(x, ll, yb, xb, split_cols, initial_point, vars, ck)
        return fm


@dataclass(frozen=True)
class _Passes:
    """`pymc_dp.kernels.expfam.StatPasses` for an `ExpFamilyModel` (no counts)."""

    fm: ExpFamilyModel
    chunk_size: int
    store: Any

    def clipped_stat_sum(self, bound: float) -> np.ndarray:
        return self.fm.clipped_stat_sum(bound, self.chunk_size, store=self.store, counts=False)[0]

    def deviation_counts(self, centre, grid, scale) -> np.ndarray:
        return self.fm.deviation_counts(
            centre, grid, self.chunk_size, scale=scale, store=self.store
        )

    def centred_clip_sum(self, centre, bound, *, scale=None, absolute=False, outer=False):
        return self.fm.centred_clip_sum(
            centre,
            bound,
            self.chunk_size,
            scale=scale,
            absolute=absolute,
            outer=outer,
            store=self.store,
            counts=False,
        )[0]


def _initial_point_eval(graph, x, initial_point, vars, ck):
    q0 = np.concatenate([np.ravel(initial_point[v.name]) for v in vars])
    return pm.pytensorf.compile([x], graph, on_unused_input="ignore", **ck)(q0.astype(x.dtype))


class ExpFamilyModel:
    """A compiled exponential-family likelihood: ``q -> (eta, A)`` and the statistic pass.

    Built by `ExpFamilyStructure.compile`. ``q`` is the flat vector of the step's value
    variables in the transformed space PyMC's step methods work in.

    Attributes
    ----------
    family : ExpFamily
    n_records : int
    stat_dim : int
        Length of ``T(x_i)``.
    constants : dict
        Known constants of the likelihood (trials, Gamma shape, precision, categories).
    """

    def __init__(
        self,
        *,
        structure: ExpFamilyStructure,
        constants: dict,
        f_params,
        free_names: list[str],
        design: list[np.ndarray],
        n_covariates: int,
        ndim: int | None,
    ) -> None:
        self.structure = structure
        self.family: ExpFamily = structure.family
        self.n_records = structure.n_records
        self.constants = constants
        self._f = f_params
        self._free = free_names
        self._design = design
        self.n_covariates = n_covariates
        self.ndim = ndim
        fake = _fake_response(self.family.name, 2, self._y_trailing(), constants)
        self.stat_dim = int(
            self.family.stats(fake, np.zeros((2, n_covariates)), **constants).shape[1]
        )

    def _y_trailing(self) -> tuple:
        return tuple(int(s) for s in _node_shape(self.structure._y_node)[1:])

    # -- data-free: natural parameters ----------------------------------------------------------
    def params(self, q: np.ndarray, design: list[np.ndarray] | None = None) -> dict[str, Any]:
        """The likelihood's free parameters at ``q`` (never reads the data)."""
        vals = self._f(q, *(self._design if design is None else design))
        out = dict(zip(self._free, [np.asarray(v, dtype=float) for v in vals], strict=True))
        fam = self.family.name
        if fam == "normal_linear":
            mu = np.broadcast_to(out["mu"].reshape(-1), (self.n_covariates + 1,))
            sigma = out["sigma"].reshape(-1)
            return {"w": np.concatenate([[mu[0]], mu[1:] - mu[0]]), "sigma": float(sigma[0])}
        if fam == "categorical":
            return {"p": out["p"].reshape(-1, out["p"].shape[-1])[0]}
        if fam == "mvnormal":
            return {"mu": out["mu"].reshape(-1, out["mu"].shape[-1])[0]}
        return {k: float(v.reshape(-1)[0]) for k, v in out.items()}

    def natural(self, q: np.ndarray) -> tuple[np.ndarray, float]:
        """``(eta(q), A(q))``: natural parameters and per-record log-normaliser at ``q``."""
        return self.family.natural(**self.params(q), **self.constants)

    # -- data-free: the clip bound from public bounds ------------------------------------------
    def box_pairs(self, data_bounds: Mapping[str, Any] | None):
        """The declared box as ``(y_lo, y_hi)`` and ``(x_lo, x_hi)`` (one entry per covariate
        column, ``None`` without covariates or without the response's range); validated as in
        `stat_bound_from_box` (data-free)."""
        bounds = dict(data_bounds or {})
        s = self.structure
        y_keys = {"y", *self.record_names()[0]}
        x_keys = {"X", *s.covariate_names}
        unknown = sorted(set(bounds) - y_keys - x_keys)
        if unknown:
            raise ValueError(
                f"data_bounds has unknown keys {unknown}; use 'y' (or {s.response_name!r}) for "
                "the response"
                + (f" and 'X' (or one of {s.covariate_names}) for covariates" if x_keys else "")
            )

        def box(key_set, trailing) -> tuple[np.ndarray, np.ndarray] | None:
            keys = [k for k in key_set if k in bounds]
            if not keys:
                return None
            lo_hi = bounds[keys[0]]
            try:
                lo, hi = (np.asarray(v, dtype=float) for v in lo_hi)
                lo, hi = np.broadcast_to(lo, trailing), np.broadcast_to(hi, trailing)
            except (TypeError, ValueError):
                raise ValueError(
                    f"data_bounds[{keys[0]!r}] must be a pair (lo, hi) of numbers or arrays "
                    "matching one record"
                ) from None
            if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo <= hi)):
                raise ValueError(f"data_bounds[{keys[0]!r}] must be finite with lo <= hi")
            return lo, hi

        y_box = box(y_keys, self._y_trailing())
        x_box = None
        if self.n_covariates:
            los, his = [], []
            for node_name, node in zip(s.covariate_names, s._x_nodes, strict=True):
                t = tuple(int(v) for v in _node_shape(node)[1:])
                b = box({node_name}, t)
                if b is None:
                    b = box({"X"}, t)
                if b is None:
                    raise ValueError(
                        "data_bounds must give the covariate range ('X': (lo, hi), or per "
                        f"covariate {s.covariate_names}) to bound T(x_i); or pass "
                        "stat_clip_bound. Choose the bounds from knowledge of the data "
                        "source, not from the data"
                    )
                los.append(b[0].ravel())
                his.append(b[1].ravel())
            x_box = (np.concatenate(los), np.concatenate(his))
        return y_box, x_box

    def stat_bound_from_box(self, data_bounds: Mapping[str, Any] | None) -> float:
        """L2 bound ``C`` on ``T(x_i)`` for data inside the public box ``data_bounds``.

        Keys: ``"y"`` (or the observed variable's name) for the response, ``"X"`` (all
        covariates) or a covariate's ``pm.Data`` name; values ``(lo, hi)`` (scalars or arrays
        broadcasting to a row). Families with bounded support (Bernoulli, Binomial,
        Categorical) need no box; a box given for them can only lower the bound.
        """
        fam = self.family
        y_box, x_box = self.box_pairs(data_bounds)
        y_max = None if y_box is None else np.maximum(np.abs(y_box[0]), np.abs(y_box[1]))
        x_max = None if x_box is None else np.maximum(np.abs(x_box[0]), np.abs(x_box[1]))
        support = fam.support_bound(**self.constants) if fam.support_bound is not None else None
        if y_max is None:
            if support is not None:
                return float(support)
            raise ValueError(
                f"data_bounds must give the response range ('y': (lo, hi)) for the "
                f"{fam.name} likelihood, or pass stat_clip_bound. Choose it from knowledge of "
                "the data source, not from the data"
            )
        if fam.stat_bound is None:
            return float(support)
        c = fam.stat_bound(y_max, x_max, **self.constants)
        return float(min(c, support)) if support is not None else float(c)

    def box_midpoint_stats(self, data_bounds: Mapping[str, Any] | None) -> np.ndarray:
        """``T`` of the record at the middle of the public box: a data-free centre."""
        self.stat_bound_from_box(data_bounds)  # validates the box
        bounds = dict(data_bounds or {})
        s = self.structure

        def mid(keys, trailing):
            for k in keys:
                if k in bounds:
                    lo, hi = (np.broadcast_to(np.asarray(v, float), trailing) for v in bounds[k])
                    return (lo + hi) / 2.0
            return None

        y = mid(["y", s.response_name], self._y_trailing())
        if y is None:
            raise ValueError(
                "centre='data_bounds' needs the response range in data_bounds ('y': (lo, hi))"
            )
        xs = [
            mid([name, "X"], tuple(int(v) for v in _node_shape(node)[1:])).ravel()
            for name, node in zip(s.covariate_names, s._x_nodes, strict=True)
        ]
        X = np.concatenate(xs)[None, :] if xs else None
        return np.asarray(self.family.stats(np.asarray(y)[None, ...], X, **self.constants))[0]

    # -- the one data pass --------------------------------------------------------------------
    def _pass(self, chunk, init, arg, chunk_size: int, store):
        """One chunked pass of ``chunk(arg, y, *covariates)`` over the records, summed."""
        if store is not None:
            out = store.map_reduce(chunk, _add_stat_sums, init, args=(arg,))
        else:
            y, xs = self.structure._arrays()
            out = init
            for start in range(0, self.n_records, chunk_size):
                sl = slice(start, start + chunk_size)
                out = _add_stat_sums(out, chunk(arg, y[sl], *(a[sl] for a in xs)))
        if not out[2]:
            raise ValueError(
                "the sufficient statistics of the data are not finite (NaN, infinite or "
                "overflowing values); DPExpFamilyPenalty needs finite data of moderate size"
            )
        return out

    def _chunk(self, kind: type, counts: bool, centre=None, scale=None, *more) -> Any:
        """The chunk function ``kind`` of this model's family and constants (picklable: it
        travels to the records), with the public ``centre`` and ``scale`` as tuples."""
        c = (
            None
            if centre is None
            else tuple(np.asarray(centre, dtype=float).reshape(self.stat_dim))
        )
        constants = tuple(sorted(self.constants.items()))
        return kind(self.family.name, constants, counts, c, _as_tuple(scale), *more)

    def centred_clip_sum(
        self,
        centre: np.ndarray,
        bound: float,
        chunk_size: int = 100_000,
        *,
        scale: np.ndarray | None = None,
        absolute: bool = False,
        outer: bool = False,
        store=None,
        counts: bool = True,
    ) -> tuple[np.ndarray, int]:
        r"""$\sum_i \mathrm{clip}_b(w \odot (T(x_i) - c))$ in one chunked pass.

        ``c`` and ``w`` are public (given, or released DP estimates): the sum has the
        replace-one L2 sensitivity ``2 b``; with no deviation above ``b``,
        ``W^{-1} sum + n c`` is $\sum_i T(x_i)$. ``absolute`` sums ``|W (T - c)|`` (the
        query of the per-coordinate spread), ``outer`` the outer products of the clipped
        whitened deviations (flattened, length ``len(T)^2``: the query of their second
        moment). ``scale`` is a vector ``w`` or a matrix ``W``
        (`pymc_dp.kernels.expfam.whiten`). Returns the sum (never publish it: the input of a
        release) and the number of clipped records (computed without noise, 0 unless
        ``counts``).
        """
        chunk = self._chunk(_StatSumChunk, counts, centre, scale, absolute, outer)
        rows = self.stat_dim if scale is None or np.ndim(scale) == 1 else np.shape(scale)[0]
        size = rows**2 if outer else rows
        S, clipped, _ = self._pass(chunk, (np.zeros(size), 0, True), bound, chunk_size, store)
        return S, int(clipped)

    def deviation_counts(
        self,
        centre: np.ndarray,
        grid: np.ndarray,
        chunk_size: int = 100_000,
        *,
        scale: np.ndarray | None = None,
        store=None,
    ) -> np.ndarray:
        """Numbers of records whose ``||w (T(x_i) - c)||`` exceeds each grid bound (exact:
        the query of the DP quantile, `pymc_dp.kernels.warmstart.noisy_histogram_quantile`)."""
        grid = np.asarray(grid, dtype=float)
        chunk = self._chunk(_DeviationCountChunk, False, centre, scale)
        init = (np.zeros(grid.size, dtype=np.int64), 0, True)
        return self._pass(chunk, init, grid, chunk_size, store)[0]

    def clipped_stat_sum(
        self, bound: float, chunk_size: int = 100_000, *, store=None, counts: bool = True
    ) -> tuple[np.ndarray, int]:
        """``S = sum_i clip_C(T(x_i))`` in one chunked pass, and the number of clipped records.

        The sum is the input of the Gaussian mechanism (never publish it); the count is
        computed without noise (only behind ``nonprivate_diagnostics``; 0 unless
        ``counts``). The chunk sums are added in chunk order. With ``store`` (records on a
        cluster whose arrays are the response and the covariates, in this order: see
        `record_names`) each partition computes its own clipped sum where it lives and
        only the sums reach the driver; otherwise the model's data are read in chunks of
        ``chunk_size``. The error for non-finite statistics names no record, count or value.
        """
        chunk = self._chunk(_StatSumChunk, counts)
        init = (np.zeros(self.stat_dim), 0, True)
        S, clipped, _ = self._pass(chunk, init, bound, chunk_size, store)
        return S, int(clipped)

    def passes(self, chunk_size: int = 100_000, store=None) -> _Passes:
        """The data passes of `pymc_dp.kernels.expfam.private_whitening` over these records
        (chunked, or where the partitions of ``store`` live); exact sums, never published."""
        return _Passes(self, chunk_size, store)

    def record_names(self) -> list[list[str]]:
        """The names of the response and of every covariate array, in the order of
        `clipped_stat_sum` (structure only; no data value is read)."""
        s = self.structure
        out = [[s.response_name]]
        if isinstance(s._y_node, SharedVariable) and s._y_node.name:
            out[0].append(s._y_node.name)
        out += [[name] for name in s.covariate_names]
        return [list(dict.fromkeys(n)) for n in out]

    def record_templates(self) -> list[tuple[np.dtype, tuple[int, ...]]]:
        """Dtype and trailing shape of the response and of every covariate (public)."""
        nodes = [self.structure._y_node, *self.structure._x_nodes]
        return [(np.dtype(node.dtype), tuple(_node_shape(node)[1:])) for node in nodes]

    # -- verification on stand-in records ------------------------------------------------------
    def _verify(self, x, ll, yb, xb, split_cols, initial_point, vars, ck) -> None:
        """Check ``ll(q) - ll(q') = (eta(q) - eta(q'))^T T - (A(q) - A(q'))`` on fake records."""
        s = self.structure
        m = 7
        g = _drop_shape_pins(_inline_op_from_graph(ll))
        g = _drop_shape_pins(
            clone_replace(g, replace=dict(zip(s._x_nodes, xb, strict=True)), rebuild_strict=False)
        )
        g = rewrite_graph(
            g, include=("canonicalize",), exclude=("constant_folding", *UNSAFE_REWRITES)
        )
        g = _drop_shape_pins(g)
        if g.ndim > 1:
            g = pt.sum(g, axis=tuple(range(1, g.ndim)))
        f_ll = pm.pytensorf.compile([x, yb, *xb], g, on_unused_input="ignore", **ck)
        fake_y = _fake_response(s.family.name, m, self._y_trailing(), self.constants)
        fake_y = np.asarray(fake_y).astype(yb.dtype)
        fake_X = np.random.default_rng(7).uniform(-1.5, 1.5, size=(m, self.n_covariates))
        fake_xs = split_cols(fake_X)
        T = self.family.stats(fake_y, fake_X if self.n_covariates else None, **self.constants)
        q0 = np.concatenate([np.ravel(initial_point[v.name]) for v in vars]).astype(x.dtype)
        d = q0.size
        qs = [q0 + 0.05 * (1 + (np.arange(d) * c) % 3) * c for c in (0.0, 1.0, -0.7, 1.9)]
        try:
            lls = [np.asarray(f_ll(q, fake_y, *fake_xs), dtype=float).reshape(-1) for q in qs]
            nat = [self.natural(q) for q in qs]
        except Exception as err:  # noqa: BLE001 - report as an unsupported structure
            raise _refuse(
                "the likelihood could not be evaluated on stand-in records "
                f"({type(err).__name__}); it must separate into one term per record"
            ) from None
        for i in range(1, len(qs)):
            lhs = lls[i] - lls[0]
            rhs = T @ (nat[i][0] - nat[0][0]) - (nat[i][1] - nat[0][1])
            scale = 1.0 + np.abs(lls[i]) + np.abs(lls[0])
            if lhs.shape != (m,) or not np.all(np.abs(lhs - rhs) <= 1e-6 * scale):
                raise _refuse(
                    "the likelihood is not of a supported exponential-family form (checked on "
                    "stand-in records: e.g. the mean is not affine in the covariates, or the "
                    "scale depends on them)"
                )


def find_expfam_structure(model: pm.Model) -> ExpFamilyStructure:
    """Recognise a supported exponential-family likelihood in ``model`` (data-free).

    Raises
    ------
    ModelNotSupportedError
        With a message that names the supported forms.
    """
    n = count_records(model)
    obs = list(model.observed_RVs)
    if len(obs) != 1:
        raise _refuse(f"the model has {len(obs)} observed variables; exactly one is supported")
    rv = obs[0]
    if rv.name.endswith("_observed") and rv.name.removesuffix("_observed") + "_unobserved" in (
        v.name for v in model.free_RVs
    ):
        raise ValueError(
            f"the observed data of {rv.name.removesuffix('_observed')!r} contain missing values "
            "(PyMC imputes them as free variables, which would publish where they are); "
            "DPExpFamilyPenalty needs complete, finite data: drop or impute those records "
            "before sampling"
        )
    op = rv.owner.op
    fam = _OPS.get(type(op).__name__)
    if fam is None:
        raise _refuse(
            f"the likelihood of {rv.name!r} is {type(op).__name__.removesuffix('RV')}, which is "
            "not supported"
        )
    dist_params = list(op.dist_params(rv.owner))
    names = _PARAMS[fam]
    if len(dist_params) != len(names):
        raise _refuse(f"unexpected parametrisation of {type(op).__name__}")
    params = {nm.removeprefix("const:"): p for nm, p in zip(names, dist_params, strict=True)}
    y_node = _observed_data(model, rv)
    if not (isinstance(y_node, SharedVariable) or isinstance(y_node, pt.TensorConstant)):
        raise _refuse(f"the observed values of {rv.name!r} are not a data array")
    y_ndim = 2 if fam == "mvnormal" else 1
    if y_node.ndim != y_ndim:
        raise _refuse(
            f"the observed variable {rv.name!r} must have shape (n,)"
            + (" rows of a vector (n, d)" if fam == "mvnormal" else "")
        )
    free_rvs = set(model.free_RVs)
    for nm, p in zip(names, dist_params, strict=True):
        if nm.startswith("const:") and (
            free_rvs & set(ancestors([p])) or _data_nodes(p, n, {y_node})
        ):
            raise _refuse(
                f"the {nm.removeprefix('const:')!r} of the {type(op).__name__[:-2]} likelihood "
                "depends on the parameters or the data; it must be a known constant"
            )
    free_rv_values = set(model.rvs_to_values.values())
    x_nodes: list = []
    for nm, p in params.items():
        found = [d for d in _data_nodes(p, n, {y_node}) if d not in free_rv_values]
        if found and (fam != "normal_linear" or nm != "mu"):
            raise _refuse(
                f"the {nm!r} of {rv.name!r} depends on arrays with one row per record "
                "(covariates); only the mean of a Normal likelihood may"
            )
        x_nodes += [d for d in found if d not in x_nodes]
    if y_node in ancestors(list(params.values())):
        raise _refuse("a likelihood parameter depends on the observed values themselves")
    cov_names = []
    for i, node in enumerate(x_nodes):
        if node.ndim not in (1, 2):
            raise _refuse("covariate arrays must have shape (n,) or (n, k)")
        cov_names.append(node.name if node.name else ("X" if len(x_nodes) == 1 else f"X{i}"))
    return ExpFamilyStructure(
        family=EXPFAM_FAMILIES[fam],
        n_records=n,
        response_name=rv.name,
        covariate_names=cov_names,
        _model=model,
        _rv=rv,
        _y_node=y_node,
        _x_nodes=x_nodes,
        _params=params,
    )
