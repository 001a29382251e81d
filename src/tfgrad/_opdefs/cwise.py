"""The op table's ``cwise`` family: SquaredDifference, Rsqrt and RsqrtGrad
(CWISE; docs/cwise.md).
"""

from __future__ import annotations

from ._types import FLOATS_ALL, Input, OpDef, Output, TypeAttr

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
