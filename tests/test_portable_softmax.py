"""The portable torch and native JAX Softmax against tfgrad's exact kernel: every case of
tfgrad/testing/cases/softmax.py, with its own inputs and fresh ones, within the module's
BOUNDS."""

from __future__ import annotations

from typing import Any

import pytest

from tests import portable
from tests.cases import Case
from tests.cases import softmax as cases
from tfgrad import _distance

SEEDS = (None, 1001)
OP = "Softmax"


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "softmax")


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    bad = []
    for seed in SEEDS:
        kwargs = case.kwargs(seed)
        arrays, attrs = portable.split(case.op, kwargs)
        (got,) = impl(case.op, arrays, attrs)
        (want,) = portable.exact(case.op, kwargs)
        bound = impl.mod.BOUNDS[OP]["softmax"]["float32"]
        if _distance.distance(got, want) > bound:
            bad.append(f"seed {seed}: distance {_distance.distance(got, want)} > {bound}")
    assert not bad
