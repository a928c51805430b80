"""Data-free stand-in records and the separability check made on them.

Stand-ins have the dtypes and trailing shapes of the data arrays and nothing else of them:
structural checks (does the likelihood separate by record? does a faster route give the same
clipped sums as the generic one?) run on them before any data value is read.
"""

from __future__ import annotations

import numpy as np

from pymc_dp.records.errors import ModelNotSupportedError

__all__ = ["check_separable", "fake_rows"]


def _fake_rows(arrays: list[np.ndarray], m: int) -> list[np.ndarray]:
    """Data-free stand-in records (same dtypes and trailing shapes) for structural checks.

    The rows are distinct, unsorted and asymmetric, so that no row equals an aggregate of the
    rows (their mean, median, maximum, ...) and no permutation of them is sorted: a likelihood
    that reads such an aggregate, or a neighbouring record, gives a record a different value
    within the group than alone. Float entries lie in (0.1, 0.95) (inside the support of the
    common positive and unit-interval likelihoods); integer and boolean entries are 0 or 1 in
    an asymmetric pattern (valid category and group indices for two or more levels).
    """
    # A fixed irrational-step (golden ratio) sequence: distinct, unsorted entries, none equal
    # to the mean, median or extreme of the rows (tests check this); no data is used.
    fake = []
    for j, a in enumerate(arrays):
        shape = (m, *a.shape[1:])
        k = np.arange(int(np.prod(shape)), dtype=float).reshape(shape) + 7.0 * j
        if np.issubdtype(a.dtype, np.integer) or a.dtype == bool:
            pattern = np.array([1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 1])
            idx = (np.arange(int(np.prod(shape))) + 3 * j).reshape(shape) % pattern.size
            fake.append(pattern[idx].astype(a.dtype))
        else:
            frac = np.mod(0.3 + k * (np.sqrt(5.0) - 1.0) / 2.0 + 0.1 * np.sqrt(k + 2.0), 1.0)
            fake.append((0.1 + 0.85 * frac).astype(a.dtype))
    return fake


def _check_separable(f_ll, q0: np.ndarray, data: list[np.ndarray], n: int) -> None:
    """Check on data-free stand-in records that the likelihood separates by record.

    Record ``i``'s log-likelihood must depend on row ``i`` of the data only. On ``m = 8``
    stand-in records (`_fake_rows`) at three parameter points, the log-likelihoods of
    all records evaluated together are compared with (a) each record evaluated alone and
    (b) the records in reversed order. A likelihood reading an aggregate of the records (mean,
    sum, standard deviation, maximum, a sort, a cumulative sum) or another record (a
    difference of neighbours) fails (a) or (b). No data value is read.
    """
    if not data:
        raise ModelNotSupportedError(
            "could not find the data arrays with one row per record in the likelihood graph"
        )
    m = 8  # even: the median of the rows is not one of them
    fake = _fake_rows(data, m)
    rev = [a[::-1] for a in fake]
    # Three data-free points: the start point and two fixed perturbations of it (at the start
    # point a parameter may be zero and hide a dependence between records).
    offset = 0.05 * (1.0 + np.arange(q0.size)) / q0.size
    points = (q0, q0 + offset, q0 - 0.7 * offset[::-1])
    try:
        together = [np.asarray(f_ll(q.astype(q0.dtype), *fake)) for q in points]
        reversed_ = [np.asarray(f_ll(q.astype(q0.dtype), *rev)) for q in points]
        alone = [
            np.concatenate(
                [
                    np.asarray(f_ll(q.astype(q0.dtype), *[a[i : i + 1] for a in fake]))
                    for i in range(m)
                ]
            )
            for q in points
        ]
    except Exception as err:  # noqa: BLE001 - report as unsupported model structure
        one = (
            " With one record (n = 1) PyTensor treats the length-1 data arrays as broadcastable "
            "scalars, so the record axis cannot be told apart; a DP posterior of one record "
            "is its prior in all but name: use more records"
            if n == 1
            else ""
        )
        raise ModelNotSupportedError(
            "the likelihood does not separate into one term per record (its graph failed on a "
            f"subset of records: {type(err).__name__}); pymc_dp needs i.i.d.-style models whose "
            f"data arrays all have the record axis first.{one}"
        ) from None
    ok = all(
        t.shape == (m,) and a.shape == (m,) and r.shape == (m,)
        for t, a, r in zip(together, alone, reversed_, strict=True)
    )
    ok = ok and all(
        np.allclose(t, a, rtol=1e-9, atol=1e-12, equal_nan=True)
        and np.allclose(t[::-1], r, rtol=1e-9, atol=1e-12, equal_nan=True)
        for t, a, r in zip(together, alone, reversed_, strict=True)
    )
    if not ok:
        raise ModelNotSupportedError(
            "the likelihood does not separate into one term per record; pymc_dp needs models "
            "where record i's log-likelihood depends only on row i of the data (not on an "
            "aggregate of the data such as its mean, nor on other records)"
        )


fake_rows = _fake_rows
check_separable = _check_separable
