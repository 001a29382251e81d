"""BiasAdd and BiasAddGrad (NHWC sums) on the compiled kernels (``tfgrad.kernels.bias_add``):
layouts, TF's row blocks for the sums, the blocks' final additions."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .._compile import launch
from .._tf.eigen import redux_blocks
from .._tf.fpenv import flush_denormals
from .._tf.redux import add
from ..kernels import bias_add as k

_FAMILY = "bias_add"


def bias_add(value: np.ndarray, bias: np.ndarray, dims: tuple[int, int, int]) -> np.ndarray:
    """value + bias for value viewed as ``dims`` = (outer, C, inner)."""
    b, c, hw = dims
    tiny = value.dtype.type(np.finfo(value.dtype).tiny)
    x = np.ascontiguousarray(value)
    out = np.empty(value.shape, value.dtype)
    bias = np.ascontiguousarray(bias)
    if hw == 1:
        launch(_FAMILY, k.bias_rows, x.size, x.reshape(b, c), bias, out.reshape(b, c), tiny,
               units=-(-b // 256))
    else:
        launch(_FAMILY, k.bias_planes, x.size, x.reshape(b, c, hw), bias,
               out.reshape(b, c, hw), tiny, units=b * c)
    return out


@lru_cache(maxsize=16)
def _tiny(dtype: np.dtype) -> np.floating:
    return dtype.type(np.finfo(dtype).tiny)


@lru_cache(maxsize=256)
def _blocks(r: int, c: int, itemsize: int, threads: int) -> tuple[int, int, int]:
    return redux_blocks(r, c, itemsize, threads)


def bias_add_grad(g: np.ndarray, r: int, c: int, threads: int) -> np.ndarray:
    """``ReduceOuterDimensions`` column sums of g viewed as [r, c] (r, c > 0)."""
    x = np.ascontiguousarray(g).reshape(r, c)
    if r == 1:
        return x[0].copy()  # TF passes a single row through (no addition, no flush)
    nb, rows, per_call = _blocks(r, c, x.dtype.itemsize, threads)
    buffers = np.zeros((nb, c), x.dtype)
    tiny = _tiny(x.dtype)
    tasks = -(-nb // per_call) * -(-c // k.WIDTH)
    launch(_FAMILY, k.column_sums, x.size, x.reshape(-1), c, rows, per_call, buffers, tiny,
           units=tasks)
    nan = np.isnan(buffers)
    if nan.any():
        for s, j in zip(*np.nonzero(nan)):  # (rare) the NaN TF's order gives
            buffers[s, j] = k.column_sum_nan(x.reshape(-1), c, j, s * rows,
                                             min(r, (s + per_call) * rows), tiny)
    total = buffers[0]
    if nb == 1:
        return total
    with flush_denormals():
        for i in range(1, nb):
            total = add(total, buffers[i])
    return total
