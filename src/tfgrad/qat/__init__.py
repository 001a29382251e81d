"""TensorFlow Model Optimization's quantization-aware training scheme, framework-neutral.

:func:`load_plan` reads a tf_keras model file (``.h5``) and gives the :class:`Plan` that
``tfgrad.torch.qat`` and ``tfgrad.jax.qat`` build from: the layers in graph order with
their weights and tfmot's quantizers. See docs/qat.md.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ._files import KerasFile, KerasFileError, name_keras_vars, read_keras, write_keras_h5
from ._plan import (
    SUPPORTED,
    Node,
    Plan,
    Quantizer,
    UnsupportedLayerError,
    Weight,
    build_plan,
)

__all__ = [
    "SUPPORTED", "KerasFile", "KerasFileError", "Node", "Plan", "Quantizer",
    "UnsupportedLayerError", "Weight", "build_plan", "load_plan", "plan_from_config",
    "read_keras", "write_keras_h5",
]


def plan_from_config(config: dict[str, Any], quantize: bool | None = None) -> Plan:
    """The plan of a Keras model config. ``quantize=None``: the model as it is (a tfmot QAT
    model with its quantizers, a float model as float); ``quantize=True``: a float model
    quantized as tfmot's ``quantize_model`` would; ``quantize=False``: refuse a QAT model."""
    body = config.get("config", {}) if isinstance(config, dict) else {}
    layers = body.get("layers", []) if isinstance(body, dict) else body
    quantized = any(isinstance(x, dict) and x.get("class_name") in _QAT_CLASSES
                    for x in layers or [])
    if quantize is True and not quantized:
        from ._rewrite import quantize_config_and_sources

        qat, sources = quantize_config_and_sources(config)
        return dataclasses.replace(build_plan(qat), sources=sources)
    if quantize is False and quantized:
        raise KerasFileError("quantize=False, but the model is already quantized (tfmot's "
                             "QuantizeWrapperV2 layers); load it with quantize=None")
    return build_plan(config)


_QAT_CLASSES = ("QuantizeWrapperV2", "QuantizeWrapper", "QuantizeLayer")


def load_plan(path: str | os.PathLike[str], quantize: bool | None = None
              ) -> tuple[Plan, KerasFile]:
    """Read a tf_keras model file and build its plan; the weights come with it."""
    f = read_keras(path)
    plan = plan_from_config(f.config, quantize)
    if f.layer_vars is not None:  # a .keras archive: its weights are named by position
        f.weights = name_keras_vars(plan, f)
    return plan, f
