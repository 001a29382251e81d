"""The gradient table: how each op is differentiated, as TF 2.21's gradient registry does it.

TF's registered gradient functions (``tensorflow/python/ops/nn_grad.py``,
``array_grad.py``) each call one or two gradient ops with inputs taken from the forward
op's inputs, outputs and incoming gradients. :data:`GRADIENTS` writes those calls down per
op, declaratively, so that every framework adapter (``tfgrad.torch``, ``tfgrad.jax``)
wires its autograd from this one table:

- a :class:`GradCall` names the gradient op, where each of its inputs comes from
  (:class:`From`), which forward inputs its outputs are the gradients of, and when it
  applies (batch norm differentiates training and inference differently);
- attrs: every attr of the gradient op is the forward op's attr of the same name, except
  those the call fixes itself (``GradCall.fixed``: MatMul's transposes);
- :data:`LINEARISED` marks gradient ops whose own gradient TF computes by differentiating
  a composite of primitive ops (``_FusedBatchNormGradGrad`` differentiates
  ``_BatchNormGrad``), or that are linear in their differentiable input: adapters
  differentiate their portable implementation with the framework's own autodiff;
- an op that is in neither has no gradient in TF; differentiating it is an error.

Only the outputs that appear as ``From("grad", name)`` are differentiable (TF's gradient
functions ignore the others' incoming gradients); forward inputs that no call ``gives``
get no gradient (TF returns None for them).

:func:`steps` is the table read for one call of an op (its attrs), with names resolved to
positions: every adapter's backward (``tfgrad.torch``'s autograd, ``tfgrad.jax``'s
transposes, the fused QAT tape of ``tfgrad.qat``) runs these steps with its own values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._opdefs import OPS, get_op_def


@dataclass(frozen=True)
class From:
    """Where a gradient op's input comes from."""

    kind: str
    """``"input"`` (a forward input), ``"output"`` (a forward output), ``"grad"`` (the
    incoming gradient of a forward output) or ``"shape"`` (a forward input's shape)."""
    name: str


def _in(name: str) -> From:
    return From("input", name)


def _out(name: str) -> From:
    return From("output", name)


def _grad(name: str) -> From:
    return From("grad", name)


def _shape(name: str) -> From:
    return From("shape", name)


@dataclass(frozen=True)
class GradCall:
    op: str
    """The gradient op TF's gradient function calls."""
    args: dict[str, From]
    """Its inputs, by name."""
    gives: dict[str, str]
    """Forward input -> the gradient op's output that is its gradient."""
    when: dict[str, Any] = field(default_factory=dict)
    """Forward attr values under which this call applies (empty: always)."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Gradient-op attrs the gradient function sets itself (MatMul's transposes), which
    replace the forward's of the same names."""

    def applies(self, attrs: dict[str, Any]) -> bool:
        return all(attrs[k] == v for k, v in self.when.items())


def _fake_quant(op: str) -> tuple[GradCall, ...]:
    if op == "FakeQuantWithMinMaxArgs":
        return (GradCall(op + "Gradient", {"gradients": _grad("outputs"), "inputs": _in("inputs")},
                         {"inputs": "backprops"}),)
    # TF's _FakeQuantWithMinMaxVarsGradient / ...PerChannelGradient
    return (GradCall(op + "Gradient",
                     {"gradients": _grad("outputs"), "inputs": _in("inputs"),
                      "min": _in("min"), "max": _in("max")},
                     {"inputs": "backprops_wrt_input", "min": "backprop_wrt_min",
                      "max": "backprop_wrt_max"}),)


def _batch_norm(version: int) -> tuple[GradCall, ...]:
    """TF's _BaseFusedBatchNormGrad: training differentiates with the batch statistics the
    forward op saved in its reserve spaces, inference with the given mean and variance.
    (TF transposes NCHW inference to NHWC around the gradient op; tfgrad's gradient op
    computes NCHW inference directly, with the same bits.)"""
    fwd = {1: "FusedBatchNorm", 2: "FusedBatchNormV2", 3: "FusedBatchNormV3"}[version]
    grad_op = fwd.replace("Norm", "NormGrad")
    gives = {"x": "x_backprop", "scale": "scale_backprop", "offset": "offset_backprop"}
    calls = []
    for training, (m, v) in ((True, (_out("reserve_space_1"), _out("reserve_space_2"))),
                             (False, (_in("mean"), _in("variance")))):
        args = {"y_backprop": _grad("y"), "x": _in("x"), "scale": _in("scale"),
                "reserve_space_1": m, "reserve_space_2": v}
        if version == 3:
            args["reserve_space_3"] = _out("reserve_space_3")
        calls.append(GradCall(grad_op, args, gives, {"is_training": training}))
    return tuple(calls)


def _matmul() -> tuple[GradCall, ...]:
    """TF's _MatMulGrad (math_grad.py): two MatMuls, whose operands and transposes follow
    the forward's transposes (grad_a / grad_b set on the call for each input)."""
    g = _grad("product")
    a, b = _in("a"), _in("b")
    # (transpose_a, transpose_b) -> (a's call, b's call): (x, y, transpose_a, transpose_b)
    table = {
        (False, False): ((g, b, False, True), (a, g, True, False)),
        (False, True): ((g, b, False, False), (g, a, True, False)),
        (True, False): ((b, g, False, True), (a, g, False, False)),
        (True, True): ((b, g, True, True), (g, a, True, True)),
    }
    calls = []
    for (ta, tb), pair in table.items():
        for which, (x, y, ga, gb) in zip(("a", "b"), pair):
            calls.append(GradCall("MatMul", {"a": x, "b": y}, {which: "product"},
                                  {"transpose_a": ta, "transpose_b": tb},
                                  {"transpose_a": ga, "transpose_b": gb,
                                   "grad_a": which == "a", "grad_b": which == "b"}))
    return tuple(calls)


_DW = "DepthwiseConv2dNative"
_DW_IN, _DW_FILTER = _DW + "BackpropInput", _DW + "BackpropFilter"

GRADIENTS: dict[str, tuple[GradCall, ...]] = {
    **{op: _fake_quant(op) for op in ("FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxVars",
                                      "FakeQuantWithMinMaxVarsPerChannel")},
    "FusedBatchNorm": _batch_norm(1),
    "FusedBatchNormV2": _batch_norm(2),
    "FusedBatchNormV3": _batch_norm(3),
    # TF's _DepthwiseConv2dNativeGrad and the gradients of its two backprops: the three ops
    # are bilinear and differentiate each other, to any order.
    _DW: (
        GradCall(_DW_IN, {"input_sizes": _shape("input"), "filter": _in("filter"),
                          "out_backprop": _grad("output")}, {"input": "output"}),
        GradCall(_DW_FILTER, {"input": _in("input"), "filter_sizes": _shape("filter"),
                              "out_backprop": _grad("output")}, {"filter": "output"}),
    ),
    _DW_IN: (
        GradCall(_DW_FILTER, {"input": _grad("output"), "filter_sizes": _shape("filter"),
                              "out_backprop": _in("out_backprop")}, {"filter": "output"}),
        GradCall(_DW, {"input": _grad("output"), "filter": _in("filter")},
                 {"out_backprop": "output"}),
    ),
    _DW_FILTER: (
        GradCall(_DW_IN, {"input_sizes": _shape("input"), "filter": _grad("output"),
                          "out_backprop": _in("out_backprop")}, {"input": "output"}),
        GradCall(_DW, {"input": _in("input"), "filter": _grad("output")},
                 {"out_backprop": "output"}),
    ),
    "FractionalAvgPool": (
        GradCall("FractionalAvgPoolGrad",
                 {"orig_input_tensor_shape": _shape("value"), "out_backprop": _grad("output"),
                  "row_pooling_sequence": _out("row_pooling_sequence"),
                  "col_pooling_sequence": _out("col_pooling_sequence")},
                 {"value": "output"}),
    ),
    "FractionalMaxPool": (
        GradCall("FractionalMaxPoolGrad",
                 {"orig_input": _in("value"), "orig_output": _out("output"),
                  "out_backprop": _grad("output"),
                  "row_pooling_sequence": _out("row_pooling_sequence"),
                  "col_pooling_sequence": _out("col_pooling_sequence")},
                 {"value": "output"}),
    ),
    # <activation>
    # TF's _ReluGrad / _Relu6Grad (the mask from the forward's output) and
    # _ReluGradGrad / _Relu6GradGrad (the same op on the incoming gradient, the mask from
    # the features; TF's zeros_like for the features: no gradient here).
    **{fwd: (GradCall(fwd + "Grad", {"gradients": _grad("activations"),
                                     "features": _out("activations")},
                      {"features": "backprops"}),)
       for fwd in ("Relu", "Relu6")},
    **{grad: (GradCall(grad, {"gradients": _grad("backprops"), "features": _in("features")},
                       {"gradients": "backprops"}),)
       for grad in ("ReluGrad", "Relu6Grad")},
    # </activation>
    # <bias_add>
    # TF's _BiasAddGrad: the incoming gradient itself for value (an Identity here, so
    # that the table names an op), BiasAddGrad for bias; TF's _IdGrad for Identity.
    "BiasAdd": (
        GradCall("Identity", {"input": _grad("output")}, {"value": "output"}),
        GradCall("BiasAddGrad", {"out_backprop": _grad("output")}, {"bias": "output"}),
    ),
    "Identity": (GradCall("Identity", {"input": _grad("output")}, {"input": "output"}),),
    # </bias_add>
    # <matmul>
    "MatMul": _matmul(),
    # </matmul>
    # <conv2d>
    # TF's _Conv2DGrad, _Conv2DBackpropInputGrad and _Conv2DBackpropFilterGrad: bilinear,
    # the three differentiate each other, to any order.
    "Conv2D": (
        GradCall("Conv2DBackpropInput", {"input_sizes": _shape("input"), "filter": _in("filter"),
                                         "out_backprop": _grad("output")}, {"input": "output"}),
        GradCall("Conv2DBackpropFilter", {"input": _in("input"),
                                          "filter_sizes": _shape("filter"),
                                          "out_backprop": _grad("output")},
                 {"filter": "output"}),
    ),
    "Conv2DBackpropInput": (
        GradCall("Conv2DBackpropFilter", {"input": _grad("output"),
                                          "filter_sizes": _shape("filter"),
                                          "out_backprop": _in("out_backprop")},
                 {"filter": "output"}),
        GradCall("Conv2D", {"input": _grad("output"), "filter": _in("filter")},
                 {"out_backprop": "output"}),
    ),
    "Conv2DBackpropFilter": (
        GradCall("Conv2DBackpropInput", {"input_sizes": _shape("input"),
                                         "filter": _grad("output"),
                                         "out_backprop": _in("out_backprop")},
                 {"input": "output"}),
        GradCall("Conv2D", {"input": _in("input"), "filter": _grad("output")},
                 {"out_backprop": "output"}),
    ),
    # </conv2d>
    # <reduction>
    # </reduction>
    # <softmax_xent>
    # </softmax_xent>
    # <max_pool>
    # TF's _MaxPoolGrad: MaxPoolGrad of the forward's input and output. (TF differentiates
    # MaxPoolGrad with MaxPoolGradGrad, which tfgrad does not implement: no entry.)
    "MaxPool": (
        GradCall("MaxPoolGrad", {"orig_input": _in("input"), "orig_output": _out("output"),
                                 "grad": _grad("output")}, {"input": "output"}),
    ),
    # </max_pool>
    # <avg_pool>
    # TF's _AvgPoolGrad: AvgPoolGrad of the forward input's shape; _AvgPoolGradGrad:
    # AvgPool of the incoming gradient (its adjoint, in TF's AvgPool bits), none for the
    # shape.
    "AvgPool": (
        GradCall("AvgPoolGrad", {"orig_input_shape": _shape("value"),
                                 "grad": _grad("output")}, {"value": "output"}),
    ),
    "AvgPoolGrad": (
        GradCall("AvgPool", {"value": _grad("output")}, {"grad": "output"}),
    ),
    # </avg_pool>
    # <cwise>
    # TF's _RsqrtGrad: RsqrtGrad(y, grad) on the forward's output.
    "Rsqrt": (GradCall("RsqrtGrad", {"y": _out("y"), "dy": _grad("y")}, {"x": "z"}),),
    # </cwise>
}

@dataclass(frozen=True)
class Linearised:
    """A gradient op differentiated through its portable implementation."""

    inputs: tuple[str, ...]
    """The inputs that get gradients."""
    outputs: tuple[str, ...]
    """The outputs whose incoming gradients count."""


_BN_GRAD_GRAD = Linearised(("y_backprop", "x", "scale"),
                           ("x_backprop", "scale_backprop", "offset_backprop"))

LINEARISED: dict[str, Linearised] = {
    # TF's _FusedBatchNormGradGrad: the gradient of the composite _BatchNormGrad.
    "FusedBatchNormGrad": _BN_GRAD_GRAD,
    "FusedBatchNormGradV2": _BN_GRAD_GRAD,
    "FusedBatchNormGradV3": _BN_GRAD_GRAD,
    # Linear in out_backprop: its adjoint averages over the same cells.
    "FractionalAvgPoolGrad": Linearised(("out_backprop",), ("output",)),
    # <activation>
    # </activation>
    # <bias_add>
    # TF's _BiasAddGradGrad (reshape and tile): linear in out_backprop, the adjoint of the
    # per-channel sum is its broadcast, which the frameworks' autodiff gives exactly.
    "BiasAddGrad": Linearised(("out_backprop",), ("output",)),
    # </bias_add>
    # <matmul>
    # </matmul>
    # <conv2d>
    # </conv2d>
    # <reduction>
    # TF's _SumGrad / _MeanGrad: the incoming gradient broadcast back to the input's shape
    # (divided by float32(input size // output size) for Mean). Both are linear in input:
    # the portable implementation's own vjp (broadcast; a division by the same float32
    # count) computes those bits.
    "Sum": Linearised(("input",), ("output",)),
    "Mean": Linearised(("input",), ("output",)),
    # </reduction>
    # <softmax_xent>
    # TF's _SparseSoftmaxCrossEntropyWithLogitsGrad: grad_loss[:, None] * backprop (the
    # op's own output), plus, for an incoming gradient G of backprop, the softmax's
    # Jacobian (G - sum(G * softmax)) * softmax. The portable implementation's vjp is
    # exactly that: its backprop is TF's bits, held constant, times grad_loss (one
    # multiply), and its backprop output carries torch's / XLA's softmax as tangent.
    "SparseSoftmaxCrossEntropyWithLogits": Linearised(("features",), ("loss", "backprop")),
    # </softmax_xent>
    # <softmax>
    # TF's _SoftmaxGrad: (grad - Sum(grad * softmax, -1, keep_dims)) * softmax, a composite
    # of TF ops. The portable torch implementation's vjp is that composite on tfgrad's
    # Softmax and Sum (TF's bits on CPU). tfgrad.jax runs the composite itself as the
    # linearisation's transpose (tfgrad.jax._primitives._COMPOSITES).
    "Softmax": Linearised(("logits",), ("softmax",)),
    # </softmax>
    # <cwise>
    # TF's _SquaredDifferenceGrad: x_grad = (2 * grad) * (x - y), Sum over each input's
    # broadcast axes and Reshape, negated for y: a composite of TF ops, which the portable
    # torch implementation's backward runs on tfgrad's Sum (TF's bits on CPU for float32).
    "SquaredDifference": Linearised(("x", "y"), ("z",)),
    # TF's _RsqrtGradGrad: -1.5 * grad * dy * y^2 for y, RsqrtGrad(y, grad) for dy: a
    # composite, differentiated through the portable implementation.
    "RsqrtGrad": Linearised(("y", "dy"), ("z",)),
    # </cwise>
}


def calls(op_name: str, attrs: dict[str, Any]) -> tuple[GradCall, ...]:
    """The gradient calls that apply to ``op_name`` with these attrs."""
    return tuple(c for c in GRADIENTS.get(op_name, ()) if c.applies(attrs))


def differentiable_outputs(op_name: str) -> tuple[str, ...]:
    """The outputs whose incoming gradients TF's gradient function uses."""
    names = {f.name for c in GRADIENTS.get(op_name, ()) for f in c.args.values()
             if f.kind == "grad"}
    if op_name in LINEARISED:
        names.update(LINEARISED[op_name].outputs)
    return tuple(o.name for o in get_op_def(op_name).outputs if o.name in names)


def differentiable_inputs(op_name: str) -> tuple[str, ...]:
    """The inputs that get a gradient (under some attrs)."""
    if op_name in LINEARISED:
        return LINEARISED[op_name].inputs
    names = {k for c in GRADIENTS.get(op_name, ()) for k in c.gives}
    return tuple(i.name for i in get_op_def(op_name).inputs if i.name in names)


def has_gradient(op_name: str) -> bool:
    return op_name in GRADIENTS or op_name in LINEARISED


def _check_table() -> None:
    """Every name in the table is an input or output of the op it refers to."""
    for fwd, grad_calls in GRADIENTS.items():
        f = OPS[fwd]
        ins, outs = {i.name for i in f.inputs}, {o.name for o in f.outputs}
        for c in grad_calls:
            g = OPS[c.op]
            assert set(c.args) == {i.name for i in g.inputs}, (fwd, c.op)
            for src in c.args.values():
                assert src.name in (outs if src.kind in ("output", "grad") else ins), src
            assert set(c.gives) <= ins and set(c.gives.values()) <= {o.name for o in g.outputs}
            assert {a.name for a in g.attrs} <= {a.name for a in f.attrs}, c.op
            assert set(c.when) <= {a.name for a in f.attrs}
            assert set(c.fixed) <= {a.name for a in g.attrs}, c.op
    for op, lin in LINEARISED.items():
        assert set(lin.inputs) <= {i.name for i in OPS[op].inputs}, op
        assert set(lin.outputs) <= {o.name for o in OPS[op].outputs}, op


_check_table()


class Step(NamedTuple):
    """One gradient-op call of :func:`steps`."""

    op: str
    """The gradient op."""
    sources: tuple[tuple[str, str, str, int], ...]
    """Its inputs: (argument, kind, forward name, position), the position the forward
    output's index for ``"grad"`` and ``"output"``, the forward input's for ``"input"`` and
    ``"shape"`` (:class:`From`'s kinds)."""
    attrs: tuple[str, ...]
    """Its attrs, in the op table's order."""
    fixed: dict[str, Any]
    """The attrs the call sets itself (``GradCall.fixed``); the others are the forward's."""
    gives: tuple[tuple[str, int, int], ...]
    """(forward input, its position, the gradient op's output index) per gradient."""

    def call_attrs(self, forward_attrs: Any) -> dict[str, Any]:
        """The gradient op's attrs for a forward call with ``forward_attrs``."""
        fixed = self.fixed
        return {n: fixed[n] if n in fixed else forward_attrs[n] for n in self.attrs}


_WHEN = {name: tuple(sorted({k for c in grad_calls for k in c.when}))
         for name, grad_calls in GRADIENTS.items()}
_STEPS: dict[tuple, tuple[Step, ...]] = {}


def steps(op_name: str, attrs: Any) -> tuple[Step, ...]:
    """TF's gradient function of ``op_name`` for a call with these attrs (a mapping holding
    at least the attrs that choose the calls), worked out once per value of those."""
    key = (op_name, *(attrs[k] for k in _WHEN.get(op_name, ())))
    found = _STEPS.get(key)
    if found is None:
        op = OPS[op_name]
        ins = [i.name for i in op.inputs]
        outs = [o.name for o in op.outputs]
        made = []
        for c in calls(op_name, attrs):
            g = OPS[c.op]
            grad_outs = [o.name for o in g.outputs]
            made.append(Step(
                c.op,
                tuple((arg, src.kind, src.name,
                       (outs if src.kind in ("grad", "output") else ins).index(src.name))
                      for arg, src in c.args.items()),
                tuple(a.name for a in g.attrs), dict(c.fixed),
                tuple((k, ins.index(k), grad_outs.index(o)) for k, o in c.gives.items())))
        found = _STEPS[key] = tuple(made)
    return found
