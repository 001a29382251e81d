"""BiasAdd, BiasAddGrad (NHWC and NCHW) and Identity (BiasAdd's value gradient).

Bit-exact with TensorFlow 2.21's CPU kernels (``bias_op.cc``, ``bias_op.h``,
``redux_functor.h``):

- BiasAdd: ``value + bias`` broadcast over the channels, one float addition per value
  under FTZ / DAZ (a denormal operand reads as a zero of its sign; a denormal sum is
  flushed); a NaN result is value's NaN quietened if value is NaN, else bias's (x86 gives
  the first operand's payload). On the CPU both data formats are computed (NCHW: the
  channel is dimension 1).
- BiasAddGrad: per-channel sums. NHWC: ``ReduceOuterDimensions`` over ``[R, C]`` (rows
  in sequence from +0 within TF's row blocks, blocks added in order; a single row is
  passed through untouched); NCHW: ``ReduceMiddleDimensions`` over ``[B, C, HW]`` (equal
  flat ranges, Eigen's full reducer per piece of a row). The blocks depend on TF's
  intra-op thread count (``tfgrad._config.tf_intra_op_threads``): the models are in
  ``tfgrad._tf.redux``.
- Identity: a copy of its input, bit for bit.

The TF behaviours and the tests that pin them: docs/bias_add.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf import redux
from .._tf.fpenv import flush_denormals
from .._validate import check_alloc, shape_str


@cache
def _dispatch() -> Any:
    from ..dispatch import bias_add

    return bias_add


def channel_axis(ndim: int, data_format: str) -> int:
    return 1 if data_format == "NCHW" else ndim - 1


def three_dims(shape: tuple[int, ...], data_format: str) -> tuple[int, int, int]:
    """``(outer, C, inner)``: NHWC ``[R, C, 1]``, NCHW ``[B, C, HW]``."""
    ax = channel_axis(len(shape), data_format)
    outer = int(math.prod(shape[:ax]))
    inner = int(math.prod(shape[ax + 1:]))
    return outer, int(shape[ax]), inner


# --------------------------------------------------------------------------------------
# The NumPy reference
# --------------------------------------------------------------------------------------
def _quiet(a: np.ndarray) -> np.ndarray:
    return a + a  # a NaN's payload, quietened (x86); (only used where a is NaN)


def reference_bias_add(value: np.ndarray, bias: np.ndarray, data_format: str) -> np.ndarray:
    b, c, hw = three_dims(value.shape, data_format)
    x = value.reshape(b, c, hw)
    bb = bias.reshape(1, c, 1)
    with flush_denormals(), np.errstate(invalid="ignore"):
        out = x + bb
        # Which NaN: value's if it is one, else bias's (the first operand's payload).
        out = np.where(np.isnan(x), _quiet(x), np.where(np.isnan(bb), _quiet(bb), out))
    return out.astype(value.dtype).reshape(value.shape)


def reference_bias_add_grad(g: np.ndarray, data_format: str) -> np.ndarray:
    b, c, hw = three_dims(g.shape, data_format)
    if c == 0:
        return np.empty(0, g.dtype)
    if g.size == 0:
        return np.zeros(c, g.dtype)
    threads = _config.tf_intra_op_threads()
    if hw == 1:
        return redux.reduce_outer(g.reshape(b, c), threads)
    return redux.reduce_middle(g.reshape(b, c, hw), threads)


# --------------------------------------------------------------------------------------
# Checks and the ops
# --------------------------------------------------------------------------------------
def _at_least_2d(a: np.ndarray) -> None:
    if a.ndim < 2:
        raise InvalidArgumentError(f"Input tensor must be at least 2D: {shape_str(a.shape)}")


def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every check that needs only shapes, in TF's order and words."""
    if op == "Identity":
        return {}
    if op == "BiasAdd":
        value, bias = args["value"], args["bias"]
        _at_least_2d(value)
        if bias.ndim != 1:
            raise InvalidArgumentError(f"Biases must be 1D: {shape_str(bias.shape)}")
        ax = channel_axis(value.ndim, args["data_format"])
        if bias.shape[0] != value.shape[ax]:
            raise InvalidArgumentError(
                "Must provide as many biases as the last dimension of the input tensor: "
                f"{shape_str(bias.shape)} vs. {shape_str(value.shape)}")
        check_alloc(op, "output", value.shape, value.dtype)
        return {}
    g = args["out_backprop"]
    _at_least_2d(g)
    if g.size > np.iinfo(np.int32).max:
        raise InvalidArgumentError("BiasGrad requires tensor size <= int32 max")
    return {"output": (int(g.shape[channel_axis(g.ndim, args["data_format"])]),)}


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    check(op, args)
    if op == "Identity":
        return lambda a: np.array(a["input"], copy=True)
    fmt = args["data_format"]
    if op == "BiasAdd":
        dims = three_dims(args["value"].shape, fmt)
        return lambda a: _bias_add(a["value"], a["bias"], fmt, dims)
    dims = three_dims(args["out_backprop"].shape, fmt)
    return lambda a: _bias_add_grad(a["out_backprop"], fmt, dims)


def _bias_add(value: np.ndarray, bias: np.ndarray, fmt: str,
              dims: tuple[int, int, int]) -> np.ndarray:
    if _config.use_reference() or value.size == 0:
        return reference_bias_add(value, bias, fmt)
    return _dispatch().bias_add(value, bias, dims)


def _bias_add_grad(g: np.ndarray, fmt: str, dims: tuple[int, int, int]) -> np.ndarray:
    if _config.use_reference():
        return reference_bias_add_grad(g, fmt)
    b, c, hw = dims
    if c == 0 or g.size == 0 or hw > 1:
        # (NCHW: the NumPy model, vectorized over whole rows, is the implementation)
        return reference_bias_add_grad(g, fmt)
    return _dispatch().bias_add_grad(g, b, c, _config.tf_intra_op_threads())


def BiasAdd(*, value: np.ndarray, bias: np.ndarray, data_format: str) -> np.ndarray:
    args = locals()
    return prepare("BiasAdd", args)(args)


def BiasAddGrad(*, out_backprop: np.ndarray, data_format: str) -> np.ndarray:
    args = locals()
    return prepare("BiasAddGrad", args)(args)


def Identity(*, input: np.ndarray) -> np.ndarray:  # noqa: A002 - TF's name
    args = locals()
    return prepare("Identity", args)(args)
