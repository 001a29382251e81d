"""Eigen's approximate reciprocal square root, as TF's x86 build computes batch
normalization's ``rsqrt(variance + epsilon)``.

Eigen's AVX packet ``prsqrt`` is ``vrsqrtps`` plus one Newton step without FMA; TF's
x86 wheel uses it for the channels in full packets of 8 and the exact ``1 / sqrt`` for
the others. ``rsqrtps`` (SSE, on every x86-64 processor) gives the same per-lane result
as ``vrsqrtps`` on the same processor. It is implementation-defined: Intel's and AMD's
differ, and TF's outputs with them (tests/fixture_store.py). Elsewhere (ARM) TF's Eigen
uses another approximation; there the exact ``1/sqrt`` is used (documented: not
bit-identical to TF on such machines).
"""

from __future__ import annotations

import platform

import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .._compile import jit

_F32 = np.float32

HAVE_HW_RSQRT = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")
"""Whether the processor's approximate reciprocal square root (``rsqrtps``) is used."""

# Eigen evaluates the gradient's ``rsqrt(var + eps)`` lazily inside [R, C] expressions, in
# tiles of at most this many channels (its cost model's block size for each expression;
# measured on TF 2.21, the same for float32, float16 and bfloat16). The packet rule then
# applies per tile: full packets of 8 from the tile's first channel.
GRAD_SCALE_TILE = 10322  # scratch = y_backprop * x_scaled (-> scale_backprop)
GRAD_DX_TILE = 4050  # x_backprop = coef1 * (y_backprop_centered - x_centered * coef2)


if HAVE_HW_RSQRT:

    @intrinsic
    def _rsqrtps(typingctx, x):  # type: ignore[no-untyped-def]
        """The x86 ``rsqrtps`` instruction applied to one float32 (lane 0 of a vector)."""
        if x != types.float32:
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            from llvmlite import ir

            v4 = ir.VectorType(ir.FloatType(), 4)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v4, [v4]), "llvm.x86.sse.rsqrt.ps")
            vec = builder.insert_element(ir.Constant(v4, [1.0] * 4), args[0],
                                         ir.Constant(ir.IntType(32), 0))
            return builder.extract_element(builder.call(fn, [vec]),
                                           ir.Constant(ir.IntType(32), 0))

        return types.float32(types.float32), codegen

else:  # pragma: no cover - non-x86 fallback

    @jit
    def _rsqrtps(x):  # type: ignore[no-redef]
        return _F32(1) / np.sqrt(x)


@jit
def packet_rsqrt(a: np.float32) -> np.float32:
    """Eigen's AVX ``prsqrt``: y0 = vrsqrtps(a), one Newton step without FMA, y0 if NaN."""
    y0 = _rsqrtps(a)
    r = (_F32(-0.5) * y0) * ((a * y0) * y0 - _F32(1)) + y0
    return y0 if np.isnan(r) else r


@jit
def rsqrt_channel(a: np.float32, approx: bool) -> np.float32:
    """One channel's rsqrt: the approximation where ``approx`` (a channel in a full
    packet of 8), else the exact ``1 / sqrt``."""
    if approx and HAVE_HW_RSQRT:
        return packet_rsqrt(a)
    return _F32(1) / np.sqrt(a)


@jit
def _eigen_rsqrt(v: np.ndarray, tile: int) -> np.ndarray:
    n = v.shape[0]
    out = np.empty(n, np.float32)
    for start in range(0, n, tile):
        stop = min(n, start + tile)
        k = start + ((stop - start) // 8) * 8
        for c in range(start, stop):
            a = v[c]
            if c < k and HAVE_HW_RSQRT:
                out[c] = packet_rsqrt(a)
            else:
                out[c] = _F32(1) / np.sqrt(a)
    return out


def eigen_rsqrt(v: np.ndarray, tile: int = 0) -> np.ndarray:
    """``rsqrt`` of a [C] float32 vector as Eigen evaluates it in tiles of ``tile``
    channels: in each tile, full packets of 8 from its first channel use the approximation
    and the tail channels the exact ``1/sqrt``. ``tile=0`` (or ``tile >= C``): the whole
    vector is one tile, the plain channel rule (c < 8*(C//8) approximate)."""
    v = np.ascontiguousarray(v, _F32)
    return _eigen_rsqrt(v, tile or max(v.size, 1))
