"""Max pooling: MaxPool and its gradient MaxPoolGrad (NHWC, float32 / float64).

Bit-exact with TensorFlow 2.21's CPU kernels (``pooling_ops_common.h``: MaxPoolingOp's
SpatialMaxPool; ``maxpooling_op.cc``: MaxPoolingGradOp's SpatialMaxPoolWithArgMaxHelper).
Measured on TF 2.21 (docs/max_pool.md, tests/test_max_pool.py):

- MaxPool starts every output at ``lowest()`` (-FLT_MAX) and folds in the window's inputs
  in row-major order with Eigen's ``cwiseMax``, ``m = (m < x) ? x : m`` under DAZ: the
  first of equal values stays (+0 before -0 gives +0, -0 before +0 gives -0), a NaN input
  is never taken (a window of NaNs gives -FLT_MAX), -inf never beats -FLT_MAX (a window of
  -inf gives -FLT_MAX), and a denormal counts, and comes out, as a zero of its sign.
  The packet body and the scalar channel tail agree on all of this (probed for depths 1 to
  20), so the bits do not depend on the channel count or on alignment.
- MaxPoolGrad does not read orig_output's values (only its shape): it recomputes each
  window's argmax from orig_input: the first element (row-major) that ``out < x`` did not
  beat, starting from the window's first element whatever it is (a NaN first element is
  the argmax; a NaN later never is), comparing under DAZ. Each grad value is then added
  into its argmax's slot of a zero-filled gradient, in the output's flat order (n, oh,
  ow, c), one flushed float addition each (FTZ / DAZ): an input under several windows
  sums their gradients in that order, starting from +0 (so -0 gradients give +0).
- Images are independent in both ops (TF shards over the batch), so the bits do not
  depend on TF's thread count or the processor.

This module holds the checks (TF's order, classes and words) and the NumPy reference (the
spec); the kernels are in ``tfgrad.kernels.max_pool``, run by ``tfgrad.dispatch.max_pool``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError, UnimplementedError
from .._tf.depthwise import window
from .._tf.fpenv import flush_denormals, flushed
from .._validate import check_alloc, shape_str

FORWARD, GRAD = "MaxPool", "MaxPoolGrad"


@functools.cache
def _dispatch() -> Any:
    from ..dispatch import max_pool

    return max_pool


# --------------------------------------------------------------------------------------
# Geometry and checks
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """One NHWC pooling: x [N, H, W, C], windows KH x KW with strides sh, sw, padding
    before pt (rows), pl (columns); y [N, OH, OW, C]."""

    N: int
    H: int
    W: int
    C: int
    KH: int
    KW: int
    sh: int
    sw: int
    OH: int
    OW: int
    pt: int
    pl: int


def _int32_attr(name: str, values: tuple[int, ...]) -> None:
    """TF's kernels read ksize and strides as int32 (GetAttr into vector<int32>)."""
    for v in values:
        if not -2**31 <= v < 2**31:
            raise InvalidArgumentError(f"Attr {name} has value {v} out of range for an int32")


def _explicit(padding: str, p: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    """TF's CheckValidPadding (NHWC); the pads are read only with EXPLICIT padding."""
    if padding != "EXPLICIT":
        return (0, 0), (0, 0)
    if len(p) != 8:
        raise InvalidArgumentError(
            f"explicit_paddings attribute must contain 8 values, but got: {len(p)}")
    if not all(v >= 0 for v in p):
        raise InvalidArgumentError("All elements of explicit_paddings must be nonnegative")
    if not (p[0] == p[1] == p[6] == p[7] == 0):
        raise InvalidArgumentError(
            "Nonzero explicit padding in the batch or depth dimensions is not supported")
    return (p[2], p[3]), (p[4], p[5])


def _check_attrs(op: str, ksize: tuple[int, ...], strides: tuple[int, ...], padding: str,
                 explicit_paddings: tuple[int, ...], data_format: str) -> None:
    """The kernels' constructors (MaxPoolingOp's words differ from MaxPoolingGradOp's:
    "stride field" against "strides field"; only the forward checks ksize > 0)."""
    _int32_attr("ksize", ksize)
    _int32_attr("strides", strides)
    which = "MaxPoolingOp" if op == FORWARD else "MaxPoolingGradOp"
    if data_format != "NHWC":
        raise InvalidArgumentError(f"Default {which} only supports NHWC on device type CPU")
    if len(ksize) != 4:
        raise InvalidArgumentError("Sliding window ksize field must specify 4 dimensions")
    if op == FORWARD:
        if not all(k > 0 for k in ksize):
            raise InvalidArgumentError(
                "Sliding window ksize must be positive. The specified or inferred ksize is: "
                + ",".join(map(str, ksize)))
        if len(strides) != 4:
            raise InvalidArgumentError("Sliding window stride field must specify 4 dimensions")
    elif len(strides) != 4:
        raise InvalidArgumentError("Sliding window strides field must specify 4 dimensions")
    if not (ksize[0] == 1 and strides[0] == 1):
        raise UnimplementedError("Pooling is not yet supported on the batch dimension.")
    if op == GRAD:
        if not (ksize[3] == 1 and strides[3] == 1):
            raise UnimplementedError(
                "MaxPoolingGrad is not yet supported on the depth dimension.")
        _explicit(padding, explicit_paddings)
        if not all(k > 0 for k in ksize):
            # TF computes windows of no element, whose argmax (-1) it then writes through
            # unchecked: refused here with the forward's words.
            raise InvalidArgumentError(
                "Sliding window ksize must be positive. The specified or inferred ksize is: "
                + ",".join(map(str, ksize)))


def _geometry(op: str, shape: tuple[int, ...], ksize: tuple[int, ...],
              strides: tuple[int, ...], padding: str,
              explicit_paddings: tuple[int, ...]) -> Geometry:
    """TF's PoolParameters for NHWC input of ``shape``."""
    if len(shape) != 4:
        raise InvalidArgumentError(
            f"tensor_in_shape must have 2 spatial dimensions. {len(shape)} 0")
    N, H, W, C = shape
    KH, KW, KC = ksize[1], ksize[2], ksize[3]
    if not (KC == 1 or (KH == 1 and KW == 1)):
        raise UnimplementedError("MaxPooling supports exactly one of pooling across depth or "
                                 "pooling across width/height.")
    pads_h, pads_w = _explicit(padding, explicit_paddings)
    if padding == "EXPLICIT":
        for side, pad, k in (("Top", pads_h[0], KH), ("Bottom", pads_h[1], KH),
                             ("Left", pads_w[0], KW), ("Right", pads_w[1], KW)):
            if not pad < k:
                raise InvalidArgumentError(
                    f"{side} padding {pad} needs to be smaller than the window size {k}")
    if KC != 1:
        # TF's DepthwiseMaxPool (Eigen's colwise maxCoeff): not part of a training step.
        raise UnimplementedError(
            "tfgrad: MaxPool over the depth dimension (ksize[3] > 1) is not implemented.")
    for s in strides[1:3]:
        if s <= 0:
            raise InvalidArgumentError(f"Stride must be > 0, but got {s}")
    oh, pt = _window(H, KH, strides[1], padding, pads_h)
    ow, pl = _window(W, KW, strides[2], padding, pads_w)
    return Geometry(N, H, W, C, KH, KW, strides[1], strides[2], oh, ow, pt, pl)


def _window(n: int, k: int, s: int, padding: str, pads: tuple[int, int]) -> tuple[int, int]:
    """TF's GetWindowedOutputSizeVerbose, whose message has no op name in front."""
    try:
        return window("", n, k, s, 1, padding, pads)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(str(e).removeprefix(": ")) from None


def _checked(op: str, args: dict[str, Any]) -> Geometry:
    _check_attrs(op, tuple(args["ksize"]), tuple(args["strides"]), args["padding"],
                 tuple(args["explicit_paddings"]), args["data_format"])
    if op == FORWARD:
        x = args["input"]
        geo = _geometry(op, x.shape, args["ksize"], args["strides"], args["padding"],
                        tuple(args["explicit_paddings"]))
        check_alloc(op, "output", (geo.N, geo.OH, geo.OW, geo.C), x.dtype)
        return geo
    x, y, g = args["orig_input"], args["orig_output"], args["grad"]
    for a, name in ((x, "tensor_in"), (y, "tensor_out"), (g, "out_backprop")):
        if a.ndim != 4:
            raise InvalidArgumentError(f"{name} must be 4-dimensional")
    geo = _geometry(op, x.shape, args["ksize"], args["strides"], args["padding"],
                    tuple(args["explicit_paddings"]))
    expected = (geo.N, geo.OH, geo.OW, geo.C)
    for a, name in ((y, "orig_output"), (g, "grad")):
        if a.shape != expected:
            raise InvalidArgumentError(f"Expected {name} shape to be {shape_str(expected)}, "
                                       f"but got {shape_str(a.shape)}")
    check_alloc(op, "output", x.shape, x.dtype)
    return geo


def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    geo = _checked(op, args)
    if op == FORWARD:
        return {"output": (geo.N, geo.OH, geo.OW, geo.C)}
    return {}


def geometry_of(op: str, ksize: tuple[int, ...], strides: tuple[int, ...], padding: str,
                explicit_paddings: tuple[int, ...], x_shape: tuple[int, ...]) -> Geometry:
    """The geometry from shapes alone (already checked), for the portable and native
    implementations."""
    return _geometry(op, tuple(x_shape), tuple(ksize), tuple(strides), padding,
                     tuple(explicit_paddings))


# --------------------------------------------------------------------------------------
# The NumPy reference
# --------------------------------------------------------------------------------------
def _taps(x: np.ndarray, geo: Geometry) -> Any:
    """Each window tap (kh, kw) in row-major order: the input it reads for every output
    [N, OH, OW, C] and whether that input exists (False in the padding)."""
    N, H, W, C = x.shape
    eh = (geo.OH - 1) * geo.sh + geo.KH
    ew = (geo.OW - 1) * geo.sw + geo.KW
    ph = max(0, eh - geo.pt - H)
    pw = max(0, ew - geo.pl - W)
    xp = np.zeros((N, geo.pt + H + ph, geo.pl + W + pw, C), x.dtype)
    valid = np.zeros((geo.pt + H + ph, geo.pl + W + pw), bool)
    xp[:, geo.pt:geo.pt + H, geo.pl:geo.pl + W] = x
    valid[geo.pt:geo.pt + H, geo.pl:geo.pl + W] = True
    for kh in range(geo.KH):
        for kw in range(geo.KW):
            r = slice(kh, kh + (geo.OH - 1) * geo.sh + 1, geo.sh)
            c = slice(kw, kw + (geo.OW - 1) * geo.sw + 1, geo.sw)
            yield kh, kw, xp[:, r, c], valid[r, c][None, :, :, None]


def forward_reference(x: np.ndarray, geo: Geometry) -> np.ndarray:
    x = flushed(x)  # DAZ: a denormal compares, and is copied, as a zero of its sign
    m = np.full((geo.N, geo.OH, geo.OW, geo.C), np.finfo(x.dtype).min, x.dtype)
    if m.size == 0:
        return m
    with np.errstate(invalid="ignore"):
        for _, _, v, ok in _taps(x, geo):
            m = np.where(ok & (m < v), v, m)  # cwiseMax: (m < x) ? x : m
    return m


def argmax_reference(x: np.ndarray, geo: Geometry) -> np.ndarray:
    """Each output's argmax as a flat index into its image [H * W * C] (TF's rule)."""
    x = flushed(x)
    shape = (geo.N, geo.OH, geo.OW, geo.C)
    m = np.full(shape, np.finfo(x.dtype).min, x.dtype)
    arg = np.full(shape, -1, np.int64)
    oh = np.arange(geo.OH)[None, :, None, None] * geo.sh - geo.pt
    ow = np.arange(geo.OW)[None, None, :, None] * geo.sw - geo.pl
    c = np.arange(geo.C)[None, None, None, :]
    with np.errstate(invalid="ignore"):
        for kh, kw, v, ok in _taps(x, geo):
            take = ok & ((m < v) | (arg < 0))  # the first valid element, then out < x
            m = np.where(take, v, m)
            arg = np.where(take, ((oh + kh) * geo.W + (ow + kw)) * geo.C + c, arg)
    return arg


def grad_reference(x: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    out = np.zeros((geo.N, geo.H * geo.W * geo.C), x.dtype)
    if g.size == 0:
        return out.reshape(x.shape)
    arg = argmax_reference(x, geo).reshape(geo.N, -1)
    with flush_denormals():  # each += is one flushed addition (FTZ / DAZ)
        for n in range(geo.N):
            # np.add.at adds unbuffered, in the order of the indices: TF's output order
            np.add.at(out[n], arg[n], g[n].reshape(-1))
    return flushed(out).reshape(x.shape)


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------
def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], np.ndarray]:
    geo = _checked(op, args)
    if op == FORWARD:
        return lambda a: _forward(a["input"], geo)
    return lambda a: _grad(a["orig_input"], a["grad"], geo)


def _forward(x: np.ndarray, geo: Geometry) -> np.ndarray:
    if _config.use_reference():
        return forward_reference(x, geo)
    return _dispatch().forward(x, geo)


def _grad(x: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    if _config.use_reference():
        return grad_reference(x, g, geo)
    return _dispatch().grad(x, g, geo)


def MaxPool(*, input: np.ndarray, ksize: tuple[int, ...], strides: tuple[int, ...],
            padding: str, explicit_paddings: tuple[int, ...] = (),
            data_format: str = "NHWC") -> np.ndarray:
    args = locals()
    return prepare(FORWARD, args)(args)


def MaxPoolGrad(*, orig_input: np.ndarray, orig_output: np.ndarray, grad: np.ndarray,
                ksize: tuple[int, ...], strides: tuple[int, ...], padding: str,
                explicit_paddings: tuple[int, ...] = (),
                data_format: str = "NHWC") -> np.ndarray:
    args = locals()
    return prepare(GRAD, args)(args)
