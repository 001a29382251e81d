"""The op table's ``fake_quant`` family: Fake quantization (FAKE_QUANT; docs/fake_quant.md)."""

from __future__ import annotations

from ._types import Attr, Input, OpDef, Output

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

FAKE_QUANT: tuple[OpDef, ...] = (
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
