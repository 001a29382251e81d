"""The op table's ``matmul`` family: MatMul (MATMUL; docs/matmul.md)."""

from __future__ import annotations

from ._types import Attr, Input, OpDef, Output, TypeAttr

MATMUL: tuple[OpDef, ...] = (
    OpDef(
        "MatMul", "matmul",
        inputs=(Input("a", type_attr="T", doc="Matrix [M, K] ([K, M] with transpose_a)."),
                Input("b", type_attr="T", doc="Matrix [K, N] ([N, K] with transpose_b).")),
        attrs=(
            Attr("transpose_a", "bool", False, doc="Use a transposed."),
            Attr("transpose_b", "bool", False, doc="Use b transposed."),
            Attr("grad_a", "bool", False,
                 doc="Set by TF's gradient for the call giving a's gradient; no effect on CPU."),
            Attr("grad_b", "bool", False,
                 doc="Set by TF's gradient for the call giving b's gradient; no effect on CPU."),
        ),
        outputs=(Output("product", type_attr="T", doc="a x b, [M, N]."),),
        type_attrs=(TypeAttr("T", ("float32",)),),
        summary="Multiply the matrix a by the matrix b.",
        description=(
            "float32 as TF's CPU kernel computes it: with min(M, K, N) > 1, Eigen's "
            "thread-pool contraction with oneDNN's sgemm blocks (per output, fused "
            "multiply-add chains over k-blocks added in order; the blocks depend on TF's "
            "intra-op thread count and the processor); with min(M, K, N) == 1, Eigen's "
            "vector products without FMA."),
        notes=("TF also computes bfloat16, half, float64, integer and complex types; "
               "tfgrad computes float32 only (TypeError for the others).",),
    ),
)
