"""What the one-shot path compiles (issue 26): only the per-record functions it calls.

A one-shot call (``method "laplace"``) needs the prior and its gradient, the per-record
log-likelihoods (the separability check) and the per-record gradients (the gradient-norm
counts, the clipped Hessian sums). The clipped log-likelihood-ratio sum (the penalty
tests) and the faster clipped-gradient routes (DP-HMC, DP-SGLD) are compiled on their first
use; a pickled copy (a chain in another process) gets them compiled, as before.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from conftest import oneshot_call

import pymc_dp.records.backend as backend
from pymc_dp.records import build_record_functions
from pymc_dp.records.clipping import LazyFunction


class _Counted:
    """A compiled function that counts its calls."""

    def __init__(self, f) -> None:
        self.f = f
        self.calls = 0

    def __call__(self, *a):
        self.calls += 1
        return self.f(*a)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.f, name)


@pytest.fixture
def compiled(monkeypatch):
    """Every function the records layer compiles (`backend._compile`), call-counted."""
    made: list[_Counted] = []
    orig = backend._compile

    def counting(inputs, outputs, **kw):
        made.append(_Counted(orig(inputs, outputs, **kw)))
        return made[-1]

    monkeypatch.setattr(backend, "_compile", counting)
    return made


def test_one_shot_compiles_only_what_it_calls(logistic_model, compiled):
    model, *_ = logistic_model
    oneshot_call(model)
    unused = [i for i, f in enumerate(compiled) if f.calls == 0]
    assert not unused, f"compiled but never called: functions {unused} of {len(compiled)}"
    # prior and gradient, per-record log-likelihoods, per-record gradients (before issue
    # 26: also the ratio sum, the GLM route, its prepare and the routes' reference: 7)
    assert len(compiled) == 3


def test_routes_and_ratio_compiled_on_first_use_and_for_pickling(logistic_model, compiled):
    model, *_ = logistic_model
    fns = build_record_functions(model, model.value_vars, model.initial_point())[0]
    q0, q1 = np.array([0.1, -0.3, 0.7]), np.array([0.2, -0.1, 0.5])
    counts = fns.grad_norm_counts(q0, np.array([0.1, 1.0, 10.0]))
    assert counts.shape == (3,)
    assert isinstance(fns._c.llr_clipped, LazyFunction) and fns._c.llr_clipped._f is None
    assert not fns._c.grad_clipped.chosen
    n_before = len(compiled)

    copy = pickle.loads(pickle.dumps(fns))
    # pickling compiled both in the original: the copy ships them compiled
    assert fns._c.grad_clipped.chosen and fns._c.llr_clipped._f is not None
    assert copy._c.grad_clipped.chosen and copy._c.llr_clipped._f is not None
    assert copy._c.grad_clipped["route"].name == "GLM fast"
    assert len(compiled) > n_before
    # the copy computes what the original computes
    for bound in (0.05, 1e6):
        s0, k0 = fns.clipped_grad_sum(q1, bound)
        s1, k1 = copy.clipped_grad_sum(q1, bound)
        np.testing.assert_array_equal(s0, s1)
        r0 = fns.clipped_loglik_ratio_sum(q1, q0, bound)
        r1 = copy.clipped_loglik_ratio_sum(q1, q0, bound)
        assert r0[0] == r1[0]
    # and the clipped gradient sum is the definition's (`reference_clipped_sum`)
    G = fns.per_record_grad(q1)
    norms = np.linalg.norm(G, axis=1)
    ref = (G * np.minimum(1.0, 0.05 / norms)[:, None]).sum(axis=0)
    np.testing.assert_allclose(fns.clipped_grad_sum(q1, 0.05)[0], ref, rtol=1e-10)
