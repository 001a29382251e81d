"""Depthwise 2-D convolution: DepthwiseConv2dNative and its input and filter gradients.

Output channel ``k * M + q`` (M the channel multiplier) is input channel ``k`` convolved
with ``filter[:, :, k, q]``, computed as TF 2.21's Eigen CPU kernels
(``TF_ENABLE_ONEDNN_OPTS=0``) compute it, bit for bit, zero signs included; NCHW and
dilations, which TF's CPU kernels reject or ignore, are computed as the convolution they
define. This module holds the ops' checks and the NumPy reference (the spec); the kernels
run through ``tfgrad.dispatch.depthwise_conv``. The TF behaviours reproduced, the differences
from TF and the tests that pin them: docs/depthwise_conv.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf.depthwise import Geometry, gap_turns_plus, window
from .._tf.fpenv import flush_denormals
from .._validate import check_alloc, check_float32_copies, overflow_words, shape_str

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


@functools.cache
def _dispatch() -> Any:
    """``tfgrad.dispatch.depthwise_conv``, imported on first use (an import statement in the
    functions cost ~0.5 us a call)."""
    from ..dispatch import depthwise_conv

    return depthwise_conv


# --------------------------------------------------------------------------------------
# Attrs and geometry
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Attrs:
    nchw: bool
    sh: int
    sw: int
    dh: int
    dw: int
    padding: str
    pads_h: tuple[int, int]
    pads_w: tuple[int, int]


def _check_attrs(op: str, strides: tuple[int, ...], padding: str,
                 explicit_paddings: tuple[int, ...], data_format: str,
                 dilations: tuple[int, ...]) -> _Attrs:
    nchw = data_format == "NCHW"
    h, w, c = (2, 3, 1) if nchw else (1, 2, 3)
    if len(strides) != 4:
        raise InvalidArgumentError(
            f"{op}: Sliding window strides field must specify 4 dimensions, got {list(strides)}")
    if strides[h] != strides[w]:
        raise InvalidArgumentError(
            f"{op}: Current implementation only supports equal length strides in the row and "
            f"column dimensions, got strides {list(strides)}")
    if not (strides[0] == 1 and strides[c] == 1):
        raise InvalidArgumentError(
            f"{op}: Current implementation does not yet support strides in the batch and depth "
            f"dimensions, got strides {list(strides)}")
    if strides[h] <= 0:
        raise InvalidArgumentError(f"{op}: Stride must be > 0, but got {strides[h]}")
    if len(dilations) != 4:
        raise InvalidArgumentError(
            f"{op}: Sliding window dilations field must specify 4 dimensions, got "
            f"{list(dilations)}")
    if not (dilations[0] == 1 and dilations[c] == 1):
        raise InvalidArgumentError(
            f"{op}: Current implementation does not yet support dilations in the batch and "
            f"depth dimensions, got dilations {list(dilations)}")
    if not (dilations[h] > 0 and dilations[w] > 0):
        raise InvalidArgumentError(
            f"{op}: Dilated rates should be larger than 0, got dilations {list(dilations)}")
    pads_h = pads_w = (0, 0)
    if padding == "EXPLICIT":
        p = explicit_paddings
        if len(p) != 8:
            raise InvalidArgumentError(
                f"{op}: explicit_paddings attribute must contain 8 values, but "
                f"got: {len(p)}")
        if not all(v >= 0 for v in p):
            raise InvalidArgumentError(
                f"{op}: All elements of explicit_paddings must be nonnegative, got {list(p)}")
        if not (p[0] == p[1] == p[2 * c] == p[2 * c + 1] == 0):
            raise InvalidArgumentError(
                f"{op}: Nonzero explicit padding in the batch or depth dimensions is not "
                f"supported, got explicit_paddings {list(p)}")
        pads_h, pads_w = (p[2 * h], p[2 * h + 1]), (p[2 * w], p[2 * w + 1])
    else:
        if len(explicit_paddings) != 0:
            raise InvalidArgumentError(
                f"{op}: explicit_paddings attribute must be empty if the padding attribute is "
                f"not EXPLICIT, got {list(explicit_paddings)}")
    return _Attrs(nchw, strides[h], strides[w], dilations[h], dilations[w], padding,
                  pads_h, pads_w)


def _geometry(op: str, a: _Attrs, N: int, H: int, W: int, C: int, fh: int, fw: int,
              M: int) -> Geometry:
    oh, pt = window(op, H, fh, a.sh, a.dh, a.padding, a.pads_h)
    ow, pl = window(op, W, fw, a.sw, a.dw, a.padding, a.pads_w)
    # With one output row (column) the stride never moves the window: clamp it (keeping
    # "strided or not"), so that no index product can overflow int64 and no working row
    # sized by the stride is allocated (strides up to 2**63 - 1 are legal).
    sh = a.sh if oh > 1 else min(a.sh, 2)
    sw = a.sw if ow > 1 else min(a.sw, 2)
    return Geometry(N, H, W, C, M, fh, fw, oh, ow, sh, sw, a.dh, a.dw, pt, pl)


# --------------------------------------------------------------------------------------
# Geometry one spatial axis at a time (Python ints and NumPy tables), for the adapters'
# portable implementations (tfgrad.torch, tfgrad.jax)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Axis:
    """One spatial axis of a depthwise convolution."""

    n: int
    """Input size."""
    f: int
    """Filter taps."""
    o: int
    """Output size."""
    s: int
    d: int
    p: int
    """Padding before (TF's pad_top / pad_left)."""

    @property
    def extent(self) -> int:
        """Size of the zero-padded window the outputs read, from the padding's start."""
        return (self.o - 1) * self.s + (self.f - 1) * self.d + 1

    @property
    def stride(self) -> int:
        """The stride to give a convolution over exactly ``extent`` (irrelevant for o = 1,
        where TF's stride may be up to 2**63 - 1)."""
        return self.s if self.o > 1 else 1

    def span(self) -> tuple[int, int, int]:
        """The window as (padding before, input rows, padding after), each >= 0."""
        before = min(self.p, self.extent)
        rows = max(0, min(self.n, self.extent - self.p))
        return before, rows, self.extent - before - rows

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """``reads`` [o, f]: the input index output i's tap r reads (n: the padding);
        ``hits`` [n, f]: the output index input i meets through tap r (o: none), i.e.
        where BackpropInput pairs w with out_backprop (i + p - r * d = s * t)."""
        reads = np.full((self.o, self.f), self.n, np.int64)
        hits = np.full((self.n, self.f), self.o, np.int64)
        for r in range(self.f):
            base = r * self.d - self.p  # (Python ints: pads and dilations up to 2**63 - 1)
            lo = max(0, -(base // self.s))
            hi = min(self.o - 1, (self.n - 1 - base) // self.s)
            if lo <= hi:
                t = np.arange(lo, hi + 1)
                i = (base + self.s * lo) + self.s * (t - lo)  # (each < n: no overflow)
                reads[t, r] = i
                hits[i, r] = t
        return reads, hits


def axes(op: str, strides: tuple[int, ...], padding: str, explicit_paddings: tuple[int, ...],
          data_format: str, dilations: tuple[int, ...], nhwc: tuple[int, int, int, int],
          fsize: tuple[int, int, int, int]) -> tuple[Axis, Axis]:
    a = _check_attrs(op, strides, padding, explicit_paddings, data_format, dilations)
    N, H, W, C = nhwc
    fh, fw, _, M = fsize
    g = _geometry(op, a, N, H, W, C, fh, fw, M)
    return Axis(H, fh, g.oh, g.sh, g.dh, g.pt), Axis(W, fw, g.ow, g.sw, g.dw, g.pl)


def live_taps(reads: np.ndarray, n: int) -> list[int]:
    """The taps that read the input for at least one output."""
    return [int(r) for r in np.flatnonzero((reads != n).any(axis=0))]


def use_grouped_conv(h: Axis, w: Axis, live: int) -> bool:
    """The grouped convolution runs on the whole padded window: take it unless that window
    dwarfs both the input and the gather's work (``live`` taps over the output)."""
    if not all(ax.p < ax.extent < 2**31 for ax in (h, w)):
        return False
    return h.extent * w.extent <= 4 * h.n * w.n + h.o * w.o * live


def _nhwc(t: np.ndarray, nchw: bool) -> np.ndarray:
    return t.transpose(0, 2, 3, 1) if nchw else t


def _back(t: np.ndarray, nchw: bool) -> np.ndarray:
    return np.ascontiguousarray(t.transpose(0, 3, 1, 2)) if nchw else t


def _sizes(op: str, arg: str, sizes: np.ndarray, prefix: str) -> tuple[int, ...]:
    """input_sizes / filter_sizes: a vector of non-negative int32 whose product fits."""
    if sizes.ndim != 1:
        raise InvalidArgumentError(f"{op}: {prefix}: {arg} input must be 1-dim, not {sizes.ndim}")
    # checked before the values are read: a huge broadcast vector must not be walked
    if sizes.size != 4:
        raise InvalidArgumentError(
            f"{op}: {'input' if arg == 'input_sizes' else 'filter'} must be "
            f"4-dimensional ({arg} has {sizes.size} values, expected 4)")
    vals = tuple(sizes.tolist())  # (Python ints)
    for i, v in enumerate(vals):
        if v < 0:
            raise InvalidArgumentError(
                f"{op}: Dimension {i} of {arg} must be >= 0, got {shape_str(vals)}")
    if math.prod(vals) > 2**63 - 1:
        raise InvalidArgumentError(
            f"{op}: {overflow_words(vals)} ({arg} {shape_str(vals)} has more elements than "
            "fit in int64)")
    return vals


def _check_backprop(op: str, a: _Attrs, in_shape: tuple[int, ...],
                    f_shape: tuple[int, ...], g_shape: tuple[int, ...]) -> Geometry:
    """TF's EXTRACT_AND_VERIFY_DIMENSIONS, shapes given in data_format order."""
    label = {"DepthwiseConv2dNativeBackpropInput": "input_sizes",
             "DepthwiseConv2dNativeBackpropFilter": "input"}[op]
    flabel = "filter" if label == "input_sizes" else "filter_sizes"
    if len(in_shape) != 4:
        raise InvalidArgumentError(
            f"{op}: input must be 4-dimensional ({label} has shape {shape_str(in_shape)})")
    if len(f_shape) != 4:
        raise InvalidArgumentError(
            f"{op}: filter must be 4-dimensional ({flabel} has shape {shape_str(f_shape)})")
    if len(g_shape) != 4:
        raise InvalidArgumentError(
            f"{op}: out_backprop must be 4-dimensional, got shape {shape_str(g_shape)}")
    if a.nchw:
        in_shape = (in_shape[0], in_shape[2], in_shape[3], in_shape[1])
        g_shape = (g_shape[0], g_shape[2], g_shape[3], g_shape[1])
    N, H, W, C = in_shape
    fh, fw, fc, M = f_shape
    if N != g_shape[0]:
        raise InvalidArgumentError(
            f"{op}: input and out_backprop must have the same batch size: "
            f"{N} vs {g_shape[0]}")
    if C != fc:
        raise InvalidArgumentError(
            f"{op}: input and filter must have the same in_depth: {C} vs {fc}")
    if M * C != g_shape[3]:
        raise InvalidArgumentError(
            f"{op}: depth_multiplier * in_depth not equal to out_depth: "
            f"{M} * {C} != {g_shape[3]}")
    geo = _geometry(op, a, N, H, W, C, fh, fw, M)
    if g_shape[1] != geo.oh:
        raise InvalidArgumentError(
            f"{op}: Number of rows of out_backprop doesn't match "
            f"computed: actual = {g_shape[1]}, computed = {geo.oh}")
    if g_shape[2] != geo.ow:
        raise InvalidArgumentError(
            f"{op}: Number of cols of out_backprop doesn't match "
            f"computed: actual = {g_shape[2]}, computed = {geo.ow}")
    return geo


# --------------------------------------------------------------------------------------
# The three ops
# --------------------------------------------------------------------------------------
def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every check of ``op``'s arguments that needs only their shapes, dtypes and attrs (and
    the values of its shape inputs), in TF's order; array inputs may be shape-only
    placeholders (see :mod:`tfgrad._shapes`). Returns the forward op's output shape."""
    geo, a = _checked(op, args)
    if op == "DepthwiseConv2dNative":
        return {"output": _out_shape((geo.N, geo.oh, geo.ow, geo.C * geo.M), a.nchw)}
    return {}


def _out_shape(nhwc: tuple[int, ...], nchw: bool) -> tuple[int, ...]:
    return (nhwc[0], nhwc[3], nhwc[1], nhwc[2]) if nchw else nhwc


def _checked(op: str, args: dict[str, Any]) -> tuple[Geometry, _Attrs]:
    a = _check_attrs(op, args["strides"], args["padding"], args["explicit_paddings"],
                     args["data_format"], args["dilations"])
    if op == "DepthwiseConv2dNative":
        input, filter = args["input"], args["filter"]
        if input.ndim != 4:
            raise InvalidArgumentError(
                f"{op}: input must be 4-dimensional{shape_str(input.shape)}")
        if filter.ndim != 4:
            raise InvalidArgumentError(
                f"{op}: filter must be 4-dimensional: {shape_str(filter.shape)}")
        N, H, W, C = _nhwc_shape(input.shape, a.nchw)
        fh, fw, fc, M = filter.shape
        if C != fc:
            raise InvalidArgumentError(
                f"{op}: input and filter must have the same depth: {C} vs {fc}")
        geo = _geometry(op, a, N, H, W, C, fh, fw, M)
        check_alloc(op, "output", (N, geo.oh, geo.ow, C * M), input.dtype)
        check_float32_copies(op, {"input": input, "filter": filter})
    elif op == "DepthwiseConv2dNativeBackpropInput":
        sizes = _sizes(op, "input_sizes", args["input_sizes"], "Conv2DBackpropInput")
        filter, g = args["filter"], args["out_backprop"]
        geo = _check_backprop(op, a, sizes, filter.shape, g.shape)
        check_alloc(op, "output", sizes, filter.dtype)
        check_float32_copies(op, {"filter": filter, "out_backprop": g})
    else:
        sizes = _sizes(op, "filter_sizes", args["filter_sizes"], "Conv2DBackpropFilter")
        input, g = args["input"], args["out_backprop"]
        geo = _check_backprop(op, a, input.shape, sizes, g.shape)
        check_alloc(op, "output", sizes, input.dtype)
        check_float32_copies(op, {"input": input, "out_backprop": g})
        # (TF's order sums each image's filter gradient apart, then adds them in batch order)
        check_alloc(op, "the per-image filter gradients", (geo.N, *sizes),
                    _F64 if input.dtype == _F64 else _F32)
    return geo, a


def _nhwc_shape(shape: tuple[int, ...], nchw: bool) -> tuple[int, ...]:
    return (shape[0], shape[2], shape[3], shape[1]) if nchw else tuple(shape)


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], np.ndarray]:
    """``check`` (the geometry); returns the rest of the op, a function of the arguments
    (``tfgrad._api`` keeps it per signature)."""
    geo, a = _checked(op, args)
    if op == "DepthwiseConv2dNative":
        if a.nchw or geo.N * geo.oh * geo.ow * geo.C * geo.M == 0:
            return lambda k: _forward(k["input"], k["filter"], geo, a)

        def forward_nhwc(k: dict[str, Any]) -> np.ndarray:  # (_forward's common case)
            with flush_denormals():
                if _config.use_reference():
                    with np.errstate(all="ignore"):
                        return forward_reference(k["input"], k["filter"], geo)
                return _dispatch().forward(k["input"], k["filter"], geo)

        return forward_nhwc
    if op == "DepthwiseConv2dNativeBackpropInput":
        return lambda k: _backprop_input(k["filter"], k["out_backprop"], geo, a)
    assert op == "DepthwiseConv2dNativeBackpropFilter", op
    return lambda k: _backprop_filter(k["input"], k["out_backprop"], geo, a)


def DepthwiseConv2dNative(input: np.ndarray, filter: np.ndarray, strides: tuple[int, ...],
                          padding: str, explicit_paddings: tuple[int, ...], data_format: str,
                          dilations: tuple[int, ...]) -> np.ndarray:
    geo, a = _checked("DepthwiseConv2dNative", locals())
    return _forward(input, filter, geo, a)


def _forward(input: np.ndarray, filter: np.ndarray, geo: Geometry, a: _Attrs) -> np.ndarray:
    if geo.N * geo.oh * geo.ow * geo.C * geo.M == 0:  # nothing to compute: never copy a
        return _back(np.zeros((geo.N, geo.oh, geo.ow, geo.C * geo.M), input.dtype), a.nchw)
    x = _nhwc(input, a.nchw)
    with flush_denormals():
        if _config.use_reference():
            with np.errstate(all="ignore"):  # inf and NaN propagate as in TF
                out = forward_reference(x, filter, geo)
        else:
            K = _dispatch()
            out = K.forward(x, filter, geo)
    return _back(out, a.nchw)


def DepthwiseConv2dNativeBackpropInput(input_sizes: np.ndarray, filter: np.ndarray,
                                       out_backprop: np.ndarray, strides: tuple[int, ...],
                                       padding: str, explicit_paddings: tuple[int, ...],
                                       data_format: str,
                                       dilations: tuple[int, ...]) -> np.ndarray:
    geo, a = _checked("DepthwiseConv2dNativeBackpropInput", locals())
    return _backprop_input(filter, out_backprop, geo, a)


def _backprop_input(filter: np.ndarray, out_backprop: np.ndarray, geo: Geometry,
                    a: _Attrs) -> np.ndarray:
    sizes = _out_shape((geo.N, geo.H, geo.W, geo.C), a.nchw)
    if out_backprop.size == 0 or filter.size == 0:  # an empty sum: zeros, no input copies
        return np.zeros(sizes, filter.dtype)
    g = _nhwc(out_backprop, a.nchw)
    with flush_denormals():
        if _config.use_reference():
            with np.errstate(all="ignore"):
                out = backprop_input_reference(filter, g, geo)
        else:
            K = _dispatch()
            out = K.backprop_input(filter, g, geo)
    return _back(out, a.nchw)


def DepthwiseConv2dNativeBackpropFilter(input: np.ndarray, filter_sizes: np.ndarray,
                                        out_backprop: np.ndarray, strides: tuple[int, ...],
                                        padding: str, explicit_paddings: tuple[int, ...],
                                        data_format: str,
                                        dilations: tuple[int, ...]) -> np.ndarray:
    geo, a = _checked("DepthwiseConv2dNativeBackpropFilter", locals())
    return _backprop_filter(input, out_backprop, geo, a)


def _backprop_filter(input: np.ndarray, out_backprop: np.ndarray, geo: Geometry,
                     a: _Attrs) -> np.ndarray:
    sizes = (geo.fh, geo.fw, geo.C, geo.M)
    if out_backprop.size == 0 or math.prod(sizes) == 0:  # an empty sum: zeros, no copies
        return np.zeros(sizes, input.dtype)
    x, g = _nhwc(input, a.nchw), _nhwc(out_backprop, a.nchw)
    with flush_denormals():
        if _config.use_reference():
            with np.errstate(all="ignore"):
                return backprop_filter_reference(x, g, geo)
        K = _dispatch()
        return K.backprop_filter(x, g, geo)


# --------------------------------------------------------------------------------------
# NumPy reference (the readable specification; NHWC)
# --------------------------------------------------------------------------------------
def _is_half(dt: np.dtype) -> bool:
    return dt not in (_F32, _F64)


def _step(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One tap: ``acc + a * b``, as Eigen's (non-FMA) pmadd for T."""
    dt = acc.dtype
    if not _is_half(dt):
        return acc + a * b  # product rounded, then sum rounded
    # Half types: the packet math converts to float32, multiplies and adds there, and
    # rounds the sum back to T.
    return (acc.astype(_F32) + a.astype(_F32) * b.astype(_F32)).astype(dt)


def _add(acc: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``acc += v`` in T (half types add in float32 and round)."""
    if not _is_half(acc.dtype):
        return acc + v
    return (acc.astype(_F32) + v.astype(_F32)).astype(acc.dtype)


def _at(a: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """a[:, rows][:, :, cols], with 0 where a row or column index falls outside a (the
    padding, or an out_backprop position between two strides, given as -1)."""
    v = np.zeros((a.shape[0], rows.size, cols.size) + a.shape[3:], a.dtype)
    ri = np.flatnonzero((rows >= 0) & (rows < a.shape[1]))
    ci = np.flatnonzero((cols >= 0) & (cols < a.shape[2]))
    v[:, ri[:, None], ci[None, :]] = a[:, rows[ri][:, None], cols[ci][None, :]]
    return v


def _signs_view(a: np.ndarray) -> np.ndarray:
    """a as float32 or float64 (same signs and finiteness) for gap_turns_plus."""
    return a if not _is_half(a.dtype) else a.astype(_F32)


def _apply_gaps(acc: np.ndarray, a: np.ndarray, p0: np.ndarray, q0: np.ndarray, sgn: int,
                r: int, c: int, geo: Geometry, sp: int, sq: int) -> None:
    """acc [N, P, Q, C, M] after real tap (r, c): the -0 sums that the inserted zeros
    before the next real tap turn +0 (see gap_turns_plus); position (P, Q)'s tap (0, 0)
    reads (p0[P], q0[Q]) of a [N, ., ., C * M]."""
    if geo.dh == 1 and geo.dw == 1:
        return
    for n, i, j, k, m in np.argwhere((acc == 0) & np.signbit(acc)):
        if gap_turns_plus(a, n, k * geo.M + m, int(p0[i]), int(q0[j]), sgn, r, c, geo.fh,
                          geo.fw, geo.dh, geo.dw, sp, sq):
            acc[n, i, j, k, m] = 0


def forward_reference(x: np.ndarray, w: np.ndarray, geo: Geometry) -> np.ndarray:
    out = np.zeros((geo.N, geo.oh, geo.ow, geo.C, geo.M), x.dtype)
    if out.size == 0:
        return out.reshape(geo.N, geo.oh, geo.ow, geo.C * geo.M)
    i0 = np.arange(geo.oh) * geo.sh - geo.pt  # where tap (0, 0) of each output reads
    j0 = np.arange(geo.ow) * geo.sw - geo.pl
    dilated = geo.dh > 1 or geo.dw > 1
    xs = np.repeat(_signs_view(x), geo.M, axis=3) if dilated else x  # (k * M + m reads k)
    for r in range(geo.fh):  # real taps in row-major order; padding taps compute 0 * w
        for c in range(geo.fw):
            xt = _at(x, i0 + r * geo.dh, j0 + c * geo.dw)[..., None]
            out = _step(out, xt, w[r, c])
            _apply_gaps(out, xs, i0, j0, 1, r, c, geo, 1, 1)
    return out.reshape(geo.N, geo.oh, geo.ow, geo.C * geo.M)


def _hsum(v: np.ndarray) -> np.ndarray:
    """AVX horizontal sum of the last axis (8 float32 lanes or 4 float64 lanes)."""
    if v.shape[-1] == 4:
        return (v[..., 0] + v[..., 2]) + (v[..., 1] + v[..., 3])
    b = v[..., :4] + v[..., 4:]
    return (b[..., 0] + b[..., 2]) + (b[..., 1] + b[..., 3])


def reduce_multiplier(per: np.ndarray) -> np.ndarray:
    """Sum [..., C, M] over M in TF's BackpropInput order (see the module docstring)."""
    dt = per.dtype
    M = per.shape[-1]
    if M == 1:
        return per[..., 0]
    lanes = 4 if dt == _F64 else 8
    acc = np.zeros(per.shape[:-1], dt)
    nvec = M // lanes * lanes
    for p in range(0, nvec, lanes):
        block = per[..., p:p + lanes]
        h = _hsum(block.astype(_F32)).astype(dt) if _is_half(dt) else _hsum(block)
        acc = _add(acc, h)
    for m in range(nvec, M):
        acc = _add(acc, per[..., m])
    return acc


def backprop_input_reference(w: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    N, H, W, C, M = geo.N, geo.H, geo.W, geo.C, geo.M
    per = np.zeros((N, H, W, C, M), w.dtype)
    if per.size == 0 or geo.fh == 0 or geo.fw == 0:  # no taps, or M = 0: empty sums
        return np.zeros((N, H, W, C), w.dtype)  # (TF leaves M = 0 uninitialised)
    # Input pixel (i, j) meets tap (r, c) at out_backprop position (p / sh, q / sw), p =
    # i + pt - r * dh, q = j + pl - c * dw, when the strides divide p and q; every other
    # tap pairs w with 0 (TF's zero-filled buffer), NaN for an inf w.
    p0, q0 = np.arange(H) + geo.pt, np.arange(W) + geo.pl
    g5 = g.reshape(N, geo.oh, geo.ow, C, M)
    gs = _signs_view(g)
    for r in range(geo.fh):
        for c in range(geo.fw):
            p, q = p0 - r * geo.dh, q0 - c * geo.dw
            rows = np.where(p % geo.sh == 0, p // geo.sh, -1)
            cols = np.where(q % geo.sw == 0, q // geo.sw, -1)
            per = _step(per, w[r, c], _at(g5, rows, cols))
            _apply_gaps(per, gs, p0, q0, -1, r, c, geo, geo.sh, geo.sw)
    return reduce_multiplier(per)


def backprop_filter_reference(x: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    N, C, M = geo.N, geo.C, geo.M
    buf = np.zeros((N, geo.fh, geo.fw, C, M), x.dtype)
    if buf.size and geo.oh * geo.ow:
        g5 = g.reshape(N, geo.oh, geo.ow, 1, 1, C, M)
        rows = np.arange(geo.fh) * geo.dh - geo.pt
        cols = np.arange(geo.fw) * geo.dw - geo.pl
        for i in range(geo.oh):  # output positions in row-major order, per image
            for j in range(geo.ow):
                patch = _at(x, i * geo.sh + rows, j * geo.sw + cols)  # (padding taps: g * 0)
                buf = _step(buf, g5[:, i, j], patch[..., None])
    total = np.zeros((geo.fh, geo.fw, C, M), x.dtype)
    for b in range(N):  # per-image buffers added in batch order
        total = _add(total, buf[b])
    return total
