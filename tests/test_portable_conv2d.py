"""The portable torch and native JAX Conv2D and backprops against tfgrad's exact kernels.

Every case of tfgrad/testing/cases/conv2d.py, with its own inputs and a fresh seed, runs
through ``tfgrad.torch._portable.conv2d`` (CPU) and ``tfgrad.jax._native.conv2d`` (CPU,
jitted). Their sums run in the framework's order, not TF's plan: each output must lie
within the module's BOUNDS of ``tfgrad.raw_ops`` and within a bound that does not depend
on cancellation, 2 (K + 1) U sum|terms| (two orders of a K-term float32 dot product, and
Col2im's adds), with sum|terms| the same convolution of the absolute values in float64.
Empty outputs are exact zeros.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from tests import portable
from tests.cases import Case
from tests.cases import conv2d as cases
from tfgrad import _distance
from tfgrad.ops import conv2d as C

SEEDS = (None, 3001)
U = 2.0**-24


@pytest.fixture(params=["torch", "jax"])
def impl(request: pytest.FixtureRequest) -> Any:
    return portable.runner(request.param, "conv2d")


def _abs_terms(op: str, arrays: dict[str, np.ndarray], attrs: dict[str, Any],
               out_shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """sum|terms| of every output (float64) and the terms' count per output."""
    a = {k: np.abs(v.astype(np.float64)) for k, v in arrays.items()}
    x_shape = out_shape if op == "Conv2DBackpropInput" else arrays["input"].shape
    f_shape = out_shape if op == "Conv2DBackpropFilter" else arrays["filter"].shape
    geo = C.window_of(op, attrs["strides"], attrs["padding"], attrs["explicit_paddings"],
                      attrs["dilations"], tuple(x_shape), tuple(f_shape))
    if op == "Conv2D":
        A = C.im2col(a["input"].astype(np.float32), geo).astype(np.float64)
        A = np.abs(A)  # (the float32 copy of |x| is exact enough for a bound: x 2)
        return 2 * (A @ a["filter"].reshape(geo.F, geo.O)), geo.F
    if op == "Conv2DBackpropFilter":
        A = np.abs(C.im2col(a["input"].astype(np.float32), geo).astype(np.float64))
        return 2 * (A.T @ a["out_backprop"].reshape(-1, geo.O)), geo.N * geo.P
    col = a["out_backprop"].reshape(-1, geo.O) @ a["filter"].reshape(geo.F, geo.O).T
    col = col.reshape(geo.N, geo.OH, geo.OW, geo.KH, geo.KW, geo.C)
    dx = np.zeros((geo.N, geo.H, geo.W, geo.C))
    for i in range(geo.OH):
        for j in range(geo.OW):
            for kh in range(geo.KH):
                for kw in range(geo.KW):
                    r, c = i * geo.sh - geo.pt + kh, j * geo.sw - geo.pl + kw
                    if 0 <= r < geo.H and 0 <= c < geo.W:
                        dx[:, r, c] += col[:, i, j, kh, kw]
    return 2 * dx, geo.O + geo.KH * geo.KW


def _violations(impl: Any, op: str, arrays: dict, attrs: dict, got: np.ndarray,
                want: np.ndarray) -> list[str]:
    if want.size == 0 or not np.any(want != 0):
        return [] if _distance.bit_identical(got, want) else ["zeros differ"]
    bad = []
    d = _distance.distance(got, want)
    if d > impl.mod.BOUNDS[op]["output"]["float32"]:
        bad.append(f"distance {d}")
    with np.errstate(invalid="ignore"):  # (inf - inf, 0 * inf: compared by distance)
        terms, k = _abs_terms(op, arrays, attrs, want.shape)
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        limit = 2 * (k + 1) * U * terms.reshape(want.shape) + 2.0**-120
        over = diff > limit
    if over.any():
        bad.append(f"{diff.max()} beyond 2 (K + 1) U sum|terms|")
    return bad


def _run_case(impl: Any, case: Case) -> list[str]:
    return portable.run_case(impl, case, SEEDS, lambda kw, arrays, attrs, got, want:
                             _violations(impl, case.op, arrays, attrs, got[0], want[0]))


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_within_bounds(impl: Any, case: Case) -> None:
    assert not _run_case(impl, case)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_bounds_declared(framework: str) -> None:
    pytest.importorskip(framework)
    mod = importlib.import_module(
        f"tfgrad.{'torch._portable' if framework == 'torch' else 'jax._native'}.conv2d")
    for op in {c.op for c in cases.CASES}:
        assert sorted(mod.BOUNDS[op]) == ["output"]
        assert mod.BOUNDS[op]["output"]["float32"] > 0
