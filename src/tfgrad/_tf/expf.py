"""TF's float32 exponential and logarithm on the CPU (Eigen, AVX build of TF 2.21).

Eigen evaluates ``exp`` in packets of 8 floats with its generic ``pexp_float`` (Cephes'
range reduction and degree-6 polynomial); TF's x86 wheels are built with AVX but without
FMA, so every ``pmadd`` is a multiply and an add, each rounded. Values Eigen evaluates one
at a time (the tail of a packet loop) go through ``std::exp``, i.e. the C library's
``expf``; ``std::log`` (``logf``) likewise. Measured against TF 2.21: ``pexp`` below matches
``tf.raw_ops.Exp`` on 100,000 packet-path values and the C library's ``expf`` every
scalar-path one; with FMA contraction 1.1 % of the values differ.

Everything here runs with TF's FTZ / DAZ (denormal operands and results are zeros).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

import numpy as np

from .fpenv import flushed

SOFTMAX_BLOCK = 6956
"""TF's block size (coefficients) for Softmax's exp assignment: Eigen's TensorBlockMapper
evaluates it block by block, and each block's last ``len % 8`` values go through expf
(probed: docs/softmax.md)."""

F32 = np.float32

# Eigen's pexp_float constants
EXP_HI = F32(88.723)
EXP_LO = F32(-104.0)
LOG2EF = F32(1.44269504088896341)
HALF = F32(0.5)
ONE = F32(1.0)
C1 = F32(-0.693359375)
C2 = F32(2.12194440e-4)
P2 = F32(0.49999988079071044921875)
P3 = F32(0.16666518151760101318359375)
P4 = F32(4.166965186595916748046875e-2)
P5 = F32(8.36894474923610687255859375e-3)
P6 = F32(1.37449637986719608306884765625e-3)
FLT_MIN64 = 2.0**-126


def _f(a: np.ndarray) -> np.ndarray:
    return flushed(np.asarray(a, F32))


def _madd(a: np.ndarray, b: np.ndarray | F32, c: np.ndarray | F32) -> np.ndarray:
    """Eigen's pmadd without FMA: round(round(a * b) + c)."""
    return _f(_f(a * b) + c)


def pexp(x: np.ndarray) -> np.ndarray:
    """Eigen's ``pexp_float`` on float32 values, elementwise (each lane of a packet is
    independent), under FTZ / DAZ."""
    x0 = _f(x)
    with np.errstate(all="ignore"):
        zero = x0 < EXP_LO
        x1 = np.where(x0 > EXP_HI, EXP_HI, x0).astype(F32)  # pmin(x, hi) keeps NaN
        m = np.floor(_madd(x1, LOG2EF, HALF))
        r = _madd(m, C1, x1)  # m * ln 2 taken off in two parts (Cody-Waite)
        r = _madd(m, C2, r)
        r2 = _f(r * r)
        p_even = _madd(r2, P6, P4)
        p_odd = _madd(r2, P5, P3)
        p_even = _madd(r2, p_even, P2)
        p_low = _f(r + ONE)
        y = _madd(r, p_odd, p_even)
        y = _madd(r2, y, p_low)
        # y * 2**m is exact unless it leaves the normal range: below it FTZ gives 0
        # (tininess after rounding, and y * 2**m has 24 bits), above it inf.
        s = y.astype(np.float64) * np.exp2(m.astype(np.float64))
        out = np.where(np.abs(s) < FLT_MIN64, 0.0, s).astype(F32)
        out = np.where(np.isnan(x0), x0, np.maximum(out, x0)).astype(F32)  # pmax(., x)
        return np.where(zero, F32(0.0), out).astype(F32)


@cache
def _libm() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    for name in ("expf", "logf"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_float
        fn.argtypes = [ctypes.c_float]
    return lib


def expf(x: np.ndarray) -> np.ndarray:
    """The C library's ``expf`` (``std::exp``), elementwise, under FTZ / DAZ."""
    lib = _libm()
    v = _f(x).reshape(-1)
    return _f(np.array([lib.expf(float(a)) for a in v], F32).reshape(np.shape(x)))


def logf(x: np.ndarray) -> np.ndarray:
    """The C library's ``logf`` (``std::log``), elementwise, under FTZ / DAZ."""
    lib = _libm()
    v = _f(x).reshape(-1)
    return _f(np.array([lib.logf(float(a)) for a in v], F32).reshape(np.shape(x)))


# --------------------------------------------------------------------------------------
# The C library's expf (glibc 2.28+, ARM's optimized-routines algorithm), for the portable
# implementations, which have no expf of their own: exp(x) = 2^(k/32) * 2^(r/32), k an
# integer, in float64, rounded once to float32. Matches glibc's expf bit for bit on every
# value tested (450,000 values x <= 0; tests/test_softmax_xent.py).
# --------------------------------------------------------------------------------------
def _exp2_table() -> np.ndarray:
    import decimal

    ctx = decimal.Context(prec=60)
    t = []
    for i in range(EXPF_N):
        v = float(ctx.power(decimal.Decimal(2), decimal.Decimal(i) / EXPF_N))
        t.append(int(np.float64(v).view(np.uint64)) - (i << 47))
    return np.array(t, np.uint64)


EXPF_N = 32
EXPF_INV_LN2_N = float.fromhex("0x1.71547652b82fep+0") * EXPF_N
EXPF_SHIFT = float.fromhex("0x1.8p+52")  # adding it rounds to an integer (ties to even)
EXPF_C = (float.fromhex("0x1.c6af84b912394p-5") / EXPF_N**3,
          float.fromhex("0x1.ebfce50fac4f3p-3") / EXPF_N**2,
          float.fromhex("0x1.62e42ff0c52d6p-1") / EXPF_N)
EXPF_UNDERFLOW = F32(float.fromhex("-0x1.9fe368p6"))  # below: +0
EXPF_TABLE = _exp2_table()
"""2^(i/32) as float64 bits, less i << 47 (the exponent of 2^(k/32) is added back)."""
EXPF_SCALE = np.array([np.float64(2.0 ** (i / EXPF_N)) for i in range(EXPF_N)])


def glibc_expf(x: np.ndarray) -> np.ndarray:
    """The C library's expf in float64 NumPy (no FTZ); the portable implementations
    transcribe it."""
    xd = np.asarray(x, F32).astype(np.float64)
    with np.errstate(all="ignore"):
        z = EXPF_INV_LN2_N * xd
        kd = z + EXPF_SHIFT
        ki = kd.view(np.uint64)
        kd = kd - EXPF_SHIFT
        r = z - kd
        t = EXPF_TABLE[(ki % np.uint64(EXPF_N)).astype(np.int64)] + (ki << np.uint64(47))
        s = t.view(np.float64)
        y = (EXPF_C[0] * r + EXPF_C[1]) * (r * r) + (EXPF_C[2] * r + 1.0)
        out = (y * s).astype(F32)
    out = np.where(np.isnan(xd), np.asarray(x, F32), out)
    return np.where((xd < EXPF_UNDERFLOW) | np.isneginf(xd), F32(0), out).astype(F32)
