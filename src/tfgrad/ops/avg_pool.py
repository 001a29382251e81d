"""AvgPool and AvgPoolGrad: TF 2.21's CPU kernels (NHWC; half, bfloat16, float, double).

TF's kernels (``avgpooling_op.cc``, ``SpatialAvgPool`` in ``pooling_ops_common.h``), as
probed on TF 2.21 (docs/avg_pool.md):

- AvgPool: every output starts at +0, each input cell of its window (padding cells are
  not cells) is added in row-major (row, column) order, one addition in T each, then the
  sum is divided by the count of those cells, itself a sum of T(1)s in T (exact for float
  and double; bfloat16 stops at 256, half at 2048: 256 + 1 rounds to 256). One thread
  computes a whole image, so nothing depends on TF's thread count;
- AvgPoolGrad: dx starts at zeros; for each output (r, c) in row-major order, each cell
  of its window gets ``dx += grad * coeff`` with ``coeff = T(1.0 / cells)`` (a double
  quotient rounded to float, then to T) and the product rounded to T before the addition
  (no fused multiply-add: probe, 659 of 1296 outputs differ with one).

Arithmetic on the half types is float32 rounded to T after every operation (Eigen's
half / bfloat16 operators); TF's FTZ / DAZ flush float32 and float64 denormals (so
bfloat16's too), not half's (a half denormal is a normal float32).

This module holds the checks (TF's order, classes and words) and the NumPy reference
(the spec: whole-array operations over the window offsets); ``tfgrad.dispatch.avg_pool``
runs the compiled kernels.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .. import _config
from .._errors import InvalidArgumentError, UnimplementedError
from .._tf.depthwise import window
from .._tf.fpenv import flush_denormals
from .._validate import check_alloc, overflow_words, shape_str

F32 = np.float32
FORWARD, GRAD = "AvgPool", "AvgPoolGrad"
HALF_TYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


@functools.cache
def _dispatch() -> Any:
    from ..dispatch import avg_pool

    return avg_pool


# --------------------------------------------------------------------------------------
# Geometry and checks
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """One NHWC pooling: input [N, H, W, C], output [N, OH, OW, C]."""

    N: int
    H: int
    W: int
    C: int
    KH: int
    KW: int
    SH: int
    SW: int
    OH: int
    OW: int
    PT: int
    """Padding rows before the first row (SAME: half the padding, rounded down)."""
    PL: int

    def rows(self, i: int) -> tuple[int, int]:
        """The input rows [first, end) of output row i's window (padding left out)."""
        r0 = i * self.SH - self.PT
        return max(r0, 0), min(r0 + self.KH, self.H)

    def cols(self, j: int) -> tuple[int, int]:
        c0 = j * self.SW - self.PL
        return max(c0, 0), min(c0 + self.KW, self.W)


def _int32_attr(name: str, values: tuple[int, ...]) -> None:
    """TF's kernels read ksize and strides as int32 (GetAttr into vector<int32>)."""
    for v in values:
        if not -2**31 <= v < 2**31:
            raise InvalidArgumentError(f"Attr {name} has value {v} out of range for an int32")


def _check_attrs(op: str, ksize: tuple[int, ...], strides: tuple[int, ...],
                 data_format: str) -> None:
    """The kernels' constructors (AvgPoolingOp, AvgPoolingGradOp), in their order. The
    gradient's constructor does not check that ksize is positive (see :func:`_checked`)."""
    if data_format != "NHWC":
        name = "AvgPoolingOp" if op == FORWARD else "AvgPoolingGradOp"
        raise InvalidArgumentError(f"Default {name} only supports NHWC on device type CPU")
    _int32_attr("ksize", ksize)
    if len(ksize) != 4:
        raise InvalidArgumentError("Sliding window ksize field must specify 4 dimensions")
    _int32_attr("strides", strides)
    if len(strides) != 4:
        word = "stride" if op == FORWARD else "strides"
        raise InvalidArgumentError(f"Sliding window {word} field must specify 4 dimensions")
    if not (ksize[0] == 1 and strides[0] == 1):
        raise UnimplementedError("Pooling is not yet supported on the batch dimension.")
    if op == FORWARD:
        for k in ksize:
            if k <= 0:
                raise InvalidArgumentError(f"ksize must be a positive int32 value, got:{k}")


def _window(n: int, k: int, s: int, padding: str) -> tuple[int, int]:
    """TF's GetWindowedOutputSize: (output size, padding before)."""
    if s <= 0:
        raise InvalidArgumentError(f"Stride must be > 0, but got {s}")
    try:
        return window("", n, k, s, 1, padding, (0, 0))
    except InvalidArgumentError as e:  # (the shared helper prefixes the op's name)
        raise InvalidArgumentError(str(e).split(": ", 1)[1]) from None


def _spatial(op: str, N: int, H: int, W: int, C: int, ksize: tuple[int, ...],
             strides: tuple[int, ...], padding: str) -> Geometry:
    oh, pt = _window(H, ksize[1], strides[1], padding)
    ow, pl = _window(W, ksize[2], strides[2], padding)
    return Geometry(N, H, W, C, ksize[1], ksize[2], strides[1], strides[2], oh, ow, pt, pl)


_NON_SPATIAL = "Non-spatial pooling is not yet supported. Volunteers? :)"


def _forward_geometry(args: dict[str, Any]) -> Geometry:
    ksize, strides = tuple(args["ksize"]), tuple(args["strides"])
    _check_attrs(FORWARD, ksize, strides, args["data_format"])
    x = args["value"]
    if x.ndim != 4:  # (PoolParameters; the 0 is TF's enum value of NHWC)
        raise InvalidArgumentError(f"tensor_in_shape must have 2 spatial dimensions. {x.ndim} 0")
    N, H, W, C = x.shape
    if not (ksize[3] == 1 or (ksize[1] == 1 and ksize[2] == 1)):
        raise UnimplementedError("MaxPooling supports exactly one of pooling across depth or "
                                 "pooling across width/height.")
    if ksize[3] != 1:  # PoolParameters' depthwise checks, then AvgPool's refusal
        if C % ksize[3] != 0:
            raise UnimplementedError("Depthwise max pooling requires the depth window to "
                                     "evenly divide the input depth")
        if strides[3] != ksize[3]:
            raise UnimplementedError("Depthwise max pooling requires the depth window to "
                                     "equal the depth stride")
        raise UnimplementedError(_NON_SPATIAL)
    geo = _spatial(FORWARD, N, H, W, C, ksize, strides, args["padding"])
    check_alloc(FORWARD, "output", (N, geo.OH, geo.OW, C), x.dtype)
    return geo


def _grad_geometry(args: dict[str, Any]) -> Geometry | None:
    """AvgPoolingGradOp's checks; None when the output is empty (TF returns it before
    looking at the window)."""
    ksize, strides = tuple(args["ksize"]), tuple(args["strides"])
    _check_attrs(GRAD, ksize, strides, args["data_format"])
    shape, g = args["orig_input_shape"], args["grad"]
    if shape.ndim != 1 or shape.size != 4:
        raise InvalidArgumentError("out_backprop must be 1-dimensional and 4 elements")
    if g.ndim != 4:
        raise InvalidArgumentError("out_backprop must be 4-dimensional")
    dims = tuple(int(v) for v in shape.tolist())
    for d in dims:  # (TensorShape::AddDimWithStatus)
        if d < 0:
            raise InvalidArgumentError(f"Expected a non-negative size, got {d}")
    if math.prod(dims) > 2**63 - 1:
        raise InvalidArgumentError(overflow_words(dims))
    check_alloc(GRAD, "output", dims, g.dtype)
    if math.prod(dims) == 0:
        return None
    if ksize[3] != 1:
        raise UnimplementedError(_NON_SPATIAL)
    N, H, W, C = dims
    geo = _spatial(GRAD, N, H, W, C, ksize, strides, args["padding"])
    # TF 2.21's gradient kernel checks neither: with ksize <= 0 it divides by a count of
    # zero or fewer cells, and with a grad of another shape it reads and writes outside
    # its buffers (a later TF rejects the shape with these words).
    for k in ksize:
        if k <= 0:
            raise InvalidArgumentError(f"ksize must be a positive int32 value, got:{k}")
    want = (N, geo.OH, geo.OW, C)
    if tuple(g.shape) != want:
        raise InvalidArgumentError(f"Expected grad shape to be {shape_str(want)}, but got "
                                   f"{shape_str(g.shape)}")
    return geo


def geometry_of(shape: tuple[int, ...], ksize: tuple[int, ...], strides: tuple[int, ...],
                padding: str) -> Geometry:
    """The geometry of an input ``shape`` (NHWC), from arguments already checked (the
    portable and native implementations run ``tfgrad._shapes.infer`` first)."""
    N, H, W, C = shape
    return _spatial(FORWARD, N, H, W, C, tuple(ksize), tuple(strides), padding)


def padded_shape(geo: Geometry) -> tuple[int, int, int, int]:
    """The input padded so that every window offset's strided slice fits."""
    return (geo.N, max(geo.PT + geo.H, (geo.OH - 1) * geo.SH + geo.KH),
            max(geo.PL + geo.W, (geo.OW - 1) * geo.SW + geo.KW), geo.C)


def inside(geo: Geometry) -> np.ndarray:
    """[rows, cols] of the padded input: True on the input's own cells. Sums skip the
    padding cells rather than add them as +0: under FTZ a window's sum can be -0 (a tiny
    negative partial sum flushed), which a +0 would turn into +0."""
    m = np.zeros(padded_shape(geo)[1:3], bool)
    m[geo.PT:geo.PT + geo.H, geo.PL:geo.PL + geo.W] = True
    return m


def taps(geo: Geometry, dr: int, dc: int) -> tuple[slice, slice]:
    """The padded input's cells that window offset (dr, dc) reads, for every output."""
    return (slice(dr, dr + (geo.OH - 1) * geo.SH + 1, geo.SH),
            slice(dc, dc + (geo.OW - 1) * geo.SW + 1, geo.SW))


def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    if op == FORWARD:
        geo = _forward_geometry(args)
        return {"output": (geo.N, geo.OH, geo.OW, geo.C)}
    _grad_geometry(args)
    return {}


# --------------------------------------------------------------------------------------
# The reference: TF's arithmetic in T, over whole arrays
# --------------------------------------------------------------------------------------
def _op(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], a: np.ndarray, b: Any,
        dt: np.dtype) -> np.ndarray:
    """One of TF's operations in T: native for float and double (flushed by the caller's
    FTZ / DAZ), in float32 rounded to T for the half types (Eigen's operators)."""
    if dt in HALF_TYPES:
        return fn(np.asarray(a, F32), np.asarray(b, F32)).astype(dt)
    return fn(a, b).astype(dt, copy=False)


def cells(geo: Geometry) -> np.ndarray:
    """[OH, OW]: the input cells in each output's window (padding left out)."""
    rows = np.array([r1 - r0 for r0, r1 in map(geo.rows, range(geo.OH))], np.int64)
    cols = np.array([c1 - c0 for c0, c1 in map(geo.cols, range(geo.OW))], np.int64)
    return rows[:, None] * cols[None, :]


def counts(geo: Geometry, dt: np.dtype) -> np.ndarray:
    """[OH, OW]: TF's out_count, the cells counted by adding T(1)s in T: exact up to
    2**digits (bfloat16 256, half 2048), where 2**digits + 1 rounds back (to even)."""
    digits = (ml_dtypes.finfo(dt) if dt in HALF_TYPES else np.finfo(dt)).nmant + 1
    return np.minimum(cells(geo), 2**digits).astype(dt)


def coefficients(geo: Geometry, dt: np.dtype) -> np.ndarray:
    """[OH, OW]: AvgPoolGrad's ``T(1.0 / (rsize * csize))``: the double quotient, to
    float (Eigen's half / bfloat16 constructors go through float), then to T."""
    co = 1.0 / cells(geo)
    return co if dt == np.float64 else co.astype(F32).astype(dt)


def forward_reference(x: np.ndarray, geo: Geometry) -> np.ndarray:
    """Each output's window's cells added in row-major order from +0 (padding cells
    skipped: :func:`inside`), then divided by the count."""
    dt = x.dtype
    xp = np.zeros(padded_shape(geo), dt)
    xp[:, geo.PT:geo.PT + geo.H, geo.PL:geo.PL + geo.W] = x
    real = inside(geo)
    acc = np.zeros((geo.N, geo.OH, geo.OW, geo.C), dt)
    for dr in range(geo.KH):
        for dc in range(geo.KW):
            rs, cs = taps(geo, dr, dc)
            acc = np.where(real[rs, cs][None, :, :, None],
                           _op(np.add, acc, xp[:, rs, cs], dt), acc)
    return _op(np.divide, acc, counts(geo, dt)[None, :, :, None], dt)


def grad_reference(g: np.ndarray, geo: Geometry) -> np.ndarray:
    """dx's cells get their outputs' ``grad * coeff`` in the outputs' row-major order: the
    window offsets from the last to the first (a larger offset is an earlier output)."""
    dt = g.dtype
    prod = _op(np.multiply, g, coefficients(geo, dt)[None, :, :, None], dt)
    dxp = np.zeros(padded_shape(geo), dt)
    for dr in reversed(range(geo.KH)):
        for dc in reversed(range(geo.KW)):
            rs, cs = taps(geo, dr, dc)
            dxp[:, rs, cs] = _op(np.add, dxp[:, rs, cs], prod, dt)
    return dxp[:, geo.PT:geo.PT + geo.H, geo.PL:geo.PL + geo.W].copy()


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------
def _forward(x: np.ndarray, geo: Geometry) -> np.ndarray:
    with flush_denormals(), np.errstate(all="ignore"):  # inf and NaN propagate as in TF
        if _config.use_reference() or x.dtype in HALF_TYPES:
            return forward_reference(x, geo)
        return _dispatch().forward(x, geo, counts(geo, x.dtype))


def _grad(g: np.ndarray, geo: Geometry) -> np.ndarray:
    with flush_denormals(), np.errstate(all="ignore"):
        if _config.use_reference() or g.dtype in HALF_TYPES:
            return grad_reference(g, geo)
        return _dispatch().grad(g, geo, coefficients(geo, g.dtype))


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], np.ndarray]:
    if op == FORWARD:
        geo = _forward_geometry(args)
        shape = (geo.N, geo.OH, geo.OW, geo.C)
        dt = args["value"].dtype
        if math.prod(shape) == 0:
            return lambda k: np.zeros(shape, dt)
        return lambda k: _forward(k["value"], geo)
    ggeo = _grad_geometry(args)
    dt = args["grad"].dtype
    if ggeo is None or ggeo.OH * ggeo.OW == 0:
        dims = tuple(int(v) for v in args["orig_input_shape"].tolist())
        return lambda k: np.zeros(dims, dt)
    return lambda k: _grad(k["grad"], ggeo)


def AvgPool(*, value: np.ndarray, ksize: tuple[int, ...], strides: tuple[int, ...],
            padding: str, data_format: str) -> np.ndarray:
    args = locals()
    return prepare(FORWARD, args)(args)


def AvgPoolGrad(*, orig_input_shape: np.ndarray, grad: np.ndarray, ksize: tuple[int, ...],
                strides: tuple[int, ...], padding: str, data_format: str) -> np.ndarray:
    args = locals()
    return prepare(GRAD, args)(args)
