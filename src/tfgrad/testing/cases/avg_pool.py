"""Op cases for AvgPool and AvgPoolGrad (NHWC; float32 first, float64, half, bfloat16).

Windows as a MobileNet / ResNet uses them (2x2 stride 2 VALID, 3x3 stride 2 SAME, the
global 7x7 VALID), overlapping windows (an input cell under several windows gets their
gradients in TF's order), unequal windows and strides, strides wider than the window
(cells no window holds), windows larger than the input (SAME: counts that differ per
output; VALID: empty outputs), empty inputs. Values span many magnitudes (sums that
round) with a share of the values TF's arithmetic treats specially: +-0, denormals of
both signs (DAZ / FTZ), +-inf, NaN, the largest finite values (overflow).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad.errors import InvalidDtypeError as IDE
from tfgrad.errors import UnimplementedError as UIE

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
DTYPES: dict[str, Any] = {"float32": np.float32, "float64": np.float64,
                          "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
FWD, GRAD = "AvgPool", "AvgPoolGrad"


def _finfo(dtype: Any) -> Any:
    return ml_dtypes.finfo(dtype)


def specials(dtype: Any) -> np.ndarray:
    fi = _finfo(dtype)
    den = float(fi.smallest_subnormal)
    return np.array([0.0, -0.0, den, -den, np.inf, -np.inf, np.nan, float(fi.max),
                     -float(fi.max)]).astype(dtype)


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any,
           special: float = 0.1) -> np.ndarray:
    """Normal values of magnitudes e^-4 .. e^4 (sums that round), a share of specials."""
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-4, 4, shape))
    x = x.astype(dtype)
    pick = rng.random(shape) < special
    sp = specials(dtype)
    x[pick] = sp[rng.integers(0, sp.size, int(pick.sum()))]
    return x


def out_shape(x: tuple[int, ...], k: tuple[int, int], s: tuple[int, int],
              padding: str) -> tuple[int, ...]:
    """NHWC output shape (TF's GetWindowedOutputSize)."""
    dims = [-(-n // ss) if padding == "SAME" else max(0, (n - kk + ss) // ss)
            for n, kk, ss in zip(x[1:3], k, s)]
    return (x[0], dims[0], dims[1], x[3])


def _attrs(k: tuple[int, int], s: tuple[int, int], padding: str) -> dict[str, Any]:
    return dict(ksize=[1, k[0], k[1], 1], strides=[1, s[0], s[1], 1], padding=padding)


def _fwd(x: tuple[int, ...], k: tuple[int, int], s: tuple[int, int], padding: str,
         dtype: Any, special: float) -> Callable[[np.random.Generator], dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        return dict(value=values(rng, x, dtype, special), **_attrs(k, s, padding))
    return make


def _grad(x: tuple[int, ...], k: tuple[int, int], s: tuple[int, int], padding: str,
          dtype: Any, special: float) -> Callable[[np.random.Generator], dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        g = values(rng, out_shape(x, k, s, padding), dtype, special)
        return dict(orig_input_shape=np.array(x, np.int32), grad=g, **_attrs(k, s, padding))
    return make


# (input shape, window, strides, padding, name)
_GEOMETRIES = [
    ((2, 8, 8, 5), (2, 2), (2, 2), "VALID", "2x2s2_valid"),
    ((2, 7, 7, 5), (3, 3), (2, 2), "SAME", "3x3s2_same_odd"),
    ((2, 8, 8, 3), (3, 3), (2, 2), "SAME", "3x3s2_same_even"),
    ((1, 5, 6, 17), (3, 3), (1, 1), "SAME", "3x3s1_same_overlap"),
    ((2, 7, 7, 9), (7, 7), (1, 1), "VALID", "global_7x7"),
    ((3, 6, 11, 3), (3, 2), (1, 3), "SAME", "unequal"),
    ((2, 9, 9, 4), (5, 4), (2, 1), "SAME", "5x4s2x1_same"),
    ((2, 7, 8, 3), (2, 2), (3, 4), "SAME", "stride_over_window"),
    ((1, 4, 3, 2), (6, 5), (1, 1), "SAME", "window_over_input"),
    ((2, 5, 5, 3), (1, 1), (1, 1), "VALID", "1x1"),
    ((1, 6, 6, 2), (4, 4), (3, 3), "VALID", "valid_uncovered"),
    ((1, 20, 20, 2), (17, 17), (1, 1), "SAME", "17x17_counts"),  # bfloat16: count 256
]

_CASES: list[Case] = []
for _dt_name, _dt in DTYPES.items():
    for _x, _k, _s, _p, _name in _GEOMETRIES:
        if _dt_name in ("float16", "bfloat16") and _name in ("unequal", "5x4s2x1_same"):
            continue
        for _op, _mk in ((FWD, _fwd), (GRAD, _grad)):
            _CASES.append(Case(_op, f"{_dt_name}_{_name}", _mk(_x, _k, _s, _p, _dt, 0.1)))
    for _op, _mk in ((FWD, _fwd), (GRAD, _grad)):
        _CASES.append(Case(_op, f"{_dt_name}_specials", _mk((2, 6, 7, 4), (3, 3), (2, 2),
                                                            "SAME", _dt, 0.5)))
for _op, _mk in ((FWD, _fwd), (GRAD, _grad)):
    # empty outputs: no images, no channels, a VALID window taller than the input
    _CASES.append(Case(_op, "empty_batch", _mk((0, 4, 4, 2), (2, 2), (2, 2), "SAME", F32, 0)))
    _CASES.append(Case(_op, "empty_channels", _mk((1, 4, 4, 0), (2, 2), (1, 1), "SAME", F32,
                                                  0)))
    _CASES.append(Case(_op, "valid_window_taller", _mk((1, 4, 4, 2), (5, 2), (1, 2), "VALID",
                                                       F32, 0)))
    # large enough for the threaded kernels
    _CASES.append(Case(_op, "threaded", _mk((2, 20, 20, 32), (3, 3), (2, 2), "SAME", F32,
                                            0.02)))


def _near_tiny(dtype: Any) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Values of one or two times the smallest normal, either sign: window sums that
    cancel below it are flushed to a zero of their sign (FTZ), -0 kept through the
    windows' padding as in TF."""
    def make(rng: np.random.Generator) -> dict[str, Any]:
        x = (rng.uniform(-2, 2, (2, 5, 6, 3)) * float(_finfo(dtype).tiny)).astype(dtype)
        return dict(value=x, **_attrs((3, 3), (1, 1), "SAME"))
    return make


for _dt_name in ("float32", "float64", "bfloat16"):  # (float16's denormals are not flushed)
    _CASES.append(Case(FWD, f"{_dt_name}_flushed_sums", _near_tiny(DTYPES[_dt_name])))

CASES: list[Case] = _CASES


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
def _x(*shape: int) -> np.ndarray:
    return np.zeros(shape, F32)


def _fw(**kw: Any) -> Callable[[], dict[str, Any]]:
    base = dict(value=_x(1, 4, 4, 2), ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1],
                padding="VALID")
    return lambda: {**base, **kw}


def _gr(**kw: Any) -> Callable[[], dict[str, Any]]:
    base = dict(orig_input_shape=np.array([1, 4, 4, 2], np.int32), grad=_x(1, 2, 2, 2),
                ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID")
    return lambda: {**base, **kw}


def _shape(*v: int) -> np.ndarray:
    return np.array(v, np.int32)


_TF_NO_CHECK = ("TF 2.21's AvgPoolGrad does not check it and computes from out-of-range "
                "indices (reads and writes outside its buffers); tfgrad refuses it")
ERROR_CASES: list[ErrorCase] = [
    ErrorCase(FWD, "nchw", _fw(data_format="NCHW"), IAE,
              r"Default AvgPoolingOp only supports NHWC on device type CPU"),
    ErrorCase(FWD, "ksize_5", _fw(ksize=[1, 2, 2, 1, 1]), IAE,
              r"Sliding window ksize field must specify 4 dimensions"),
    ErrorCase(FWD, "ksize_3", _fw(ksize=[1, 2, 2]), IAE,
              r"Length for attr 'ksize' of 3 must be at least minimum 4"),
    ErrorCase(FWD, "strides_5", _fw(strides=[1, 2, 2, 1, 1]), IAE,
              r"Sliding window stride field must specify 4 dimensions"),
    ErrorCase(FWD, "batch_window", _fw(ksize=[2, 2, 2, 1]), UIE,
              r"Pooling is not yet supported on the batch dimension\."),
    ErrorCase(FWD, "batch_stride", _fw(strides=[2, 2, 2, 1]), UIE,
              r"Pooling is not yet supported on the batch dimension\."),
    ErrorCase(FWD, "batch_before_ksize", _fw(ksize=[2, 0, 2, 1]), UIE,
              r"Pooling is not yet supported on the batch dimension\."),
    ErrorCase(FWD, "ksize_zero", _fw(ksize=[1, 0, 2, 1]), IAE,
              r"ksize must be a positive int32 value, got:0"),
    ErrorCase(FWD, "ksize_negative", _fw(ksize=[1, 2, -1, 1]), IAE,
              r"ksize must be a positive int32 value, got:-1"),
    ErrorCase(FWD, "ksize_int32", _fw(ksize=[1, 2**31, 2, 1, 1]), IAE,
              r"Attr ksize has value 2147483648 out of range for an int32"),
    ErrorCase(FWD, "stride_int32", _fw(strides=[1, 2**31, 2, 1]), IAE,
              r"Attr strides has value 2147483648 out of range for an int32"),
    ErrorCase(FWD, "stride_zero", _fw(strides=[1, 0, 2, 1]), IAE,
              r"Stride must be > 0, but got 0"),
    ErrorCase(FWD, "stride_negative", _fw(strides=[1, 2, -1, 1]), IAE,
              r"Stride must be > 0, but got -1"),
    ErrorCase(FWD, "rows_before_cols", _fw(ksize=[1, 6, 2, 1], strides=[1, 1, 0, 1]), IAE,
              r"Computed output size would be negative: -1 \[input_size: 4, "
              r"effective_filter_size: 6, stride: 1\]"),
    ErrorCase(FWD, "rank3", _fw(value=_x(4, 4, 2)), IAE,
              r"tensor_in_shape must have 2 spatial dimensions. 3 0"),
    ErrorCase(FWD, "rank5", _fw(value=_x(1, 4, 4, 2, 1)), IAE,
              r"tensor_in_shape must have 2 spatial dimensions. 5 0"),
    ErrorCase(FWD, "depth_and_spatial", _fw(ksize=[1, 2, 2, 2], strides=[1, 0, 2, 1]), UIE,
              r"MaxPooling supports exactly one of pooling across depth or pooling across "
              r"width/height\."),
    ErrorCase(FWD, "depth_not_dividing", _fw(value=_x(1, 4, 4, 3), ksize=[1, 1, 1, 2],
                                             strides=[1, 1, 1, 2]), UIE,
              r"Depthwise max pooling requires the depth window to evenly divide the input "
              r"depth"),
    ErrorCase(FWD, "depth_stride", _fw(ksize=[1, 1, 1, 2], strides=[1, 1, 1, 1]), UIE,
              r"Depthwise max pooling requires the depth window to equal the depth stride"),
    ErrorCase(FWD, "depth_window", _fw(ksize=[1, 1, 1, 2], strides=[1, 1, 1, 2]), UIE,
              r"Non-spatial pooling is not yet supported\. Volunteers\? :\)"),
    ErrorCase(FWD, "negative_output", _fw(ksize=[1, 6, 2, 1], strides=[1, 1, 1, 1]), IAE,
              r"Computed output size would be negative: -1 \[input_size: 4, "
              r"effective_filter_size: 6, stride: 1\]"),
    ErrorCase(FWD, "explicit", _fw(padding="EXPLICIT"), IAE,
              r"Value for attr 'padding' of \"EXPLICIT\" is not in the list of allowed "
              r"values: \"SAME\", \"VALID\""),
    ErrorCase(FWD, "int32", _fw(value=np.zeros((1, 4, 4, 1), np.int32)), IDE,
              r"Value for attr 'T' of int32 is not in the list of allowed values: half, "
              r"bfloat16, float, double"),
    # AvgPoolGrad
    ErrorCase(GRAD, "nchw", _gr(data_format="NCHW", orig_input_shape=_shape(1, 2, 4, 4),
                                ksize=[1, 1, 2, 2], strides=[1, 1, 2, 2]), IAE,
              r"Default AvgPoolingGradOp only supports NHWC on device type CPU"),
    ErrorCase(GRAD, "ksize_5", _gr(ksize=[1, 2, 2, 1, 1]), IAE,
              r"Sliding window ksize field must specify 4 dimensions"),
    ErrorCase(GRAD, "strides_5", _gr(strides=[1, 2, 2, 1, 1]), IAE,
              r"Sliding window strides field must specify 4 dimensions"),
    ErrorCase(GRAD, "batch_stride", _gr(strides=[2, 2, 2, 1]), UIE,
              r"Pooling is not yet supported on the batch dimension\."),
    ErrorCase(GRAD, "ksize_int32", _gr(ksize=[1, 2**31, 2, 1]), IAE,
              r"Attr ksize has value 2147483648 out of range for an int32"),
    ErrorCase(GRAD, "shape_3", _gr(orig_input_shape=_shape(1, 4, 4)), IAE,
              r"out_backprop must be 1-dimensional and 4 elements"),
    ErrorCase(GRAD, "shape_2d", _gr(orig_input_shape=np.array([[1, 4], [4, 2]], np.int32)),
              IAE, r"out_backprop must be 1-dimensional and 4 elements"),
    ErrorCase(GRAD, "grad_rank3", _gr(grad=_x(2, 2, 2)), IAE,
              r"out_backprop must be 4-dimensional"),
    ErrorCase(GRAD, "shape_negative", _gr(orig_input_shape=_shape(1, -4, 4, 2)), IAE,
              r"Expected a non-negative size, got -4"),
    ErrorCase(GRAD, "depth_window", _gr(ksize=[1, 1, 1, 2], strides=[1, 0, 2, 1]), UIE,
              r"Non-spatial pooling is not yet supported\. Volunteers\? :\)"),
    ErrorCase(GRAD, "stride_zero", _gr(ksize=[1, 0, 2, 1], strides=[1, 0, 2, 1]), IAE,
              r"Stride must be > 0, but got 0"),
    ErrorCase(GRAD, "negative_output", _gr(grad=_x(1, 0, 2, 2), ksize=[1, 6, 2, 1],
                                           strides=[1, 1, 2, 1]), IAE,
              r"Computed output size would be negative: -1 \[input_size: 4, "
              r"effective_filter_size: 6, stride: 1\]"),
    ErrorCase(GRAD, "grad_rows", _gr(grad=_x(1, 3, 2, 2)), IAE,
              r"Expected grad shape to be \[1,2,2,2\], but got \[1,3,2,2\]", tf_rejects=False,
              why=_TF_NO_CHECK),
    ErrorCase(GRAD, "grad_channels", _gr(grad=_x(1, 2, 2, 3)), IAE,
              r"Expected grad shape to be \[1,2,2,2\], but got \[1,2,2,3\]", tf_rejects=False,
              why=_TF_NO_CHECK + " (a heap overflow: TF's process may abort)"),
    ErrorCase(GRAD, "ksize_zero", _gr(ksize=[1, 0, 2, 1], grad=_x(1, 3, 2, 2)), IAE,
              r"ksize must be a positive int32 value, got:0", tf_rejects=False,
              why="TF 2.21's AvgPoolGrad does not check that ksize is positive (its AvgPool "
              "does) and divides by a count of no cells; tfgrad refuses it with AvgPool's "
              "words"),
]


# --------------------------------------------------------------------------------------
# Benchmarks: MobileNet-ish pools
# --------------------------------------------------------------------------------------
_BENCH_SHAPES = [
    ("[8,56,56,32] 2x2/2 VALID", (8, 56, 56, 32), (2, 2), (2, 2), "VALID"),
    ("[8,56,56,32] 3x3/2 SAME", (8, 56, 56, 32), (3, 3), (2, 2), "SAME"),
    ("[32,7,7,1280] 7x7 VALID", (32, 7, 7, 1280), (7, 7), (1, 1), "VALID"),
]


def _bench(op: str, shape: tuple[int, ...], k: tuple[int, int], s: tuple[int, int],
           padding: str) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        x = (2, 9, 9, 8) if smoke else shape
        if op == FWD:
            return dict(value=rng.standard_normal(x).astype(F32), **_attrs(k, s, padding))
        g = rng.standard_normal(out_shape(x, k, s, padding)).astype(F32)
        return dict(orig_input_shape=np.array(x, np.int32), grad=g, **_attrs(k, s, padding))
    return make


def _bytes(kw: dict[str, Any]) -> int:
    if "value" in kw:  # input read, output (~input / stride^2) written
        s = kw["strides"]
        return array_bytes(kw["value"]) * (1 + s[1] * s[2]) // (s[1] * s[2])
    return array_bytes(kw["grad"]) + 4 * int(np.prod(kw["orig_input_shape"]))


def _torch(op: str) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def build(kw: dict[str, Any]) -> Callable[[], Any]:
        torch = torch_module()
        k, s = tuple(kw["ksize"][1:3]), tuple(kw["strides"][1:3])
        pad = tuple(kk // 2 for kk in k) if kw["padding"] == "SAME" else 0
        fn = torch.nn.functional.avg_pool2d
        if op == FWD:  # (channels-last, as TF's layout)
            x = torch.from_numpy(kw["value"]).permute(0, 3, 1, 2)
            return lambda: fn(x, k, s, pad, count_include_pad=False)
        shape = tuple(int(v) for v in kw["orig_input_shape"])
        x = torch.zeros(shape).permute(0, 3, 1, 2).requires_grad_()
        y = fn(x, k, s, pad, count_include_pad=False)
        g = torch.from_numpy(kw["grad"]).permute(0, 3, 1, 2)
        g = g[:, :, :y.shape[2], :y.shape[3]]  # (torch's SAME-like padding may differ)
        return lambda: torch.autograd.grad(y, x, g, retain_graph=True)
    return build


BENCHES = [Bench(op, name, _bench(op, shape, k, s, p), _bytes, torch=_torch(op))
           for op in (FWD, GRAD) for name, shape, k, s, p in _BENCH_SHAPES]


def _warm(op: str, dtype: Any, shape: tuple[int, ...]) -> Callable[[np.random.Generator],
                                                                     dict[str, Any]]:
    mk = _fwd if op == FWD else _grad
    return mk(shape, (3, 3), (2, 2), "SAME", dtype, 0.0)


# Both kernels for float64 (float32's are the cases' and the benchmarks'), serial and
# threaded.
WARMUP: list[Warmup] = [
    Warmup(op, f"float64 {list(shape)}", _warm(op, np.float64, shape), large=large)
    for op in (FWD, GRAD) for shape, large in (((1, 5, 5, 2), False), ((4, 28, 28, 32), True))
]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    """A larger input (tests/test_determinism.py runs it on 1 and 2 threads)."""
    def make() -> dict[str, Any]:
        return _fwd((8, 28, 28, 32), (3, 3), (2, 2), "SAME", F32, 0.01)(
            np.random.default_rng(1)) if op == FWD else _grad(
            (8, 28, 28, 32), (3, 3), (2, 2), "SAME", F32, 0.01)(np.random.default_rng(1))
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {op: _large(op) for op in (FWD, GRAD)}
