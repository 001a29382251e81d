"""The portable torch and native JAX SquaredDifference, Rsqrt and RsqrtGrad against
tfgrad's exact kernels.

Every small case of tfgrad/testing/cases/cwise.py (every float type, body and tail
positions, denormals, NaNs, broadcasts), with its own inputs and a fresh seed, runs through
``tfgrad.torch._portable.cwise`` (CPU) and ``tfgrad.jax._native.cwise`` (CPU, jitted):
each output within its BOUNDS (0: bit-identical, NaN payloads aside).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from tests import portable
from tests.cases import Case
from tests.cases import cwise as cases
from tfgrad._opdefs import get_op_def

SEEDS = (None, 2001)


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "cwise")


def _ulps(name: str, a: np.ndarray, e: np.ndarray, bound: Any) -> list[str]:
    """Per value, in ulps of the expected value (stricter than _distance.distance's ulps
    of the largest output)."""
    a32, e32 = np.asarray(a, np.float64), np.asarray(e, np.float64)
    with np.errstate(all="ignore"):
        both_nan = np.isnan(a32) & np.isnan(e32)
        ulp = np.abs(np.spacing(e32.astype(e.dtype)).astype(np.float64))
        far = (np.abs(a32 - e32) > bound * ulp) & ~both_nan & (a32 != e32)
    return [f"{name} beyond {bound} ulps"] if far.any() else []


def _run_case(impl: Any, case: Case) -> list[str]:
    return portable.run_case(impl, case, SEEDS, lambda kw, arrays, attrs, got, want:
                             portable.bit_identical(impl, case.op, got, want, _ulps))


_SMALL = [c for c in cases.CASES if max(np.size(v) for v in c.kwargs().values()) < 2000]


@pytest.mark.parametrize("case", _SMALL, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    assert not _run_case(impl, case)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.cwise")
    for op in {c.op for c in cases.CASES}:
        outs = [o.name for o in get_op_def(op).outputs]
        assert sorted(mod.BOUNDS[op]) == sorted(outs)
    assert set(mod.BOUNDS["SquaredDifference"]["z"].values()) == {0}
    assert set(mod.BOUNDS["RsqrtGrad"]["z"].values()) == {0}
