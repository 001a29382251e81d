"""The portable torch and native JAX MatMul against tfgrad's exact kernels.

Every case of tfgrad/testing/cases/matmul.py, with its own inputs and a fresh seed, runs
through ``tfgrad.torch._portable.matmul`` (CPU) and ``tfgrad.jax._native.matmul`` (CPU,
jitted): the product must lie within the module's BOUNDS (tfgrad._distance: the devices'
GEMMs sum in their own order), with the same zeros, infinities and NaN where the exact
result has them.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests import portable
from tests.cases import Case
from tests.cases import matmul as cases
from tfgrad import _distance

SEEDS = (None, 3001)


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "matmul")


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    for seed in SEEDS:
        kwargs = case.kwargs(seed)
        arrays, attrs = portable.split(case.op, kwargs)
        (got,) = impl(case.op, arrays, attrs)
        (want,) = portable.exact(case.op, kwargs)
        d = _distance.distance(got, want)
        assert d <= impl.mod.BOUNDS["MatMul"]["product"]["float32"], (seed, d)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.matmul")
    assert sorted(mod.BOUNDS) == ["MatMul"] and sorted(mod.BOUNDS["MatMul"]) == ["product"]
