"""QAT parity models and TF's side of the parity runs (tf_keras + tfmot, imported lazily).

Each builder makes a small float tf_keras model for one of tfmot's rewrite patterns;
:func:`tfmot_qat` quantizes it with tfmot and saves it; :func:`tf_steps` trains it on
given batches with a loss whose gradient is exact in any framework (``sum(y * c)``) and
plain SGD written as TF computes it (``var - lr * grad``, two roundings), recording the
outputs and every variable after each step. The torch and JAX parity tests and
examples/port_tfmot_model.py run the same steps on the port and compare.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..qat import Plan


def keras(onednn: bool = False) -> Any:
    """tf_keras on TF's Eigen kernels (the oracle; ``onednn=True``: TF's default build).
    Raises ImportError when missing, RuntimeError when TF was already imported with the
    other choice (TF_ENABLE_ONEDNN_OPTS is read once, at TF's import)."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1" if onednn else "0")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras
    from tensorflow.python.util import _pywrap_util_port

    if bool(_pywrap_util_port.IsMklEnabled()) != onednn:
        raise RuntimeError(
            f"TensorFlow was imported with its {'Eigen' if onednn else 'oneDNN'} kernels; "
            f"set TF_ENABLE_ONEDNN_OPTS={int(onednn)} before anything imports it")
    return tf_keras


def tfmot(onednn: bool = False) -> Any:
    keras(onednn)
    import tensorflow_model_optimization

    return tensorflow_model_optimization


def _depthwise_chain(k: Any) -> Any:
    """Only tfgrad's operators upstream of every activation range: depthwise convs, 4-D
    batch norm, ReLU/ReLU6, ZeroPadding2D, MaxPooling2D, Add, Concatenate, Flatten."""
    L = k.layers
    i = k.Input((10, 10, 3))
    x = L.ZeroPadding2D(1)(i)
    x = L.DepthwiseConv2D(3, strides=2, depth_multiplier=2, use_bias=False)(x)
    x = L.BatchNormalization()(x)
    x = L.ReLU(6.0)(x)
    y = L.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    y = L.BatchNormalization()(y)
    y = L.ReLU()(y)
    x = L.Add()([x, y])
    x = L.Activation("relu")(x)
    z = L.DepthwiseConv2D(1)(x)
    x = L.Concatenate()([x, z])
    x = L.MaxPooling2D(2)(x)
    x = L.Flatten()(x)
    x = L.Dense(6)(x)
    return k.Model(i, x, name="depthwise_chain")


def _cnn(k: Any) -> Any:
    """Conv2D + BN (+ ReLU / Activation relu / none), a separate ReLU after a conv,
    average pooling, global average pooling, Dense + 2-D BN + ReLU, dropout, softmax."""
    L = k.layers
    i = k.Input((12, 12, 3))
    x = L.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(i)
    x = L.BatchNormalization()(x)
    x = L.ReLU(6.0)(x)
    x = L.Conv2D(8, 3, padding="same", use_bias=False)(x)
    x = L.BatchNormalization()(x)
    x = L.Activation("relu")(x)
    y = L.Conv2D(8, 1, use_bias=False)(x)
    y = L.BatchNormalization()(y)
    x = L.Add()([x, y])
    x = L.Conv2D(8, 1)(x)
    x = L.ReLU()(x)
    x = L.AveragePooling2D(2, padding="same")(x)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(16, use_bias=False)(x)
    x = L.BatchNormalization()(x)
    x = L.ReLU()(x)
    x = L.Dropout(0.0)(x)
    x = L.Dense(5, activation="softmax")(x)
    return k.Model(i, x, name="cnn")


def _mlp(k: Any) -> Any:
    """A Sequential MLP: Flatten, Dense with activations, Reshape."""
    L = k.layers
    return k.Sequential([
        L.Reshape((6, 4), input_shape=(24,)),
        L.Flatten(),
        L.Dense(12, activation="relu"),
        L.Dense(8),
        L.Softmax(),
    ], name="mlp")


def _separable(k: Any) -> Any:
    """SeparableConv2D (split by tfmot into a depthwise and a 1x1 conv), with and without
    batch norm, and a Concatenate fed by an input."""
    L = k.layers
    i = k.Input((9, 9, 4))
    x = L.SeparableConv2D(8, 3, padding="same", use_bias=False)(i)
    x = L.BatchNormalization()(x)
    x = L.ReLU()(x)
    x = L.Concatenate()([i, x])
    x = L.SeparableConv2D(4, 3, strides=2, depth_multiplier=2, activation="relu")(x)
    x = L.ZeroPadding2D(((1, 1), (1, 1)))(x)
    x = L.AveragePooling2D(2, strides=2)(x)
    x = L.Flatten()(x)
    x = L.Dense(7)(x)
    return k.Model(i, x, name="separable")


def _mobilenet_v2(k: Any) -> Any:
    """tf_keras.applications' MobileNetV2, small: alpha 0.35, 32x32 inputs, 10 classes."""
    return k.applications.MobileNetV2(alpha=0.35, input_shape=(32, 32, 3), weights=None,
                                      classes=10)


def _mobilenet_v2_logits(k: Any) -> Any:
    """MobileNetV2 as above, returning logits (no softmax layer): what a training step
    with TF's sparse softmax cross entropy takes."""
    return k.applications.MobileNetV2(alpha=0.35, input_shape=(32, 32, 3), weights=None,
                                      classes=10, classifier_activation=None)


MODELS: dict[str, Callable[[Any], Any]] = {
    "depthwise_chain": _depthwise_chain,
    "cnn": _cnn,
    "mlp": _mlp,
    "separable": _separable,
    "mobilenet_v2": _mobilenet_v2,
}
LOGIT_MODELS: dict[str, Callable[[Any], Any]] = {"mobilenet_v2_logits": _mobilenet_v2_logits}
"""Further models for the whole-step tests only (not in every parity run)."""


def input_shape(model: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in model.input_shape[1:])


def tfmot_qat(name: str, folder: str, seed: int = 0) -> tuple[str, str]:
    """Build model ``name`` (weights from ``seed``), save it float and tfmot-quantized as
    ``.h5`` (and ``.keras`` beside them) in ``folder``; returns the .h5 paths (float,
    QAT)."""
    k = keras()
    k.utils.set_random_seed(seed)
    float_model = {**MODELS, **LOGIT_MODELS}[name](k)
    rng = np.random.default_rng(seed)
    for w in float_model.weights:  # non-trivial BN statistics and biases too
        if "moving_variance" in w.name or "gamma" in w.name:
            w.assign(rng.uniform(0.5, 1.5, w.shape).astype(np.float32))
        elif "moving_mean" in w.name or "beta" in w.name or "bias" in w.name:
            w.assign(rng.uniform(-0.3, 0.3, w.shape).astype(np.float32))
    fpath = os.path.join(folder, f"{name}_float.h5")
    qpath = os.path.join(folder, f"{name}_qat.h5")
    float_model.save(fpath)
    float_model.save(fpath[:-3] + ".keras")
    qat = tfmot().quantization.keras.quantize_model(float_model)
    qat.save(qpath)
    qat.save(qpath[:-3] + ".keras")
    return fpath, qpath


def load_tf(path: str, onednn: bool = False) -> Any:
    with tfmot(onednn).quantization.keras.quantize_scope():
        return keras(onednn).models.load_model(path, compile=False)


def layer_weights(model: Any) -> dict[str, list[np.ndarray]]:
    """Each layer's weights in its own order (the order an .h5 file lists them)."""
    return {layer.name: [w.numpy() for w in layer.weights] for layer in model.layers}


def batches(model: Any, n: int, batch: int, seed: int = 7
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``n`` input batches for ``model`` (a tf_keras model) and the loss's ``c`` for each:
    the same in every parity run of a seed."""
    rng = np.random.default_rng(seed)
    shape, nout = input_shape(model), int(model.output_shape[-1])
    xs = [rng.standard_normal((batch, *shape)).astype(np.float32) for _ in range(n)]
    cs = [rng.standard_normal((batch, nout)).astype(np.float32) for _ in range(n)]
    return xs, cs


def file_batch(path: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """One input batch for the Keras file's model (read from its plan: no TF) and the
    loss's ``c``: the benchmarks' and the GPU check's."""
    from ..qat import load_plan

    plan, _ = load_plan(path)
    shape = plan.node(plan.inputs[0]).output_shape[1:]
    classes = plan.node(plan.outputs[0]).output_shape[-1]
    rng = np.random.default_rng(0)
    return (rng.standard_normal((batch, *shape)).astype(np.float32),
            rng.standard_normal((batch, classes)).astype(np.float32))


def by_name(weights: dict[str, list[tuple[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """A port's ``keras_weights()`` as one dict by weight name."""
    return {n: v for layer in weights.values() for n, v in layer}


def named_like(names: dict[str, list[tuple[str, Any]]], weights: dict[str, list[np.ndarray]]
               ) -> dict[str, np.ndarray]:
    """TF's per-layer weight values (:func:`layer_weights`) named as the port names them
    (a loaded model's variables are named otherwise than the file's)."""
    return {n: v for layer, ws in weights.items() for (n, _), v in zip(names[layer], ws)}


def ranges_differ(port: Any, got: dict, ref: dict) -> tuple[int, list[str]]:
    """After one step, ``port``'s range variables (``got``: a port's step record) against
    TF's (``ref``: :func:`tf_steps`' record): how many there are, and those whose bits
    differ."""
    tfw = named_like(port.keras_weights(), ref["weights"])
    ported = by_name(got["weights"])
    ranges = [n for n in tfw if n.split(":")[0].endswith(("_min", "_max"))]
    return len(ranges), [n for n in ranges if not np.array_equal(ported[n], tfw[n])]


def tf_steps(model: Any, xs: list[np.ndarray], cs: list[np.ndarray], lr: float
             ) -> list[dict[str, Any]]:
    """Train ``model`` one SGD step per batch: loss ``sum(y * c)``, ``var -= lr * grad``.
    Returns per step the training forward's output and every layer's weights after the
    update."""
    import tensorflow as tf

    out = []
    lr32 = tf.constant(lr, tf.float32)
    for x, c in zip(xs, cs):
        with tf.GradientTape() as tape:
            y = model(x, training=True)
            loss = tf.reduce_sum(y * c)
        grads = tape.gradient(loss, model.trainable_weights)
        for v, g in zip(model.trainable_weights, grads):
            v.assign_sub(lr32 * g)
        out.append({"y": y.numpy(), "weights": layer_weights(model)})
    return out


def tf_xent_steps(model: Any, xs: list[np.ndarray], labels: list[np.ndarray], lr: float
                  ) -> list[dict[str, Any]]:
    """A tf_keras training step as TF computes it: the mean of
    ``tf.nn.sparse_softmax_cross_entropy_with_logits`` and tf_keras' SGD (``var + (-grad *
    lr)``, float32, two roundings). Per step: the loss, the training forward's output and
    every layer's weights after the update."""
    import tensorflow as tf

    opt = keras().optimizers.SGD(learning_rate=lr)
    out = []
    for x, t in zip(xs, labels):
        with tf.GradientTape() as tape:
            y = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=t, logits=y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_weights),
                                model.trainable_weights))
        out.append({"loss": loss.numpy(), "y": y.numpy(), "weights": layer_weights(model)})
    return out


def torch_xent_steps(model: Any, xs: list[np.ndarray], labels: list[np.ndarray], lr: float
                     ) -> list[dict[str, Any]]:
    """:func:`tf_xent_steps` on a ``tfgrad.torch.qat`` module: TF's loss through
    ``tfgrad.torch`` (SparseSoftmaxCrossEntropyWithLogits, then Mean) and the update as
    tf_keras' SGD rounds it."""
    import torch

    import tfgrad.torch as tt

    model.train()
    lr32 = torch.tensor(lr, dtype=torch.float32)
    out = []
    for x, t in zip(xs, labels):
        y = model(torch.from_numpy(x))
        per_example = tt.sparse_softmax_cross_entropy_with_logits(y, torch.from_numpy(t))[0]
        loss = tt.mean(per_example, [0])
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(-p.grad * lr32)
                p.grad = None
        out.append({"loss": loss.detach().numpy(), "y": y.detach().numpy(),
                    "weights": model.keras_weights()})
    return out


def torch_steps(model: Any, xs: list[np.ndarray], cs: list[np.ndarray], lr: float
                ) -> list[dict[str, Any]]:
    """:func:`tf_steps` on a ``tfgrad.torch.qat`` module (torch imported here): per step
    the training forward's output and ``model.keras_weights()`` after the update."""
    import torch

    model.train()
    lr32 = torch.tensor(lr, dtype=torch.float32)
    out = []
    for x, c in zip(xs, cs):
        y = model(torch.from_numpy(x))
        (y * torch.from_numpy(c)).sum().backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(lr32 * p.grad)
                p.grad = None
        out.append({"y": y.detach().numpy(), "weights": model.keras_weights()})
    return out


def exact_ranges(plan: Plan) -> set[str]:
    """The range variables whose every upstream op is one of tfgrad's operators or exact in
    any framework (elementwise adds, max, pads, reshapes), so a port's values after a
    training forward equal TF's bit for bit: weight ranges, and activation ranges of
    nodes whose inputs are all exact."""
    exact_kinds = {"InputLayer", "QuantizeLayer", "DepthwiseConv2D", "ReLU", "Add",
                   "Concatenate", "ZeroPadding2D", "MaxPooling2D", "Flatten", "Reshape",
                   "Dropout"}
    good: set[str] = set()
    names: set[str] = set()
    for n in plan.nodes:
        upstream = all(i in good for i in n.inputs)
        for place, q in n.quantizers():
            if place.startswith("weight:"):
                names |= {q.min_name, q.max_name}
        ok = upstream and (
            n.kind in exact_kinds
            or (n.kind == "BatchNormalization" and len(n.output_shape) == 4)
            or (n.kind == "Activation" and n.activation in ("relu", "relu6", "linear")))
        if ok:
            good.add(n.name)
            for _, q in n.quantizers():
                names |= {q.min_name, q.max_name}
    return names
