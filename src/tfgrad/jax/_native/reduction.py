"""Sum and Mean in jax.numpy, jittable on any backend (TF 2.21's semantics; the spec is
:mod:`tfgrad.ops.reduction`, TF's behaviours docs/reduction.md).

TF's plan is followed exactly (:func:`tfgrad.ops.reduction.make_plan`): nothing reduced
copies the input (-0 and denormals survive), an empty input gives 0 (Sum) or NaN (Mean),
inputs are read with DAZ, and Mean divides the float32 sum by the float32 count, flushed
as TF's FTZ. The count must stay a divisor: XLA would turn a division by a constant into
a multiplication by its reciprocal (``_div``). The sums are ``jnp.sum`` in float32: XLA's
order, not Eigen's tree, lanes and shards (see BOUNDS); their gradient (a broadcast,
divided by the count for Mean, as TF's _SumGrad / _MeanGrad) is exact.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...ops import reduction as _r
from ._ieee import div_rn

_TINY = np.float32(np.finfo(np.float32).tiny)  # smallest normal float32

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype:
# XLA's summation order against Eigen's, within 2.4 U * sum(|terms|) (U = 2**-24),
# thousands of ulps of the largest output where the terms cancel.
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "Sum": {"output": {"float32": 8192}},
    "Mean": {"output": {"float32": 8192}},
}

NOTES: dict[str, str] = {
    "Sum": "Summed in XLA's order, not Eigen's (tree, lanes, TF's thread split).",
    "Mean": "Summed in XLA's order, not Eigen's (tree, lanes, TF's thread split); "
    "then divided by the float32 count as TF.",
}

Array = Any


def _ftz(v: Array) -> Array:
    """Denormals to zero (TF's FTZ / DAZ); NaN and inf unchanged. Straight through for
    autodiff: TF's gradient (a broadcast) does not depend on the values, so the flush
    must not zero it."""
    d = jax.lax.stop_gradient(v)
    return jnp.where(jnp.abs(d) < _TINY, (v - d) + d * np.float32(0), v)


def _reduce(name: str, x: Array, axis: tuple[int, ...], keep_dims: bool, mean: bool) -> Array:
    x = jnp.asarray(x)
    plan = _r.make_plan(name, tuple(x.shape), tuple(int(a) for a in axis), bool(keep_dims))
    if plan.kind == "copy":
        return jnp.reshape(x, plan.out_shape)
    if plan.kind in ("empty", "identity"):
        fill = np.float32(np.nan) if mean and plan.kind == "identity" else np.float32(0)
        return jnp.full(plan.out_shape, fill, x.dtype)
    rank = x.ndim
    dims = tuple(sorted({(int(a) + rank) % rank for a in axis}))
    s = _ftz(jnp.sum(_ftz(x), axis=dims, keepdims=keep_dims))
    if mean:
        s = _ftz(div_rn(s, np.float32(plan.count)))
    return jnp.reshape(s, plan.out_shape)


def Sum(*, input: Array, axis: tuple[int, ...], keep_dims: bool = False) -> Array:  # noqa: A002
    return _reduce("Sum", input, axis, keep_dims, mean=False)


def Mean(*, input: Array, axis: tuple[int, ...], keep_dims: bool = False) -> Array:  # noqa: A002
    return _reduce("Mean", input, axis, keep_dims, mean=True)
