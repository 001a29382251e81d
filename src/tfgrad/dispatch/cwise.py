"""SquaredDifference, Rsqrt and RsqrtGrad (float32 / float64) on the compiled kernels
(``tfgrad.kernels.cwise``): flat C-contiguous views, the packet body's end, and the
broadcast patterns that need no broadcast copy (one operand a single value, or the
other's trailing dimensions: a [N, C] x against its [1, C] mean)."""

from __future__ import annotations

import math

import numpy as np

from .._compile import launch
from .._tf.cwise import PACKET, broadcast_shape
from ..kernels import cwise as k

_FAMILY = "cwise"


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1)


def _units(n: int) -> int:
    return -(-n // k.CHUNK)


def _trailing(small: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """The number of values of ``small`` when it equals ``shape``'s trailing dimensions
    once its leading 1s are dropped (so it repeats along the flat output); else 0."""
    s = list(small)
    while s and s[0] == 1:
        s.pop(0)
    if not s or tuple(s) != tuple(shape[len(shape) - len(s):]):
        return 0
    return math.prod(s)


def SquaredDifference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    shape = broadcast_shape(x.shape, y.shape)
    assert shape is not None
    out = np.empty(shape, x.dtype)
    o = out.reshape(-1)
    n = o.size
    if n == 0:
        return out
    if x.shape == shape and y.shape == shape:
        launch(_FAMILY, k.squared_difference, n, _flat(x), _flat(y), o, units=_units(n))
    elif y.size == 1 and x.shape == shape:
        launch(_FAMILY, k.squared_difference_scalar, n, _flat(x), _flat(y), o, units=_units(n))
    elif x.size == 1 and y.shape == shape:
        launch(_FAMILY, k.squared_difference_scalar_x, n, _flat(x), _flat(y), o,
               units=_units(n))
    elif x.shape == shape and (cols := _trailing(y.shape, shape)):
        launch(_FAMILY, k.squared_difference_rows, n, _flat(x), _flat(y), o, cols,
               units=n // cols)
    elif y.shape == shape and (cols := _trailing(x.shape, shape)):
        launch(_FAMILY, k.squared_difference_rows_x, n, _flat(x), _flat(y), o, cols,
               units=n // cols)
    else:  # any other broadcast: the operands expanded (elementwise: the same bits)
        a = _flat(np.broadcast_to(x, shape))
        b = _flat(np.broadcast_to(y, shape))
        launch(_FAMILY, k.squared_difference, n, a, b, o, units=_units(n))
    return out


def Rsqrt(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, x.dtype)
    o = out.reshape(-1)
    n = o.size
    if n:
        if x.dtype == np.float64:
            launch(_FAMILY, k.rsqrt_f64, n, _flat(x), o, units=_units(n))
        else:
            launch(_FAMILY, k.rsqrt_f32, n, _flat(x), o, n - n % PACKET["float32"],
                   units=_units(n))
    return out


def RsqrtGrad(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    out = np.empty(y.shape, y.dtype)
    o = out.reshape(-1)
    n = o.size
    if n:
        t = y.dtype.type
        end = n - n % PACKET[y.dtype.name]
        launch(_FAMILY, k.rsqrt_grad, n, _flat(y), _flat(dy), o, end, t(0), t(-0.5),
               units=_units(n))
    return out
