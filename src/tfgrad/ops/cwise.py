"""Elementwise ops of Keras' unfused batch normalization: SquaredDifference, Rsqrt,
RsqrtGrad, bit for bit with TensorFlow 2.21's Eigen CPU kernels (``cwise_op_*.cc``).

TF evaluates each as an Eigen expression over the flat output: AVX packets of
``PACKET[dtype]`` values (8; float64 4) from the start, every parallelFor block a whole
number of packets, so only the last ``size % packet`` values run Eigen's scalar code
(measured on TF 2.21, docs/cwise.md). All under TF's FTZ / DAZ. Per op:

- ``SquaredDifference`` (``scalar_squared_difference_op``): ``d = x - y; d * d``, two
  roundings, the same in packets and scalars. x and y broadcast by TF's BCast (numpy's
  rules, TF's error words). Half types compute each operation in float32 and round it to
  the type (float16 without DAZ: its denormals are float32 normals).
- ``Rsqrt`` (``scalar_rsqrt_op``): the packet body is Eigen's AVX ``prsqrt``: the
  processor's ``rsqrtps`` and one Newton step without FMA (``tfgrad._tf.rsqrt``; Intel's
  and AMD's differ, so these bits are processor-dependent, as batch norm's); the scalar
  tail is the exact ``1 / sqrt(x)``. float64 is exact everywhere. Half types: the body is
  float32's prsqrt rounded once; the tail rounds ``sqrt`` to the type, then ``1 / s``.
- ``RsqrtGrad`` (``scalar_rsqrt_gradient_op``, cwise_ops_gradients.h): the packet body is
  ``mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy))`` (``mul_no_nan(a, b) = b == 0 ? +0 :
  a * b``), the scalar tail ``dy == 0 ? +0 : (-0.5 * (dy * y)) * (y * y)``; they differ
  where a product underflows (FTZ: a flushed ``y * dy`` gives +0 in the body, a signed
  zero in the tail) and for NaN / inf operands. Every product rounded to T.
- bfloat16 NaN results: Eigen's packet conversion from float32 gives the canonical 0x7fc0,
  its scalar conversion ``sign | 0x7fc0`` (as Relu's, tfgrad._tf.relu).

This module holds the checks and the NumPy reference (the spec); the float32 / float64
kernels are ``tfgrad.kernels.cwise``, run by ``tfgrad.dispatch.cwise``. The half types
run the reference (they are computed in float32 here as in TF).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf.cwise import PACKET, broadcast_shape
from .._tf.fpenv import flush_denormals
from .._validate import check_alloc, shape_str

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)


@cache
def _dispatch() -> Any:
    from ..dispatch import cwise

    return cwise


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------
def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shape checks in TF's words: BinaryOp's BCast for SquaredDifference, SimpleBinaryOp's
    element count for RsqrtGrad (whose output is shaped like y)."""
    if op == "SquaredDifference":
        x, y = args["x"], args["y"]
        shape = broadcast_shape(x.shape, y.shape)
        if shape is None:
            raise InvalidArgumentError(
                f"Incompatible shapes: {shape_str(x.shape)} vs. {shape_str(y.shape)}")
        check_alloc(op, "z", shape, x.dtype)
        return {"z": shape}
    if op == "RsqrtGrad":
        y, dy = args["y"], args["dy"]
        if y.size != dy.size:
            raise InvalidArgumentError(
                "The two arguments to a cwise op must have same number of elements, got "
                f"{y.size} and {dy.size}")
        check_alloc(op, "z", y.shape, y.dtype)
        return {}
    check_alloc(op, "y", args["x"].shape, args["x"].dtype)
    return {}


# --------------------------------------------------------------------------------------
# The NumPy reference
# --------------------------------------------------------------------------------------
def body_mask(n: int, dtype: np.dtype) -> np.ndarray:
    """Which of a flat output's n values TF computes in packets (the rest: scalar code)."""
    m = np.zeros(n, bool)
    m[: n - n % PACKET[dtype.name]] = True
    return m


def _to(v: np.ndarray, dtype: np.dtype, body: np.ndarray) -> np.ndarray:
    """float32 values rounded to a half type as Eigen converts them (to nearest even;
    bfloat16 NaN: canonical in packets, signed in scalar code)."""
    out = v.astype(dtype)
    if dtype == BF16:
        sign = ((v.view(np.uint32) >> 16) & 0x8000).astype(np.uint16)
        nan = np.where(body, np.uint16(0x7FC0), sign | np.uint16(0x7FC0))
        out = np.where(np.isnan(v), nan, out.view(np.uint16)).astype(np.uint16).view(dtype)
    return out


def _half(dtype: np.dtype) -> bool:
    return dtype.itemsize == 2


def reference_squared_difference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    shape = broadcast_shape(x.shape, y.shape)
    assert shape is not None
    dt = x.dtype
    a = np.broadcast_to(x, shape).reshape(-1)
    b = np.broadcast_to(y, shape).reshape(-1)
    with flush_denormals(), np.errstate(all="ignore"):
        if not _half(dt):
            d = a - b
            return (d * d).reshape(shape)
        body = body_mask(a.size, dt)
        d = _to(a.astype(F32) - b.astype(F32), dt, body).astype(F32)
        return _to(d * d, dt, body).reshape(shape)


def reference_rsqrt(x: np.ndarray) -> np.ndarray:
    dt = x.dtype
    v = np.ascontiguousarray(x).reshape(-1)
    n = v.size
    end = n - n % PACKET[dt.name]
    with flush_denormals(), np.errstate(all="ignore"):
        if dt == np.float64:
            return (1.0 / np.sqrt(v)).reshape(x.shape)
        f = v.astype(F32)
        out = np.empty(n, F32)
        if end:
            out[:end] = _packet_rsqrt(f[:end])
        tail = f[end:]
        if _half(dt):
            body = body_mask(n, dt)
            s = _to(np.sqrt(tail), dt, body[end:]).astype(F32)
            res = np.concatenate([_to(out[:end], dt, body[:end]),
                                  _to(F32(1) / s, dt, body[end:])])
            return res.reshape(x.shape)
        out[end:] = F32(1) / np.sqrt(tail)
        return out.reshape(x.shape)


def _packet_rsqrt(f: np.ndarray) -> np.ndarray:
    """Eigen's prsqrt on float32 values (all in full packets)."""
    from .._tf.rsqrt import eigen_rsqrt  # (compiled: imported on first use)

    return eigen_rsqrt(f)


def reference_rsqrt_grad(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    dt = y.dtype
    a = np.ascontiguousarray(y).reshape(-1)
    g = np.ascontiguousarray(dy).reshape(-1)
    body = body_mask(a.size, dt)
    half = _half(dt)
    ct = F32 if half else dt.type
    zero, m_half = ct(0), ct(-0.5)

    def r(v: np.ndarray) -> np.ndarray:  # one rounding to T
        return _to(v, dt, body).astype(F32) if half else v

    with flush_denormals(), np.errstate(all="ignore"):
        a, g = a.astype(ct), g.astype(ct)
        yy = r(a * a)
        # packet body: mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy))
        t = np.where(g == zero, zero, r(a * g))
        packet = np.where(t == zero, zero, r(r(m_half * yy) * t))
        # scalar tail: dy == 0 ? 0 : (-0.5 * (dy * y)) * (y * y)
        scalar = np.where(g == zero, zero, r(r(m_half * r(g * a)) * yy))
        out = np.where(body, packet, scalar).astype(ct)
    return (_to(out, dt, body) if half else out).reshape(y.shape)


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------
def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    check(op, args)
    if op == "SquaredDifference":
        return lambda a: _run(op, a["x"], a["y"])
    if op == "Rsqrt":
        return lambda a: _run(op, a["x"])
    return lambda a: _run(op, a["y"], a["dy"])


_REFERENCE: dict[str, Callable[..., np.ndarray]] = {
    "SquaredDifference": reference_squared_difference,
    "Rsqrt": reference_rsqrt,
    "RsqrtGrad": reference_rsqrt_grad,
}


def _run(op: str, *arrays: np.ndarray) -> np.ndarray:
    if _config.use_reference() or _half(arrays[0].dtype):
        return _REFERENCE[op](*arrays)
    return getattr(_dispatch(), op)(*arrays)


def SquaredDifference(*, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    args = locals()
    return prepare("SquaredDifference", args)(args)


def Rsqrt(*, x: np.ndarray) -> np.ndarray:
    args = locals()
    return prepare("Rsqrt", args)(args)


def RsqrtGrad(*, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    args = locals()
    return prepare("RsqrtGrad", args)(args)
