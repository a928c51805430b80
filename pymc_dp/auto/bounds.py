"""Public bounds of the data, declared by the user (``data_bounds``).

Bounds are public knowledge (a questionnaire's range, a sensor's limits), never computed
from the data. They are checked against the model's *names* and shapes only: no data value
is read, so a bad declaration fails before anything is touched.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pymc as pm

from pymc_dp.auto.intervals import split_candidates
from pymc_dp.records.graph_facts import imputed_variables

__all__ = ["DerivedBounds", "check_data_bounds", "clip_plan"]

#: Prefix of the label of a data array without a name (internal).
_UNNAMED = "\x00unnamed:"


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
            # a likelihood written as a pm.Potential has no observed variable to bound (found on
            # the issue-26 eighth sweep: a censored survival likelihood in a Potential was told
            # only "known names: []", not that the Potential is the reason)
            potentials = ", ".join(repr(p.name) for p in model.potentials)
            hint = (
                f"; the model's pm.Potential terms ({potentials}) "
                "are not observed variables: write a likelihood as one (e.g. pm.Censored for "
                "censored data, pm.CustomDist with a logp)"
                if model.potentials
                else ""
            )
            if name in imputed_variables(model):
                # found on the same sweep: a masked covariate's bound under its own name was
                # pointed at PyMC's '{name}_observed', which is then refused for its gaps
                hint += (
                    f"; {name!r} has missing values, which PyMC splits into "
                    f"'{name}_observed' and '{name}_unobserved' to impute them: pymc_dp needs "
                    "complete data (drop or impute the incomplete records before building the "
                    "model, by a rule that does not look at the other records)"
                )
            raise ValueError(
                f"data_bounds names {name!r}, which is neither an observed variable nor a "
                f"pm.Data container of the model; known names: {sorted(names)}{hint}"
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


#: Relative margin added to every derived bound: covers the rounding of the interval
#: evaluation (not directed), far below any effect on the noise.
ROUNDING_MARGIN = 1e-6

#: Pieces of each subdivided intermediate (`pymc_dp.auto.intervals.interval_eval_split`).
SPLIT_PIECES = 32

#: Largest number of integer-data combinations enumerated (`DerivedBounds`).
INTEGER_CASES = 16


def _data_names(model: pm.Model, nodes: list) -> list[list[str]]:
    """The names every data node is known by (observed variables, ``pm.Data``); structure."""
    from pytensor.compile.sharedvalue import SharedVariable

    from pymc_dp.records.graph_facts import observed_data

    out = []
    for node in nodes:
        names = [rv.name for rv in model.observed_RVs if observed_data(model, rv) is node]
        if isinstance(node, SharedVariable) and node.name:
            names.append(node.name)
        out.append(list(dict.fromkeys(names)))
    return out


class DerivedBounds:
    """Clip bounds of the per-record log-likelihood from declared data bounds (no data read).

    Bounds the per-record gradient ``g_i(q) = grad_q log p(x_i | q)`` (transformed space, the
    layout of the step methods) and its Hessian ``H_i`` by interval arithmetic over the graph
    of one record (`pymc_dp.auto.intervals.interval_eval`), with every data entry of the
    record in its declared range and ``q`` in a public box (a released point, or a box around
    released values). The result is a true upper bound for every record inside the declared
    bounds: clipping at it clips none of them, so the clip bound costs no privacy (it is a
    function of public declarations and released values). Records outside the bounds are
    still clipped at it: privacy never rests on the declaration.

    For a GLM (``eta_i = x_i . beta + a``, Normal / Bernoulli-logit / Poisson / StudentT) the
    per-coordinate enclosure of ``g_i = v(eta_i, y_i) (1, x_i)`` is ``max |v|`` times the
    range of ``(1, x_i)``: the bound is ``max |v| max ||(1, x)||``, equal to the supremum when
    both maxima fall on the same corner of the box, else an upper bound.

    Parameters
    ----------
    model : pm.Model
    vars : list
        Value variables, in the order of the flat vector ``q``.
    initial_point : dict
        A point of the model (shapes only).
    data_bounds : dict
        Validated ``{name: (low, high)}`` (`check_data_bounds`).

    Attributes
    ----------
    gradient_ok : bool
        Every data node the per-record gradient reads has a declared bound and every
        operation has an interval rule.
    hessian_ok : bool
        The same for the per-record Hessian.
    reason : str
        Why a bound is not available (names of undeclared data, an unsupported operation).
    """

    def __init__(self, model: pm.Model, vars, initial_point: dict, data_bounds: dict) -> None:
        import pytensor
        import pytensor.tensor as pt
        from pytensor.graph.rewriting.utils import rewrite_graph
        from pytensor.graph.traversal import ancestors
        from pytensor.graph.utils import MethodNotDefined

        from pymc_dp.records.graphs import per_record_graphs
        from pymc_dp.records.rewrite import UNSAFE_REWRITES
        from pymc_dp.records.store import node_shape

        graphs = per_record_graphs(model, vars, initial_point)
        self._x = graphs.x
        self.ndim = graphs.ndim
        # simplified graphs (fewer repeated subexpressions: tighter enclosures); no fusion,
        # whose Composite ops have no gradient and no interval rule
        rewrites = {"include": ("canonicalize", "stabilize", "specialize")}
        rewrites["exclude"] = ("fusion", "inplace", *UNSAFE_REWRITES)
        raw = pytensor.grad(graphs.one_record, graphs.x)
        grad = rewrite_graph(raw, **rewrites)
        self._grad, self._hess = grad, None
        self._boxes: dict = {}
        self._splits: dict = {}
        missing: dict[str, list[str]] = {}
        names = _data_names(model, graphs.data_nodes)
        for row, node, known in zip(graphs.rows, graphs.data_nodes, names, strict=True):
            shape = node_shape(node)[1:]
            declared = [data_bounds[k] for k in known if k in data_bounds]
            if declared:
                # several names of one node (an observed pm.Data): the intersection
                low = max(b[0] for b in declared)
                high = min(b[1] for b in declared)
                if low > high:
                    raise ValueError(
                        f"data_bounds declare disjoint ranges for the names {known} of one "
                        "data array; give it one range"
                    )
                if row.dtype.startswith(("int", "uint", "bool")):
                    # integer data take integer values only
                    low, high = math.ceil(low), math.floor(high)
                    if low > high:
                        raise ValueError(
                            f"data_bounds for {known} contain no integer, but the data are "
                            "integers; widen the range"
                        )
                self._boxes[row] = (np.full(shape, float(low)), np.full(shape, float(high)))
            else:
                # an unnamed array: its dtype and number of dimensions (the user's terms)
                missing[row.name] = known or [f"{_UNNAMED}{row.dtype}, {len(shape) + 1}-d"]
        self._missing = missing
        self.reason = ""
        self.gradient_ok = self._check(self._grad, ancestors, "gradient")
        # the per-record Hessian (``d`` symbolic gradients: 62 s of a 468 s call at d = 467,
        # issue 26) only where the gradient has its enclosure: without it there is no
        # Hessian bound either (``hessian_ok`` False, ``reason`` the gradient's)
        self.hessian_ok = False
        if self.gradient_ok:
            no_hessian = ""
            try:
                hess = pt.stack([pytensor.grad(grad[j], graphs.x) for j in range(self.ndim)])
            except (NotImplementedError, MethodNotDefined):
                # a specialised op without a gradient: from the raw one
                try:
                    hess = pt.stack([pytensor.grad(raw[j], graphs.x) for j in range(self.ndim)])
                except (NotImplementedError, MethodNotDefined) as err:
                    # PyTensor cannot differentiate the gradient itself (e.g. the ScalarLoop of
                    # betainc in a hurdle negative binomial's truncation, third sweep): no
                    # Hessian enclosure, so the clips that need one come from DP histograms
                    hess = None
                    no_hessian = (
                        "the per-record Hessian cannot be formed: PyTensor has no gradient for "
                        f"an operation of the per-record gradient ({type(err).__name__}: {err})"
                    )
            # the Hessian as differentiated, not rewritten: on PyTensor 2.38 its rewrites did
            # not finish in minutes on a negative binomial regression's Hessian (issue 26's
            # real-data sweep); a looser enclosure, still sound
            self._hess = hess
            if hess is None:
                self.reason = self.reason or no_hessian
            else:
                self.hessian_ok = self._check(self._hess, ancestors, "Hessian")
        self._graphs_rows = graphs.rows

    def _check(self, out, ancestors, what: str) -> bool:
        from pymc_dp.auto.intervals import IntervalUnsupported

        read = {v for v in ancestors([out]) if getattr(v, "name", None) in self._missing}
        if read:
            labels = sorted({n for v in read for n in self._missing[v.name]})
            named = [x for x in labels if not x.startswith(_UNNAMED)]
            unnamed = [x.removeprefix(_UNNAMED) for x in labels if x.startswith(_UNNAMED)]
            parts = [f"{', '.join(named)} (declare their bounds in data_bounds)"] if named else []
            if unnamed:
                parts.append(
                    f"{len(unnamed)} unnamed array(s) of one row per record "
                    f"({'; '.join(unnamed)}): a numpy array written into the model has no "
                    "name to declare bounds by; wrap it in pm.Data('name', ...)"
                )
            self.reason = f"the per-record {what} reads data without declared bounds: " + (
                "; ".join(parts)
            )
            return False
        try:  # structural: a point of q at 0 is enough to see every operation
            self._eval(out, np.zeros(self.ndim), np.zeros(self.ndim))
        except IntervalUnsupported as err:
            self.reason = f"the per-record {what} has no interval bound: {err}"
            return False
        return True

    def _eval(self, out, q_lo: np.ndarray, q_hi: np.ndarray):
        """The intersection of the enclosures of ``out``: plain, and split at each candidate
        (`pymc_dp.auto.intervals.interval_eval_split`); each is an enclosure, so is their
        intersection."""
        from pymc_dp.auto.intervals import interval_eval, interval_eval_split, split_candidates

        qbox = (np.asarray(q_lo, float), np.asarray(q_hi, float))
        if out not in self._splits:
            self._splits[out] = split_candidates([out], [self._x, *self._boxes])
        acc = None
        for boxes in self._integer_cases():
            boxes = {self._x: qbox, **boxes}
            lo, hi = interval_eval([out], boxes)[0]
            for v in self._splits[out]:
                slo, shi = interval_eval_split([out], boxes, v, SPLIT_PIECES)[0]
                lo, hi = np.maximum(lo, slo), np.minimum(hi, shi)
            acc = (lo, hi) if acc is None else (np.minimum(acc[0], lo), np.maximum(acc[1], hi))
        return acc

    def _integer_cases(self):
        """The data boxes with every small integer-valued scalar input enumerated.

        An integer (or boolean) record entry declared in ``[low, high]`` takes only the
        integers there; when there are at most `INTEGER_CASES` combinations, each is a
        point (a union of enclosures over a cover of the box is an enclosure).
        """
        ints = [
            r
            for r, (lo, hi) in self._boxes.items()
            if r.dtype.startswith(("int", "uint", "bool")) and np.size(lo) == 1
        ]
        values = [np.arange(self._boxes[r][0].item(), self._boxes[r][1].item() + 1) for r in ints]
        if not ints or np.prod([v.size for v in values]) > INTEGER_CASES:
            yield self._boxes
            return
        for combo in itertools.product(*values):
            case = dict(self._boxes)
            for r, v in zip(ints, combo, strict=True):
                point = np.full(np.shape(self._boxes[r][0]), float(v))
                case[r] = (point, point)
            yield case

    def gradient_bound(self, q: np.ndarray, q_hi: np.ndarray | None = None) -> float:
        """An upper bound of ``||g_i(q')||`` over records in the bounds and ``q'`` in the box
        ``[q, q_hi]`` (the point ``q`` without ``q_hi``); ``inf`` when none is finite."""
        from pymc_dp.auto.intervals import interval_eval, interval_eval_split

        def norm(lo, hi) -> float:
            m = np.maximum(np.abs(lo), np.abs(hi))
            return float(np.sqrt(np.sum(m * m)))

        out = self._grad
        qbox = (np.asarray(q, float), np.asarray(q if q_hi is None else q_hi, float))
        if out not in self._splits:
            self._splits[out] = split_candidates([out], [self._x, *self._boxes])
        b = 0.0
        for boxes in self._integer_cases():
            boxes = {self._x: qbox, **boxes}
            lo, hi = interval_eval([out], boxes)[0]
            case = norm(lo, hi)
            # each part of a split: its enclosure intersected with the plain one, and the
            # largest norm over the parts (a cover of the box): tighter than the norm of the
            # union, whose coordinates may come from different parts
            for v in self._splits[out]:
                parts = interval_eval_split([out], boxes, v, SPLIT_PIECES, per_piece=True)
                case = min(
                    case,
                    max(norm(np.maximum(lo, p[0][0]), np.minimum(hi, p[0][1])) for p in parts),
                )
            b = max(b, case)
        return b * (1.0 + ROUNDING_MARGIN) if np.isfinite(b) else float("inf")

    def residual_bound(self, lo: np.ndarray, hi: np.ndarray, anchor: np.ndarray) -> float:
        """An upper bound of ``|l_i(q1) - l_i(q0) - g_i(a) . (q1 - q0)| / ||q1 - q0||``.

        For ``q0, q1`` in the box ``[lo, hi]`` (which must contain the anchor ``a``) and
        records in the bounds. By the mean-value theorem the ratio is ``(g_i(xi) - g_i(a)) .
        u`` for a unit ``u`` and some ``xi`` in the box, so it is at most ``||g_i(xi) -
        g_i(a)||``, bounded per coordinate by the smaller of ``sum_k M_jk w_k`` (``M`` the
        enclosure of ``|H_i|`` over the box, ``w_k`` the largest distance from ``a_k`` to
        the box's edge in coordinate ``k``) and the width of the union of the enclosures of
        ``g_ij`` over the box and at ``a``.
        """
        anchor = np.asarray(anchor, dtype=float)
        if np.any(anchor < lo) or np.any(anchor > hi):
            raise ValueError("residual_bound: the box must contain the anchor")
        hlo, hhi = self._eval(self._hess, lo, hi)
        m = np.maximum(np.abs(hlo), np.abs(hhi))
        w = np.maximum(hi - anchor, anchor - lo)
        with np.errstate(invalid="ignore"):
            by_hessian = np.nan_to_num(m @ w, nan=np.inf)
        glo, ghi = self._eval(self._grad, lo, hi)
        alo, ahi = self._eval(self._grad, anchor, anchor)
        by_range = np.maximum(ghi - alo, ahi - glo)
        per = np.minimum(by_hessian, by_range)
        b = float(np.sqrt(np.sum(per * per)))
        return b * (1.0 + ROUNDING_MARGIN) if np.isfinite(b) else float("inf")


def clip_plan(
    model: pm.Model,
    vars,
    initial_point: dict,
    data_bounds: dict | None,
    q0: np.ndarray,
    derive_clips: bool = False,
    derive_residual: bool = False,
) -> tuple[DerivedBounds | None, dict[str, str]]:
    """Which clip bounds of the automatic mode come from ``data_bounds`` (data-free).

    Returns the `DerivedBounds` (None without ``data_bounds``) and, by clip bound, its
    source: ``"data_bounds"`` or ``"DP histogram"`` with the reason. Reads no data.
    ``derive_clips`` (the gradient clips of the warm start and the control variate) and
    ``derive_residual`` (also the penalty test's) switch the derivation on; the declared
    bounds are checked either way.

    Raises
    ------
    ValueError
        The declared bounds give no finite bound of the per-record gradient at the model's
        initial point ``q0`` (a declared range reaching outside the likelihood's support).
    """
    if not data_bounds:
        return None, {}
    derived = DerivedBounds(model, vars, initial_point, data_bounds)
    if derived.gradient_ok and not np.isfinite(derived.gradient_bound(q0)):
        raise ValueError(
            f"data_bounds {data_bounds} give no finite bound of the per-record log-likelihood "
            "gradient at the model's initial point: a declared range reaches outside the "
            "support of the likelihood (e.g. 0 for a LogNormal or Gamma observation, or a "
            "value where the log-likelihood is -inf). Narrow the range to values the "
            "likelihood accepts, or leave the name out of data_bounds (a DP histogram then "
            "chooses the clip bounds)"
        )
    hist = "DP histogram"
    why = f" ({derived.reason})" if derived.reason else ""
    if not derive_clips:
        # by default the bounds are checked, not used for the clips: why they could not be
        # used would be advice that changes nothing
        grad = hist + " (derive_clips=False)"
    elif not derived.gradient_ok:
        grad = hist + why
    else:
        grad = "data_bounds"
    sources = {"warm-start gradient clip": grad, "control-variate clip": grad}
    if grad == "data_bounds" and derived.hessian_ok and derive_residual:
        sources["penalty-test clip"] = "data_bounds"
    elif grad == "data_bounds" and derived.hessian_ok:
        sources["penalty-test clip"] = hist + " (derive_residual_clip=False)"
    else:
        sources["penalty-test clip"] = grad if grad != "data_bounds" else hist + why
    return derived, sources
