"""SquaredDifference, Rsqrt and RsqrtGrad in jax.numpy, jittable on any backend.

TF's arithmetic (tfgrad.ops.cwise, the spec; docs/cwise.md) with its FTZ / DAZ written out,
each operation one IEEE operation of T (the half types computed in float32 and rounded
after each; bfloat16 NaN results as Eigen's conversions give them). Rsqrt's packet body is
Eigen's approximate prsqrt (the processor's rsqrtps) in TF: here the exact ``1 / sqrt``
(an optimization barrier keeps XLA from turning it into its own approximate rsqrt), an
ulp or two away (BOUNDS). SquaredDifference is differentiated by JAX
(``(2 * g) * (x - y)`` up to the order of its broadcast sums).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from ._ieee import div_rn

Array = Any
_FLOATS = ("float32", "float64", "float16", "bfloat16")
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "SquaredDifference": {"z": {dt: 0 for dt in _FLOATS}},
    "RsqrtGrad": {"z": {dt: 0 for dt in _FLOATS}},
    "Rsqrt": {"y": {"float32": 4, "float64": 0, "float16": 1, "bfloat16": 1}},
}
NOTES: dict[str, str] = {
    "Rsqrt": "the exact 1 / sqrt where TF's packets take the processor's rsqrtps and a "
    "Newton step: up to 4 ulps in float32 (2 on an AMD EPYC, 4 on an Intel Xeon with "
    "AVX-512: the processors' approximations differ), 1 in the half types (after rounding).",
}
_PACKET = {"float32": 8, "float64": 4, "float16": 8, "bfloat16": 8}


def _ftz(v: Array) -> Array:
    tiny = np.finfo(v.dtype).tiny
    return jnp.where(jnp.abs(v) < tiny, v * 0, v)


class _T:
    def __init__(self, dtype: Any, n: int) -> None:
        self.dtype = jnp.dtype(dtype)
        self.half = self.dtype.itemsize == 2
        self.ct = jnp.float32 if self.half else self.dtype
        self.body = jnp.arange(n) < n - n % _PACKET[self.dtype.name]

    def read(self, a: Array) -> Array:
        v = a.astype(self.ct)
        return v if self.dtype == jnp.float16 else _ftz(v)

    def round(self, v: Array) -> Array:
        v = lax.optimization_barrier(_ftz(v))
        return v.astype(self.dtype).astype(self.ct) if self.half else v

    def out(self, v: Array) -> Array:
        r = v.astype(self.dtype)
        if self.dtype == jnp.bfloat16:  # 0x7fc0 in packets, sign | 0x7fc0 in scalars
            sign = jnp.signbit(v) & ~self.body.reshape(v.shape)
            bits = jnp.where(sign, jnp.uint16(0xFFC0), jnp.uint16(0x7FC0))
            r = jnp.where(jnp.isnan(v), lax.bitcast_convert_type(bits, jnp.bfloat16), r)
        return r


def SquaredDifference(*, x: Array, y: Array) -> Array:
    shape = jnp.broadcast_shapes(x.shape, y.shape)
    ar = _T(x.dtype, int(np.prod(shape)))
    ar.body = ar.body.reshape(shape)
    d = ar.round(ar.read(x) - ar.read(y))
    return ar.out(_ftz(d * d))


def Rsqrt(*, x: Array) -> Array:
    ar = _T(x.dtype, x.size)
    v = ar.read(x.reshape(-1))
    s = lax.optimization_barrier(jnp.sqrt(v))
    if not ar.half:
        return _ftz(div_rn(1, s)).astype(x.dtype).reshape(x.shape)
    tail = div_rn(1, ar.round(s))  # the scalar tail rounds sqrt to T first
    return ar.out(jnp.where(ar.body, div_rn(1, s), tail)).reshape(x.shape)


def RsqrtGrad(*, y: Array, dy: Array) -> Array:
    ar = _T(y.dtype, y.size)
    a, g = ar.read(y.reshape(-1)), ar.read(dy.reshape(-1))
    zero = jnp.zeros((), ar.ct)
    half = jnp.asarray(-0.5, ar.ct)
    yy = ar.round(a * a)
    t = jnp.where(g == 0, zero, ar.round(a * g))
    packet = jnp.where(t == 0, zero, ar.round(ar.round(half * yy) * t))
    scalar = jnp.where(g == 0, zero, ar.round(ar.round(half * ar.round(g * a)) * yy))
    return ar.out(jnp.where(ar.body, packet, scalar)).reshape(y.shape)
