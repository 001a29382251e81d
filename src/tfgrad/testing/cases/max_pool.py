"""Op cases for MaxPool and MaxPoolGrad (float32 / float64, NHWC).

Windows as a MobileNet / ResNet uses them (2x2 stride 2 VALID, 3x3 stride 2 SAME), plus
overlapping windows (3x3 stride 1: an input under several windows sums their gradients
in TF's order), unequal windows and strides, EXPLICIT padding, windows larger than the
input, empty outputs. Inputs are small integers (many ties: TF's first-maximum rule)
mixed with the values TF's comparisons treat specially: +-0, denormals of both signs,
+-inf, NaNs, the lowest finite value; gradients are normal values with some signed zeros
and denormals (the flushed sums).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad.errors import UnimplementedError

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
DTYPES = {"float32": np.float32, "float64": np.float64}
FWD, GRAD = "MaxPool", "MaxPoolGrad"


def specials(dtype: Any) -> np.ndarray:
    fi = np.finfo(dtype)
    den = fi.smallest_subnormal
    return np.array([0.0, -0.0, den, -den, np.inf, -np.inf, np.nan, fi.min, fi.max], dtype)


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any,
           special: float = 0.15) -> np.ndarray:
    """Small integers in [-3, 3] (ties), some halves, a share of specials."""
    x = (rng.integers(-6, 7, shape) / 2.0).astype(dtype)
    pick = rng.random(shape) < special
    sp = specials(dtype)
    x[pick] = sp[rng.integers(0, sp.size, int(pick.sum()))]
    return x


def grads(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    g = rng.standard_normal(shape).astype(dtype)
    pick = rng.random(shape) < 0.05
    g[pick] = np.array([-0.0, np.finfo(dtype).smallest_subnormal, 1e30], dtype)[
        rng.integers(0, 3, int(pick.sum()))]
    return g


def out_shape(x: tuple[int, ...], k: tuple[int, int], s: tuple[int, int], padding: str,
              pads: tuple[int, ...] = ()) -> tuple[int, ...]:
    """NHWC output shape (TF's GetWindowedOutputSize)."""
    dims = []
    for i, (n, kk, ss) in enumerate(zip(x[1:3], k, s)):
        if padding == "SAME":
            dims.append(-(-n // ss))
        else:
            p = pads[2 * i] + pads[2 * i + 1] if padding == "EXPLICIT" else 0
            dims.append(max(0, (n + p - kk + ss) // ss))
    return (x[0], *dims, x[3])


def attrs(k: tuple[int, int], s: tuple[int, int], padding: str,
          pads: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"ksize": [1, *k, 1], "strides": [1, *s, 1], "padding": padding,
            "explicit_paddings": [0, 0, *pads, 0, 0] if pads else []}


_CASES: list[Case] = []


def _add(name: str, x: tuple[int, ...], k: tuple[int, int], s: tuple[int, int],
         padding: str, pads: tuple[int, ...] = (), dtypes: tuple[str, ...] = ("float32",),
         special: float = 0.15, grad: bool = True) -> None:
    a = attrs(k, s, padding, pads)
    y = out_shape(x, k, s, padding, pads)
    for dt_name in dtypes:
        dt = DTYPES[dt_name]

        def fwd(rng: np.random.Generator, dt: Any = dt) -> dict[str, Any]:
            return dict(input=values(rng, x, dt, special), **a)

        def bwd(rng: np.random.Generator, dt: Any = dt) -> dict[str, Any]:
            # (orig_output's values are not read by TF's CPU kernel, only its shape)
            return dict(orig_input=values(rng, x, dt, special),
                        orig_output=values(rng, y, dt), grad=grads(rng, y, dt), **a)

        label = f"{dt_name}_{name}" if len(dtypes) > 1 or dt_name != "float32" else name
        tf_call = None if dt_name == "float32" else _as_tensors(FWD)
        _CASES.append(Case(FWD, label, fwd, tf_call=tf_call))
        if not grad:
            continue
        tf_call = None if dt_name == "float32" else _as_tensors(GRAD)
        _CASES.append(Case(GRAD, label, bwd, tf_call=tf_call))


def _as_tensors(op: str) -> Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]:
    """TF's eager binding may convert NumPy inputs to the type attr's default, float32
    (it does for MaxPoolGrad): float64 cases go to TF as float64 tensors."""
    def call(kw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        from ..oracle import tensorflow

        tf = tensorflow()
        return op, {k: tf.constant(v) if isinstance(v, np.ndarray) else v
                    for k, v in kw.items()}
    return call


_BOTH = ("float32", "float64")
_add("2x2s2_valid", (2, 8, 8, 5), (2, 2), (2, 2), "VALID", dtypes=_BOTH)
_add("3x3s2_same", (2, 9, 9, 3), (3, 3), (2, 2), "SAME", dtypes=_BOTH)
_add("3x3s2_same_even", (1, 8, 8, 17), (3, 3), (2, 2), "SAME")
_add("3x3s1_same_overlap", (2, 6, 7, 4), (3, 3), (1, 1), "SAME", dtypes=_BOTH)
_add("2x3s1x2_valid", (1, 7, 9, 2), (2, 3), (1, 2), "VALID")
_add("3x2s3x1_same", (3, 5, 6, 2), (3, 2), (3, 1), "SAME")
_add("1x1s2_valid", (2, 5, 5, 3), (1, 1), (2, 2), "VALID")
_add("stride_gt_window", (1, 9, 9, 2), (2, 2), (3, 3), "VALID")
_add("window_gt_input_same", (2, 3, 2, 3), (5, 4), (1, 2), "SAME")
_add("global_7x7_valid", (2, 7, 7, 20), (7, 7), (7, 7), "VALID", special=0.05)
_add("explicit", (2, 6, 5, 3), (3, 3), (2, 1), "EXPLICIT", (1, 2, 2, 0), dtypes=_BOTH)
_add("explicit_zero", (1, 4, 4, 2), (2, 2), (2, 2), "EXPLICIT", (0, 0, 0, 0))
_add("all_specials", (1, 6, 6, 9), (2, 2), (1, 1), "SAME", special=0.9)
# (MaxPoolGrad with no windows: TF returns its output buffer uninitialized, tfgrad zeros;
# tests/test_max_pool.py)
_add("empty_output", (2, 3, 3, 2), (4, 4), (1, 1), "VALID", grad=False)
_add("empty_batch", (0, 4, 4, 2), (2, 2), (2, 2), "VALID")
_add("empty_channels", (2, 4, 4, 0), (2, 2), (2, 2), "SAME")
_add("one_pixel", (1, 1, 1, 3), (1, 1), (1, 1), "VALID")


def _depth_stride(rng: np.random.Generator) -> dict[str, Any]:
    """MaxPool ignores a depth stride when the depth window is 1 (its gradient refuses)."""
    return dict(input=values(rng, (2, 5, 5, 3), F32), ksize=[1, 2, 2, 1],
                strides=[1, 1, 1, 2], padding="VALID")


_CASES.append(Case(FWD, "depth_stride_ignored", _depth_stride))
_add("wide_channels", (1, 4, 4, 67), (2, 2), (1, 1), "VALID", special=0.05)

CASES: list[Case] = _CASES


# --------------------------------------------------------------------------------------
# Errors (TF's order and words: probed on TF 2.21)
# --------------------------------------------------------------------------------------
def _x(*shape: int, dtype: Any = F32) -> np.ndarray:
    return np.zeros(shape, dtype)


def _fw(**kw: Any) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        a = dict(input=_x(2, 5, 5, 3), ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1],
                 padding="VALID")
        a.update(kw)
        return a
    return make


def _bw(**kw: Any) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        a = dict(orig_input=_x(2, 5, 5, 3), orig_output=_x(2, 2, 2, 3), grad=_x(2, 2, 2, 3),
                 ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID")
        a.update(kw)
        return a
    return make


_EXP = {"padding": "EXPLICIT"}
UIE = UnimplementedError
ERROR_CASES: list[ErrorCase] = [
    ErrorCase(FWD, "nchw", _fw(data_format="NCHW"), IAE,
              r"Default MaxPoolingOp only supports NHWC on device type CPU"),
    ErrorCase(FWD, "nchw_vect_c", _fw(data_format="NCHW_VECT_C"), IAE,
              r"Default MaxPoolingOp only supports NHWC on device type CPU"),
    ErrorCase(FWD, "ksize_5", _fw(ksize=[1, 2, 2, 1, 1]), IAE,
              r"Sliding window ksize field must specify 4 dimensions"),
    ErrorCase(FWD, "ksize_3", _fw(ksize=[1, 2, 2]), IAE,
              r"Length for attr 'ksize' of 3 must be at least minimum 4"),
    ErrorCase(FWD, "ksize_zero", _fw(ksize=[1, 0, 2, 1]), IAE,
              r"Sliding window ksize must be positive. The specified or inferred ksize is: "
              r"1,0,2,1"),
    ErrorCase(FWD, "strides_5", _fw(strides=[1, 2, 2, 1, 1]), IAE,
              r"Sliding window stride field must specify 4 dimensions"),
    ErrorCase(FWD, "batch_window", _fw(ksize=[2, 2, 2, 1]), UIE,
              r"Pooling is not yet supported on the batch dimension\."),
    ErrorCase(FWD, "batch_stride", _fw(strides=[2, 2, 2, 1]), UIE,
              r"Pooling is not yet supported on the batch dimension\."),
    ErrorCase(FWD, "stride_zero", _fw(strides=[1, 0, 2, 1]), IAE,
              r"Stride must be > 0, but got 0"),
    ErrorCase(FWD, "stride_negative", _fw(strides=[1, 2, -1, 1]), IAE,
              r"Stride must be > 0, but got -1"),
    ErrorCase(FWD, "stride_int32", _fw(strides=[1, 2**31, 2, 1]), IAE,
              r"Attr strides has value 2147483648 out of range for an int32"),
    ErrorCase(FWD, "rank3", _fw(input=_x(5, 5, 3)), IAE,
              r"tensor_in_shape must have 2 spatial dimensions. 3 0"),
    ErrorCase(FWD, "rank5", _fw(input=_x(1, 2, 5, 5, 3)), IAE,
              r"tensor_in_shape must have 2 spatial dimensions. 5 0"),
    ErrorCase(FWD, "depth_and_spatial", _fw(ksize=[1, 2, 2, 3], strides=[1, 1, 1, 3]), UIE,
              r"MaxPooling supports exactly one of pooling across depth or pooling across "
              r"width/height\."),
    ErrorCase(FWD, "depthwise", _fw(ksize=[1, 1, 1, 3], strides=[1, 1, 1, 3]), UIE,
              r"tfgrad: MaxPool over the depth dimension", tf_rejects=False,
              why="TF's CPU kernel pools over the depth (DepthwiseMaxPool); tfgrad does not"),
    ErrorCase(FWD, "negative_output", _fw(ksize=[1, 2**31 - 1, 2, 1]), IAE,
              r"Computed output size would be negative: -1073741820 \[input_size: 5, "
              r"effective_filter_size: 2147483647, stride: 2\]"),
    ErrorCase(FWD, "explicit_count", _fw(explicit_paddings=[0, 0, 1, 1, 1, 1], **_EXP), IAE,
              r"explicit_paddings attribute must contain 8 values, but got: 6"),
    ErrorCase(FWD, "explicit_negative",
              _fw(explicit_paddings=[0, 0, -1, 1, 1, 1, 0, 0], **_EXP), IAE,
              r"All elements of explicit_paddings must be nonnegative"),
    ErrorCase(FWD, "explicit_batch", _fw(explicit_paddings=[1, 0, 1, 1, 1, 1, 0, 0], **_EXP),
              IAE, r"Nonzero explicit padding in the batch or depth dimensions is not "
              r"supported"),
    ErrorCase(FWD, "explicit_top", _fw(explicit_paddings=[0, 0, 2, 1, 1, 1, 0, 0], **_EXP),
              IAE, r"Top padding 2 needs to be smaller than the window size 2"),
    ErrorCase(FWD, "explicit_bottom",
              _fw(explicit_paddings=[0, 0, 1, 2, 1, 1, 0, 0], **_EXP), IAE,
              r"Bottom padding 2 needs to be smaller than the window size 2"),
    ErrorCase(FWD, "explicit_left", _fw(explicit_paddings=[0, 0, 1, 1, 5, 5, 0, 0],
                                        strides=[1, 0, 1, 1], **_EXP), IAE,
              r"Left padding 5 needs to be smaller than the window size 2"),
    ErrorCase(FWD, "explicit_right",
              _fw(explicit_paddings=[0, 0, 1, 1, 1, 2, 0, 0], **_EXP), IAE,
              r"Right padding 2 needs to be smaller than the window size 2"),
    ErrorCase(FWD, "int32", _fw(input=np.ones((1, 2, 2, 1), np.int32)), TypeError, r"input",
              tf_rejects=False,
              why="TF pools integer and half types too; tfgrad float32 and float64 only"),
    ErrorCase(GRAD, "nchw", _bw(data_format="NCHW"), IAE,
              r"Default MaxPoolingGradOp only supports NHWC on device type CPU"),
    ErrorCase(GRAD, "ksize_5", _bw(ksize=[1, 2, 2, 1, 1]), IAE,
              r"Sliding window ksize field must specify 4 dimensions"),
    ErrorCase(GRAD, "strides_5", _bw(strides=[1, 2, 2, 1, 1]), IAE,
              r"Sliding window strides field must specify 4 dimensions"),
    ErrorCase(GRAD, "batch_window", _bw(ksize=[2, 2, 2, 1]), UIE,
              r"Pooling is not yet supported on the batch dimension\."),
    ErrorCase(GRAD, "depth_window", _bw(ksize=[1, 1, 1, 3], strides=[1, 1, 1, 3]), UIE,
              r"MaxPoolingGrad is not yet supported on the depth dimension\."),
    ErrorCase(GRAD, "depth_stride", _bw(strides=[1, 2, 2, 2]), UIE,
              r"MaxPoolingGrad is not yet supported on the depth dimension\."),
    ErrorCase(GRAD, "stride_zero", _bw(strides=[1, 0, 2, 1]), IAE,
              r"Stride must be > 0, but got 0"),
    ErrorCase(GRAD, "tensor_in_rank", _bw(orig_input=_x(5, 5, 3)), IAE,
              r"tensor_in must be 4-dimensional"),
    ErrorCase(GRAD, "tensor_out_rank", _bw(orig_output=_x(2, 2, 3)), IAE,
              r"tensor_out must be 4-dimensional"),
    ErrorCase(GRAD, "out_backprop_rank", _bw(grad=_x(2, 2, 3)), IAE,
              r"out_backprop must be 4-dimensional"),
    ErrorCase(GRAD, "orig_output_shape", _bw(orig_output=_x(2, 3, 3, 3)), IAE,
              r"Expected orig_output shape to be \[2,2,2,3\], but got \[2,3,3,3\]"),
    ErrorCase(GRAD, "grad_shape", _bw(grad=_x(2, 2, 2, 1)), IAE,
              r"Expected grad shape to be \[2,2,2,3\], but got \[2,2,2,1\]"),
    ErrorCase(GRAD, "ksize_zero", _bw(ksize=[1, 0, 2, 1], orig_output=_x(2, 3, 2, 3),
                                      grad=_x(2, 3, 2, 3)), IAE,
              r"Sliding window ksize must be positive", tf_rejects=False,
              why="TF's MaxPoolingGradOp does not check ksize > 0: its empty windows' "
              "argmax (-1) is written through unchecked (out of bounds)"),
    ErrorCase(GRAD, "negative_output", _bw(ksize=[1, 1, 7, 1], strides=[1, 1, 1, 1]), IAE,
              r"Computed output size would be negative: -1 \[input_size: 5, "
              r"effective_filter_size: 7, stride: 1\]"),
    ErrorCase(GRAD, "explicit_count", _bw(explicit_paddings=[0, 0, 1, 1, 1, 1], **_EXP), IAE,
              r"explicit_paddings attribute must contain 8 values, but got: 6"),
    ErrorCase(GRAD, "explicit_left", _bw(explicit_paddings=[0, 0, 1, 1, 3, 1, 0, 0], **_EXP),
              IAE, r"Left padding 3 needs to be smaller than the window size 2"),
    ErrorCase(GRAD, "explicit_bottom",
              _bw(explicit_paddings=[0, 0, 1, 2, 1, 1, 0, 0], **_EXP), IAE,
              r"Bottom padding 2 needs to be smaller than the window size 2"),
]


# --------------------------------------------------------------------------------------
# Benchmarks: MobileNet / ResNet pooling shapes
# --------------------------------------------------------------------------------------
_BENCH = (
    ("[8,56,56,32] 2x2/2 VALID", (8, 56, 56, 32), (2, 2), (2, 2), "VALID"),
    ("[8,56,56,32] 3x3/2 SAME", (8, 56, 56, 32), (3, 3), (2, 2), "SAME"),
    ("[32,7,7,1280] 7x7 VALID", (32, 7, 7, 1280), (7, 7), (7, 7), "VALID"),
)
_SMOKE = (2, 8, 8, 16)


def _bench(op: str, shape: tuple[int, ...], k: tuple[int, int], s: tuple[int, int],
           padding: str) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        x_shape = _SMOKE if smoke else shape
        kk = (min(k[0], x_shape[1]), min(k[1], x_shape[2]))
        a = attrs(kk, s, padding)
        x = rng.standard_normal(x_shape).astype(F32)
        if op == FWD:
            return dict(input=x, **a)
        y = out_shape(x_shape, kk, s, padding)
        return dict(orig_input=x, orig_output=np.zeros(y, F32),
                    grad=rng.standard_normal(y).astype(F32), **a)
    return make


def _bytes(kw: dict[str, Any]) -> int:
    if "input" in kw:
        x = kw["input"]
        y = out_shape(x.shape, tuple(kw["ksize"][1:3]), tuple(kw["strides"][1:3]),
                      kw["padding"])
        return x.nbytes + int(np.prod(y)) * x.itemsize
    return array_bytes(kw["orig_input"], kw["grad"]) + kw["orig_input"].nbytes


def _torch(op: str) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    """torch's max_pool2d (NCHW; channels-last memory) and its backward."""
    def build(kw: dict[str, Any]) -> Callable[[], Any]:
        torch = torch_module()
        F = torch.nn.functional
        xk = kw["input"] if op == FWD else kw["orig_input"]
        x = torch.from_numpy(xk).permute(0, 3, 1, 2)
        k, s = tuple(kw["ksize"][1:3]), tuple(kw["strides"][1:3])
        pad = (k[0] // 2, k[1] // 2) if kw["padding"] == "SAME" else (0, 0)
        if op == FWD:
            return lambda: F.max_pool2d(x, k, s, pad)
        y, idx = F.max_pool2d(x, k, s, pad, return_indices=True)
        g = torch.from_numpy(kw["grad"]).permute(0, 3, 1, 2)
        if g.shape != y.shape:  # (torch's symmetric padding: a different output size)
            return lambda: F.max_pool2d(x, k, s, pad)
        return lambda: torch.ops.aten.max_pool2d_with_indices_backward(
            g, x, list(k), list(s), list(pad), [1, 1], False, idx)
    return build


BENCHES = [Bench(op, name, _bench(op, shape, k, s, p), _bytes, torch=_torch(op))
           for name, shape, k, s, p in _BENCH for op in (FWD, GRAD)]


# --------------------------------------------------------------------------------------
# Warmup and large inputs
# --------------------------------------------------------------------------------------
def _warm(op: str, dt: Any, shape: tuple[int, ...]) -> Callable[[np.random.Generator],
                                                                   dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        a = attrs((3, 3), (2, 2), "SAME")
        if op == FWD:
            return dict(input=values(rng, shape, dt), **a)
        y = out_shape(shape, (3, 3), (2, 2), "SAME")
        return dict(orig_input=values(rng, shape, dt), orig_output=np.zeros(y, dt),
                    grad=grads(rng, y, dt), **a)
    return make


WARMUP: list[Warmup] = [
    Warmup(op, f"{name} {list(shape)}", _warm(op, dt, shape), large=shape[0] > 1)
    for op in (FWD, GRAD) for name, dt in DTYPES.items()
    for shape in ((1, 4, 4, 2), (4, 40, 40, 16))
]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    """Big enough for the threaded kernels (tests/test_determinism.py: 1 and 2 threads)."""
    def make() -> dict[str, Any]:
        rng = np.random.default_rng(1)
        shape = (6, 30, 30, 24)
        a = attrs((3, 3), (1, 1), "SAME")
        if op == FWD:
            return dict(input=values(rng, shape, F32), **a)
        return dict(orig_input=values(rng, shape, F32), orig_output=np.zeros(shape, F32),
                    grad=grads(rng, shape, F32), **a)
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {op: _large(op) for op in (FWD, GRAD)}
