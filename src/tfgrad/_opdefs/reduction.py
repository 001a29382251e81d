"""The op table's ``reduction`` family: Sum and Mean (REDUCTION; docs/reduction.md)."""

from __future__ import annotations

from ._types import Attr, Input, OpDef, Output, TypeAttr


def _reduction(name: str, mean: bool) -> OpDef:
    what = "mean" if mean else "sum"
    return OpDef(
        name, "reduction",
        inputs=(
            Input("input", type_attr="T", doc="The tensor to reduce."),
            Input("axis", type_attr="Tidx", is_shape=True,
                  doc="The dimensions to reduce, in [-rank(input), rank(input))."),
        ),
        attrs=(Attr("keep_dims", "bool", False,
                    doc="If true, retain reduced dimensions with length 1."),),
        outputs=(Output("output", type_attr="T", doc=f"The reduced tensor ({what})."),),
        type_attrs=(TypeAttr("T", ("float32",)), TypeAttr("Tidx", ("int32", "int64"))),
        summary=f"Computes the {what} of elements across dimensions of a tensor.",
        description="Summed in float32 in Eigen's order for the collapsed shape (full, "
        "inner, outer, middle or generic reduction; a full reduction of 108388 values or "
        "more is split by TF's thread count)"
        + (", then divided by float32(number of values summed)." if mean else ".")
        + " Reducing nothing (no axes, or only size-1 dims) returns the input unchanged.",
    )


REDUCTION: tuple[OpDef, ...] = (_reduction("Sum", False), _reduction("Mean", True))
