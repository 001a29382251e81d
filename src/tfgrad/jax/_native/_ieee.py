"""IEEE arithmetic XLA does not promise on every backend.

:func:`div_rn`: float division rounded once to nearest even. XLA:CPU's division is IEEE; XLA:GPU
lowers a float32 division to PTX's ``div.full.f32`` (``-nvptx-prec-divf32=1``: up to 2 ulps
off), which moves a quantization step or an average by an ulp (measured on an H200 with
tools/gpu_check.py). Off the CPU the quotient is computed from the operands' bits with
32-bit integer division, which every backend does exactly. Its cost is compile time: ~50
operations per division, and a QAT MobileNetV2's jitted gradient divides in ~860 places
(every quantizer's range, forward and gradient; batch norm): compiled with it (forced on
the CPU) 76 s, against 23 s with XLA's division. ``XLA_FLAGS=--xla_backend_extra_options=
-nvptx-prec-divf32=2`` makes XLA:GPU's own division IEEE's (measured on an H200).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

Array = Any

_U32 = jnp.uint32
_I32 = jnp.int32
# Tests set this to run the integer division on the CPU too (read while tracing).
FORCE_INTEGER_DIVISION = False


def _integer_div(a: Array, b: Array) -> Array:
    """float32 ``a / b`` rounded to nearest even where the quotient is normal, from the
    operands' bits: 24-bit significands divided to 26 fraction bits and a sticky bit.
    Elsewhere (zero, inf or NaN operands, denormal operands or quotients) the backend's
    own quotient; an overflow rounds to inf as IEEE's does."""
    q = a / b
    ua, ub = lax.bitcast_convert_type(a, _U32), lax.bitcast_convert_type(b, _U32)
    ea = ((ua >> 23) & 0xFF).astype(_I32)
    eb = ((ub >> 23) & 0xFF).astype(_I32)
    ma = (ua & 0x7FFFFF) | 0x800000
    mb = (ub & 0x7FFFFF) | 0x800000
    # quot = floor(ma * 2**26 / mb), in (2**25, 2**27), by integer division in four
    # steps of at most 8 bits: every dividend (a remainder < mb < 2**24, shifted) fits in
    # 32 bits. (A bit at a time took ~190 operations a division: 5x the compile time of a
    # QAT MobileNetV2 step.)
    d = ma << 8
    quot, rem = lax.div(d, mb), lax.rem(d, mb)
    for shift in (8, 8, 2):
        d = rem << shift
        quot, rem = (quot << shift) | lax.div(d, mb), lax.rem(d, mb)
    big = quot >= (1 << 26)  # ma >= mb: the quotient of the significands is in [1, 2)
    quot = jnp.where(big, quot, quot << 1)  # 27 bits: 24 kept, a guard bit, 2 more
    sig = quot >> 3
    sticky = ((quot & 3) | rem) != 0
    sig = sig + ((quot >> 2) & (sticky | sig).astype(_U32) & 1)  # to nearest even
    e = ea - eb + 126 + big.astype(_I32)  # the biased exponent before rounding
    # (a significand rounded up to 2**24 carries into the exponent: to inf past 254)
    bits = ((ua ^ ub) & _U32(0x80000000)) | ((e.astype(_U32) << 23) + sig - 0x800000)
    usable = ((ea - 1).astype(_U32) < 254) & ((eb - 1).astype(_U32) < 254) & (
        e.astype(_U32) < 255) & ((bits & 0x7F800000) != 0)
    return jnp.where(usable, lax.bitcast_convert_type(bits, jnp.float32), q)


def _div_rn(a: Array, b: Array) -> Array:
    a, b = jnp.asarray(a), jnp.asarray(b)
    dt = jnp.result_type(a, b)
    if not jnp.issubdtype(dt, jnp.floating):
        return a / b
    # XLA turns a division by a constant into a multiplication by its reciprocal (two
    # roundings); a divisor that depends on a (replaced where a is NaN, which changes
    # nothing) is never constant
    b = jnp.where(jnp.isnan(a), a, b)
    if dt == jnp.float64:
        return a / b  # float64 division is IEEE on every backend XLA has
    a32, b32 = jnp.broadcast_arrays(a.astype(jnp.float32), b.astype(jnp.float32))
    if FORCE_INTEGER_DIVISION:
        q = _integer_div(a32, b32)
    else:
        q = lax.platform_dependent(a32, b32, cpu=lambda x, y: x / y, default=_integer_div)
    # float16 / bfloat16: the float32 quotient rounded again is the correctly rounded one
    # (24 >= 2 * 11 + 2 bits)
    return q.astype(dt)


@jax.custom_jvp
def div_rn(a: Array, b: Array) -> Array:
    """``a / b`` rounded once (IEEE, to nearest even) on every backend, also by a constant
    (never XLA's reciprocal rewrite); differentiates as ``a / b``."""
    return _div_rn(a, b)


def _div_rn_jvp(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    # jax.lax's rules for div (d/da = 1 / b, d/db = -a / b**2), skipping zero tangents (a
    # constant divisor gives t / b, no 0 * inf)
    a, b = primals
    ta, tb = tangents
    out = div_rn(a, b)
    t = None
    if not isinstance(ta, SymbolicZero):
        t = ta / jnp.where(jnp.isnan(a), a, b)  # (never a constant: see _div_rn)
    if not isinstance(tb, SymbolicZero):
        tb_part = (-tb * a) * lax.integer_pow(b, -2)
        t = tb_part if t is None else t + tb_part
    if t is None:
        t = jnp.zeros_like(out)
    return out, jnp.broadcast_to(t, out.shape).astype(out.dtype)


div_rn.defjvp(_div_rn_jvp, symbolic_zeros=True)
