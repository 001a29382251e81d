"""The op table's ``bias_add`` family: BiasAdd, BiasAddGrad (and Identity)
(BIAS_ADD; docs/bias_add.md).
"""

from __future__ import annotations

from ._types import FLOATS_ALL, Attr, Input, OpDef, Output, TypeAttr

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
