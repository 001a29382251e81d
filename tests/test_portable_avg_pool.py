"""The portable torch and native JAX AvgPool / AvgPoolGrad against tfgrad's exact kernels.

Every case of tfgrad/testing/cases/avg_pool.py, with its own inputs and a fresh one, runs
through ``tfgrad.torch._portable.avg_pool`` (CPU) and ``tfgrad.jax._native.avg_pool``
(CPU, jitted); both compute TF's operations in TF's order, so each output must lie within
the module's BOUNDS (0: bit-identical) of ``tfgrad.raw_ops``.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests import portable
from tests.cases import Case
from tests.cases import avg_pool as cases
from tfgrad import _distance, _validate

SEEDS = (None, 1001)  # the case's own inputs, then fresh ones
# JAX compiles each shape anew (seconds with a large window's unrolled offsets): every
# float32 geometry, and each other dtype through its specials case (tests run < 2 min).
CASES = [c for c in cases.CASES
         if ("float32" in c.name and "17x17" not in c.name) or "specials" in c.name
         or c.name.startswith(("empty", "valid_window"))]


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "avg_pool")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    for seed in SEEDS:
        kwargs = case.kwargs(seed)
        arrays, attrs = portable.split(case.op, kwargs)
        (got,) = impl(case.op, arrays, attrs)
        (want,) = portable.exact(case.op, kwargs)
        bound = impl.mod.BOUNDS[case.op]["output"][_validate.dtype_name(want.dtype)]
        assert got.shape == want.shape
        assert _distance.distance(got, want) <= bound, (seed, _distance.distance(got, want))
        if bound == 0:
            assert _distance.bit_identical(got, want), seed


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.avg_pool")
    assert set(mod.BOUNDS) == {"AvgPool", "AvgPoolGrad"}
    for op in mod.BOUNDS:
        assert set(mod.BOUNDS[op]) == {"output"}
