"""MaxPool and MaxPoolGrad in torch tensor ops, on any device (float32 / float64, NHWC).

TF's rules exactly (:mod:`tfgrad.ops.max_pool`, docs/max_pool.md), as whole-tensor
steps over the window's taps in row-major order: denormals read as zeros of their sign
(explicit, whatever the device does), each output starts at the type's lowest value and
takes a tap's value where ``out < x`` (padding reads NaN, which is never taken). The
gradient recomputes TF's argmax (the window's first element, then ``max < x``) and sums
each input's gradients in TF's order, the output's (oh, ow) order: one step per
position of an input among the windows that cover it, each a flushed addition (adding
+0 where the window's argmax is elsewhere changes nothing: a sum that starts at +0 is
never -0). No rounding differs from the exact kernels: bit-identical (BOUNDS: 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...ops import max_pool as _m

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "MaxPool": {"output": {"float32": 0, "float64": 0}},
    "MaxPoolGrad": {"output": {"float32": 0, "float64": 0}},
}
NOTES: dict[str, str] = {}


def _flush(x: torch.Tensor) -> torch.Tensor:
    """DAZ / FTZ: a denormal becomes a zero of its sign."""
    return torch.where(x.abs() < torch.finfo(x.dtype).tiny, x * 0, x)


def _taps(x: torch.Tensor, geo: _m.Geometry):  # type: ignore[no-untyped-def]
    """(kh, kw, the tap's input for every output [N, OH, OW, C]), row-major; the padding
    reads NaN."""
    eh = (geo.OH - 1) * geo.sh + geo.KH
    ew = (geo.OW - 1) * geo.sw + geo.KW
    xp = F.pad(x, (0, 0, geo.pl, max(0, ew - geo.pl - geo.W), geo.pt,
                   max(0, eh - geo.pt - geo.H)), value=float("nan"))
    for kh in range(geo.KH):
        for kw in range(geo.KW):
            yield kh, kw, xp[:, kh:kh + (geo.OH - 1) * geo.sh + 1:geo.sh,
                             kw:kw + (geo.OW - 1) * geo.sw + 1:geo.sw]


def _geo(ksize: tuple[int, ...], strides: tuple[int, ...], padding: str,
         explicit_paddings: tuple[int, ...], shape: tuple[int, ...]) -> _m.Geometry:
    return _m.geometry_of("MaxPool", ksize, strides, padding, explicit_paddings, shape)


def MaxPool(input: torch.Tensor, ksize: tuple[int, ...], strides: tuple[int, ...],  # noqa: A002
            padding: str, explicit_paddings: tuple[int, ...] = (),
            data_format: str = "NHWC") -> torch.Tensor:
    geo = _geo(ksize, strides, padding, explicit_paddings, tuple(input.shape))
    m = input.new_full((geo.N, geo.OH, geo.OW, geo.C), torch.finfo(input.dtype).min)
    if m.numel() == 0:
        return m
    for _, _, v in _taps(_flush(input), geo):
        m = torch.where(m < v, v, m)  # Eigen's cwiseMax: (m < x) ? x : m
    return m


def _argmax(x: torch.Tensor, geo: _m.Geometry) -> torch.Tensor:
    """TF's argmax of every window, as a flat index into its image [H * W * C]."""
    dev = x.device
    shape = (geo.N, geo.OH, geo.OW, geo.C)
    m = x.new_full(shape, torch.finfo(x.dtype).min)
    arg = torch.full(shape, -1, dtype=torch.int64, device=dev)
    oh = (torch.arange(geo.OH, device=dev) * geo.sh - geo.pt)[None, :, None, None]
    ow = (torch.arange(geo.OW, device=dev) * geo.sw - geo.pl)[None, None, :, None]
    c = torch.arange(geo.C, device=dev)[None, None, None, :]
    for kh, kw, v in _taps(_flush(x), geo):
        r, q = oh + kh, ow + kw
        ok = (r >= 0) & (r < geo.H) & (q >= 0) & (q < geo.W)
        take = ok & ((m < v) | (arg < 0))  # the first element, then max < x
        m = torch.where(take, v, m)
        arg = torch.where(take, (r * geo.W + q) * geo.C + c, arg)
    return arg


def _cover(n: int, k: int, s: int, p: int, o: int, dev: torch.device
           ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """For each input row (column): the first output window covering it, the end of
    those windows (TF's h_start, h_end) and the most windows any row lies in."""
    pos = torch.arange(n, device=dev) + p
    start = torch.where(pos < k, 0, torch.div(pos - k, s, rounding_mode="floor") + 1)
    end = torch.clamp(torch.div(pos, s, rounding_mode="floor") + 1, max=o)
    return start, end, max(int((end - start).max()), 0) if n else 0


def MaxPoolGrad(orig_input: torch.Tensor, orig_output: torch.Tensor, grad: torch.Tensor,
                ksize: tuple[int, ...], strides: tuple[int, ...], padding: str,
                explicit_paddings: tuple[int, ...] = (),
                data_format: str = "NHWC") -> torch.Tensor:
    geo = _geo(ksize, strides, padding, explicit_paddings, tuple(orig_input.shape))
    acc = torch.zeros_like(orig_input)
    if grad.numel() == 0:
        return acc
    dev = orig_input.device
    arg = _argmax(orig_input, geo)
    g = _flush(grad)
    h0, h1, rows = _cover(geo.H, geo.KH, geo.sh, geo.pt, geo.OH, dev)
    w0, w1, cols = _cover(geo.W, geo.KW, geo.sw, geo.pl, geo.OW, dev)
    here = ((torch.arange(geo.H, device=dev)[:, None] * geo.W
             + torch.arange(geo.W, device=dev)[None, :])[:, :, None] * geo.C
            + torch.arange(geo.C, device=dev)[None, None, :])[None]
    for i in range(rows):  # the covering windows in the output's order: oh, then ow
        oh = h0 + i
        ok_h = (oh < h1)[None, :, None, None]
        oh = oh.clamp(max=geo.OH - 1)
        for j in range(cols):
            ow = w0 + j
            ok = ok_h & (ow < w1)[None, None, :, None]
            ow = ow.clamp(max=geo.OW - 1)
            hit = ok & (arg[:, oh][:, :, ow] == here)
            acc = _flush(acc + torch.where(hit, g[:, oh][:, :, ow], 0))
    return acc
