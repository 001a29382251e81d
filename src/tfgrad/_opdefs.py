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
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", op_name)
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

OPS: dict[str, OpDef] = {
    op.name: op for op in FAKE_QUANT + BATCH_NORM + DEPTHWISE + FRACTIONAL_POOL
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
