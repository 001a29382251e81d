"""tfgrad.qat.quantize_config against tfmot 0.8.1's quantize_model, live.

Each model is built in tf_keras, saved as .h5 (its ``model_config`` is the float config a
user has), quantized by tfmot, and the quantized model saved as .h5 too; the rewrite of
the float config must equal the quantized ``model_config`` exactly, and
``build_plan`` of it must give tfmot's variables, names and order, layer by layer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

h5py = pytest.importorskip("h5py")
keras = pytest.importorskip("tf_keras")
tfmot = pytest.importorskip("tensorflow_model_optimization")

from tfgrad.qat import UnsupportedLayerError, build_plan, plan_from_config  # noqa: E402
from tfgrad.qat._rewrite import quantize_config  # noqa: E402

L = keras.layers
quantize_model = tfmot.quantization.keras.quantize_model


def _model_config(path: Path) -> dict[str, Any]:
    with h5py.File(path, "r") as f:
        raw = f.attrs["model_config"]
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)


def _strip_top(config: dict[str, Any], shared_ids: bool = True) -> dict[str, Any]:
    """``get_config`` -> the .h5 form. The only fields dropped: a top-level layer entry's
    ``module`` and ``registered_name`` (tf_keras' legacy .h5 serialization omits them;
    for built-in Keras and tfmot classes they only repeat the class name's home) and its
    ``build_config`` (the input shape the layer was built with, which the wrapped inner
    layer's own ``build_config`` also carries, and which we compare there); with
    ``shared_ids=False``, a QuantizeConfig's ``shared_object_id`` (it says that several
    wrappers hold one Python object; get_config and the .h5 writer number and place it
    differently, and the .h5 comparison checks it exactly)."""
    out = json.loads(json.dumps(config))
    for layer in out["config"]["layers"]:
        for key in ("module", "registered_name", "build_config"):
            layer.pop(key, None)
        if not shared_ids:
            layer["config"].get("quantize_config", {}).pop("shared_object_id", None)
    return out


def _run_tfmot(model: Any, tmp_path: Path) -> tuple[dict, dict, Any]:
    """(float config, tfmot's quantized config, tfmot's quantized model), both configs as
    a tf_keras .h5 file stores them."""
    model.save(tmp_path / "float.h5")
    # Keras names the layers tfmot creates from per-process counters: reset them, as in
    # the fresh process quantize_config models (see tfgrad.qat._rewrite's docstring).
    keras.backend.clear_session()
    q = quantize_model(model)
    q.save(tmp_path / "qat.h5")
    return _model_config(tmp_path / "float.h5"), _model_config(tmp_path / "qat.h5"), q


def _check(model: Any, tmp_path: Path, trainable: bool = True) -> dict[str, Any]:
    float_cfg, want, q = _run_tfmot(model, tmp_path)
    got = json.loads(json.dumps(quantize_config(float_cfg)))  # tuples -> lists, as JSON
    assert got == want
    # tfmot's get_config, less only the fields _strip_top names, is the same config
    cls = "Sequential" if isinstance(q, keras.Sequential) else "Functional"
    assert _strip_top(got, shared_ids=False) == _strip_top(
        {"class_name": cls, "config": q.get_config()}, shared_ids=False)
    # the float model's get_config form (module, registered_name, build_config at the
    # top level) is read the same
    assert quantize_config(_strip_top({"class_name": float_cfg["class_name"],
                                       "config": model.get_config()})) == got
    plan = build_plan(got)
    # Sequential.layers leaves out the InputLayer; it has no weights either way
    assert [(n.name, [w.name for w in n.weights]) for n in plan.nodes
            if n.kind != "InputLayer"] == \
        [(layer.name, [w.name for w in layer.weights]) for layer in q.layers
         if not isinstance(layer, keras.layers.InputLayer)]
    assert [w.name for _, w in plan.weights()] == [w.name for w in q.weights]
    if trainable:
        assert [w.name for _, w in plan.trainable()] == [w.name for w in q.trainable_weights]
    assert plan_from_config(float_cfg, quantize=True).config == quantize_config(float_cfg)
    return got


def _layer(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return next(x for x in cfg["config"]["layers"] if x["config"]["name"] == name)


def _qc(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return _layer(cfg, name)["config"]["quantize_config"]


def _act(cfg: dict[str, Any], name: str) -> Any:
    return _layer(cfg, name)["config"]["layer"]["config"]["activation"]


def _inputs(cfg: dict[str, Any], name: str) -> list[str]:
    return [i[0] for i in _layer(cfg, name)["inbound_nodes"][0]]


def _functional(build: Callable[[Any], Any], shape: tuple[int, ...] = (8, 8, 3)) -> Any:
    x = L.Input(shape)
    return keras.Model(x, build(x))


# --- the rewrite patterns -----------------------------------------------------------------

def test_conv_bn_relu6(tmp_path: Path) -> None:
    m = _functional(lambda x: L.Dense(3)(L.GlobalAveragePooling2D(name="gap")(
        L.ReLU(6.0, name="r")(L.BatchNormalization(name="bn")(
            L.Conv2D(4, 3, use_bias=False, name="c")(x))))))
    got = _check(m, tmp_path)
    assert _qc(got, "quant_bn")["class_name"] == "NoOpQuantizeConfig"
    assert _act(got, "quant_c")["config"]["activation"] == {"class_name": "NoOpActivation",
                                                           "config": {}}
    assert _layer(got, "quantize_layer")["config"]["quantizer"]["class_name"] == \
        "AllValuesQuantizer"


def test_conv_bn_activation_relu(tmp_path: Path) -> None:
    m = _functional(lambda x: L.Flatten()(L.Activation("relu", name="a")(
        L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c")(x)))))
    got = _check(m, tmp_path)
    assert _qc(got, "quant_bn")["class_name"] == "NoOpQuantizeConfig"
    assert _qc(got, "quant_a") == {"class_name": "Default8BitActivationQuantizeConfig",
                                   "config": {"quantize_output": True}}


def test_conv_bn_alone(tmp_path: Path) -> None:
    m = _functional(lambda x: L.Flatten()(L.BatchNormalization(name="bn")(
        L.Conv2D(4, 3, use_bias=False, name="c")(x))))
    got = _check(m, tmp_path)
    assert _qc(got, "quant_bn") == {"class_name": "Default8BitOutputQuantizeConfig",
                                    "config": {"quantize_output": True}}


def test_depthwise_bn_relu(tmp_path: Path) -> None:
    m = _functional(lambda x: L.GlobalAveragePooling2D()(L.ReLU(name="r")(
        L.BatchNormalization(name="bn")(L.DepthwiseConv2D(3, depth_multiplier=2,
                                                          use_bias=False, name="dw")(x)))))
    got = _check(m, tmp_path)
    assert _qc(got, "quant_bn")["class_name"] == "NoOpQuantizeConfig"
    assert _qc(got, "quant_dw")["config"]["weight_attrs"] == ["depthwise_kernel"]


def test_dense_bn(tmp_path: Path) -> None:
    m = _functional(lambda x: L.Dense(2)(L.BatchNormalization(name="bn")(
        L.Dense(5, name="d")(x))), (6,))
    got = _check(m, tmp_path)
    assert _qc(got, "quant_bn")["class_name"] == "Default8BitOutputQuantizeConfig"


def test_dense_bn_relu(tmp_path: Path) -> None:
    """DenseBatchNormQuantize comes before DenseBatchNormReLUQuantize in tfmot's list, so BN
    keeps an output FQ and the ReLU gets its own: two FQs in a row."""
    m = _functional(lambda x: L.ReLU(name="r")(L.BatchNormalization(name="bn")(
        L.Dense(5, name="d")(x))), (6,))
    got = _check(m, tmp_path)
    assert _qc(got, "quant_bn")["class_name"] == "Default8BitOutputQuantizeConfig"
    assert _qc(got, "quant_r")["config"]["quantize_output"] is True


def test_separable_conv(tmp_path: Path) -> None:
    def build(x: Any) -> Any:
        y = L.SeparableConv2D(5, 3, activation="relu", name="s1")(x)
        y = L.SeparableConv2D(4, 3, depth_multiplier=2, use_bias=False, padding="same",
                              name="s2")(y)
        return L.Flatten(name="f")(y)

    got = _check(_functional(build), tmp_path)
    names = [x["config"]["name"] for x in got["config"]["layers"]]
    assert names[1:] == ["quantize_layer", "quant_depthwise_conv2d", "quant_conv2d",
                         "quant_depthwise_conv2d_1", "quant_conv2d_1", "quant_f"]
    assert _act(got, "quant_depthwise_conv2d")["config"]["activation"] == "linear"
    assert _act(got, "quant_conv2d")["config"]["activation"] == "relu"


def test_separable_conv_name_collision(tmp_path: Path) -> None:
    """tfmot names the split's Conv2D ``conv2d`` even when the model has one: quantize_model
    fails in a fresh process. tfgrad takes the next free name instead."""
    def build(x: Any) -> Any:
        y = L.Conv2D(8, 1, name="conv2d")(x)
        return L.SeparableConv2D(4, 3, name="s")(y)

    m = _functional(build)
    keras.backend.clear_session()
    with pytest.raises(ValueError, match="not a multiple of input depth"):
        quantize_model(m)
    float_cfg = _strip_top({"class_name": "Functional", "config": m.get_config()})
    got = quantize_config(float_cfg)
    names = [x["config"]["name"] for x in got["config"]["layers"]]
    assert names[2:] == ["quant_conv2d", "quant_depthwise_conv2d", "quant_conv2d_1"]
    assert [n.name for n in build_plan(got).nodes][2:] == names[2:]


def test_concatenate_two_inputs(tmp_path: Path) -> None:
    """Feeders lose their output FQ, the Concatenate has one. The call's input order is
    kept here (the first input comes first in the config)."""
    def build(x: Any) -> Any:
        a = L.Conv2D(2, 1, name="a")(x)
        b = L.Activation("relu", name="b")(L.Conv2D(3, 1, name="bc")(x))
        return L.Concatenate(name="cat")([a, b])

    got = _check(_functional(build), tmp_path)
    assert _qc(got, "quant_cat") == {"class_name": "Default8BitOutputQuantizeConfig",
                                     "config": {"quantize_output": True}}
    assert _qc(got, "quant_b") == {"class_name": "Default8BitActivationQuantizeConfig",
                                   "config": {"quantize_output": False}}
    assert _qc(got, "quant_a")["config"]["quantize_output"] is False


def test_concatenate_three_inputs_with_an_input(tmp_path: Path) -> None:
    """An input feeding only the Concatenate: its QuantizeLayer has no quantizer. tfmot
    re-lists the inputs in its working layer list's order (issue #1061): the call's
    [b, x2, a] becomes [b, a, x2], so the quantized model concatenates the channels in
    another order than the float model."""
    x1 = L.Input((6, 6, 3), name="x1")
    x2 = L.Input((6, 6, 2), name="x2")
    a = L.ReLU(name="a")(L.Conv2D(2, 1, name="ac")(x1))
    b = L.Conv2D(3, 1, name="b")(x1)
    cat = L.Concatenate(name="cat")([b, x2, a])
    m = keras.Model([x1, x2], L.GlobalAveragePooling2D(name="gap")(cat))
    got = _check(m, tmp_path)
    assert _layer(got, "quantize_layer_1")["config"]["quantizer"] is None
    assert _qc(got, "quant_a")["config"]["quantize_output"] is False
    assert _qc(got, "quant_ac")["class_name"] == "NoOpQuantizeConfig"
    assert _inputs(got, "quant_cat") == ["quant_b", "quant_a", "quantize_layer_1"]


def test_concatenate_feeder_with_two_consumers(tmp_path: Path) -> None:
    """A feeder with another consumer: no match, every layer keeps the registry's config."""
    def build(x: Any) -> Any:
        a = L.Conv2D(2, 1, name="a")(x)
        b = L.Conv2D(2, 1, name="b")(x)
        return L.Add(name="add")([L.Concatenate(name="cat")([a, b]),
                                  L.Concatenate(name="cat2")([b, a])])

    got = _check(_functional(build), tmp_path)
    assert _qc(got, "quant_cat")["class_name"] == "Default8BitQuantizeConfig"


def test_concatenate_of_concatenate(tmp_path: Path) -> None:
    """The inner Concatenate is matched first (it comes first in the layer list): it gets
    an output config that the outer one's transform then switches off."""
    def build(x: Any) -> Any:
        a = L.Conv2D(2, 1, name="a")(x)
        b = L.Conv2D(2, 1, name="b")(x)
        c = L.ReLU(name="c")(L.Conv2D(2, 1, name="cc")(x))
        return L.Concatenate(name="cat2")([c, L.Concatenate(name="cat1")([a, b])])

    got = _check(_functional(build), tmp_path)
    assert _qc(got, "quant_cat1") == {"class_name": "Default8BitOutputQuantizeConfig",
                                      "config": {"quantize_output": False}}
    assert _qc(got, "quant_cat2")["config"]["quantize_output"] is True


def test_concatenate_repeated_input(tmp_path: Path) -> None:
    """tfmot quirk: Concatenate([a, a, b]) lists two distinct layers, so the two-input
    transform matches and rewrites its inputs as [a, b]: the quantized model has fewer
    channels than the float one."""
    def build(x: Any) -> Any:
        a = L.Conv2D(2, 1, name="a")(x)
        b = L.Conv2D(2, 1, name="b")(x)
        return L.GlobalAveragePooling2D(name="g")(L.Concatenate(name="cat")([a, a, b]))

    got = _check(_functional(build), tmp_path)
    assert _inputs(got, "quant_cat") == ["quant_a", "quant_b"]


def test_call_kwargs_dropped_and_two_outputs(tmp_path: Path) -> None:
    """tfmot quirk: a transform rewrites its layers' connections as [name, 0, 0, {}], so
    BatchNormalization(...)(x, training=False) loses its ``training`` argument. BN here also
    feeds two consumers (a ReLU and a model output): only Conv2DBatchNormQuantize, with BN
    as the head, matches."""
    x = L.Input((4, 4, 3))
    bn = L.BatchNormalization(name="bn")(L.Conv2D(2, 1, use_bias=False, name="a")(x),
                                         training=False)
    m = keras.Model(x, [L.ReLU(name="r")(bn), bn])
    got = _check(m, tmp_path)
    assert _layer(got, "quant_bn")["inbound_nodes"] == [[["quant_a", 0, 0, {}]]]
    assert _qc(got, "quant_bn")["class_name"] == "Default8BitOutputQuantizeConfig"
    assert got["config"]["output_layers"] == [["quant_r", 0, 0], ["quant_bn", 0, 0]]


def test_two_inputs(tmp_path: Path) -> None:
    """QuantizeLayers are named in the layer list's order, not the model inputs' order."""
    x1 = L.Input((4,), name="in_b")
    x2 = L.Input((4,), name="in_a")
    m = keras.Model([x2, x1], L.Add(name="add")([L.Dense(3, name="d1")(x1),
                                                 L.Dense(3, name="d2")(x2)]))
    got = _check(m, tmp_path)
    assert got["config"]["input_layers"] == [["in_a", 0, 0], ["in_b", 0, 0]]


def test_shared_quantize_configs(tmp_path: Path) -> None:
    """One Python QuantizeConfig held by several wrappers: the registry's single
    Default8BitActivationQuantizeConfig (every Activation layer it configures), and the one
    a Concatenate transform gives its Activation feeders. The .h5 writer marks them with a
    shared_object_id, its running count of serialized objects."""
    def build(x: Any) -> Any:
        y = L.BatchNormalization(name="bn")(L.Conv2D(4, 1, use_bias=False, name="c")(x))
        y = L.Activation("relu", name="a0")(y)  # Conv+BN+Activation: NoOpActivation
        a = L.Activation("sigmoid", name="a1")(y)
        b = L.Activation("tanh", name="a2")(L.Conv2D(4, 1, name="c2")(a))
        y = L.Concatenate(name="cat")([L.Activation("relu", name="f1")(a),
                                       L.Activation("sigmoid", name="f2")(b)])
        return L.Activation("sigmoid", name="a3")(y)

    got = _check(_functional(build), tmp_path)
    ids = {n: _qc(got, f"quant_{n}").get("shared_object_id")
           for n in ("a0", "a1", "a2", "a3", "f1", "f2")}
    # a0 also takes the registry's config: the Conv+BN+Activation transform leaves it none
    assert ids["a0"] == ids["a1"] == ids["a2"] == ids["a3"] is not None
    assert ids["f1"] == ids["f2"] is not None
    assert ids["f1"] != ids["a1"]


def test_concatenate_repeated_input_then_weights(tmp_path: Path) -> None:
    """Where the channels a repeated Concatenate input loses feed a layer with weights,
    tfmot fails copying the float weights; so does tfgrad, with the reason."""
    def build(x: Any) -> Any:
        a = L.Conv2D(2, 1, name="a")(x)
        b = L.Conv2D(2, 1, name="b")(x)
        return L.Conv2D(3, 1, name="after")(L.Concatenate(name="cat")([a, a, b]))

    m = _functional(build)
    keras.backend.clear_session()
    with pytest.raises(ValueError, match="Shape mismatch"):
        quantize_model(m)
    with pytest.raises(UnsupportedLayerError, match="'after'.*Shape mismatch"):
        quantize_config(_config(m))


def test_add_relu(tmp_path: Path) -> None:
    def build(x: Any) -> Any:
        a = L.Conv2D(2, 1, name="a")(x)
        b = L.Conv2D(2, 1, name="b")(x)
        s = L.ReLU(name="r")(L.Add(name="add")([a, b]))
        t = L.Activation("relu", name="act")(L.Add(name="add2")([s, a]))
        return t

    got = _check(_functional(build), tmp_path)
    assert _qc(got, "quant_add")["class_name"] == "NoOpQuantizeConfig"
    assert _qc(got, "quant_add2")["class_name"] == "NoOpQuantizeConfig"


def test_layer_then_relu(tmp_path: Path) -> None:
    """Conv2D / DepthwiseConv2D / Dense then a ReLU layer: the producer gets NoOp (no kernel
    FQ), and its activation stays a plain string."""
    def build(x: Any) -> Any:
        y = L.ReLU(name="r1")(L.Conv2D(4, 3, name="c")(x))
        y = L.ReLU(6.0, name="r2")(L.DepthwiseConv2D(3, name="dw")(y))
        y = L.Flatten()(y)
        return L.Activation("relu", name="r3")(L.Dense(3, name="d")(y))

    got = _check(_functional(build), tmp_path)
    for name in ("quant_c", "quant_dw", "quant_d"):
        assert _qc(got, name) == {"class_name": "NoOpQuantizeConfig", "config": {}}
        assert _act(got, name) == "linear"


def test_other_layers(tmp_path: Path) -> None:
    def build(x: Any) -> Any:
        y = L.ZeroPadding2D(((1, 0), (0, 1)), name="zp")(x)
        y = L.Conv2D(4, 3, strides=2, activation="relu", name="c")(y)
        y = L.AveragePooling2D(name="ap")(y)
        z = L.MaxPooling2D(name="mp")(L.Conv2D(4, 1, activation="sigmoid", name="c2")(x))
        z = L.GlobalAveragePooling2D(keepdims=True, name="gap")(z)
        y = L.Dropout(0.2, name="do")(L.Flatten(name="fl")(y))
        z = L.Reshape((4,), name="rs")(z)
        y = L.Dense(5, activation="tanh", name="d")(L.Concatenate(name="cat")([y, z]))
        return L.Softmax(name="sm")(L.Dense(3, activation="softmax", name="d2")(y))

    got = _check(_functional(build, (9, 9, 3)), tmp_path)
    assert _act(got, "quant_d2")["config"]["activation"] == "softmax"
    assert _qc(got, "quant_sm")["config"]["quantize_output"] is False


def test_sequential(tmp_path: Path) -> None:
    m = keras.Sequential([
        L.Conv2D(4, 3, use_bias=False, input_shape=(8, 8, 3), name="c"),
        L.BatchNormalization(name="bn"), L.ReLU(name="r"),
        L.SeparableConv2D(4, 3, name="s"), L.Flatten(name="f"),
        L.Dense(2, name="d"), L.BatchNormalization(name="bn2"), L.Softmax(name="sm"),
        L.Activation("sigmoid", name="a1"), L.Activation("tanh", name="a2")],
        name="seq")
    got = _check(m, tmp_path)
    assert got["class_name"] == "Sequential"
    assert [x["config"]["name"] for x in got["config"]["layers"]][:2] == ["c_input",
                                                                          "quantize_layer"]
    # one QuantizeConfig object for both, but Sequential's get_config opens no
    # SharedObjectSavingScope: no shared_object_id
    assert "shared_object_id" not in _qc(got, "quant_a1")


def test_frozen_layer(tmp_path: Path) -> None:
    """A frozen layer: QuantizeWrapper.trainable is the inner layer's."""
    def build(x: Any) -> Any:
        y = L.Conv2D(4, 3, use_bias=False, name="c", trainable=False)(x)
        return L.Flatten()(L.BatchNormalization(name="bn", trainable=False)(y))

    got = _check(_functional(build), tmp_path, trainable=False)
    assert _layer(got, "quant_bn")["config"]["trainable"] is False
    assert _layer(got, "quant_bn")["config"]["layer"]["config"]["trainable"] is False


def _frozen_conv(tmp_path: Path) -> tuple[list[str], list[str]]:
    m = _functional(lambda x: L.Flatten()(L.Conv2D(4, 3, name="c", trainable=False)(x)))
    float_cfg, _, q = _run_tfmot(m, tmp_path)
    plan = build_plan(quantize_config(float_cfg))
    return [w.name for w in q.trainable_weights], [w.name for _, w in plan.trainable()]


def test_frozen_quantized_kernel_trains_in_tfmot(tmp_path: Path) -> None:
    """tfmot quirk: QuantizeWrapper.build appends each quantized weight to its own
    trainable weights, so a frozen Conv2D's kernel trains (its bias does not)."""
    assert _frozen_conv(tmp_path)[0] == ["c/kernel:0"]


def test_frozen_quantized_kernel_trains_in_plan(tmp_path: Path) -> None:
    tfmot_names, plan_names = _frozen_conv(tmp_path)
    assert plan_names == tfmot_names


def test_mobilenet_v2(tmp_path: Path) -> None:
    # about 13 s on the 2-core machine: not marked slow
    m = keras.applications.MobileNetV2(alpha=0.35, input_shape=(32, 32, 3), weights=None,
                                       classes=10)
    got = _check(m, tmp_path)
    assert len(got["config"]["layers"]) == len(m.layers) + 1


# --- refusals -------------------------------------------------------------------------------

def _config(model: Any) -> dict[str, Any]:
    return _strip_top({"class_name": "Functional", "config": model.get_config()})


@pytest.mark.parametrize("case", ["bn_alone", "bn_after_relu_conv", "conv1d", "multiply"])
def test_tfmot_refuses(case: str) -> None:
    """Layers outside Default8BitQuantizeRegistry that no transform rewrites: tfmot raises
    RuntimeError naming the layer and its class; so does tfgrad."""
    if case == "bn_alone":
        m = _functional(lambda x: L.BatchNormalization(name="bn")(x))
        name, cls = "bn", "BatchNormalization"
    elif case == "bn_after_relu_conv":
        m = _functional(lambda x: L.BatchNormalization(name="bn")(
            L.Conv2D(2, 1, activation="relu", name="c")(x)))
        name, cls = "bn", "BatchNormalization"
    elif case == "conv1d":
        m = _functional(lambda x: L.Conv1D(2, 3, name="c1")(x), (8, 3))
        name, cls = "c1", "Conv1D"
    else:
        x = L.Input((4,))
        m = keras.Model(x, L.Multiply(name="mul")([L.Dense(4)(x), x]))
        name, cls = "mul", "Multiply"
    keras.backend.clear_session()
    with pytest.raises(RuntimeError, match=f"Layer {name}:.*{cls}.* is not supported"):
        quantize_model(m)
    with pytest.raises(UnsupportedLayerError, match=f"Layer {name}:{cls} is not supported"):
        quantize_config(_config(m))


def test_refuses_activations() -> None:
    """Activations tfmot's QuantizeAwareActivation (Dense, Conv) or
    Default8BitActivationQuantizeConfig (Activation layers) refuse: tfmot raises
    ValueError when it builds the wrapper."""
    dense = _functional(lambda x: L.Dense(2, activation="elu", name="d")(x), (4,))
    act = _functional(lambda x: L.Activation("elu", name="a")(L.Dense(2)(x)), (4,))
    for m, name in ((dense, "d"), (act, "a")):
        keras.backend.clear_session()
        with pytest.raises(ValueError, match="not supported|Only some Keras activations"):
            quantize_model(m)
        with pytest.raises(UnsupportedLayerError, match=f"layer {name!r}.*'elu'"):
            quantize_config(_config(m))


def test_refuses_what_tfgrad_does_not_build() -> None:
    lam = _functional(lambda x: L.Lambda(lambda t: t * 2.0, name="lam")(x), (4,))
    with pytest.raises(UnsupportedLayerError, match="'lam' \\(Lambda\\).*Lambda"):
        quantize_config(_config(lam))
    leaky = _functional(lambda x: L.LeakyReLU(name="lr")(L.Dense(2)(x)), (4,))
    with pytest.raises(UnsupportedLayerError, match="'lr' \\(LeakyReLU\\).*tfgrad"):
        quantize_config(_config(leaky))
    inner = _functional(lambda x: L.Dense(2)(x), (4,))
    outer = _functional(lambda x: inner(x), (4,))
    with pytest.raises(UnsupportedLayerError, match="nested model"):
        quantize_config(_config(outer))
    qat = quantize_config(_config(leaky.__class__(leaky.inputs, leaky.layers[1].output)))
    with pytest.raises(UnsupportedLayerError, match="already quantized"):
        quantize_config(qat)
    with pytest.raises(UnsupportedLayerError, match="Sequential and Functional"):
        quantize_config({"class_name": "MyModel", "config": {}})
