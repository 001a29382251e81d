"""tfmot's QAT scheme as data: the plan that every framework's builder reads.

A :class:`Plan` is the model's layers in graph order, each with its inputs, its weights
(tf_keras' names, shapes and order in an ``.h5`` file) and its quantizers (kind, bits,
per-axis, symmetric, narrow range, the range variables' names and initial values, and
where each sits). It is built once from a Keras model config:

- a tfmot QAT config (``QuantizeLayer`` and ``QuantizeWrapperV2`` layers, as
  ``quantize_model(m).save('m.h5')`` writes it): read as saved;
- a float config with ``quantize=True``: first rewritten as tfmot's ``quantize_model``
  rewrites it (:mod:`tfgrad.qat._rewrite`), then read the same way;
- a float config with ``quantize=False``: the float model, no quantizers.

Nothing here imports a framework.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import InvalidArgumentError


class UnsupportedLayerError(InvalidArgumentError):
    """A layer (or a layer option) that tfgrad's QAT models do not build, or that tfmot's
    default 8-bit scheme refuses to quantize."""


@dataclass(frozen=True)
class Quantizer:
    """One of tfmot's quantizers, with its two range variables.

    kind: ``"last_value"`` (weights: the batch's range), ``"moving_average"`` (activations
    and outputs: ``var - (var - v) * float32(1 - 0.999)``), ``"all_values"`` (the model
    input: the running min/max, from 0/0).
    """

    kind: str
    num_bits: int
    per_axis: bool
    symmetric: bool
    narrow_range: bool
    min_name: str  # tf_keras weight names, e.g. "quant_conv2d/kernel_min:0"
    max_name: str
    shape: tuple[int, ...]  # () per tensor, (C,) per axis
    init: tuple[float, float]


@dataclass(frozen=True)
class Weight:
    """A weight of a layer: its tf_keras name, attribute, shape and whether it trains."""

    name: str  # e.g. "conv2d/kernel:0"
    attr: str  # e.g. "kernel", "moving_mean", "kernel_min", "optimizer_step"
    shape: tuple[int, ...]
    trainable: bool
    dtype: str = "float32"


@dataclass(frozen=True)
class Node:
    """One layer of the plan.

    ``name`` is the layer's name in the Keras model (the wrapper's, ``quant_conv2d``, for a
    wrapped layer), ``inner`` the wrapped layer's own name (``conv2d``). ``kind`` is the
    Keras class of the computation (``Conv2D``; ``QuantizeLayer`` for tfmot's input
    quantizer). Quantizers by place: ``weights`` (attr -> quantizer), ``pre_activation``,
    ``post_activation``, ``output``.
    """

    name: str
    inner: str
    kind: str
    config: Mapping[str, Any]
    inputs: tuple[str, ...]
    input_shapes: tuple[tuple[int | None, ...], ...]
    output_shape: tuple[int | None, ...]
    weights: tuple[Weight, ...]
    wrapped: bool = False
    activation: str = "linear"  # the layer's activation; "noop" where tfmot removed it
    weight_quantizers: Mapping[str, Quantizer] = field(default_factory=dict)
    pre_activation: Quantizer | None = None
    post_activation: Quantizer | None = None
    output: Quantizer | None = None

    def quantizers(self) -> list[tuple[str, Quantizer]]:
        """(place, quantizer) in the order tfmot runs them in a training step."""
        out = [(f"weight:{a}", q) for a, q in self.weight_quantizers.items()]
        for place, q in (("pre_activation", self.pre_activation),
                         ("post_activation", self.post_activation), ("output", self.output)):
            if q is not None:
                out.append((place, q))
        return out


@dataclass(frozen=True)
class Plan:
    """The whole model: nodes in graph order, the inputs and outputs by node name."""

    name: str
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    quantized: bool
    config: Mapping[str, Any]  # the Keras config the plan describes (QAT when quantized)
    # weight name -> its name in the float file, for the layers the QAT rewrite creates
    sources: Mapping[str, str] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def weights(self) -> list[tuple[str, Weight]]:
        """(layer name, weight) for every weight, in the file's order."""
        return [(n.name, w) for n in self.nodes for w in n.weights]

    def trainable(self) -> list[tuple[str, Weight]]:
        return [(n, w) for n, w in self.weights() if w.trainable]


# --- the layers -------------------------------------------------------------------------

SUPPORTED = (
    "InputLayer", "Conv2D", "DepthwiseConv2D", "SeparableConv2D", "BatchNormalization",
    "ReLU", "Activation", "Add", "Concatenate", "ZeroPadding2D", "AveragePooling2D",
    "MaxPooling2D", "GlobalAveragePooling2D", "Dense", "Dropout", "Flatten", "Reshape",
    "Softmax",
)
ACTIVATIONS = ("linear", "relu", "relu6", "softmax", "sigmoid", "tanh", "swish")
# QuantizeAwareActivation: where tfmot puts the activation's fake quant
PRE_QUANT = frozenset({"softmax", "sigmoid", "tanh", "gelu"})
POST_QUANT = frozenset({"linear", "relu", "swish", "gelu"})

Shape = tuple[int | None, ...]


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    a, b = v
    return (int(a), int(b))


def _window(size: int | None, k: int, s: int, d: int, padding: str) -> int | None:
    if size is None:
        return None
    eff = (k - 1) * d + 1
    if padding == "same":
        return -(-size // s)
    return max(0, (size - eff) // s + 1) if size >= eff else 0


def _activation_name(act: Any, where: str) -> str:
    if act is None:
        return "linear"
    if isinstance(act, str):
        name = act
    elif isinstance(act, Mapping):
        cls = act.get("class_name")
        if cls == "QuantizeAwareActivation":
            return _activation_name(act.get("config", {}).get("activation"), where)
        if cls == "NoOpActivation":
            return "noop"
        name = str(act.get("config", {}).get("name", cls))
    else:
        name = str(act)
    if name not in ACTIVATIONS:
        raise UnsupportedLayerError(
            f"{where}: activation {name!r} is not supported (tfgrad builds "
            f"{', '.join(ACTIVATIONS)})")
    return name


def _channels_last(cfg: Mapping[str, Any], where: str) -> None:
    if cfg.get("data_format", "channels_last") not in (None, "channels_last"):
        raise UnsupportedLayerError(f"{where}: data_format {cfg['data_format']!r}; tfgrad's QAT "
                                    "models take channels_last (NHWC), as TF's CPU kernels do")


def infer_shape(kind: str, cfg: Mapping[str, Any], shapes: Sequence[Shape],
                where: str) -> Shape:
    """The output shape of a layer from its input shapes (None: the batch)."""
    x = shapes[0] if shapes else ()

    def rank(r: int) -> None:
        if len(x) != r:
            raise UnsupportedLayerError(f"{where}: {kind} on a rank-{len(x)} input {x}; "
                                        f"tfgrad builds it for rank {r}")

    if kind in ("Conv2D", "DepthwiseConv2D", "SeparableConv2D", "AveragePooling2D",
                "MaxPooling2D"):
        rank(4)
        _channels_last(cfg, where)
        if kind.endswith("Pooling2D"):
            k = _pair(cfg.get("pool_size", 2))
            s = _pair(cfg.get("strides") or k)
            d = (1, 1)
        else:
            k = _pair(cfg["kernel_size"])
            s = _pair(cfg.get("strides", 1))
            d = _pair(cfg.get("dilation_rate", 1))
        pad = str(cfg.get("padding", "valid")).lower()
        if pad not in ("same", "valid"):
            raise UnsupportedLayerError(f"{where}: padding {pad!r}")
        h = _window(x[1], k[0], s[0], d[0], pad)
        w = _window(x[2], k[1], s[1], d[1], pad)
        c = x[3]
        if kind in ("Conv2D", "SeparableConv2D"):
            c = int(cfg["filters"])
        elif kind == "DepthwiseConv2D":
            c = None if c is None else c * int(cfg.get("depth_multiplier", 1))
        return (x[0], h, w, c)
    if kind == "ZeroPadding2D":
        rank(4)
        _channels_last(cfg, where)
        (t, b), (lf, r) = _padding2d(cfg["padding"])
        return (x[0], None if x[1] is None else x[1] + t + b,
                None if x[2] is None else x[2] + lf + r, x[3])
    if kind == "GlobalAveragePooling2D":
        rank(4)
        _channels_last(cfg, where)
        return (x[0], 1, 1, x[3]) if cfg.get("keepdims") else (x[0], x[3])
    if kind == "Dense":
        rank(2)
        return (x[0], int(cfg["units"]))
    if kind == "Flatten":
        n = 1
        for v in x[1:]:
            n = None if v is None or n is None else n * v
        return (x[0], n)
    if kind == "Reshape":
        target = [int(v) for v in cfg["target_shape"]]
        total = math.prod(int(v) for v in x[1:] if v is not None)
        if -1 in target:
            known = math.prod(v for v in target if v != -1)
            target[target.index(-1)] = total // known if known else 0
        if math.prod(target) != total:
            raise UnsupportedLayerError(f"{where}: cannot reshape {x} to {cfg['target_shape']}")
        return (x[0], *target)
    if kind == "Concatenate":
        axis = int(cfg.get("axis", -1))
        r = len(x)
        axis = axis % r
        if axis == 0:
            raise UnsupportedLayerError(f"{where}: Concatenate over the batch axis")
        out = list(x)
        out[axis] = sum(int(s[axis]) for s in shapes)  # type: ignore[arg-type]
        return tuple(out)
    if kind == "Add":
        return x
    if kind == "BatchNormalization":
        axis = cfg.get("axis", -1)
        axes = [axis] if isinstance(axis, int) else list(axis)
        if len(axes) != 1 or axes[0] % len(x) != len(x) - 1:
            raise UnsupportedLayerError(f"{where}: BatchNormalization over axis {axis} of a "
                                        f"rank-{len(x)} input; tfgrad builds the last axis")
        if len(x) not in (2, 4):
            raise UnsupportedLayerError(f"{where}: BatchNormalization of a rank-{len(x)} "
                                        "input; tfgrad builds rank 2 and 4")
        for opt in ("renorm", "virtual_batch_size", "adjustment"):
            if cfg.get(opt):
                raise UnsupportedLayerError(f"{where}: BatchNormalization with {opt}")
        return x
    return x


def _padding2d(p: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    if isinstance(p, int):
        return ((p, p), (p, p))
    a, b = p
    return (_pair(a) if not isinstance(a, int) else (a, a),
            _pair(b) if not isinstance(b, int) else (b, b))


def layer_weights(kind: str, cfg: Mapping[str, Any], in_shape: Shape,
                  prefix: str) -> list[Weight]:
    """A Keras layer's own weights, in tf_keras' creation order."""
    def w(attr: str, shape: tuple[int, ...], trainable: bool = True) -> Weight:
        return Weight(f"{prefix}/{attr}:0", attr, shape, trainable)

    c = in_shape[-1] if in_shape else None
    if kind in ("Conv2D", "DepthwiseConv2D", "SeparableConv2D", "Dense") and c is None:
        raise UnsupportedLayerError(f"{prefix}: {kind} with an unknown number of input "
                                    "channels")
    out: list[Weight] = []
    if kind == "Conv2D":
        if int(cfg.get("groups", 1)) != 1:
            raise UnsupportedLayerError(f"{prefix}: Conv2D with groups={cfg['groups']}")
        kh, kw = _pair(cfg["kernel_size"])
        out.append(w("kernel", (kh, kw, int(c), int(cfg["filters"]))))  # type: ignore[arg-type]
        if cfg.get("use_bias", True):
            out.append(w("bias", (int(cfg["filters"]),)))
    elif kind == "DepthwiseConv2D":
        kh, kw = _pair(cfg["kernel_size"])
        m = int(cfg.get("depth_multiplier", 1))
        out.append(w("depthwise_kernel", (kh, kw, int(c), m)))  # type: ignore[arg-type]
        if cfg.get("use_bias", True):
            out.append(w("bias", (int(c) * m,)))  # type: ignore[arg-type]
    elif kind == "SeparableConv2D":
        kh, kw = _pair(cfg["kernel_size"])
        m = int(cfg.get("depth_multiplier", 1))
        out.append(w("depthwise_kernel", (kh, kw, int(c), m)))  # type: ignore[arg-type]
        out.append(w("pointwise_kernel", (1, 1, int(c) * m, int(cfg["filters"]))))  # type: ignore[arg-type]
        if cfg.get("use_bias", True):
            out.append(w("bias", (int(cfg["filters"]),)))
    elif kind == "Dense":
        out.append(w("kernel", (int(c), int(cfg["units"]))))  # type: ignore[arg-type]
        if cfg.get("use_bias", True):
            out.append(w("bias", (int(cfg["units"]),)))
    elif kind == "BatchNormalization":
        n = int(c)  # type: ignore[arg-type]
        if cfg.get("scale", True):
            out.append(w("gamma", (n,)))
        if cfg.get("center", True):
            out.append(w("beta", (n,)))
        out.append(w("moving_mean", (n,), False))
        out.append(w("moving_variance", (n,), False))
    if not cfg.get("trainable", True):
        out = [Weight(x.name, x.attr, x.shape, False) for x in out]
    return out


# --- reading a config -------------------------------------------------------------------

def _layers(config: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(layers with 'name', 'class_name', 'config', 'inbound'), inputs, outputs, for a
    Functional or Sequential config."""
    cls = config.get("class_name")
    cfg = config.get("config", {})
    if cls in ("Functional", "Model"):
        layers = []
        for layer in cfg["layers"]:
            nodes = layer.get("inbound_nodes", [])
            if len(nodes) > 1:
                raise UnsupportedLayerError(
                    f"layer {layer['name']!r} is called {len(nodes)} times (a shared layer); "
                    "tfgrad's QAT models take each layer once")
            inbound = []
            for node in nodes:
                for entry in node:
                    if isinstance(entry, Mapping):  # the newer dict form
                        entry = entry.get("args", [entry])[0]
                    name = entry[0]
                    if len(entry) > 3 and entry[3]:
                        raise UnsupportedLayerError(
                            f"layer {layer['name']!r} is called with arguments {entry[3]}; "
                            "tfgrad's QAT models take none (tfmot's rewrite drops them)")
                    if entry[1] != 0 or entry[2] != 0:
                        raise UnsupportedLayerError(f"layer {layer['name']!r} takes output "
                                                    f"{entry[1:3]} of {name!r}")
                    inbound.append(name)
            layers.append({"name": layer.get("name", layer["config"].get("name")),
                           "class_name": layer["class_name"], "config": layer["config"],
                           "inbound": inbound})
        ins = [e[0] for e in cfg["input_layers"]]
        outs = [e[0] for e in cfg["output_layers"]]
        if isinstance(cfg["input_layers"][0], str):
            ins = [cfg["input_layers"][0]]
        if isinstance(cfg["output_layers"][0], str):
            outs = [cfg["output_layers"][0]]
        return layers, ins, outs
    if cls == "Sequential":
        layers = []
        prev: str | None = None
        raw = list(cfg["layers"])
        if raw and raw[0]["class_name"] != "InputLayer":
            shape = raw[0]["config"].get("batch_input_shape")
            if shape is None:
                raise UnsupportedLayerError("a Sequential model without an input shape "
                                            "(build it, or give the first layer input_shape)")
            raw.insert(0, {"class_name": "InputLayer",
                           "config": {"name": f"{raw[0]['config']['name']}_input",
                                      "batch_input_shape": shape}})
        for layer in raw:
            name = layer["config"]["name"]
            layers.append({"name": name, "class_name": layer["class_name"],
                           "config": layer["config"], "inbound": [prev] if prev else []})
            prev = name
        return layers, [layers[0]["name"]], [layers[-1]["name"]]
    if cls is None:
        raise InvalidArgumentError("not a Keras model config: it has no 'class_name'")
    raise UnsupportedLayerError(
        f"a {cls} model: tfgrad reads Functional and Sequential models (subclassed models "
        "have no config; tfmot's quantize_model refuses them too)")


def _quantizer(spec: Mapping[str, Any], layer: str, var: str, shape: tuple[int, ...],
               where: str) -> Quantizer:
    cls = spec.get("class_name")
    c = spec.get("config", {})
    kinds = {"LastValueQuantizer": "last_value", "MovingAverageQuantizer": "moving_average",
             "AllValuesQuantizer": "all_values", "Default8BitConvWeightsQuantizer":
             "last_value"}
    if cls not in kinds:
        raise UnsupportedLayerError(f"{where}: quantizer {cls!r} (tfgrad builds tfmot's "
                                    f"{', '.join(kinds)})")
    if cls == "Default8BitConvWeightsQuantizer":
        c = {"num_bits": 8, "per_axis": True, "symmetric": True, "narrow_range": True}
    kind = kinds[cls]  # type: ignore[index]
    per_axis = bool(c.get("per_axis", False)) and kind != "moving_average"
    init = (0.0, 0.0) if kind == "all_values" else (-6.0, 6.0)
    return Quantizer(kind, int(c.get("num_bits", 8)), per_axis and kind == "last_value",
                     bool(c.get("symmetric", False)), bool(c.get("narrow_range", False)),
                     f"{layer}/{var}_min:0", f"{layer}/{var}_max:0",
                     shape if per_axis and kind == "last_value" else (), init)


_LAST_VALUE = {"class_name": "LastValueQuantizer",
               "config": {"num_bits": 8, "per_axis": False, "symmetric": True,
                          "narrow_range": True}}
_CONV_WEIGHTS = {"class_name": "Default8BitConvWeightsQuantizer", "config": {}}
_MOVING = {"class_name": "MovingAverageQuantizer",
           "config": {"num_bits": 8, "per_axis": False, "symmetric": False,
                      "narrow_range": False}}
_QUANTIZE_CONFIGS = ("Default8BitQuantizeConfig", "Default8BitConvQuantizeConfig",
                     "Default8BitActivationQuantizeConfig", "NoOpQuantizeConfig",
                     "Default8BitOutputQuantizeConfig")


def _wrapped_node(name: str, layer: Mapping[str, Any], qc: Mapping[str, Any],
                  inputs: tuple[str, ...], shapes: tuple[Shape, ...]) -> Node:
    kind = layer["class_name"]
    cfg = layer["config"]
    inner = cfg["name"]
    where = f"layer {name!r} ({kind})"
    if kind not in SUPPORTED or kind in ("InputLayer", "SeparableConv2D"):
        raise UnsupportedLayerError(f"{where}: tfgrad does not build this layer")
    out_shape = infer_shape(kind, cfg, shapes, where)
    own = layer_weights(kind, cfg, shapes[0] if shapes else (), inner)
    qcls = qc.get("class_name")
    qcfg = qc.get("config", {})
    if qcls not in _QUANTIZE_CONFIGS:
        raise UnsupportedLayerError(f"{where}: quantize config {qcls!r} (tfgrad builds tfmot's "
                                    f"default 8-bit configs: {', '.join(_QUANTIZE_CONFIGS)})")
    act = _activation_name(cfg.get("activation"), where) if "activation" in cfg else "linear"
    wq: dict[str, Quantizer] = {}
    pre = post = output = None
    extra: list[Weight] = [Weight(f"{name}/optimizer_step:0", "optimizer_step", (), False,
                                  "int32")]
    if qcls in ("Default8BitQuantizeConfig", "Default8BitConvQuantizeConfig"):
        spec = _CONV_WEIGHTS if qcls == "Default8BitConvQuantizeConfig" else _LAST_VALUE
        for attr in qcfg.get("weight_attrs", []):
            shape = next((w.shape for w in own if w.attr == attr), None)
            if shape is None:
                raise UnsupportedLayerError(f"{where}: quantizes weight {attr!r}, which a "
                                            f"{kind} does not have")
            # QuantizeWrapper.build adds each quantized weight to its own trainable
            # weights: a frozen layer's kernel still trains (tfmot's quirk)
            own = [Weight(w.name, w.attr, w.shape, True, w.dtype) if w.attr == attr else w
                   for w in own]
            q = _quantizer(spec, name, attr, (shape[-1],), where)
            wq[attr] = q
            extra += [Weight(q.min_name, f"{attr}_min", q.shape, False),
                      Weight(q.max_name, f"{attr}_max", q.shape, False)]
        if qcfg.get("activation_attrs"):
            if act not in PRE_QUANT | POST_QUANT | {"noop"}:
                # QuantizeAwareActivation refuses it when tfmot builds the model
                raise UnsupportedLayerError(
                    f"{where}: activation {act!r} inside a quantized layer; tfmot's "
                    "QuantizeAwareActivation supports only some Keras activations (use a "
                    "separate ReLU(6.) layer for relu6)")
            if act in PRE_QUANT:
                pre = _quantizer(_MOVING, name, "pre_activation", (), where)
                extra += [Weight(pre.min_name, "pre_activation_min", (), False),
                          Weight(pre.max_name, "pre_activation_max", (), False)]
            if act in POST_QUANT:
                post = _quantizer(_MOVING, name, "post_activation", (), where)
                extra += [Weight(post.min_name, "post_activation_min", (), False),
                          Weight(post.max_name, "post_activation_max", (), False)]
        if qcfg.get("quantize_output"):
            output = _quantizer(_MOVING, name, "output", (), where)
    elif qcls == "Default8BitActivationQuantizeConfig":
        if qcfg.get("quantize_output", True) and act in ("relu", "swish", "gelu", "relu6"):
            output = _quantizer(_MOVING, name, "output", (), where)
    elif qcls == "Default8BitOutputQuantizeConfig":
        if qcfg.get("quantize_output", True):
            output = _quantizer(_MOVING, name, "output", (), where)
    if output is not None:
        extra += [Weight(output.min_name, "output_min", (), False),
                  Weight(output.max_name, "output_max", (), False)]
    return Node(name, inner, kind, cfg, inputs, shapes, out_shape, tuple(own + extra),
                True, act, wq, pre, post, output)


def build_plan(config: Mapping[str, Any]) -> Plan:
    """The plan of a Keras model config, QAT (tfmot's wrappers) or float, as it stands."""
    layers, ins, outs = _layers(config)
    shapes: dict[str, Shape] = {}
    nodes: list[Node] = []
    quantized = False
    for layer in layers:
        name, kind, cfg = layer["name"], layer["class_name"], layer["config"]
        inputs = tuple(layer["inbound"])
        missing = [i for i in inputs if i not in shapes]
        if missing:
            raise UnsupportedLayerError(f"layer {name!r} takes {missing[0]!r}, which comes "
                                        "later or not at all in the config")
        in_shapes = tuple(shapes[i] for i in inputs)
        where = f"layer {name!r} ({kind})"
        if kind == "InputLayer":
            shape = cfg.get("batch_input_shape") or cfg.get("batch_shape")
            if shape is None:
                raise UnsupportedLayerError(f"{where}: no input shape")
            if cfg.get("dtype", "float32") != "float32":
                raise UnsupportedLayerError(f"{where}: dtype {cfg['dtype']}; tfgrad's QAT "
                                            "models take float32 inputs")
            node = Node(name, name, kind, cfg, (), (), tuple(shape), ())
        elif kind == "QuantizeLayer":
            quantized = True
            spec = cfg.get("quantizer")
            q = None if spec is None else _quantizer(spec, name, name, (), where)
            weights: list[Weight] = []
            if q is not None:
                weights += [Weight(q.min_name, f"{name}_min", (), False),
                            Weight(q.max_name, f"{name}_max", (), False)]
            weights.append(Weight(f"{name}/optimizer_step:0", "optimizer_step", (), False,
                                  "int32"))
            node = Node(name, name, kind, cfg, inputs, in_shapes, in_shapes[0],
                        tuple(weights), True, "linear", {}, None, None, q)
        elif kind in ("QuantizeWrapperV2", "QuantizeWrapper"):
            quantized = True
            node = _wrapped_node(name, cfg["layer"], cfg["quantize_config"], inputs,
                                 in_shapes)
        elif kind in SUPPORTED:
            act = (_activation_name(cfg.get("activation"), where)
                   if kind in ("Conv2D", "DepthwiseConv2D", "SeparableConv2D", "Dense",
                               "Activation") else "linear")
            node = Node(name, name, kind, cfg, inputs, in_shapes,
                        infer_shape(kind, cfg, in_shapes, where),
                        tuple(layer_weights(kind, cfg, in_shapes[0] if in_shapes else (),
                                            name)), False, act)
        else:
            raise UnsupportedLayerError(
                f"{where}: tfgrad does not build this layer class (it builds "
                f"{', '.join(SUPPORTED)})")
        if node.kind not in ("InputLayer", "Add", "Concatenate") and len(inputs) != 1:
            raise UnsupportedLayerError(f"{where} takes {len(inputs)} inputs; expected 1")
        shapes[name] = node.output_shape
        nodes.append(node)
    return Plan(str(config.get("config", {}).get("name", "model")), tuple(nodes), tuple(ins),
                tuple(outs), quantized, config)
