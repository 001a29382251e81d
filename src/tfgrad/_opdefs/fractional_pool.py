"""The op table's ``fractional_pool`` family: Fractional pooling
(FRACTIONAL_POOL; docs/fractional_pool.md).
"""

from __future__ import annotations

from ._types import POOL_TYPES, Attr, Input, OpDef, Output, TypeAttr

_FP_T = (TypeAttr("T", POOL_TYPES),)
_FP_FWD_ATTRS = (
    Attr("pooling_ratio", "list(float)", min_length=4,
         doc="Ratio for each dimension of value; the first and last must be 1.0."),
    Attr("pseudo_random", "bool", False,
         doc="Generate the pooling sequence pseudorandomly instead of randomly."),
    Attr("overlapping", "bool", False,
         doc="Adjacent pooling cells share their boundary index."),
    Attr("deterministic", "bool", False,
         doc="Use the fixed (seed, seed2) pair to draw the sequences."),
    Attr("seed", "int", 0, doc="First seed of the Philox generator."),
    Attr("seed2", "int", 0, doc="Second seed of the Philox generator."),
)
_FP_OVERLAP = Attr("overlapping", "bool", False,
                   doc="Adjacent pooling cells share their boundary index.")


def _fp_fwd(kind: str) -> OpDef:
    return OpDef(
        f"Fractional{kind}Pool", "fractional_pool",
        inputs=(Input("value", type_attr="T", doc="4-D [batch, height, width, channels]."),),
        attrs=_FP_FWD_ATTRS,
        outputs=(
            Output("output", type_attr="T", doc="Pooled values."),
            Output("row_pooling_sequence", "int64", doc="Row boundaries of the cells."),
            Output("col_pooling_sequence", "int64", doc="Column boundaries of the cells."),
        ),
        type_attrs=_FP_T,
        summary=f"Performs fractional {'max' if kind == 'Max' else 'average'} pooling on the "
        "input.",
        description="Pooling regions are generated from a Philox4x32-10 stream keyed by "
        "(seed, seed2), identical to TF's for the same seeds when deterministic is True.",
    )


FRACTIONAL_POOL: tuple[OpDef, ...] = (
    _fp_fwd("Avg"),
    OpDef(
        "FractionalAvgPoolGrad", "fractional_pool",
        inputs=(
            Input("orig_input_tensor_shape", "int64", doc="Shape of the forward input.",
                  is_shape=True),
            Input("out_backprop", type_attr="T", doc="Gradient with respect to the output."),
            Input("row_pooling_sequence", "int64", doc="Row sequence of the forward op."),
            Input("col_pooling_sequence", "int64", doc="Column sequence of the forward op."),
        ),
        attrs=(_FP_OVERLAP,),
        outputs=(Output("output", type_attr="T", doc="Gradient with respect to the input.",
                        shape="values of orig_input_tensor_shape"),),
        type_attrs=_FP_T,
        summary="Computes gradient of the FractionalAvgPool function.",
        description="Each out_backprop element is spread evenly over the input cells of its "
        "pooling region, accumulated in float64 and rounded to T once.",
    ),
    _fp_fwd("Max"),
    OpDef(
        "FractionalMaxPoolGrad", "fractional_pool",
        inputs=(
            Input("orig_input", type_attr="T", doc="The forward op's input."),
            Input("orig_output", type_attr="T", doc="The forward op's output."),
            Input("out_backprop", type_attr="T", doc="Gradient with respect to the output."),
            Input("row_pooling_sequence", "int64", doc="Row sequence of the forward op."),
            Input("col_pooling_sequence", "int64", doc="Column sequence of the forward op."),
        ),
        attrs=(_FP_OVERLAP,),
        outputs=(Output("output", type_attr="T", doc="Gradient with respect to the input.",
                        shape="like orig_input"),),
        type_attrs=_FP_T,
        summary="Computes gradient of the FractionalMaxPool function.",
        description="Each out_backprop element goes to the first maximum (row-major) of its "
        "pooling region.",
    ),
)
