"""The op-definition table: one declarative entry per op, as TF's ``REGISTER_OP``.

Each :class:`OpDef` names the op's inputs (with their dtype or the type attr that
gives it), its attrs (type, default, allowed values or range) and its outputs, in
TensorFlow 2.21's order and spelling. The table drives argument validation
(:mod:`tfgrad._validate`), the generated ``tfgrad.raw_ops`` and snake_case
functions (their signatures and docstrings) and ``python -m tfgrad ops``.

Dtypes are named as NumPy names them (``"float32"``, ``"bfloat16"`` from ml_dtypes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Marker for an attr without a default (the caller must pass it)."""

FLOATS_HALF = ("float16", "bfloat16", "float32")
FLOATS_ALL = ("float16", "bfloat16", "float32", "float64")
POOL_TYPES = ("float32", "float64", "int32", "int64")


@dataclass(frozen=True)
class Input:
    name: str
    dtype: str | None = None
    """Fixed dtype of the input, or None when ``type_attr`` gives it."""
    type_attr: str | None = None
    doc: str = ""
    is_shape: bool = False
    """The input holds a shape (TF keeps it in host memory): the framework adapters take
    it as a list of ints, so that output shapes are known without reading a tensor."""


@dataclass(frozen=True)
class TypeAttr:
    """A dtype attr (``T``, ``U``), inferred from the inputs as TF's Python binding does."""

    name: str
    allowed: tuple[str, ...]


@dataclass(frozen=True)
class Attr:
    name: str
    type: str
    """One of ``int``, ``float``, ``bool``, ``string``, ``list(int)``, ``list(float)``."""
    default: Any = REQUIRED
    allowed: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    doc: str = ""


@dataclass(frozen=True)
class Output:
    name: str
    dtype: str | None = None
    type_attr: str | None = None
    doc: str = ""
    shape: str = ""
    """How the output's shape follows from the inputs (:mod:`tfgrad._shapes`): ``"like
    <input>"``, ``"values of <input>"`` (a shape input), ``"()"`` or ``"(0,)"``; empty
    where the family's ``output_shapes`` computes it."""


@dataclass(frozen=True)
class OpDef:
    name: str
    family: str
    """Module under ``tfgrad.ops`` (and ``tfgrad.kernels``) that implements the op."""
    inputs: tuple[Input, ...]
    attrs: tuple[Attr, ...]
    outputs: tuple[Output, ...]
    type_attrs: tuple[TypeAttr, ...] = ()
    summary: str = ""
    description: str = ""
    notes: tuple[str, ...] = field(default=())
    """Where tfgrad deliberately differs from (goes beyond) TF's CPU kernel."""

    @property
    def snake_name(self) -> str:
        return snake_case(self.name)

    def type_attr(self, name: str) -> TypeAttr:
        for t in self.type_attrs:
            if t.name == name:
                return t
        raise KeyError(name)

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)


def snake_case(op_name: str) -> str:
    """TF's generated-wrapper name: ``FusedBatchNormV3`` -> ``fused_batch_norm_v3``."""
    # (an underscore before a capital that follows a lower-case letter, or that starts a
    # word after a digit or an acronym: Conv2DBackpropInput -> conv2d_backprop_input)
    s = re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z0-9])(?=[A-Z][a-z])", "_", op_name)
    return s.lower()


# --------------------------------------------------------------------------------------
# Fake quantization
# --------------------------------------------------------------------------------------
_FQ_BITS = Attr(
    "num_bits", "int", 8, minimum=2, maximum=16,
    doc="Bit width of the quantization, between 2 and 16 inclusive.",
)
_FQ_NARROW = Attr(
    "narrow_range", "bool", False,
    doc="Quantize into [1, 2^num_bits - 1] instead of [0, 2^num_bits - 1].",
)
_FQ_ARGS_ATTRS = (
    Attr("min", "float", -6.0, doc="Lower end of the quantization range (float32)."),
    Attr("max", "float", 6.0, doc="Upper end of the quantization range (float32)."),
    _FQ_BITS,
    _FQ_NARROW,
)
_FQ_DESC = (
    "The range [min, max] is first nudged so that 0.0 is exactly representable: "
    "scale = (max - min) / (quant_max - quant_min), zero point = "
    "round_half_away(quant_min - min / scale) clamped to [quant_min, quant_max], "
    "nudged_min = (quant_min - zero_point) * scale, nudged_max = (quant_max - zero_point) * "
    "scale. Inputs are clamped to [nudged_min, nudged_max] and rounded half up to the grid "
    "of step scale. All arithmetic is float32, as TF's kernel. The result can lie outside "
    "[min, max] (it lies in the nudged range)."
)
_FQ_GRAD_DESC = (
    "Gradients pass where nudged_min <= inputs <= nudged_max (the nudged range, inclusive), "
    "not where min <= inputs <= max as TF's public docs say. "
)

FAKE_QUANT = (
    OpDef(
        "FakeQuantWithMinMaxArgs", "fake_quant",
        inputs=(Input("inputs", "float32", doc="Values to quantize."),),
        attrs=_FQ_ARGS_ATTRS,
        outputs=(Output("outputs", "float32", shape="like inputs"),),
        summary="Fake-quantize the 'inputs' tensor of type float to 'outputs' of the same type.",
        description=_FQ_DESC + " Requires min < max.",
    ),
    OpDef(
        "FakeQuantWithMinMaxArgsGradient", "fake_quant",
        inputs=(
            Input("gradients", "float32", doc="Backpropagated gradients above the op."),
            Input("inputs", "float32", doc="Values passed as inputs to the forward op."),
        ),
        attrs=_FQ_ARGS_ATTRS,
        outputs=(Output("backprops", "float32", shape="like inputs"),),
        summary="Compute gradients for a FakeQuantWithMinMaxArgs operation.",
        description=_FQ_GRAD_DESC + "backprops = gradients * (nudged_min <= inputs <= nudged_max).",
    ),
    OpDef(
        "FakeQuantWithMinMaxVars", "fake_quant",
        inputs=(
            Input("inputs", "float32", doc="Values to quantize."),
            Input("min", "float32", doc="Scalar lower end of the range."),
            Input("max", "float32", doc="Scalar upper end of the range."),
        ),
        attrs=(_FQ_BITS, _FQ_NARROW),
        outputs=(Output("outputs", "float32", shape="like inputs"),),
        summary="Fake-quantize the 'inputs' tensor of type float via global float scalars.",
        description=_FQ_DESC + " Unlike the Args op, the grid position is computed by dividing "
        "by scale (not multiplying by its separately computed inverse), so results can differ "
        "by one step. min == max == 0 gives zeros; TF does not check min < max.",
    ),
    OpDef(
        "FakeQuantWithMinMaxVarsGradient", "fake_quant",
        inputs=(
            Input("gradients", "float32", doc="Backpropagated gradients above the op."),
            Input("inputs", "float32", doc="Values passed as inputs to the forward op."),
            Input("min", "float32", doc="Scalar lower end of the range."),
            Input("max", "float32", doc="Scalar upper end of the range."),
        ),
        attrs=(_FQ_BITS, _FQ_NARROW),
        outputs=(
            Output("backprops_wrt_input", "float32", shape="like inputs"),
            Output("backprop_wrt_min", "float32", shape="like min"),
            Output("backprop_wrt_max", "float32", shape="like max"),
        ),
        summary="Compute gradients for a FakeQuantWithMinMaxVars operation.",
        description=_FQ_GRAD_DESC + "backprop_wrt_min = sum(gradients * (inputs < nudged_min)), "
        "backprop_wrt_max = sum(gradients * (inputs > nudged_max)), summed in float32 in "
        "Eigen's reduction order.",
    ),
    OpDef(
        "FakeQuantWithMinMaxVarsPerChannel", "fake_quant",
        inputs=(
            Input("inputs", "float32", doc="Values to quantize; channels are the last dimension."),
            Input("min", "float32", doc="Lower ends of the ranges, shape [d]."),
            Input("max", "float32", doc="Upper ends of the ranges, shape [d]."),
        ),
        attrs=(_FQ_BITS, _FQ_NARROW),
        outputs=(Output("outputs", "float32", shape="like inputs"),),
        summary="Fake-quantize 'inputs' per channel (last dimension) with ranges min[d], max[d].",
        description=_FQ_DESC + " Any rank >= 1 is accepted (TF documents [d], [b, d], "
        "[b, h, w, d]); a rank-0 input, which aborts TF's process, is an InvalidArgumentError.",
    ),
    OpDef(
        "FakeQuantWithMinMaxVarsPerChannelGradient", "fake_quant",
        inputs=(
            Input("gradients", "float32", doc="Backpropagated gradients above the op."),
            Input("inputs", "float32", doc="Values passed as inputs to the forward op."),
            Input("min", "float32", doc="Lower ends of the ranges, shape [d]."),
            Input("max", "float32", doc="Upper ends of the ranges, shape [d]."),
        ),
        attrs=(_FQ_BITS, _FQ_NARROW),
        outputs=(
            Output("backprops_wrt_input", "float32", shape="like inputs"),
            Output("backprop_wrt_min", "float32", shape="like min"),
            Output("backprop_wrt_max", "float32", shape="like max"),
        ),
        summary="Compute gradients for a FakeQuantWithMinMaxVarsPerChannel operation.",
        description=_FQ_GRAD_DESC + "The per-channel sums run in float32 in Eigen's reduction "
        "order over each channel's column.",
    ),
)

# --------------------------------------------------------------------------------------
# Fused batch normalization
# --------------------------------------------------------------------------------------
_BN_EPS = Attr("epsilon", "float", 0.0001, doc="Small float added to the variance (no minimum).")
_BN_EAF = Attr(
    "exponential_avg_factor", "float", 1.0,
    doc="Weight f of the batch statistics in the running averages (1.0: replace them).",
)
_BN_FMT4 = Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW"),
                doc="Layout of x and y.")
_BN_FMT5 = Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW", "NDHWC", "NCDHW"),
                doc="Layout of x and y.")
_BN_TRAIN = Attr("is_training", "bool", True,
                 doc="Normalize with the batch statistics (True) or the given ones (False).")
_BN_FWD_DESC = (
    "Normalizes x per channel: y = (x - mean) * rsqrt(variance + epsilon) * scale + offset. "
    "When is_training, mean and variance are the batch's (the biased variance); batch_variance "
    "is returned Bessel-corrected, and with exponential_avg_factor != 1 the running "
    "statistics are (1 - f) * input + f * batch value. Accumulation is float32."
)
_BN_GRAD_DESC = (
    "Gradient of FusedBatchNorm: given y_backprop, x, scale and the saved statistics "
    "(reserve_space_1/2: batch mean and biased variance when is_training, population mean "
    "and variance otherwise), returns x_backprop, scale_backprop and offset_backprop."
)


def _bn_fwd(name: str, version: int) -> OpDef:
    t = TypeAttr("T", ("float32",) if version == 1 else FLOATS_HALF)
    u = "T" if version == 1 else "U"
    type_attrs = (t,) if version == 1 else (t, TypeAttr("U", ("float32",)))
    outputs = [
        Output("y", type_attr="T", doc="Normalized x.", shape="like x"),
        Output("batch_mean", type_attr=u, doc="Batch mean (or running mean), shape [C].",
               shape="like scale"),
        Output("batch_variance", type_attr=u, doc="Bessel-corrected batch variance, shape [C].",
               shape="like scale"),
        Output("reserve_space_1", type_attr=u, doc="Mean used to normalize, for the gradient.",
               shape="like scale"),
        Output("reserve_space_2", type_attr=u, doc="Biased variance used, for the gradient.",
               shape="like scale"),
    ]
    if version == 3:
        outputs.append(Output("reserve_space_3", type_attr=u, doc="Scalar 0 on CPU.", shape="()"))
    return OpDef(
        name, "batch_norm",
        inputs=(
            Input("x", type_attr="T", doc="A 4-D (or 5-D) input."),
            Input("scale", type_attr=u, doc="Per-channel scale, shape [C]."),
            Input("offset", type_attr=u, doc="Per-channel offset, shape [C]."),
            Input("mean", type_attr=u, doc="Population (or running) mean, shape [C] or empty."),
            Input("variance", type_attr=u, doc="Population (or running) variance, [C] or empty."),
        ),
        attrs=(_BN_EPS, _BN_EAF, _BN_FMT5 if version == 3 else _BN_FMT4, _BN_TRAIN),
        outputs=tuple(outputs),
        type_attrs=type_attrs,
        summary="Batch normalization.",
        description=_BN_FWD_DESC,
        notes=("Where TF leaves outputs uninitialised, tfgrad returns defined values: "
               "reserve_space_1/2 are copies of mean/variance when is_training=False (as TF's "
               "oneDNN kernel) and zeros for an empty x.",),
    )


def _bn_grad(name: str, version: int) -> OpDef:
    t = TypeAttr("T", ("float32",) if version == 1 else FLOATS_HALF)
    u = "T" if version == 1 else "U"
    type_attrs = (t,) if version == 1 else (t, TypeAttr("U", ("float32",)))
    inputs = [
        Input("y_backprop", type_attr="T", doc="Gradient with respect to y."),
        Input("x", type_attr="T", doc="The forward op's x."),
        Input("scale", "float32" if version > 1 else None, type_attr=None if version > 1 else "T",
              doc="Per-channel scale, shape [C]."),
        Input("reserve_space_1", type_attr=u, doc="Saved mean, shape [C]."),
        Input("reserve_space_2", type_attr=u, doc="Saved variance, shape [C]."),
    ]
    extra = ("reserve_space_3", "reserve_space_4")
    if version == 3:
        inputs.append(Input("reserve_space_3", type_attr=u, doc="Ignored on CPU."))
        extra = ("reserve_space_4", "reserve_space_5")
    return OpDef(
        name, "batch_norm",
        inputs=tuple(inputs),
        attrs=(_BN_EPS, _BN_FMT5 if version == 3 else _BN_FMT4, _BN_TRAIN),
        outputs=(
            Output("x_backprop", type_attr="T", doc="Gradient with respect to x.",
                   shape="like x"),
            Output("scale_backprop", type_attr=u, doc="Gradient with respect to scale.",
                   shape="like scale"),
            Output("offset_backprop", type_attr=u, doc="Gradient with respect to offset.",
                   shape="like scale"),
            Output(extra[0], type_attr=u, doc="Unused placeholder, shape [0].", shape="(0,)"),
            Output(extra[1], type_attr=u, doc="Unused placeholder, shape [0].", shape="(0,)"),
        ),
        type_attrs=type_attrs,
        summary="Gradient for batch normalization.",
        description=_BN_GRAD_DESC,
        notes=("is_training=False with data_format NCHW (or NCDHW) is computed, as TF's GPU "
               "and oneDNN kernels do; TF's Eigen CPU kernel rejects it.",),
    )


BATCH_NORM = (
    _bn_fwd("FusedBatchNorm", 1),
    _bn_fwd("FusedBatchNormV2", 2),
    _bn_fwd("FusedBatchNormV3", 3),
    _bn_grad("FusedBatchNormGrad", 1),
    _bn_grad("FusedBatchNormGradV2", 2),
    _bn_grad("FusedBatchNormGradV3", 3),
)

# --------------------------------------------------------------------------------------
# Depthwise convolution
# --------------------------------------------------------------------------------------
_DW_ATTRS = (
    Attr("strides", "list(int)", doc="Stride of the sliding window for each dimension."),
    Attr("padding", "string", allowed=("SAME", "VALID", "EXPLICIT"),
         doc="Padding algorithm."),
    Attr("explicit_paddings", "list(int)", (),
         doc="With EXPLICIT padding: [before, after] for each of the 4 dimensions."),
    Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW"), doc="Layout of the data."),
    Attr("dilations", "list(int)", (1, 1, 1, 1), doc="Dilation factor for each dimension."),
)
_DW_T = (TypeAttr("T", FLOATS_ALL),)
_DW_NOTE = (
    "data_format='NCHW' and dilations > 1 are computed as the convolution they define, for all "
    "three ops (the backprops are the exact adjoints of the forward). TF 2.21's Eigen CPU kernel "
    "rejects them in the forward, and its backprop ops (Eigen and oneDNN alike) silently ignore "
    "dilations, returning the dilation-1 gradient.",
)

DEPTHWISE = (
    OpDef(
        "DepthwiseConv2dNative", "depthwise_conv",
        inputs=(
            Input("input", type_attr="T", doc="4-D input [batch, height, width, in_channels]."),
            Input("filter", type_attr="T",
                  doc="[filter_height, filter_width, in_channels, channel_multiplier]."),
        ),
        attrs=_DW_ATTRS,
        outputs=(Output("output", type_attr="T"),),
        type_attrs=_DW_T,
        summary="Computes a 2-D depthwise convolution given 4-D input and filter tensors.",
        description="Each input channel is convolved with its own channel_multiplier filters; "
        "output channel k * channel_multiplier + q comes from input channel k and filter "
        "[:, :, k, q]. Half-precision types round to T after every tap, as TF's CPU kernel.",
        notes=_DW_NOTE,
    ),
    OpDef(
        "DepthwiseConv2dNativeBackpropInput", "depthwise_conv",
        inputs=(
            Input("input_sizes", "int32", doc="Shape of the forward input, 4 integers.",
                  is_shape=True),
            Input("filter", type_attr="T",
                  doc="[filter_height, filter_width, in_channels, channel_multiplier]."),
            Input("out_backprop", type_attr="T", doc="Gradient with respect to the output."),
        ),
        attrs=_DW_ATTRS,
        outputs=(Output("output", type_attr="T", doc="Gradient with respect to the input.",
                        shape="values of input_sizes"),),
        type_attrs=_DW_T,
        summary="Computes the gradients of depthwise convolution with respect to the input.",
        notes=_DW_NOTE,
    ),
    OpDef(
        "DepthwiseConv2dNativeBackpropFilter", "depthwise_conv",
        inputs=(
            Input("input", type_attr="T", doc="The forward op's 4-D input."),
            Input("filter_sizes", "int32", doc="Shape of the filter, 4 integers.", is_shape=True),
            Input("out_backprop", type_attr="T", doc="Gradient with respect to the output."),
        ),
        attrs=_DW_ATTRS,
        outputs=(Output("output", type_attr="T", doc="Gradient with respect to the filter.",
                        shape="values of filter_sizes"),),
        type_attrs=_DW_T,
        summary="Computes the gradients of depthwise convolution with respect to the filter.",
        notes=_DW_NOTE,
    ),
)

# --------------------------------------------------------------------------------------
# Fractional pooling
# --------------------------------------------------------------------------------------
_FP_T = (TypeAttr("T", POOL_TYPES),)
_FP_FWD_ATTRS = (
    Attr("pooling_ratio", "list(float)", min_length=4,
         doc="Ratio for each dimension of value; the first and last must be 1.0."),
    Attr("pseudo_random", "bool", False,
         doc="Generate the pooling sequence pseudorandomly instead of randomly."),
    Attr("overlapping", "bool", False,
         doc="Adjacent pooling cells share their boundary index."),
    Attr("deterministic", "bool", False,
         doc="Use the fixed (seed, seed2) pair to draw the sequences."),
    Attr("seed", "int", 0, doc="First seed of the Philox generator."),
    Attr("seed2", "int", 0, doc="Second seed of the Philox generator."),
)
_FP_OVERLAP = Attr("overlapping", "bool", False,
                   doc="Adjacent pooling cells share their boundary index.")


def _fp_fwd(kind: str) -> OpDef:
    return OpDef(
        f"Fractional{kind}Pool", "fractional_pool",
        inputs=(Input("value", type_attr="T", doc="4-D [batch, height, width, channels]."),),
        attrs=_FP_FWD_ATTRS,
        outputs=(
            Output("output", type_attr="T", doc="Pooled values."),
            Output("row_pooling_sequence", "int64", doc="Row boundaries of the cells."),
            Output("col_pooling_sequence", "int64", doc="Column boundaries of the cells."),
        ),
        type_attrs=_FP_T,
        summary=f"Performs fractional {'max' if kind == 'Max' else 'average'} pooling on the "
        "input.",
        description="Pooling regions are generated from a Philox4x32-10 stream keyed by "
        "(seed, seed2), identical to TF's for the same seeds when deterministic is True.",
    )


FRACTIONAL_POOL = (
    _fp_fwd("Avg"),
    OpDef(
        "FractionalAvgPoolGrad", "fractional_pool",
        inputs=(
            Input("orig_input_tensor_shape", "int64", doc="Shape of the forward input.",
                  is_shape=True),
            Input("out_backprop", type_attr="T", doc="Gradient with respect to the output."),
            Input("row_pooling_sequence", "int64", doc="Row sequence of the forward op."),
            Input("col_pooling_sequence", "int64", doc="Column sequence of the forward op."),
        ),
        attrs=(_FP_OVERLAP,),
        outputs=(Output("output", type_attr="T", doc="Gradient with respect to the input.",
                        shape="values of orig_input_tensor_shape"),),
        type_attrs=_FP_T,
        summary="Computes gradient of the FractionalAvgPool function.",
        description="Each out_backprop element is spread evenly over the input cells of its "
        "pooling region, accumulated in float64 and rounded to T once.",
    ),
    _fp_fwd("Max"),
    OpDef(
        "FractionalMaxPoolGrad", "fractional_pool",
        inputs=(
            Input("orig_input", type_attr="T", doc="The forward op's input."),
            Input("orig_output", type_attr="T", doc="The forward op's output."),
            Input("out_backprop", type_attr="T", doc="Gradient with respect to the output."),
            Input("row_pooling_sequence", "int64", doc="Row sequence of the forward op."),
            Input("col_pooling_sequence", "int64", doc="Column sequence of the forward op."),
        ),
        attrs=(_FP_OVERLAP,),
        outputs=(Output("output", type_attr="T", doc="Gradient with respect to the input.",
                        shape="like orig_input"),),
        type_attrs=_FP_T,
        summary="Computes gradient of the FractionalMaxPool function.",
        description="Each out_backprop element goes to the first maximum (row-major) of its "
        "pooling region.",
    ),
)

# The training-step families (issue #43), each section owned by one family.
# <activation>
_ACT_T = (TypeAttr("T", FLOATS_ALL),)
_ACT_DESC = (
    "Elementwise, as TF's Eigen CPU kernel: denormals flushed (FTZ/DAZ) where its "
    "arithmetic flushes them, which differs between the vectorised body and the scalar "
    "tail of the flat tensor (docs/activation.md); NaN passes through bit for bit."
)
_ACT_GRAD_DESC = (
    "gradients * (mask of features).cast<T>(): one float multiplication (FTZ), so masked-out "
    "gradients give zeros of their sign, and inf or NaN gradients NaN."
)


def _act(name: str, summary: str) -> OpDef:
    return OpDef(
        name, "activation",
        inputs=(Input("features", type_attr="T", doc="Any shape."),),
        attrs=(),
        outputs=(Output("activations", type_attr="T", shape="like features"),),
        type_attrs=_ACT_T, summary=summary, description=_ACT_DESC,
    )


def _act_grad(name: str, summary: str, mask: str) -> OpDef:
    return OpDef(
        name, "activation",
        inputs=(
            Input("gradients", type_attr="T", doc="The backpropagated gradients."),
            Input("features", type_attr="T",
                  doc="The forward op's features or its outputs (the same mask)."),
        ),
        attrs=(),
        outputs=(Output("backprops", type_attr="T", doc=f"gradients * ({mask}).",
                        shape="like features"),),
        type_attrs=_ACT_T, summary=summary, description=_ACT_GRAD_DESC,
    )


ACTIVATION: tuple[OpDef, ...] = (
    _act("Relu", "Computes rectified linear: max(features, 0)."),
    _act_grad("ReluGrad", "Computes rectified linear gradients for a Relu operation.",
              "features > 0"),
    _act("Relu6", "Computes rectified linear 6: min(max(features, 0), 6)."),
    _act_grad("Relu6Grad", "Computes rectified linear 6 gradients for a Relu6 operation.",
              "0 < features < 6"),
)
# </activation>
# <bias_add>
_BIAS_T = (TypeAttr("T", ("float32", "float64")),)
_BIAS_FMT = Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW"),
                 doc="NHWC: the channels are value's last dimension; NCHW: its second.")
BIAS_ADD: tuple[OpDef, ...] = (
    OpDef(
        "BiasAdd", "bias_add",
        inputs=(Input("value", type_attr="T", doc="At least 2-D."),
                Input("bias", type_attr="T", doc="1-D, one value per channel.")),
        attrs=(_BIAS_FMT,),
        outputs=(Output("output", type_attr="T", shape="like value"),),
        type_attrs=_BIAS_T,
        summary="Adds bias to value.",
        description="value + bias broadcast over the channel dimension: one addition per "
        "value, denormals flushed (FTZ / DAZ) as TF's CPU kernel.",
    ),
    OpDef(
        "BiasAddGrad", "bias_add",
        inputs=(Input("out_backprop", type_attr="T", doc="At least 2-D."),),
        attrs=(_BIAS_FMT,),
        outputs=(Output("output", type_attr="T", doc="1-D: one sum per channel."),),
        type_attrs=_BIAS_T,
        summary="The backward operation for BiasAdd on the bias tensor.",
        description="Per-channel sums of out_backprop in TF's order: ReduceOuterDimensions "
        "(NHWC) or ReduceMiddleDimensions (NCHW) with TF's intra-op thread count's blocks "
        "(docs/bias_add.md).",
    ),
    OpDef(
        "Identity", "bias_add",
        inputs=(Input("input", type_attr="T"),),
        attrs=(),
        outputs=(Output("output", type_attr="T", shape="like input"),),
        type_attrs=(TypeAttr("T", FLOATS_ALL),),
        summary="Return a tensor with the same shape and contents as the input tensor.",
        description="The incoming gradient of BiasAdd's value, as TF's _BiasAddGrad passes "
        "it on; in the gradient table so that BiasAdd's value gradient is an op call.",
        notes=("tfgrad's Identity returns a copy (TF's may share the input's buffer).",),
    ),
)
# </bias_add>
# <matmul>
MATMUL: tuple[OpDef, ...] = (
    OpDef(
        "MatMul", "matmul",
        inputs=(Input("a", type_attr="T", doc="Matrix [M, K] ([K, M] with transpose_a)."),
                Input("b", type_attr="T", doc="Matrix [K, N] ([N, K] with transpose_b).")),
        attrs=(
            Attr("transpose_a", "bool", False, doc="Use a transposed."),
            Attr("transpose_b", "bool", False, doc="Use b transposed."),
            Attr("grad_a", "bool", False,
                 doc="Set by TF's gradient for the call giving a's gradient; no effect on CPU."),
            Attr("grad_b", "bool", False,
                 doc="Set by TF's gradient for the call giving b's gradient; no effect on CPU."),
        ),
        outputs=(Output("product", type_attr="T", doc="a x b, [M, N]."),),
        type_attrs=(TypeAttr("T", ("float32",)),),
        summary="Multiply the matrix a by the matrix b.",
        description=(
            "float32 as TF's CPU kernel computes it: with min(M, K, N) > 1, Eigen's "
            "thread-pool contraction with oneDNN's sgemm blocks (per output, fused "
            "multiply-add chains over k-blocks added in order; the blocks depend on TF's "
            "intra-op thread count and the processor); with min(M, K, N) == 1, Eigen's "
            "vector products without FMA."),
        notes=("TF also computes bfloat16, half, float64, integer and complex types; "
               "tfgrad computes float32 only (TypeError for the others).",),
    ),
)
# </matmul>
# <conv2d>
_C2_ATTRS = (
    Attr("strides", "list(int)", doc="Stride of the sliding window for each dimension."),
    Attr("use_cudnn_on_gpu", "bool", True, doc="Ignored on the CPU."),
    Attr("padding", "string", allowed=("SAME", "VALID", "EXPLICIT"),
         doc="Padding algorithm."),
    Attr("explicit_paddings", "list(int)", (),
         doc="With EXPLICIT padding: [before, after] for each of the 4 dimensions."),
    Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW"),
         doc="Layout of the data (TF's CPU kernels: NHWC only)."),
    Attr("dilations", "list(int)", (1, 1, 1, 1), doc="Dilation factor for each dimension."),
)
_C2_T = (TypeAttr("T", ("float32",)),)
_C2_DESC = (
    "As TF's Eigen CPU kernels: a contraction of image patches (K index (kh*KW + kw)*C + c) "
    "whose every output is a sum of FMA chains over TF's k-blocks (oneDNN's sgemm inside "
    "Eigen's ThreadPool contraction); the blocks depend on TF's thread count and the "
    "processor (docs/conv2d.md)."
)

CONV2D: tuple[OpDef, ...] = (
    OpDef(
        "Conv2D", "conv2d",
        inputs=(
            Input("input", type_attr="T", doc="4-D input [batch, height, width, in_channels]."),
            Input("filter", type_attr="T",
                  doc="[filter_height, filter_width, in_channels, out_channels]."),
        ),
        attrs=_C2_ATTRS,
        outputs=(Output("output", type_attr="T"),),
        type_attrs=_C2_T,
        summary="Computes a 2-D convolution given 4-D input and filter tensors.",
        description=_C2_DESC + " Dilations are computed (TF's Eigen kernel takes them); "
        "NCHW and grouped convolutions are refused.",
    ),
    OpDef(
        "Conv2DBackpropInput", "conv2d",
        inputs=(
            Input("input_sizes", "int32", doc="Shape of the forward input: 4 integers (or "
                  "[height, width]).", is_shape=True),
            Input("filter", type_attr="T",
                  doc="[filter_height, filter_width, in_channels, out_channels]."),
            Input("out_backprop", type_attr="T", doc="Gradient with respect to the output."),
        ),
        attrs=_C2_ATTRS,
        outputs=(Output("output", type_attr="T", doc="Gradient with respect to the input.",
                        shape=""),),
        type_attrs=_C2_T,
        summary="Computes the gradients of convolution with respect to the input.",
        description=_C2_DESC + " Per image, then TF's Col2im scatter-add. Where TF runs "
        "oneDNN's gemm_smalln_tn (several images, OH*OW < 16, small work) the order is not "
        "reproduced (docs/conv2d.md).",
    ),
    OpDef(
        "Conv2DBackpropFilter", "conv2d",
        inputs=(
            Input("input", type_attr="T", doc="The forward op's 4-D input."),
            Input("filter_sizes", "int32", doc="Shape of the filter, 4 integers.",
                  is_shape=True),
            Input("out_backprop", type_attr="T", doc="Gradient with respect to the output."),
        ),
        attrs=_C2_ATTRS,
        outputs=(Output("output", type_attr="T", doc="Gradient with respect to the filter.",
                        shape="values of filter_sizes"),),
        type_attrs=_C2_T,
        summary="Computes the gradients of convolution with respect to the filter.",
        description=_C2_DESC + " Images in TF's L3-sized shards, each shard's contraction "
        "added to the result.",
    ),
)
# </conv2d>
# <reduction>
def _reduction(name: str, mean: bool) -> OpDef:
    what = "mean" if mean else "sum"
    return OpDef(
        name, "reduction",
        inputs=(
            Input("input", type_attr="T", doc="The tensor to reduce."),
            Input("axis", type_attr="Tidx", is_shape=True,
                  doc="The dimensions to reduce, in [-rank(input), rank(input))."),
        ),
        attrs=(Attr("keep_dims", "bool", False,
                    doc="If true, retain reduced dimensions with length 1."),),
        outputs=(Output("output", type_attr="T", doc=f"The reduced tensor ({what})."),),
        type_attrs=(TypeAttr("T", ("float32",)), TypeAttr("Tidx", ("int32", "int64"))),
        summary=f"Computes the {what} of elements across dimensions of a tensor.",
        description="Summed in float32 in Eigen's order for the collapsed shape (full, "
        "inner, outer, middle or generic reduction; a full reduction of 108388 values or "
        "more is split by TF's thread count)"
        + (", then divided by float32(number of values summed)." if mean else ".")
        + " Reducing nothing (no axes, or only size-1 dims) returns the input unchanged.",
    )


REDUCTION: tuple[OpDef, ...] = (_reduction("Sum", False), _reduction("Mean", True))
# </reduction>
# <softmax_xent>
SOFTMAX_XENT: tuple[OpDef, ...] = (
    OpDef(
        "SparseSoftmaxCrossEntropyWithLogits", "softmax_xent",
        inputs=(
            Input("features", type_attr="T", doc="batch_size x num_classes matrix (logits)."),
            Input("labels", type_attr="Tlabels",
                  doc="batch_size vector with values in [0, num_classes)."),
        ),
        attrs=(),
        outputs=(
            Output("loss", type_attr="T", doc="Per example loss (batch_size vector)."),
            Output("backprop", type_attr="T",
                   doc="backpropagated gradients (batch_size x num_classes matrix)."),
        ),
        type_attrs=(TypeAttr("T", ("float32",)), TypeAttr("Tlabels", ("int32", "int64"))),
        summary="Computes softmax cross entropy cost and gradients to backpropagate.",
        description="loss = log(sum(exp(shifted))) - shifted[label] and backprop = "
        "exp(shifted) / sum - onehot(label), with shifted = features - max(features) per "
        "row, in float32 in TF's order: Eigen's vectorised exp (pexp) where TF evaluates "
        "packets of 8, the C library's expf and logf elsewhere, Eigen's tree for the sum.",
    ),
)
# </softmax_xent>
# <softmax>
SOFTMAX: tuple[OpDef, ...] = (
    OpDef(
        "Softmax", "softmax",
        inputs=(Input("logits", type_attr="T", doc="Non-empty; softmax over the last "
                      "dimension (2-D with shape [batch_size, num_classes] in TF's doc)."),),
        attrs=(),
        outputs=(Output("softmax", type_attr="T", doc="Same shape as logits."),),
        type_attrs=(TypeAttr("T", ("float32",)),),
        summary="Computes softmax activations.",
        description="softmax = exp(shifted) * (1 / sum(exp(shifted))) per row of the last "
        "dimension, with shifted = logits - max(logits), in float32 in TF's order: Eigen's "
        "vectorised exp (pexp) where TF's tiled assignment evaluates packets of 8, the C "
        "library's expf on each block's tail, Eigen's tree for the sum, the processor's "
        "rcpps and a Newton step for the reciprocal of rows in packets of 8.",
    ),
)
# </softmax>
# <max_pool>
_MP_ATTRS = (
    Attr("ksize", "list(int)", min_length=4,
         doc="The size of the window for each dimension of the input tensor."),
    Attr("strides", "list(int)", min_length=4,
         doc="The stride of the sliding window for each dimension of the input tensor."),
    Attr("padding", "string", allowed=("SAME", "VALID", "EXPLICIT"),
         doc="The type of padding algorithm to use."),
    Attr("explicit_paddings", "list(int)", (),
         doc="With EXPLICIT padding: [before, after] for each of the 4 dimensions."),
)
_MP_T = (TypeAttr("T", ("float32", "float64")),)
MAX_POOL: tuple[OpDef, ...] = (
    OpDef(
        "MaxPool", "max_pool",
        inputs=(Input("input", type_attr="T", doc="4-D input to pool over (NHWC)."),),
        attrs=(*_MP_ATTRS,
               Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW", "NCHW_VECT_C"),
                    doc="Layout of the data (TF's CPU kernel: NHWC only).")),
        outputs=(Output("output", type_attr="T", doc="The max pooled output tensor."),),
        type_attrs=_MP_T,
        summary="Performs max pooling on the input.",
        description="As TF's CPU kernel: each output starts at the type's lowest value and "
        "takes each window input x (row-major) where out < x, denormals read as zeros of "
        "their sign: NaN inputs are never taken and a window of -inf or NaN gives the "
        "lowest finite value (docs/max_pool.md).",
        notes=("TF also pools half, bfloat16 and integer types, and over the depth "
               "dimension (ksize[3] > 1); tfgrad pools float32 and float64 over rows and "
               "columns only.",),
    ),
    OpDef(
        "MaxPoolGrad", "max_pool",
        inputs=(
            Input("orig_input", type_attr="T", doc="The original input tensor."),
            Input("orig_output", type_attr="T",
                  doc="The original output tensor (only its shape is read, as TF's CPU "
                  "kernel)."),
            Input("grad", type_attr="T", doc="Gradients w.r.t. the output of max_pool."),
        ),
        attrs=(*_MP_ATTRS,
               Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW"),
                    doc="Layout of the data (TF's CPU kernel: NHWC only).")),
        outputs=(Output("output", type_attr="T", doc="Gradients w.r.t. the input to max_pool.",
                        shape="like orig_input"),),
        type_attrs=_MP_T,
        summary="Computes gradients of the maxpooling function.",
        description="Each grad value goes to its window's argmax, recomputed from "
        "orig_input: the first element (row-major) no later element exceeds, the window's "
        "first element even if NaN; values are added into a zero-filled gradient in the "
        "output's order, each addition flushed (FTZ / DAZ).",
    ),
)
# </max_pool>

# <cwise>
_CW_T = (TypeAttr("T", FLOATS_ALL),)
CWISE: tuple[OpDef, ...] = (
    OpDef(
        "SquaredDifference", "cwise",
        inputs=(Input("x", type_attr="T"), Input("y", type_attr="T")),
        attrs=(),
        outputs=(Output("z", type_attr="T", doc="(x - y) * (x - y), broadcast."),),
        type_attrs=_CW_T,
        summary="Returns conj(x - y)(x - y) element-wise.",
        description="x and y broadcast as TF's BCast (numpy rules). One subtraction and one "
        "multiplication, each rounded to T (half types: computed in float32 and rounded "
        "after each), denormals flushed (FTZ / DAZ) as TF's Eigen CPU kernel.",
    ),
    OpDef(
        "Rsqrt", "cwise",
        inputs=(Input("x", type_attr="T"),),
        attrs=(),
        outputs=(Output("y", type_attr="T", shape="like x"),),
        type_attrs=_CW_T,
        summary="Computes reciprocal of square root of x element-wise.",
        description="As TF's Eigen CPU kernel on the flat tensor: values in full packets of "
        "8 (float32, and the half types computed in float32) take Eigen's approximate "
        "prsqrt (the processor's rsqrtps and one Newton step: processor-dependent), the "
        "last size % 8 the exact 1 / sqrt (half types: the square root rounded to T first); "
        "float64 is the exact 1 / sqrt everywhere. DAZ: a denormal gives inf.",
    ),
    OpDef(
        "RsqrtGrad", "cwise",
        inputs=(Input("y", type_attr="T", doc="The forward op's output."),
                Input("dy", type_attr="T", doc="Gradient with respect to y; as many "
                      "values as y.")),
        attrs=(),
        outputs=(Output("z", type_attr="T", doc="dy * -0.5 * y^3, shaped like y.",
                        shape="like y"),),
        type_attrs=_CW_T,
        summary="Computes the gradient for the rsqrt of x wrt its input.",
        description="Eigen's scalar_rsqrt_gradient_op: in full packets (8 values; float64 "
        "4) mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy)), on the tail "
        "(dy == 0 ? 0 : (-0.5 * (dy * y)) * (y * y)); each product rounded to T, FTZ / DAZ.",
    ),
)
# </cwise>
# <avg_pool>
_AP_ATTRS = (
    Attr("ksize", "list(int)", min_length=4,
         doc="The size of the sliding window for each dimension of value."),
    Attr("strides", "list(int)", min_length=4,
         doc="The stride of the sliding window for each dimension of value."),
    Attr("padding", "string", allowed=("SAME", "VALID"),
         doc="The type of padding algorithm to use."),
    Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW"),
         doc="Layout of the data (TF's CPU kernels: NHWC only)."),
)
_AP_T = (TypeAttr("T", FLOATS_ALL),)
AVG_POOL: tuple[OpDef, ...] = (
    OpDef(
        "AvgPool", "avg_pool",
        inputs=(Input("value", type_attr="T", doc="4-D with shape [batch, height, width, "
                      "channels]."),),
        attrs=_AP_ATTRS,
        outputs=(Output("output", type_attr="T", doc="The average pooled output tensor."),),
        type_attrs=_AP_T,
        summary="Performs average pooling on the input.",
        description="As TF's CPU kernel: each output is its window's cells (padding "
        "excluded) added in row-major order from +0, then divided by their count, itself "
        "a sum of ones in T (bfloat16 counts stop at 256, half at 2048); one rounding per "
        "operation in T (half types: float32 rounded to T), FTZ / DAZ (docs/avg_pool.md).",
    ),
    OpDef(
        "AvgPoolGrad", "avg_pool",
        inputs=(
            Input("orig_input_shape", "int32", doc="The forward op's input shape.",
                  is_shape=True),
            Input("grad", type_attr="T",
                  doc="4-D with shape [batch, height, width, channels]: gradients w.r.t. "
                  "the output of avg_pool."),
        ),
        attrs=_AP_ATTRS,
        outputs=(Output("output", type_attr="T", doc="Gradients w.r.t. the input of "
                        "avg_pool.", shape="values of orig_input_shape"),),
        type_attrs=_AP_T,
        summary="Computes gradients of the average pooling function.",
        description="As TF's CPU kernel: from zeros, each output's grad * T(1.0 / cells) "
        "(the product rounded to T, no FMA) is added to its window's cells, outputs in "
        "row-major order; FTZ / DAZ (docs/avg_pool.md).",
        notes=("TF 2.21 does not check that grad has the forward output's shape (it reads "
               "and writes outside its buffers) or that ksize is positive; tfgrad rejects "
               "both with the words of AvgPool and of later TF versions.",),
    ),
)
# </avg_pool>

OPS: dict[str, OpDef] = {
    op.name: op for op in FAKE_QUANT + BATCH_NORM + DEPTHWISE + FRACTIONAL_POOL + ACTIVATION
    + BIAS_ADD + MATMUL + CONV2D + REDUCTION + SOFTMAX_XENT + SOFTMAX + MAX_POOL
    + CWISE + AVG_POOL
}
"""Every op tfgrad implements, by TF name."""

FAMILIES: dict[str, tuple[str, ...]] = {}
for _op in OPS.values():
    FAMILIES.setdefault(_op.family, ())
    FAMILIES[_op.family] += (_op.name,)
del _op


def get_op_def(name: str) -> OpDef:
    """The definition of op ``name`` (TF's CamelCase name or the snake_case one)."""
    if name in OPS:
        return OPS[name]
    for op in OPS.values():
        if op.snake_name == name:
            return op
    raise KeyError(f"tfgrad has no op named {name!r}; known ops: {', '.join(OPS)}")
