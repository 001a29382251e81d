"""Op cases for Conv2D, Conv2DBackpropInput and Conv2DBackpropFilter (float32, NHWC).

Shapes cover TF's paths: the 1x1 stride-1 MatMul (MobileNetV2's expand / project), the
filter == input VALID MatMul, Eigen's SpatialConvolution (MobileNetV2's 3x3 stride-2 stem
with C = 3, strides, unequal strides, SAME / VALID / EXPLICIT, dilations), contractions
deep enough for several k-blocks (3x3 with C = 256 and 384, 1x1 with C = 1280), and the
backprop-input paths (batch 1: Eigen's contraction; several images: oneDNN's sgemm per
image, its nocopy kernel, gemm_smalln_tn when 1 < OH*OW < 16, gemv_t for one pixel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad._opdefs import OPS
from tfgrad._tf.depthwise import window
from tfgrad.errors import UnimplementedError

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
FWD, BI, BF = "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"


def _attrs(s: tuple[int, int], padding: str, pads: tuple[int, ...] | None,
           d: int) -> dict[str, Any]:
    return {"strides": [1, s[0], s[1], 1], "padding": padding,
            "explicit_paddings": [0, 0, *pads, 0, 0] if pads else [],
            "dilations": [1, d, d, 1]}


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal values, a few exact zeros of both signs (the zero signs of the sums)."""
    x = rng.standard_normal(shape).astype(F32)
    flat = x.reshape(-1)
    if flat.size >= 8:
        idx = rng.choice(flat.size, max(2, flat.size // 50), replace=False)
        flat[idx[::2]] = 0.0
        flat[idx[1::2]] = -0.0
    return x


def _specials(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """inf, -inf, NaN and denormals at random places (TF's DAZ / FTZ, 0 * inf = NaN on
    the padding taps)."""
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, 5, replace=False)
    flat[idx] = np.array([np.inf, -np.inf, np.nan, 1e-40, -1e-39], F32)
    return x


def _cases(name: str, N: int, H: int, W: int, C: int, O: int, KH: int, KW: int,
           s: tuple[int, int] = (1, 1), padding: str = "SAME",
           pads: tuple[int, int, int, int] | None = None, d: int = 1,
           ops: tuple[str, ...] = (FWD, BI, BF), sizes2: bool = False,
           special: str = "") -> list[Case]:
    oh, _ = window("", H, KH, s[0], d, padding, pads[:2] if pads else (0, 0))
    ow, _ = window("", W, KW, s[1], d, padding, pads[2:] if pads else (0, 0))
    attrs = _attrs(s, padding, pads, d)
    out = []
    for op in ops:
        def make(rng: np.random.Generator, op: str = op) -> dict[str, Any]:
            x = _values(rng, (N, H, W, C))
            w = _values(rng, (KH, KW, C, O))
            g = _values(rng, (N, oh, ow, O))
            for arr, which in ((x, "x"), (w, "w"), (g, "g")):
                if which in special:
                    _specials(arr, rng)
            if op == FWD:
                return {"input": x, "filter": w, **attrs}
            if op == BI:
                sizes = [H, W] if sizes2 else [N, H, W, C]
                return {"input_sizes": np.array(sizes, np.int32), "filter": w,
                        "out_backprop": g, **attrs}
            return {"input": x, "filter_sizes": np.array([KH, KW, C, O], np.int32),
                    "out_backprop": g, **attrs}

        out.append(Case(op, name, make))
    return out


CASES: list[Case] = [
    *_cases("same_3x3", 2, 7, 6, 3, 4, 3, 3),
    *_cases("stem_3x3_s2_c3", 2, 16, 16, 3, 16, 3, 3, s=(2, 2)),  # MobileNetV2's first conv
    *_cases("valid_3x3_s2", 3, 9, 9, 5, 6, 3, 3, s=(2, 2), padding="VALID"),
    *_cases("expand_1x1", 2, 4, 4, 16, 96, 1, 1),                 # MobileNetV2's 1x1 convs
    *_cases("project_1x1", 2, 4, 4, 96, 24, 1, 1, padding="VALID"),
    *_cases("1x1_s2", 2, 7, 7, 8, 12, 1, 1, s=(2, 2)),
    *_cases("1x1_explicit_after", 2, 5, 4, 3, 4, 1, 1, padding="EXPLICIT", pads=(0, 2, 0, 1)),
    *_cases("unequal_strides_3x2", 2, 7, 7, 4, 5, 3, 2, s=(1, 2), padding="VALID"),
    *_cases("explicit", 2, 6, 6, 16, 8, 3, 3, padding="EXPLICIT", pads=(1, 2, 2, 0)),
    *_cases("filter_eq_input", 3, 5, 5, 16, 8, 5, 5, padding="VALID"),
    *_cases("sizes_hw", 2, 6, 5, 3, 4, 3, 3, ops=(BI,), sizes2=True),
    *_cases("dilated_2", 2, 9, 9, 3, 4, 3, 3, d=2, ops=(FWD,)),
    *_cases("dilated_2_s2", 2, 11, 10, 3, 4, 3, 2, s=(2, 2), d=2, padding="VALID", ops=(FWD,)),
    # contractions of several k-blocks (the plan TF's cost model chooses); BackpropInput
    # contracts over O: deep when O is
    *_cases("deep_3x3_c256", 1, 3, 3, 256, 2, 3, 3, ops=(FWD, BF)),
    *_cases("deep_3x3_c384", 1, 3, 3, 384, 2, 3, 3, ops=(FWD, BF)),
    *_cases("deep_1x1_c1280", 1, 2, 2, 1280, 4, 1, 1, ops=(FWD, BF)),
    *_cases("deep_out_400_smalln", 2, 3, 3, 2, 400, 3, 3, ops=(BI,)),
    *_cases("deep_out_400_n1", 1, 3, 3, 2, 400, 3, 3, ops=(BI,)),
    *_cases("deep_out_800_nocopy", 2, 4, 4, 2, 800, 1, 1, ops=(BI,)),
    # one output channel (oneDNN's gemv_t), one input channel, one output pixel per image
    # (Eigen's own GEMV)
    *_cases("out_channels_1", 2, 5, 5, 3, 1, 3, 3),
    *_cases("out_channels_1_deep", 1, 4, 4, 64, 1, 3, 3, ops=(FWD, BF)),
    *_cases("in_channels_1_1x1", 2, 4, 4, 1, 5, 1, 1),
    *_cases("one_pixel_batch1", 1, 4, 4, 3, 5, 4, 4, padding="VALID"),
    # several images, 1 < OH*OW < 16: oneDNN's gemm_smalln_tn; one pixel: its gemv_t
    *_cases("smalln_3x3_s2", 3, 7, 7, 8, 16, 3, 3, s=(2, 2), padding="VALID"),
    *_cases("one_pixel_n1", 1, 3, 3, 4, 6, 3, 3, padding="VALID", ops=(BI,)),
    *_cases("empty_batch", 0, 5, 5, 2, 4, 3, 3),
    # inf / NaN / denormals in each input (a filter's inf meets the padding's zeros)
    *_cases("specials_x", 2, 6, 6, 4, 5, 3, 3, special="x"),
    *_cases("specials_w", 2, 6, 6, 4, 5, 3, 3, special="w"),
    *_cases("specials_g", 2, 6, 6, 4, 5, 3, 3, special="g", ops=(BI, BF)),
]


def processor_dependent(case: Case, kwargs: dict[str, Any]) -> set[str]:
    """Every output: each op sums through TF's contraction, whose order follows TF's
    intra-op thread count, the L1 size Eigen reads and oneDNN's kernel (docs/conv2d.md)."""
    return {o.name for o in OPS[case.op].outputs}


# --------------------------------------------------------------------------------------
# Errors (checked against TF live)
# --------------------------------------------------------------------------------------
def _z(*shape: int) -> np.ndarray:
    return np.zeros(shape, F32)


def _err(op: str, name: str, match: str, error: type[Exception] = IAE, tf_rejects: bool = True,
         why: str = "", **over: Any) -> ErrorCase:
    def kwargs() -> dict[str, Any]:
        base: dict[str, Any] = {"strides": [1, 1, 1, 1], "padding": "SAME"}
        if op == FWD:
            base.update(input=_z(1, 5, 5, 2), filter=_z(3, 3, 2, 4))
        elif op == BI:
            base.update(input_sizes=np.array([1, 5, 5, 2], np.int32), filter=_z(3, 3, 2, 4),
                        out_backprop=_z(1, 5, 5, 4))
        else:
            base.update(input=_z(1, 5, 5, 2), filter_sizes=np.array([3, 3, 2, 4], np.int32),
                        out_backprop=_z(1, 5, 5, 4))
        base.update({k: (v() if callable(v) else v) for k, v in over.items()})
        return base

    return ErrorCase(op, name, kwargs, error, match, tf_rejects, why)


def _all(name: str, match: str, error: type[Exception] = IAE, **over: Any) -> list[ErrorCase]:
    return [_err(op, name, match, error, **over) for op in (FWD, BI, BF)]


_UNIMP = UnimplementedError
ERROR_CASES: list[ErrorCase] = [
    *_all("strides_3", "Sliding window strides field must specify 4 dimensions",
          strides=[1, 1, 1]),
    _err(FWD, "strides_batch", "does not yet support strides in the batch and depth", _UNIMP,
         strides=[2, 1, 1, 1]),
    _err(BI, "strides_batch", "does not yet support strides in the batch and depth", _UNIMP,
         strides=[2, 1, 1, 1]),
    _err(BF, "strides_depth", "does not yet support strides in the batch and depth",
         strides=[1, 1, 1, 2]),
    *_all("strides_0", r"Row and column strides should be larger than 0\.",
          strides=[1, 0, 0, 1]),
    *_all("dilations_3", "Sliding window dilations field must specify 4 dimensions",
          dilations=[1, 1, 1]),
    _err(FWD, "dilations_batch", "does not yet support dilations in the batch", _UNIMP,
         dilations=[2, 1, 1, 1]),
    _err(FWD, "dilations_0", r"Dilated rates should be larger than 0\.",
         dilations=[1, 0, 0, 1]),
    _err(BI, "dilations_2", "Current CPU implementations do not yet support dilation rates "
         "larger than 1", dilations=[1, 2, 2, 1]),
    _err(BF, "dilations_2", "Current CPU implementations do not yet support dilation rates "
         "larger than 1", dilations=[1, 2, 1, 1]),
    _err(FWD, "nchw", "The Conv2D op currently only supports the NHWC tensor format on the "
         "CPU", _UNIMP, data_format="NCHW", input=_z(1, 2, 5, 5)),
    _err(BI, "nchw", r"Conv2DCustomBackpropInputOp only supports NHWC\.",
         data_format="NCHW"),
    _err(BF, "nchw", r"Conv2DCustomBackpropFilterOp only supports NHWC\.",
         data_format="NCHW"),
    *_all("explicit_4", "explicit_paddings attribute must contain 8 values, but got: 4",
          padding="EXPLICIT", explicit_paddings=[0, 0, 1, 1]),
    *_all("explicit_negative", "All elements of explicit_paddings must be nonnegative",
          padding="EXPLICIT", explicit_paddings=[0, 0, -1, 1, 1, 1, 0, 0]),
    *_all("explicit_batch", "Nonzero explicit padding in the batch or depth dimensions",
          padding="EXPLICIT", explicit_paddings=[1, 0, 1, 1, 1, 1, 0, 0]),
    *_all("explicit_not_empty", "explicit_paddings attribute must be empty if the padding "
          "attribute is not EXPLICIT", padding="VALID",
          explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0]),
    _err(FWD, "input_rank", r"convolution input must be 4-dimensional: \[5,5,2\]",
         input=_z(5, 5, 2)),
    _err(FWD, "filter_rank", r"convolution filter must be 4-dimensional: \[3,3,2\]",
         filter=_z(3, 3, 2)),
    _err(FWD, "depth", "input depth must be evenly divisible by filter depth: 2 vs 3",
         filter=_z(3, 3, 3, 4)),
    _err(FWD, "negative_output", "Computed output size would be negative: -1 "
         r"\[input_size: 5, effective_filter_size: 7, stride: 1\]",
         padding="VALID", filter=_z(7, 7, 2, 4)),
    _err(FWD, "explicit_too_large", "filter too large", padding="EXPLICIT",
         strides=[1, 2**30, 2**30, 1], explicit_paddings=[0, 0, 2**31, 2**31, 0, 0, 0, 0]),
    *_all("strides_int64", "Attr strides has value 1099511627776 out of range for an int32",
          strides=[1, 2**40, 2**40, 1]),
    *_all("dilations_int64", "Attr dilations has value 4294967296 out of range for an int32",
          dilations=[1, 2**32, 1, 1]),
    _err(FWD, "filter_empty", "filter must not have zero elements", filter=_z(0, 3, 2, 4)),
    _err(FWD, "filter_depth_0", "filter depth must be stricly positive, got 0",
         input=_z(1, 5, 5, 0), filter=_z(3, 3, 0, 4)),
    _err(FWD, "grouped", "grouped convolutions", _UNIMP, input=_z(1, 5, 5, 4),
         tf_rejects=False, why="TF's CPU kernel runs grouped convolutions (one per group); "
         "tfgrad implements groups = 1 only"),
    _err(BI, "sizes_3", "Conv2DBackpropInput requires input_sizes to contain 4 values or 2 "
         "values, but got: 3", input_sizes=np.array([1, 5, 5], np.int32)),
    _err(BI, "out_backprop_rank", "input_sizes must be 4-dimensional, got: 3",
         out_backprop=_z(5, 5, 4)),
    _err(BI, "filter_rank", "Conv2DCustomBackpropInput: filter must be 4-dimensional",
         filter=_z(3, 3, 2)),
    _err(BI, "batch", "Conv2DCustomBackpropInput: input and out_backprop must have the same "
         "batch size. Input batch: 1, outbackprop batch: 2", out_backprop=_z(2, 5, 5, 4)),
    _err(BI, "depth", "Conv2DCustomBackpropInput: input depth must be evenly divisible by "
         "filter depth", filter=_z(3, 3, 3, 4)),
    _err(BI, "out_depth", "Conv2DCustomBackpropInput: filter and out_backprop must have the "
         "same out_depth", out_backprop=_z(1, 5, 5, 3)),
    _err(BI, "rows", "Conv2DCustomBackpropInput: Size of out_backprop doesn't match "
         "computed: actual = 4, computed = 5 spatial_dim: 1 input: 5 filter: 3 output: 4 "
         "stride: 1 dilation: 1", out_backprop=_z(1, 4, 5, 4)),
    _err(BI, "negative_size", "Dimension -5 must be >= 0",
         input_sizes=np.array([1, -5, 5, 2], np.int32)),
    _err(BI, "grouped", "Gradients for grouped convolutions are not supported on CPU",
         input_sizes=np.array([1, 5, 5, 4], np.int32)),
    _err(BF, "input_rank", "Conv2DCustomBackpropFilter: input must be 4-dimensional",
         input=_z(5, 5, 2)),
    _err(BF, "sizes_3", "Conv2DCustomBackpropFilter: filter must be 4-dimensional",
         filter_sizes=np.array([3, 3, 2], np.int32)),
    _err(BF, "batch", "Conv2DCustomBackpropFilter: input and out_backprop must have the "
         "same batch size", out_backprop=_z(2, 5, 5, 4)),
    _err(BF, "out_depth", "Conv2DCustomBackpropFilter: filter and out_backprop must have "
         "the same out_depth", out_backprop=_z(1, 5, 5, 3)),
    _err(BF, "cols", "Conv2DCustomBackpropFilter: Size of out_backprop doesn't match "
         "computed: actual = 4, computed = 5 spatial_dim: 2", out_backprop=_z(1, 5, 4, 4)),
    _err(BF, "grouped", "filter_size does not have enough elements, requested 144, got 72",
         input=_z(1, 5, 5, 4)),
    _err(BF, "negative_size", "Dimension -3 must be >= 0",
         filter_sizes=np.array([3, -3, 2, 4], np.int32)),
    _err(FWD, "float64", "float", TypeError, tf_rejects=False,
         input=_z(1, 5, 5, 2).astype(np.float64), filter=_z(3, 3, 2, 4).astype(np.float64),
         why="TF has float64 / half / int32 Conv2D kernels; tfgrad implements float32"),
]


# --------------------------------------------------------------------------------------
# Benchmarks: MobileNetV2's convolutions at batch 32 (224x224 input)
# --------------------------------------------------------------------------------------
_BENCH = {  # name: (N, H, W, C, O, K, stride)
    "stem [32,224,224,3] 3x3/2 -> 32": (32, 224, 224, 3, 32, 3, 2),
    "expand [32,56,56,24] 1x1 -> 144": (32, 56, 56, 24, 144, 1, 1),
    "project [32,14,14,384] 1x1 -> 64": (32, 14, 14, 384, 64, 1, 1),
}
_SMOKE = (2, 16, 16)


def _bench_make(op: str, dims: tuple[int, ...]) -> Callable[[np.random.Generator, bool],
                                                            dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        N, H, W, C, O, K, s = dims
        if smoke:
            N, H, W = _SMOKE
        oh, ow = -(-H // s), -(-W // s)
        attrs = _attrs((s, s), "SAME", None, 1)
        x = rng.standard_normal((N, H, W, C)).astype(F32)
        w = rng.standard_normal((K, K, C, O)).astype(F32)
        g = rng.standard_normal((N, oh, ow, O)).astype(F32)
        if op == FWD:
            return {"input": x, "filter": w, **attrs}
        if op == BI:
            return {"input_sizes": np.array(x.shape, np.int32), "filter": w,
                    "out_backprop": g, **attrs}
        return {"input": x, "filter_sizes": np.array(w.shape, np.int32), "out_backprop": g,
                **attrs}
    return make


def _bench_torch(op: str) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def build(kw: dict[str, Any]) -> Callable[[], Any]:
        torch = torch_module()
        s = kw["strides"][1]
        if op == FWD:
            x = torch.from_numpy(kw["input"]).permute(0, 3, 1, 2)
            w = torch.from_numpy(kw["filter"]).permute(3, 2, 0, 1)
            p = w.shape[-1] // 2
            return lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=p)
        g = torch.from_numpy(kw["out_backprop"]).permute(0, 3, 1, 2)
        if op == BI:
            w = torch.from_numpy(kw["filter"]).permute(3, 2, 0, 1)
            shape = [int(v) for v in kw["input_sizes"]]
            size = (shape[0], shape[3], shape[1], shape[2])
            return lambda: torch.nn.grad.conv2d_input(size, w, g, stride=s,
                                                      padding=w.shape[-1] // 2)
        x = torch.from_numpy(kw["input"]).permute(0, 3, 1, 2)
        fs = [int(v) for v in kw["filter_sizes"]]
        return lambda: torch.nn.grad.conv2d_weight(x, (fs[3], fs[2], fs[0], fs[1]), g,
                                                   stride=s, padding=fs[0] // 2)
    return build


def _nbytes(kw: dict[str, Any]) -> int:
    return array_bytes(*(v for v in kw.values() if isinstance(v, np.ndarray))) * 2


BENCHES = [Bench(op, f"{name}", _bench_make(op, dims), _nbytes, torch=_bench_torch(op))
           for name, dims in _BENCH.items() for op in (FWD, BI, BF)]

WARMUP: list[Warmup] = []


def _large(op: str) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        return _bench_make(op, (4, 32, 32, 16, 32, 3, 2))(np.random.default_rng(1), False)
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large(name) for name, op in OPS.items() if op.family == "conv2d"}
