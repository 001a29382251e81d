"""AvgPool and AvgPoolGrad in jax.numpy, jittable on any backend (TF 2.21's semantics;
the spec is :mod:`tfgrad.ops.avg_pool`, TF's behaviours docs/avg_pool.md).

TF's arithmetic one elementwise operation at a time, as the portable torch
implementation (:mod:`tfgrad.torch._portable.avg_pool`): the window offsets' strided
slices added in TF's order, TF's counts and coefficients in T, denormals flushed after
each operation (not half's). Three XLA rewrites are kept out: ``0 + b`` folded to ``b``
(a -0 where TF's sum gives +0, ``_add``), a division by a constant
becomes a multiplication by its reciprocal (the divisor is made to depend on the
dividend, ``_div``), and XLA:CPU contracts a multiply and the add that consumes it into
an FMA (the product passes through a select that XLA and LLVM cannot fold, ``_r``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ...ops import avg_pool as _ap
from ._ieee import div_rn

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype:
# TF's operations in TF's order, bit-identical (measured over the case table, XLA:CPU).
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    op: {"output": {dt: 0 for dt in ("float32", "float64", "float16", "bfloat16")}}
    for op in ("AvgPool", "AvgPoolGrad")
}
NOTES: dict[str, str] = {}

Array = Any


def _np_dtype(x: Array) -> np.dtype:
    return np.dtype(x.dtype)


def _ftz(v: Array) -> Array:
    """Denormals to zeros of their sign (TF's FTZ / DAZ); NaN and inf unchanged."""
    dt = _np_dtype(v)
    if dt == np.float16:
        return v
    tiny = np.finfo(np.float64 if dt == np.float64 else np.float32).tiny
    return jnp.where(jnp.abs(v) < tiny.astype(dt), v * dt.type(0), v)


def _r(v: Array) -> Array:
    """``v`` rounded once: a select XLA and LLVM cannot fold keeps the product out of the
    next addition (no FMA)."""
    return jnp.where(jnp.isnan(v), jnp.asarray(np.nan, v.dtype), v)


def _add(a: Array, b: Array) -> Array:
    """``a + b`` with IEEE's zero sign: XLA folds ``0 + b`` to ``b``, which keeps a -0 that
    TF's sum onto +0 turns into +0 (a sum of two zeros is -0 only when both are; a sum
    of other values flushed to zero keeps its sign)."""
    s = a + b
    plus = (a == 0) & (b == 0) & ~(jnp.signbit(a) & jnp.signbit(b))
    return jnp.where(plus, jnp.zeros_like(s), s)


def AvgPool(*, value: Array, ksize: tuple[int, ...], strides: tuple[int, ...],
            padding: str, data_format: str = "NHWC") -> Array:
    value = jnp.asarray(value)
    geo = _ap.geometry_of(tuple(value.shape), ksize, strides, padding)
    dt = _np_dtype(value)
    if geo.N * geo.OH * geo.OW * geo.C == 0:
        return jnp.zeros((geo.N, geo.OH, geo.OW, geo.C), dt)
    xp = jnp.zeros(_ap.padded_shape(geo), dt)
    xp = xp.at[:, geo.PT:geo.PT + geo.H, geo.PL:geo.PL + geo.W].set(_ftz(value))
    inside = _ap.inside(geo)
    acc = jnp.zeros((geo.N, geo.OH, geo.OW, geo.C), dt)
    for dr in range(geo.KH):
        for dc in range(geo.KW):
            rs, cs = _ap.taps(geo, dr, dc)
            # (padding cells skipped: _ap.inside)
            acc = jnp.where(inside[rs, cs][None, :, :, None], _ftz(_add(acc, xp[:, rs, cs])),
                            acc)
    counts = jnp.asarray(_ap.counts(geo, dt))[None, :, :, None]
    return _ftz(div_rn(acc, counts))


def AvgPoolGrad(*, orig_input_shape: tuple[int, ...], grad: Array, ksize: tuple[int, ...],
                strides: tuple[int, ...], padding: str, data_format: str = "NHWC") -> Array:
    grad = jnp.asarray(grad)
    dt = _np_dtype(grad)
    shape = tuple(int(v) for v in orig_input_shape)
    if int(np.prod(shape)) == 0:
        return jnp.zeros(shape, dt)
    geo = _ap.geometry_of(shape, ksize, strides, padding)
    if geo.OH * geo.OW == 0:
        return jnp.zeros(shape, dt)
    coeff = jnp.asarray(_ap.coefficients(geo, dt))[None, :, :, None]
    prod = _r(_ftz(grad * coeff))
    dxp = jnp.zeros(_ap.padded_shape(geo), dt)
    for dr in reversed(range(geo.KH)):
        for dc in reversed(range(geo.KW)):
            rs, cs = _ap.taps(geo, dr, dc)
            dxp = dxp.at[:, rs, cs].set(_ftz(_add(dxp[:, rs, cs], prod)))
    return dxp[:, geo.PT:geo.PT + geo.H, geo.PL:geo.PL + geo.W]


