"""Numba kernels for SquaredDifference, Rsqrt and RsqrtGrad on float32 / float64 (the
spec: tfgrad.ops.cwise and docs/cwise.md).

Each kernel runs over chunks of ``CHUNK`` values of the flat output with TF's FTZ / DAZ
set on its thread (``ftz_enter`` / ``ftz_exit``); ``end`` is where TF's packet body
stops (``size - size % packet``): values below it take Eigen's packet arithmetic, the
others its scalar code. Every operation is one IEEE operation of the array's type, in
TF's order; nothing is fused (never fastmath).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from .._compile import Twins, inline
from .._tf.mxcsr import ftz_enter, ftz_exit
from .._tf.rsqrt import HAVE_HW_RSQRT, packet_rsqrt

CHUNK = 1 << 14  # values per parallel chunk (a multiple of every packet)
_AVX = HAVE_HW_RSQRT  # (x86-64: TF's wheels need AVX; elsewhere the scalar fallback)
_U = np.uint64  # unsigned indices: no wraparound checks, so LLVM vectorizes


@Twins
def squared_difference(x, y, out):  # pragma: no cover - compiled
    """out = (x - y) * (x - y) on equal-sized flat arrays."""
    n = out.size
    for c in prange((n + CHUNK - 1) // CHUNK):
        fz = ftz_enter()
        a = c * CHUNK
        for j in range(min(n, a + CHUNK) - a):
            i = _U(a + j)
            d = x[i] - y[i]
            out[i] = d * d
        ftz_exit(fz)


@Twins
def squared_difference_scalar(x, y, out):  # pragma: no cover - compiled
    """out = (x - y) * (x - y) with y one value (TF's bound scalar functor)."""
    n = out.size
    b = y[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        fz = ftz_enter()
        a = c * CHUNK
        for j in range(min(n, a + CHUNK) - a):
            i = _U(a + j)
            d = x[i] - b
            out[i] = d * d
        ftz_exit(fz)


@Twins
def squared_difference_scalar_x(x, y, out):  # pragma: no cover - compiled
    """out = (x - y) * (x - y) with x one value."""
    n = out.size
    b = x[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        fz = ftz_enter()
        a = c * CHUNK
        for j in range(min(n, a + CHUNK) - a):
            i = _U(a + j)
            d = b - y[i]
            out[i] = d * d
        ftz_exit(fz)


@Twins
def squared_difference_rows(x, y, out, cols):  # pragma: no cover - compiled
    """out[r, c] = (x[r, c] - y[c])^2 on flat [rows, cols] x: tf.nn.moments' x against
    its [1, C] mean (the subtraction's order kept: squared_difference_rows_x for the
    other side)."""
    rows = out.size // cols
    for r in prange(rows):
        fz = ftz_enter()
        base = r * cols
        for j in range(cols):
            i = _U(base + j)
            d = x[i] - y[_U(j)]
            out[i] = d * d
        ftz_exit(fz)


@Twins
def squared_difference_rows_x(x, y, out, cols):  # pragma: no cover - compiled
    """out[r, c] = (x[c] - y[r, c])^2 on flat [rows, cols] y."""
    rows = out.size // cols
    for r in prange(rows):
        fz = ftz_enter()
        base = r * cols
        for j in range(cols):
            i = _U(base + j)
            d = x[_U(j)] - y[i]
            out[i] = d * d
        ftz_exit(fz)


@intrinsic
def _prsqrt8(typingctx, x, out, i):  # type: ignore[no-untyped-def]
    """out[i:i + 8] = Eigen's AVX prsqrt of x[i:i + 8]: ``vrsqrtps``, then one Newton step
    without FMA, ``(-0.5 * y0) * ((a * y0) * y0 - 1) + y0``, y0 where that is NaN
    (tfgrad._tf.rsqrt.packet_rsqrt on a whole packet; plain IR instructions, no fast-math
    flags: LLVM neither fuses nor reorders them)."""
    if not (isinstance(x, types.Array) and x.dtype == types.float32):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v8 = ir.VectorType(ir.FloatType(), 8)

        def ptr(aty, arr):  # type: ignore[no-untyped-def]
            data = context.make_array(aty)(context, builder, arr).data
            return builder.bitcast(builder.gep(data, [args[2]]), v8.as_pointer())

        a = builder.load(ptr(sig.args[0], args[0]), align=4)
        fn = builder.module.declare_intrinsic("llvm.x86.avx.rsqrt.ps.256",
                                              fnty=ir.FunctionType(v8, [v8]))
        y0 = builder.call(fn, [a])
        one = ir.Constant(v8, [1.0] * 8)
        mhalf = ir.Constant(v8, [-0.5] * 8)
        e = builder.fsub(builder.fmul(builder.fmul(a, y0), y0), one)
        r = builder.fadd(builder.fmul(builder.fmul(mhalf, y0), e), y0)
        nan = builder.fcmp_unordered("uno", r, r)
        builder.store(builder.select(nan, y0, r), ptr(sig.args[1], args[1]), align=4)
        return context.get_dummy_value()

    return types.none(x, out, i), codegen


@Twins
def rsqrt_f32(x, out, end):  # pragma: no cover - compiled
    """Eigen's prsqrt below ``end`` (a multiple of 8), the exact 1 / sqrt after it."""
    n = out.size
    one = np.float32(1)
    for c in prange((n + CHUNK - 1) // CHUNK):
        fz = ftz_enter()
        a = c * CHUNK
        b = min(n, a + CHUNK)
        p = min(b, max(a, end))  # chunks start on packets: [a, p) is whole packets
        if _AVX:
            for k in range((p - a) // 8):
                _prsqrt8(x, out, _U(a + 8 * k))
        else:
            for j in range(p - a):
                out[_U(a + j)] = packet_rsqrt(x[_U(a + j)])
        for j in range(b - p):
            i = _U(p + j)
            out[i] = one / np.sqrt(x[i])
        ftz_exit(fz)


@Twins
def rsqrt_f64(x, out):  # pragma: no cover - compiled
    """The exact 1 / sqrt (float64: packets and scalars alike)."""
    n = out.size
    for c in prange((n + CHUNK - 1) // CHUNK):
        fz = ftz_enter()
        a = c * CHUNK
        for j in range(min(n, a + CHUNK) - a):
            i = _U(a + j)
            out[i] = 1.0 / np.sqrt(x[i])
        ftz_exit(fz)


@inline
def _grad_packet(y, dy, zero, half):
    # mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy)): b == 0 ? +0 : a * b
    t = zero if dy == zero else y * dy
    return zero if t == zero else (half * (y * y)) * t


@inline
def _grad_scalar(y, dy, zero, half):
    # dy == 0 ? 0 : (-0.5 * (dy * y)) * (y * y)
    return zero if dy == zero else (half * (dy * y)) * (y * y)


@Twins
def rsqrt_grad(y, dy, out, end, zero, half):  # pragma: no cover - compiled
    """Eigen's scalar_rsqrt_gradient_op: its packet form below ``end``, its scalar form
    after (``zero`` and ``half`` = -0.5 of the array's type)."""
    n = out.size
    for c in prange((n + CHUNK - 1) // CHUNK):
        fz = ftz_enter()
        a = c * CHUNK
        b = min(n, a + CHUNK)
        p = min(b, max(a, end))  # [a, p): packets, [p, b): the scalar tail
        for j in range(p - a):  # (two loops, no per-value branch: LLVM vectorizes)
            i = _U(a + j)
            out[i] = _grad_packet(y[i], dy[i], zero, half)
        for j in range(b - p):
            i = _U(p + j)
            out[i] = _grad_scalar(y[i], dy[i], zero, half)
        ftz_exit(fz)
