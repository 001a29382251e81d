"""The portable torch and native JAX BiasAdd / BiasAddGrad / Identity against tfgrad's
exact kernels: every case of tfgrad/testing/cases/bias_add.py (its inputs and a fresh
seed) within the module's BOUNDS (0: bit-identical; the sums in the framework's order)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests import portable
from tests.cases import Case
from tests.cases import bias_add as cases
from tfgrad import _distance
from tfgrad._opdefs import get_op_def

SEEDS = (None, 3001)


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "bias_add")


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    if impl.name == "jax" and "float64" in case.name:
        pytest.skip("float64 needs jax_enable_x64")
    for seed in SEEDS:
        kwargs = case.kwargs(seed)
        arrays, attrs = portable.split(case.op, kwargs)
        got = impl(case.op, arrays, attrs)
        want = portable.exact(case.op, kwargs)
        for name, a, e in zip([o.name for o in get_op_def(case.op).outputs], got, want,
                              strict=True):
            bound = impl.mod.BOUNDS[case.op][name][str(e.dtype)]
            if bound == 0:
                assert _distance.bit_identical(a, e), (seed, name)
            else:
                assert _distance.distance(a, e) <= bound, (seed, name)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.bias_add")
    for op in {c.op for c in cases.CASES}:
        assert sorted(mod.BOUNDS[op]) == sorted(o.name for o in get_op_def(op).outputs)
    assert set(mod.BOUNDS["BiasAdd"]["output"].values()) == {0}
