"""Fused batch normalization in torch tensor ops, on any device: TF 2.21's FusedBatchNorm{,V2,V3}
and FusedBatchNormGrad{,V2,V3}.

TF's formulas (:mod:`tfgrad.ops.batch_norm`'s NumPy reference; docs/batch_norm.md), each
float32 operation a torch op of its own (no FMA, no fused ops), statistics in float32 for
every input dtype, y / x_backprop rounded to T once at the end. Channels are dim 1 (NCHW, NCDHW)
or the last dim (NHWC, NDHWC, and V1/V2's 5-D x); the per-channel vectors broadcast against
x, so no layout is transposed.

Where the bits differ from TF's CPU kernel (measured in BOUNDS):

- Sums are ``torch.sum`` in float32, not Eigen's column reduction (forward) or TF's
  sequential ``ReduceOuterDimensions`` (gradient).
- ``rsqrt`` is the exact ``1 / sqrt`` (one division of a correctly rounded square root);
  TF uses the processor's approximate ``vrsqrtps`` and a Newton step for the channels in
  full packets of 8.
- Denormals are not flushed (TF runs with FTZ / DAZ): only values below 2**-126 differ.

The gradients are differentiable by torch autograd (``tfgrad._gradients.LINEARISED``), as
TF differentiates its composite ``_BatchNormGrad``: with ``is_training=True`` that composite
recomputes the batch mean and variance from x, so when x requires grad the saved statistics
(reserve_space_1/2) carry the derivative of x's mean and variance (their values unchanged).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..._distance import Bounds, bounds_by_output

_F32 = torch.float32
_CHANNELS_FIRST = ("NCHW", "NCDHW")

_FWD = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
_GRAD = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")


# Largest distance from the exact kernels (tfgrad._distance), op -> output -> output dtype.
# (one table for the three versions of the op and of its gradient)
BOUNDS: Bounds = bounds_by_output(_FWD + _GRAD, {
    "reserve_space_3": {"float32": 0},
    # TF's approximate rsqrt on packets of 8 channels, the sums' order (max seen: 7).
    "y": {"float32": 12, "float16": 1, "bfloat16": 1},
    # the sums' order (max seen: 8 and 10).
    "batch_mean": {"float32": 12}, "batch_variance": {"float32": 16},
    "reserve_space_1": {"float32": 12}, "reserve_space_2": {"float32": 16},
    # R = 2: dx is rounding noise that cancels, and TF's rsqrt moves it (max seen 2644;
    # <= 4 elsewhere).
    "x_backprop": {"float32": 4096, "float16": 1, "bfloat16": 1},
    # one channel (C = 1) whose sum cancels (max seen 680 and 72704; <= 8 elsewhere).
    "scale_backprop": {"float32": 1024}, "offset_backprop": {"float32": 131072},
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
    op: "Denormal inputs and intermediates are not flushed to zero (TF's FTZ / DAZ); only "
    "values below 2**-126 can differ." for op in _FWD + _GRAD
}


# --------------------------------------------------------------------------------------
# Layout and helpers
# --------------------------------------------------------------------------------------
def _layout(x: torch.Tensor, data_format: str) -> tuple[int, list[int], list[int]]:
    """(channels, the axes summed over, the shape a [C] vector broadcasts as)."""
    axis = 1 if data_format in _CHANNELS_FIRST else x.dim() - 1
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    return x.shape[axis], [d for d in range(x.dim()) if d != axis], shape


def _f32(v: float) -> float:
    """A Python float holding the float32 value TF computes."""
    return float(np.float32(v))


def _rsqrt(v: torch.Tensor) -> torch.Tensor:
    # Exact 1/sqrt: torch.rsqrt is an approximation on CUDA.
    return torch.reciprocal(torch.sqrt(v))


class _ValueWithGradOf(torch.autograd.Function):
    """``value``'s values with ``surrogate``'s derivative (the saved statistics
    differentiate as the statistics of x that TF's composite recomputes)."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, surrogate: torch.Tensor) -> torch.Tensor:
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, grad


def _with_batch_stats(mean: torch.Tensor, var: torch.Tensor, x: torch.Tensor,
                      axes: list[int], shape: list[int]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The saved mean / variance, differentiable as x's batch mean / biased variance
    (``tf.nn.moments``: the variance stops the mean's gradient, as TF's composite)."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return mean, var
    mx = x.mean(axes)
    vx = (x - mx.detach().reshape(shape)).square().mean(axes)
    return _ValueWithGradOf.apply(mean, mx), _ValueWithGradOf.apply(var, vx)


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------
def _forward(version: int, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
             mean: torch.Tensor, variance: torch.Tensor, epsilon: float,
             exponential_avg_factor: float, data_format: str,
             is_training: bool) -> tuple[torch.Tensor, ...]:
    c, axes, shape = _layout(x, data_format)
    extra = (torch.zeros((), dtype=_F32, device=x.device),) if version == 3 else ()
    if x.numel() == 0:
        # TF: NaN batch statistics (also at inference); tfgrad's reserve spaces are zeros.
        nan = torch.full((c,), float("nan"), dtype=_F32, device=x.device)
        zeros = torch.zeros(c, dtype=_F32, device=x.device)
        return (torch.empty_like(x), nan, nan.clone(), zeros, zeros.clone()) + extra
    X = x.to(_F32)
    eps = _f32(epsilon)
    if is_training:
        r = X.numel() // c
        inv_r = _f32(np.float32(1) / np.float32(r))  # TF multiplies by the reciprocal
        m = X.sum(axes) * inv_r
        xc = X - m.reshape(shape)
        v = (xc * xc).sum(axes) * inv_r  # two-pass, biased
        sf = _rsqrt(v + eps) * scale
        y = xc * sf.reshape(shape) + offset.reshape(shape)
        adj = _f32(np.float32(r) / np.float32(max(r - 1, 1)))  # Bessel's correction
        f = np.float32(exponential_avg_factor)
        if f == 1:
            bm, bv = m, v * adj
        else:
            keep = _f32(np.float32(1) - f)
            bm = mean * keep + m * float(f)
            bv = variance * keep + v * _f32(f * np.float32(adj))
        return (y.to(x.dtype), bm, bv, m.clone(), v.clone()) + extra
    sf = _rsqrt(variance + eps) * scale
    y = (X - mean.reshape(shape)) * sf.reshape(shape) + offset.reshape(shape)
    return (y.to(x.dtype), mean.clone(), variance.clone(), mean.clone(),
            variance.clone()) + extra


def FusedBatchNorm(**kw: Any) -> tuple[torch.Tensor, ...]:
    return _forward(1, **kw)


def FusedBatchNormV2(**kw: Any) -> tuple[torch.Tensor, ...]:
    return _forward(2, **kw)


def FusedBatchNormV3(**kw: Any) -> tuple[torch.Tensor, ...]:
    return _forward(3, **kw)


# --------------------------------------------------------------------------------------
# Gradient
# --------------------------------------------------------------------------------------
def _grad(y_backprop: torch.Tensor, x: torch.Tensor, scale: torch.Tensor,
          reserve_space_1: torch.Tensor, reserve_space_2: torch.Tensor, epsilon: float,
          data_format: str, is_training: bool) -> tuple[torch.Tensor, ...]:
    c, axes, shape = _layout(x, data_format)
    placeholders = tuple(torch.zeros(0, dtype=_F32, device=x.device) for _ in range(2))
    if x.numel() == 0:
        zeros = torch.zeros(c, dtype=_F32, device=x.device)
        return (torch.empty_like(x), zeros, zeros.clone()) + placeholders
    dy, X = y_backprop.to(_F32), x.to(_F32)
    eps = _f32(epsilon)
    offset_bp = dy.sum(axes)
    if is_training:
        mean, var = _with_batch_stats(reserve_space_1, reserve_space_2, X, axes, shape)
        r = X.numel() // c
        c0 = _rsqrt(var + eps)
        xc = X - mean.reshape(shape)
        scale_bp = (dy * (xc * c0.reshape(shape))).sum(axes)
        # TF divides by R here (a tensor divisor: CUDA divides by a host scalar as a
        # multiplication by its reciprocal).
        m = (dy * xc).sum(axes) / torch.full_like(c0, float(r))
        c1 = scale * c0
        c2 = (c0 * c0) * m
        inv_r = _f32(np.float32(1) / np.float32(r))
        dx = c1.reshape(shape) * ((dy - (offset_bp * inv_r).reshape(shape))
                                  - xc * c2.reshape(shape))
    else:
        s = _rsqrt(reserve_space_2 + eps)
        scale_bp = (dy * (X - reserve_space_1.reshape(shape))).sum(axes) * s
        dx = dy * (s * scale).reshape(shape)
    return (dx.to(x.dtype), scale_bp, offset_bp) + placeholders


def FusedBatchNormGrad(**kw: Any) -> tuple[torch.Tensor, ...]:
    return _grad(**kw)


def FusedBatchNormGradV2(**kw: Any) -> tuple[torch.Tensor, ...]:
    return _grad(**kw)


def FusedBatchNormGradV3(*, reserve_space_3: torch.Tensor, **kw: Any
                         ) -> tuple[torch.Tensor, ...]:
    # TF's CPU kernel ignores reserve_space_3.
    return _grad(**kw)
