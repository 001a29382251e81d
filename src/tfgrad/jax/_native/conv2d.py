"""Conv2D and its backprops in jax.lax (float32, NHWC), for any backend.

``lax.conv_general_dilated`` with TF's padding as explicit (before, after) pairs (SAME's
extra row / column after) and the filter dilation; BackpropFilter is its linear
transpose (``jax.vjp``), BackpropInput TF's col = dy x W^T and Col2im (a transposed
convolution would multiply the filter by the zeros between strides: 0 * inf = NaN where
TF has none). ``Precision.HIGHEST``
keeps float32 products on accelerators (no TF32 / bfloat16 passes).

Not bit-identical: XLA's order of the sums is not TF's contraction plan (FMA chains over
TF's k-blocks, docs/conv2d.md), and XLA on the CPU does not flush denormals.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ...ops import conv2d as _c

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype:
# measured up to 10 ulps of the largest output over the case table on the CPU (XLA's
# order against TF's); tests/test_portable_conv2d.py also holds every output to
# 2 (K + 1) U sum|terms|, which does not depend on cancellation.
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "Conv2D": {"output": {"float32": 32}},
    "Conv2DBackpropInput": {"output": {"float32": 32}},
    "Conv2DBackpropFilter": {"output": {"float32": 32}},
}
_NOT_REPRODUCED = ("The sums run in XLA's order, not TF's contraction plan; denormals are "
                   "not flushed.")
NOTES: dict[str, str] = {op: _NOT_REPRODUCED for op in BOUNDS}
_DN = ("NHWC", "HWIO", "NHWC")


def _conv(x: jax.Array, w: jax.Array, geo: _c.Geometry) -> jax.Array:
    eh, ew = _c.extent(geo)
    pads = [(geo.pt, eh - geo.pt - geo.H), (geo.pl, ew - geo.pl - geo.W)]
    return lax.conv_general_dilated(
        x, w, (geo.sh if geo.OH > 1 else 1, geo.sw if geo.OW > 1 else 1), pads,
        rhs_dilation=(geo.dh, geo.dw), dimension_numbers=_DN,
        precision=lax.Precision.HIGHEST)


def Conv2D(*, input: jax.Array, filter: jax.Array, strides: tuple[int, ...],  # noqa: A002
           use_cudnn_on_gpu: bool = True, padding: str = "SAME",
           explicit_paddings: tuple[int, ...] = (), data_format: str = "NHWC",
           dilations: tuple[int, ...] = (1, 1, 1, 1)) -> jax.Array:
    geo = _c.window_of("Conv2D", strides, padding, explicit_paddings, dilations,
                       tuple(input.shape), tuple(filter.shape))
    if geo.N * geo.OH * geo.OW * geo.O == 0:
        return jnp.zeros((geo.N, geo.OH, geo.OW, geo.O), input.dtype)
    return _conv(input, filter, geo)


def Conv2DBackpropInput(*, input_sizes: tuple[int, ...], filter: jax.Array,
                        out_backprop: jax.Array, strides: tuple[int, ...],
                        use_cudnn_on_gpu: bool = True, padding: str = "SAME",
                        explicit_paddings: tuple[int, ...] = (), data_format: str = "NHWC",
                        dilations: tuple[int, ...] = (1, 1, 1, 1)) -> jax.Array:
    sizes = tuple(input_sizes)
    if len(sizes) == 2:
        sizes = (out_backprop.shape[0], sizes[0], sizes[1], filter.shape[2])
    geo = _c.window_of("Conv2DBackpropInput", strides, padding, explicit_paddings, dilations,
                       sizes, tuple(filter.shape))
    if geo.N * geo.H * geo.W * geo.C == 0 or geo.OH * geo.OW * geo.O == 0:
        return jnp.zeros(sizes, out_backprop.dtype)
    # TF's way (col = dy x W^T, then Col2im), not the transposed convolution, whose
    # taps over the stride gaps and the padding multiply zeros by the filter (0 * inf)
    col = jnp.einsum("nhwo,abco->nhwabc", out_backprop, filter,
                     precision=lax.Precision.HIGHEST)
    eh, ew = _c.extent(geo)
    full = jnp.zeros((geo.N, max(eh, geo.pt + geo.H), max(ew, geo.pl + geo.W), geo.C),
                     out_backprop.dtype)
    for a in range(geo.KH):
        for b in range(geo.KW):
            full = full.at[:, a:a + geo.sh * (geo.OH - 1) + 1:geo.sh,
                           b:b + geo.sw * (geo.OW - 1) + 1:geo.sw].add(col[:, :, :, a, b])
    return full[:, geo.pt:geo.pt + geo.H, geo.pl:geo.pl + geo.W]


def Conv2DBackpropFilter(*, input: jax.Array, filter_sizes: tuple[int, ...],  # noqa: A002
                         out_backprop: jax.Array, strides: tuple[int, ...],
                         use_cudnn_on_gpu: bool = True, padding: str = "SAME",
                         explicit_paddings: tuple[int, ...] = (), data_format: str = "NHWC",
                         dilations: tuple[int, ...] = (1, 1, 1, 1)) -> jax.Array:
    fs = tuple(filter_sizes)
    geo = _c.window_of("Conv2DBackpropFilter", strides, padding, explicit_paddings,
                       dilations, tuple(input.shape), fs)
    if geo.N * geo.OH * geo.OW == 0 or geo.F * geo.O == 0:
        return jnp.zeros(fs, input.dtype)
    w0 = jnp.zeros(fs, input.dtype)
    _, vjp = jax.vjp(lambda w: _conv(input, w, geo), w0)
    return vjp(out_backprop)[0]
