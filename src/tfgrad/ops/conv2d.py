"""Conv2D, Conv2DBackpropInput and Conv2DBackpropFilter: TF 2.21's CPU kernels (float32, NHWC).

TF runs all three as contractions around image patches (probes: .helpers/CONV2D_NOTES.md,
shared/tf-cpu-contraction.md), so each is bit for bit a MatMul with TF's contraction plan
(``tfgrad._tf.contraction``) around im2col / col2im:

- Conv2D (``LaunchGeneric``: MatMulConvFunctor for 1x1 stride 1 and for filter == input
  VALID, else Eigen's SpatialConvolution): ``im2col(x) [N*OH*OW, KH*KW*C] x W [KH*KW*C, O]``,
  K index ``(kh*KW + kw)*C + c``, the padding taps explicit zeros;
- Conv2DBackpropInput (Conv2DCustomBackpropInputOp): per image ``col = dy [OH*OW, O] x
  W^T``, then Col2im scatter-adds col into a zeroed dx in the order (oh, ow, kh, kw, c),
  one float32 add each. The contraction is Eigen's (TF's plan) when TF takes its parallel
  contraction (batch 1, or a large per-thread work unit), else oneDNN's sgemm directly
  over the whole K = O (its K passes);
- Conv2DBackpropFilter (Conv2DCustomBackpropFilterOp): dW zeroed, then per shard of
  images (TF's L3 rule) ``dW = dW + im2col(x_shard)^T x dy_shard`` (Eigen's plan for that
  shard's K = pixels).

This module holds the checks (TF's order, classes and words) and the NumPy reference (the
spec, on ``tfgrad.ops.matmul``'s exact reference contraction); ``tfgrad.dispatch.conv2d``
runs the compiled im2col / col2im and the matmul kernels. docs/conv2d.md lists the TF
behaviours and the tests that pin them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError, UnimplementedError
from .._tf import contraction, onednn
from .._tf import conv2d as _patches
from .._tf.conv2d import Geometry
from .._tf.cpuid import eigen_caches, onednn_isa
from .._tf.depthwise import window
from .._tf.fpenv import flush_denormals, flushed
from .._validate import check_alloc, overflow_words, shape_str
from . import matmul as _mm

F32 = np.float32
FORWARD, INPUT, FILTER = "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"
# TF's hard-coded cache sizes in the custom backprop kernels (conv_grad_*_ops)
_L2_TF = 256 << 10
_L3_TF = 30 << 20


@functools.cache
def _dispatch() -> Any:
    from ..dispatch import conv2d

    return conv2d


# --------------------------------------------------------------------------------------
# Geometry
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Attrs:
    sh: int
    sw: int
    dh: int
    dw: int
    padding: str
    pads_h: tuple[int, int]
    pads_w: tuple[int, int]


def _check_padding(padding: str, p: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    """TF's CheckValidPadding (NHWC)."""
    if padding == "EXPLICIT":
        if len(p) != 8:
            raise InvalidArgumentError(
                f"explicit_paddings attribute must contain 8 values, but got: {len(p)}")
        if not all(v >= 0 for v in p):
            raise InvalidArgumentError("All elements of explicit_paddings must be nonnegative")
        if not (p[0] == p[1] == p[6] == p[7] == 0):
            raise InvalidArgumentError(
                "Nonzero explicit padding in the batch or depth dimensions is not supported")
        return (p[2], p[3]), (p[4], p[5])
    if len(p) != 0:
        raise InvalidArgumentError(
            "explicit_paddings attribute must be empty if the padding attribute is not "
            "EXPLICIT")
    return (0, 0), (0, 0)


def _int32_attr(name: str, values: tuple[int, ...]) -> None:
    """TF's kernels read strides and dilations as int32 (GetAttr into vector<int32>)."""
    for v in values:
        if not -2**31 <= v < 2**31:
            raise InvalidArgumentError(f"Attr {name} has value {v} out of range for an int32")


def _check_attrs(op: str, strides: tuple[int, ...], padding: str,
                 explicit_paddings: tuple[int, ...], data_format: str,
                 dilations: tuple[int, ...]) -> _Attrs:
    """The kernels' constructors: Conv2DOp's InitConv2DParameters, the custom backprops'
    own (which refuse NCHW and dilations here; BackpropFilter's batch/depth strides are an
    InvalidArgument where the others' are Unimplemented)."""
    if op == FORWARD:
        _int32_attr("dilations", dilations)
        _int32_attr("strides", strides)
        if len(dilations) != 4:
            raise InvalidArgumentError("Sliding window dilations field must specify 4 dimensions")
        if len(strides) != 4:
            raise InvalidArgumentError("Sliding window strides field must specify 4 dimensions")
        if not (strides[0] == 1 and strides[3] == 1):
            raise UnimplementedError("Current implementation does not yet support strides in "
                                     "the batch and depth dimensions.")
        if not (dilations[0] == 1 and dilations[3] == 1):
            raise UnimplementedError("Current implementation does not yet support dilations "
                                     "in the batch and depth dimensions.")
        if not (strides[1] > 0 and strides[2] > 0):
            raise InvalidArgumentError("Row and column strides should be larger than 0.")
        if not (dilations[1] > 0 and dilations[2] > 0):
            raise InvalidArgumentError("Dilated rates should be larger than 0.")
        ph, pw = _check_padding(padding, explicit_paddings)
        return _Attrs(strides[1], strides[2], dilations[1], dilations[2], padding, ph, pw)
    name = "Conv2DCustomBackpropInputOp" if op == INPUT else "Conv2DCustomBackpropFilterOp"
    if data_format != "NHWC":
        raise InvalidArgumentError(f"{name} only supports NHWC.")
    _int32_attr("strides", strides)
    _int32_attr("dilations", dilations)
    if len(strides) != 4:
        raise InvalidArgumentError("Sliding window strides field must specify 4 dimensions")
    if not (strides[0] == 1 and strides[3] == 1):
        cls = UnimplementedError if op == INPUT else InvalidArgumentError
        raise cls("Current implementation does not yet support strides in the batch and "
                  "depth dimensions.")
    if not (strides[1] > 0 and strides[2] > 0):
        raise InvalidArgumentError("Row and column strides should be larger than 0.")
    if op == FILTER:  # (BackpropFilter reads the padding before the dilations)
        ph, pw = _check_padding(padding, explicit_paddings)
    if len(dilations) != 4:
        raise InvalidArgumentError("Sliding window dilations field must specify 4 dimensions")
    if not (dilations[0] == 1 and dilations[3] == 1):
        cls = UnimplementedError if op == INPUT else InvalidArgumentError
        raise cls("Current implementation does not yet support dilations in the batch and "
                  "depth dimensions.")
    if not (dilations[1] == 1 and dilations[2] == 1):
        raise InvalidArgumentError(
            "Current CPU implementations do not yet support dilation rates larger than 1.")
    if op == INPUT:
        ph, pw = _check_padding(padding, explicit_paddings)
    return _Attrs(strides[1], strides[2], 1, 1, padding, ph, pw)


def _geometry(op: str, a: _Attrs, N: int, H: int, W: int, C: int, KH: int, KW: int,
              O: int) -> Geometry:
    oh, pt = window(op, H, KH, a.sh, a.dh, a.padding, a.pads_h)
    ow, pl = window(op, W, KW, a.sw, a.dw, a.padding, a.pads_w)
    return Geometry(N, H, W, C, O, KH, KW, oh, ow, a.sh, a.sw, a.dh, a.dw, pt, pl, a.padding)


def _sizes(op: str, arg: str, sizes: np.ndarray) -> tuple[int, ...]:
    if sizes.ndim != 1:
        who = "Conv2DBackpropInput" if op == INPUT else "Conv2DCustomBackpropFilter"
        raise InvalidArgumentError(f"{who}: {arg} input must be 1-dim, not {sizes.ndim}")
    vals = tuple(int(v) for v in sizes.tolist())
    if op == INPUT and len(vals) not in (2, 4):
        raise InvalidArgumentError(
            f"Conv2DBackpropInput requires input_sizes to contain 4 values or 2 values, but "
            f"got: {len(vals)}")
    for v in vals:
        if v < 0:
            raise InvalidArgumentError(f"Dimension {v} must be >= 0")
    if math.prod(vals) > 2**63 - 1:
        raise InvalidArgumentError(f"{overflow_words(vals)} ({arg} {shape_str(vals)})")
    return vals


def _backprop_dims(op: str, a: _Attrs, x: tuple[int, ...], f: tuple[int, ...],
                   g: tuple[int, ...]) -> Geometry:
    """TF's ConvBackpropComputeDimensionsV2 (label Conv2DCustomBackprop{Input,Filter})."""
    label = "Conv2DCustomBackpropInput" if op == INPUT else "Conv2DCustomBackpropFilter"
    if len(x) != 4:
        raise InvalidArgumentError(f"{label}: input must be 4-dimensional")
    if len(f) != 4:
        raise InvalidArgumentError(f"{label}: filter must be 4-dimensional")
    if len(g) != 4:
        raise InvalidArgumentError(f"{label}: out_backprop must be 4-dimensional")
    N, H, W, C = x
    KH, KW, FC, O = f
    if N != g[0]:
        raise InvalidArgumentError(
            f"{label}: input and out_backprop must have the same batch size. Input batch: "
            f"{N}, outbackprop batch: {g[0]}, batch_dim: 0")
    if FC == 0 or C % FC != 0:
        raise InvalidArgumentError(
            f"{label}: input depth must be evenly divisible by filter depth")
    if O != g[3]:
        raise InvalidArgumentError(
            f"{label}: filter and out_backprop must have the same out_depth")
    geo = _geometry(label, a, N, H, W, C, KH, KW, O)
    for dim, (actual, computed, n, k, s) in enumerate(
            ((g[1], geo.OH, H, KH, a.sh), (g[2], geo.OW, W, KW, a.sw)), 1):
        if actual != computed:
            raise InvalidArgumentError(
                f"{label}: Size of out_backprop doesn't match computed: actual = {actual}, "
                f"computed = {computed} spatial_dim: {dim} input: {n} filter: {k} output: "
                f"{actual} stride: {s} dilation: 1")
    return geo


def _grouped(op: str, geo: Geometry, fc: int) -> None:
    if fc != geo.C:
        raise UnimplementedError(
            f"{op}: grouped convolutions (input depth {geo.C}, filter depth {fc}) are not "
            "implemented by tfgrad")


def _checked(op: str, args: dict[str, Any]) -> Geometry:
    a = _check_attrs(op, tuple(args["strides"]), args["padding"],
                     tuple(args["explicit_paddings"]), args["data_format"],
                     tuple(args["dilations"]))
    if op == FORWARD:
        x, f = args["input"], args["filter"]
        if x.ndim != 4:
            raise InvalidArgumentError(
                f"convolution input must be 4-dimensional: {shape_str(x.shape)}")
        if f.ndim != 4:
            raise InvalidArgumentError(
                f"convolution filter must be 4-dimensional: {shape_str(f.shape)}")
        nchw = args["data_format"] == "NCHW"
        N, H, W, C = (x.shape[0], x.shape[2], x.shape[3], x.shape[1]) if nchw else x.shape
        KH, KW, FC, O = f.shape
        if FC == 0:
            raise InvalidArgumentError(f"filter depth must be stricly positive, got {FC}")
        if C % FC != 0:
            raise InvalidArgumentError(
                f"input depth must be evenly divisible by filter depth: {C} vs {FC}")
        geo = _geometry(op, a, N, H, W, C, KH, KW, O)
        if geo.N * geo.OH * geo.OW * O == 0:
            return geo  # TF returns the empty output before its launcher's checks
        if nchw:
            raise UnimplementedError(
                "The Conv2D op currently only supports the NHWC tensor format on the CPU. "
                "The op was given the format: NCHW")
        if any(v > 2**31 - 1 for v in args["explicit_paddings"]):
            raise InvalidArgumentError("filter too large")  # (TF's int bounds check)
        if KH * KW * FC * O == 0:
            raise InvalidArgumentError(
                "filter must not have zero elements (i.e. all dimensions must be non-zero)")
        _grouped(op, geo, FC)
        check_alloc(op, "output", (geo.N, geo.OH, geo.OW, O), F32)
        return geo
    g = args["out_backprop"]
    if op == INPUT:
        if g.ndim != 4:
            raise InvalidArgumentError(f"input_sizes must be 4-dimensional, got: {g.ndim}")
        f = args["filter"]
        sizes = _sizes(op, "input_sizes", args["input_sizes"])
        if len(sizes) == 2:  # [H, W]: batch from out_backprop, depth from the filter
            sizes = (g.shape[0], sizes[0], sizes[1], f.shape[2] if f.ndim == 4 else 0)
        geo = _backprop_dims(op, a, sizes, f.shape, g.shape)
        if geo.C != f.shape[2]:
            raise InvalidArgumentError(
                "Gradients for grouped convolutions are not supported on CPU. Please file a "
                f"feature request if you run into this issue. Computed input depth {geo.C} "
                f"doesn't match filter input depth {f.shape[2]}")
        check_alloc(op, "output", sizes, F32)
        return geo
    x = args["input"]
    fs = _sizes(op, "filter_sizes", args["filter_sizes"])
    geo = _backprop_dims(op, a, x.shape, fs, g.shape)
    if math.prod(fs) != 0 and geo.F * geo.O != math.prod(fs):
        raise InvalidArgumentError(
            f"filter_size does not have enough elements, requested {geo.F * geo.O}, got "
            f"{math.prod(fs)}")
    check_alloc(op, "output", fs, F32)
    return geo


def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    geo = _checked(op, args)
    if op == FORWARD:
        return {"output": (geo.N, geo.OH, geo.OW, geo.O)}
    if op == INPUT:
        return {"output": (geo.N, geo.H, geo.W, geo.C)}
    return {}


def window_of(op: str, strides: tuple[int, ...], padding: str,
              explicit_paddings: tuple[int, ...], dilations: tuple[int, ...],
              x_shape: tuple[int, ...], f_shape: tuple[int, ...]) -> Geometry:
    """The geometry from shapes alone (NHWC, already checked), for the portable and
    native implementations."""
    a = _check_attrs(op, tuple(strides), padding, tuple(explicit_paddings), "NHWC",
                     tuple(dilations))
    N, H, W, C = x_shape
    KH, KW, _, O = f_shape
    return _geometry(op, a, N, H, W, C, KH, KW, O)


def extent(geo: Geometry) -> tuple[int, int]:
    """Rows and columns of the (padded) input the outputs read, from the padding's start:
    ``(OH - 1) * sh + (KH - 1) * dh + 1`` and likewise (0 without outputs)."""
    eh = (geo.OH - 1) * geo.sh + (geo.KH - 1) * geo.dh + 1 if geo.OH else 0
    ew = (geo.OW - 1) * geo.sw + (geo.KW - 1) * geo.dw + 1 if geo.OW else 0
    return eh, ew


# --------------------------------------------------------------------------------------
# TF's plans
# --------------------------------------------------------------------------------------
def matmul_path(geo: Geometry, padding: str) -> bool:
    """LaunchGeneric's MatMulConvFunctor: a 1x1 filter at stride 1 (SAME or VALID), or a
    filter as large as the input, VALID, undilated; else Eigen's SpatialConvolution."""
    return ((geo.KH == geo.KW == 1 and geo.sh == geo.sw == 1 and padding != "EXPLICIT")
            or (geo.KH == geo.H and geo.KW == geo.W and geo.dh == geo.dw == 1
                and padding == "VALID"))


def forward_plan(geo: Geometry, padding: str) -> contraction.Plan:
    """Eigen's contraction [N*OH*OW, F] x [F, O] (MatMul's m = O, n = pixels): MatMul's
    plan on the MatMulConvFunctor path, else the image patches' (their cost model)."""
    if matmul_path(geo, padding):
        return _mm.plan(geo.N * geo.P, geo.F, geo.O)
    return _patches.plan(geo.O, geo.N * geo.P, geo.F, _config.tf_intra_op_threads(),
                         *eigen_caches(), onednn_isa())


def input_parallel(geo: Geometry) -> bool:
    """Conv2DCustomBackpropInputOp's use_parallel_contraction (TF's hard-coded L2)."""
    work = geo.P * geo.O + geo.F * geo.O + geo.P * geo.F
    return geo.N == 1 or work // _config.tf_intra_op_threads() >= _L2_TF // 4


def input_plan(geo: Geometry) -> contraction.Plan:
    """Per image col [P, F] = dy [P, O] x W^T: Eigen's plan on the parallel path; on the
    sharded path oneDNN's sgemm over the whole K = O (the nocopy kernel's K passes; see
    :func:`input_direct_kind` for its other kernels)."""
    if input_parallel(geo):
        return _mm.plan(geo.P, geo.O, geo.F)
    isa = onednn_isa()
    passes = tuple(contraction.onednn_passes(0, geo.O, isa))
    copy = isa == "avx2" and contraction.copy_based(geo.F, geo.P, geo.O)
    return contraction.Plan((contraction.Shard(
        blocks=((0, geo.O),), ranges=passes, gemv_m=False, gemv_n=False, isa=isa,
        trans_a=True, copy=((0, geo.P, 0, geo.F),) if copy else (),
        copy_ranges=tuple(contraction.copy_passes(0, geo.O)) if copy else ()),), "direct")


def input_direct_kind(geo: Geometry) -> str:
    """Which oneDNN kernel the sharded path's sgemm (column-major: M = F, N = OH*OW,
    K = O, A transposed) runs: ``"gemv"`` (N = 1: gemv_t), ``"smalln"`` (1 < N < 16:
    gemm_smalln_tn, AVX-512 only), ``"nocopy"`` otherwise; ``""`` on the parallel path."""
    if input_parallel(geo):
        return ""
    if geo.P == 1:
        return "gemv"
    return "smalln" if geo.P < 16 and onednn_isa() == "avx512_core" else "nocopy"


def smalln_reference(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """oneDNN's gemm_smalln_tn, C [R, F] = A [R, K] x B [F, K]^T: per output 16 lanes,
    lane l a FMA chain from +0 over k = l (mod 16) (all of K, no passes), then halved:
    lanes l and l + 8, then l and l + 4, l + 2, l + 1 (probe: every K in 1..800 with
    OH*OW in 2..15, 0 of 144 outputs differ; a single chain differs in most)."""
    R, K = A.shape
    F = B.shape[0]
    acc = np.zeros((R, F, 16), F32)
    for k in range(K):
        acc[:, :, k % 16] = onednn.fma(A[:, None, k], B[None, :, k], acc[:, :, k % 16])
    while acc.shape[2] > 1:
        h = acc.shape[2] // 2
        acc = onednn.add(acc[:, :, :h], acc[:, :, h:])
    return acc[:, :, 0]


def filter_shard(geo: Geometry) -> int:
    """Images per contraction in Conv2DCustomBackpropFilterOp (TF's hard-coded L3)."""
    work = geo.P * geo.F + geo.P * geo.O + geo.F * geo.O
    return max(1, -(-(_L3_TF // 4) // work))


def filter_plan(geo: Geometry, images: int) -> contraction.Plan:
    """dW [F, O] = A^T [F, P*images] x dy [P*images, O] (MatMul with transpose_a)."""
    return _mm.plan(geo.F, geo.P * images, geo.O)


# --------------------------------------------------------------------------------------
# The reference
# --------------------------------------------------------------------------------------
def contract_reference(A: np.ndarray, B: np.ndarray, p: contraction.Plan) -> np.ndarray:
    """Eigen's tensor contraction [M, K] x [K, N] with plan ``p`` (TF's names), its
    one-row and one-column shapes included."""
    if A.shape[0] == 1:
        return _patches.eigen_gemv(A, B)
    return _mm.reference_contraction(A, B, _patches.edge_plan(p, B.shape[1]))


def im2col(x: np.ndarray, geo: Geometry) -> np.ndarray:
    """[n*OH*OW, KH*KW*C]: patch rows in (image, oh, ow) order, K in (kh, kw, c) order,
    zeros for the padding (Eigen's image patches and TF's Im2col alike)."""
    n = x.shape[0]
    cols = np.zeros((n, geo.OH, geo.OW, geo.KH, geo.KW, geo.C), F32)
    for kh in range(geo.KH):
        r = np.array([i * geo.sh - geo.pt + kh * geo.dh for i in range(geo.OH)], np.int64)
        ri = np.flatnonzero((r >= 0) & (r < geo.H))
        for kw in range(geo.KW):
            c = np.array([j * geo.sw - geo.pl + kw * geo.dw for j in range(geo.OW)], np.int64)
            ci = np.flatnonzero((c >= 0) & (c < geo.W))
            cols[:, ri[:, None], ci[None, :], kh, kw] = x[:, r[ri][:, None], c[ci][None, :]]
    return cols.reshape(n * geo.P, geo.F)


def col2im(col: np.ndarray, geo: Geometry) -> np.ndarray:
    """TF's Col2im for one image: dx zeroed, col [P, F] added in (oh, ow, kh, kw) order,
    channels as vectors; one float32 add each (FTZ)."""
    dx = np.zeros((geo.H, geo.W, geo.C), F32)
    col = col.reshape(geo.OH, geo.OW, geo.KH, geo.KW, geo.C)
    for i in range(geo.OH):
        for j in range(geo.OW):
            for kh in range(geo.KH):
                r = i * geo.sh - geo.pt + kh
                if not 0 <= r < geo.H:
                    continue
                for kw in range(geo.KW):
                    c = j * geo.sw - geo.pl + kw
                    if 0 <= c < geo.W:
                        dx[r, c] = _mm.add(dx[r, c], col[i, j, kh, kw])
    return dx


def forward_reference(x: np.ndarray, f: np.ndarray, geo: Geometry) -> np.ndarray:
    A = im2col(flushed(x), geo)
    out = contract_reference(A, flushed(f).reshape(geo.F, geo.O),
                             forward_plan(geo, geo.padding))
    return out.reshape(geo.N, geo.OH, geo.OW, geo.O)


def input_reference(f: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    p = input_plan(geo)
    kind = input_direct_kind(geo)
    W = flushed(f).reshape(geo.F, geo.O)
    dx = np.empty((geo.N, geo.H, geo.W, geo.C), F32)
    for n in range(geo.N):
        a = flushed(g[n]).reshape(geo.P, geo.O)
        if kind == "smalln":
            col = smalln_reference(a, W)
        elif kind == "gemv":
            col = _patches.gemv_one(a, W)
        else:
            col = contract_reference(a, W.T, p)
        dx[n] = col2im(col, geo)
    return dx


def filter_reference(x: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    dw = np.zeros((geo.F, geo.O), F32)
    for s, e, p in _filter_plans(geo):
        A = im2col(flushed(x[s:e]), geo)
        B = flushed(g[s:e]).reshape(-1, geo.O)
        dw = _mm.add(dw, contract_reference(A.T, B, p))  # TF's C += contraction
    return dw


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------
def _filter_plans(geo: Geometry) -> list[tuple[int, int, contraction.Plan]]:
    """TF's shards of images for BackpropFilter: (first, end, the shard's plan)."""
    step = filter_shard(geo)
    return [(s, min(geo.N, s + step), filter_plan(geo, min(geo.N, s + step) - s))
            for s in range(0, geo.N, step)]


def _plans(op: str, geo: Geometry) -> Any:
    """TF's plan(s) of the op's contraction(s), as the kernels take them."""
    if op == FORWARD:
        return forward_plan(geo, geo.padding)
    if op == INPUT:
        return input_plan(geo), input_direct_kind(geo)
    return _filter_plans(geo)


def _run(op: str, geo: Geometry, k: dict[str, Any], plans: dict[tuple, Any]) -> np.ndarray:
    """``plans``: the call's plans by what they depend on besides the geometry (TF's
    thread count, the modelled oneDNN kernel), kept per signature: planned once."""
    with flush_denormals(), np.errstate(all="ignore"):  # inf and NaN propagate as in TF
        ref = _config.use_reference()
        if not ref:
            by = (_config.tf_intra_op_threads(), onednn_isa())
            p = plans.get(by)
            if p is None:
                p = plans[by] = _plans(op, geo)
        if op == FORWARD:
            if ref:
                return forward_reference(k["input"], k["filter"], geo)
            return _dispatch().forward(k["input"], k["filter"], geo, p)
        if op == INPUT:
            if ref:
                return input_reference(k["filter"], k["out_backprop"], geo)
            return _dispatch().backprop_input(k["filter"], k["out_backprop"], geo, *p)
        if ref:
            out = filter_reference(k["input"], k["out_backprop"], geo)
        else:
            out = _dispatch().backprop_filter(k["input"], k["out_backprop"], geo, p)
        return out.reshape(geo.KH, geo.KW, geo.C, geo.O)


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], np.ndarray]:
    geo = _checked(op, args)
    if op == FORWARD:
        shape = (geo.N, geo.OH, geo.OW, geo.O)
        if math.prod(shape) == 0:
            return lambda k: np.zeros(shape, F32)
    elif op == INPUT:
        shape = (geo.N, geo.H, geo.W, geo.C)
        if geo.N * geo.H * geo.W * geo.C == 0 or geo.P * geo.O == 0 or geo.F * geo.O == 0:
            return lambda k: np.zeros(shape, F32)
    else:
        shape = tuple(int(v) for v in args["filter_sizes"].tolist())
        if math.prod(shape) == 0 or geo.N * geo.P == 0:
            return lambda k: np.zeros(shape, F32)
    plans: dict[tuple, Any] = {}
    return lambda k: _run(op, geo, k, plans)


def Conv2D(*, input: np.ndarray, filter: np.ndarray, strides: tuple[int, ...],
           use_cudnn_on_gpu: bool, padding: str, explicit_paddings: tuple[int, ...],
           data_format: str, dilations: tuple[int, ...]) -> np.ndarray:
    args = locals()
    return prepare(FORWARD, args)(args)


def Conv2DBackpropInput(*, input_sizes: np.ndarray, filter: np.ndarray,
                        out_backprop: np.ndarray, strides: tuple[int, ...],
                        use_cudnn_on_gpu: bool, padding: str,
                        explicit_paddings: tuple[int, ...], data_format: str,
                        dilations: tuple[int, ...]) -> np.ndarray:
    args = locals()
    return prepare(INPUT, args)(args)


def Conv2DBackpropFilter(*, input: np.ndarray, filter_sizes: np.ndarray,
                         out_backprop: np.ndarray, strides: tuple[int, ...],
                         use_cudnn_on_gpu: bool, padding: str,
                         explicit_paddings: tuple[int, ...], data_format: str,
                         dilations: tuple[int, ...]) -> np.ndarray:
    args = locals()
    return prepare(FILTER, args)(args)
