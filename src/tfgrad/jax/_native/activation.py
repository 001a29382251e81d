"""Relu, Relu6 and their gradients in jax.numpy, for any XLA backend.

The rules of :mod:`tfgrad.ops.activation`'s NumPy reference (the spec; docs/activation.md)
on the values' bit patterns (``lax.bitcast_convert_type`` to unsigned integers): TF's
outputs are always an input's bits, a zero, six or a NaN, chosen by comparisons that read
denormals as zeros (DAZ) and differ between Eigen's packet body and its scalar tail, so
integer selects reproduce them exactly, whatever the backend does with denormals and NaN
payloads in float arithmetic. Bit-identical to the exact kernels (BOUNDS: 0).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

from ..._tf.relu import CANONICAL, FORMATS, QUIET, SELECT, SIGNED, kinds

Array = Any

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    op: {out: {dt: 0 for dt in ("float32", "float64", "bfloat16", "float16")}}
    for op, out in (("Relu", "activations"), ("Relu6", "activations"),
                    ("ReluGrad", "backprops"), ("Relu6Grad", "backprops"))
}
NOTES: dict[str, str] = {}


def _bits(x: Array) -> tuple[Array, Any]:
    fmt = FORMATS[jnp.dtype(x.dtype).name]
    return lax.bitcast_convert_type(x.reshape(-1), jnp.dtype(fmt.uint)), fmt


def _forward(x: Array, relu6: bool) -> Array:
    u, fmt = _bits(x)
    T = u.dtype.type
    low = T(~fmt.sign & (2 * fmt.sign - 1))
    zero = T(0)
    mag = u & low
    neg = (u & T(fmt.sign)) != 0
    small = mag < T(fmt.normal) if fmt.daz else mag == zero
    body = jnp.where(~neg & ~small, u, zero)                        # maxps(x, 0)
    select = jnp.where(neg & ~small, zero, u)                       # x < 0 ? 0 : x
    pair = jnp.where(neg & ~small, zero, jnp.where(small, u & T(fmt.sign), u))
    end, kb, kf, kt = kinds(u.size, fmt, relu6)
    by_kind = {0: body, SELECT: select, 2: pair}
    i = jnp.arange(u.size)
    out = jnp.where(i < end, by_kind[kb], jnp.where(i == end, by_kind[kf], by_kind[kt]))
    if relu6:
        out = jnp.where(((out & T(fmt.sign)) == zero) & (out > T(fmt.six)), T(fmt.six), out)
    out = jnp.where(mag > T(fmt.inf), u, out)
    return lax.bitcast_convert_type(out, x.dtype).reshape(x.shape)


def _backward(g: Array, f: Array, relu6: bool) -> Array:
    fu, fmt = _bits(f)
    gu, _ = _bits(g)
    T = fu.dtype.type
    low = T(~fmt.sign & (2 * fmt.sign - 1))
    fmag, gmag = fu & low, gu & low
    pos = ((fu & T(fmt.sign)) == T(0)) & (fmag <= T(fmt.inf))
    pos = pos & (fmag >= T(fmt.normal) if fmt.daz else fmag != T(0))
    if relu6:
        pos = pos & (fmag < T(fmt.six))
    gs = gu & T(fmt.sign)
    canon = T(fmt.inf | fmt.quiet)
    n = fu.size
    end = n - n % fmt.packet if fmt.packet else n
    mode = jnp.where(jnp.arange(n) < end, fmt.body_nan, fmt.tail_nan)
    kept = jnp.where(gmag < T(fmt.normal), gs, gu) if fmt.daz else gu
    default_nan = jnp.where(mode == CANONICAL, canon, T(fmt.sign) | canon)
    out = jnp.where(pos, kept, jnp.where(gmag == T(fmt.inf), default_nan, gs))
    nan = jnp.where(mode == QUIET, gu | T(fmt.quiet),
                    jnp.where(mode == SIGNED, gs | canon, canon))
    out = jnp.where(gmag > T(fmt.inf), nan, out)
    return lax.bitcast_convert_type(out, f.dtype).reshape(f.shape)


def Relu(*, features: Array) -> Array:
    return _forward(features, False)


def Relu6(*, features: Array) -> Array:
    return _forward(features, True)


def ReluGrad(*, gradients: Array, features: Array) -> Array:
    return _backward(gradients, features, False)


def Relu6Grad(*, gradients: Array, features: Array) -> Array:
    return _backward(gradients, features, True)
