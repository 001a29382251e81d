"""Numba helpers for batch norm's [C] vectors: the per-channel arithmetic between the
kernels' passes over x (``tfgrad.dispatch.batch_norm`` runs them), in the float32
operations and order of the NumPy expressions they replace, so the bits are those.

A QAT step's batch norms are small (a MobileNetV2 at batch 32 has [32, 2, 2, 24]): there
the twenty-odd NumPy calls on [C] vectors around the kernels cost more than the kernels
(benchmarks/RESULTS.md). Serial: C is at most a few thousand.
"""

from __future__ import annotations

import numpy as np

from .._compile import jit
from .._tf.rsqrt import rsqrt_channel

_F32 = np.float32


@jit
def fwd_vectors(m, v, scale, offset, eps, pads):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """pads[0] = m, pads[1] = Eigen's rsqrt(v + eps) * scale (the approximation on the
    channels in whole packets of 8), pads[2] = offset: rows of [3, C + slack], whose
    slack the caller zeroed."""
    C = m.size
    k = (C // 8) * 8
    for c in range(C):
        pads[0, c] = m[c]
        pads[1, c] = rsqrt_channel(v[c] + eps, c < k) * scale[c]
        pads[2, c] = offset[c]


@jit
def running_stats(m, v, mean_in, var_in, factor, R, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """TF's batch_mean and batch_variance (out[0], out[1]) from the batch's m and v over
    R rows: with exponential_avg_factor f, (1 - f) * running + f * batch, the variance
    Bessel-corrected; f == 1 skips the running values (which may then be empty)."""
    adj = _F32(R) / _F32(max(R - 1, 1))
    f = _F32(factor)
    C = m.size
    if f == _F32(1):
        for c in range(C):
            out[0, c] = m[c]
            out[1, c] = v[c] * adj
        return
    om = _F32(1) - f
    fa = f * adj
    for c in range(C):
        out[0, c] = om * mean_in[c] + f * m[c]
        out[1, c] = om * var_in[c] + fa * v[c]


@jit
def _rsqrt_tiled(a, c, C, tile):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Channel c's rsqrt(a) as Eigen evaluates [C] in tiles of ``tile`` channels: the
    approximation on the whole packets of 8 from each tile's start (_tf.rsqrt)."""
    start = (c // tile) * tile
    stop = min(C, start + tile)
    return rsqrt_channel(a, c < start + ((stop - start) // 8) * 8)


@jit
def grad_prologue(var, mean, scale, eps, training, stile, dtile, pre, c0d):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled  # noqa: E501
    """Before the gradient's sums: c0d = rsqrt(var + eps) in the dx tiles; pre[0] = mean;
    pre[1] = the sums' factor, rsqrt(var + eps) in the scale tiles (training) or
    c0d * scale (frozen statistics). pre: [2, C + slack], its slack zeroed by the caller."""
    C = var.size
    for c in range(C):
        a = var[c] + eps
        d = _rsqrt_tiled(a, c, C, dtile)
        c0d[c] = d
        pre[0, c] = mean[c]
        pre[1, c] = _rsqrt_tiled(a, c, C, stile) if training else d * scale[c]


@jit
def grad_epilogue(sums, c0d, scale, R, sb, ob, post):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """After the sums (rows of ``sums``: dy * x_scaled, dy, dy * (x - mean)), training:
    scale_backprop, offset_backprop, and the dx pass's coefficients into post's rows
    (coef1 = scale * c0d, coef2 = c0d * c0d * (sum / R), the mean of dy)."""
    r = _F32(R)
    inv = _F32(1) / r
    for c in range(c0d.size):
        d = c0d[c]
        sb[c] = sums[0, c]
        ob[c] = sums[1, c]
        post[0, c] = scale[c] * d
        post[1, c] = (d * d) * (sums[2, c] / r)
        post[2, c] = sums[1, c] * inv
