"""The op table's ``softmax`` family: Softmax (SOFTMAX; docs/softmax.md)."""

from __future__ import annotations

from ._types import Input, OpDef, Output, TypeAttr

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
