"""Fused batch normalization in jax.numpy, jittable on any backend: TF 2.21's
FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}.

TF's formulas (:mod:`tfgrad.ops.batch_norm`'s NumPy reference; docs/batch_norm.md), each
float32 operation rounded once, statistics in float32 for every input dtype, y / x_backprop
rounded to T once at the end. XLA would contract a multiply into the next add (an FMA) and
rewrite ``1 / sqrt(v)`` as its approximate ``rsqrt``; :func:`_r` (a select XLA and LLVM
cannot see through) keeps each product rounded and the square root exact. Channels are
axis 1 (NCHW, NCDHW) or the last axis (NHWC, NDHWC, and V1/V2's 5-D x); the per-channel
vectors broadcast against x, so no layout is transposed.

Where the bits differ from TF's CPU kernel (measured in BOUNDS):

- Sums are ``jnp.sum`` in float32 (XLA's order), not Eigen's column reduction (forward) or
  TF's sequential ``ReduceOuterDimensions`` (gradient).
- ``rsqrt`` is the exact ``1 / sqrt``; TF uses the processor's approximate ``vrsqrtps``
  and a Newton step for the channels in full packets of 8.
- Denormals: XLA:CPU flushes them as TF does; other backends may not (only values below
  2**-126 differ).

The gradients are differentiable by JAX (``tfgrad._gradients.LINEARISED``), as TF
differentiates its composite ``_BatchNormGrad``: with ``is_training=True`` that composite
recomputes the batch mean and variance from x, so the saved statistics (reserve_space_1/2)
carry the derivative of x's mean and variance (their values unchanged).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..._distance import Bounds, bounds_by_output
from ._ieee import div_rn

_F32 = jnp.float32
_NAN = np.float32(np.nan)
_CHANNELS_FIRST = ("NCHW", "NCDHW")

_FWD = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
_GRAD = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")

Array = Any  # a jax.Array (or anything jnp.asarray takes)


# Largest distance from the exact kernels (tfgrad._distance), op -> output -> output dtype.
# (one table for the three versions of the op and of its gradient)
BOUNDS: Bounds = bounds_by_output(_FWD + _GRAD, {
    "reserve_space_3": {"float32": 0},
    # TF's approximate rsqrt on packets of 8 channels, the sums' order (max seen: 4;
    # torch, on the same rsqrt, 7).
    "y": {"float32": 8, "float16": 1, "bfloat16": 1},
    # the sums' order (max seen: 6).
    "batch_mean": {"float32": 9}, "batch_variance": {"float32": 9},
    "reserve_space_1": {"float32": 9}, "reserve_space_2": {"float32": 9},
    # R = 2: dx is rounding noise that cancels, and TF's rsqrt moves it (max seen 1297;
    # <= 3 elsewhere).
    "x_backprop": {"float32": 2048, "float16": 1, "bfloat16": 1},
    # the sums' order (max seen: 5 and 3).
    "scale_backprop": {"float32": 8}, "offset_backprop": {"float32": 6},
    "reserve_space_4": {"float32": 0},
    "reserve_space_5": {"float32": 0},
})
BOUNDS_COUNT = 162
"""The most values per channel in the case table, on which BOUNDS were measured."""
SUM_OUTPUTS = ("y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2",
               "scale_backprop", "offset_backprop")
"""Outputs that sum over the batch: beyond BOUNDS_COUNT values per channel their bound
grows with the count (``tfgrad._distance.sum_bound``; tests/test_portable_batch_norm.py
checks 4,096 and 65,536)."""

NOTES: dict[str, str] = {
    op: "Denormals are flushed to zero (TF's FTZ / DAZ) only where the backend does it "
    "(XLA:CPU does); elsewhere only values below 2**-126 can differ." for op in _FWD + _GRAD
}


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------
def _r(v: Array) -> Array:
    """``v`` as computed, rounded once: a select XLA and LLVM cannot fold keeps a multiply
    out of the next add (no FMA) and a square root out of ``1 / sqrt -> rsqrt``."""
    return jnp.where(jnp.isnan(v), _NAN, v)


def _rsqrt(v: Array) -> Array:
    return div_rn(np.float32(1), _r(jnp.sqrt(v)))  # exact; XLA's rsqrt is an approximation


def _layout(x: Array, data_format: str) -> tuple[int, tuple[int, ...], list[int]]:
    """(channels, the axes summed over, the shape a [C] vector broadcasts as)."""
    axis = 1 if data_format in _CHANNELS_FIRST else x.ndim - 1
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return x.shape[axis], tuple(d for d in range(x.ndim) if d != axis), shape


@jax.custom_jvp
def _value_with_grad_of(value: Array, surrogate: Array) -> Array:
    """``value``'s values with ``surrogate``'s derivative (the saved statistics
    differentiate as the statistics of x that TF's composite recomputes)."""
    return value


@_value_with_grad_of.defjvp
def _value_with_grad_of_jvp(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    return primals[0], tangents[1]


def _with_batch_stats(mean: Array, var: Array, x: Array, axes: tuple[int, ...],
                      shape: list[int]) -> tuple[Array, Array]:
    """The saved mean / variance, differentiable as x's batch mean / biased variance
    (``tf.nn.moments``: the variance stops the mean's gradient, as TF's composite). Unused
    without differentiation, so jit drops the extra sums."""
    mx = jnp.mean(x, axes)
    xc = x - jax.lax.stop_gradient(mx).reshape(shape)
    vx = jnp.mean(xc * xc, axes)
    return _value_with_grad_of(mean, mx), _value_with_grad_of(var, vx)


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------
def _forward(version: int, x: Array, scale: Array, offset: Array, mean: Array,
             variance: Array, epsilon: float, exponential_avg_factor: float,
             data_format: str, is_training: bool) -> tuple[Array, ...]:
    x = jnp.asarray(x)
    scale, offset, mean, variance = (jnp.asarray(a, _F32)
                                     for a in (scale, offset, mean, variance))
    c, axes, shape = _layout(x, data_format)
    extra = (jnp.zeros((), _F32),) if version == 3 else ()
    if x.size == 0:
        # TF: NaN batch statistics (also at inference); tfgrad's reserve spaces are zeros.
        nan = jnp.full((c,), _NAN)
        zeros = jnp.zeros((c,), _F32)
        return (jnp.zeros(x.shape, x.dtype), nan, nan, zeros, zeros) + extra
    X = x.astype(_F32)
    eps = np.float32(epsilon)
    if is_training:
        r = x.size // c
        inv_r = np.float32(1) / np.float32(r)  # TF multiplies by the reciprocal
        m = _r(jnp.sum(X, axes) * inv_r)
        xc = X - m.reshape(shape)
        v = _r(jnp.sum(_r(xc * xc), axes) * inv_r)  # two-pass, biased
        sf = _r(_rsqrt(v + eps) * scale)
        y = _r(xc * sf.reshape(shape)) + offset.reshape(shape)
        adj = np.float32(r) / np.float32(max(r - 1, 1))  # Bessel's correction
        f = np.float32(exponential_avg_factor)
        if f == 1:
            bm, bv = m, v * adj
        else:
            bm = _r(mean * (np.float32(1) - f)) + _r(m * f)
            bv = _r(variance * (np.float32(1) - f)) + _r(v * (f * adj))
        return (y.astype(x.dtype), bm, bv, m, v) + extra
    sf = _r(_rsqrt(variance + eps) * scale)
    y = _r((X - mean.reshape(shape)) * sf.reshape(shape)) + offset.reshape(shape)
    return (y.astype(x.dtype), mean, variance, mean, variance) + extra


def FusedBatchNorm(**kw: Any) -> tuple[Array, ...]:
    return _forward(1, **kw)


def FusedBatchNormV2(**kw: Any) -> tuple[Array, ...]:
    return _forward(2, **kw)


def FusedBatchNormV3(**kw: Any) -> tuple[Array, ...]:
    return _forward(3, **kw)


# --------------------------------------------------------------------------------------
# Gradient
# --------------------------------------------------------------------------------------
def _grad(y_backprop: Array, x: Array, scale: Array, reserve_space_1: Array,
          reserve_space_2: Array, epsilon: float, data_format: str,
          is_training: bool) -> tuple[Array, ...]:
    x = jnp.asarray(x)
    scale, mean, var = (jnp.asarray(a, _F32) for a in (scale, reserve_space_1,
                                                      reserve_space_2))
    c, axes, shape = _layout(x, data_format)
    placeholders = (jnp.zeros((0,), _F32), jnp.zeros((0,), _F32))
    if x.size == 0:
        zeros = jnp.zeros((c,), _F32)
        return (jnp.zeros(x.shape, x.dtype), zeros, zeros) + placeholders
    dy, X = jnp.asarray(y_backprop).astype(_F32), x.astype(_F32)
    eps = np.float32(epsilon)
    offset_bp = jnp.sum(dy, axes)
    if is_training:
        mean, var = _with_batch_stats(mean, var, X, axes, shape)
        r = x.size // c
        c0 = _rsqrt(var + eps)
        xc = _r(X - mean.reshape(shape))
        scale_bp = jnp.sum(_r(dy * _r(xc * c0.reshape(shape))), axes)
        m = div_rn(jnp.sum(_r(dy * xc), axes), np.float32(r))  # TF divides by R here
        c1 = scale * c0
        c2 = _r(_r(c0 * c0) * m)
        inv_r = np.float32(1) / np.float32(r)
        dx = c1.reshape(shape) * (_r(dy - _r(offset_bp * inv_r).reshape(shape))
                                  - _r(xc * c2.reshape(shape)))
    else:
        s = _rsqrt(var + eps)
        scale_bp = _r(jnp.sum(_r(dy * (X - mean.reshape(shape))), axes)) * s
        dx = dy * _r(s * scale).reshape(shape)
    return (dx.astype(x.dtype), scale_bp, offset_bp) + placeholders


def FusedBatchNormGrad(**kw: Any) -> tuple[Array, ...]:
    return _grad(**kw)


def FusedBatchNormGradV2(**kw: Any) -> tuple[Array, ...]:
    return _grad(**kw)


def FusedBatchNormGradV3(*, reserve_space_3: Array, **kw: Any) -> tuple[Array, ...]:
    # TF's CPU kernel ignores reserve_space_3.
    return _grad(**kw)
