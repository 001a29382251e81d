"""The contraction kernel: per output, FMA chains from +0 over k-ranges, added in order
(``tfgrad._tf.contraction``), as oneDNN's AVX-512 sgemm runs each of Eigen's blocks.

Register-blocked: a tile of 4 rows x 32 columns keeps 8 FMA accumulators and 8 running
sums in vector registers over all of its k-ranges; every FMA is ``llvm.fma`` (one
rounding, as ``vfmadd231ps``), every sum one float32 add. The rows' values are broadcast,
B's rows loaded as vectors. A is read in place (a transposed view too); callers pad B
to a multiple of 16 columns and give C a multiple of 4 rows (the extra outputs are
dropped).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._compile import Twins, jit
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._simd import _VEC, Vec, _llvm_type, _pointer, _splat, vload, vstore, vzeros

_V = _VEC[types.float32]


_V8 = Vec(types.float32, 8)  # half a register: oneDNN's gemv_t keeps 8 lanes


@intrinsic
def vfma(typingctx, s, v, acc):  # type: ignore[no-untyped-def]
    """fma(s, v, acc) with one rounding per lane (``llvm.fma.v16f32`` / ``v8f32``); ``s``
    a float32 (broadcast) or a vector of acc's type."""
    vt = acc
    if not (vt in (_V, _V8) and v == vt and (s == types.float32 or s == vt)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ty = _llvm_type(vt)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3),
                                            f"llvm.fma.v{vt.lanes}f32")
        a = args[0] if s == vt else _splat(builder, vt, args[0])
        return builder.call(fn, [a, args[1], args[2]])

    return vt(s, v, acc), codegen


@intrinsic
def vload8(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + 8] of a float32 array (C-contiguous, one-dimensional)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32
            and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.load(_pointer(context, builder, sig.args[0], args[0], args[1], _V8),
                            align=4)

    return _V8(arr, i), codegen


@intrinsic
def vzeros8(typingctx):  # type: ignore[no-untyped-def]
    """Eight float32 +0."""
    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return ir.Constant(_llvm_type(_V8), [0.0] * 8)

    return _V8(), codegen


@intrinsic
def vlanes8(typingctx, v):  # type: ignore[no-untyped-def]
    """The eight lanes of v as a tuple of float32."""
    if v != _V8:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        lanes = [builder.extract_element(args[0], ir.IntType(32)(k)) for k in range(8)]
        return context.make_tuple(builder, sig.return_type, lanes)

    return types.UniTuple(types.float32, 8)(v), codegen


@intrinsic
def vadd(typingctx, a, b):  # type: ignore[no-untyped-def]
    """a + b lane by lane (one float32 rounding each)."""
    if not (a == _V and b == _V):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.fadd(args[0], args[1])

    return _V(a, b), codegen


@intrinsic
def fma32(typingctx, a, b, c):  # type: ignore[no-untyped-def]
    """Scalar float32 fma(a, b, c), one rounding (``llvm.fma.f32``)."""
    if not (a == types.float32 and b == types.float32 and c == types.float32):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        f = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f, [f] * 3),
                                            "llvm.fma.f32")
        return builder.call(fn, list(args))

    return types.float32(a, b, c), codegen


def _contract(A, B, N, ranges, C):  # type: ignore[no-untyped-def]  # pragma: no cover
    """C[Mp, N] (flat; Mp = M rounded up to 4) = the plan's sums of A[M, K] (any strides)
    x B (flat, [K, N], N % 16 == 0); ``ranges`` [r, 2]: the k-ranges of each FMA chain in
    order. Rows past M repeat row M - 1 (their outputs are dropped)."""
    M = A.shape[0]
    nv = N // 16
    tiles_j = (nv + 1) // 2
    tiles = ((M + 3) // 4) * tiles_j
    nr = ranges.shape[0]
    for t in prange(tiles):
        fz = ftz_enter()
        i = (t // tiles_j) * 4
        j = (t % tiles_j) * 32
        i1 = min(i + 1, M - 1)
        i2 = min(i + 2, M - 1)
        i3 = min(i + 3, M - 1)
        if j + 32 <= N:  # two vectors of columns
            c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = vzeros(B)
            for r in range(nr):
                a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = vzeros(B)
                for k in range(ranges[r, 0], ranges[r, 1]):
                    b0 = vload(B, k * N + j)
                    b1 = vload(B, k * N + j + 16)
                    x = A[i, k]
                    a00 = vfma(x, b0, a00)
                    a01 = vfma(x, b1, a01)
                    x = A[i1, k]
                    a10 = vfma(x, b0, a10)
                    a11 = vfma(x, b1, a11)
                    x = A[i2, k]
                    a20 = vfma(x, b0, a20)
                    a21 = vfma(x, b1, a21)
                    x = A[i3, k]
                    a30 = vfma(x, b0, a30)
                    a31 = vfma(x, b1, a31)
                c00 = vadd(c00, a00)
                c01 = vadd(c01, a01)
                c10 = vadd(c10, a10)
                c11 = vadd(c11, a11)
                c20 = vadd(c20, a20)
                c21 = vadd(c21, a21)
                c30 = vadd(c30, a30)
                c31 = vadd(c31, a31)
            vstore(C, i * N + j, c00)
            vstore(C, i * N + j + 16, c01)
            vstore(C, (i + 1) * N + j, c10)
            vstore(C, (i + 1) * N + j + 16, c11)
            vstore(C, (i + 2) * N + j, c20)
            vstore(C, (i + 2) * N + j + 16, c21)
            vstore(C, (i + 3) * N + j, c30)
            vstore(C, (i + 3) * N + j + 16, c31)
        else:  # the last single vector of columns
            c0 = c1 = c2 = c3 = vzeros(B)
            for r in range(nr):
                a0 = a1 = a2 = a3 = vzeros(B)
                for k in range(ranges[r, 0], ranges[r, 1]):
                    b0 = vload(B, k * N + j)
                    a0 = vfma(A[i, k], b0, a0)
                    a1 = vfma(A[i1, k], b0, a1)
                    a2 = vfma(A[i2, k], b0, a2)
                    a3 = vfma(A[i3, k], b0, a3)
                c0 = vadd(c0, a0)
                c1 = vadd(c1, a1)
                c2 = vadd(c2, a2)
                c3 = vadd(c3, a3)
            vstore(C, i * N + j, c0)
            vstore(C, (i + 1) * N + j, c1)
            vstore(C, (i + 2) * N + j, c2)
            vstore(C, (i + 3) * N + j, c3)
        ftz_exit(fz)


contract = Twins(_contract)


@jit
def pad_columns(src, dst):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """dst[K, Np] = src[K, N] (any strides) with zeros in columns N..Np-1."""
    K, N = src.shape
    Np = dst.shape[1]
    for k in range(K):
        for j in range(N):
            dst[k, j] = src[k, j]
        for j in range(N, Np):
            dst[k, j] = 0.0


# --------------------------------------------------------------------------------------
# The GEMVs TF runs for one-wide contractions (the NumPy models: tfgrad._tf.onednn.gemv_t,
# tfgrad._tf.conv2d.eigen_gemv), operation for operation under FTZ / DAZ
# --------------------------------------------------------------------------------------
@jit
def gemv_t(X, w, y, s, e):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """oneDNN's gemv_t over k in [s, e), in place on y [R] (X [R, K], w [K], both
    C-contiguous): 8 FMA lanes
    over the first 16*floor(K/16) (lane l: k = l mod 8), the horizontal sum
    ((l0+l1)+(l4+l5)) + ((l2+l3)+(l6+l7)) added; then chunks of 8, 4, 2, 1 of products
    (fma from 0), each summed as the lanes are and added."""
    fz = ftz_enter()
    zero = np.float32(0.0)
    p = np.zeros(8, np.float32)
    K = e - s
    k16 = s + K - K % 16
    Xf = X.reshape(-1)  # (X and w C-contiguous: the lanes are vector loads)
    for r in range(X.shape[0]):
        acc = vzeros8()
        base = r * X.shape[1]
        for j in range(s, k16, 8):
            acc = vfma(vload8(Xf, base + j), vload8(w, j), acc)
        yr = y[r]
        if k16 > s:
            a0, a1, a2, a3, a4, a5, a6, a7 = vlanes8(acc)
            yr = yr + (((a0 + a1) + (a4 + a5)) + ((a2 + a3) + (a6 + a7)))
        j = k16
        for width in (8, 4, 2, 1):
            if e - j >= width:
                for lane in range(width):
                    p[lane] = fma32(X[r, j + lane], w[j + lane], zero)
                if width == 8:
                    t = ((p[0] + p[1]) + (p[4] + p[5])) + ((p[2] + p[3]) + (p[6] + p[7]))
                elif width == 4:
                    t = (p[0] + p[1]) + (p[2] + p[3])
                elif width == 2:
                    t = p[0] + p[1]
                else:
                    t = p[0]
                yr = yr + t
                j += width
        y[r] = yr
    ftz_exit(fz)


@jit
def eigen_gemv(a, B, y):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Eigen's own column-major GEMV (no FMA): y[j] = sum_k B[k, j] a[k] in blocks of k
    (all of K below 128, else 16; 4 when the outer stride is 32000 bytes or more), each a
    mul-then-add chain from 0, added to y (y [N] zeroed by the caller)."""
    fz = ftz_enter()
    K, N = B.shape
    block = K if K < 128 else (16 if N * 4 < 32000 else 4)
    zero = np.float32(0.0)
    for s in range(0, K, block):
        for j in range(N):
            c = zero
            for k in range(s, min(K, s + block)):
                c = c + B[k, j] * a[k]
            y[j] = y[j] + c
    ftz_exit(fz)
