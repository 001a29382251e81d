"""The fake-quant ops on the compiled kernels (``tfgrad.kernels.fake_quant``): channels-last
rows, the nudged range's values, Eigen's reduction plan for the sums."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compile import launch
from .._tf.eigen import reduction_plan
from ..kernels import fake_quant as k

F32 = np.float32
_FAMILY = "fake_quant"


def _flat(a: np.ndarray) -> np.ndarray:
    """C-contiguous 1-D view (copy only if needed)."""
    return np.ascontiguousarray(a).reshape(-1)


def _as_rows(a: np.ndarray, d: int) -> np.ndarray:
    """C-contiguous [N, d] view (copy only if needed) of channels-last data (d > 0)."""
    return np.ascontiguousarray(a).reshape(-1, d)


def _channel_first(a: np.ndarray) -> tuple[tuple[int, ...], int, int] | None:
    """``(perm, N, S)`` where channels-last ``a`` (not C-contiguous, not empty) is a view of
    channel-first memory: ``a.transpose(perm)`` is C-contiguous [N..., C, S...] (the
    channel axis moved last from position j > 0, as a torch NCHW layer's ``movedim``
    does), N and S the sizes before and after it; else None. Its rows, in channels-last
    order, are then runs of S values, one run per (n, channel)."""
    last = a.ndim - 1
    for j in range(last):
        perm = (*range(j), last, *range(j, last))
        if a.transpose(perm).flags.c_contiguous:
            return perm, math.prod(a.shape[:j]), math.prod(a.shape[j:last])
    return None


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def nudge(mn: np.ndarray, mx: np.ndarray, num_bits: int, narrow_range: bool
          ) -> tuple[np.ndarray, ...]:
    """TF's Nudge of float32 min/max arrays of one shape: (nmin, nmax, scale, inv, qz,
    zero), arrays of that shape (``ops.fake_quant.Nudged``'s fields)."""
    shape = np.shape(mn)
    f, zero = k.nudge(_flat(mn), _flat(mx), F32(1 if narrow_range else 0),
                      F32((1 << num_bits) - 1))
    f = f.reshape((5, *shape))
    return f[0], f[1], f[2], f[3], f[4], zero.reshape(shape)


def quantize(x: np.ndarray, p: Any, divide: bool) -> np.ndarray:
    """The forward for ``p`` (``ops.fake_quant.Nudged``): one range ([] arrays) or one per
    channel ([d]); ``divide``: Vars (t = shifted / scale)."""
    if p.nmin.ndim == 0:  # one range for the whole tensor
        if bool(p.zero):
            return np.zeros(x.shape, F32)
        out = np.empty(x.shape, F32)
        launch(_FAMILY, k.quantize_flat, x.size, _flat(x), float(p.nmin), float(p.nmax),
               float(p.scale), float(p.inv), float(p.qz), divide, out.reshape(-1))
        return out
    d = x.shape[-1]
    cf = _channel_first(x) if x.size and not x.flags.c_contiguous else None
    if cf is not None:  # the output in x's layout (as NumPy's elementwise functions)
        perm, n, s = cf
        t = np.empty(x.transpose(perm).shape, F32)
        launch(_FAMILY, k.quantize_channels_first, x.size, x.transpose(perm).reshape(n, d, s),
               p.nmin, p.nmax, p.scale, p.inv, p.qz, t.reshape(n, d, s), units=n * d)
        out = t.transpose(_inverse(perm))
    else:
        out = np.empty(x.shape, F32)
        if out.size:
            launch(_FAMILY, k.quantize_channels, x.size, _as_rows(x, d), p.nmin, p.nmax,
                   p.scale, p.inv, p.qz, out.reshape(-1, d))
    for c in p.zero_channels:  # min == max == 0: zeros
        out[..., c] = 0
    return out


def mask_gradient(g: np.ndarray, x: np.ndarray, p: Any) -> np.ndarray:
    """The Args gradient: g where nmin <= x <= nmax (no sums)."""
    dx = np.empty(x.shape, F32)
    launch(_FAMILY, k.mask_gradient, x.size, _flat(g), _flat(x), float(p.nmin), float(p.nmax),
           dx.reshape(-1))
    return dx


def gradient(g: np.ndarray, x: np.ndarray, p: Any, cost: float
             ) -> tuple[np.ndarray, Any, Any]:
    """dx (shape of x) and the sums (shape of p's arrays) for one range or one per channel
    (at least one channel); ``cost``: Eigen's cycles per value of the summed expression."""
    if p.nmin.ndim == 0:
        if bool(p.zero):
            return g.copy(), F32(0), F32(0)
        dx = np.empty(x.shape, F32)
        sums = np.zeros(2, F32)
        plan = reduction_plan(x.size, 1, cost)
        launch(_FAMILY, k.gradient_flat, x.size, _flat(g), _flat(x), float(p.nmin),
               float(p.nmax), *plan, dx.reshape(-1), sums, units=plan[1].size - 1)
        return dx, sums[0], sums[1]
    d = x.shape[-1]
    dmin = np.zeros(d, F32)
    dmax = np.zeros(d, F32)
    cf = _channel_first(x) if x.size and not x.flags.c_contiguous else None
    if cf is not None:  # dx in x's layout; the sums in the channels-last rows' order
        perm, n, s = cf
        t = np.empty(x.transpose(perm).shape, F32)
        prog, starts, top, _, depth = reduction_plan(n * s, d, cost)
        launch(_FAMILY, k.gradient_channels_first, x.size,
               np.ascontiguousarray(g.transpose(perm)).reshape(n, d, s),
               x.transpose(perm).reshape(n, d, s), p.nmin, p.nmax, prog, starts, top, depth,
               t.reshape(n, d, s), dmin, dmax, units=(starts.size - 1) * d)
        dx = t.transpose(_inverse(perm))
    else:
        dx = np.empty(x.shape, F32)
        if x.size:
            n = x.size // d
            plan = reduction_plan(n, d, cost)
            tasks = (plan[1].size - 1) * -(-d // plan[3])  # subtrees x channel blocks
            launch(_FAMILY, k.gradient_channels, x.size, _as_rows(g, d), _as_rows(x, d),
                   p.nmin, p.nmax, *plan, dx.reshape(-1, d), dmin, dmax, units=tasks)
    for c in p.zero_channels:  # min == max == 0: pass through
        dx[..., c] = g[..., c]
        dmin[c] = dmax[c] = 0
    return dx, dmin, dmax
