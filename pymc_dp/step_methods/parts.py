"""The parts a DP step is built from: privacy settings and how the records are read.

Every public step takes the same two settings objects, in the manner of PyMC's
``proposal_dist`` and BlackJAX's proposal functions (parts passed in, not threaded through
keyword arguments):

- `PrivacySettings`: the noise (a noise multiplier, or a target ``(epsilon, delta)`` for a
  planned run ``draws``/``tune``/``chains``), the clip bounds, the public data bounds, and
  whether non-private diagnostics may be emitted;
- `LikelihoodSettings`: how the step reads the records (where they live, in what chunks,
  at what temperature, and the declaration that the model's potentials are data-free).

The steps' older keywords (``epsilon=``, ``clip_bound=``, ``tempering=``, ...) are kept as
deprecated aliases for one release: `resolve_parts` folds them into these objects, so that a
step built either way runs the same code (seeded draws bit-identical,
``dev/step_draws.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = [
    "LikelihoodSettings",
    "PrivacySettings",
    "accepted_keywords",
    "from_keywords",
    "require_clip_bound",
    "resolve_parts",
    "to_keywords",
]


@dataclass(frozen=True)
class PrivacySettings:
    r"""How much noise a step adds and to what it is calibrated (data-free settings).

    Give either the noise (``noise_multiplier``) or a target (``epsilon``, ``delta``) with
    the planned run (``draws``, ``tune``, ``chains``, as passed to `pymc.sample`); the
    noise is then calibrated so that the run's epsilon never exceeds the target (warmup
    iterations and every chain included). A step whose iteration makes releases of several
    kinds takes a mapping by kind where one number does not fit (`DPHMC`:
    ``{"llr": ..., "grad": ...}``).

    Parameters
    ----------
    epsilon, delta : float, optional
        Target privacy of the whole planned run. With only a noise multiplier, ``delta`` is
        the delta at which the report states the spend.
    noise_multiplier : float, tuple or mapping, optional
        Noise standard deviation over sensitivity, ``z`` (per release kind where the step
        has several: `DPHMC` ``{"llr": z_l, "grad": z_g}``, `DPFastMH` ``(z_1, z_2)``).
    clip_bound : float or mapping, optional
        The step's clip bound ``b`` (per release kind for `DPHMC`:
        ``{"llr": b_l, "grad": b_g}``; for `DPExpFamilyPenalty` the bound of the centred
        sufficient statistics). Choose it from public knowledge, never from the data.
    data_bounds : mapping, optional
        Public bounds ``{name: (lo, hi)}`` of the observed data (`DPExpFamilyPenalty`: the
        clip bound of its statistics is derived from them).
    draws, tune, chains : int, optional
        The planned run; a chain asked to run longer stops before it reads the data again.
    budget_split : mapping, optional
        How a target is shared among a step's release kinds (`DPHMC`: ``{"grad": f}``, the
        fraction of the privacy-loss parameter spent on gradients; default 0.5).
    nonprivate_diagnostics : bool
        Also emit the ``*_NONPRIVATE`` sampler stats, computed from the data WITHOUT noise
        (not differentially private; the privacy report flags the run).

    Examples
    --------
    >>> privacy = PrivacySettings(epsilon=1.0, delta=1e-5, clip_bound=2.0,
    ...                           draws=500, tune=500, chains=2)
    >>> privacy.plan()
    (500, 500, 2)
    """

    epsilon: float | None = None
    delta: float | None = None
    noise_multiplier: Any = None
    clip_bound: Any = None
    data_bounds: Mapping[str, Any] | None = None
    draws: int | None = None
    tune: int | None = None
    chains: int | None = None
    budget_split: Mapping[str, float] | None = None
    nonprivate_diagnostics: bool = False

    def plan(self) -> tuple[int | None, int | None, int | None]:
        """``(draws, tune, chains)`` as given."""
        return self.draws, self.tune, self.chains

    def of_kind(self, name: str, kind: str, kinds: tuple[str, ...]) -> Any:
        """The value of field ``name`` for release ``kind``: the mapping's entry, or the
        one value shared by every kind. Unknown keys are refused (naming the field)."""
        value = getattr(self, name)
        if not isinstance(value, Mapping):
            return value
        unknown = sorted(set(value) - set(kinds))
        if unknown:
            raise ValueError(
                f"PrivacySettings {name}: unknown release kinds {unknown}; this step's are "
                f"{list(kinds)}"
            )
        return value.get(kind)


@dataclass(frozen=True)
class LikelihoodSettings:
    """How a step reads the records (data-free settings).

    Parameters
    ----------
    records : pymc_dp.distributed.DaskRecords, optional
        The records on a Dask cluster (default: the model's data, in memory).
    chunk_size : int, optional
        Records per call of the compiled likelihood (bounded memory for large ``n``).
    tempering : float
        Likelihood temperature ``T`` (Räisä 2021, Sec. 3.2): the step targets
        ``p(theta) prod_i p(x_i | theta)^(1/T)``.
    data_free_potentials : bool
        Declare that every ``pm.Potential`` of the model is free of the data.
    """

    records: Any = None
    chunk_size: int | None = None
    tempering: float = 1.0
    data_free_potentials: bool = False


_LIKELIHOOD_FIELDS = tuple(f.name for f in fields(LikelihoodSettings))
#: keywords of every step that are fields of the two settings objects (same name)
_COMMON = {
    **{k: ("privacy", k, None) for k in ("epsilon", "delta", "draws", "tune", "chains")},
    "nonprivate_diagnostics": ("privacy", "nonprivate_diagnostics", None),
    **{k: ("likelihood", k, None) for k in _LIKELIHOOD_FIELDS},
}


def _keyword_map(step: type) -> dict[str, tuple[str, str, str | None]]:
    """``old keyword -> (part, field, kind)`` of a step class: the common ones and the
    step's own ``_privacy_keywords`` (``old keyword -> (field, kind or None)``)."""
    own = getattr(step, "_privacy_keywords", {})
    return {**_COMMON, **{k: ("privacy", f, kind) for k, (f, kind) in own.items()}}


def resolve_parts(
    step: type,
    privacy: PrivacySettings | None,
    likelihood: LikelihoodSettings | None,
    keywords: Mapping[str, Any],
    extra: tuple[str, ...] = (),
) -> tuple[PrivacySettings, LikelihoodSettings, dict[str, Any]]:
    """The settings of a step built with ``privacy=`` / ``likelihood=`` and, deprecated,
    the older keywords (folded into the same objects).

    Parameters
    ----------
    step : type
        The step class (its ``_privacy_keywords`` name its own privacy keywords).
    privacy, likelihood : settings objects or None
    keywords : mapping
        The deprecated keywords the constructor received (``**deprecated``).
    extra : tuple of str
        Other deprecated keywords the step folds into its own parts itself; returned.

    Returns
    -------
    (PrivacySettings, LikelihoodSettings, dict)
        The settings, and the ``extra`` keywords given.

    Raises
    ------
    TypeError
        A keyword the step does not take, or a settings argument of the wrong type.
    ValueError
        A setting given both in an object and as a keyword.
    """
    name = step.__name__
    privacy = PrivacySettings() if privacy is None else privacy
    likelihood = LikelihoodSettings() if likelihood is None else likelihood
    if not isinstance(privacy, PrivacySettings):
        raise TypeError(f"{name}: privacy must be a pymc_dp.PrivacySettings; got {privacy!r}")
    if not isinstance(likelihood, LikelihoodSettings):
        raise TypeError(
            f"{name}: likelihood must be a pymc_dp.LikelihoodSettings; got {likelihood!r}"
        )
    table = _keyword_map(step)
    unknown = sorted(k for k in keywords if k not in table and k not in extra)
    if unknown:
        raise TypeError(
            f"{name}() got unexpected keyword arguments {unknown}{_hint(name, unknown)}"
        )
    updates: dict[str, dict[str, Any]] = {"privacy": {}, "likelihood": {}}
    for key, value in keywords.items():
        if key in extra:
            continue
        part, fname, kind = table[key]
        obj = privacy if part == "privacy" else likelihood
        default = next(f.default for f in fields(obj) if f.name == fname)
        current = updates[part].get(fname, getattr(obj, fname))
        if kind is not None:
            if current is not None and not isinstance(current, Mapping):
                raise ValueError(f"{name}: {key} given twice (in privacy= and as a keyword)")
            current = {} if current is None else dict(current)
            if kind in current:
                raise ValueError(f"{name}: {key} given twice (in privacy= and as a keyword)")
            current[kind] = value
            updates[part][fname] = current
            continue
        if not _is_default(current, default):
            raise ValueError(f"{name}: {key} given twice (in {part}= and as a keyword)")
        updates[part][fname] = value
    if updates["privacy"]:
        privacy = replace(privacy, **updates["privacy"])
    read = {f for part, f, _ in table.values() if part == "privacy"}
    unread = [
        f.name
        for f in fields(privacy)
        if f.name not in read and not _is_default(getattr(privacy, f.name), f.default)
    ]
    if unread:
        raise ValueError(f"{name} does not read PrivacySettings {unread}; leave them out")
    if updates["likelihood"]:
        likelihood = replace(likelihood, **updates["likelihood"])
    return privacy, likelihood, {k: v for k, v in keywords.items() if k in extra}


#: Keywords of `pymc_dp.sample` (not of a step) that a step built by hand is often given
_SAMPLE_KEYWORDS = ("data_bounds", "auto_kwargs", "step_kwargs", "random_seed", "cores")
#: Where to read about configuring a step class privately
_AUTO_DOCS = "docs/auto.md, 'A step class without its hyperparameters'"


def _hint(name: str, unknown: list[str]) -> str:
    """What to do instead, for keywords that belong to `pymc_dp.sample`, not to a step."""
    misplaced = [k for k in unknown if k in _SAMPLE_KEYWORDS]
    if not misplaced:
        return ""
    return (
        f": {misplaced} {'is an argument' if len(misplaced) == 1 else 'are arguments'} of "
        f"pymc_dp.sample, not of the step. Pass the class itself, "
        f"pymc_dp.sample(step=pymc_dp.{name}, epsilon=..., delta=..., data_bounds={{...}}), "
        f"and it configures the step privately from the declared bounds (or refuses it, naming "
        f"the step that suits: {_AUTO_DOCS}); or give the step its clip bounds yourself, "
        f"privacy=pymc_dp.PrivacySettings(clip_bound=..., ...), chosen from public knowledge"
    )


def require_clip_bound(step: type, value: Any, name: str = "clip_bound") -> float:
    """The step's clip bound ``value``, checked positive; a clear error where none is given.

    Parameters
    ----------
    step : type
        The step class (named in the message).
    value : float or None
        The clip bound the settings give for this release kind.
    name : str
        The keyword of this clip bound (``llr_clip_bound`` for `DPHMC`'s ratio test).

    Raises
    ------
    ValueError
        No clip bound (before any data is read): the message says how to give one and how
        to let `pymc_dp.sample` choose it privately instead.
    """
    from pymc_dp._validation import check_positive

    if value is None:
        cls = step.__name__
        example = 'clip_bound={"llr": b_l, "grad": b_g}' if name != "clip_bound" else "clip_bound=b"
        raise ValueError(
            f"{cls}: no {name} given. A step built by hand needs its clip bound from public "
            f"knowledge, never from the data: {cls}(privacy=pymc_dp.PrivacySettings({example}, "
            f"epsilon=..., delta=..., draws=..., tune=..., chains=...)). Or pass the class "
            f"itself, pymc_dp.sample(step=pymc_dp.{cls}, epsilon=..., delta=..., "
            f"data_bounds={{...}}), which configures it privately from the declared bounds of "
            f"the data (or refuses it, naming the step that suits: {_AUTO_DOCS}), or step=None "
            f"for the automatic mode"
        )
    return check_positive(value, name, coerce=True)


def _is_default(value: Any, default: Any) -> bool:
    """Whether a settings field still holds its default (not given)."""
    return value is default or (type(value) in (bool, int, float) and value == default)


def accepted_keywords(step: type) -> set[str]:
    """Every keyword a step's constructor takes: its named parameters and the deprecated
    keywords it folds into its parts (for checks made before a step is built)."""
    import inspect

    params = inspect.signature(step.__init__).parameters
    named = {k for k, p in params.items() if p.kind is not p.VAR_KEYWORD and k != "self"}
    return named | set(_keyword_map(step)) | set(getattr(step, "_deprecated_keywords", ()))


def to_keywords(step: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``privacy=`` and ``likelihood=`` of ``kwargs`` spelled as the step's older keywords
    (the inverse of `from_keywords` for the settings objects): `pymc_dp.sample` checks a
    step class's ``step_kwargs`` by those names before it reads any data."""
    out = {k: v for k, v in kwargs.items() if k not in ("privacy", "likelihood")}
    privacy, likelihood, _ = resolve_parts(
        step, kwargs.get("privacy"), kwargs.get("likelihood"), {}
    )
    for key, (part, fname, kind) in _keyword_map(step).items():
        obj = privacy if part == "privacy" else likelihood
        if kwargs.get(part) is None:
            continue
        value = getattr(obj, fname)
        if kind is not None:
            kinds = tuple(k for p, f, k in _keyword_map(step).values() if f == fname)
            value = obj.of_kind(fname, kind, kinds)
        default = next(f.default for f in fields(obj) if f.name == fname)
        if value is None or _is_default(value, default):
            continue
        if key in out:
            raise ValueError(f"{step.__name__}: {key} given twice (in {part}= and as a keyword)")
        out[key] = value
    return out


def from_keywords(step: type, keywords: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments of ``step`` built from parts, for a call written with the
    older keywords (a migration aid: ``step(**from_keywords(step, old))`` builds the same
    step as ``step(**old)``)."""
    table = _keyword_map(step)
    folded = {k: v for k, v in keywords.items() if k in table}
    rest = {k: v for k, v in keywords.items() if k not in table}
    privacy, likelihood, _ = resolve_parts(step, None, None, folded)
    convert = getattr(step, "_parts_from_keywords", None)
    if convert is not None:
        rest = convert(rest)
    return {"privacy": privacy, "likelihood": likelihood, **rest}
