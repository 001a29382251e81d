"""Op cases for DepthwiseConv2dNative and its two gradients.

TF's Eigen CPU kernel computes NHWC without dilation; the NCHW and dilated cases are
checked against it through ``tf_call``: the NHWC transpose of the same call, and the
filter dilated explicitly (zeros inserted between the taps; for BackpropFilter, the
gradient of the dilated filter sampled at the real taps). Both give the same bits as the
convolution itself for finite inputs, zero signs included (see tfgrad.ops.depthwise_conv).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numba
import numpy as np

from tfgrad import InvalidArgumentError
from tfgrad._opdefs import OPS
from tfgrad._tf.depthwise import window
from tfgrad.kernels.depthwise_conv import VARIANTS, Variant

from ..harness import Bench, array_bytes
from . import Case, ErrorCase, Warmup

FWD = "DepthwiseConv2dNative"
BI = "DepthwiseConv2dNativeBackpropInput"
BF = "DepthwiseConv2dNativeBackpropFilter"
DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _attrs(s: int, padding: str, pads: tuple[int, int, int, int] | None, dil: tuple[int, int],
           nchw: bool) -> dict[str, Any]:
    """Attrs in data_format order; pads = (top, bottom, left, right)."""
    kw: dict[str, Any] = {"padding": padding}
    if nchw:
        kw.update(strides=[1, 1, s, s], dilations=[1, 1, *dil], data_format="NCHW")
        if pads is not None:
            kw["explicit_paddings"] = [0, 0, 0, 0, *pads]
    else:
        kw.update(strides=[1, s, s, 1], dilations=[1, *dil, 1])
        if pads is not None:
            kw["explicit_paddings"] = [0, 0, *pads, 0, 0]
    return kw


def _nhwc_call(op: str, kw: dict[str, Any], nchw: bool, dil: tuple[int, int],
               fsize: tuple[int, int, int, int]) -> tuple[str, dict[str, Any]]:
    """The NHWC, dilation-1 call that TF's Eigen kernel computes for the same case."""
    kw = dict(kw)
    dh, dw = dil
    fh, fw, C, M = fsize
    fh_d, fw_d = ((fh - 1) * dh + 1 if fh else 0), ((fw - 1) * dw + 1 if fw else 0)
    if nchw:
        for k in ("input", "out_backprop"):
            if k in kw:
                kw[k] = np.ascontiguousarray(kw[k].transpose(0, 2, 3, 1))
        if "input_sizes" in kw:
            n, c, h, w = (int(v) for v in kw["input_sizes"])
            kw["input_sizes"] = np.array([n, h, w, c], np.int32)
        s = kw["strides"][2]
        kw["strides"] = [1, s, s, 1]
        if "explicit_paddings" in kw:
            kw["explicit_paddings"] = [0, 0, *kw["explicit_paddings"][4:], 0, 0]
        kw["data_format"] = "NHWC"
    kw["dilations"] = [1, 1, 1, 1]
    if "filter" in kw:
        f = kw["filter"]
        big = np.zeros((fh_d, fw_d, C, M), f.dtype)
        big[::dh, ::dw] = f
        kw["filter"] = big
    if "filter_sizes" in kw:
        kw["filter_sizes"] = np.array([fh_d, fw_d, C, M], np.int32)
    return op, kw


def _cases(name: str, *, N: int = 2, H: int = 7, W: int = 6, C: int = 3, M: int = 1,
           fh: int = 3, fw: int = 3, s: int = 1, padding: str = "SAME",
           pads: tuple[int, int, int, int] | None = None, dil: tuple[int, int] = (1, 1),
           nchw: bool = False, dtypes: tuple[str, ...] = ("f32",),
           ops: tuple[str, ...] = (FWD, BI, BF), inf_filter: bool = False,
           inf_grad: bool = False) -> list[Case]:
    oh, _ = window("", H, fh, s, dil[0], padding, pads[:2] if pads else (0, 0))
    ow, _ = window("", W, fw, s, dil[1], padding, pads[2:] if pads else (0, 0))
    kw_attrs = _attrs(s, padding, pads, dil, nchw)
    refused = nchw or dil != (1, 1)

    def layout(shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        n, h, w, c = shape
        return (n, c, h, w) if nchw else shape

    out = []
    for dname in dtypes:
        dt = DTYPES[dname]
        for op in ops:
            def make(rng: np.random.Generator, op: str = op, dt: Any = dt) -> dict[str, Any]:
                x = rng.standard_normal(layout((N, H, W, C))).astype(dt)
                w = rng.standard_normal((fh, fw, C, M)).astype(dt)
                if inf_filter and w.size:
                    w[0, 0, 0, 0] = np.inf  # 0 * inf = NaN on the padding / missed taps
                g = rng.standard_normal(layout((N, oh, ow, C * M))).astype(dt)
                if inf_grad:  # at a border column of channel 0: its padding taps get NaN
                    g[0, 0, 0, 0] = np.inf
                if op == FWD:
                    return {"input": x, "filter": w, **kw_attrs}
                if op == BI:
                    return {"input_sizes": np.array(layout((N, H, W, C)), np.int32),
                            "filter": w, "out_backprop": g, **kw_attrs}
                return {"input": x, "filter_sizes": np.array([fh, fw, C, M], np.int32),
                        "out_backprop": g, **kw_attrs}

            tf_call = tf_outputs = None
            if refused:
                def tf_call(kw: dict[str, Any], op: str = op) -> tuple[str, dict[str, Any]]:
                    return _nhwc_call(op, kw, nchw, dil, (fh, fw, C, M))

                def tf_outputs(out: Any, op: str = op) -> Any:
                    if op == BF:
                        return out[::dil[0], ::dil[1]]
                    return out.transpose(0, 3, 1, 2) if nchw else out

            out.append(Case(op, f"{name}/{dname}", make, tf_call=tf_call,
                            tf_outputs=tf_outputs))
    return out


ALL4 = ("f32", "f64", "f16", "bf16")
CASES: list[Case] = [
    *_cases("same_3x3", dtypes=ALL4),
    *_cases("valid_5x5_s2_m2", H=9, W=10, M=2, fh=5, fw=5, s=2, padding="VALID",
            dtypes=("f32", "f64", "bf16")),
    *_cases("explicit_3x2_s2_m3", M=3, fw=2, s=2, padding="EXPLICIT", pads=(1, 2, 0, 3),
            dtypes=("f32", "f16")),
    # SAME with an odd pad total: the extra row / column goes after (bottom / right).
    *_cases("same_odd_pad_2x2", H=4, W=5, fh=2, fw=2, dtypes=("f32",)),
    *_cases("same_odd_pad_s2", H=6, W=6, s=2, dtypes=("f32",)),
    *_cases("same_s3_4x3", N=1, H=8, W=7, C=5, fh=4, fw=3, s=3, dtypes=("f32", "f64")),
    *_cases("valid_1x1_s2", H=5, W=5, C=4, M=2, fh=1, fw=1, s=2, padding="VALID",
            dtypes=("f32",)),
    *_cases("stride4_gt_filter_2x2", H=9, W=10, M=2, fh=2, fw=2, s=4, dtypes=("f32",)),
    *_cases("explicit_s3_large_pads", N=1, H=5, W=4, fh=3, fw=4, s=3, padding="EXPLICIT",
            pads=(4, 0, 3, 5), dtypes=("f64",)),
    # Multipliers around the 8-lane (float32, halves) and 4-lane (float64) packets of the
    # BackpropInput reduction.
    *_cases("m8_7x7", N=1, H=8, W=8, C=2, M=8, fh=7, fw=7, dtypes=("f32", "f64", "f16")),
    *_cases("m9_same", N=1, H=5, W=4, C=2, M=9, dtypes=("f32", "bf16")),
    *_cases("m17_s2", N=1, H=6, W=5, C=2, M=17, s=2, dtypes=("f32", "f64")),
    *_cases("large_filter_9x8", N=1, H=10, W=9, C=2, fh=9, fw=8, dtypes=("f32",)),
    # BackpropFilter's per-image buffers summed in batch order in T (float32 for the
    # halves), over more than two images; 20 channels leave a partial lane vector.
    *_cases("batch6_3x3", N=6, H=6, W=9, C=20, ops=(BF,), dtypes=ALL4),
    *_cases("batch5_4x4", N=5, H=6, W=7, C=3, fh=4, fw=4, ops=(BF,), dtypes=("f32", "bf16")),
    # Beyond TF's CPU kernel: NCHW and dilations (checked against the NHWC / explicitly
    # dilated equivalents that TF computes).
    *_cases("nchw_same_s2_m2", M=2, s=2, nchw=True, dtypes=("f32", "f16")),
    *_cases("nchw_explicit", padding="EXPLICIT", pads=(2, 0, 1, 1), nchw=True,
            dtypes=("f64",)),
    *_cases("dilation2_same", H=8, W=8, dil=(2, 2), dtypes=("f32", "bf16")),
    *_cases("dilation_3x2_valid_m2", H=9, W=8, M=2, dil=(3, 2), padding="VALID",
            dtypes=("f32", "f64")),
    *_cases("dilation2_s2_explicit", H=9, W=9, s=2, dil=(2, 2), padding="EXPLICIT",
            pads=(1, 3, 2, 0), dtypes=("f32",)),
    *_cases("nchw_dilation2_m3", H=8, W=7, M=3, dil=(2, 2), nchw=True, dtypes=("f32",)),
    # Empty tensors. (BackpropFilter with batch 0 or an empty out_backprop is pinned in
    # tests/test_depthwise_conv.py: TF returns uninitialised memory there.)
    *_cases("batch0", N=0, ops=(FWD, BI)),
    *_cases("channels0", C=0, ops=(FWD, BI, BF)),
    *_cases("multiplier0", M=0, ops=(FWD, BF)),
    *_cases("valid_empty_output", N=1, H=1, W=1, C=1, fh=4, fw=4, s=2, padding="VALID",
            ops=(FWD, BI)),
    *_cases("filter_rows0", fh=0, ops=(FWD, BI, BF)),
    # An inf filter tap meets the zero padding (forward) and the taps that reach no
    # out_backprop value (BackpropInput, stride 2): 0 * inf = NaN, as TF.
    *_cases("inf_filter", s=2, inf_filter=True, ops=(FWD, BI)),
    *_cases("inf_filter_m9", H=5, W=6, M=9, s=2, inf_filter=True, ops=(BI,),
            dtypes=("f32", "f16")),
    # An inf out_backprop value at a border column: NaN in its own channel's padding taps
    # only, not in the other channels'.
    *_cases("inf_grad_4x4", H=5, W=6, fh=4, fw=4, inf_grad=True, ops=(BF,)),
    *_cases("inf_grad_3x3", H=5, W=6, inf_grad=True, ops=(BF,)),
    # M = 2 on whole lane vectors (C * M = 16): the lane-vector-blocked rings, and
    # BackpropFilter's five-row sweeps (5x5 on AVX-512, the rows all inside) beside its
    # three + two row groups (padding rows), one with a height-only dilation.
    *_cases("lanes_5x5_m2_valid", H=9, W=10, C=8, M=2, fh=5, fw=5, padding="VALID",
            dtypes=("f32", "f64")),
    *_cases("lanes_5x5_m2_same_dil_h2", H=12, W=9, C=8, M=2, fh=5, fw=5, dil=(2, 1),
            dtypes=("f32",)),
]


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------
def _x(shape=(1, 4, 5, 2)):  # type: ignore[no-untyped-def]
    return np.ones(shape, np.float32)


def _err(op: str, name: str, match: str, tf_rejects: bool = True, why: str = "",
         tf_error: str = "", tf_match: str | None = None, **over: Any) -> ErrorCase:
    def kwargs() -> dict[str, Any]:
        base: dict[str, Any] = {"strides": [1, 1, 1, 1], "padding": "SAME"}
        if op == FWD:
            base.update(input=_x(), filter=_x((3, 3, 2, 1)))
        elif op == BI:
            base.update(input_sizes=np.array([1, 4, 5, 2], np.int32), filter=_x((3, 3, 2, 1)),
                        out_backprop=_x())
        else:
            base.update(input=_x(), filter_sizes=np.array([3, 3, 2, 1], np.int32),
                        out_backprop=_x())
        base.update({k: (v() if callable(v) else v) for k, v in over.items()})
        return base

    return ErrorCase(op, name, kwargs, InvalidArgumentError, match, tf_rejects, why,
                     tf_error, tf_match)


def _all_ops(name: str, match: str, **over: Any) -> list[ErrorCase]:
    return [_err(op, name, match, **over) for op in (FWD, BI, BF)]


_OVERFLOW = "Encountered overflow when multiplying 4611686014132420609 with 2147483647"
_IGNORED = "TF's backprop kernels never read dilations (they ignore them silently)"
# TF's CPU forward refuses every dilation but 1 (UnimplementedError); tfgrad computes
# dilations > 0, so what is wrong here is what TF's GPU kernel says (InvalidArgument).
_DILATED = dict(tf_error="UnimplementedError",
                tf_match="Current kernel implementation does not support dilations",
                why="TF's CPU forward raises Unimplemented for any dilation; tfgrad "
                    "computes dilated convolutions and rejects only this one's error")
ERROR_CASES: list[ErrorCase] = [
    *_all_ops("strides_len3", "strides field must specify 4 dimensions", strides=[1, 1, 1]),
    *_all_ops("stride0", r"Stride must be > 0, but got 0", strides=[1, 0, 0, 1]),
    *_all_ops("stride_negative", r"Stride must be > 0, but got -1", strides=[1, -1, -1, 1]),
    *_all_ops("strides_unequal", "equal length strides", strides=[1, 1, 2, 1]),
    *_all_ops("stride_batch", "strides in the batch and depth", strides=[2, 1, 1, 1]),
    *_all_ops("explicit_len4", "must contain 8 values, but got: 4", padding="EXPLICIT",
              explicit_paddings=[1, 1, 1, 1]),
    *_all_ops("explicit_missing", "must contain 8 values, but got: 0", padding="EXPLICIT"),
    *_all_ops("explicit_negative", "must be nonnegative", padding="EXPLICIT",
              explicit_paddings=[0, 0, -1, 1, 1, 1, 0, 0]),
    *_all_ops("explicit_batch", "batch or depth dimensions is not supported",
              padding="EXPLICIT", explicit_paddings=[1, 0, 1, 1, 1, 1, 0, 0]),
    *_all_ops("explicit_with_same", "must be empty if the padding attribute is not EXPLICIT",
              explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0]),
    _err(FWD, "dilation0", "Dilated rates should be larger than 0", dilations=[1, 0, 0, 1],
         **_DILATED),
    _err(BI, "dilation0", "Dilated rates should be larger than 0", dilations=[1, 0, 0, 1],
         tf_rejects=False, why=_IGNORED),
    _err(BF, "dilation0", "Dilated rates should be larger than 0", dilations=[1, 1, 0, 1],
         tf_rejects=False, why=_IGNORED),
    _err(FWD, "dilations_len3", "dilations field must specify 4 dimensions",
         dilations=[1, 1, 1], tf_rejects=False,
         why="TF's forward only checks that every value is 1, whatever the length"),
    _err(BI, "dilations_len3", "dilations field must specify 4 dimensions",
         dilations=[1, 2, 2], tf_rejects=False, why=_IGNORED),
    _err(FWD, "dilation_batch", "dilations in the batch and depth", dilations=[2, 1, 1, 1],
         **_DILATED),
    _err(BF, "dilation_depth", "dilations in the batch and depth", dilations=[1, 1, 1, 2],
         tf_rejects=False, why=_IGNORED),
    # Forward shapes.
    _err(FWD, "input_rank3", r"input must be 4-dimensional\[4,5,2\]", input=_x((4, 5, 2))),
    _err(FWD, "filter_rank3", r"filter must be 4-dimensional: \[3,3,2\]",
         filter=_x((3, 3, 2))),
    _err(FWD, "depth_mismatch", "must have the same depth: 2 vs 3", filter=_x((3, 3, 3, 1))),
    _err(FWD, "negative_output", r"output size would be negative: -1 \[input_size: 2, "
         r"effective_filter_size: 4, stride: 1\]", input=_x((1, 2, 2, 1)),
         filter=_x((4, 4, 1, 1)), padding="VALID"),
    _err(FWD, "negative_output_dilated", r"would be negative: -2 \[input_size: 4, "
         r"effective_filter_size: 7", padding="VALID", dilations=[1, 3, 3, 1], **_DILATED),
    # BackpropInput.
    _err(BI, "input_sizes_rank2", "input_sizes input must be 1-dim, not 2",
         input_sizes=np.array([[1, 4, 5, 2]], np.int32)),
    _err(BI, "input_sizes_len3", "input must be 4-dimensional",
         input_sizes=np.array([4, 5, 2], np.int32)),
    _err(BI, "input_sizes_negative", "Dimension 1 of input_sizes must be >= 0",
         input_sizes=np.array([1, -4, 5, 2], np.int32)),
    _err(BI, "input_sizes_overflow", _OVERFLOW,
         input_sizes=np.array([2**31 - 1, 2**31 - 1, 2**31 - 1, 2], np.int32)),
    _err(BI, "filter_rank3", "filter must be 4-dimensional", filter=_x((3, 3, 2))),
    _err(BI, "out_backprop_rank3", "out_backprop must be 4-dimensional",
         out_backprop=_x((4, 5, 2))),
    _err(BI, "batch_mismatch", "same batch size", input_sizes=np.array([2, 4, 5, 2], np.int32)),
    _err(BI, "depth_mismatch", "same in_depth", input_sizes=np.array([1, 4, 5, 3], np.int32)),
    _err(BI, "out_depth_mismatch", "depth_multiplier \\* in_depth not equal to out_depth",
         out_backprop=_x((1, 4, 5, 3))),
    _err(BI, "rows_mismatch", "Number of rows of out_backprop doesn't match computed: "
         "actual = 3, computed = 4", out_backprop=_x((1, 3, 5, 2))),
    _err(BI, "cols_mismatch", "Number of cols of out_backprop doesn't match computed: "
         "actual = 4, computed = 3", out_backprop=_x((1, 4, 4, 2)), strides=[1, 2, 2, 1],
         input_sizes=np.array([1, 8, 5, 2], np.int32)),
    _err(BI, "negative_output", "output size would be negative",
         input_sizes=np.array([1, 2, 2, 2], np.int32), filter=_x((4, 4, 2, 1)),
         padding="VALID"),
    _err(BI, "nchw_rows_mismatch", "Number of rows of out_backprop", data_format="NCHW",
         input_sizes=np.array([1, 2, 4, 5], np.int32), out_backprop=_x((1, 2, 3, 5)),
         tf_rejects=True),
    # BackpropFilter.
    _err(BF, "filter_sizes_rank2", "filter_sizes input must be 1-dim, not 2",
         filter_sizes=np.array([[3, 3, 2, 1]], np.int32)),
    _err(BF, "filter_sizes_len3", "filter must be 4-dimensional",
         filter_sizes=np.array([3, 3, 2], np.int32)),
    _err(BF, "filter_sizes_negative", "Dimension 1 of filter_sizes must be >= 0",
         filter_sizes=np.array([3, -3, 2, 1], np.int32)),
    _err(BF, "filter_sizes_overflow", _OVERFLOW,
         filter_sizes=np.array([2**31 - 1, 2**31 - 1, 2**31 - 1, 2], np.int32)),
    _err(BF, "input_rank3", "input must be 4-dimensional", input=_x((4, 5, 2))),
    _err(BF, "out_backprop_rank3", "out_backprop must be 4-dimensional",
         out_backprop=_x((4, 5, 2))),
    _err(BF, "batch_mismatch", "same batch size", out_backprop=_x((2, 4, 5, 2))),
    _err(BF, "depth_mismatch", "same in_depth", filter_sizes=np.array([3, 3, 3, 1], np.int32)),
    _err(BF, "out_depth_mismatch", "depth_multiplier \\* in_depth not equal to out_depth",
         out_backprop=_x((1, 4, 5, 3))),
    _err(BF, "rows_mismatch", "actual = 3, computed = 4", out_backprop=_x((1, 3, 5, 2))),
    _err(BF, "cols_mismatch", "actual = 4, computed = 5", out_backprop=_x((1, 4, 4, 2))),
]


# --------------------------------------------------------------------------------------
# Benchmarks (tfgrad bench, benchmarks/run.py)
# --------------------------------------------------------------------------------------
# Depthwise convolution benchmarks at MobileNet shapes (float32, NHWC).
#
# PyTorch runs the same convolutions as grouped convolutions (groups = in_channels) on
# channels-last views of the same buffers: ``torch.nn.functional.conv2d`` for the forward
# and ``torch.ops.aten.convolution_backward`` for the two gradients. Where TF's SAME
# padding is asymmetric (stride 2 on an even size: 0 before, 1 after) PyTorch gets the
# symmetric padding that gives the same output size (the same amount of work).
# (N, H, W, C, fh, fw, M, stride, padding); smoke-mode sizes are scaled down.
BENCH_SHAPES = [
    (16, 56, 56, 128, 3, 3, 1, 1, "SAME"),
    (16, 112, 112, 32, 3, 3, 1, 2, "SAME"),
    (16, 32, 32, 96, 5, 5, 2, 1, "VALID"),
]


def _bench_dims(shape: tuple, smoke: bool) -> tuple:
    N, H, W, C, fh, fw, M, s, pad = shape
    if smoke:
        N, H, W, C = 2, max(8, H // 8), max(8, W // 8), min(C, 16)
    oh, pt = window("bench", H, fh, s, 1, pad, (0, 0))
    ow, pl = window("bench", W, fw, s, 1, pad, (0, 0))
    return N, H, W, C, fh, fw, M, s, pad, oh, ow, pt, pl


def _bench_attrs(s: int, pad: str) -> dict[str, Any]:
    return {"strides": [1, s, s, 1], "padding": pad}


def _bench_desc(shape: tuple) -> str:
    N, H, W, C, fh, fw, M, s, pad = shape
    return f"[{N},{H},{W},{C}] {fh}x{fw} M={M} s={s} {pad}"


def _bench_torch_args(shape: tuple, kw: dict[str, Any]) -> dict[str, Any]:
    import torch

    N, H, W, C, fh, fw, M, s, pad = shape
    pt = pl = 0
    if pad == "SAME":
        pt = pl = (fh - 1) // 2  # symmetric, same output size as TF's SAME here
    t = {"stride": (s, s), "padding": (pt, pl), "groups": C}
    for k in ("input", "out_backprop"):
        if k in kw:  # channels-last views of the same NHWC memory
            t[k] = torch.from_numpy(kw[k]).permute(0, 3, 1, 2)
    if "filter" in kw:
        f = kw["filter"]
        t["weight"] = torch.from_numpy(
            np.ascontiguousarray(f.transpose(2, 3, 0, 1).reshape(C * M, 1, fh, fw)))
    else:
        t["weight"] = torch.zeros(C * M, 1, fh, fw)
    if "input" not in t:
        t["input"] = torch.zeros(N, C, H, W).contiguous(memory_format=torch.channels_last)
    return t


def _bench_make(shape: tuple, op: str):
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        N, H, W, C, fh, fw, M, s, pad, oh, ow, _, _ = _bench_dims(shape, smoke)
        x = rng.standard_normal((N, H, W, C), dtype=np.float32)
        w = rng.standard_normal((fh, fw, C, M), dtype=np.float32)
        g = rng.standard_normal((N, oh, ow, C * M), dtype=np.float32)
        kw = _bench_attrs(s, pad)
        if op == "fwd":
            return {"input": x, "filter": w, **kw}
        if op == "bi":
            return {"input_sizes": np.array([N, H, W, C], np.int32), "filter": w,
                    "out_backprop": g, **kw}
        return {"input": x, "filter_sizes": np.array([fh, fw, C, M], np.int32),
                "out_backprop": g, **kw}

    return make


def _bench_torch(shape: tuple, op: str):
    def build(kw: dict[str, Any]):
        import torch
        import torch.nn.functional as F

        s, pad = kw["strides"][1], kw["padding"]
        if "input_sizes" in kw:
            N, H, W, C = (int(v) for v in kw["input_sizes"])
        else:
            N, H, W, C = kw["input"].shape
        fh, fw, _, M = kw["filter"].shape if "filter" in kw else kw["filter_sizes"]
        t = _bench_torch_args((N, H, W, C, int(fh), int(fw), int(M), s, pad), kw)
        if op == "fwd":
            return lambda: F.conv2d(t["input"], t["weight"], None, t["stride"], t["padding"],
                                    1, t["groups"])
        mask = [True, False, False] if op == "bi" else [False, True, False]
        return lambda: torch.ops.aten.convolution_backward(
            t["out_backprop"], t["input"], t["weight"], None, t["stride"], t["padding"],
            (1, 1), False, (0, 0), t["groups"], mask)

    return build


def _bench_nbytes(op: str):
    def nbytes(kw: dict[str, Any]) -> int:
        if op == "fwd":  # read input and filter, write the output
            x, w = kw["input"], kw["filter"]
            N, H, W, C = x.shape
            fh, fw, _, M = w.shape
            s, pad = kw["strides"][1], kw["padding"]
            oh, _ = window("bench", H, fh, s, 1, pad, (0, 0))
            ow, _ = window("bench", W, fw, s, 1, pad, (0, 0))
            return array_bytes(x, w) + N * oh * ow * C * M * 4
        if op == "bi":  # read filter and out_backprop, write the input gradient
            return array_bytes(kw["filter"], kw["out_backprop"]) + int(
                np.prod(kw["input_sizes"])) * 4
        return array_bytes(kw["input"], kw["out_backprop"]) + int(
            np.prod(kw["filter_sizes"])) * 4

    return nbytes


_BENCH_OPS = {"fwd": "DepthwiseConv2dNative", "bi": "DepthwiseConv2dNativeBackpropInput",
        "bf": "DepthwiseConv2dNativeBackpropFilter"}

BENCHES = [
    Bench(_BENCH_OPS[op], _bench_desc(shape), _bench_make(shape, op), _bench_nbytes(op),
          torch=_bench_torch(shape, op))
    for shape in BENCH_SHAPES for op in ("fwd", "bi", "bf")
]


# --------------------------------------------------------------------------------------
# Warmup (tfgrad warmup runs these besides every case and benchmark)
# --------------------------------------------------------------------------------------
# Every dtype and layout with each padding, a stride, a dilation and a non-finite filter
# (another BackpropInput kernel), 3x3: tiny, and large with as many images as threads
# (BackpropFilter's kernel depends on the batch against the thread count). A new kernel
# variant that no case or benchmark selects gets a row here.
_WARM_VARIANTS = [  # (padding, pads, stride, dilation, inf filter)
    ("SAME", None, 1, 1, False),
    ("VALID", None, 2, 1, False),
    ("EXPLICIT", (1, 1, 1, 1), 1, 1, False),
    ("SAME", None, 1, 2, False),
    ("SAME", None, 1, 1, True),
]
_WARM_SIZES = {False: dict(N=1, H=5, W=5, C=2, M=2),
               True: dict(N=max(2, numba.config.NUMBA_NUM_THREADS), H=16, W=16, C=8, M=2)}
WARMUP: list[Warmup] = [
    Warmup(c.op, c.name, c.make, large)
    for large, size in _WARM_SIZES.items()
    for nchw in (False, True)
    for padding, pads, s, d, inf in _WARM_VARIANTS
    for c in _cases(f"{'large' if large else 'tiny'}_{'nchw' if nchw else 'nhwc'}_{padding}"
                    f"_s{s}_d{d}{'_inf' if inf else ''}", **size, s=s, padding=padding,
                    pads=pads, dil=(d, d), nchw=nchw, dtypes=ALL4, inf_filter=inf)
]

WARMUP_GROUPS = (("DepthwiseConv2dNative",), ("DepthwiseConv2dNativeBackpropInput",),
                 ("DepthwiseConv2dNativeBackpropFilter",))
"""Ops whose kernels share no compiled function (each op's kernels live in a module of
their own): ``tfgrad warmup --jobs`` may warm them in separate processes. The family
compiles the most of all: in one process it was the whole warmup's critical path."""

# One input per register-blocked kernel of the variant table (``VARIANTS``), in float32 and
# float64, whatever the cases and benchmarks select (tests/test_depthwise_conv.py checks
# that each input selects its variant).
_VARIANT_OPS = {"forward": FWD, "backprop_input": BI, "backprop_filter": BF}


def variant_size(v: Variant, dname: str) -> dict[str, int]:
    """Sizes whose call selects variant ``v`` in dtype ``dname`` (``"f32"`` or ``"f64"``)."""
    line = 16 if dname == "f32" else 8  # (elements in a 64-byte line)
    if v.stream or v.pstream:  # an output of 4 MiB (the streaming minimum), whole lines
        return dict(N=1, H=256, W=256, C=line, M=2 if v.pstream else 1)
    if v.pair:  # C * M two lane vectors
        return dict(N=1, H=9, W=9, C=line, M=2)
    if v.blocked:  # C * M one lane vector
        return dict(N=1, H=9, W=9, C=line // 2, M=2)
    return dict(N=1, H=9, W=9, C=3, M=1)


VARIANT_WARMUP: list[tuple[Variant, Warmup]] = [
    (v, Warmup(c.op, c.name, c.make, v.stream or v.pstream))
    for v in VARIANTS for dname in ("f32", "f64")
    for c in _cases(f"variant_{v.op}_{v.fh}x{v.fw}{'_stream' if v.stream else ''}"
                    f"{'_blocked' if v.blocked else ''}{'_pstream' if v.pstream else ''}"
                    f"{'_pair' if v.pair else ''}",
                    **variant_size(v, dname), fh=v.fh, fw=v.fw, dtypes=(dname,),
                    ops=(_VARIANT_OPS[v.op],))
]
WARMUP += [w for _, w in VARIANT_WARMUP]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    """A larger input for ``op``: big enough for the kernels' threads and reductions to
    split work (tests/test_determinism.py runs it on 1 and 2 threads)."""
    def make() -> dict[str, Any]:
        g = np.random.default_rng(3)
        x = g.standard_normal((4, 33, 29, 12)).astype(np.float32)
        w = g.standard_normal((3, 3, 12, 3)).astype(np.float32)
        attrs = {"strides": [1, 2, 2, 1], "padding": "SAME"}
        dy = g.standard_normal((4, 17, 15, 36)).astype(np.float32)
        if op == "DepthwiseConv2dNative":
            return {"input": x, "filter": w, **attrs}
        if op == "DepthwiseConv2dNativeBackpropInput":
            return {"input_sizes": np.array(x.shape, np.int32), "filter": w,
                    "out_backprop": dy, **attrs}
        return {"input": x, "filter_sizes": np.array(w.shape, np.int32), "out_backprop": dy,
                **attrs}
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large(name) for name, op in OPS.items() if op.family == "depthwise_conv"}
