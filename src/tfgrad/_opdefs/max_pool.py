"""The op table's ``max_pool`` family: MaxPool and MaxPoolGrad (MAX_POOL; docs/max_pool.md)."""

from __future__ import annotations

from ._types import Attr, Input, OpDef, Output, TypeAttr

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
