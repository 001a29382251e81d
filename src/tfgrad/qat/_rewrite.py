"""tfmot's ``quantize_model`` as a rewrite of a Keras model config, without TensorFlow.

:func:`quantize_config` takes a float tf_keras model config (the JSON of a tf_keras
``.h5`` file's ``model_config`` attribute, or ``{"class_name": ..., "config":
model.get_config()}``; Functional or Sequential) and gives the config that
``tfmot.quantization.keras.quantize_model(model).save("x.h5")`` stores
(tensorflow-model-optimization 0.8.1, default 8-bit scheme, tf_keras 2.21):

1. the layout transforms of ``Default8BitQuantizeLayoutTransform``, in its list order,
   each applied until it matches no more, the whole list repeated until none matches,
   with ``ModelTransformer``'s matching rules (a pattern's non-head layers have exactly
   one consumer; a layer is matched as a head once per transform; a pattern's inputs
   are taken in the config's layer order, not the call's: see below);
2. every layer wrapped in ``QuantizeWrapperV2`` named ``quant_<layer>`` with the
   ``QuantizeConfig`` the transforms left in their metadata or else the one of
   ``Default8BitQuantizeRegistry``, serialized as tfmot serializes it;
3. the layers in the order tf_keras' ``Functional`` gives them (its depth-first
   topological sort from the outputs), which is what ``get_config`` lists.

This module ports ``ModelTransformer`` and the transforms onto the config's dicts rather
than re-deriving their outcome, because the outcome depends on their mechanics, quirks
included (each checked against tfmot in tests/test_qat_rewrite.py):

- a replaced group of layers moves to the end of the working layer list, which changes
  what later scans find first (a Concatenate feeding a Concatenate gets
  ``Default8BitOutputQuantizeConfig(quantize_output=False)`` or ``NoOpQuantizeConfig``
  depending on which is matched first);
- a pattern's inputs are looked up in that list's order, not the call's, and a
  replacement's non-leaf layers get their connections rewritten from them as
  ``[name, 0, 0, {}]``: a Concatenate's inputs can change order (tfmot issue #1061:
  ``[b, x2, a]`` becomes ``[b, a, x2]``), a repeated input is dropped
  (``[a, a, b]`` becomes ``[a, b]``, fewer channels), and call kwargs are lost (a
  BatchNormalization called with ``training=False`` after a Conv2D runs in training
  mode in the QAT model);
- a QuantizeConfig is compared by identity or by value as tfmot's classes define
  ``__eq__``, which decides whether a transform "changed" anything.

Naming of the layers tfmot creates (the input ``QuantizeLayer``, and the
``DepthwiseConv2D`` + ``Conv2D`` that replace a ``SeparableConv2D``): tfmot lets Keras
name them from its per-process counters, so in a fresh process (one that loaded the
model from a file) they are ``quantize_layer``, ``quantize_layer_1``, ...,
``depthwise_conv2d``, ``conv2d``, ``depthwise_conv2d_1``, ``conv2d_1``, ... in the
order the transforms create them; Keras does not check those names against the model's,
so a model that already has a ``conv2d`` gets two layers of that name and tfmot's
``quantize_model`` fails (or, in a process whose counters had moved on, names differ).
**tfgrad gives the name tfmot gives in a fresh process where it is free, and otherwise
takes the counter's next value that no layer of the model has** (``conv2d_1``, ...), as
Keras' ``unique_object_name`` does with ``avoid_names``; so the rewrite never collides
and equals tfmot's output whenever tfmot's own run succeeds in a fresh process.

The config written is the ``.h5`` form: each top-level layer entry is ``class_name``,
``config`` (and ``name`` and ``inbound_nodes`` in a Functional model), without the
``module``, ``registered_name`` and ``build_config`` that ``get_config`` adds (the
wrapped inner layer keeps them, as tfmot writes it). Inner layer configs are copied as
given; tfmot round-trips them through tf_keras 2.21, which leaves a tf_keras 2.21
config as it is.

Refused (:class:`UnsupportedLayerError`, tfmot's message in gist): layers outside
``Default8BitQuantizeRegistry`` that no transform rewrites (a BatchNormalization not
after a linear Conv2D / DepthwiseConv2D / Dense that it alone consumes, Conv1D,
Multiply, ...); activations tfmot's QuantizeAwareActivation or
Default8BitActivationQuantizeConfig refuse; nested models; Lambda layers (tfmot leaves
them unquantized with a warning; tfgrad does not build them); and layers tfmot
quantizes but tfgrad's QAT models do not build (not in :data:`SUPPORTED`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ._plan import SUPPORTED, UnsupportedLayerError, infer_shape, layer_weights
from ._transformer import (
    _graph_order,
    _inbound_names,
    _name,
    _Node,
    _Pattern,
    _Transform,
    _Transformer,
)

__all__ = ["quantize_config"]

_QAA_MODULE = ("tensorflow_model_optimization.python.core.quantization.keras."
               "quantize_aware_activation")
_ALL_VALUES = {"class_name": "AllValuesQuantizer",
               "config": {"num_bits": 8, "per_axis": False, "symmetric": False,
                          "narrow_range": False}}
# tf_keras' serialization of a default initializer, as a fresh layer writes it.
_ZEROS = {"module": "keras.initializers", "class_name": "Zeros", "config": {},
          "registered_name": None}
_NOOP_ACTIVATION = {"class_name": "NoOpActivation", "config": {}}

# QuantizeAwareActivation's accepted activations (quantize_aware_activation.py); any
# other raises ValueError when the wrapper builds.
_QAA_ACTIVATIONS = frozenset({"softmax", "sigmoid", "tanh", "gelu", "linear", "relu",
                              "swish"})
# Default8BitActivationQuantizeConfig.get_output_quantizers: these, else ValueError.
_ACTIVATION_LAYER_OK = frozenset({"relu", "swish", "gelu", "relu6", "linear", "softmax",
                                  "sigmoid", "tanh"})


# --- tfmot's QuantizeConfig classes -----------------------------------------------------
# Equality matters: ModelTransformer skips a replacement equal to its match, and tfmot's
# Default8BitQuantizeConfig (and its Conv subclasses) compare by value while
# Default8BitActivationQuantizeConfig, Default8BitOutputQuantizeConfig and
# NoOpQuantizeConfig have no __eq__ (identity). The classes below keep those semantics.

class _QuantizeConfig:
    class_name = ""

    def get_config(self) -> dict[str, Any]:
        return {}

    def serialize(self) -> dict[str, Any]:
        return {"class_name": self.class_name, "config": self.get_config()}


class _Default8Bit(_QuantizeConfig):
    """Default8BitQuantizeConfig and its per-axis Conv / ConvTranspose subclasses."""

    def __init__(self, weight_attrs: list[str], activation_attrs: list[str],
                 quantize_output: bool, class_name: str = "Default8BitQuantizeConfig"
                 ) -> None:
        self.weight_attrs = list(weight_attrs)
        self.activation_attrs = list(activation_attrs)
        self.quantize_output = quantize_output
        self.class_name = class_name

    def get_config(self) -> dict[str, Any]:
        return {"weight_attrs": list(self.weight_attrs),
                "activation_attrs": list(self.activation_attrs),
                "quantize_output": self.quantize_output}

    def _weight_quantizer(self) -> tuple[bool, ...]:
        # LastValueQuantizer.__eq__ compares num_bits, per_axis, symmetric, narrow_range:
        # per axis for Default8BitConvWeightsQuantizer only.
        return (self.class_name == "Default8BitConvQuantizeConfig",)

    def __eq__(self, other: object) -> bool:
        # tfmot's __eq__ compares activation_attrs with itself (a bug), so not at all.
        return (isinstance(other, _Default8Bit)
                and self.weight_attrs == other.weight_attrs
                and self._weight_quantizer() == other._weight_quantizer()
                and self.quantize_output == other.quantize_output)

    __hash__ = None  # type: ignore[assignment]


class _ActivationConfig(_QuantizeConfig):
    class_name = "Default8BitActivationQuantizeConfig"

    def __init__(self, quantize_output: bool = True) -> None:
        self.quantize_output = quantize_output

    def get_config(self) -> dict[str, Any]:
        return {"quantize_output": self.quantize_output}


class _OutputConfig(_ActivationConfig):
    class_name = "Default8BitOutputQuantizeConfig"


class _NoOpConfig(_QuantizeConfig):
    class_name = "NoOpQuantizeConfig"


# --- Default8BitQuantizeRegistry, by Keras class name -----------------------------------

_OUTPUT = ([], [], True)
_NOTHING: tuple[list[str], list[str], bool] = ([], [], False)
_REGISTRY: dict[str, tuple[list[str], list[str], bool]] = {
    "ReLU": _OUTPUT, "Softmax": _NOTHING, "LeakyReLU": _OUTPUT, "Concatenate": _OUTPUT,
    "Cropping1D": _NOTHING, "Cropping2D": _NOTHING, "Cropping3D": _NOTHING,
    "UpSampling2D": _OUTPUT, "ZeroPadding1D": _NOTHING, "ZeroPadding2D": _NOTHING,
    "ActivityRegularization": _NOTHING, "Dense": (["kernel"], ["activation"], False),
    "Dropout": _NOTHING, "Flatten": _NOTHING, "Permute": _NOTHING, "Reshape": _NOTHING,
    "SpatialDropout1D": _NOTHING, "SpatialDropout2D": _NOTHING,
    "SpatialDropout3D": _NOTHING, "AveragePooling1D": _OUTPUT, "AveragePooling2D": _OUTPUT,
    "GlobalAveragePooling1D": _OUTPUT, "GlobalAveragePooling2D": _OUTPUT,
    "GlobalAveragePooling3D": _OUTPUT, "GlobalMaxPooling1D": _NOTHING,
    "GlobalMaxPooling2D": _NOTHING, "GlobalMaxPooling3D": _NOTHING,
    "MaxPooling2D": _NOTHING, "Add": _OUTPUT,
}
_SPECIAL = {"Conv2D": (["kernel"], "Default8BitConvQuantizeConfig"),
            "DepthwiseConv2D": (["depthwise_kernel"], "Default8BitConvQuantizeConfig"),
            "Conv2DTranspose": (["kernel"], "Default8BitConvTransposeQuantizeConfig")}


class _Registry:
    """One Default8BitQuantizeRegistry: like tfmot's, it holds one
    Default8BitActivationQuantizeConfig that every Activation layer shares."""

    def __init__(self) -> None:
        self._activation = _ActivationConfig()

    @staticmethod
    def supports(class_name: str) -> bool:
        return class_name in _REGISTRY or class_name in _SPECIAL or class_name == "Activation"

    def get(self, class_name: str) -> _QuantizeConfig:
        if class_name == "Activation":
            return self._activation
        if class_name in _SPECIAL:
            attrs, cls = _SPECIAL[class_name]
            return _Default8Bit(attrs, ["activation"], False, cls)
        w, a, out = _REGISTRY[class_name]
        return _Default8Bit(w, a, out)


# --- the transforms (default_8bit/default_8bit_transforms.py) -----------------------------

def _custom(*nodes: _Node) -> bool:
    return any(n.metadata.get("quantize_config") is not None for n in nodes)


class _InputLayerQuantize(_Transform):
    key = "InputLayerQuantize"

    def pattern(self) -> _Pattern:
        return _Pattern("InputLayer")

    def replacement(self, match: _Node, tr: _Transformer) -> _Node:
        name = tr.namer("quantize_layer")
        layer = {"class_name": "QuantizeLayer",
                 "config": {"name": name, "trainable": True, "dtype": "float32",
                            "quantizer": copy.deepcopy(_ALL_VALUES)},
                 "name": name}
        return _Node(layer, [match])


class _SeparableConvQuantize(_Transform):
    key = "SeparableConvQuantize"

    def pattern(self) -> _Pattern:
        return _Pattern("SeparableConv2D")

    def replacement(self, match: _Node, tr: _Transformer) -> _Node:
        if _custom(match):
            return match
        c = match.layer["config"]
        # The configs of tfmot's keras.layers.DepthwiseConv2D(...) and Conv2D(...) calls
        # as tf_keras 2.21 serializes them (keys in its order); both are named by Keras'
        # counters, the depthwise one first.
        dname = tr.namer("depthwise_conv2d")
        dconv = {
            "name": dname, "trainable": c.get("trainable", True), "dtype": "float32",
            "kernel_size": c["kernel_size"], "strides": c["strides"],
            "padding": c["padding"], "data_format": c["data_format"],
            "dilation_rate": c["dilation_rate"], "groups": 1, "activation": "linear",
            "use_bias": False, "bias_initializer": copy.deepcopy(_ZEROS),
            "bias_regularizer": None, "activity_regularizer": None, "bias_constraint": None,
            "depth_multiplier": c["depth_multiplier"],
            "depthwise_initializer": c["depthwise_initializer"],
            "depthwise_regularizer": c["depthwise_regularizer"],
            "depthwise_constraint": c["depthwise_constraint"],
        }
        cname = tr.namer("conv2d")
        conv = {
            "name": cname, "trainable": c.get("trainable", True), "dtype": "float32",
            "filters": c["filters"], "kernel_size": [1, 1], "strides": [1, 1],
            "padding": "valid", "data_format": c["data_format"],
            # tfmot passes the separable conv's dilation_rate on (harmless at 1x1).
            "dilation_rate": c["dilation_rate"], "groups": 1,
            "activation": c["activation"], "use_bias": c["use_bias"],
            "kernel_initializer": c["pointwise_initializer"],
            "bias_initializer": c["bias_initializer"],
            "kernel_regularizer": c["pointwise_regularizer"],
            "bias_regularizer": c["bias_regularizer"],
            "activity_regularizer": c["activity_regularizer"],
            "kernel_constraint": c["pointwise_constraint"],
            "bias_constraint": c["bias_constraint"],
        }
        sep = c["name"]
        tr.sources[f"{dname}/depthwise_kernel:0"] = f"{sep}/depthwise_kernel:0"
        tr.sources[f"{cname}/kernel:0"] = f"{sep}/pointwise_kernel:0"
        if c["use_bias"]:
            tr.sources[f"{cname}/bias:0"] = f"{sep}/bias:0"
        dnode = _Node({"class_name": "DepthwiseConv2D", "config": copy.deepcopy(dconv),
                       "name": dname}, [], {"quantize_config": None})
        return _Node({"class_name": "Conv2D", "config": copy.deepcopy(conv), "name": cname},
                     [dnode], {"quantize_config": None})


_BN = "BatchNormalization|SyncBatchNormalization"


class _ConvBatchNorm(_Transform):
    """Conv2DBatchNormQuantize and DenseBatchNormQuantize: the producer's activation
    becomes NoOpActivation, BN gets Default8BitOutputQuantizeConfig."""

    def __init__(self, producer: str, key: str) -> None:
        self.producer = producer
        self.key = key

    def pattern(self) -> _Pattern:
        return _Pattern(_BN, inputs=[_Pattern(self.producer, {"activation": "linear"})])

    def replacement(self, match: _Node, tr: _Transformer) -> _Node:
        bn, conv = match, match.input_layers[0]
        if _custom(bn, conv):
            return bn
        conv.layer["config"]["activation"] = copy.deepcopy(_NOOP_ACTIVATION)
        bn.metadata["quantize_config"] = _OutputConfig()
        return bn


class _ConvBatchNormReLU(_ConvBatchNorm):
    """...BatchNormReLUQuantize / ...BatchNormActivationQuantize: BN gets
    NoOpQuantizeConfig (the FQ sits after the ReLU)."""

    def __init__(self, producer: str, key: str, activation: bool) -> None:
        super().__init__(producer, key)
        self.activation = activation

    def pattern(self) -> _Pattern:
        inner = super().pattern()
        if self.activation:
            return _Pattern("Activation", {"activation": "relu"}, [inner])
        return _Pattern("ReLU", inputs=[inner])

    def replacement(self, match: _Node, tr: _Transformer) -> _Node:
        relu = match
        bn = relu.input_layers[0]
        conv = bn.input_layers[0]
        if _custom(relu, bn, conv):
            return relu
        conv.layer["config"]["activation"] = copy.deepcopy(_NOOP_ACTIVATION)
        bn.metadata["quantize_config"] = _NoOpConfig()
        return relu


class _Concat(_Transform):
    """ConcatTransform with n inputs: feeders' output FQs off, one on the concat."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.key = "ConcatTransform" if n == 2 else f"ConcatTransform{n}Inputs"

    def pattern(self) -> _Pattern:
        return _Pattern("Concatenate", inputs=[_Pattern(".*") for _ in range(self.n)])

    def replacement(self, match: _Node, tr: _Transformer) -> _Node:
        registry = _Registry()
        configs: list[_QuantizeConfig] = []
        for feed in match.input_layers:
            qc = feed.metadata.get("quantize_config")
            if not qc:
                cls = feed.layer["class_name"]
                if cls == "Concatenate":
                    feed.metadata["quantize_config"] = _NoOpConfig()
                    continue
                if cls == "QuantizeLayer":
                    feed.metadata["quantizer"] = None
                    continue
                if not registry.supports(cls):
                    # tfmot returns the (copied) match here, keeping what it already set
                    # on earlier feeders.
                    return match
                qc = registry.get(cls)
                feed.metadata["quantize_config"] = qc
            configs.append(qc)
        for qc in configs:
            if hasattr(qc, "quantize_output"):
                qc.quantize_output = False
        if not match.metadata.get("quantize_config"):
            match.metadata["quantize_config"] = _OutputConfig()
        return match


class _LayerReLU(_Transform):
    """LayerReLUQuantize / LayerReluActivationQuantize: the producer gets NoOp."""

    def __init__(self, activation: bool) -> None:
        self.activation = activation
        self.key = "LayerReluActivationQuantize" if activation else "LayerReLUQuantize"

    def pattern(self) -> _Pattern:
        inner = _Pattern("Add|Conv2D|DepthwiseConv2D|Dense")
        if self.activation:
            return _Pattern("Activation", {"activation": "relu"}, [inner])
        return _Pattern("ReLU", inputs=[inner])

    def replacement(self, match: _Node, tr: _Transformer) -> _Node:
        match.input_layers[0].metadata["quantize_config"] = _NoOpConfig()
        return match


def _transforms() -> list[_Transform]:
    # Default8BitQuantizeLayoutTransform.apply's list, less SeparableConv1DQuantize and
    # the four Conv2DReshapeBatchNorm* transforms: they match only SeparableConv1D and
    # the Lambda layers it becomes, which quantize_config refuses up front.
    conv = "Conv2D|DepthwiseConv2D"
    return [
        _InputLayerQuantize(),
        _SeparableConvQuantize(),
        _ConvBatchNormReLU(conv, "Conv2DBatchNormReLUQuantize", False),
        _ConvBatchNormReLU(conv, "Conv2DBatchNormActivationQuantize", True),
        _ConvBatchNorm(conv, "Conv2DBatchNormQuantize"),
        _Concat(6), _Concat(5), _Concat(4), _Concat(3), _Concat(2),
        _ConvBatchNorm("Dense", "DenseBatchNormQuantize"),
        _ConvBatchNormReLU("Dense", "DenseBatchNormReLUQuantize", False),
        _ConvBatchNormReLU("Dense", "DenseBatchNormActivationQuantize", True),
        _LayerReLU(False),
        _LayerReLU(True),
    ]


# --- reading the float config -----------------------------------------------------------

_TOP_KEYS = ("class_name", "config", "name", "inbound_nodes")
_ALREADY_QAT = ("QuantizeLayer", "QuantizeWrapper", "QuantizeWrapperV2", "QuantizeAnnotate")
_MODELS = ("Functional", "Model", "Sequential")


def _where(layer: Mapping[str, Any]) -> str:
    return f"layer {_name(layer)!r} ({layer['class_name']})"


def _refuse_upfront(layer: Mapping[str, Any]) -> None:
    cls = layer["class_name"]
    where = _where(layer)
    if cls in _ALREADY_QAT:
        raise UnsupportedLayerError(f"{where}: the model is already quantized (tfmot's QAT "
                                    "layers); quantize_config takes a float model")
    if cls in _MODELS:
        raise UnsupportedLayerError(f"{where}: a nested model; tfmot's quantize_model "
                                    "refuses it ('Quantizing a keras Model inside another "
                                    "keras Model is not supported.')")
    if cls in ("Lambda", "TFOpLambda", "SlicingOpLambda"):
        raise UnsupportedLayerError(
            f"{where}: tfmot's quantize_model does not quantize Lambda layers (it leaves "
            "them unwrapped, with a warning: 'Lambda layers are not supported by automatic "
            "model annotation'), and tfgrad does not build them")
    if cls == "SeparableConv1D":
        raise UnsupportedLayerError(f"{where}: tfmot rewrites SeparableConv1D into Lambda "
                                    "layers around a SeparableConv2D; tfgrad does not build "
                                    "that")
    if cls in ("InputLayer", "BatchNormalization", "SeparableConv2D") or _Registry.supports(cls):
        if cls not in SUPPORTED:
            raise UnsupportedLayerError(
                f"{where}: tfmot quantizes this layer, but tfgrad's QAT models do not build "
                f"it (they build {', '.join(SUPPORTED)})")
        return
    raise UnsupportedLayerError(_not_supported(layer))


def _not_supported(layer: Mapping[str, Any]) -> str:
    name, cls = _name(layer), layer["class_name"]
    hint = ""
    if cls == "BatchNormalization":
        hint = (" (tfmot quantizes a BatchNormalization only right after a Conv2D, "
                "DepthwiseConv2D or Dense with a linear activation whose only consumer it is)")
    return (f"Layer {name}:{cls} is not supported: tfmot's quantize_model raises RuntimeError "
            "'Layer ... is not supported. You can quantize this layer by passing a "
            "`tfmot.quantization.keras.QuantizeConfig` instance to the "
            f"`quantize_annotate_layer` API.' (not in Default8BitQuantizeRegistry){hint}")


def _strip(layer: Mapping[str, Any], functional: bool) -> dict[str, Any]:
    # The transformer's view of a layer: tfmot's legacy get_config entry, which has no
    # module / registered_name / build_config.
    out = {k: copy.deepcopy(layer[k]) for k in _TOP_KEYS if k in layer}
    out["name"] = out["config"]["name"]
    if functional:
        out.setdefault("inbound_nodes", [])
    else:
        out.pop("inbound_nodes", None)
    return out


def _as_list(entries: Any, what: str) -> list[list[Any]]:
    if not isinstance(entries, list) or not entries:
        raise UnsupportedLayerError(f"the model's {what} must be a list of layers (tfgrad "
                                    "does not take dict inputs or outputs)")
    if isinstance(entries[0], str):
        entries = [entries]
    return [list(e) for e in entries]


def _check_connections(layer: Mapping[str, Any]) -> None:
    nodes = layer.get("inbound_nodes", [])
    if len(nodes) > 1:
        raise UnsupportedLayerError(f"{_where(layer)} is called {len(nodes)} times (a shared "
                                    "layer); tfgrad's QAT models take each layer once")
    for node in nodes:
        if not isinstance(node, list):
            raise UnsupportedLayerError(f"{_where(layer)}: inbound node {node!r} is not a "
                                        "tf_keras (Keras 2) connection list")
        for info in node:
            if not (isinstance(info, list) and len(info) == 4 and isinstance(info[0], str)
                    and isinstance(info[3], dict)):
                raise UnsupportedLayerError(f"{_where(layer)}: inbound connection {info!r} "
                                            "is not tf_keras' [layer, node, tensor, kwargs]")


# --- the final model ----------------------------------------------------------------------

def _activation_name(act: Any) -> str | None:
    if isinstance(act, str):
        return act
    if act is None:
        return "linear"
    if isinstance(act, Mapping) and act.get("class_name") == "NoOpActivation":
        return "NoOpActivation"
    return None


def _inner(layer: dict[str, Any], qc: _QuantizeConfig | None,
           in_shapes: list[tuple[int | None, ...]]) -> dict[str, Any]:
    cfg = copy.deepcopy(layer["config"])
    where = _where(layer)
    if isinstance(qc, _Default8Bit) and "activation" in qc.activation_attrs:
        act = cfg.get("activation")
        name = _activation_name(act)
        if name not in _QAA_ACTIVATIONS and name != "NoOpActivation":
            raise UnsupportedLayerError(
                f"{where}: activation {act!r}: tfmot's QuantizeAwareActivation raises "
                "ValueError ('Only some Keras activations under `keras.activations` are "
                f"supported'); it takes {', '.join(sorted(_QAA_ACTIVATIONS))}")
        cfg["activation"] = {"module": _QAA_MODULE, "class_name": "QuantizeAwareActivation",
                             "config": {"activation": copy.deepcopy(act)},
                             "registered_name": "QuantizeAwareActivation"}
    if isinstance(qc, _ActivationConfig) and not isinstance(qc, _OutputConfig) \
            and qc.quantize_output:
        name = _activation_name(cfg.get("activation"))
        if name not in _ACTIVATION_LAYER_OK:
            raise UnsupportedLayerError(
                f"{where}: activation {cfg.get('activation')!r}: tfmot raises ValueError "
                "('Activation ... not supported by Default8BitActivationQuantizeConfig'); it "
                f"takes {', '.join(sorted(_ACTIVATION_LAYER_OK))}")
    shape: Any = ([list(s) for s in in_shapes] if len(in_shapes) > 1
                  else list(in_shapes[0]) if in_shapes else None)
    return {"module": "keras.layers", "class_name": layer["class_name"], "config": cfg,
            "registered_name": None, "build_config": {"input_shape": shape}}


def quantize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The model config ``tfmot.quantization.keras.quantize_model`` gives for a float
    tf_keras model config, as its ``.h5`` file stores it. See the module docstring."""
    return quantize_config_and_sources(config)[0]


def quantize_config_and_sources(config: Mapping[str, Any]
                                ) -> tuple[dict[str, Any], dict[str, str]]:
    """:func:`quantize_config`, and for the weights of the layers the rewrite creates
    their names in the float model (``{"conv2d/kernel:0": "sep/pointwise_kernel:0"}``)."""
    cls = config.get("class_name") if isinstance(config, Mapping) else None
    if cls not in _MODELS:
        raise UnsupportedLayerError(
            f"a {cls} model: tfmot's quantize_model takes Sequential and Functional models")
    body = config.get("config")
    if cls == "Sequential" and isinstance(body, list):  # the oldest Sequential form
        body = {"name": "sequential", "layers": body}
    if not isinstance(body, Mapping) or not isinstance(body.get("layers"), list):
        raise UnsupportedLayerError("not a Keras model config: no config.layers")
    functional = cls != "Sequential"
    raw = list(body["layers"])
    for layer in raw:
        _refuse_upfront(layer)
        if functional:
            _check_connections(layer)
    layers = [_strip(x, functional) for x in raw]
    if not functional and (not layers or layers[0]["class_name"] != "InputLayer"):
        first = layers[0]["config"] if layers else {}
        shape = first.get("batch_input_shape")
        if shape is None:
            raise UnsupportedLayerError("a Sequential model without an input shape (give its "
                                        "first layer input_shape, or an Input)")
        # what tf_keras' Sequential adds, and get_config then lists
        name = f"{first['name']}_input"
        layers.insert(0, {"class_name": "InputLayer", "name": name,
                          "config": {"batch_input_shape": shape,
                                     "dtype": first.get("dtype", "float32"),
                                     "sparse": False, "ragged": False, "name": name,
                                     "optional": False}})
    names = [_name(x) for x in layers]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise UnsupportedLayerError(f"two layers are named {dup!r}")
    if functional:
        inputs = [e[0] for e in _as_list(body.get("input_layers"), "input_layers")]
        outputs = _as_list(copy.deepcopy(body.get("output_layers")), "output_layers")
    else:
        inputs, outputs = [names[0]], [[names[-1], 0, 0]]

    float_weights = _float_weight_shapes(layers, functional)

    # quantize_apply: every layer but the inputs is annotated ({'quantize_config': None});
    # an input is in the map (as {}) when a layer it feeds is annotated.
    metadata: dict[str, dict[str, Any]] = {}
    for layer in layers:
        if layer["class_name"] != "InputLayer":
            metadata[_name(layer)] = {"quantize_config": None}
    for layer in layers:
        if layer["class_name"] == "InputLayer":
            feeds = (any(_name(layer) in _inbound_names(x) for x in layers) if functional
                     else len(layers) > 1)
            if feeds:
                metadata[_name(layer)] = {}
    tr = _Transformer(layers, outputs, functional, metadata, set(metadata))
    tr.transform(_transforms())

    ordered = (_graph_order(tr.layers, inputs, [o[0] for o in outputs]) if functional
               else tr.layers)
    return _wrap(ordered, tr, body, functional, inputs, outputs, float_weights), tr.sources


def _float_weight_shapes(layers: list[dict[str, Any]], functional: bool
                         ) -> dict[str, list[tuple[int, ...]]]:
    """The float model's weight shapes by layer, which tfmot copies into its rewrite."""
    shapes: dict[str, tuple[int | None, ...]] = {}
    out: dict[str, list[tuple[int, ...]]] = {}
    prev: str | None = None
    for layer in layers:
        n, cls, cfg = _name(layer), layer["class_name"], layer["config"]
        ins = _inbound_names(layer) if functional else ([prev] if prev else [])
        prev = n
        if cls == "InputLayer":
            shape = cfg.get("batch_input_shape") or cfg.get("batch_shape")
            if shape is None:
                raise UnsupportedLayerError(f"{_where(layer)}: no input shape")
            shapes[n] = tuple(shape)
            continue
        if any(i not in shapes for i in ins):
            raise UnsupportedLayerError(f"{_where(layer)} takes a layer that comes later in "
                                        "the config or not at all")
        in_shapes = [shapes[i] for i in ins]
        shapes[n] = infer_shape(cls, cfg, in_shapes, _where(layer))
        out[n] = [w.shape for w in layer_weights(cls, cfg, in_shapes[0] if in_shapes else (),
                                                 n)]
    return out


class _SharedIds:
    """tf_keras' SharedObjectSavingScope, which Functional's get_network_config opens
    around its layers (Sequential.get_config opens none: no ids there). When
    model.save('x.h5') serializes a Functional config, every object its legacy serializer
    writes takes the next id (the layers, each QuantizeLayer's quantizer, each wrapper's
    QuantizeConfig, a NoOpActivation inside a QuantizeAwareActivation); an object written
    again (one Python QuantizeConfig held by several wrappers) is written with the id of
    its first writing, which gets it too. tfmot's Default8BitQuantizeConfig family defines
    ``__eq__`` and so is unhashable: the scope cannot track it (it never shares), though
    it still takes an id."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.next = 0
        self.seen: dict[int, tuple[int, dict[str, Any]]] = {}

    def take(self) -> None:
        self.next += 1

    def config(self, qc: _QuantizeConfig) -> dict[str, Any]:
        if not self.enabled:
            return qc.serialize()
        if id(qc) in self.seen:
            sid, first = self.seen[id(qc)]
            first["shared_object_id"] = sid
            return {**qc.serialize(), "shared_object_id": sid}
        out = qc.serialize()
        if not isinstance(qc, _Default8Bit):
            self.seen[id(qc)] = (self.next, out)
        self.take()
        return out


def _wrap(ordered: list[dict[str, Any]], tr: _Transformer, body: Mapping[str, Any],
          functional: bool, inputs: list[str], outputs: list[list[Any]],
          float_weights: dict[str, list[tuple[int, ...]]]) -> dict[str, Any]:
    """quantize_apply's last clone: each layer in its QuantizeWrapperV2."""
    registry = _Registry()
    ids = _SharedIds(functional)
    final: dict[str, str] = {}  # layer name -> its name in the quantized model
    for layer in ordered:
        n = _name(layer)
        final[n] = n if layer["class_name"] in ("InputLayer", "QuantizeLayer") else f"quant_{n}"
    if len(set(final.values())) != len(final):
        raise UnsupportedLayerError("the quantized model would have two layers of one name "
                                    "(a layer named quant_<another layer>)")

    def parents(layer: Mapping[str, Any]) -> list[str]:
        return [info[0] for node in layer.get("inbound_nodes", []) for info in node]

    outbound: dict[str, int] = {}
    if functional:
        for layer in ordered:
            for p in parents(layer):
                outbound[p] = outbound.get(p, 0) + 1
    # Shapes first: tfmot copies the float weights into the transformed model (and fails
    # where their shapes changed) before it wraps any layer.
    shapes: dict[str, tuple[int | None, ...]] = {}
    in_shapes_of: dict[str, list[tuple[int | None, ...]]] = {}
    prev: str | None = None
    for layer in ordered:
        n, cls, cfg = _name(layer), layer["class_name"], layer["config"]
        ins = parents(layer) if functional else ([prev] if prev else [])
        prev = n
        in_shapes = in_shapes_of[n] = [shapes[i] for i in ins]
        if cls == "InputLayer":
            shapes[n] = tuple(cfg.get("batch_input_shape") or cfg.get("batch_shape"))
        elif cls == "QuantizeLayer":
            shapes[n] = in_shapes[0]
        else:
            shapes[n] = infer_shape(cls, cfg, in_shapes, _where(layer))
            if n in float_weights:
                before = float_weights[n]
                after = [w.shape for w in layer_weights(
                    cls, cfg, in_shapes[0] if in_shapes else (), n)]
                if before != after:
                    # a Concatenate that lost a repeated input upstream (see the module
                    # docstring)
                    raise UnsupportedLayerError(
                        f"{_where(layer)}: tfmot's rewrite changes its weights' shapes from "
                        f"{before} to {after}, and quantize_model fails ('Cannot assign "
                        "value to variable ...: Shape mismatch')")

    out_layers: list[dict[str, Any]] = []
    for layer in ordered:
        n, cls = _name(layer), layer["class_name"]
        in_shapes = in_shapes_of[n]
        if cls == "InputLayer":
            entry_cfg = copy.deepcopy(layer["config"])
            ids.take()
        elif cls == "QuantizeLayer":
            entry_cfg = copy.deepcopy(layer["config"])
            # quantize_apply applies the transforms' metadata (quantizer None after a
            # Concatenate transform) unless the layer feeds more than one call.
            if outbound.get(n, 0) <= 1 and n in tr.metadata:
                entry_cfg.update(copy.deepcopy(tr.metadata[n]))
            if entry_cfg.get("quantizer") is not None:
                ids.take()
            ids.take()
        else:
            # Every layer here is annotated and so in the metadata; quantize_apply takes
            # the registry's config where the transforms left none.
            qc = tr.metadata.get(n, {}).get("quantize_config")
            if not qc:
                if not _Registry.supports(cls):
                    raise UnsupportedLayerError(_not_supported(layer))
                qc = registry.get(cls)
            inner = _inner(layer, qc, in_shapes)
            act = inner["config"].get("activation")
            if isinstance(act, dict) and isinstance(act.get("config", {}).get("activation"),
                                                    dict):
                # QuantizeAwareActivation writes a NoOpActivation with the legacy
                # serializer, before the wrapper writes its QuantizeConfig
                ids.take()
            # QuantizeWrapper.trainable is its inner layer's
            entry_cfg = {"name": final[n], "trainable": layer["config"].get("trainable", True),
                         "dtype": "float32", "layer": inner,
                         "quantize_config": ids.config(qc)}
            ids.take()
            cls = "QuantizeWrapperV2"
        entry: dict[str, Any] = {"class_name": cls, "config": entry_cfg}
        if functional:
            entry["name"] = final[n]
            nodes = copy.deepcopy(layer.get("inbound_nodes", []))
            for node in nodes:
                for info in node:
                    info[0] = final[info[0]]
            entry["inbound_nodes"] = nodes
        out_layers.append(entry)
    name = body.get("name", "model" if functional else "sequential")
    if not functional:
        return {"class_name": "Sequential", "config": {"name": name, "layers": out_layers}}
    # quantize_apply's clone is a new Functional: trainable, whatever the float model was.
    return {"class_name": "Functional",
            "config": {"name": name, "trainable": True, "layers": out_layers,
                       "input_layers": [[i, 0, 0] for i in inputs],
                       "output_layers": [[final[o[0]], *o[1:]] for o in outputs]}}
