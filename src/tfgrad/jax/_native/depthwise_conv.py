"""DepthwiseConv2dNative and its two backprops in jax.lax, for any JAX backend (jittable:
every argument but the arrays is static).

The semantics are tfgrad.ops.depthwise_conv's: TF's window arithmetic (SAME puts the odd
pad row / column after; EXPLICIT paddings; C++ division), output channel ``k * M + q``
from input channel ``k`` and ``filter[:, :, k, q]``, NHWC and NCHW, dilations, and the
true dilated adjoints for the backprops (TF's CPU backprops ignore dilations; tfgrad's
do not). The arithmetic, over the zero-padded window the outputs read:

- off the CPU, XLA's grouped convolution (``lax.conv_general_dilated``,
  ``feature_group_count=C``, the filter as HWIO ``[fh, fw, 1, C * M]``) at
  ``Precision.HIGHEST`` (no TF32 / bf16 passes): the forward; BackpropInput as JAX's
  transpose of it (the transposed convolution); BackpropFilter as JAX's filter
  transpose, one multiplier lane at a time (with M > 1 outputs per group that transpose
  does C times the work);
- on XLA:CPU, whose grouped convolutions run as a generic loop, the same sums tap by
  tap: each tap a strided slice of the padded input (BackpropInput: of out_backprop
  spread by the strides), multiplied and added in TF's tap order, which XLA fuses into
  one loop (``lax.platform_dependent`` picks at lowering). BackpropFilter keeps the
  per-lane filter transpose there too.

Numerics (see BOUNDS): XLA sums in its own order (and contracts multiply-adds), where
TF's CPU kernels add taps one by one in row-major order, the multiplier lanes in
AVX-lane order and BackpropFilter's batch and positions sequentially. float16 /
bfloat16 go through float32 and round once at the end; TF rounds to T after every tap.

Non-finite values as TF: every tap TF computes over the padding (``0 * w`` in the
forward, ``g * 0`` in BackpropFilter, ``w * 0`` for a BackpropInput tap that meets no
out_backprop value) makes an inf or NaN factor NaN there. XLA's convolutions skip
implicit padding and the holes of a dilated input, so those NaNs are put back by a mask
built from the geometry (separable per axis: no large intermediate).

Geometry that would make the padded window huge (dilations or explicit paddings far
beyond the input: the NumPy op takes dilations of 10**12) runs a gather instead: the
filter taps that read the input anywhere gather it (or out_backprop) at static indices
on both axes and are multiplied in; taps that only ever read the padding contribute
nothing but the mask's NaNs. Memory stays within a few times the output's.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...ops.depthwise_conv import Axis, axes, live_taps, use_grouped_conv

# Measured on CPU (the tap-by-tap slices, the grouped convolutions that other backends
# run, the gather) over tests/cases/depthwise_conv.py with 8 seeds, ~500 random
# geometries (up to N*oh*ow = 1.1e4) and the tests' huge geometry, x1.5; distance in
# ulps of each output's largest |value| (tfgrad._distance).
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    # the order of up to 72 taps (float32: XLA:CPU's multiply-add contraction where a
    # small output's taps cancel, 5.9); the halves: TF rounds to T after each tap
    "DepthwiseConv2dNative": {"output": {
        "float32": 9, "float64": 6, "float16": 6, "bfloat16": 5}},
    # the taps, then the multiplier lanes (up to 17) in another order than TF's
    "DepthwiseConv2dNativeBackpropInput": {"output": {
        "float32": 5, "float64": 8, "float16": 5, "bfloat16": 4}},
    # TF's sequential sum over the batch and positions (its error grows with their number,
    # about as its square root; these hold up to 1.1e4 positions)
    "DepthwiseConv2dNativeBackpropFilter": {"output": {
        "float32": 48, "float64": 44, "float16": 18, "bfloat16": 23}},
}
_NOT_REPRODUCED = ("The sums run in XLA's order (float16 / bfloat16 in float32, rounded "
                   "once; TF rounds after every step); denormals are flushed only where the "
                   "backend does (XLA:CPU does); a zero's sign may differ.")
NOTES: dict[str, str] = {op: _NOT_REPRODUCED for op in BOUNDS}

_HIGHEST = lax.Precision.HIGHEST


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------
def _compute_dtype(dt: Any) -> Any:
    return jnp.float32 if dt in (jnp.float16, jnp.bfloat16) else dt


def _nhwc_dims(shape: tuple[int, ...], nchw: bool) -> tuple[int, int, int, int]:
    n, a, b, c = shape
    return (n, b, c, a) if nchw else (n, a, b, c)


def _spec(nchw: bool) -> tuple[str, str, str]:
    return ("NCHW", "HWIO", "NCHW") if nchw else ("NHWC", "HWIO", "NHWC")


def _window(x: jax.Array, h: Axis, w: Axis, nchw: bool
            ) -> tuple[jax.Array, list[tuple[int, int]]]:
    """x cropped to the input rows / columns the window holds, and the window's zero
    padding (before, after) per spatial axis, for the convolution's ``padding``."""
    (t, hr, b), (left, wr, right) = h.span(), w.span()
    x = x[:, :, :hr, :wr] if nchw else x[:, :hr, :wr, :]
    return x, [(t, b), (left, right)]


def _pads(reads: np.ndarray, n: int) -> np.ndarray | None:
    """[o, f] bool: the (output, tap) pairs that read the padding; None if none do."""
    pad = reads == n
    return pad if pad.any() else None


def _axis_mask(pad: np.ndarray | None, bad: jax.Array) -> jax.Array | None:
    """[o, ch]: some tap of output o that reads the padding has a non-finite factor in
    channel ch (pad [o, f], bad [f, ch])."""
    if pad is None:
        return None
    return (jnp.asarray(pad)[:, :, None] & bad[None]).any(axis=1)


def _with_nans(y: jax.Array, mh: jax.Array | None, mw: jax.Array | None,
               chw: bool) -> jax.Array:
    """y [..., a, b, ch] (chw: [..., ch, a, b]) with NaN where mh [a, ch] or mw [b, ch]
    says so: TF's padding taps ``0 * inf`` (the taps of one output are the pairs of its
    row's and column's taps, so a padded pair has a padded row tap or a padded column
    tap)."""
    if mh is None and mw is None:
        return y
    a, b = (y.shape[-2], y.shape[-1]) if chw else (y.shape[-3], y.shape[-2])
    ch = y.shape[-3] if chw else y.shape[-1]
    m = jnp.zeros((a, b, ch), bool)
    if mh is not None:
        m = m | mh[:, None, :]
    if mw is not None:
        m = m | mw[None, :, :]
    if chw:
        m = m.transpose(2, 0, 1)
    return jnp.where(m, jnp.asarray(math.nan, y.dtype), y)


def _to_nhwc(t: jax.Array, nchw: bool) -> jax.Array:
    return t.transpose(0, 2, 3, 1) if nchw else t


def _from_nhwc(t: jax.Array, nchw: bool) -> jax.Array:
    return t.transpose(0, 3, 1, 2) if nchw else t


def _out_shape(nhwc: tuple[int, int, int, int], nchw: bool) -> tuple[int, int, int, int]:
    n, a, b, c = nhwc
    return (n, c, a, b) if nchw else nhwc


# --------------------------------------------------------------------------------------
# The three ops
# --------------------------------------------------------------------------------------
_CPU_SLICES = True
"""Take the tap-by-tap slices on XLA:CPU (tests turn it off to check the convolutions)."""


def _by_platform(default: Any, cpu: Any, *args: jax.Array) -> jax.Array:
    """``default(*args)``, or ``cpu(*args)`` when lowered for XLA:CPU, whose grouped
    convolutions run as a generic loop far slower than the tap-by-tap slices (which XLA
    fuses into one elementwise loop)."""
    if not _CPU_SLICES:
        return default(*args)
    return lax.platform_dependent(*args, cpu=cpu, default=default)


def _conv(x: jax.Array, w: jax.Array, h: Axis, wa: Axis, pads: list[tuple[int, int]],
          nchw: bool) -> jax.Array:
    """The grouped convolution: w [fh, fw, C, M] as HWIO [fh, fw, 1, C * M], so output
    channel k * M + q is group k's q-th."""
    fh, fw, C, M = w.shape
    return lax.conv_general_dilated(
        x, w.reshape(fh, fw, 1, C * M), (h.stride, wa.stride), pads, rhs_dilation=(h.d, wa.d),
        dimension_numbers=_spec(nchw), feature_group_count=C, precision=_HIGHEST)


def _tap(xp: jax.Array, h: Axis, wa: Axis, r: int, c: int) -> jax.Array:
    """What tap (r, c) reads for every output: a strided slice of the padded window
    xp [N, extent_h, extent_w, ch]."""
    N, _, _, ch = xp.shape
    return lax.slice(xp, (0, r * h.d, c * wa.d, 0),
                     (N, r * h.d + (h.o - 1) * h.stride + 1,
                      c * wa.d + (wa.o - 1) * wa.stride + 1, ch),
                     (1, h.stride, wa.stride, 1))


def DepthwiseConv2dNative(input: jax.Array, filter: jax.Array, strides: tuple[int, ...],
                          padding: str, explicit_paddings: tuple[int, ...], data_format: str,
                          dilations: tuple[int, ...]) -> jax.Array:
    op = "DepthwiseConv2dNative"
    nchw = data_format == "NCHW"
    N, H, W, C = _nhwc_dims(tuple(input.shape), nchw)
    fh, fw, _, M = filter.shape
    h, w = axes(op, strides, padding, explicit_paddings, data_format, dilations,
                 (N, H, W, C), tuple(filter.shape))
    dt = input.dtype
    out = _out_shape((N, h.o, w.o, C * M), nchw)
    if N * C * M * h.o * w.o == 0 or fh * fw == 0:  # an empty output or no taps: zeros
        return jnp.zeros(out, dt)
    ct = _compute_dtype(dt)
    x, wt = input.astype(ct), filter.astype(ct)
    rh, _ = h.tables()
    rw, _ = w.tables()
    live_h, live_w = live_taps(rh, H), live_taps(rw, W)
    if use_grouped_conv(h, w, len(live_h) * len(live_w)):
        xw, pads = _window(x, h, w, nchw)

        def slices(x: jax.Array, f: jax.Array) -> jax.Array:
            xp = jnp.pad(_to_nhwc(x, nchw), ((0, 0), *pads, (0, 0)))
            y = jnp.zeros((N, h.o, w.o, C, M), ct)
            for r in range(fh):  # TF's tap order
                for c in range(fw):
                    y = y + _tap(xp, h, w, r, c)[..., None] * f[r, c]
            return _from_nhwc(y.reshape(N, h.o, w.o, C * M), nchw)

        y = _by_platform(lambda x, f: _conv(x, f, h, w, pads, nchw), slices, xw, wt)
    else:
        y = _from_nhwc(_forward_gather(_to_nhwc(x, nchw), wt, rh, rw, live_h, live_w), nchw)
    bad = ~jnp.isfinite(filter).reshape(fh, fw, C * M)
    y = _with_nans(y, _axis_mask(_pads(rh, H), bad.any(axis=1)),
                   _axis_mask(_pads(rw, W), bad.any(axis=0)), nchw)
    return y.astype(dt)


def _patches(x: jax.Array, rh: np.ndarray, rw: np.ndarray, live_h: list[int],
             live_w: list[int]) -> jax.Array:
    """x [N, a, b, ch] read at the live taps' static indices: [N, oh, lh, ow, lw, ch]; a
    table's index a (b) reads the zero row (column) appended here."""
    xp = jnp.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)))
    return xp[:, rh[:, live_h]][:, :, :, rw[:, live_w]]


def _forward_gather(x: jax.Array, w: jax.Array, rh: np.ndarray, rw: np.ndarray,
                    live_h: list[int], live_w: list[int]) -> jax.Array:
    N, _, _, C = x.shape
    M = w.shape[3]
    p = _patches(x, rh, rw, live_h, live_w)  # (the padding's 0 * w: NaN for inf)
    y = jnp.zeros((N, rh.shape[0], rw.shape[0], C, M), x.dtype)
    for a, r in enumerate(live_h):  # TF's tap order
        for b, c in enumerate(live_w):
            y = y + p[:, :, a, :, b, :, None] * w[r, c]
    return y.reshape(N, rh.shape[0], rw.shape[0], C * M)


def DepthwiseConv2dNativeBackpropInput(input_sizes: tuple[int, ...], filter: jax.Array,
                                       out_backprop: jax.Array, strides: tuple[int, ...],
                                       padding: str, explicit_paddings: tuple[int, ...],
                                       data_format: str,
                                       dilations: tuple[int, ...]) -> jax.Array:
    op = "DepthwiseConv2dNativeBackpropInput"
    nchw = data_format == "NCHW"
    N, H, W, C = _nhwc_dims(tuple(input_sizes), nchw)
    fh, fw, _, M = filter.shape
    h, w = axes(op, strides, padding, explicit_paddings, data_format, dilations,
                 (N, H, W, C), tuple(filter.shape))
    dt = filter.dtype
    if out_backprop.size == 0 or filter.size == 0:  # an empty sum: zeros
        return jnp.zeros(tuple(input_sizes), dt)
    ct = _compute_dtype(dt)
    g, wt = out_backprop.astype(ct), filter.astype(ct)
    rh, hh = h.tables()
    rw, hw = w.tables()
    live_h, live_w = live_taps(rh, H), live_taps(rw, W)
    if use_grouped_conv(h, w, len(live_h) * len(live_w)):
        (_, hr, _), (_, wr, _) = h.span(), w.span()
        xw, pads = _window(jnp.zeros(_out_shape((N, H, W, C), nchw), ct), h, w, nchw)

        def transposed(g: jax.Array, f: jax.Array) -> jax.Array:
            # JAX's transpose of the forward: the convolution of out_backprop spread by
            # the strides with the flipped filter, over the input rows the window holds
            _, vjp = jax.vjp(lambda x: _conv(x, f, h, w, pads, nchw), xw)
            return _from_nhwc(jnp.pad(_to_nhwc(vjp(g)[0], nchw),
                                      ((0, 0), (0, H - hr), (0, W - wr), (0, 0))), nchw)

        def slices(g: jax.Array, f: jax.Array) -> jax.Array:
            # input row i meets tap r at row i + p - r * d of out_backprop spread by the
            # strides (zeros between); padded so that tap r reads rows (f - 1 - r) * d + i.
            # The lanes q lead ([M, N, ., ., C]) so that each slice is one strided copy.
            gm = _to_nhwc(g, nchw).reshape(N, h.o, w.o, C, M).transpose(4, 0, 1, 2, 3)
            spread = [(0, 0, 0), (0, 0, 0),
                      *[((ax.f - 1) * ax.d - ax.p, ax.p + ax.n - 1 - (ax.o - 1) * ax.stride,
                         ax.stride - 1) for ax in (h, w)], (0, 0, 0)]
            gd = lax.pad(gm, jnp.zeros((), ct), spread)
            fm = f.transpose(0, 1, 3, 2)[:, :, :, None, None, None, :]  # [., ., M, ., C]
            acc = jnp.zeros((M, N, H, W, C), ct)
            for r in range(fh):  # per lane, taps in TF's order; then the sum over q
                for c in range(fw):
                    a, b = (fh - 1 - r) * h.d, (fw - 1 - c) * w.d
                    gt = lax.slice(gd, (0, 0, a, b, 0), (M, N, a + H, b + W, C))
                    acc = acc + gt * fm[r, c]
            dx = acc[0]
            for q in range(1, M):
                dx = dx + acc[q]
            return _from_nhwc(dx, nchw)

        dx = _by_platform(transposed, slices, g, wt)
    else:
        dx = _from_nhwc(_backprop_input_gather(_to_nhwc(g, nchw), wt, hh, hw, live_h, live_w),
                        nchw)
    bad = (~jnp.isfinite(filter)).any(axis=3)  # [fh, fw, C]: a lane of channel k
    dx = _with_nans(dx, _axis_mask(_pads(hh, h.o), bad.any(axis=1)),
                    _axis_mask(_pads(hw, w.o), bad.any(axis=0)), nchw)
    return dx.astype(dt)


def _backprop_input_gather(g: jax.Array, w: jax.Array, hh: np.ndarray, hw: np.ndarray,
                           live_h: list[int], live_w: list[int]) -> jax.Array:
    N = g.shape[0]
    C, M = w.shape[2:]
    H, W = hh.shape[0], hw.shape[0]
    p = _patches(g, hh, hw, live_h, live_w)  # (index o: no value, w * 0)
    p = p.reshape(N, H, len(live_h), W, len(live_w), C, M)
    return (p * w[np.ix_(live_h, live_w)][:, None]).sum(axis=(2, 4, 6))


def DepthwiseConv2dNativeBackpropFilter(input: jax.Array, filter_sizes: tuple[int, ...],
                                        out_backprop: jax.Array, strides: tuple[int, ...],
                                        padding: str, explicit_paddings: tuple[int, ...],
                                        data_format: str,
                                        dilations: tuple[int, ...]) -> jax.Array:
    op = "DepthwiseConv2dNativeBackpropFilter"
    nchw = data_format == "NCHW"
    N, H, W, C = _nhwc_dims(tuple(input.shape), nchw)
    fh, fw, _, M = filter_sizes
    h, w = axes(op, strides, padding, explicit_paddings, data_format, dilations,
                 (N, H, W, C), tuple(filter_sizes))
    dt = input.dtype
    if out_backprop.size == 0 or math.prod(filter_sizes) == 0:  # an empty sum: zeros
        return jnp.zeros(tuple(filter_sizes), dt)
    ct = _compute_dtype(dt)
    x, g = input.astype(ct), out_backprop.astype(ct)
    rh, _ = h.tables()
    rw, _ = w.tables()
    live_h, live_w = live_taps(rh, H), live_taps(rw, W)
    if use_grouped_conv(h, w, len(live_h) * len(live_w)):
        xw, pads = _window(x, h, w, nchw)
        g5 = _to_nhwc(g, nchw).reshape(N, h.o, w.o, C, M)
        # One multiplier lane at a time: JAX's filter transpose of a grouped convolution
        # with M > 1 outputs per group does C times the work (M = 1 is depthwise).
        _, vjp = jax.vjp(lambda f: _conv(xw, f, h, w, pads, nchw),
                         jnp.zeros((fh, fw, C, 1), ct))
        dw = jnp.stack([vjp(_from_nhwc(g5[..., q], nchw))[0][..., 0] for q in range(M)],
                       axis=-1)
    else:
        dw = _backprop_filter_gather(_to_nhwc(x, nchw), _to_nhwc(g, nchw), rh, rw, live_h,
                                     live_w, M)
    ph, pw = _pads(rh, H), _pads(rw, W)
    if ph is not None or pw is not None:  # g * 0 on a padding tap is NaN
        bad = ~jnp.isfinite(_to_nhwc(out_backprop, nchw))  # [N, oh, ow, C * M]
        mh = _axis_mask(None if ph is None else ph.T, bad.any(axis=(0, 2)))  # [fh, C * M]
        mw = _axis_mask(None if pw is None else pw.T, bad.any(axis=(0, 1)))  # [fw, C * M]
        dw = _with_nans(dw.reshape(fh, fw, C * M), mh, mw, False).reshape(fh, fw, C, M)
    return dw.astype(dt)


def _backprop_filter_gather(x: jax.Array, g: jax.Array, rh: np.ndarray, rw: np.ndarray,
                            live_h: list[int], live_w: list[int], M: int) -> jax.Array:
    N, _, _, C = x.shape
    oh, ow = rh.shape[0], rw.shape[0]
    p = _patches(x, rh, rw, live_h, live_w)[..., None]  # [N, oh, lh, ow, lw, C, 1]
    g7 = g.reshape(N, oh, 1, ow, 1, C, M)
    dw = jnp.zeros((rh.shape[1], rw.shape[1], C, M), x.dtype)
    # taps that only read the padding stay 0 (the mask adds g * 0's NaNs)
    return dw.at[np.ix_(live_h, live_w)].set((p * g7).sum(axis=(0, 1, 3)))
