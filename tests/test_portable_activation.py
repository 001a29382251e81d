"""The portable torch and native JAX activations against tfgrad's exact kernels.

Every case of tfgrad/testing/cases/activation.py (every float type, body and tail
positions, denormals, NaN payloads), with its own inputs and a fresh seed, runs through
``tfgrad.torch._portable.activation`` (CPU) and ``tfgrad.jax._native.activation`` (CPU,
jitted): each output must be bit-identical (BOUNDS 0).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests import portable
from tests.cases import Case
from tests.cases import activation as cases
from tfgrad._opdefs import get_op_def

SEEDS = (None, 2001)


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "activation")


def _run_case(impl: Any, case: Case) -> list[str]:
    return portable.run_case(impl, case, SEEDS, lambda kw, arrays, attrs, got, want:
                             portable.bit_identical(impl, case.op, got, want))


_SMALL = [c for c in cases.CASES if c.kwargs()[next(iter(c.kwargs()))].size < 5000]


@pytest.mark.parametrize("case", _SMALL, ids=lambda c: c.id)
def test_bit_identical(impl: Any, case: Case) -> None:
    assert not _run_case(impl, case)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.activation")
    for op in {c.op for c in cases.CASES}:
        outs = [o.name for o in get_op_def(op).outputs]
        assert sorted(mod.BOUNDS[op]) == sorted(outs)
        assert set(mod.BOUNDS[op][outs[0]].values()) == {0}, op
