"""The portable torch and native JAX SparseSoftmaxCrossEntropyWithLogits against tfgrad's
exact kernel: every case of tfgrad/testing/cases/softmax_xent.py, with its own inputs and
fresh ones, within the module's BOUNDS (torch's backprop: bit-identical)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests import portable
from tests.cases import Case
from tests.cases import softmax_xent as cases
from tfgrad import _distance

SEEDS = (None, 1001, 1002)
OP = "SparseSoftmaxCrossEntropyWithLogits"


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "softmax_xent")


def _bad(mod: Any, got: tuple, want: tuple) -> list[str]:
    bad = []
    for name, a, e in zip(("loss", "backprop"), got, want, strict=True):
        bound = mod.BOUNDS[OP][name]["float32"]
        ok = _distance.bit_identical(a, e) if bound == 0 else _distance.distance(a, e) <= bound
        if not ok:
            bad.append(f"{name}: distance {_distance.distance(a, e)} > {bound}")
    return bad


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    bad = []
    for seed in SEEDS:
        kwargs = case.kwargs(seed)
        arrays, attrs = portable.split(case.op, kwargs)
        got = impl(case.op, arrays, attrs)
        bad += [f"seed {seed}: {b}" for b in _bad(impl.mod, got, portable.exact(case.op,
                                                                                kwargs))]
    assert not bad


def test_torch_backprop_is_exact() -> None:
    pytest.importorskip("torch")
    from tfgrad.torch._portable import softmax_xent as mod

    assert mod.BOUNDS[OP]["backprop"] == {"float32": 0}


def test_jax_nan_rows_for_bad_labels() -> None:
    """Off the host nothing can raise: TF's GPU behaviour, NaN rows."""
    jax = pytest.importorskip("jax")
    from tfgrad.jax._native import softmax_xent as mod

    loss, bp = jax.jit(lambda x, y: mod.SparseSoftmaxCrossEntropyWithLogits(
        features=x, labels=y))(np.ones((2, 3), np.float32), np.array([0, 5], np.int32))
    assert not np.isnan(np.asarray(loss)[0]) and np.isnan(np.asarray(loss)[1])
    assert np.isnan(np.asarray(bp)[1]).all()
