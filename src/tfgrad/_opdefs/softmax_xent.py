"""The op table's ``softmax_xent`` family: SparseSoftmaxCrossEntropyWithLogits
(SOFTMAX_XENT; docs/softmax_xent.md).
"""

from __future__ import annotations

from ._types import Input, OpDef, Output, TypeAttr

SOFTMAX_XENT: tuple[OpDef, ...] = (
    OpDef(
        "SparseSoftmaxCrossEntropyWithLogits", "softmax_xent",
        inputs=(
            Input("features", type_attr="T", doc="batch_size x num_classes matrix (logits)."),
            Input("labels", type_attr="Tlabels",
                  doc="batch_size vector with values in [0, num_classes)."),
        ),
        attrs=(),
        outputs=(
            Output("loss", type_attr="T", doc="Per example loss (batch_size vector)."),
            Output("backprop", type_attr="T",
                   doc="backpropagated gradients (batch_size x num_classes matrix)."),
        ),
        type_attrs=(TypeAttr("T", ("float32",)), TypeAttr("Tlabels", ("int32", "int64"))),
        summary="Computes softmax cross entropy cost and gradients to backpropagate.",
        description="loss = log(sum(exp(shifted))) - shifted[label] and backprop = "
        "exp(shifted) / sum - onehot(label), with shifted = features - max(features) per "
        "row, in float32 in TF's order: Eigen's vectorised exp (pexp) where TF evaluates "
        "packets of 8, the C library's expf and logf elsewhere, Eigen's tree for the sum.",
    ),
)
