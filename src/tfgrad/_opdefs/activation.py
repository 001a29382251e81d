"""The op table's ``activation`` family: Relu and Relu6, and their gradients
(ACTIVATION; docs/activation.md).
"""

from __future__ import annotations

from ._types import FLOATS_ALL, Input, OpDef, Output, TypeAttr

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
