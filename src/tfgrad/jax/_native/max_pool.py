"""MaxPool and MaxPoolGrad in jax.numpy, for any XLA backend (float32 / float64, NHWC).

TF's rules exactly (:mod:`tfgrad.ops.max_pool`, docs/max_pool.md), as the portable torch
implementation computes them: the window's taps in row-major order, denormals read as
zeros of their sign (explicit, whatever the backend does), ``out < x`` selects from the
type's lowest value (the padding reads NaN, never taken); the gradient recomputes TF's
argmax and sums each input's gradients in the output's (oh, ow) order, one flushed
addition per covering window. The index arithmetic is NumPy on static shapes. No
rounding differs from the exact kernels: bit-identical (BOUNDS: 0).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ...ops import max_pool as _m

Array = Any

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "MaxPool": {"output": {"float32": 0, "float64": 0}},
    "MaxPoolGrad": {"output": {"float32": 0, "float64": 0}},
}
NOTES: dict[str, str] = {}


def _flush(x: Array) -> Array:
    """DAZ / FTZ: a denormal becomes a zero of its sign."""
    return jnp.where(jnp.abs(x) < jnp.finfo(x.dtype).tiny, x * 0, x)


def _taps(x: Array, geo: _m.Geometry):  # type: ignore[no-untyped-def]
    """(kh, kw, the tap's input for every output [N, OH, OW, C]), row-major; the padding
    reads NaN."""
    eh = (geo.OH - 1) * geo.sh + geo.KH
    ew = (geo.OW - 1) * geo.sw + geo.KW
    xp = jnp.pad(x, ((0, 0), (geo.pt, max(0, eh - geo.pt - geo.H)),
                     (geo.pl, max(0, ew - geo.pl - geo.W)), (0, 0)),
                 constant_values=jnp.nan)
    for kh in range(geo.KH):
        for kw in range(geo.KW):
            yield kh, kw, xp[:, kh:kh + (geo.OH - 1) * geo.sh + 1:geo.sh,
                             kw:kw + (geo.OW - 1) * geo.sw + 1:geo.sw]


def _geo(ksize: tuple[int, ...], strides: tuple[int, ...], padding: str,
         explicit_paddings: tuple[int, ...], shape: tuple[int, ...]) -> _m.Geometry:
    return _m.geometry_of("MaxPool", ksize, strides, padding, explicit_paddings, shape)


def MaxPool(input: Array, ksize: tuple[int, ...], strides: tuple[int, ...],  # noqa: A002
            padding: str, explicit_paddings: tuple[int, ...] = (),
            data_format: str = "NHWC") -> Array:
    geo = _geo(ksize, strides, padding, explicit_paddings, tuple(input.shape))
    m = jnp.full((geo.N, geo.OH, geo.OW, geo.C), jnp.finfo(input.dtype).min, input.dtype)
    if m.size == 0:
        return m
    for _, _, v in _taps(_flush(input), geo):
        m = jnp.where(m < v, v, m)  # Eigen's cwiseMax: (m < x) ? x : m
    return m


def _argmax(x: Array, geo: _m.Geometry) -> Array:
    """TF's argmax of every window, as a flat index into its image [H * W * C]."""
    shape = (geo.N, geo.OH, geo.OW, geo.C)
    m = jnp.full(shape, jnp.finfo(x.dtype).min, x.dtype)
    arg = jnp.full(shape, -1, jnp.int32)
    oh = (np.arange(geo.OH) * geo.sh - geo.pt)[None, :, None, None]
    ow = (np.arange(geo.OW) * geo.sw - geo.pl)[None, None, :, None]
    c = np.arange(geo.C)[None, None, None, :]
    for kh, kw, v in _taps(_flush(x), geo):
        r, q = oh + kh, ow + kw
        ok = (r >= 0) & (r < geo.H) & (q >= 0) & (q < geo.W)
        take = ok & ((m < v) | (arg < 0))  # the first element, then max < x
        m = jnp.where(take, v, m)
        arg = jnp.where(take, ((r * geo.W + q) * geo.C + c).astype(np.int32), arg)
    return arg


def _cover(n: int, k: int, s: int, p: int, o: int) -> tuple[np.ndarray, np.ndarray, int]:
    """For each input row (column): the first output window covering it, the end of
    those windows (TF's h_start, h_end) and the most windows any row lies in."""
    pos = np.arange(n) + p
    start = np.where(pos < k, 0, (pos - k) // s + 1)
    end = np.minimum(pos // s + 1, o)
    return start, end, int(max((end - start).max(), 0)) if n else 0


def MaxPoolGrad(orig_input: Array, orig_output: Array, grad: Array,
                ksize: tuple[int, ...], strides: tuple[int, ...], padding: str,
                explicit_paddings: tuple[int, ...] = (), data_format: str = "NHWC") -> Array:
    geo = _geo(ksize, strides, padding, explicit_paddings, tuple(orig_input.shape))
    acc = jnp.zeros_like(orig_input)
    if grad.size == 0:
        return acc
    arg = _argmax(orig_input, geo)
    g = _flush(grad)
    h0, h1, rows = _cover(geo.H, geo.KH, geo.sh, geo.pt, geo.OH)
    w0, w1, cols = _cover(geo.W, geo.KW, geo.sw, geo.pl, geo.OW)
    here = ((np.arange(geo.H)[:, None] * geo.W + np.arange(geo.W)[None, :])[:, :, None]
            * geo.C + np.arange(geo.C)[None, None, :])[None]
    for i in range(rows):  # the covering windows in the output's order: oh, then ow
        oh = h0 + i
        ok_h = (oh < h1)[None, :, None, None]
        oh = np.minimum(oh, geo.OH - 1)
        for j in range(cols):
            ow = w0 + j
            ok = ok_h & (ow < w1)[None, None, :, None]
            ow = np.minimum(ow, geo.OW - 1)
            hit = ok & (arg[:, oh][:, :, ow] == here)
            add = jnp.where(hit, g[:, oh][:, :, ow], 0)
            # TF's first addition is +0 + g (-0 gives +0); XLA folds a constant 0 + x
            # into x, so the first step writes it out
            acc = _flush(acc + add) if i or j else jnp.where(add == 0, 0, add)
    return acc
