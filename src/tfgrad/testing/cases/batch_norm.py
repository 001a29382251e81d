"""Op cases for the batch_norm family (FusedBatchNorm{,V2,V3}, FusedBatchNormGrad{,V2,V3}).

Outputs TF leaves uninitialised (inference reserve_space_1/2, empty-batch reserve spaces)
are compared with tfgrad's documented values (copies of mean/variance, zeros) through
``tf_outputs``. FusedBatchNormGrad* with is_training=False in NCHW/NCDHW, which TF's CPU
kernel rejects, is compared with TF's NHWC computation, transposed. Shapes stay below
~1e5 elements so that TF's own thread split of the gradient sums does not engage (see
tfgrad.ops.batch_norm): on any thread count TF then sums rows in sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from tfgrad import InvalidArgumentError
from tfgrad._opdefs import OPS
from tfgrad.errors import InvalidDtypeError, NotFoundError

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
F16 = np.float16
BF16 = ml_dtypes.bfloat16
E = np.zeros(0, F32)
FWD = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
GRAD = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")


def _nchw(shape_nhwc: tuple[int, ...]) -> tuple[int, ...]:
    return (shape_nhwc[0], shape_nhwc[-1]) + tuple(shape_nhwc[1:-1])


def _to_channel_last(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def _to_channel_first(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(a, -1, 1))


def _fwd_maker(shape: tuple[int, ...], dtype: Any, fmt: str, training: bool, eps: float,
               factor: float, stats: bool = True, loc: float = 1.0,
               spread: float = 3.0) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Forward kwargs; ``shape`` is in channel-last order, permuted for NCHW/NCDHW."""
    c = shape[-1]
    channel_first = fmt in ("NCHW", "NCDHW")

    def make(rng: np.random.Generator) -> dict[str, Any]:
        x = (rng.standard_normal(shape) * spread + loc).astype(dtype)
        if channel_first:
            x = _to_channel_first(x)
        need = stats or not training or F32(factor) != F32(1)
        return dict(
            x=x,
            scale=rng.standard_normal(c).astype(F32),
            offset=rng.standard_normal(c).astype(F32),
            mean=rng.standard_normal(c).astype(F32) if need else E,
            variance=(rng.random(c) + 0.25).astype(F32) if need else E,
            epsilon=eps, exponential_avg_factor=factor, data_format=fmt,
            is_training=training,
        )

    return make


def _fwd_case(op: str, name: str, make: Callable[[np.random.Generator], dict[str, Any]],
              training: bool, empty: bool = False) -> Case:
    """A forward case; where TF's reserve_space_1/2 are uninitialised (inference, empty x)
    TF's outputs get tfgrad's defined values: copies of mean/variance, or zeros."""
    if training and not empty:
        return Case(op, name, make)
    seen: dict[str, Any] = {}

    def tf_call(kw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        seen.clear()
        seen.update(kw)
        return op, kw

    def tf_outputs(out: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        out = list(out)
        if empty:
            out[3], out[4] = np.zeros_like(out[3]), np.zeros_like(out[4])
        else:
            out[3] = np.array(seen["mean"], F32)
            out[4] = np.array(seen["variance"], F32)
        return tuple(out)

    return Case(op, name, make, tf_call=tf_call, tf_outputs=tf_outputs)


def _grad_maker(op: str, shape: tuple[int, ...], dtype: Any, fmt: str, training: bool,
                eps: float, from_forward: bool = True
                ) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Grad kwargs; reserve spaces are a batch's mean / biased variance (training) or
    population statistics (inference)."""
    c = shape[-1]
    channel_first = fmt in ("NCHW", "NCDHW")

    def make(rng: np.random.Generator) -> dict[str, Any]:
        x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        x32 = x.astype(F32).reshape(-1, c)
        if training and from_forward and x32.shape[0] > 0:
            mean = x32.mean(axis=0, dtype=np.float64).astype(F32)
            var = x32.var(axis=0, dtype=np.float64).astype(F32)
        else:
            mean = rng.standard_normal(c).astype(F32)
            var = (rng.random(c) + 0.25).astype(F32)
        if channel_first:
            x, dy = _to_channel_first(x), _to_channel_first(dy)
        kw = dict(y_backprop=dy, x=x, scale=rng.standard_normal(c).astype(F32),
                  reserve_space_1=mean, reserve_space_2=var, epsilon=eps, data_format=fmt,
                  is_training=training)
        if op.endswith("V3"):
            kw["reserve_space_3"] = E
        return kw

    return make


def _grad_case(op: str, name: str, make: Callable[[np.random.Generator], dict[str, Any]],
               fmt: str, training: bool) -> Case:
    if training or fmt in ("NHWC", "NDHWC"):
        return Case(op, name, make)

    # TF's CPU kernel rejects inference grads in NCHW; compare with its NHWC computation.
    def tf_call(kw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        kw = dict(kw, y_backprop=_to_channel_last(kw["y_backprop"]),
                  x=_to_channel_last(kw["x"]),
                  data_format="NDHWC" if fmt == "NCDHW" else "NHWC")
        return op, kw

    def tf_outputs(out: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        return (_to_channel_first(out[0]),) + tuple(out[1:])

    return Case(op, name, make, tf_call=tf_call, tf_outputs=tf_outputs)


def _dtypes(op: str) -> tuple[Any, ...]:
    return (F32,) if op in ("FusedBatchNorm", "FusedBatchNormGrad") else (F32, F16, BF16)


def _dname(dt: Any) -> str:
    return np.dtype(dt).name


CASES: list[Case] = []

# Forward: every op x dtype x layout x mode, shapes with full packets and tails.
for op in FWD:
    fmts = ("NHWC", "NCHW", "NDHWC", "NCDHW") if op.endswith("V3") else ("NHWC", "NCHW")
    for dt in _dtypes(op):
        for fmt in fmts:
            five = fmt in ("NDHWC", "NCDHW")
            shape = (2, 2, 2, 3, 19) if five else (2, 3, 5, 19)  # C=19: 16 packet + 3 tail
            for training in (True, False):
                for factor in ((1.0, 0.25) if training else (0.5,)):
                    name = f"{_dname(dt)}_{fmt}_{'train' if training else 'infer'}_f{factor}"
                    make = _fwd_maker(shape, dt, fmt, training, 1e-3, factor,
                                      stats=factor != 1.0)
                    CASES.append(_fwd_case(op, name, make, training))

# Forward corner cases (V3 float32 unless stated).
_SPECIAL_FWD = [
    ("tiny_R1", (1, 1, 1, 10), F32, "NHWC", True, 1e-3, 1.0),  # Bessel factor clamps to 1
    ("R15_no_unroll", (1, 3, 5, 24), F32, "NHWC", True, 1e-3, 1.0),  # R < 16: sequential
    ("R16_unroll", (1, 4, 4, 24), F32, "NHWC", True, 1e-3, 1.0),
    ("R18_leftover", (2, 3, 3, 16), F32, "NCHW", True, 1e-3, 1.0),
    ("C1", (2, 9, 9, 1), F32, "NHWC", True, 1e-3, 1.0),
    ("C8_all_packet", (2, 4, 5, 8), F32, "NCHW", True, 1e-5, 1.0),
    ("C40", (2, 6, 6, 40), F32, "NHWC", True, 1e-5, 1.0),
    ("factor0", (2, 3, 3, 12), F32, "NHWC", True, 1e-3, 0.0),
    ("factor2", (2, 3, 3, 12), F32, "NCHW", True, 1e-3, 2.0),
    ("eps0", (2, 3, 3, 12), F32, "NHWC", True, 0.0, 1.0),
    ("eps_large", (2, 3, 3, 12), F16, "NHWC", True, 10.0, 1.0),
    ("eps_negative_infer", (2, 3, 3, 12), F32, "NHWC", False, -0.5, 1.0),  # NaN where var<0.5
    ("eps_tiny", (2, 3, 3, 9), BF16, "NCHW", True, 1e-12, 0.1),
    ("5d_NHWC_V3", (2, 2, 3, 4, 9), F32, "NHWC", True, 1e-3, 1.0),  # 5-D with the 4-D name
]
for name, shape, dt, fmt, training, eps, factor in _SPECIAL_FWD:
    make = _fwd_maker(shape, dt, fmt, training, eps, factor)
    CASES.append(_fwd_case("FusedBatchNormV3", name, make, training))

# 5-D input for V1/V2 (TF's Eigen kernel accepts it with the 4-D format names).
for op in ("FusedBatchNorm", "FusedBatchNormV2"):
    for fmt in ("NHWC", "NCHW"):
        CASES.append(_fwd_case(op, f"5d_{fmt}", _fwd_maker((2, 2, 3, 3, 11), F32, fmt, True,
                                                           1e-3, 1.0), True))

# Constant channel with epsilon 0: y = 0 * inf = NaN, as TF.
CASES.append(Case("FusedBatchNormV3", "const_channel_eps0", lambda rng: dict(
    x=np.ones((1, 2, 2, 3), F32), scale=np.ones(3, F32), offset=np.zeros(3, F32), mean=E,
    variance=E, epsilon=0.0, is_training=True)))
# Large magnitudes, f16 output that overflows to inf.
CASES.append(_fwd_case("FusedBatchNormV2", "f16_overflow", _fwd_maker(
    (2, 3, 3, 4), F16, "NHWC", False, 1e-3, 1.0, loc=60000.0, spread=1.0), False))

# Empty inputs.
for fmt, shape in (("NHWC", (0, 2, 3, 5)), ("NCHW", (0, 5, 2, 3)), ("NHWC", (2, 0, 3, 5))):
    for training in (True, False):
        c = 5

        def make_empty(rng: np.random.Generator, shape=shape, fmt=fmt, training=training,
                       c=c) -> dict[str, Any]:
            return dict(x=np.zeros(shape, F32), scale=np.ones(c, F32),
                        offset=np.ones(c, F32), mean=rng.standard_normal(c).astype(F32),
                        variance=np.ones(c, F32), data_format=fmt, is_training=training)

        CASES.append(_fwd_case("FusedBatchNormV3", f"empty_{fmt}_{shape}_{training}",
                               make_empty, training, empty=True))
CASES.append(Case("FusedBatchNormV3", "zero_channels", lambda rng: dict(
    x=np.zeros((2, 3, 3, 0), F32), scale=E, offset=E, mean=E, variance=E,
    is_training=True)))

# Gradient: every op x dtype x layout x mode.
for op in GRAD:
    fmts = ("NHWC", "NCHW", "NDHWC", "NCDHW") if op.endswith("V3") else ("NHWC", "NCHW")
    for dt in _dtypes(op):
        for fmt in fmts:
            five = fmt in ("NDHWC", "NCDHW")
            shape = (2, 2, 2, 3, 19) if five else (2, 3, 5, 19)
            for training in (True, False):
                name = f"{_dname(dt)}_{fmt}_{'train' if training else 'infer'}"
                CASES.append(_grad_case(op, name, _grad_maker(op, shape, dt, fmt, training,
                                                              1e-3), fmt, training))

_SPECIAL_GRAD = [
    ("R1", (1, 1, 1, 10), F32, "NHWC", True),  # TF passes the single row through
    ("R2", (1, 1, 2, 10), F32, "NCHW", True),
    ("C1", (2, 9, 9, 1), F32, "NHWC", True),
    ("C40_nchw_infer", (2, 6, 6, 40), F32, "NCHW", False),
    ("C4100_tiles", (1, 1, 2, 4100), F32, "NHWC", True),  # rsqrt tiles of 4050 in dx
    ("C10330_tiles", (1, 1, 2, 10330), F32, "NCHW", True),  # tiles of 10322 in scale_bp
    ("f16_C4100_tiles", (1, 1, 2, 4100), F16, "NHWC", True),
    ("5d_NHWC_V3", (2, 2, 3, 4, 9), F32, "NHWC", True),
]
for name, shape, dt, fmt, training in _SPECIAL_GRAD:
    CASES.append(_grad_case("FusedBatchNormGradV3", name, _grad_maker(
        "FusedBatchNormGradV3", shape, dt, fmt, training, 1e-3), fmt, training))
for op in ("FusedBatchNormGrad", "FusedBatchNormGradV2"):
    CASES.append(Case(op, "5d_NHWC", _grad_maker(op, (2, 2, 3, 3, 11), F32, "NHWC", True,
                                                 1e-3)))
CASES.append(Case("FusedBatchNormGradV3", "eps_negative_infer", _grad_maker(
    "FusedBatchNormGradV3", (2, 3, 3, 12), F32, "NHWC", False, -0.5)))
CASES.append(Case("FusedBatchNormGradV3", "eps0_train", _grad_maker(
    "FusedBatchNormGradV3", (2, 3, 3, 12), F32, "NHWC", True, 0.0)))
for fmt, shape, training in (("NHWC", (0, 2, 3, 5), True), ("NCHW", (0, 5, 2, 3), True),
                             ("NHWC", (2, 0, 3, 5), False), ("NCHW", (0, 5, 2, 3), False)):
    def make_gempty(rng: np.random.Generator, shape=shape, fmt=fmt,
                    training=training) -> dict[str, Any]:
        c = 5
        return dict(y_backprop=np.zeros(shape, F32), x=np.zeros(shape, F32),
                    scale=np.ones(c, F32), reserve_space_1=np.zeros(c, F32),
                    reserve_space_2=np.ones(c, F32), reserve_space_3=E, data_format=fmt,
                    is_training=training)

    # TF returns zeros before its NCHW check, so even the inference NCHW call works here.
    CASES.append(Case("FusedBatchNormGradV3", f"empty_{fmt}_{shape}_{training}", make_gempty))


def processor_dependent(case: Case, kwargs: dict[str, Any]) -> set[str]:
    """The outputs computed with the processor's approximate rsqrt (``rsqrtps`` and Eigen's
    Newton step, as TF: Intel's and AMD's differ, and TF's bits with them): y, x_backprop
    and scale_backprop, when some channel is in a full packet of 8."""
    x = kwargs["x"]
    channel_last = kwargs.get("data_format", "NHWC") in ("NHWC", "NDHWC")
    c = x.shape[-1] if channel_last else x.shape[1]
    names = {o.name for o in OPS[case.op].outputs}
    return {"y", "x_backprop", "scale_backprop"} & names if c >= 8 else set()


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
def _fwd_kw(**over: Any) -> Callable[[], dict[str, Any]]:
    def kw() -> dict[str, Any]:
        c = 2
        base = dict(x=np.ones((2, 1, 2, c), F32), scale=np.ones(c, F32),
                    offset=np.zeros(c, F32), mean=np.zeros(c, F32),
                    variance=np.ones(c, F32), is_training=True)
        base.update(over)
        return base

    return kw


def _grad_kw(v3: bool = True, **over: Any) -> Callable[[], dict[str, Any]]:
    def kw() -> dict[str, Any]:
        c = 2
        base = dict(y_backprop=np.ones((2, 1, 2, c), F32), x=np.ones((2, 1, 2, c), F32),
                    scale=np.ones(c, F32), reserve_space_1=np.zeros(c, F32),
                    reserve_space_2=np.ones(c, F32), is_training=True)
        if v3:
            base["reserve_space_3"] = E
        base.update(over)
        return base

    return kw


IAE = InvalidArgumentError
ERROR_CASES: list[ErrorCase] = []
for op in FWD:
    ERROR_CASES += [
        ErrorCase(op, "x_rank3", _fwd_kw(x=np.ones((1, 2, 2), F32)), IAE,
                  r"input must be 4 or 5-dimensional.*\[1,2,2\]"),
        ErrorCase(op, "x_rank6", _fwd_kw(x=np.ones((1, 1, 1, 1, 1, 2), F32)), IAE,
                  r"input must be 4 or 5-dimensional"),
        ErrorCase(op, "scale_rank2", _fwd_kw(scale=np.ones((1, 2), F32)), IAE,
                  r"scale must be 1-dimensional.*\[1,2\]"),
        ErrorCase(op, "offset_rank0", _fwd_kw(offset=np.float32(1)), IAE,
                  r"offset must be 1-dimensional"),
        ErrorCase(op, "mean_rank2", _fwd_kw(mean=np.zeros((1, 2), F32)), IAE,
                  r"estimated_mean must be 1-dimensional"),
        ErrorCase(op, "variance_rank2", _fwd_kw(variance=np.zeros((2, 1), F32)), IAE,
                  r"estimated_variance must be 1-dimensional"),
        ErrorCase(op, "scale_size", _fwd_kw(scale=np.ones(1, F32)), IAE,
                  r"scale must have the same number of elements as the channels of x, "
                  r"got 1 and 2"),
        ErrorCase(op, "offset_size", _fwd_kw(offset=np.ones(3, F32)), IAE,
                  r"offset must have the same number of elements.*got 3 and 2"),
        ErrorCase(op, "infer_mean_empty", _fwd_kw(mean=E, is_training=False), IAE,
                  r"When is_training=false, mean must have the same number of elements "
                  r"as the channels of x, got 0 and 2"),
        ErrorCase(op, "infer_variance_size", _fwd_kw(variance=np.ones(3, F32),
                                                     is_training=False), IAE,
                  r"When is_training=false, variance must have.*got 3 and 2"),
        ErrorCase(op, "ema_mean_empty", _fwd_kw(mean=E, exponential_avg_factor=0.5), IAE,
                  r"When exponential_avg_factor != 1, mean must have.*got 0 and 2"),
        ErrorCase(op, "ema_variance_empty", _fwd_kw(variance=E, exponential_avg_factor=0.0),
                  IAE, r"When exponential_avg_factor != 1, variance must have"),
        ErrorCase(op, "bad_format", _fwd_kw(data_format="NCWH"), IAE,
                  r"Value for attr 'data_format' of \"NCWH\" is not in the list of allowed "
                  r"values: \"NHWC\", \"NCHW\""),
        ErrorCase(op, "x_float64", _fwd_kw(x=np.ones((2, 1, 2, 2))), InvalidDtypeError,
                  r"Value for attr 'T' of double is not in the list of allowed values: "),
        ErrorCase(op, "x_int32", _fwd_kw(x=np.ones((2, 1, 2, 2), np.int32)), InvalidDtypeError,
                  r"Value for attr 'T' of int32 is not in the list of allowed values: "),
        ErrorCase(op, "channels_first_mismatch", _fwd_kw(data_format="NCHW"), IAE,
                  r"scale must have the same number of elements.*got 2 and 1"),
        ErrorCase(op, "epsilon_string", _fwd_kw(epsilon="0.1"), TypeError,
                  r"Expected float for argument 'epsilon' not '0.1'\."),
        ErrorCase(op, "is_training_int", _fwd_kw(is_training=1), TypeError,
                  r"Expected bool for argument 'is_training' not 1\."),
    ]
ERROR_CASES += [
    ErrorCase("FusedBatchNorm", "half", _fwd_kw(x=np.ones((2, 1, 2, 2), F16),
                                                scale=np.ones(2, F16), offset=np.ones(2, F16),
                                                mean=np.ones(2, F16),
                                                variance=np.ones(2, F16)), InvalidDtypeError,
              r"Value for attr 'T' of half is not in the list of allowed values: float"),
    ErrorCase("FusedBatchNormV2", "ndhwc_attr", _fwd_kw(data_format="NDHWC"), IAE,
              r"Value for attr 'data_format' of \"NDHWC\" is not in the list"),
    ErrorCase("FusedBatchNorm", "ncdhw_attr", _fwd_kw(data_format="NCDHW"), IAE,
              r"Value for attr 'data_format' of \"NCDHW\" is not in the list"),
    # TF's op def allows U=bfloat16, but TF has no CPU kernel for it
    ErrorCase("FusedBatchNormV3", "scale_bfloat16", _fwd_kw(
        scale=np.ones(2, BF16), offset=np.ones(2, BF16), mean=np.ones(2, BF16),
        variance=np.ones(2, BF16)), NotFoundError,
        r"Could not find device for node: .*FusedBatchNormV3.*U=(DT_)?(?i:bfloat16)"),
    ErrorCase("FusedBatchNormV3", "ncdhw_on_nhwc_shaped_x", _fwd_kw(data_format="NCDHW"),
              IAE, r"got 2 and 1"),
    ErrorCase("FusedBatchNormV2", "scale_float16", _fwd_kw(scale=np.ones(2, F16)),
              InvalidDtypeError, r"Value for attr 'U' of half is not in the list of allowed "
              r"values: float"),
]
for op in GRAD:
    v3 = op.endswith("V3")
    ERROR_CASES += [
        ErrorCase(op, "dy_rank3", _grad_kw(v3, y_backprop=np.ones((1, 2, 2), F32)), IAE,
                  r"input must be 4 or 5-dimensional(, got y_backprop|\[1,2,2\])"),
        ErrorCase(op, "x_rank3", _grad_kw(v3, x=np.ones((1, 2, 2), F32)), IAE,
                  r"input must be 4 or 5-dimensional(, got x of|\[1,2,2\])"),
        ErrorCase(op, "scale_rank2", _grad_kw(v3, scale=np.ones((1, 2), F32)), IAE,
                  r"scale must be 1-dimensional"),
        ErrorCase(op, "mean_rank2", _grad_kw(v3, reserve_space_1=np.ones((1, 2), F32)), IAE,
                  r"saved mean.*must be 1-dimensional"),
        ErrorCase(op, "var_rank0", _grad_kw(v3, reserve_space_2=np.float32(1)), IAE,
                  r"saved variance.*must be 1-dimensional"),
        ErrorCase(op, "shape_mismatch", _grad_kw(v3, y_backprop=np.ones((1, 1, 2, 2), F32)),
                  IAE, r"x and y_backprop must have same shape, but x has shape \[2,1,2,2\] "
                  r"and y_backprop has shape \[1,1,2,2\]"),
        ErrorCase(op, "scale_size", _grad_kw(v3, scale=np.ones(1, F32)), IAE,
                  r"scale must have the same number of elements.*got 1 and 2"),
        ErrorCase(op, "mean_size", _grad_kw(v3, reserve_space_1=np.ones(1, F32)), IAE,
                  r"reserve_space_1 must have the same number of elements.*got 1 and 2"),
        ErrorCase(op, "var_size", _grad_kw(v3, reserve_space_2=E), IAE,
                  r"reserve_space_2 must have the same number of elements.*got 0 and 2"),
        ErrorCase(op, "bad_format", _grad_kw(v3, data_format="HWCN"), IAE,
                  r"Value for attr 'data_format' of \"HWCN\" is not in the list"),
        ErrorCase(op, "x_float64", _grad_kw(v3, x=np.ones((2, 1, 2, 2)),
                                            y_backprop=np.ones((2, 1, 2, 2))),
                  InvalidDtypeError, r"Value for attr 'T' of double is not in the list"),
        # FusedBatchNormGrad's T is float32 only: float16 is not allowed, in TF either
        ErrorCase(op, "dy_x_dtypes_differ", _grad_kw(v3, y_backprop=np.ones((2, 1, 2, 2),
                                                                           F16)),
                  InvalidDtypeError, r"Value for attr 'T' of half is not in the list")
        if op == "FusedBatchNormGrad" else
        ErrorCase(op, "dy_x_dtypes_differ", _grad_kw(v3, y_backprop=np.ones((2, 1, 2, 2),
                                                                           F16)),
                  TypeError, r"y_backprop|x", tf_rejects=False,
                  why="TF converts a NumPy float32 x to y_backprop's float16; tfgrad "
                  "requires one dtype for T, as for arrays that are TF tensors"),
    ]
ERROR_CASES += [
    ErrorCase("FusedBatchNormGradV2", "ndhwc_attr", _grad_kw(False, data_format="NDHWC"), IAE,
              r"data_format"),
    ErrorCase("FusedBatchNormGrad", "half", _grad_kw(
        False, y_backprop=np.ones((2, 1, 2, 2), F16), x=np.ones((2, 1, 2, 2), F16),
        scale=np.ones(2, F16), reserve_space_1=np.ones(2, F16),
        reserve_space_2=np.ones(2, F16)), InvalidDtypeError,
        r"Value for attr 'T' of half is not in the list of allowed values: float"),
]


# --------------------------------------------------------------------------------------
# Benchmarks (tfgrad bench, benchmarks/run.py)
# --------------------------------------------------------------------------------------
# Benchmarks of the batch_norm family: [16, 56, 56, 128] float32, NHWC and its NCHW
# transpose, forward (training and inference) and gradient (training), against TF's CPU
# kernel and PyTorch's native batch norm (channels-last memory format for NHWC).
F32 = np.float32
BENCH_SHAPE = (16, 56, 56, 128)
BENCH_SMOKE = (2, 5, 5, 16)


def _bench_x(rng: np.random.Generator, smoke: bool, fmt: str) -> np.ndarray:
    x = (rng.standard_normal(BENCH_SMOKE if smoke else BENCH_SHAPE) * 2 + 1).astype(F32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if fmt == "NCHW" else x


def _bench_channels(x: np.ndarray, fmt: str) -> int:
    return x.shape[-1] if fmt == "NHWC" else x.shape[1]


def _bench_fwd_make(fmt: str, training: bool):
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        x = _bench_x(rng, smoke, fmt)
        c = _bench_channels(x, fmt)
        return dict(x=x, scale=rng.standard_normal(c).astype(F32),
                    offset=rng.standard_normal(c).astype(F32),
                    mean=rng.standard_normal(c).astype(F32),
                    variance=(rng.random(c) + 0.5).astype(F32), epsilon=1e-3,
                    data_format=fmt, is_training=training)

    return make


def _bench_grad_make(fmt: str):
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        x = _bench_x(rng, smoke, fmt)
        dy = _bench_x(rng, smoke, fmt)
        c = _bench_channels(x, fmt)
        axes = (0, 1, 2) if fmt == "NHWC" else (0, 2, 3)
        return dict(y_backprop=dy, x=x, scale=rng.standard_normal(c).astype(F32),
                    reserve_space_1=x.mean(axis=axes).astype(F32),
                    reserve_space_2=x.var(axis=axes).astype(F32),
                    reserve_space_3=np.zeros(0, F32), epsilon=1e-3, data_format=fmt,
                    is_training=True)

    return make


def _bench_torch_nchw(torch: Any, a: np.ndarray, fmt: str) -> Any:
    """A torch tensor in NCHW logical order; NHWC data becomes channels-last memory."""
    t = torch.from_numpy(a)
    return t.permute(0, 3, 1, 2) if fmt == "NHWC" else t


def _bench_torch_fwd(fmt: str, training: bool):
    def build(kw: dict[str, Any]):
        torch = torch_module()
        x = _bench_torch_nchw(torch, kw["x"], fmt)
        w, b = torch.from_numpy(kw["scale"]), torch.from_numpy(kw["offset"])
        rm, rv = torch.from_numpy(kw["mean"].copy()), torch.from_numpy(kw["variance"].copy())
        op = torch.ops.aten.native_batch_norm
        return lambda: op(x, w, b, rm, rv, training, 0.1, kw["epsilon"])

    return build


def _bench_torch_grad(fmt: str):
    def build(kw: dict[str, Any]):
        torch = torch_module()
        x = _bench_torch_nchw(torch, kw["x"], fmt)
        dy = _bench_torch_nchw(torch, kw["y_backprop"], fmt)
        w = torch.from_numpy(kw["scale"])
        mean = torch.from_numpy(kw["reserve_space_1"])
        invstd = torch.from_numpy(1 / np.sqrt(kw["reserve_space_2"] + F32(kw["epsilon"])))
        op = torch.ops.aten.native_batch_norm_backward
        return lambda: op(dy, x, w, None, None, mean, invstd, True, kw["epsilon"],
                          [True, True, True])

    return build


def _bench_fwd_bytes(kw: dict[str, Any]) -> int:
    return 2 * array_bytes(kw["x"])  # read x, write y


def _bench_grad_bytes(kw: dict[str, Any]) -> int:
    return 3 * array_bytes(kw["x"])  # read dy and x, write dx


BENCHES = []
for _fmt in ("NHWC", "NCHW"):
    _shape = "x".join(map(str, BENCH_SHAPE if _fmt == "NHWC" else (16, 128, 56, 56)))
    BENCHES += [
        Bench("FusedBatchNormGradV3", f"{_shape} {_fmt} f32 train", _bench_grad_make(_fmt),
              _bench_grad_bytes, torch=_bench_torch_grad(_fmt)),
        Bench("FusedBatchNormV3", f"{_shape} {_fmt} f32 train", _bench_fwd_make(_fmt, True),
              _bench_fwd_bytes, torch=_bench_torch_fwd(_fmt, True)),
        Bench("FusedBatchNormV3", f"{_shape} {_fmt} f32 infer", _bench_fwd_make(_fmt, False),
              _bench_fwd_bytes, torch=_bench_torch_fwd(_fmt, False)),
    ]


# --------------------------------------------------------------------------------------
# Warmup (tfgrad warmup runs these besides every case and benchmark)
# --------------------------------------------------------------------------------------
# Every op, dtype, data format and mode, tiny and at 2**17 elements and more (threaded
# kernels); shapes in channel-last order.
_WARM_SHAPES = {False: ((2, 3, 4, 3), (2, 2, 3, 4, 3)), True: ((8, 32, 32, 16),
                                                               (8, 4, 32, 32, 16))}
WARMUP: list[Warmup] = []
for _large, (_four, _five) in _WARM_SHAPES.items():
    for _op in FWD + GRAD:
        for _t in OPS[_op].type_attr("T").allowed:
            for _fmt in OPS[_op].attr("data_format").allowed:
                _shape = _five if _fmt in ("NDHWC", "NCDHW") else _four
                _dt = BF16 if _t == "bfloat16" else np.dtype(_t).type
                for _training in (True, False):
                    _name = f"{_t}_{list(_shape)}_{_fmt}_{'train' if _training else 'infer'}"
                    if _op in GRAD:
                        _make = _grad_maker(_op, _shape, _dt, _fmt, _training, 1e-3)
                        WARMUP.append(Warmup(_op, _name, _make, _large))
                        continue
                    for _factor in ((1.0, 0.5) if _training else (1.0,)):
                        _make = _fwd_maker(_shape, _dt, _fmt, _training, 1e-3, _factor)
                        WARMUP.append(Warmup(_op, f"{_name}_f{_factor}", _make, _large))


def _large(op: str) -> Callable[[], dict[str, Any]]:
    """A larger input for ``op``: big enough for the kernels' threads and reductions to
    split work (tests/test_determinism.py runs it on 1 and 2 threads)."""
    def make() -> dict[str, Any]:
        g = np.random.default_rng(2)
        t = np.float16 if op.endswith(("V2",)) else np.float32
        x = (g.standard_normal((16, 24, 24, 37)) * 3 + 1).astype(t)  # 341k values, 37 ch
        c = x.shape[-1]
        if "Grad" in op:
            kw = {"y_backprop": g.standard_normal(x.shape).astype(t), "x": x,
                  "scale": g.standard_normal(c).astype(np.float32),
                  "reserve_space_1": g.standard_normal(c).astype(np.float32),
                  "reserve_space_2": g.random(c).astype(np.float32) + 0.5, "is_training": True}
            if op.endswith("V3"):
                kw["reserve_space_3"] = np.zeros(c, np.float32)
            return kw
        return {"x": x, "scale": g.standard_normal(c).astype(np.float32),
                "offset": g.standard_normal(c).astype(np.float32),
                "mean": np.zeros(c, np.float32), "variance": np.ones(c, np.float32),
                "exponential_avg_factor": 0.3, "is_training": True}
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large(name) for name, op in OPS.items() if op.family == "batch_norm"}
