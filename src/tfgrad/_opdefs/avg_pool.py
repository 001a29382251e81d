"""The op table's ``avg_pool`` family: AvgPool and AvgPoolGrad (AVG_POOL; docs/avg_pool.md)."""

from __future__ import annotations

from ._types import FLOATS_ALL, Attr, Input, OpDef, Output, TypeAttr

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
