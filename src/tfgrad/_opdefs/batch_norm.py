"""The op table's ``batch_norm`` family: Fused batch normalization
(BATCH_NORM; docs/batch_norm.md).
"""

from __future__ import annotations

from ._types import FLOATS_HALF, Attr, Input, OpDef, Output, TypeAttr

_BN_EPS = Attr("epsilon", "float", 0.0001, doc="Small float added to the variance (no minimum).")
_BN_EAF = Attr(
    "exponential_avg_factor", "float", 1.0,
    doc="Weight f of the batch statistics in the running averages (1.0: replace them).",
)
_BN_FMT4 = Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW"),
                doc="Layout of x and y.")
_BN_FMT5 = Attr("data_format", "string", "NHWC", allowed=("NHWC", "NCHW", "NDHWC", "NCDHW"),
                doc="Layout of x and y.")
_BN_TRAIN = Attr("is_training", "bool", True,
                 doc="Normalize with the batch statistics (True) or the given ones (False).")
_BN_FWD_DESC = (
    "Normalizes x per channel: y = (x - mean) * rsqrt(variance + epsilon) * scale + offset. "
    "When is_training, mean and variance are the batch's (the biased variance); batch_variance "
    "is returned Bessel-corrected, and with exponential_avg_factor != 1 the running "
    "statistics are (1 - f) * input + f * batch value. Accumulation is float32."
)
_BN_GRAD_DESC = (
    "Gradient of FusedBatchNorm: given y_backprop, x, scale and the saved statistics "
    "(reserve_space_1/2: batch mean and biased variance when is_training, population mean "
    "and variance otherwise), returns x_backprop, scale_backprop and offset_backprop."
)


def _bn_fwd(name: str, version: int) -> OpDef:
    t = TypeAttr("T", ("float32",) if version == 1 else FLOATS_HALF)
    u = "T" if version == 1 else "U"
    type_attrs = (t,) if version == 1 else (t, TypeAttr("U", ("float32",)))
    outputs = [
        Output("y", type_attr="T", doc="Normalized x.", shape="like x"),
        Output("batch_mean", type_attr=u, doc="Batch mean (or running mean), shape [C].",
               shape="like scale"),
        Output("batch_variance", type_attr=u, doc="Bessel-corrected batch variance, shape [C].",
               shape="like scale"),
        Output("reserve_space_1", type_attr=u, doc="Mean used to normalize, for the gradient.",
               shape="like scale"),
        Output("reserve_space_2", type_attr=u, doc="Biased variance used, for the gradient.",
               shape="like scale"),
    ]
    if version == 3:
        outputs.append(Output("reserve_space_3", type_attr=u, doc="Scalar 0 on CPU.", shape="()"))
    return OpDef(
        name, "batch_norm",
        inputs=(
            Input("x", type_attr="T", doc="A 4-D (or 5-D) input."),
            Input("scale", type_attr=u, doc="Per-channel scale, shape [C]."),
            Input("offset", type_attr=u, doc="Per-channel offset, shape [C]."),
            Input("mean", type_attr=u, doc="Population (or running) mean, shape [C] or empty."),
            Input("variance", type_attr=u, doc="Population (or running) variance, [C] or empty."),
        ),
        attrs=(_BN_EPS, _BN_EAF, _BN_FMT5 if version == 3 else _BN_FMT4, _BN_TRAIN),
        outputs=tuple(outputs),
        type_attrs=type_attrs,
        summary="Batch normalization.",
        description=_BN_FWD_DESC,
        notes=("Where TF leaves outputs uninitialised, tfgrad returns defined values: "
               "reserve_space_1/2 are copies of mean/variance when is_training=False (as TF's "
               "oneDNN kernel) and zeros for an empty x.",),
    )


def _bn_grad(name: str, version: int) -> OpDef:
    t = TypeAttr("T", ("float32",) if version == 1 else FLOATS_HALF)
    u = "T" if version == 1 else "U"
    type_attrs = (t,) if version == 1 else (t, TypeAttr("U", ("float32",)))
    inputs = [
        Input("y_backprop", type_attr="T", doc="Gradient with respect to y."),
        Input("x", type_attr="T", doc="The forward op's x."),
        Input("scale", "float32" if version > 1 else None, type_attr=None if version > 1 else "T",
              doc="Per-channel scale, shape [C]."),
        Input("reserve_space_1", type_attr=u, doc="Saved mean, shape [C]."),
        Input("reserve_space_2", type_attr=u, doc="Saved variance, shape [C]."),
    ]
    extra = ("reserve_space_3", "reserve_space_4")
    if version == 3:
        inputs.append(Input("reserve_space_3", type_attr=u, doc="Ignored on CPU."))
        extra = ("reserve_space_4", "reserve_space_5")
    return OpDef(
        name, "batch_norm",
        inputs=tuple(inputs),
        attrs=(_BN_EPS, _BN_FMT5 if version == 3 else _BN_FMT4, _BN_TRAIN),
        outputs=(
            Output("x_backprop", type_attr="T", doc="Gradient with respect to x.",
                   shape="like x"),
            Output("scale_backprop", type_attr=u, doc="Gradient with respect to scale.",
                   shape="like scale"),
            Output("offset_backprop", type_attr=u, doc="Gradient with respect to offset.",
                   shape="like scale"),
            Output(extra[0], type_attr=u, doc="Unused placeholder, shape [0].", shape="(0,)"),
            Output(extra[1], type_attr=u, doc="Unused placeholder, shape [0].", shape="(0,)"),
        ),
        type_attrs=type_attrs,
        summary="Gradient for batch normalization.",
        description=_BN_GRAD_DESC,
        notes=("is_training=False with data_format NCHW (or NCDHW) is computed, as TF's GPU "
               "and oneDNN kernels do; TF's Eigen CPU kernel rejects it.",),
    )


BATCH_NORM: tuple[OpDef, ...] = (
    _bn_fwd("FusedBatchNorm", 1),
    _bn_fwd("FusedBatchNormV2", 2),
    _bn_fwd("FusedBatchNormV3", 3),
    _bn_grad("FusedBatchNormGrad", 1),
    _bn_grad("FusedBatchNormGradV2", 2),
    _bn_grad("FusedBatchNormGradV3", 3),
)
