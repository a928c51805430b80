"""Automatic recentring of non-centred hierarchical parameters, and shifting of blocks whose
likelihood reads them relative to their prior location (data-free bijections).

A non-centred hierarchical model writes group effects as ``a = loc + scale * z`` with
``z ~ N(0, 1)``. With many records per group the posterior of ``(loc, log scale, z)`` is a
curved ridge (``z_j = (a_j - loc) / scale``: ``a_j`` is pinned by the data, ``z_j`` moves with
``scale``), and its mode is far from its mean: the density along the ridge carries the
Jacobian ``scale^J`` (Betancourt & Girolami 2015, "Hamiltonian Monte Carlo for hierarchical
models"; Papaspiliopoulos, Roberts & Skold 2007, "A general framework for the
parametrization of hierarchical models"). A Gaussian (Laplace) approximation, and an
independence proposal built from it, then fail. In the *centred* coordinates
``y = T(q)``: ``a = loc + scale * z`` in place of ``z`` the posterior is close to Gaussian.

`find_recentring` reads the model's graph (structure only, no data) for free variables
``z ~ Normal(0, 1)`` that enter the likelihood only through ``scale * z`` (possibly
indexed, e.g. ``tau * z[group]``), ``scale`` a positive scalar free variable (log
transform), optionally inside ``loc + scale * z`` with ``loc`` a scalar free variable, also
where ``loc`` is one term of a longer sum (``b0 + x b + scale * z[g]``, a GLMM's shared
intercept: `_additive_loc`).
`Recentring` is the map ``T``, its inverse, Jacobian and log-determinant
``sum_blocks J_k log scale_k``, compiled from the graph. ``T`` is a bijection whatever the
data: a detection that misses a pattern costs efficiency, never correctness or privacy (the
automatic mode then samples in the model's own coordinates).

A *shifted* block, ``v ~ Normal(loc(w), s)`` with ``loc`` a function of other free
variables ``w`` that the likelihood reads only as ``v - loc(w)`` (written ``v + t(w)``,
``t = -loc`` checked numerically at random points: data-free graphs), is sampled as
``u = v - loc(w)`` (``RecentredBlock.shift``; unit Jacobian). The DP-HMC paper's banana,
``theta2 ~ N(-a theta1^2, s)`` with ``x_2 ~ N(theta2 + a theta1^2, .)``, is the case: its
curved posterior is Gaussian-like in ``(theta1, u)``.

A block already written centred, ``a ~ Normal(loc, scale)``, is found too
(``RecentredBlock.centred``): ``T`` is the identity there, and the automatic mode takes from
it what it takes from a recentred block, the expected curvature of its funnel prior
(`Recentring.curvature_correction`) and the ``loc``/``scale`` the likelihood does not read
(``likelihood_free``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from pymc.logprob.transforms import LogTransform
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor import subtensor as _st
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.random.basic import NormalRV

from pymc_dp import callscope
from pymc_dp.records.graph_facts import count_records, static_leading_length

__all__ = ["RecentredBlock", "Recentring", "find_recentring"]

#: ops a ``z`` may pass through on its way to ``scale * z`` (broadcasting and indexing by
#: the group index: applied after the recentring, they do not change it)
_PASS = tuple(
    op
    for op in (
        DimShuffle,
        _st.Subtensor,
        _st.AdvancedSubtensor,
        getattr(_st, "AdvancedSubtensor1", None),
    )
    if op is not None
)


@dataclass(frozen=True)
class RecentredBlock:
    """``name = (a - loc) / scale``: the block ``name`` is sampled as ``a`` (names only)."""

    name: str
    scale: str
    loc: str | None
    #: names among ``scale``/``loc`` that the likelihood reads only through this pattern
    #: (in the centred coordinates the likelihood does not depend on them at all)
    exclusive: tuple[str, ...] = ()
    #: an already centred block ``name ~ N(loc, scale)``: sampled as it is (the map is the
    #: identity there); its prior is the funnel of a recentred block's, with the same
    #: expected curvature and the same likelihood-free ``loc`` and ``scale``
    centred: bool = False
    #: a shifted block ``name ~ N(loc(w), s)`` that the likelihood reads only as
    #: ``name - loc(w)`` (`_shift_blocks`): sampled as ``u = name - loc(w)``; ``loc`` names
    #: the free variables ``w`` of ``loc``, ``scale`` is empty
    shift: bool = False

    def describe(self) -> str:
        if self.shift:
            return f"{self.name} -> {self.name} - loc({self.loc})"
        if self.centred:
            return f"{self.name} ~ N({self.loc or 0}, {self.scale}) (centred: as is)"
        a = f"{self.scale} * {self.name}"
        return f"{self.name} -> {self.loc} + {a}" if self.loc else f"{self.name} -> {a}"


def _clients(outputs, stop=frozenset()) -> dict:
    """``variable -> [(node, input index)]`` over the graph of ``outputs`` (not through the
    variables in ``stop``)."""
    clients: dict = defaultdict(list)
    seen: set = set()
    stack = list(outputs)
    while stack:
        v = stack.pop()
        node = v.owner
        if node is None or node in seen or v in stop:
            continue
        seen.add(node)
        for i, inp in enumerate(node.inputs):
            clients[inp].append((node, i))
            stack.append(inp)
    return clients


def _strip(v):
    """``v`` without the DimShuffles (broadcasting) around it."""
    while v.owner is not None and isinstance(v.owner.op, DimShuffle):
        v = v.owner.inputs[0]
    return v


def _is_op(node, scalar_op) -> bool:
    return isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, scalar_op)


def _mul_uses(v, clients) -> list | None:
    """Every ``(Mul node, other input)`` through which ``v`` reaches the likelihood, or None
    when ``v`` is also used any other way."""
    out = []
    for node, i in clients.get(v, []):
        if node is None:
            return None
        if isinstance(node.op, _PASS) and i == 0:
            inner = _mul_uses(node.outputs[0], clients)
            if inner is None:
                return None
            out += inner
        elif _is_op(node, ps.Mul) and len(node.inputs) == 2:
            out.append((node, node.inputs[1 - i]))
        else:
            return None
    return out


def _constant(v) -> float | None:
    """The value of a prior parameter that is a constant (an all-equal array read as its
    one value by ``get_underlying_scalar_constant_value``), or None.

    Data never reaches here: it is called on the ``mu`` and ``sigma`` of free variables'
    priors only (`_standard_normal`, `_centred_blocks`). A prior that reads an array of
    ``n`` rows (record data) is refused before any sampling (`check_model_supported`,
    `per_record_graphs`: "the prior ... reads an array with one row per record"), for
    all-equal and mixed values alike (helper 247's probe), so the value read here is a
    number written into the model, not a record's.
    """
    try:
        return float(pt.get_underlying_scalar_constant_value(v))
    except Exception:
        return None


def _standard_normal(rv) -> bool:
    node = rv.owner
    if node is None or not isinstance(node.op, NormalRV):
        return False
    mu, sigma = node.op.dist_params(node)
    return _constant(mu) == 0.0 and _constant(sigma) == 1.0


def find_recentring(model: pm.Model, vars=None, point: dict | None = None) -> list[RecentredBlock]:
    """Non-centred blocks of ``model`` that `Recentring` can recentre (structure only).

    Parameters
    ----------
    model : pm.Model
    vars : list, optional
        The value variables sampled (default: all); a block and its ``scale`` and ``loc``
        must all be among them.
    point : dict, optional
        The model's initial point (``model.initial_point()``, shapes only; computed when
        not given).

    Returns
    -------
    list of RecentredBlock
        Empty when the model has no such block.
    """
    values = list(vars) if vars is not None else list(model.value_vars)
    sampled = {model.values_to_rvs[v] for v in values}
    params = [inp for rv in model.observed_RVs for inp in rv.owner.inputs]
    clients = _clients(params)
    # the likelihood's parameters themselves: a variable that is one is read directly
    for p in params:
        clients[p].append((None, 0))
    found = []
    chain_adds: set = set()  # the Add nodes between a loc found among other terms and its block
    for z in model.free_RVs:
        if z not in sampled or model.rvs_to_transforms.get(z) is not None:
            continue
        if not _standard_normal(z) or z.ndim < 1:
            continue
        uses = _mul_uses(z, clients)
        if not uses:
            continue
        scales = {_strip(other) for _, other in uses}
        if len(scales) != 1:
            continue
        scale = scales.pop()
        if (
            scale not in sampled
            or scale.ndim != 0
            or not isinstance(model.rvs_to_transforms.get(scale), LogTransform)
        ):
            continue
        locs = set()
        for node, _ in uses:
            users = clients.get(node.outputs[0], [])
            add = users[0][0] if len(users) == 1 else None
            if add is None:
                locs.add(None)
                continue
            if add is None or not (_is_op(add, ps.Add) and len(add.inputs) == 2):
                locs.add(None)
                continue
            raw = add.inputs[1 - users[0][1]]
            other = _strip(raw)
            if other in sampled and other.ndim == 0:
                locs.add(other)
            else:  # ``(loc + x b) + scale * z``: a shared intercept among other terms
                loc_in, adds_in = _additive_loc(raw, sampled, clients)
                locs.add(loc_in)
                chain_adds.update(adds_in)
        loc = locs.pop() if len(locs) == 1 else None
        found.append((z, scale, loc, uses))
    names = {z.name for z, *_ in found}
    # a block's scale or loc must not itself be recentred (T stays triangular)
    found = [
        f for f in found if f[1].name not in names and (f[2] is None or f[2].name not in names)
    ]
    # the pattern's own nodes: a scale (loc) read by nothing else is one the likelihood does
    # not depend on in the centred coordinates
    muls = {node for *_, uses in found for node, _ in uses}
    adds = {
        u
        for *_, uses in found
        for node, _ in uses
        for u, _ in clients.get(node.outputs[0], [])
        if u is not None
    } | chain_adds
    blocks = []
    for z, scale, loc, _ in found:
        exclusive = tuple(
            v.name
            for v, own in ((scale, muls), (loc, adds))
            if v is not None and _only_through(v, own, clients)
        )
        blocks.append(
            RecentredBlock(z.name, scale.name, None if loc is None else loc.name, exclusive)
        )
    # the likelihood reads the free variables' values: their priors are not part of it
    direct = _clients(params, stop=frozenset(model.free_RVs))
    for p in params:
        direct[p].append((None, 0))
    blocks += _centred_blocks(model, sampled, direct, {b.name for b in blocks})
    blocks += _shift_blocks(model, sampled, direct, blocks, point)
    return blocks


def _free_inputs(v, free: set, n: int) -> set | None:
    """The free variables the graph of ``v`` reads (the search stops at them), or None when
    it reads anything else that is not a constant, or a constant with one row per record
    (data, as `pymc_dp.records.graph_facts` defines it: a ``pm.Data`` container, a shared
    variable, a numpy array of ``n`` rows)."""
    found = set()
    for x in ancestors([v], blockers=free):
        if x in free:
            found.add(x)
        elif x.owner is None and (
            not isinstance(x, pt.TensorConstant) or (x.ndim >= 1 and static_leading_length(x) == n)
        ):
            return None
    return found


def _negates(t, loc, deps, point: dict, rng: np.random.Generator) -> bool:
    """Whether ``t(w) = -loc(w)`` at a few random points ``w`` (graphs of the free variables
    ``deps`` and constants only: data-free)."""
    ins = [w.type() for w in deps]
    out = clone_replace(t + loc, replace=dict(zip(deps, ins, strict=True)))
    f = pytensor.function(ins, [out, t], on_unused_input="ignore")
    for _ in range(3):
        vals = [0.5 + np.abs(rng.normal(size=np.shape(point[w.name]))) for w in deps]
        err, size = (np.asarray(x, dtype=float) for x in f(*vals))
        if not np.all(np.isfinite(err)) or np.max(np.abs(err)) > 1e-9 * (1 + np.max(np.abs(size))):
            return False
    return True


def _shift_blocks(model: pm.Model, sampled: set, clients, blocks: list, ip=None) -> list:
    """Shifted blocks ``v ~ Normal(loc(w), s)`` that the likelihood reads only as
    ``v - loc(w)``: every use of ``v`` is an addition ``v + t(w)`` with ``t = -loc``
    (checked numerically at random points: both are graphs of free variables and constants,
    no data). ``loc`` a non-constant function of other sampled variables ``w`` (none of them
    a block). In ``u = v - loc(w)`` (unit Jacobian) the likelihood reads ``u`` alone and the
    prior is ``u ~ N(0, s)``: the curved ridge of ``(w, v)`` (the DP-HMC paper's banana,
    ``theta2 ~ N(-a theta1^2, s)``, ``x_2 ~ N(theta2 + a theta1^2, .)``) becomes a
    Gaussian-like posterior (the reparametrisation of Papaspiliopoulos, Roberts & Skold 2007
    applied to a location). Structure only; the map is a bijection whatever the data."""
    free = set(model.free_RVs)
    n = count_records(model)
    taken = {b.name for b in blocks} | {n for b in blocks for n in (b.scale, b.loc) if n}
    point = {rv.name: np.asarray(v) for rv, v in _rv_point(model, ip).items()}
    rng = np.random.default_rng(0)  # data-free: random points of the free variables
    out = []
    for v in _plain_normals(model, sampled, taken):
        node = v.owner
        loc = node.op.dist_params(node)[0]
        deps = _free_inputs(loc, free, n)
        if not deps or any(w not in sampled or w.name in taken for w in deps):
            continue
        uses = clients.get(v, [])
        ts = []
        for use, i in uses:
            if use is None or not (_is_op(use, ps.Add) and len(use.inputs) == 2):
                break
            t = use.inputs[1 - i]
            if _free_inputs(t, free, n) is None or t.type.shape != loc.type.shape:
                break
            ts.append(t)
        if not uses or len(ts) != len(uses):
            continue
        deps = sorted(deps, key=lambda w: w.name)
        if not all(_negates(t, loc, deps, point, rng) for t in ts):
            continue
        out.append(RecentredBlock(v.name, "", ", ".join(w.name for w in deps), shift=True))
        taken |= {v.name, *(w.name for w in deps)}
    return out


def _rv_point(model: pm.Model, ip: dict | None = None) -> dict:
    """``{free RV: a value of its shape}`` (the initial point ``ip``, shapes only)."""
    ip = callscope.initial_point(model) if ip is None else ip
    return {rv: ip[model.rvs_to_values[rv].name] for rv in model.free_RVs}


def _plain_normals(model: pm.Model, sampled: set, taken: set):
    """The sampled free variables ``v ~ Normal(...)`` without a transform that are not
    already part of a block (``taken``: names), in the model's order."""
    for v in model.free_RVs:
        node = v.owner
        if (
            v in sampled
            and v.name not in taken
            and model.rvs_to_transforms.get(v) is None
            and node is not None
            and isinstance(node.op, NormalRV)
        ):
            yield v


def _centred_blocks(model: pm.Model, sampled: set, clients, taken: set) -> list:
    """Already centred blocks ``a ~ Normal(loc, scale)``: ``a`` a sampled vector without a
    transform, ``scale`` a sampled positive scalar (log transform), ``loc`` a sampled scalar
    or the constant 0, neither of them a block. The map leaves them as they are; what the
    automatic mode takes from them is the prior's expected curvature and which of ``loc``
    and ``scale`` the likelihood does not read (structure only)."""
    out = []
    blocks = []
    for a in _plain_normals(model, sampled, taken):
        if a.ndim < 1:
            continue
        node = a.owner
        mu, sigma = (_strip(v) for v in node.op.dist_params(node))
        if (
            sigma not in sampled
            or sigma.ndim != 0
            or not isinstance(model.rvs_to_transforms.get(sigma), LogTransform)
        ):
            continue
        if mu in sampled and mu.ndim == 0:
            loc = mu
        elif _constant(mu) == 0.0:
            loc = None
        else:
            continue
        blocks.append((a, sigma, loc))
    names = {a.name for a, *_ in blocks} | set(taken)
    for a, sigma, loc in blocks:
        if sigma.name in names or (loc is not None and loc.name in names):
            continue
        exclusive = tuple(
            v.name for v in (sigma, loc) if v is not None and _only_through(v, set(), clients)
        )
        out.append(
            RecentredBlock(a.name, sigma.name, None if loc is None else loc.name, exclusive, True)
        )
    return out


def _additive_loc(v, sampled: set, clients) -> tuple:
    """``(loc, adds)``: the one scalar free variable that is a bare addend of the sum ``v``
    (binary Adds read by nothing but the sum above them, e.g. ``b0 + x b`` in ``b0 + x b +
    scale * z[g]``), and the Add nodes from it up to ``v``; ``(None, ())`` when there is no
    such variable or more than one. Every node between them must be read only by the next (a
    sum also read elsewhere would read ``loc`` there).

    Then ``b0 + x b + scale * z[g] = x b + a[g]`` with ``a = b0 + scale * z``: in the centred
    coordinates the likelihood does not read ``b0`` (a GLMM's intercept against its random
    intercepts, a direction no record's gradient has: measured on the Poisson GLMM of
    `bench_auto`, the one-shot strategy's Newton steps then converged linearly along it).
    Structure only.
    """
    found, adds, stack = [], [], [v]
    while stack:
        u = stack.pop()
        if len(clients.get(u, [])) != 1:
            continue  # read elsewhere too: not only inside this sum
        node = u.owner
        if node is not None and isinstance(node.op, DimShuffle):
            adds.append(node)
            stack.append(node.inputs[0])
            continue
        if node is None or not (_is_op(node, ps.Add) and len(node.inputs) == 2):
            continue
        adds.append(node)
        for inp in node.inputs:
            bare = _strip(inp)
            if bare in sampled and bare.ndim == 0:
                found.append(bare)
            else:
                stack.append(inp)
    if len(found) != 1:
        return None, ()
    return found[0], tuple(adds)


def _only_through(v, nodes: set, clients) -> bool:
    """Whether every use of ``v`` (through DimShuffles) in the likelihood is in ``nodes``."""
    for node, i in clients.get(v, []):
        if node is None:
            return False
        if isinstance(node.op, DimShuffle) and i == 0:
            if not _only_through(node.outputs[0], nodes, clients):
                return False
        elif node not in nodes:
            return False
    return True


class Recentring:
    """The bijection ``y = T(q)``: each block ``z`` replaced by ``loc + scale * z`` (a shifted
    block ``v`` by ``v - loc(w)``).

    ``loc`` and ``scale`` do not depend on any recentred block, so ``T`` is triangular:
    ``T^{-1}`` replaces ``a`` by ``(a - loc) / scale`` with ``loc``, ``scale`` read from the
    other coordinates, and ``log |det dT/dq| = sum_k size_k log scale_k``. All of it is
    compiled from the model's graph and reads no data.

    Parameters
    ----------
    model : pm.Model
    blocks : list of RecentredBlock
        From `find_recentring`.
    vars : list
        The value variables, in the order of the flat vector ``q``.
    point : dict
        A point (shapes only), e.g. ``callscope.initial_point(model)``.
    compile_kwargs : dict, optional
        Passed to ``pytensor.function``.
    """

    def __init__(self, model: pm.Model, blocks, vars, point, compile_kwargs=None) -> None:
        from pymc.pytensorf import join_nonshared_inputs

        self.blocks = list(blocks)
        names = [v.name for v in vars]
        sizes = [int(np.prod(np.shape(point[n]), dtype=int)) for n in names]
        starts = dict(zip(names, np.cumsum([0, *sizes[:-1]]).tolist(), strict=True))
        size = dict(zip(names, sizes, strict=True))
        by_name = {rv.name: rv for rv in model.free_RVs}
        exprs = []
        for b in self.blocks:
            if b.shift:  # the prior's location, a graph of other free variables
                rv = by_name[b.name]
                exprs += [pt.constant(1.0), rv.owner.op.dist_params(rv.owner)[0]]
                continue
            exprs.append(by_name[b.scale])
            exprs.append(by_name[b.loc] if b.loc else pt.constant(0.0))
        exprs = model.replace_rvs_by_values(exprs)
        outs, x = join_nonshared_inputs(dict(point), exprs, list(vars))
        y = x.copy()  # a new variable (the map is the identity where no block is recentred)
        logdet = pt.constant(0.0)
        self._slices = []
        self.likelihood_free = np.zeros(sum(sizes), dtype=bool)
        for b in self.blocks:
            for name in b.exclusive:
                vn = model.rvs_to_values[by_name[name]].name
                self.likelihood_free[starts[vn] : starts[vn] + size[vn]] = True
        for k, b in enumerate(self.blocks):
            vb = model.rvs_to_values[by_name[b.name]]
            a0 = starts[vb.name]
            sl = slice(a0, a0 + size[vb.name])
            self._slices.append(sl)
            if b.centred:  # sampled as it is
                continue
            scale, loc = outs[2 * k], outs[2 * k + 1]
            if b.shift:  # u = v - loc(w), unit Jacobian
                y = pt.set_subtensor(y[sl], x[sl] - loc)
                continue
            y = pt.set_subtensor(y[sl], loc + scale * x[sl])
            logdet = logdet + (sl.stop - sl.start) * pt.log(scale)
        # vectorised (one batched graph of the d rows), not a Scan over them: the same
        # numbers, measured 10-fold faster at d = 467 (a Scan step per output row)
        jac = pytensor.gradient.jacobian(y, x, vectorize=True)
        kw = dict(compile_kwargs or {})
        # the map and its log-determinant (every iteration of a chain) apart from the
        # derivatives (the warm start only): the Jacobian is a loop over the d outputs
        self._fwd = pytensor.function([x], [y, logdet], on_unused_input="ignore", **kw)
        self._derivs = pytensor.function(
            [x],
            [pytensor.grad(logdet, x, disconnected_inputs="ignore"), jac],
            on_unused_input="ignore",
            **kw,
        )
        yv = x.type()
        scale_loc = clone_replace(outs, replace={x: yv})
        xr = yv.copy()
        for k, sl in enumerate(self._slices):
            if self.blocks[k].centred:
                continue
            scale, loc = scale_loc[2 * k], scale_loc[2 * k + 1]
            if self.blocks[k].shift:  # loc reads w, which the map leaves as it is
                xr = pt.set_subtensor(xr[sl], yv[sl] + loc)
                continue
            xr = pt.set_subtensor(xr[sl], (yv[sl] - loc) / scale)
        self._inv = pytensor.function([yv], xr, on_unused_input="ignore", **kw)
        # the gradient of the log prior density of y (`pull_back`): ``J^{-T} v`` as the
        # vector-Jacobian product of the inverse map, ``(dT^{-1}/dy)^T v``, O(d), where
        # ``inv(J)`` is O(d^3) (25 ms at d = 467, 6 900 times in one call: issue 26), with the
        # log-determinant's gradient alone (no Jacobian)
        vv = yv.type()
        self._pull = pytensor.function(
            [yv, vv],
            pytensor.grad(pt.sum(xr * vv), yv, disconnected_inputs="ignore"),
            on_unused_input="ignore",
            **kw,
        )
        self._gld = pytensor.function(
            [x],
            pytensor.grad(logdet, x, disconnected_inputs="ignore"),
            on_unused_input="ignore",
            **kw,
        )
        # the recentred blocks' prior in y: sum_k -|a_k - loc_k|^2 / (2 s_k^2) - J_k log s_k
        # (z's N(0, 1) over |det J|), its exact Hessian, and the Jacobian of (a, loc, log s)
        # (the hierarchical blocks only: a shifted block's prior u ~ N(0, s) is no funnel)
        self._funnels = [k for k, b in enumerate(self.blocks) if not b.shift]
        self._d = int(sum(sizes))
        if not self._funnels:
            self._curv = None
            return
        fg = pt.constant(0.0)
        parts = []
        for k in self._funnels:
            sl = self._slices[k]
            scale, loc = scale_loc[2 * k], scale_loc[2 * k + 1]
            a = yv[sl]
            fg = fg - pt.sum((a - loc) ** 2) / (2.0 * scale**2)
            fg = fg - (sl.stop - sl.start) * pt.log(scale)
            parts += [a, pt.atleast_1d(loc + 0.0), pt.atleast_1d(pt.log(scale))]
        self._curv = pytensor.function(
            [yv],
            [
                # a Scan (3.4 s of compile at d = 467, 14 calls a run): vectorised like
                # ``_derivs``, its compile did not finish in 600 s on PyTensor 2.38 (issue 26)
                pytensor.gradient.hessian(fg, yv),
                pytensor.gradient.jacobian(pt.concatenate(parts), yv),
                pt.stack([scale_loc[2 * k] for k in self._funnels]),
            ],
            on_unused_input="ignore",
            **kw,
        )

    def forward_with_log_det(self, q: np.ndarray) -> tuple[np.ndarray, float]:
        """``(T(q), log |det dT/dq|)`` in one evaluation."""
        y, logdet = self._fwd(np.asarray(q, dtype=float))
        return np.asarray(y, dtype=float), float(logdet)

    def forward(self, q: np.ndarray) -> np.ndarray:
        """``y = T(q)``."""
        return self.forward_with_log_det(q)[0]

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """``q = T^{-1}(y)``."""
        return np.asarray(self._inv(np.asarray(y, dtype=float)), dtype=float)

    def log_det_jacobian(self, q: np.ndarray) -> float:
        """``log |det dT/dq|`` at ``q``."""
        return self.forward_with_log_det(q)[1]

    def grad_log_det_jacobian(self, q: np.ndarray) -> np.ndarray:
        """Gradient of `log_det_jacobian` with respect to ``q``."""
        return self.derivatives(q)[0]

    def derivatives(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(grad log |det dT/dq|, dT/dq)`` at ``q`` in one evaluation (`grad_log_det_jacobian`
        and `jacobian` each evaluate both)."""
        gld, jac = self._derivs(np.asarray(q, dtype=float))
        return np.asarray(gld, dtype=float), np.asarray(jac, dtype=float)

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        """``dT/dq`` at ``q``, shape ``(d, d)``."""
        return self.derivatives(q)[1]

    def pull_back(self, q: np.ndarray, y: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``J(q)^{-T} (v - grad log |det J(q)|)`` at ``y = T(q)``: a gradient ``v`` of a
        log density of ``q`` to the gradient in ``y`` of that density over ``|det J|``.

        The same as ``gradient_map(q) @ (v - grad_log_det_jacobian(q))`` up to rounding
        (``J(q)^{-1}`` is the Jacobian of ``T^{-1}`` at ``y``; a vector-Jacobian product of
        the compiled inverse, O(d), where ``inv(J)`` is O(d^3)). Data-free.
        """
        r = np.asarray(v, dtype=float) - np.asarray(self._gld(np.asarray(q, dtype=float)), float)
        return np.asarray(self._pull(np.asarray(y, dtype=float), r), dtype=float)

    def gradient_map(self, q: np.ndarray) -> np.ndarray:
        """``M = J(q)^{-T}``: gradients in ``q`` to gradients in ``y`` (chain rule)."""
        return np.linalg.inv(self.jacobian(q)).T

    def curvature_correction(self, y: np.ndarray) -> np.ndarray:
        """Expected minus exact curvature of the recentred blocks' prior, at ``y``.

        In ``y`` the prior of a block ``a ~ N(loc, s^2)`` is a funnel: where the ``a_j`` sit
        at ``loc`` (the start of a warm start) its exact curvature in ``log s`` is 0 and a
        Newton step falls into ``s -> 0``. Its expectation under the prior, ``2 J`` in
        ``log s``, ``1/s^2`` in each ``a_j``, ``J / s^2`` in ``loc`` (Fisher scoring's
        curvature; Gauss-Newton through the Jacobian of ``(a, loc, log s)``), is positive
        definite and as large everywhere. Added to the exact curvature of the whole prior,
        it replaces the blocks' part by its expectation. Data-free.
        """
        if self._curv is None:
            return np.zeros((self._d, self._d))
        hess, k, scales = self._curv(np.asarray(y, dtype=float))
        blocks = []
        slices = [self._slices[j] for j in self._funnels]
        for sl, s in zip(slices, np.atleast_1d(scales), strict=True):
            j = sl.stop - sl.start
            h = np.zeros((j + 2, j + 2))
            h[:j, :j] = np.eye(j) / s**2
            h[:j, j] = h[j, :j] = -1.0 / s**2
            h[j, j] = j / s**2
            h[j + 1, j + 1] = 2.0 * j
            blocks.append(h)
        size = sum(b.shape[0] for b in blocks)
        expected = np.zeros((size, size))
        at = 0
        for b in blocks:
            expected[at : at + b.shape[0], at : at + b.shape[0]] = b
            at += b.shape[0]
        k = np.asarray(k, dtype=float)
        return k.T @ expected @ k + np.asarray(hess, dtype=float)

    @property
    def slices(self) -> tuple[slice, ...]:
        """Where each of `blocks` sits in the flat vector ``q`` (and ``y``), in the same
        order: ``q[slices[k]]`` is ``blocks[k]``'s value variable. Data-free."""
        return tuple(self._slices)

    def describe(self) -> list[str]:
        """The recentred blocks, e.g. ``["z -> mu + tau * z"]`` (names only)."""
        return [b.describe() for b in self.blocks]
