"""The portable torch and native JAX Sum / Mean against tfgrad's exact kernels.

Every case of tfgrad/testing/cases/reduction.py, with its own inputs and fresh ones, runs
through ``tfgrad.torch._portable.reduction`` (CPU) and ``tfgrad.jax._native.reduction``
(CPU, jitted); each output must lie within the module's BOUNDS of ``tfgrad.raw_ops``. The
sums, in the framework's order rather than Eigen's, are also held to a bound that does
not depend on cancellation: the classic bound of any summation order, (n - 1) U sum|terms|
for each of the two orders (divided by the count for Mean, plus its rounding). What is
not a sum (copies, empty inputs) is bit-identical.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from tests import portable
from tests.cases import Case
from tests.cases import reduction as cases
from tfgrad import _distance
from tfgrad.ops import reduction as red

SEEDS = (None, 1001, 1002)  # the case's own inputs, then fresh ones
U = 2.0**-24  # float32 unit roundoff


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "reduction")


def _violations(mod: Any, op: str, arrays: dict[str, np.ndarray], attrs: dict[str, Any],
                got: np.ndarray, want: np.ndarray) -> list[str]:
    bad = []
    bound = mod.BOUNDS[op]["output"]["float32"]
    x = arrays["input"]
    plan = red.make_plan(op, x.shape, tuple(attrs["axis"]), attrs["keep_dims"])
    if plan.kind in ("copy", "empty", "identity"):
        if not _distance.bit_identical(got, want):
            bad.append(f"{plan.kind}: not bit-identical")
        return bad
    if _distance.distance(got, want) > bound:
        bad.append(f"distance {_distance.distance(got, want)} > {bound}")
    rank = x.ndim
    dims = tuple(sorted({(a + rank) % rank for a in attrs["axis"]}))
    with np.errstate(invalid="ignore"):
        terms = np.abs(red.ftz(x).astype(np.float64)).sum(dims, keepdims=attrs["keep_dims"])
        terms = terms.reshape(plan.out_shape) / (plan.count if op == "Mean" else 1)
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    finite = np.isfinite(diff)
    rounding = 2 * max(plan.count - 1, 1) * U * terms + 2 * U * np.abs(want) + 2.0**-126
    if (diff[finite] > rounding[finite]).any():
        bad.append(f"{diff.max()} > 2 (n - 1) U sum|terms|")
    return bad


def _run_case(impl: Any, case: Case, seeds: tuple = SEEDS) -> list[str]:
    return portable.run_case(impl, case, seeds, lambda kw, arrays, attrs, got, want:
                             _violations(impl.mod, case.op, arrays, attrs, got[0], want[0]))


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    assert not _run_case(impl, case)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.reduction")
    assert set(mod.BOUNDS) == {"Sum", "Mean"}
    for op in mod.BOUNDS:
        assert set(mod.BOUNDS[op]) == {"output"}


def test_one_term_off_fails(impl: Any) -> None:
    """A sum with one term left out is caught."""
    case = next(c for c in cases.CASES if c.id == "Sum/outer40x64")
    kwargs = case.kwargs()
    arrays, attrs = portable.split(case.op, kwargs)
    (got,) = impl(case.op, arrays, attrs)
    (want,) = portable.exact(case.op, kwargs)
    assert not _violations(impl.mod, case.op, arrays, attrs, got, want)
    x = arrays["input"]
    k = int(np.argmax(np.abs(x[:, 5])))
    off = got.copy()
    off[5] -= x[k, 5]
    assert _violations(impl.mod, case.op, arrays, attrs, off, want)


def test_mean_divides_not_multiplies() -> None:
    """XLA turns a division by a constant into a multiplication by its reciprocal; the
    native Mean keeps TF's division: exact where the sum is exact (one value per output)."""
    jax = pytest.importorskip("jax")
    mod = portable.runner("jax", "reduction").mod
    x = np.random.default_rng(3).standard_normal((1000, 1, 3)).astype(np.float32)
    x = np.broadcast_to(x, (1000, 1, 3)).copy()
    y = np.asarray(jax.jit(lambda a: mod.Mean(input=a[:, :, :1] * 0 + a[:, :, :1],
                                              axis=(1,), keep_dims=False))(x))
    want = red.ftz(x[:, 0, :1])  # a copy (size-1 axis): nothing divided
    assert _distance.bit_identical(y, want)
    z = np.random.default_rng(4).standard_normal((200, 7)).astype(np.float32)
    z[:, 1:] = 0  # one nonzero term: the sum is exact, the division shows
    got = np.asarray(jax.jit(lambda a: mod.Mean(input=a, axis=(1,), keep_dims=False))(z))
    assert _distance.bit_identical(got, red.ftz(z[:, 0] / np.float32(7)))
