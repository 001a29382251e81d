"""Activations: Relu, Relu6 and their gradients ReluGrad, Relu6Grad.

Bit-exact with TensorFlow 2.21's Eigen CPU kernels (``relu_op_functor.h``):

- ``Relu = features.cwiseMax<PropagateNaN>(0)``, ``Relu6 = ....cwiseMin<PropagateNaN>(6)``;
- ``ReluGrad = gradients * (features > 0).cast<T>()``, ``Relu6Grad = gradients *
  ((features > 0) * (features < 6)).cast<T>()``.

No value is ever rounded, so each output is one of the input's bits, a zero, six or a NaN,
and what varies is which: TF runs with FTZ / DAZ set (a denormal operand reads as a zero of
its sign, a denormal result is flushed), and Eigen evaluates the flat tensor as AVX packets
of ``PACKET[dtype]`` values (``EvalRange``: every parallelFor block is a multiple of the
packet, so only the last ``size % packet`` values are scalar code), where the compiled
scalar code differs from the packet code. Measured on TF 2.21 (docs/activation.md):

- packet body, float32 / float64: ``max(x, 0)`` as ``maxps(x, 0)``: x if x is NaN or a
  positive normal (or inf), else +0 (a denormal or -0 gives +0);
- scalar tail, float32 / float64: Relu's first tail value when the tail has odd length is
  a compare-and-select (``x < 0 ? 0 : x`` with DAZ: x kept, a denormal of either sign and
  -0 too, a negative normal gives +0: "select"); the remaining pairs are ``maxps(0, x)``
  (a negative normal gives +0, otherwise x flushed: -denormal gives -0: "pair"). Relu6's
  tail is all "select" (then ``6 < m ? 6 : m``);
- bfloat16: the body is "pair" (computed on float32 packets), the tail "select";
- float16: "select" everywhere, without DAZ (a half denormal is a normal float32);
- NaN: the input's bits, payload and sign kept (PropagateNaN selects ``x``).

The gradients are one multiplication by 1 or 0 (the mask compares with DAZ): x86's rules
give ``g`` (flushed) or a zero of g's sign, a NaN ``g`` quietened, and ``inf * 0`` the
default NaN (sign set). bfloat16 converts NaN results on the way back: canonical 0x7fc0
in the packet body, sign | 0x7fc0 in the tail; float16 keeps the quietened payload.

This module holds the checks and the NumPy reference (the spec, on the values' bit
patterns); the kernels are in ``tfgrad.kernels.activation``, run by
``tfgrad.dispatch.activation``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf.relu import BODY, CANONICAL, FORMATS, QUIET, SELECT, SIGNED, Format, kinds
from .._validate import check_alloc, shape_str


@cache
def _dispatch() -> Any:
    from ..dispatch import activation

    return activation


# --------------------------------------------------------------------------------------
# The NumPy reference, on bit patterns
# --------------------------------------------------------------------------------------
def _ref_forward(u: np.ndarray, kind: np.ndarray, fmt: Format, relu6: bool) -> np.ndarray:
    T = fmt.uint
    mag = u & T(~fmt.sign & (2 * fmt.sign - 1))
    neg = (u & T(fmt.sign)) != 0
    nan = mag > T(fmt.inf)
    # The value as the comparison sees it: below the smallest normal DAZ reads a zero.
    small = mag < T(fmt.normal) if fmt.daz else mag == T(0)
    body = np.where(~neg & ~small, u, T(0))                      # maxps(x, 0)
    select = np.where(neg & ~small, T(0), u)                     # x < 0 ? 0 : x
    pair = np.where(neg & ~small, T(0),
                    np.where(small, u & T(fmt.sign), u))         # maxps(0, x), x flushed
    out = np.where(kind == BODY, body, np.where(kind == SELECT, select, pair))
    if relu6:  # (6 < m ? 6 : m) on a non-negative m
        out = np.where(((out & T(fmt.sign)) == 0) & (out > T(fmt.six)), T(fmt.six), out)
    return np.where(nan, u, out).astype(T)


def _ref_backward(g: np.ndarray, f: np.ndarray, nan_mode: np.ndarray, fmt: Format,
                  relu6: bool) -> np.ndarray:
    T = fmt.uint
    low = T(~fmt.sign & (2 * fmt.sign - 1))
    fmag, gmag = f & low, g & low
    f_pos = ((f & T(fmt.sign)) == 0) & (fmag <= T(fmt.inf))  # (NaN compares false)
    f_pos &= fmag >= T(fmt.normal) if fmt.daz else fmag != T(0)
    if relu6:
        f_pos &= fmag < T(fmt.six)
    g_sign = g & T(fmt.sign)
    canon = T(fmt.inf | fmt.quiet)
    # g * 1: g, flushed (DAZ); g * 0: a zero of g's sign, or inf * 0 = the default NaN.
    kept = np.where(gmag < T(fmt.normal), g_sign, g) if fmt.daz else g
    default_nan = np.where(nan_mode == CANONICAL, canon, T(fmt.sign) | canon)
    out = np.where(f_pos, kept, np.where(gmag == T(fmt.inf), default_nan, g_sign))
    nan = np.where(nan_mode == QUIET, g | T(fmt.quiet),
                   np.where(nan_mode == SIGNED, g_sign | canon, canon))
    return np.where(gmag > T(fmt.inf), nan, out).astype(T)


def _positions(n: int, fmt: Format, relu6: bool) -> np.ndarray:
    end, body, first, tail = kinds(n, fmt, relu6)
    kind = np.full(n, tail, np.int8)
    kind[:end] = body
    if end < n:
        kind[end] = first
    return kind


def _nan_modes(n: int, fmt: Format) -> np.ndarray:
    mode = np.full(n, fmt.tail_nan, np.int8)
    mode[:n - n % fmt.packet if fmt.packet else n] = fmt.body_nan
    return mode


def reference_forward(x: np.ndarray, relu6: bool) -> np.ndarray:
    fmt = FORMATS[x.dtype.name]
    u = np.ascontiguousarray(x).reshape(-1).view(fmt.uint)
    out = _ref_forward(u, _positions(u.size, fmt, relu6), fmt, relu6)
    return out.view(x.dtype).reshape(x.shape)


def reference_backward(g: np.ndarray, f: np.ndarray, relu6: bool) -> np.ndarray:
    fmt = FORMATS[f.dtype.name]
    gu = np.ascontiguousarray(g).reshape(-1).view(fmt.uint)
    fu = np.ascontiguousarray(f).reshape(-1).view(fmt.uint)
    out = _ref_backward(gu, fu, _nan_modes(fu.size, fmt), fmt, relu6)
    return out.view(f.dtype).reshape(f.shape)


# --------------------------------------------------------------------------------------
# Checks and the ops
# --------------------------------------------------------------------------------------
def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every check that needs only shapes: the gradients' two inputs must match (TF's
    ``BinaryElementWiseOp``); outputs are shaped like ``features``."""
    f = args["features"]
    if op.endswith("Grad"):
        g = args["gradients"]
        if g.shape != f.shape:
            raise InvalidArgumentError(
                f"Inputs to operation {op} of type {op} must have the same size and shape.  "
                f"Input 0: {shape_str(g.shape)} != input 1: {shape_str(f.shape)}")
    check_alloc(op, "activations" if not op.endswith("Grad") else "backprops", f.shape,
                f.dtype)
    return {}


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    check(op, args)
    relu6 = op.startswith("Relu6")
    if op.endswith("Grad"):
        return lambda a: _backward(a["gradients"], a["features"], relu6)
    return lambda a: _forward(a["features"], relu6)


def _forward(x: np.ndarray, relu6: bool) -> np.ndarray:
    if _config.use_reference():
        return reference_forward(x, relu6)
    return _dispatch().forward(x, relu6)


def _backward(g: np.ndarray, f: np.ndarray, relu6: bool) -> np.ndarray:
    if _config.use_reference():
        return reference_backward(g, f, relu6)
    return _dispatch().backward(g, f, relu6)


def Relu(*, features: np.ndarray) -> np.ndarray:
    args = locals()
    return prepare("Relu", args)(args)


def ReluGrad(*, gradients: np.ndarray, features: np.ndarray) -> np.ndarray:
    args = locals()
    return prepare("ReluGrad", args)(args)


def Relu6(*, features: np.ndarray) -> np.ndarray:
    args = locals()
    return prepare("Relu6", args)(args)


def Relu6Grad(*, gradients: np.ndarray, features: np.ndarray) -> np.ndarray:
    args = locals()
    return prepare("Relu6Grad", args)(args)
