"""BiasAdd, BiasAddGrad and Identity in jax.numpy, for any XLA backend.

BiasAdd follows :mod:`tfgrad.ops.bias_add`'s reference (the spec; docs/bias_add.md): one
addition per value with TF's FTZ / DAZ explicit and x86's choice of NaN (value's, else
bias's): bit-identical to the exact kernels. BiasAddGrad is ``jnp.sum`` over the
non-channel dimensions: XLA's order, not TF's blocks (see BOUNDS). Identity is a copy.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

Array = Any

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "BiasAdd": {"output": {"float32": 0, "float64": 0}},
    "BiasAddGrad": {"output": {"float32": 8192, "float64": 8192}},
    "Identity": {"output": {dt: 0 for dt in ("float16", "bfloat16", "float32", "float64")}},
}
NOTES: dict[str, str] = {
    "BiasAddGrad": "summed in XLA's order, not TF's ReduceOuterDimensions / "
    "ReduceMiddleDimensions blocks (which depend on TF's thread count).",
}


def _ftz(v: Array) -> Array:
    return jnp.where(jnp.abs(v) < jnp.finfo(v.dtype).tiny, v * 0, v)


def BiasAdd(*, value: Array, bias: Array, data_format: str) -> Array:
    shape = [1] * value.ndim
    shape[1 if data_format == "NCHW" else value.ndim - 1] = bias.shape[0]
    b = bias.reshape(shape)
    s = _ftz(_ftz(value) + _ftz(b))
    return jnp.where(jnp.isnan(value), value + value, jnp.where(jnp.isnan(b), b + b, s))


def BiasAddGrad(*, out_backprop: Array, data_format: str) -> Array:
    axis = 1 if data_format == "NCHW" else out_backprop.ndim - 1
    dims = tuple(d for d in range(out_backprop.ndim) if d != axis)
    return _ftz(out_backprop).sum(dims) if dims else out_backprop


def Identity(*, input: Array) -> Array:  # noqa: A002 - TF's name
    return jnp.asarray(input)
