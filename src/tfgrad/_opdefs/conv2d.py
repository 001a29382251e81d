"""The op table's ``conv2d`` family: Conv2D and its backprops (CONV2D; docs/conv2d.md)."""

from __future__ import annotations

from ._types import Attr, Input, OpDef, Output, TypeAttr

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
