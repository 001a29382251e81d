"""Conv2D and its backprops in torch tensor ops, on any device (float32, NHWC).

The convolution TF defines, on ``torch.nn.functional.conv2d`` and its two gradients
(``torch.nn.grad``), with TF's padding (SAME's extra row / column after, EXPLICIT's
given pads) applied as an explicit window over the input: the outputs read
``extent = (O - 1) * stride + (K - 1) * dilation + 1`` rows from the padding's start, so
the input is padded (or cut) to exactly that window and convolved without padding. TF32
is turned off around the calls (``allow_tf32``), so CUDA sums float32 products.

Not bit-identical: torch's (cuDNN's, oneDNN's, MKL's) order of the sums is not TF's
contraction plan (FMA chains over TF's k-blocks, docs/conv2d.md), and torch does not
flush denormals. The distance is that of two orders of one float32 dot product.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ...ops import conv2d as _c

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype:
# measured up to 10 ulps of the largest output over the case table on the CPU (torch's
# order against TF's); tests/test_portable_conv2d.py also holds every output to
# 2 (K + 1) U sum|terms|, which does not depend on cancellation.
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "Conv2D": {"output": {"float32": 32}},
    "Conv2DBackpropInput": {"output": {"float32": 32}},
    "Conv2DBackpropFilter": {"output": {"float32": 32}},
}
_NOT_REPRODUCED = ("The sums run in torch's order (cuDNN / oneDNN / MKL), not TF's "
                   "contraction plan; denormals are not flushed.")
NOTES: dict[str, str] = {op: _NOT_REPRODUCED for op in BOUNDS}


@contextlib.contextmanager
def _ieee() -> Iterator[None]:
    """TF32 off for cuDNN's convolutions (float32 products and sums)."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = old


def _window(x: torch.Tensor, geo: _c.Geometry) -> torch.Tensor:
    """x [N, C, H, W] padded with TF's zeros (or cut) to exactly the window the outputs
    read."""
    eh, ew = _c.extent(geo)
    x = F.pad(x, (geo.pl, max(0, ew - geo.pl - geo.W), geo.pt, max(0, eh - geo.pt - geo.H)))
    return x[:, :, :eh, :ew]


def _attrs(geo: _c.Geometry) -> dict[str, tuple[int, int]]:
    # (a stride never moves a window with one output: 1 keeps torch's arithmetic small)
    return {"stride": (geo.sh if geo.OH > 1 else 1, geo.sw if geo.OW > 1 else 1),
            "dilation": (geo.dh, geo.dw)}


def Conv2D(input: torch.Tensor, filter: torch.Tensor, strides: tuple[int, ...],  # noqa: A002
           use_cudnn_on_gpu: bool = True, padding: str = "SAME",
           explicit_paddings: tuple[int, ...] = (), data_format: str = "NHWC",
           dilations: tuple[int, ...] = (1, 1, 1, 1)) -> torch.Tensor:
    geo = _c.window_of("Conv2D", strides, padding, explicit_paddings, dilations,
                       tuple(input.shape), tuple(filter.shape))
    if geo.N * geo.OH * geo.OW * geo.O == 0:
        return input.new_zeros((geo.N, geo.OH, geo.OW, geo.O))
    x = _window(input.permute(0, 3, 1, 2), geo)
    with _ieee():
        y = F.conv2d(x, filter.permute(3, 2, 0, 1), **_attrs(geo))
    return y.permute(0, 2, 3, 1).contiguous()


def Conv2DBackpropInput(input_sizes: tuple[int, ...], filter: torch.Tensor,
                        out_backprop: torch.Tensor, strides: tuple[int, ...],
                        use_cudnn_on_gpu: bool = True, padding: str = "SAME",
                        explicit_paddings: tuple[int, ...] = (), data_format: str = "NHWC",
                        dilations: tuple[int, ...] = (1, 1, 1, 1)) -> torch.Tensor:
    sizes = tuple(input_sizes)
    if len(sizes) == 2:
        sizes = (out_backprop.shape[0], sizes[0], sizes[1], filter.shape[2])
    geo = _c.window_of("Conv2DBackpropInput", strides, padding, explicit_paddings, dilations,
                       sizes, tuple(filter.shape))
    if geo.N * geo.H * geo.W * geo.C == 0 or geo.OH * geo.OW * geo.O == 0:
        return out_backprop.new_zeros(sizes)
    eh, ew = _c.extent(geo)
    g = out_backprop.permute(0, 3, 1, 2)
    with _ieee():
        dxw = torch.nn.grad.conv2d_input((geo.N, geo.C, eh, ew), filter.permute(3, 2, 0, 1),
                                         g, **_attrs(geo))
    full = dxw.new_zeros((geo.N, geo.C, max(eh, geo.pt + geo.H), max(ew, geo.pl + geo.W)))
    full[:, :, :eh, :ew] = dxw
    return full[:, :, geo.pt:geo.pt + geo.H, geo.pl:geo.pl + geo.W].permute(0, 2, 3, 1
                                                                             ).contiguous()


def Conv2DBackpropFilter(input: torch.Tensor, filter_sizes: tuple[int, ...],  # noqa: A002
                         out_backprop: torch.Tensor, strides: tuple[int, ...],
                         use_cudnn_on_gpu: bool = True, padding: str = "SAME",
                         explicit_paddings: tuple[int, ...] = (), data_format: str = "NHWC",
                         dilations: tuple[int, ...] = (1, 1, 1, 1)) -> torch.Tensor:
    fs = tuple(filter_sizes)
    geo = _c.window_of("Conv2DBackpropFilter", strides, padding, explicit_paddings,
                       dilations, tuple(input.shape), fs)
    if geo.N * geo.OH * geo.OW == 0 or geo.F * geo.O == 0:
        return input.new_zeros(fs)
    x = _window(input.permute(0, 3, 1, 2), geo)
    g = out_backprop.permute(0, 3, 1, 2)
    with _ieee():
        dw = torch.nn.grad.conv2d_weight(x, (fs[3], fs[2], fs[0], fs[1]), g, **_attrs(geo))
    return dw.permute(2, 3, 1, 0).contiguous()
