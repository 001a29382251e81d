"""Regression tests for TensorFlow's security advisories on the ops tfgrad implements.

Each proof of concept from TensorFlow's advisories (TFSA files in
tensorflow/security/advisory, GitHub advisories GHSA-*, CVE ids) is rebuilt with NumPy
inputs, together with close variants (the same flaw through a sibling op, another
argument or another bad value). tfgrad must reject each with a clean
``InvalidArgumentError`` (``expect="error"``). A few variants are inputs that TF 2.21
(patched) accepts and computes; there tfgrad must return outputs of the documented
shapes (``"ok"``), and where tfgrad deliberately goes beyond TF's CPU kernel (NCHW,
dilations, unequal strides) either answer is allowed (``"either"``). In every case the
inputs (read-only here) must not change and nothing else may happen.

TF itself is never run here: these inputs crashed (and on the oneDNN path still crash)
TF's process. ``tools/advisories_tf.py`` runs them against TF 2.21, one subprocess
each, to document what TF does.

No TensorFlow advisory names DepthwiseConv2dNative* directly; its cases rebuild the
advisories of the Conv2D backprops (same shape-computing code in TF), of TFLite's
depthwise kernel, of large shapes in general, and a public crash report.

Memory bounds (the end of this file): outputs whose size comes from input *values*
(input_sizes, filter_sizes, orig_input_tensor_shape, explicit paddings) are checked
against ``TFGRAD_MAX_BYTES`` before anything is allocated (``ResourceLimitError``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import tfgrad
from tests.fuzz_strategies import PropertyViolation, check_call, expected_outputs

f32, f64, i32, i64 = np.float32, np.float64, np.int32, np.int64


@dataclass(frozen=True)
class Advisory:
    ref: str
    """TFSA / GHSA / CVE ids (or the public report) the case reproduces."""
    name: str
    op: str
    make: Callable[[], dict[str, Any]]
    expect: str = "error"  # "error" | "ok" | "either"
    note: str = ""

    @property
    def id(self) -> str:
        return f"{self.ref.split()[0]}:{self.name}"


def z(shape, dtype=f32, value=0):
    return np.full(shape, value, dtype)


def r(shape, dtype=f32, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


FQ_VARS = "CVE-2022-35971 GHSA-9fpg-838v-wpv7"
FQ_VARS_GRAD = "CVE-2022-36005 GHSA-r26c-679w-mrjm"
FQ_PC = "CVE-2022-36019 GHSA-9j4v-pp28-mxv7"
FQ_PC_GRAD = "CVE-2022-35990 GHSA-h7ff-cfc9-wmmh"
BN_FPE = "TFSA-2021-043 CVE-2021-29555"
BN_OOB = "TFSA-2021-072 CVE-2021-29583 GHSA-9xh4-23q4-v6wr"
BN_GRAD_OOB = "CVE-2021-41223 GHSA-f54p-f6jp-4rhr"
FAP_DIV0 = "TFSA-2021-038 CVE-2021-29550"
FMP_DIV0 = "CVE-2022-21735 GHSA-87v6-crgm-2gfj"
FP_RATIO = "CVE-2022-41900 GHSA-xvwp-h6jv-7472"
FAPG_SEQ = "TFSA-2021-067 CVE-2021-29578"
FAPG_EMPTY = "CVE-2021-37651 GHSA-hpv4-7p9c-mvfr"
FAPG_NEG = "CVE-2022-21730 GHSA-vjg4-v33c-ggc4"
FAPG_SHAPE = "CVE-2022-35963 GHSA-84jm-4cf3-9jfm"
FMPG_EMPTY = "CVE-2021-29580 GHSA-x8h6-xgqx-jqgp"
FMPG_CHECK = "CVE-2022-35981 GHSA-vxv8-r8q2-63xw"
FMPG_OOB = "CVE-2022-41897 GHSA-f2w8-jw48-fr7j"
CONV_BPF_OOB = "TFSA-2021-028 CVE-2021-29540 (Conv2DBackpropFilter)"
CONV_BPF_DIV0 = "CVE-2021-29524 (Conv2DBackpropFilter)"
CONV_BPI_DIV0 = "CVE-2021-29525 (Conv2DBackpropInput)"
CONV_DIV0 = "CVE-2021-29526 (Conv2D)"
TFLITE_DW = "CVE-2022-21741 TFSA-2022-022 (TFLite depthwise)"
LARGE = "CVE-2021-41197 GHSA-prcg-wp5q-rv7p"
DW_ISSUE = "tensorflow-issue DepthwiseConv2dNativeBackpropInput check-fail"


def _fq_vars(mn, mx, x=(2, 3)):
    return lambda: {"inputs": z(x), "min": mn(), "max": mx(), "num_bits": 8,
                    "narrow_range": False}


def _fq_vars_grad(mn, mx, g=(2, 2), x=(2, 2)):
    return lambda: {"gradients": r(g, seed=1), "inputs": r(x, seed=2), "min": mn(),
                    "max": mx(), "num_bits": 8, "narrow_range": False}


def _bn(op, x, c_scale, c_offset, c_mean, c_var, is_training=False, fmt="NHWC", eaf=0.0):
    def make():
        return {"x": z(x), "scale": z(c_scale), "offset": z(c_offset), "mean": z(c_mean),
                "variance": z(c_var), "epsilon": 0.0, "exponential_avg_factor": eaf,
                "data_format": fmt, "is_training": is_training}
    return make


def _bn_grad(op, dy, x, scale, rs1, rs2, fmt="NCHW", is_training=True, rs3=None):
    def make():
        kw = {"y_backprop": np.arange(np.prod(dy), dtype=f32).reshape(dy),
              "x": np.arange(np.prod(x), dtype=f32).reshape(x), "scale": z(scale, value=1),
              "reserve_space_1": z(rs1, value=1), "reserve_space_2": z(rs2, value=1),
              "epsilon": 1.0, "data_format": fmt, "is_training": is_training}
        if op.endswith("V3"):
            kw["reserve_space_3"] = z(rs3 if rs3 is not None else rs1)
        return kw
    return make


def _frac(value, ratio, **kw):
    def make():
        args = {"value": value(), "pooling_ratio": ratio, "pseudo_random": False,
                "overlapping": False, "deterministic": False, "seed": 0, "seed2": 0}
        args.update(kw)
        return args
    return make


def _fapg(shape, grad, rows, cols, overlapping=True):
    return lambda: {"orig_input_tensor_shape": np.asarray(shape, i64), "out_backprop": grad(),
                    "row_pooling_sequence": np.asarray(rows, i64),
                    "col_pooling_sequence": np.asarray(cols, i64), "overlapping": overlapping}


def _fmpg(x, y, g, rows, cols, overlapping=True):
    return lambda: {"orig_input": x(), "orig_output": y(), "out_backprop": g(),
                    "row_pooling_sequence": np.asarray(rows, i64),
                    "col_pooling_sequence": np.asarray(cols, i64), "overlapping": overlapping}


def _dw_attrs(strides=(1, 1, 1, 1), padding="SAME", fmt="NHWC", dil=(1, 1, 1, 1), ep=()):
    return {"strides": list(strides), "padding": padding, "explicit_paddings": list(ep),
            "data_format": fmt, "dilations": list(dil)}


def _dw_bpf(x, sizes, g, **attrs):
    return lambda: {"input": x(), "filter_sizes": np.asarray(sizes, i32),
                    "out_backprop": g(), **_dw_attrs(**attrs)}


def _dw_bpi(sizes, w, g, **attrs):
    return lambda: {"input_sizes": np.asarray(sizes, i32), "filter": w(),
                    "out_backprop": g(), **_dw_attrs(**attrs)}


def _dw(x, w, **attrs):
    return lambda: {"input": x(), "filter": w(), **_dw_attrs(**attrs)}


A = Advisory
ADVISORIES: list[Advisory] = [
    # ---- FakeQuant: min/max of the wrong rank reached a CHECK in TF --------------------
    A(FQ_VARS, "poc_rank2_min_max", "FakeQuantWithMinMaxVars",
      _fq_vars(lambda: z((2, 3)), lambda: z((2, 3)))),
    A(FQ_VARS, "min_rank1", "FakeQuantWithMinMaxVars", _fq_vars(lambda: z((1,)), lambda: f32(6))),
    A(FQ_VARS, "max_rank1", "FakeQuantWithMinMaxVars", _fq_vars(lambda: f32(-6), lambda: z((1,)))),
    A(FQ_VARS, "min_empty", "FakeQuantWithMinMaxVars", _fq_vars(lambda: z((0,)), lambda: f32(6))),
    A(FQ_VARS, "max_rank2_1x1", "FakeQuantWithMinMaxVars",
      _fq_vars(lambda: f32(-6), lambda: z((1, 1), value=6))),
    A(FQ_VARS_GRAD, "poc_rank2_min_max", "FakeQuantWithMinMaxVarsGradient",
      _fq_vars_grad(lambda: r((2, 2), seed=3), lambda: r((2, 2), seed=4))),
    A(FQ_VARS_GRAD, "min_rank1", "FakeQuantWithMinMaxVarsGradient",
      _fq_vars_grad(lambda: z((1,)), lambda: f32(1))),
    A(FQ_VARS_GRAD, "max_empty", "FakeQuantWithMinMaxVarsGradient",
      _fq_vars_grad(lambda: f32(-1), lambda: z((0,)))),
    A(FQ_VARS_GRAD, "gradients_shape_differs", "FakeQuantWithMinMaxVarsGradient",
      _fq_vars_grad(lambda: f32(-1), lambda: f32(1), g=(2, 3))),
    A(FQ_VARS_GRAD, "gradients_same_size_other_shape", "FakeQuantWithMinMaxVarsGradient",
      _fq_vars_grad(lambda: f32(-1), lambda: f32(1), g=(4,), x=(2, 2))),
    A(FQ_PC, "poc_min_rank3_empty", "FakeQuantWithMinMaxVarsPerChannel",
      _fq_vars(lambda: z((4, 0, 0)), lambda: z((4,)), x=(4,))),
    A(FQ_PC, "min_rank0", "FakeQuantWithMinMaxVarsPerChannel",
      _fq_vars(lambda: f32(-1), lambda: z((4,), value=1), x=(4,))),
    A(FQ_PC, "max_rank2", "FakeQuantWithMinMaxVarsPerChannel",
      _fq_vars(lambda: z((4,), value=-1), lambda: z((4, 1), value=1), x=(2, 4))),
    A(FQ_PC, "min_size_mismatch", "FakeQuantWithMinMaxVarsPerChannel",
      _fq_vars(lambda: z((3,), value=-1), lambda: z((4,), value=1), x=(2, 4))),
    A(FQ_PC, "inputs_rank0", "FakeQuantWithMinMaxVarsPerChannel",
      _fq_vars(lambda: z((1,), value=-1), lambda: z((1,), value=1), x=()),
      note="a rank-0 input aborts TF (Check failed: d >= 0)"),
    A(FQ_PC_GRAD, "poc_rank2_min_max", "FakeQuantWithMinMaxVarsPerChannelGradient",
      _fq_vars_grad(lambda: r((1, 1), seed=3), lambda: r((1, 1), seed=4), g=(1, 1), x=(1, 1))),
    A(FQ_PC_GRAD, "min_rank0", "FakeQuantWithMinMaxVarsPerChannelGradient",
      _fq_vars_grad(lambda: f32(-1), lambda: z((2,), value=1), g=(3, 2), x=(3, 2))),
    A(FQ_PC_GRAD, "max_size_mismatch", "FakeQuantWithMinMaxVarsPerChannelGradient",
      _fq_vars_grad(lambda: z((2,), value=-1), lambda: z((3,), value=1), g=(3, 2), x=(3, 2))),
    A(FQ_PC_GRAD, "gradients_shape_differs", "FakeQuantWithMinMaxVarsPerChannelGradient",
      _fq_vars_grad(lambda: z((2,), value=-1), lambda: z((2,), value=1), g=(2, 2), x=(3, 2))),
    A(FQ_PC_GRAD, "inputs_rank0", "FakeQuantWithMinMaxVarsPerChannelGradient",
      _fq_vars_grad(lambda: z((1,), value=-1), lambda: z((1,), value=1), g=(), x=())),
    # ---- FusedBatchNorm: zero channels (division by 0 in TF) ---------------------------
    A(BN_FPE, "poc_zero_channels_inference", "FusedBatchNorm",
      _bn("FusedBatchNorm", (1, 1, 1, 0), (0,), (0,), (0,), (0,)), expect="ok",
      note="TF 2.21 returns empty outputs"),
    A(BN_FPE, "zero_channels_training_v2", "FusedBatchNormV2",
      _bn("FusedBatchNormV2", (1, 1, 1, 0), (0,), (0,), (0,), (0,), is_training=True),
      expect="ok"),
    A(BN_FPE, "zero_channels_nchw_v3", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (1, 0, 1, 1), (0,), (0,), (0,), (0,), fmt="NCHW"), expect="ok"),
    A(BN_FPE, "zero_everything_training", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (0, 0, 0, 0), (0,), (0,), (0,), (0,), is_training=True),
      expect="ok"),
    A(BN_FPE, "empty_batch_training", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (0, 2, 2, 3), (3,), (3,), (3,), (3,), is_training=True,
          eaf=0.5), expect="ok", note="TF: NaN running statistics"),
    A(BN_FPE, "grad_zero_channels", "FusedBatchNormGradV3",
      _bn_grad("FusedBatchNormGradV3", (1, 1, 1, 0), (1, 1, 1, 0), (0,), (0,), (0,),
               fmt="NHWC"), expect="ok"),
    # ---- FusedBatchNorm: per-channel inputs of the wrong size (heap OOB) ---------------
    A(BN_OOB, "poc_size1_for_6_channels", "FusedBatchNorm",
      _bn("FusedBatchNorm", (10, 10, 10, 6), (1,), (1,), (1,), (1,))),
    A(BN_OOB, "poc_empty_for_1_channel", "FusedBatchNorm",
      _bn("FusedBatchNorm", (10, 10, 10, 1), (0,), (0,), (0,), (0,))),
    A(BN_OOB, "offset_only_wrong", "FusedBatchNormV2",
      _bn("FusedBatchNormV2", (2, 2, 2, 3), (3,), (2,), (3,), (3,))),
    A(BN_OOB, "mean_wrong_inference", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (2, 2, 2, 3), (3,), (3,), (4,), (3,))),
    A(BN_OOB, "variance_wrong_with_ema", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (2, 2, 2, 3), (3,), (3,), (3,), (0,), is_training=True,
          eaf=0.5)),
    A(BN_OOB, "scale_rank2", "FusedBatchNorm",
      _bn("FusedBatchNorm", (2, 2, 2, 3), (1, 3), (3,), (3,), (3,))),
    A(BN_OOB, "nchw_channels_mismatch", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (2, 3, 2, 2), (2,), (2,), (2,), (2,), fmt="NCHW")),
    A(BN_OOB, "ndhwc_with_4d_x", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (2, 2, 2, 3), (3,), (3,), (3,), (3,), fmt="NDHWC"), expect="ok",
      note="TF 2.21 accepts a 4-D x with NDHWC"),
    A(BN_OOB, "x_rank3", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (2, 2, 3), (3,), (3,), (3,), (3,))),
    A(BN_OOB, "x_rank6", "FusedBatchNormV3",
      _bn("FusedBatchNormV3", (1, 1, 1, 1, 1, 3), (3,), (3,), (3,), (3,))),
    # ---- FusedBatchNormGrad: shapes not checked (heap OOB) -----------------------------
    A(BN_GRAD_OOB, "poc_dy_x_shapes_differ", "FusedBatchNormGrad",
      _bn_grad("FusedBatchNormGrad", (1, 1, 3, 3), (1, 1, 1, 2), (2,), (2,), (3,))),
    A(BN_GRAD_OOB, "reserve_space_2_size", "FusedBatchNormGrad",
      _bn_grad("FusedBatchNormGrad", (1, 2, 1, 2), (1, 2, 1, 2), (2,), (2,), (3,))),
    A(BN_GRAD_OOB, "reserve_space_1_rank2", "FusedBatchNormGradV2",
      _bn_grad("FusedBatchNormGradV2", (1, 2, 1, 2), (1, 2, 1, 2), (2,), (1, 2), (2,))),
    A(BN_GRAD_OOB, "scale_empty_v3", "FusedBatchNormGradV3",
      _bn_grad("FusedBatchNormGradV3", (4, 10, 10, 2), (4, 10, 10, 2), (0,), (2,), (2,),
               fmt="NHWC"),
      note="also tensorflow/tensorflow#58999 (segfault)"),
    A(BN_GRAD_OOB, "same_size_other_shape_v3", "FusedBatchNormGradV3",
      _bn_grad("FusedBatchNormGradV3", (1, 2, 2, 2), (1, 2, 4, 1), (1,), (1,), (1,),
               fmt="NHWC")),
    A(BN_GRAD_OOB, "x_rank3_v2", "FusedBatchNormGradV2",
      _bn_grad("FusedBatchNormGradV2", (2, 2, 2), (2, 2, 2), (2,), (2,), (2,), fmt="NHWC")),
    # ---- FractionalAvgPool / FractionalMaxPool: output size 0 (division by 0) ---------
    A(FAP_DIV0, "poc_ratio_above_dim", "FractionalAvgPool",
      _frac(lambda: np.array([60], i32).reshape(1, 1, 1, 1), [1.0, 1.0000014345305555, 1.0, 1.0])),
    A(FAP_DIV0, "same_for_max", "FractionalMaxPool",
      _frac(lambda: np.array([60], i32).reshape(1, 1, 1, 1), [1.0, 1.0000014345305555, 1.0, 1.0])),
    A(FAP_DIV0, "cols_pseudo_random", "FractionalAvgPool",
      _frac(lambda: z((1, 2, 2, 1), f64), [1.0, 1.0, 2.5, 1.0], pseudo_random=True)),
    A(FAP_DIV0, "empty_batch", "FractionalAvgPool",
      _frac(lambda: z((0, 4, 4, 1)), [1.0, 1.5, 1.5, 1.0])),
    A(FAP_DIV0, "empty_channels_overlapping", "FractionalMaxPool",
      _frac(lambda: z((1, 4, 4, 0)), [1.0, 1.5, 1.5, 1.0], overlapping=True)),
    A(FMP_DIV0, "poc_rows_1_ratio_1_44", "FractionalMaxPool",
      _frac(lambda: np.array([[[[1, 4, 2, 3]]]], i64), [1.0, 1.44, 1.73, 1.0])),
    A(FMP_DIV0, "same_for_avg", "FractionalAvgPool",
      _frac(lambda: np.array([[[[1, 4, 2, 3]]]], i64), [1.0, 1.44, 1.73, 1.0])),
    A(FMP_DIV0, "deterministic_seeded", "FractionalMaxPool",
      _frac(lambda: z((1, 3, 1, 1)), [1.0, 1.0, 1.5, 1.0], deterministic=True, seed=1,
            seed2=2)),
    # ---- pooling_ratio < 1 (heap OOB) and other malformed ratios -----------------------
    A(FP_RATIO, "ratio_below_1_max", "FractionalMaxPool",
      _frac(lambda: r((1, 3, 3, 1)), [1.0, 0.5, 1.0, 1.0])),
    A(FP_RATIO, "ratio_below_1_avg", "FractionalAvgPool",
      _frac(lambda: r((1, 3, 3, 1)), [1.0, 1.0, 0.999, 1.0])),
    A(FP_RATIO, "ratio_zero", "FractionalAvgPool",
      _frac(lambda: r((1, 3, 3, 1)), [1.0, 0.0, 1.5, 1.0])),
    A(FP_RATIO, "ratio_negative", "FractionalMaxPool",
      _frac(lambda: r((1, 3, 3, 1)), [1.0, -2.0, 1.5, 1.0])),
    A(FP_RATIO, "ratio_nan", "FractionalMaxPool",
      _frac(lambda: r((1, 3, 3, 1)), [1.0, float("nan"), 1.5, 1.0])),
    A(FP_RATIO, "ratio_inf", "FractionalAvgPool",
      _frac(lambda: r((1, 3, 3, 1)), [1.0, float("inf"), 1.5, 1.0])),
    A(FP_RATIO, "ratio_length_5", "FractionalMaxPool",
      _frac(lambda: r((1, 3, 3, 1)), [1.0, 1.5, 1.5, 1.0, 1.0])),
    A(FP_RATIO, "ratio_length_3", "FractionalMaxPool",
      _frac(lambda: r((1, 3, 3, 1)), [1.0, 1.5, 1.5])),
    A(FP_RATIO, "ratio_on_batch", "FractionalAvgPool",
      _frac(lambda: r((4, 3, 3, 1)), [2.0, 1.5, 1.5, 1.0])),
    A(FP_RATIO, "ratio_on_channels", "FractionalMaxPool",
      _frac(lambda: r((1, 3, 3, 4)), [1.0, 1.5, 1.5, 2.0])),
    A(FP_RATIO, "value_rank3", "FractionalMaxPool",
      _frac(lambda: r((3, 3, 1)), [1.0, 1.5, 1.5, 1.0])),
    # ---- FractionalAvgPoolGrad ---------------------------------------------------------
    A(FAPG_SEQ, "poc_sequences_too_short", "FractionalAvgPoolGrad",
      _fapg([1, 3, 2, 3], lambda: z((1, 1, 1, 1), i64, 2), [1], [1], overlapping=False)),
    A(FAPG_SEQ, "cols_too_short", "FractionalAvgPoolGrad",
      _fapg([1, 4, 4, 1], lambda: z((1, 2, 2, 1)), [0, 2, 4], [0, 4])),
    A(FAPG_SEQ, "rows_rank2", "FractionalAvgPoolGrad",
      _fapg([1, 4, 4, 1], lambda: z((1, 2, 2, 1)), [[0, 2, 4]], [0, 2, 4]), expect="either",
      note="TF 2.21 flattens it and computes; tfgrad requires a vector, as MaxGrad does"),
    A(FAPG_SEQ, "sequences_empty", "FractionalAvgPoolGrad",
      _fapg([1, 4, 4, 1], lambda: z((1, 2, 2, 1)), [], [])),
    A(FAPG_EMPTY, "poc_empty_orig_batch", "FractionalAvgPoolGrad",
      _fapg([0, 1, 2, 3], lambda: np.array([[[[541], [541]], [[541], [541]]]]),
            [0, 0, 0, 0, 0], [-2, 0, 0, 2, 0])),
    A(FAPG_EMPTY, "empty_orig_rows", "FractionalAvgPoolGrad",
      _fapg([1, 0, 2, 1], lambda: z((1, 1, 1, 1)), [0, 1], [0, 2])),
    A(FAPG_EMPTY, "empty_orig_depth", "FractionalAvgPoolGrad",
      _fapg([1, 2, 2, 0], lambda: z((1, 1, 1, 1)), [0, 2], [0, 2])),
    A(FAPG_EMPTY, "empty_out_backprop", "FractionalAvgPoolGrad",
      _fapg([1, 2, 2, 1], lambda: z((1, 0, 1, 1)), [0, 2], [0, 2])),
    A(FAPG_NEG, "poc_negative_row", "FractionalAvgPoolGrad",
      _fapg([2, 2, 2, 2], lambda: np.arange(1, 13, dtype=i32).reshape(1, 2, 3, 2),
            [-10, 1, 2, 3], [1, 2, 3, 4])),
    A(FAPG_NEG, "negative_col", "FractionalAvgPoolGrad",
      _fapg([1, 2, 2, 1], lambda: z((1, 1, 1, 1)), [0, 2], [-1, 2])),
    A(FAPG_NEG, "huge_negative_end", "FractionalAvgPoolGrad",
      _fapg([1, 2, 2, 1], lambda: z((1, 1, 1, 1)), [0, -(2**62)], [0, 2])),
    A(FAPG_NEG, "huge_positive_values", "FractionalAvgPoolGrad",
      _fapg([1, 3, 3, 1], lambda: z((1, 1, 2, 1), value=9), [0, 2**62], [2**62, 1, 3]),
      expect="either", note="TF clamps ends to the input and skips empty cells; tfgrad "
      "rejects values outside [0, input size] on purpose"),
    A(FAPG_NEG, "decreasing_sequence", "FractionalAvgPoolGrad",
      _fapg([1, 3, 3, 1], lambda: z((1, 2, 2, 1), value=9), [0, 3, 1], [0, 2, 3]),
      expect="either", note="TF skips cells whose start is past their end; tfgrad "
      "requires strictly increasing sequences on purpose"),
    A(FAPG_SHAPE, "poc_negative_orig_shape", "FractionalAvgPoolGrad",
      _fapg([-1879048192] * 4, lambda: z((0, 0, 0, 0), f64), [1, 1, 1, 1], [1, 1, 1, 1])),
    A(FAPG_SHAPE, "orig_shape_overflows_int64", "FractionalAvgPoolGrad",
      _fapg([2**62, 2**62, 2**62, 2**62], lambda: z((1, 1, 1, 1), f64), [0, 1], [0, 1])),
    A(FAPG_SHAPE, "orig_shape_3_elements", "FractionalAvgPoolGrad",
      _fapg([1, 2, 2], lambda: z((1, 1, 1, 1)), [0, 2], [0, 2])),
    A(FAPG_SHAPE, "orig_shape_rank2", "FractionalAvgPoolGrad",
      _fapg([[1, 2], [2, 1]], lambda: z((1, 1, 1, 1)), [0, 2], [0, 2])),
    A(FAPG_SHAPE, "out_backprop_rank3", "FractionalAvgPoolGrad",
      _fapg([1, 2, 2, 1], lambda: z((1, 1, 1)), [0, 2], [0, 2])),
    A(FAPG_SHAPE, "out_backprop_batch_exceeds_orig", "FractionalAvgPoolGrad",
      _fapg([1, 2, 2, 1], lambda: z((3, 1, 1, 1)), [0, 2], [0, 2]), expect="either",
      note="TF 2.21 aborts (signal 6): it does not compare out_backprop's batch/depth "
      "with the original shape"),
    # ---- FractionalMaxPoolGrad ---------------------------------------------------------
    A(FMPG_EMPTY, "empty_orig_input", "FractionalMaxPoolGrad",
      _fmpg(lambda: z((0, 3, 3, 1)), lambda: z((0, 2, 2, 1)), lambda: z((0, 2, 2, 1)),
            [0, 2, 3], [0, 2, 3])),
    A(FMPG_EMPTY, "empty_orig_output", "FractionalMaxPoolGrad",
      _fmpg(lambda: z((1, 3, 3, 1)), lambda: z((1, 0, 2, 1)), lambda: z((1, 0, 2, 1)),
            [0], [0, 2, 3])),
    A(FMPG_EMPTY, "orig_output_rank3", "FractionalMaxPoolGrad",
      _fmpg(lambda: z((1, 3, 3, 1)), lambda: z((2, 2, 1)), lambda: z((2, 2, 1)),
            [0, 2, 3], [0, 2, 3])),
    A(FMPG_EMPTY, "orig_input_rank5", "FractionalMaxPoolGrad",
      _fmpg(lambda: z((1, 1, 3, 3, 1)), lambda: z((1, 2, 2, 1)), lambda: z((1, 2, 2, 1)),
            [0, 2, 3], [0, 2, 3])),
    A(FMPG_CHECK, "poc_sequences_do_not_match", "FractionalMaxPoolGrad",
      _fmpg(lambda: z((1, 7, 13, 1), value=.453409232), lambda: z((1, 7, 13, 1), value=.453409232),
            lambda: z((1, 7, 13, 1), value=.453409232), [0] * 5, [0] * 5)),
    A(FMPG_CHECK, "out_backprop_larger_than_output", "FractionalMaxPoolGrad",
      _fmpg(lambda: r((1, 4, 4, 1)), lambda: z((1, 2, 2, 1), value=1),
            lambda: z((1, 3, 3, 1), value=1), [0, 2, 4], [0, 2, 4]),
      note="TF has no check and reads uninitialized argmax memory"),
    A(FMPG_CHECK, "sequences_too_short", "FractionalMaxPoolGrad",
      _fmpg(lambda: r((1, 4, 4, 1)), lambda: z((1, 2, 2, 1)), lambda: z((1, 2, 2, 1)),
            [0, 4], [0, 2, 4])),
    A(FMPG_CHECK, "output_not_the_forward_max", "FractionalMaxPoolGrad",
      _fmpg(lambda: np.arange(16, dtype=f32).reshape(1, 4, 4, 1), lambda: z((1, 2, 2, 1), value=-7),
            lambda: z((1, 2, 2, 1), value=1), [0, 2, 4], [0, 2, 4])),
    A(FMPG_OOB, "poc_huge_negative_sequence", "FractionalMaxPoolGrad",
      _fmpg(lambda: np.array([[[[1, 1, 1, 1, 1]]]], i32), lambda: np.array([[[[1, 1, 1]]]], i32),
            lambda: np.array([[[[3], [3], [6]]]], i32), [-0x4000000, 1, 1], [-0x4000000, 1, 1],
            overlapping=False)),
    A(FMPG_OOB, "negative_col", "FractionalMaxPoolGrad",
      _fmpg(lambda: r((1, 4, 4, 1)), lambda: z((1, 2, 2, 1)), lambda: z((1, 2, 2, 1)),
            [0, 2, 4], [-1, 2, 4])),
    A(FMPG_OOB, "huge_positive_sequence", "FractionalMaxPoolGrad",
      _fmpg(lambda: r((1, 4, 4, 1)), lambda: z((1, 2, 2, 1)), lambda: z((1, 2, 2, 1)),
            [0, 2, 2**62], [0, 2, 4])),
    A(FMPG_OOB, "sequence_int64_min", "FractionalMaxPoolGrad",
      _fmpg(lambda: r((1, 4, 4, 1)), lambda: z((1, 2, 2, 1)), lambda: z((1, 2, 2, 1)),
            [0, 2, 4], [-(2**63), 2, 4]), note="still a segfault in TF 2.21"),
    # ---- DepthwiseConv2dNative* (Conv2D backprop advisories, TFLite, large shapes) -----
    A(CONV_BPF_OOB, "huge_unequal_strides", "DepthwiseConv2dNativeBackpropFilter",
      _dw_bpf(lambda: np.array([386.078431372549, 386.07843139643234], f32).reshape(1, 1, 1, 2),
              [1, 1, 2, 1], lambda: z((1, 1, 1, 2), value=386.07843), strides=(1, 66, 49, 1),
              padding="VALID"), expect="either"),
    A(CONV_BPF_OOB, "out_backprop_too_small", "DepthwiseConv2dNativeBackpropFilter",
      _dw_bpf(lambda: r((1, 4, 4, 2)), [3, 3, 2, 1], lambda: z((1, 1, 1, 2)), padding="VALID")),
    A(CONV_BPF_OOB, "filter_sizes_depth_mismatch", "DepthwiseConv2dNativeBackpropFilter",
      _dw_bpf(lambda: r((1, 4, 4, 2)), [1, 1, 3, 1], lambda: z((1, 4, 4, 3)))),
    A(CONV_BPF_DIV0, "all_empty", "DepthwiseConv2dNativeBackpropFilter",
      _dw_bpf(lambda: z((0, 0, 0, 0)), [0, 0, 0, 0], lambda: z((0, 0, 0, 0))),
      expect="ok"),
    A(CONV_BPF_DIV0, "filter_sizes_negative", "DepthwiseConv2dNativeBackpropFilter",
      _dw_bpf(lambda: r((1, 4, 4, 2)), [-1, 1, 2, 1], lambda: z((1, 4, 4, 2)))),
    A(CONV_BPF_DIV0, "filter_sizes_3_elements", "DepthwiseConv2dNativeBackpropFilter",
      _dw_bpf(lambda: r((1, 4, 4, 2)), [1, 1, 2], lambda: z((1, 4, 4, 2)))),
    A(CONV_BPI_DIV0, "all_empty", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([0, 0, 0, 0], lambda: z((0, 0, 0, 0)), lambda: z((0, 0, 0, 0))),
      expect="ok"),
    A(CONV_BPI_DIV0, "input_sizes_negative", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([1, -4, 4, 2], lambda: z((1, 1, 2, 1)), lambda: z((1, 4, 4, 2)))),
    A(CONV_BPI_DIV0, "input_sizes_rank2", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([[1, 4], [4, 2]], lambda: z((1, 1, 2, 1)), lambda: z((1, 4, 4, 2)))),
    A(CONV_BPI_DIV0, "input_sizes_2_elements", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([4, 4], lambda: z((1, 1, 2, 1)), lambda: z((1, 4, 4, 2)))),
    A(CONV_BPI_DIV0, "out_backprop_rows_mismatch", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([1, 4, 4, 2], lambda: z((1, 1, 2, 1)), lambda: z((1, 3, 4, 2)))),
    A(CONV_BPI_DIV0, "multiplier_mismatch", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([1, 4, 4, 2], lambda: z((1, 1, 2, 2)), lambda: z((1, 4, 4, 2)))),
    A(CONV_DIV0, "all_empty", "DepthwiseConv2dNative",
      _dw(lambda: z((0, 0, 0, 0)), lambda: z((0, 0, 0, 0))), expect="either"),
    A(CONV_DIV0, "depth_mismatch", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((1, 1, 3, 1)))),
    A(CONV_DIV0, "negative_output_size", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 2, 2, 1)), lambda: z((4, 4, 1, 1)), padding="VALID")),
    A(TFLITE_DW, "stride_zero", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), strides=(1, 0, 0, 1))),
    A(TFLITE_DW, "stride_negative", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), strides=(1, -1, -1, 1))),
    A(TFLITE_DW, "dilation_zero", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), dil=(1, 0, 0, 1))),
    A(TFLITE_DW, "dilation_negative_valid", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), dil=(1, -3, -3, 1),
          padding="VALID")),
    A(TFLITE_DW, "stride_zero_backprop_filter", "DepthwiseConv2dNativeBackpropFilter",
      _dw_bpf(lambda: r((1, 4, 4, 2)), [2, 2, 2, 1], lambda: z((1, 4, 4, 2)),
              strides=(1, 0, 0, 1))),
    A(TFLITE_DW, "explicit_padding_negative", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), padding="EXPLICIT",
          ep=(0, 0, -3, 0, 0, 0, 0, 0))),
    A(TFLITE_DW, "explicit_padding_on_batch", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), padding="EXPLICIT",
          ep=(1, 0, 0, 0, 0, 0, 0, 0))),
    A(TFLITE_DW, "explicit_padding_4_values", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), padding="EXPLICIT",
          ep=(0, 0, 1, 1))),
    A(DW_ISSUE, "stride_zero_dilations_5", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([1, 4, 4, 2], lambda: z((1, 1, 2, 1)), lambda: z((1, 4, 4, 2)),
              strides=(1, 0, 1, 1), padding="VALID", dil=(1, 0, 77, 1, 64))),
    A(DW_ISSUE, "strides_length_3", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([1, 4, 4, 2], lambda: z((1, 1, 2, 1)), lambda: z((1, 4, 4, 2)),
              strides=(1, 1, 1))),
    A(LARGE, "input_sizes_int32_max", "DepthwiseConv2dNativeBackpropInput",
      _dw_bpi([2**31 - 1] * 4, lambda: z((1, 1, 1, 1)), lambda: z((1, 1, 1, 1)))),
    A(LARGE, "filter_sizes_int32_max", "DepthwiseConv2dNativeBackpropFilter",
      _dw_bpf(lambda: r((1, 2, 2, 1)), [2**31 - 1] * 4, lambda: z((1, 2, 2, 1)))),
    A(LARGE, "strides_int64_max", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), strides=(1, 2**63 - 1, 2**63 - 1, 1),
          padding="VALID"), expect="either"),
    A(LARGE, "dilations_int64_max", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), dil=(1, 2**62, 2**62, 1),
          padding="VALID")),
    A(LARGE, "explicit_padding_int64_max", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 4, 4, 2)), lambda: z((2, 2, 2, 1)), padding="EXPLICIT",
          ep=(0, 0, 2**63 - 1, 2**63 - 1, 0, 0, 0, 0))),
    A(LARGE, "explicit_padding_int64_max_empty_output", "DepthwiseConv2dNative",
      _dw(lambda: r((1, 5, 5, 1)), lambda: z((3, 2, 1, 0)), padding="EXPLICIT",
          strides=(1, 2, 2, 1), ep=(0, 0, 0, 2**63 - 1, 2, 1, 0, 0)),
      note="output (1, 2**62, 3, 0): empty, but NumPy cannot create it (ValueError)"),
    A(LARGE, "fractional_seed_extremes", "FractionalMaxPool",
      _frac(lambda: r((1, 5, 5, 1)), [1.0, 1.5, 1.5, 1.0], deterministic=True,
            seed=-(2**63), seed2=2**63 - 1), expect="ok"),
]


def _readonly(kwargs: dict[str, Any]) -> dict[str, Any]:
    for v in kwargs.values():
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return kwargs


_REJECTED = {f"error:{name}" for name, c in vars(tfgrad.errors).items()
             if isinstance(c, type) and issubclass(c, tfgrad.InvalidArgumentError)}
"""An InvalidArgumentError, or one of TF's classes tfgrad raises (all subclasses of it)."""


@pytest.mark.parametrize("adv", ADVISORIES, ids=lambda a: a.id)
def test_advisory(adv: Advisory):
    kwargs = _readonly(adv.make())
    outcome = check_call(adv.op, kwargs)  # no crash, no other exception, inputs unchanged
    if adv.expect == "error":
        assert outcome in _REJECTED, (
            f"{adv.ref}: {adv.op} should reject this with InvalidArgumentError, got {outcome}")
    elif adv.expect == "ok":
        assert outcome == "ok", f"{adv.ref}: TF 2.21 computes this; tfgrad gave {outcome}"
    else:
        assert outcome == "ok" or outcome in _REJECTED, outcome


def test_advisory_errors_name_the_problem():
    """A clean error: a message that names the op or an argument, not an internal error."""
    for adv in ADVISORIES:
        if adv.expect != "error":
            continue
        with pytest.raises(tfgrad.InvalidArgumentError) as info:
            getattr(tfgrad.raw_ops, adv.op)(**adv.make())
        msg = str(info.value)
        assert len(msg) > 10 and "Traceback" not in msg, (adv.id, msg)


# --------------------------------------------------------------------------------------
# Memory bounds: sizes taken from input values are checked before allocating
# --------------------------------------------------------------------------------------
LIMIT = 1 << 24  # 16 MiB for these tests
# Broadcast inputs below are 2**26 elements (256 MiB if an op copied them): over LIMIT,
# yet harmless to the machine if a family does materialize them.

BOUNDED: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
    ("DepthwiseConv2dNativeBackpropInput", "input_sizes",
     _dw_bpi([1, 100_000, 100_000, 1], lambda: z((1, 1, 1, 1)), lambda: z((1, 1, 1, 1)),
             strides=(1, 100_000, 100_000, 1), padding="VALID")),
    ("DepthwiseConv2dNativeBackpropInput", "input_sizes_batch",
     _dw_bpi([2**26, 1, 1, 1], lambda: z((1, 1, 1, 1)),
             lambda: np.broadcast_to(f32(1), (2**26, 1, 1, 1)))),
    ("DepthwiseConv2dNativeBackpropFilter", "filter_sizes",
     _dw_bpf(lambda: z((1, 1, 1, 1)), [100_000, 100_000, 1, 1], lambda: z((1, 1, 1, 1)))),
    ("DepthwiseConv2dNativeBackpropFilter", "filter_sizes_multiplier",
     _dw_bpf(lambda: z((1, 1, 1, 1)), [1, 1, 1, 2**26],
             lambda: np.broadcast_to(f32(1), (1, 1, 1, 2**26)))),
    ("FractionalAvgPoolGrad", "orig_input_tensor_shape",
     _fapg([1, 100_000, 100_000, 1], lambda: z((1, 1, 1, 1)), [0, 100_000], [0, 100_000])),
    ("FractionalAvgPoolGrad", "orig_input_tensor_shape_int64",
     _fapg([1, 2**20, 2**20, 1], lambda: z((1, 1, 1, 1), f64), [0, 2**20], [0, 2**20])),
    ("FractionalAvgPoolGrad", "overflow:orig_input_tensor_shape_2**80",
     _fapg([1, 2**40, 2**40, 1], lambda: z((1, 1, 1, 1), f64), [0, 2**40], [0, 2**40])),
    ("DepthwiseConv2dNative", "explicit_paddings",
     _dw(lambda: z((1, 1, 1, 1)), lambda: z((1, 1, 1, 1)), padding="EXPLICIT",
         ep=(0, 0, 50_000, 50_000, 50_000, 50_000, 0, 0))),
    ("DepthwiseConv2dNative", "broadcast_input",
     _dw(lambda: np.broadcast_to(f32(1), (1, 2**13, 2**13, 1)), lambda: z((1, 1, 1, 1)))),
    ("FractionalMaxPoolGrad", "broadcast_orig_input",
     _fmpg(lambda: np.broadcast_to(f32(1), (1, 2**13, 2**13, 1)), lambda: z((1, 1, 1, 1), value=1),
           lambda: z((1, 1, 1, 1)), [0, 2**13], [0, 2**13])),
]


def _big(shape: tuple[int, ...] = (1, 2**13, 2**13, 1), dtype: Any = f32) -> np.ndarray:
    """2**26 elements (256 MiB as float32) that take no memory."""
    return np.broadcast_to(np.ones((), dtype), shape)


def _broadcast_call(op: str) -> dict[str, Any]:
    """A call whose first output is as large as a broadcast input, far over LIMIT."""
    if op.startswith("FakeQuant"):
        kw: dict[str, Any] = {"inputs": _big((2**13, 2**13))}
        if "Gradient" in op:
            kw["gradients"] = _big((2**13, 2**13))
        if "PerChannel" in op:
            kw["min"], kw["max"] = np.full(2**13, -1, f32), np.full(2**13, 1, f32)
        elif "Vars" in op:
            kw["min"], kw["max"] = np.array(-1, f32), np.array(1, f32)
        return kw
    one = np.ones(1, f32)
    if op.startswith("FusedBatchNormGrad"):
        kw = {"y_backprop": _big(), "x": _big(), "scale": one, "reserve_space_1": one,
              "reserve_space_2": one}
        if op.endswith("V3"):
            kw["reserve_space_3"] = one
        return kw
    if op.startswith("FusedBatchNorm"):
        return {"x": _big(), "scale": one, "offset": one, "mean": one, "variance": one}
    if op in ("FractionalAvgPool", "FractionalMaxPool"):
        return {"value": _big(), "pooling_ratio": [1.0, 1.5, 1.5, 1.0], "deterministic": True,
                "seed": 1, "seed2": 1}
    raise KeyError(op)


# A float64 input of a float32 op is converted by the shared argument binding first.
BOUNDED.append(("FakeQuantWithMinMaxArgs", "broadcast_float64_input",
                lambda: {"inputs": _big((2**13, 2**13), f64)}))

for _op in sorted(tfgrad._opdefs.OPS):
    if _op.startswith(("FakeQuant", "FusedBatchNorm")) or _op in ("FractionalAvgPool",
                                                                    "FractionalMaxPool"):
        BOUNDED.append((_op, "broadcast", lambda _op=_op: _broadcast_call(_op)))


@pytest.mark.parametrize("op,what,make", BOUNDED, ids=lambda v: v if isinstance(v, str) else "")
def test_output_size_is_bounded(op, what, make, monkeypatch):
    """An output larger than TFGRAD_MAX_BYTES raises ResourceLimitError, before allocating.

    This holds for every op, also where the output is as large as an input: a broadcast
    (stride-0) input has a large logical size without using memory.
    """
    monkeypatch.setenv("TFGRAD_MAX_BYTES", str(LIMIT))
    kwargs = make()
    import tracemalloc

    tracemalloc.start()
    try:
        getattr(tfgrad.raw_ops, op)(**kwargs)
    except tfgrad.InvalidArgumentError as e:
        err = e
    else:
        pytest.fail(f"{op} ({what}): computed an output over TFGRAD_MAX_BYTES={LIMIT} "
                    "instead of raising ResourceLimitError")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 4 * LIMIT, f"{op} allocated {peak} bytes before refusing"
    if not what.startswith("overflow:"):  # element counts beyond int64: any clean error
        assert isinstance(err, tfgrad.ResourceLimitError), (
            f"{op}: {what} giving an output over TFGRAD_MAX_BYTES should raise "
            f"ResourceLimitError, got {type(err).__name__}: {err}")


def test_limit_is_configurable(monkeypatch):
    """The same call passes under a larger limit (the limit is what refuses it)."""
    make = _fapg([1, 600, 600, 1], lambda: z((1, 1, 1, 1)), [0, 600], [0, 600])
    monkeypatch.setenv("TFGRAD_MAX_BYTES", str(600 * 600 * 4 - 1))
    with pytest.raises(tfgrad.ResourceLimitError):
        tfgrad.raw_ops.FractionalAvgPoolGrad(**make())
    monkeypatch.setenv("TFGRAD_MAX_BYTES", str(600 * 600 * 8 * 2))
    out = tfgrad.raw_ops.FractionalAvgPoolGrad(**make())
    assert out.shape == (1, 600, 600, 1)


def test_expected_outputs_helper():
    """The shape oracle used above agrees with the op table on a simple call."""
    kw = _bn("FusedBatchNormV3", (2, 2, 2, 3), (3,), (3,), (3,), (3,))()
    shapes = [s for s, _ in expected_outputs("FusedBatchNormV3", kw)]
    assert shapes == [(2, 2, 2, 3), (3,), (3,), (3,), (3,), ()]
    with pytest.raises(PropertyViolation):
        expected_outputs("FractionalAvgPoolGrad",
                         _fapg([1, 2, 2], lambda: z((1, 1, 1, 1)), [0, 2], [0, 2])())



COPIES: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
    ("DepthwiseConv2dNativeBackpropFilter", "filter_sizes_4096_values",
     _dw_bpf(lambda: r((1, 4, 4, 2)), [1], lambda: z((1, 4, 4, 2)))),
    ("DepthwiseConv2dNativeBackpropInput", "input_sizes_4096_values",
     _dw_bpi([1], lambda: z((1, 1, 2, 1)), lambda: z((1, 4, 4, 2)))),
    ("DepthwiseConv2dNative", "broadcast_filter_empty_output",
     _dw(lambda: z((3, 0, 3, 2), f64), lambda: np.broadcast_to(f64(1), (1, 3, 2, 2**22)),
         strides=(1, 3, 3, 1), dil=(1, 2, 2, 1))),
]


@pytest.mark.parametrize("op,what,make", COPIES, ids=lambda v: v if isinstance(v, str) else "")
def test_inputs_are_not_expanded_without_bound(op, what, make, monkeypatch):
    """A long shape vector or a broadcast input is rejected (or, for an empty output,
    computed) without converting, copying or formatting it in full: time and memory stay
    small under the default limit (the machine's available memory)."""
    import time
    import tracemalloc

    monkeypatch.delenv("TFGRAD_MAX_BYTES", raising=False)
    kwargs = make()
    for k in ("filter_sizes", "input_sizes"):
        if what.startswith(k):  # a message listing every value per value is quadratic
            kwargs[k] = np.broadcast_to(np.int32(2), (4096,))
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        outcome = check_call(op, kwargs)
    finally:
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 4 * LIMIT, f"{op} ({what}) allocated {peak} bytes"
    assert seconds < 2, f"{op} ({what}) took {seconds:.1f} s"
    assert outcome == "ok" or outcome in _REJECTED, outcome
