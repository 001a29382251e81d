"""DepthwiseConv2dNative and its two backprops in torch tensor ops, for any device.

The semantics are tfgrad.ops.depthwise_conv's: TF's window arithmetic (SAME puts the odd
pad row / column after; EXPLICIT paddings; C++ division), output channel ``k * M + q``
from input channel ``k`` and ``filter[:, :, k, q]``, NHWC and NCHW, dilations, and the
true dilated adjoints for the backprops (TF's CPU backprops ignore dilations; tfgrad's
do not). The arithmetic is torch's grouped convolution (``groups=C``; filter rearranged
to ``[C * M, 1, fh, fw]``): forward ``F.conv2d``, BackpropInput ``F.conv_transpose2d`` (the
transposed convolution), BackpropFilter ``conv2d_weight``, each on the zero-padded
window the outputs read (asymmetric padding by ``F.pad``), with TF32 off on CUDA.

Numerics (see BOUNDS): the backend sums the taps (and BackpropInput the multiplier
lanes, BackpropFilter the batch and positions) in its own order, where TF's CPU kernels
add them one by one in row-major order. float16 / bfloat16 go through float32 and round
once at the end; TF rounds to T after every tap, so that is where they differ most.

Non-finite values as TF: every tap TF computes over the padding (``0 * w`` in the
forward, ``g * 0`` in BackpropFilter, ``w * 0`` for a BackpropInput tap that meets no
out_backprop value) makes an inf or NaN factor NaN there. Convolution backends skip
implicit padding and the holes of a strided transpose, so those NaNs are put back by a
mask built from the geometry (separable per axis: no large intermediate).

Geometry that would make the padded window huge (dilations or explicit paddings far
beyond the input: the NumPy op takes dilations of 10**12) runs a gather instead: each
filter tap that reads the input anywhere is an index_select of the input (or
out_backprop) on both axes, multiplied in and added in TF's tap order; taps that only
ever read the padding contribute nothing but the mask's NaNs. Memory stays within a
few times the output's.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from ...ops.depthwise_conv import Axis, axes, live_taps, use_grouped_conv

# Measured (CPU: the grouped convolutions and the gather) over tests/cases/depthwise_conv.py
# with 8 seeds, ~500 random geometries (up to N*oh*ow = 1.1e4) and the tests' huge
# geometry, x1.5; distance in ulps of each output's largest |value| (tfgrad._distance).
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    # the order of up to 72 taps; the halves: TF rounds to T after each of them
    "DepthwiseConv2dNative": {"output": {
        "float32": 5, "float64": 6, "float16": 6, "bfloat16": 5}},
    # the taps, then the multiplier lanes (up to 17) in another order than TF's
    "DepthwiseConv2dNativeBackpropInput": {"output": {
        "float32": 8, "float64": 6, "float16": 5, "bfloat16": 4}},
    # TF's sequential sum over the batch and positions (its error grows with their number,
    # about as its square root; these hold up to 1.1e4 positions)
    "DepthwiseConv2dNativeBackpropFilter": {"output": {
        "float32": 50, "float64": 29, "float16": 18, "bfloat16": 23}},
}
_NOT_REPRODUCED = ("The sums run in the backend's order (float16 / bfloat16 in float32, "
                   "rounded once; TF rounds after every step); denormals are not flushed "
                   "(TF runs with FTZ / DAZ); a zero's sign may differ.")
NOTES: dict[str, str] = {op: _NOT_REPRODUCED for op in BOUNDS}

_HALF = (torch.float16, torch.bfloat16)


def _window(x: torch.Tensor, h: Axis, w: Axis) -> torch.Tensor:
    """x [N, C, H, W] cropped / zero-padded to the window [-p, extent - p) on both axes."""
    t, hr, b = h.span()
    left, wr, right = w.span()
    return F.pad(x[:, :, :hr, :wr], (left, right, t, b))


def _unwindow(y: torch.Tensor, h: Axis, w: Axis) -> torch.Tensor:
    """The inverse of _window's placement: y [N, C, extent_h, extent_w] back on the input's
    rows and columns (zeros where the window ends before the input does)."""
    t, hr, _ = h.span()
    left, wr, _ = w.span()
    return F.pad(y[:, :, t:t + hr, left:left + wr], (0, w.n - wr, 0, h.n - hr))


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------
@contextmanager
def _ieee() -> Iterator[None]:
    """cuDNN convolutions in IEEE float32 (no TF32), the user's other cuDNN flags kept."""
    c = torch.backends.cudnn
    # (flags() of older torch releases takes fewer keywords: keep the ones it has)
    kept = {k: getattr(c, k) for k in ("fp32_precision", "depthwise_kernel")
            if k in inspect.signature(c.flags).parameters}
    with c.flags(enabled=c.enabled, benchmark=c.benchmark,
                 benchmark_limit=c.benchmark_limit or 10, deterministic=c.deterministic,
                 allow_tf32=False, **kept):
        yield


def _grouped(w: torch.Tensor) -> torch.Tensor:
    """[fh, fw, C, M] as the grouped convolution's [C * M, 1, fh, fw]: output channel
    k * M + q is group k's q-th."""
    fh, fw, C, M = w.shape
    return w.permute(2, 3, 0, 1).reshape(C * M, 1, fh, fw)


def _compute_dtype(dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt in _HALF else dt


def _nchw(t: torch.Tensor, nchw: bool) -> torch.Tensor:
    """t as [N, C, H, W]; on the CPU in channels-last memory (NHWC data is already), where
    oneDNN's depthwise kernels run (the NCHW-memory path is a generic loop)."""
    t = t if nchw else t.permute(0, 3, 1, 2)
    if t.device.type == "cpu":
        t = t.contiguous(memory_format=torch.channels_last)
    return t


def _back(t: torch.Tensor, nchw: bool, dtype: torch.dtype) -> torch.Tensor:
    return (t if nchw else t.permute(0, 2, 3, 1)).to(dtype).contiguous()


def _nhwc_dims(shape: tuple[int, ...], nchw: bool) -> tuple[int, int, int, int]:
    n, a, b, c = shape
    return (n, b, c, a) if nchw else (n, a, b, c)


def _index(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(a, device=device)


def _pads(reads: np.ndarray, n: int, device: torch.device) -> torch.Tensor | None:
    """[o, f] bool: the (output, tap) pairs that read the padding; None if none do."""
    pad = reads == n
    return _index(pad, device) if pad.any() else None


def _axis_mask(pad: torch.Tensor | None, bad: torch.Tensor) -> torch.Tensor | None:
    """[o, ch]: some tap of output o that reads the padding has a non-finite factor in
    channel ch (pad [o, f], bad [f, ch])."""
    if pad is None:
        return None
    return (pad[:, :, None] & bad[None]).any(dim=1)


def _with_nans(y: torch.Tensor, mh: torch.Tensor | None, mw: torch.Tensor | None
               ) -> torch.Tensor:
    """y [..., ch, a, b] with NaN where mh [a, ch] or mw [b, ch] says so: TF's padding
    taps ``0 * inf`` (the taps of one output are the pairs of its row's and column's
    taps, so a padded pair has a padded row tap or a padded column tap)."""
    if mh is None and mw is None:
        return y
    a, b = y.shape[-2:]
    ch = y.shape[-3]
    m = torch.zeros((ch, a, b), dtype=torch.bool, device=y.device)
    if mh is not None:
        m = m | mh.T[:, :, None]
    if mw is not None:
        m = m | mw.T[:, None, :]
    return torch.where(m, torch.full((), math.nan, dtype=y.dtype, device=y.device), y)


# --------------------------------------------------------------------------------------
# The three ops
# --------------------------------------------------------------------------------------
def DepthwiseConv2dNative(input: torch.Tensor, filter: torch.Tensor, strides: tuple[int, ...],
                          padding: str, explicit_paddings: tuple[int, ...], data_format: str,
                          dilations: tuple[int, ...]) -> torch.Tensor:
    op = "DepthwiseConv2dNative"
    nchw = data_format == "NCHW"
    N, H, W, C = _nhwc_dims(tuple(input.shape), nchw)
    fh, fw, _, M = filter.shape
    h, w = axes(op, strides, padding, explicit_paddings, data_format, dilations,
                 (N, H, W, C), tuple(filter.shape))
    dt, dev = input.dtype, input.device
    if N * C * M * h.o * w.o == 0 or fh * fw == 0:  # an empty output or no taps: zeros
        return _back(torch.zeros((N, C * M, h.o, w.o), dtype=dt, device=dev), nchw, dt)
    ct = _compute_dtype(dt)
    x = _nchw(input, nchw).to(ct)
    wt = filter.to(ct)
    rh, _ = h.tables()
    rw, _ = w.tables()
    live_h, live_w = live_taps(rh, H), live_taps(rw, W)
    if use_grouped_conv(h, w, len(live_h) * len(live_w)):
        with _ieee():
            y = F.conv2d(_window(x, h, w), _grouped(wt), stride=(h.stride, w.stride),
                         dilation=(h.d, w.d), groups=C)
    else:
        y = _forward_gather(x, wt, rh, rw, live_h, live_w)
    bad = ~torch.isfinite(filter).reshape(fh, fw, C * M)
    y = _with_nans(y, _axis_mask(_pads(rh, H, dev), bad.any(dim=1)),
                   _axis_mask(_pads(rw, W, dev), bad.any(dim=0)))
    return _back(y, nchw, dt)


def _forward_gather(x: torch.Tensor, w: torch.Tensor, rh: np.ndarray, rw: np.ndarray,
                    live_h: list[int], live_w: list[int]) -> torch.Tensor:
    N, C, _, _ = x.shape
    M = w.shape[3]
    xp = F.pad(x, (0, 1, 0, 1))  # index n of a table reads this zero row / column
    ih, iw = _index(rh, x.device), _index(rw, x.device)
    y = torch.zeros((N, C, M, rh.shape[0], rw.shape[0]), dtype=x.dtype, device=x.device)
    for r in live_h:  # TF's tap order; the padding's 0 * w is computed (NaN for inf w)
        xr = xp.index_select(2, ih[:, r])
        for c in live_w:
            y = y + xr.index_select(3, iw[:, c])[:, :, None] * w[r, c][None, :, :, None, None]
    return y.reshape(N, C * M, rh.shape[0], rw.shape[0])


def DepthwiseConv2dNativeBackpropInput(input_sizes: tuple[int, ...], filter: torch.Tensor,
                                       out_backprop: torch.Tensor, strides: tuple[int, ...],
                                       padding: str, explicit_paddings: tuple[int, ...],
                                       data_format: str,
                                       dilations: tuple[int, ...]) -> torch.Tensor:
    op = "DepthwiseConv2dNativeBackpropInput"
    nchw = data_format == "NCHW"
    N, H, W, C = _nhwc_dims(tuple(input_sizes), nchw)
    fh, fw, _, M = filter.shape
    h, w = axes(op, strides, padding, explicit_paddings, data_format, dilations,
                 (N, H, W, C), tuple(filter.shape))
    dt, dev = filter.dtype, filter.device
    if out_backprop.numel() == 0 or filter.numel() == 0:  # an empty sum: zeros
        return _back(torch.zeros((N, C, H, W), dtype=dt, device=dev), nchw, dt)
    ct = _compute_dtype(dt)
    g = _nchw(out_backprop, nchw).to(ct)
    wt = filter.to(ct)
    rh, hh = h.tables()
    rw, hw = w.tables()
    live_h, live_w = live_taps(rh, H), live_taps(rw, W)
    if use_grouped_conv(h, w, len(live_h) * len(live_w)):
        with _ieee():  # the window's gradient: exactly extent rows, no output_padding
            dxw = F.conv_transpose2d(g, _grouped(wt), stride=(h.stride, w.stride),
                                     dilation=(h.d, w.d), groups=C)
        dx = _unwindow(dxw, h, w)
    else:
        dx = _backprop_input_gather(g, wt, hh, hw, live_h, live_w)
    bad = (~torch.isfinite(filter)).any(dim=3)  # [fh, fw, C]: a lane of channel k
    dx = _with_nans(dx, _axis_mask(_pads(hh, h.o, dev), bad.any(dim=1)),
                    _axis_mask(_pads(hw, w.o, dev), bad.any(dim=0)))
    return _back(dx, nchw, dt)


def _backprop_input_gather(g: torch.Tensor, w: torch.Tensor, hh: np.ndarray, hw: np.ndarray,
                           live_h: list[int], live_w: list[int]) -> torch.Tensor:
    N = g.shape[0]
    C, M = w.shape[2:]
    H, W = hh.shape[0], hw.shape[0]
    gp = F.pad(g, (0, 1, 0, 1))  # index o of a table: no out_backprop value, w * 0
    ih, iw = _index(hh, g.device), _index(hw, g.device)
    acc = torch.zeros((N, C, M, H, W), dtype=g.dtype, device=g.device)
    for r in live_h:  # per lane (k, q), taps in TF's order; then the sum over q
        gr = gp.index_select(2, ih[:, r])
        for c in live_w:
            gt = gr.index_select(3, iw[:, c]).reshape(N, C, M, H, W)
            acc = acc + w[r, c][None, :, :, None, None] * gt
    return acc.sum(dim=2)


def DepthwiseConv2dNativeBackpropFilter(input: torch.Tensor, filter_sizes: tuple[int, ...],
                                        out_backprop: torch.Tensor, strides: tuple[int, ...],
                                        padding: str, explicit_paddings: tuple[int, ...],
                                        data_format: str,
                                        dilations: tuple[int, ...]) -> torch.Tensor:
    op = "DepthwiseConv2dNativeBackpropFilter"
    nchw = data_format == "NCHW"
    N, H, W, C = _nhwc_dims(tuple(input.shape), nchw)
    fh, fw, _, M = filter_sizes
    h, w = axes(op, strides, padding, explicit_paddings, data_format, dilations,
                 (N, H, W, C), tuple(filter_sizes))
    dt, dev = input.dtype, input.device
    if out_backprop.numel() == 0 or math.prod(filter_sizes) == 0:  # an empty sum: zeros
        return torch.zeros(tuple(filter_sizes), dtype=dt, device=dev)
    ct = _compute_dtype(dt)
    x = _nchw(input, nchw).to(ct)
    g = _nchw(out_backprop, nchw).to(ct)
    rh, _ = h.tables()
    rw, _ = w.tables()
    live_h, live_w = live_taps(rh, H), live_taps(rw, W)
    if use_grouped_conv(h, w, len(live_h) * len(live_w)):
        with _ieee():
            dwt = torch.nn.grad.conv2d_weight(
                _window(x, h, w), (C * M, 1, fh, fw), g, stride=(h.stride, w.stride),
                dilation=(h.d, w.d), groups=C)
        dw = dwt.reshape(C, M, fh, fw).permute(2, 3, 0, 1)
    else:
        dw = _backprop_filter_gather(x, g, rh, rw, live_h, live_w, M)
    ph, pw = _pads(rh, H, dev), _pads(rw, W, dev)
    if ph is not None or pw is not None:  # g * 0 on a padding tap is NaN
        bad = _nchw(~torch.isfinite(out_backprop), nchw)  # [N, C * M, oh, ow]
        mh = _axis_mask(None if ph is None else ph.T, bad.any(dim=3).any(dim=0).T)  # [fh, CM]
        mw = _axis_mask(None if pw is None else pw.T, bad.any(dim=2).any(dim=0).T)  # [fw, CM]
        dw = _with_nans(dw.reshape(fh, fw, C * M).permute(2, 0, 1), mh, mw)
        dw = dw.permute(1, 2, 0).reshape(fh, fw, C, M)
    return dw.to(dt).contiguous()


def _backprop_filter_gather(x: torch.Tensor, g: torch.Tensor, rh: np.ndarray, rw: np.ndarray,
                            live_h: list[int], live_w: list[int], M: int) -> torch.Tensor:
    N, C, _, _ = x.shape
    oh, ow = rh.shape[0], rw.shape[0]
    xp = F.pad(x, (0, 1, 0, 1))
    ih, iw = _index(rh, x.device), _index(rw, x.device)
    g5 = g.reshape(N, C, M, oh, ow)
    dw = torch.zeros((rh.shape[1], rw.shape[1], C, M), dtype=x.dtype, device=x.device)
    for r in live_h:  # taps that only read the padding stay 0 (the mask adds g * 0's NaNs)
        xr = xp.index_select(2, ih[:, r])
        for c in live_w:
            dw[r, c] = (g5 * xr.index_select(3, iw[:, c])[:, :, None]).sum(dim=(0, 3, 4))
    return dw
