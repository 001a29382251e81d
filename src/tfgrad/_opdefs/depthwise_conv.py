"""The op table's ``depthwise_conv`` family: Depthwise convolution
(DEPTHWISE; docs/depthwise_conv.md).
"""

from __future__ import annotations

from ._types import FLOATS_ALL, Attr, Input, OpDef, Output, TypeAttr

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

DEPTHWISE: tuple[OpDef, ...] = (
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
