"""The portable torch and native JAX max pooling against tfgrad's exact kernels.

Every case of tfgrad/testing/cases/max_pool.py (ties, NaN, +-inf, signed zeros,
denormals, overlapping windows whose gradients sum, EXPLICIT padding, empty tensors),
with its own inputs and fresh seeds, runs through ``tfgrad.torch._portable.max_pool``
(CPU) and ``tfgrad.jax._native.max_pool`` (CPU, jitted): each output must be
bit-identical (BOUNDS 0). A mutant that sums a pixel's gradients in another order, or
takes the last of tied maxima, must fail.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from tests import portable
from tests.cases import Case
from tests.cases import max_pool as cases
from tfgrad import _distance

SEEDS = (None, 4001)


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "max_pool")


def _run_case(impl: Any, case: Case, seeds: tuple[int | None, ...] = SEEDS) -> list[str]:
    return portable.run_case(impl, case, seeds, lambda kw, arrays, attrs, got, want:
                             portable.bit_identical(impl, case.op, got, want))


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_bit_identical(impl: Any, case: Case) -> None:
    assert not _run_case(impl, case)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.max_pool")
    for op in ("MaxPool", "MaxPoolGrad"):
        assert sorted(mod.BOUNDS[op]) == ["output"]
        assert set(mod.BOUNDS[op]["output"].values()) == {0}, op


def _case(cid: str) -> Case:
    return next(c for c in cases.CASES if c.id == cid)


def test_a_last_maximum_mutant_fails(impl: Any) -> None:
    """Taking ``m <= x`` (the last of tied maxima) must break the overlapping case."""
    if impl.name == "torch":
        import torch

        where = torch.where
    else:
        import jax.numpy as jnp

        where = jnp.where
    calls = {"n": 0}

    def last_max(cond: Any, a: Any, b: Any) -> Any:
        calls["n"] += 1
        return where(cond | (a == b), a, b)

    np_mod = impl.mod.torch if impl.name == "torch" else impl.mod.jnp
    with portable.patched(impl, **{("torch" if impl.name == "torch" else "jnp"): _Where(
            np_mod, last_max)}):
        assert _run_case(impl, _case("MaxPool/float32_3x3s1_same_overlap"), (None,))
    assert calls["n"]


def test_a_reordered_sum_mutant_fails(impl: Any) -> None:
    """Adding a pixel's gradients in the reverse window order must change some bits."""
    if impl.name == "torch":
        import torch

        lib: Any = torch
    else:
        import jax.numpy as jnp

        lib = jnp
    case = _case("MaxPoolGrad/float32_3x3s1_same_overlap")
    kwargs = case.kwargs()
    x = np.zeros_like(kwargs["orig_input"])
    x[:, 1::3, 1::3] = 1.0  # one peak in every 3x3 window: sums of up to 9 gradients
    kwargs["orig_input"] = x
    kwargs["grad"] = (np.random.default_rng(0).standard_normal(kwargs["grad"].shape)
                      * 10.0 ** np.random.default_rng(1).integers(-4, 5, kwargs["grad"].shape)
                      ).astype(np.float32)
    arrays, attrs = portable.split(case.op, kwargs)
    want = portable.exact(case.op, kwargs)[0]
    assert _distance.bit_identical(impl(case.op, arrays, attrs)[0], want)
    # the same sums, in reverse order
    geo = impl.mod._geo(attrs["ksize"], attrs["strides"], attrs["padding"],
                        attrs["explicit_paddings"], arrays["orig_input"].shape)
    g = arrays["grad"]
    rev = np.zeros(arrays["orig_input"].shape, np.float32)
    arg = np.asarray(impl.mod._argmax(lib.asarray(arrays["orig_input"]), geo)).reshape(
        geo.N, -1)
    for n in range(geo.N):
        for i in reversed(range(arg.shape[1])):
            rev[n].reshape(-1)[arg[n, i]] += g[n].reshape(-1)[i]
    assert not _distance.bit_identical(rev, want)


class _Where:
    """A module stand-in whose ``where`` is replaced (the rest forwarded)."""

    def __init__(self, mod: Any, where: Any) -> None:
        self._mod, self.where = mod, where

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mod, name)
