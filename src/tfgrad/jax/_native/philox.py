"""Philox4x32-10 (``tsl::random::PhiloxRandom``) in uint32 jax.numpy arithmetic.

Every operation is on uint32 (wrapping adds and multiplies, shifts, xors), so the generator
runs with ``jax_enable_x64`` off and on every backend, and its key and counter may be traced.
The 32x32 -> 64-bit products Philox needs are built from 16-bit halves.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

_M0 = 0xD2511F53  # PhiloxRandom's kMultiplier0 / kMultiplier1 / kPhiloxW32A / kPhiloxW32B
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85


def _u32(v: int) -> Array:
    return jnp.asarray(v & 0xFFFFFFFF, jnp.uint32)


def mulhilo(a: Array, b: int) -> tuple[Array, Array]:
    """High and low 32 bits of the 64-bit product of uint32 ``a`` and the constant ``b``."""
    a0, a1 = a & _u32(0xFFFF), a >> _u32(16)
    b0, b1 = _u32(b & 0xFFFF), _u32(b >> 16)
    ll, lh, hl, hh = a0 * b0, a0 * b1, a1 * b0, a1 * b1  # each < 2**32: exact in uint32
    mid = (ll >> _u32(16)) + (lh & _u32(0xFFFF)) + (hl & _u32(0xFFFF))  # < 3 * 2**16
    hi = hh + (lh >> _u32(16)) + (hl >> _u32(16)) + (mid >> _u32(16))
    return hi, a * _u32(b)  # the low word is the wrapping uint32 product


def philox4x32_10(counter: tuple[Array, Array, Array, Array],
                  key: tuple[Array, Array]) -> tuple[Array, Array, Array, Array]:
    """The four output lanes of Philox4x32-10 for counter lanes ``counter`` (c0 lowest) and
    ``key`` (k0, k1), all uint32 arrays that broadcast together."""
    c0, c1, c2, c3 = (jnp.asarray(c, jnp.uint32) for c in counter)
    k0, k1 = (jnp.asarray(k, jnp.uint32) for k in key)
    for rnd in range(10):
        hi0, lo0 = mulhilo(c0, _M0)
        hi1, lo1 = mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if rnd < 9:  # the key is bumped between rounds, not after the last one
            k0, k1 = k0 + _u32(_W0), k1 + _u32(_W1)
    return c0, c1, c2, c3
