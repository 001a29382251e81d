"""Reading and writing tf_keras (Keras 2) model files without TensorFlow.

A tf_keras ``.h5`` file holds the model's JSON config in the root attribute
``model_config`` and the weights under ``model_weights/<layer>/``, whose attribute
``weight_names`` lists them in the layer's order (``quant_conv2d/kernel_min:0``). h5py is
imported lazily (the ``qat`` extra).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import InvalidArgumentError


class KerasFileError(InvalidArgumentError):
    """A file is not a tf_keras model file tfgrad can read (truncated, not Keras, Keras 3,
    weights missing or of the wrong shape)."""


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - exercised only without h5py
        raise ImportError("reading and writing Keras files needs h5py: "
                          "pip install tfgrad[qat]") from e
    return h5py


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


@dataclass
class KerasFile:
    """A tf_keras model file read into memory: its config and its weights by layer."""

    path: str
    config: dict[str, Any]
    keras_version: str
    # layer name -> [(weight name, value)] in the file's order
    weights: dict[str, list[tuple[str, np.ndarray]]] = field(default_factory=dict)
    # a .keras archive's weights as it stores them: "layers/conv2d/vars" -> [values]
    # (named by the layers' classes; :func:`name_keras_vars` names them with the plan)
    layer_vars: dict[str, list[np.ndarray]] | None = None


_KERAS3_HINT = (
    "tfgrad reads tf_keras (Keras 2) files, as tfmot does: tfmot refuses Keras 3 models. "
    "Rebuild the model with tf_keras (`import tf_keras as keras`, or TF_USE_LEGACY_KERAS=1) "
    "and save it with model.save('model.h5')")


def read_keras(path: str | os.PathLike[str]) -> KerasFile:
    """Read a tf_keras ``.h5`` model file (config and weights). Raises
    :class:`KerasFileError` for a file that is not one, saying what it is instead."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise KerasFileError(f"{p!r}: no such file")
    with open(p, "rb") as fh:
        head = fh.read(8)
    if head.startswith(b"PK"):
        return _read_zip(p)
    if head != b"\x89HDF\r\n\x1a\n":
        raise KerasFileError(
            f"{p!r} is not a Keras model file: expected an HDF5 (.h5) file written by "
            "tf_keras' model.save, found neither HDF5 nor zip content")
    h5py = _h5py()
    try:
        f = h5py.File(p, "r")
    except OSError as e:
        raise KerasFileError(f"{p!r}: cannot read it as HDF5 ({e}); is it truncated?") from None
    with f:
        attrs = f.attrs
        if "model_config" not in attrs:
            if "layer_names" in attrs:
                raise KerasFileError(
                    f"{p!r} holds weights only (model.save_weights): tfgrad needs the whole "
                    "model, saved with model.save('model.h5')")
            raise KerasFileError(f"{p!r} is an HDF5 file but not a Keras model: it has no "
                                 "'model_config' attribute")
        version = _text(attrs.get("keras_version", ""))
        if version.startswith("3"):
            raise KerasFileError(f"{p!r} was written by Keras {version}. {_KERAS3_HINT}")
        try:
            config = json.loads(_text(attrs["model_config"]))
        except json.JSONDecodeError as e:
            raise KerasFileError(f"{p!r}: its model_config is not valid JSON ({e})") from None
        weights: dict[str, list[tuple[str, np.ndarray]]] = {}
        if "model_weights" not in f:
            raise KerasFileError(f"{p!r} has a config but no weights ('model_weights' group)")
        mw = f["model_weights"]
        try:
            for layer in mw.attrs.get("layer_names", []):
                name = _text(layer)
                g = mw[name]
                weights[name] = [(_text(w), np.array(g[_text(w)]))
                                 for w in g.attrs.get("weight_names", [])]
        except (KeyError, OSError) as e:
            raise KerasFileError(f"{p!r}: a weight listed in the file cannot be read ({e}); "
                                 "is the file truncated?") from None
    return KerasFile(p, config, version, weights)


def _read_zip(p: str) -> KerasFile:
    try:
        with zipfile.ZipFile(p) as z:
            names = set(z.namelist())
            meta = json.loads(z.read("metadata.json")) if "metadata.json" in names else {}
            version = str(meta.get("keras_version", ""))
            if version.startswith("3"):
                raise KerasFileError(f"{p!r} was written by Keras {version}. {_KERAS3_HINT}")
            if "config.json" not in names:
                raise KerasFileError(f"{p!r} is a zip file but not a Keras model (no "
                                     "config.json)")
            config = json.loads(z.read("config.json"))
            if "model.weights.h5" not in names:
                raise KerasFileError(f"{p!r} has a config but no weights (model.weights.h5)")
            blob = z.read("model.weights.h5")
    except (zipfile.BadZipFile, OSError, json.JSONDecodeError, EOFError) as e:
        raise KerasFileError(f"{p!r}: not a readable .keras archive ({e}); is it "
                             "truncated?") from None
    import io

    h5py = _h5py()
    layer_vars: dict[str, list[np.ndarray]] = {}
    try:
        with h5py.File(io.BytesIO(blob), "r") as f:
            def visit(name: str, obj: Any) -> None:
                if name.endswith("/vars") or name == "vars":
                    layer_vars[name] = [np.array(obj[str(i)]) for i in range(len(obj))]

            f.visititems(visit)
    except (OSError, KeyError) as e:
        raise KerasFileError(f"{p!r}: its model.weights.h5 cannot be read ({e})") from None
    return KerasFile(p, config, version, {}, layer_vars)


def to_snake_case(name: str) -> str:
    """tf_keras' generic_utils.to_snake_case: how a .keras archive names a layer's
    weights (by its class, counted in the model's layer order)."""
    intermediate = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    insecure = re.sub("([a-z])([A-Z])", r"\1_\2", intermediate).lower()
    return insecure if insecure[0] != "_" else "private" + insecure


def write_keras_h5(path: str | os.PathLike[str], config: Mapping[str, Any],
                   weights: Mapping[str, Sequence[tuple[str, np.ndarray]]],
                   layer_order: Sequence[str], keras_version: str = "2.21.0") -> None:
    """Write a tf_keras ``.h5`` model file atomically (a temporary file in the same folder,
    renamed over ``path`` only once complete), as tf_keras' ``model.save`` lays it out."""
    h5py = _h5py()
    p = os.fsdecode(os.fspath(path))
    folder = os.path.dirname(os.path.abspath(p))
    if os.path.isdir(p):
        raise IsADirectoryError(f"{p!r} is a folder: name the .h5 file to write, e.g. "
                                f"{os.path.join(p, 'model.h5')!r}")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{p!r}: its folder {folder!r} does not exist (create it "
                                f"first)")
    try:
        fd, tmp = tempfile.mkstemp(suffix=".h5.tmp", dir=folder)
    except PermissionError as e:
        raise PermissionError(f"{p!r}: cannot write in {folder!r} ({e.strerror})") from None
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["backend"] = "tensorflow"
            f.attrs["keras_version"] = keras_version
            f.attrs["model_config"] = json.dumps(config)
            mw = f.create_group("model_weights")
            mw.attrs["backend"] = "tensorflow"
            mw.attrs["keras_version"] = keras_version
            mw.attrs["layer_names"] = np.array([n.encode() for n in layer_order])
            for name in layer_order:
                g = mw.create_group(name)
                ws = list(weights.get(name, ()))
                g.attrs["weight_names"] = np.array([w.encode() for w, _ in ws])
                for wname, value in ws:
                    g.create_dataset(wname, data=np.asarray(value))
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def name_keras_vars(plan: Any, f: KerasFile) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Name a .keras archive's weights with the plan, as tf_keras saved them: each layer
    of the model (config order; a Sequential's InputLayer is not one) under
    ``layers/<snake_case(class)>[_n]/vars``, its own trainable then non-trainable
    weights. A tfmot wrapper's own list is the wrapped layer's trainable weights, its
    quantized weights again (QuantizeWrapper.build appends them), then optimizer_step and
    the ranges; the wrapped layer's ``layer/vars`` keep what its quantized weights left
    (set_quantize_weights replaces the attribute, which untracks the variable)."""
    assert f.layer_vars is not None
    sequential = plan.config.get("class_name") == "Sequential"
    counts: dict[str, int] = {}
    out: dict[str, list[tuple[str, np.ndarray]]] = {}
    for i, node in enumerate(plan.nodes):
        if sequential and i == 0 and node.kind == "InputLayer":
            out[node.name] = []
            continue
        cls = ("QuantizeWrapperV2" if node.wrapped and node.kind != "QuantizeLayer"
               else node.kind)
        snake = to_snake_case(cls)
        n = counts.get(snake)
        counts[snake] = 0 if n is None else n + 1
        path = f"layers/{snake}" if n is None else f"layers/{snake}_{n + 1}"
        own = f.layer_vars.get(f"{path}/vars", [])
        if not (node.wrapped and node.kind != "QuantizeLayer"):
            layouts = [list(node.weights)]
            values = own
        else:
            quantized = set(node.weight_quantizers)
            inner = [w for w in node.weights if w.name.startswith(f"{node.inner}/")]
            extra = [w for w in node.weights if not w.name.startswith(f"{node.inner}/")]
            trainable = [w for w in inner if w.trainable]
            again = [w for w in inner if w.attr in quantized]
            kept = [w for w in inner if w.attr not in quantized]
            kept = [w for w in kept if w.trainable] + [w for w in kept if not w.trainable]
            # The wrapper's own list depends on the model's history (tfmot #1123): the
            # wrapped layer's trainable weights then the quantized ones again (a model
            # fresh from quantize_model), or the quantized ones alone (one loaded back)
            layouts = [p + extra + kept for p in (trainable + again, again, trainable)]
            values = own + f.layer_vars.get(f"{path}/layer/vars", [])
        expected = next((e for e in layouts if len(e) == len(values) and all(
            tuple(w.shape) == tuple(v.shape) for w, v in zip(e, values))), None)
        if expected is None:
            want = layouts[0]
            raise KerasFileError(
                f"{f.path!r}: layer {node.name!r} ({path}) holds {len(values)} weights of "
                f"shapes {[list(v.shape) for v in values]}; the model needs "
                f"{', '.join(f'{w.name} {list(w.shape)}' for w in want)}")
        named: dict[str, np.ndarray] = {}
        for w, v in zip(expected, values):
            named.setdefault(w.name, v)
        out[node.name] = [(w.name, named[w.name]) for w in node.weights]
    return out
