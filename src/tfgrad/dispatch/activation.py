"""Relu, Relu6 and their gradients on the compiled kernels (``tfgrad.kernels.activation``):
flat bit views, the float type's constants, TF's packet body and scalar tail."""

from __future__ import annotations

import numpy as np

from .._compile import launch
from .._tf.relu import FORMATS, Format, kinds
from ..kernels import activation as k

_FAMILY = "activation"


def _bits(a: np.ndarray, fmt: Format) -> np.ndarray:
    """C-contiguous flat view of ``a``'s bits (a copy only if needed)."""
    return np.ascontiguousarray(a).reshape(-1).view(fmt.uint)


def _consts(fmt: Format) -> tuple:
    T = fmt.uint
    return (T(0), T(fmt.sign), T(~fmt.sign & (2 * fmt.sign - 1)), T(fmt.normal), T(fmt.inf))


# (the kernels' constants per float type, made once: NumPy scalars cost ~0.4 us apiece)
_FORWARD = {n: (*_consts(f), f.uint(f.six)) for n, f in FORMATS.items()}
_BACKWARD = {n: (*_consts(f), f.uint(f.quiet), f.uint(f.six)) for n, f in FORMATS.items()}
_BY_DTYPE: dict[np.dtype, tuple[Format, tuple, tuple]] = {}


def _format(dt: np.dtype) -> tuple[Format, tuple, tuple]:
    """(format, forward constants, backward constants) of a float type, by dtype: its
    ``.name`` is a Python property that costs microseconds a call."""
    hit = _BY_DTYPE.get(dt)
    if hit is None:
        n = dt.name
        hit = _BY_DTYPE[dt] = (FORMATS[n], _FORWARD[n], _BACKWARD[n])
    return hit


def forward(x: np.ndarray, relu6: bool) -> np.ndarray:
    fmt, consts, _ = _format(x.dtype)
    out = np.empty(x.shape, x.dtype)
    u, o = _bits(x, fmt), out.reshape(-1).view(fmt.uint)
    n = u.size
    end, body, first, tail = kinds(n, fmt, relu6)
    if end:
        launch(_FAMILY, k.forward(body, relu6, fmt.daz), end, u[:end], o[:end], *consts,
               units=-(-end // k.CHUNK))
    if end < n:  # TF's scalar tail: its first value, then the rest
        k.forward(first, relu6, fmt.daz).serial(u[end:end + 1], o[end:end + 1], *consts)
        if end + 1 < n:
            k.forward(tail, relu6, fmt.daz).serial(u[end + 1:], o[end + 1:], *consts)
    return out


def backward(g: np.ndarray, f: np.ndarray, relu6: bool) -> np.ndarray:
    fmt, _, consts = _format(f.dtype)
    out = np.empty(f.shape, f.dtype)
    gu, fu, o = _bits(g, fmt), _bits(f, fmt), out.reshape(-1).view(fmt.uint)
    n = fu.size
    end = n - n % fmt.packet if fmt.packet else n
    if end:
        launch(_FAMILY, k.backward(fmt.body_nan, relu6, fmt.daz), end, gu[:end], fu[:end],
               o[:end], *consts, units=-(-end // k.CHUNK))
    if end < n:
        k.backward(fmt.tail_nan, relu6, fmt.daz).serial(gu[end:], fu[end:], o[end:], *consts)
    return out
