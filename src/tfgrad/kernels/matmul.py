"""The contraction kernel: per output, FMA chains from +0 over k-ranges, added in order
(``tfgrad._tf.contraction``), as oneDNN's AVX-512 sgemm runs each of Eigen's blocks.

Register-blocked: a tile of 4 rows x 32 (24, 16, 8) columns keeps its FMA accumulators in
vector registers over one k-range; every FMA is ``llvm.fma`` (one rounding, as
``vfmadd231ps``), every running sum one float32 add, kept in C between the k-ranges
(a float32 store and load change nothing). The rows' values are broadcast, B's rows
loaded as vectors. A is read in place (a transposed view too); callers pad B to a
multiple of 8 columns with zeros; C is written exactly [M, N] (masked stores at the
right edge, no rows past M).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._compile import Twins, inline, jit
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._simd import (
    _VEC,
    Vec,
    _first_lanes,
    _llvm_type,
    _masked,
    _pointer,
    _splat,
    vload,
    vload_part,
    vstore,
    vstore_nt,
    vstore_part,
    vzeros,
)

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
def vfma_first(typingctx, a, b, acc, n):  # type: ignore[no-untyped-def]
    """fma(a, b, acc) in the first n lanes (one rounding each), acc as it is in the
    others (n an integer, 0 <= n <= lanes)."""
    vt = acc
    if not (vt == _V and a == vt and b == vt and isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ty = _llvm_type(vt)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3),
                                            f"llvm.fma.v{vt.lanes}f32")
        mask = _first_lanes(builder, vt.lanes,
                            context.cast(builder, args[3], sig.args[3], types.int64))
        return builder.select(mask, builder.call(fn, [args[0], args[1], args[2]]), args[2])

    return vt(a, b, acc, n), codegen


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
    """a + b lane by lane, 16 or 8 lanes (one float32 rounding each)."""
    if not (a == b and a in (_V, _V8)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.fadd(args[0], args[1])

    return a(a, b), codegen


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


def _item_pointer(context, builder, sig, args):  # type: ignore[no-untyped-def]
    """The address of arr[i, k] for an intrinsic's (arr, i, k), any strides, the indices
    taken as they are (no wraparound, no bounds check)."""
    aty = sig.args[0]
    ary = context.make_array(aty)(context, builder, args[0])
    inds = [context.cast(builder, args[1], sig.args[1], types.intp),
            context.cast(builder, args[2], sig.args[2], types.intp)]
    return cgutils.get_item_pointer2(
        context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
        strides=cgutils.unpack_tuple(builder, ary.strides), layout=aty.layout,
        inds=inds, wraparound=False, boundscheck=False)


@intrinsic
def aload(typingctx, arr, i, k):  # type: ignore[no-untyped-def]
    """arr[i, k] of a two-dimensional float32 array of any strides, the indices taken as
    they are (no negative-index wraparound: callers pass 0 <= i, k < shape)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and arr.ndim == 2
            and isinstance(i, types.Integer) and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ptr = _item_pointer(context, builder, sig, args)
        return builder.load(ptr)

    return types.float32(arr, i, k), codegen


@intrinsic
def prefetch(typingctx, arr, i, k):  # type: ignore[no-untyped-def]
    """Prefetch the cache line of arr[i, k] (``llvm.prefetch``: a hint, no fault, no
    effect on any value)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2
            and isinstance(i, types.Integer) and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ptr = _item_pointer(context, builder, sig, args)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.none(arr, i, k), codegen


@intrinsic
def vload8_part(typingctx, arr, i, n):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + n] in the first n lanes of eight (0 < n <= 8), +0 in the others;
    nothing past i + n is read."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32
            and isinstance(i, types.Integer) and isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        lt = _llvm_type(_V8)
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1], _V8)
        mask = _first_lanes(builder, 8, context.cast(builder, args[2], sig.args[2],
                                                     types.int64))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(lt, [ptr.type, ir.IntType(32), mask.type, lt]),
            _masked(_V8, "load"))
        return builder.call(fn, [ptr, ir.IntType(32)(4), mask, ir.Constant(lt, [0.0] * 8)])

    return _V8(arr, i, n), codegen


@intrinsic
def vstore8_part(typingctx, arr, i, v, n):  # type: ignore[no-untyped-def]
    """arr.flat[i:i + n] = the first n of v's eight lanes (a masked store)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and v == _V8
            and isinstance(i, types.Integer) and isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        lt = _llvm_type(_V8)
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1], _V8)
        mask = _first_lanes(builder, 8, context.cast(builder, args[3], sig.args[3],
                                                     types.int64))
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [lt, ptr.type, ir.IntType(32), mask.type]),
            _masked(_V8, "store"))
        builder.call(fn, [args[2], ptr, ir.IntType(32)(4), mask])
        return context.get_dummy_value()

    return types.none(arr, i, v, n), codegen


@inline(force=True)
def _put(C, off, acc, n, first, plus0, nt):  # type: ignore[no-untyped-def]  # pragma: no cover
    """C.flat[off:off + min(n, 16)] = acc if first, else C's values + acc: one float32
    add per output after the first k-range (the running sum over the k-ranges; the
    first is stored as it is, so a chain flushed to -0 stays -0, as in TF), then + 0
    when ``plus0`` (Col2im's add into a zeroed dx: -0 becomes +0); nothing when n <= 0.
    ``nt``: a whole vector is stored past the caches (C.flat[off] on a 64-byte line)."""
    if n >= 16:
        c = acc if first else vadd(vload(C, off), acc)
        if nt:
            vstore_nt(C, off, vadd(c, vzeros(C)) if plus0 else c)
        else:
            vstore(C, off, vadd(c, vzeros(C)) if plus0 else c)
    elif n > 0:
        c = acc if first else vadd(vload_part(C, off, n), acc)
        vstore_part(C, off, vadd(c, vzeros(C)) if plus0 else c, n)


@inline(force=True)
def _put8(C, off, acc, n, first, plus0):  # type: ignore[no-untyped-def]  # pragma: no cover
    """_put for eight lanes."""
    if n > 0:
        m = min(n, 8)
        c = acc if first else vadd(vload8_part(C, off, m), acc)
        vstore8_part(C, off, vadd(c, vzeros8()) if plus0 else c, m)


@inline(force=True)
def _tile(A, B, Nb, i, i1, i2, i3, j, k0, k1, C, cb, N, M, first, plus0, nt, W):  # type: ignore[no-untyped-def]  # pragma: no cover  # noqa: E501
    """One tile: rows i..i+3 (i1..i3 clamped to M - 1), columns j..j+W of B (W one of
    32, 24, 16, 8: a compile-time constant at each call), one FMA chain from +0 per
    output over k in [k0, k1), added to C's running sums (stored when ``first``);
    stores only inside C [M, N] (at C.flat[cb:])."""
    z = vzeros(B)
    a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = z
    h = vzeros8()
    h0 = h1 = h2 = h3 = h
    b0 = b1 = z
    b8 = h
    for k in range(k0, k1):
        x0 = aload(A, i, k)
        x1 = aload(A, i1, k)
        x2 = aload(A, i2, k)
        x3 = aload(A, i3, k)
        o = k * Nb + j
        if W >= 16:
            b0 = vload(B, o)
            a00 = vfma(x0, b0, a00)
            a10 = vfma(x1, b0, a10)
            a20 = vfma(x2, b0, a20)
            a30 = vfma(x3, b0, a30)
        if W == 32:
            b1 = vload(B, o + 16)
            a01 = vfma(x0, b1, a01)
            a11 = vfma(x1, b1, a11)
            a21 = vfma(x2, b1, a21)
            a31 = vfma(x3, b1, a31)
        if W == 8 or W == 24:
            b8 = vload8(B, o + W - 8)
            h0 = vfma(x0, b8, h0)
            h1 = vfma(x1, b8, h1)
            h2 = vfma(x2, b8, h2)
            h3 = vfma(x3, b8, h3)
    n = N - j  # columns of C left from j
    o0 = cb + i * N + j
    rows = M - i
    if W >= 16:
        _put(C, o0, a00, n, first, plus0, nt)
        if rows > 1:
            _put(C, o0 + N, a10, n, first, plus0, nt)
        if rows > 2:
            _put(C, o0 + 2 * N, a20, n, first, plus0, nt)
        if rows > 3:
            _put(C, o0 + 3 * N, a30, n, first, plus0, nt)
    if W == 32:
        _put(C, o0 + 16, a01, n - 16, first, plus0, nt)
        if rows > 1:
            _put(C, o0 + N + 16, a11, n - 16, first, plus0, nt)
        if rows > 2:
            _put(C, o0 + 2 * N + 16, a21, n - 16, first, plus0, nt)
        if rows > 3:
            _put(C, o0 + 3 * N + 16, a31, n - 16, first, plus0, nt)
    if W == 8 or W == 24:
        e = W - 8
        _put8(C, o0 + e, h0, n - e, first, plus0)
        if rows > 1:
            _put8(C, o0 + N + e, h1, n - e, first, plus0)
        if rows > 2:
            _put8(C, o0 + 2 * N + e, h2, n - e, first, plus0)
        if rows > 3:
            _put8(C, o0 + 3 * N + e, h3, n - e, first, plus0)


ROWS = 64
"""Rows of A (and C) per task."""
COLS = 256
"""Columns of B (and C) per task."""


def _contract(A, B, Nb, N, ranges, shard_ptr, plus0, stream, C):  # type: ignore[no-untyped-def]  # pragma: no cover  # noqa: E501
    """C [S, M, N] (flat) = each K-shard's sums of A[M, K] (any strides) x B (flat,
    [K, Nb], Nb % 8 == 0, zeros past column N): shard s's k-ranges are
    ``ranges[shard_ptr[s]:shard_ptr[s + 1]]``, one FMA chain from +0 per output over
    each, the first stored, the others added in order; then + 0 when ``plus0`` (TF's Col2im of a
    1x1, stride-1 Conv2DBackpropInput: a zeroed dx plus the contraction). ``stream``:
    the final sums are written with non-temporal stores (C on a 64-byte line, N % 16 == 0).

    Tasks: (shard, block of ``ROWS`` rows, block of ``COLS`` columns); within a task the
    k-ranges are the outer loop (each B block read from memory once), the running sums
    kept in C between them, tiles of 4 rows x 32 (24, 16, 8) columns inside."""
    M = A.shape[0]
    S = shard_ptr.shape[0] - 1
    nib = (M + ROWS - 1) // ROWS
    njb = (Nb + COLS - 1) // COLS
    rows_k = A.strides[1] == 4  # A's rows contiguous: 16 values a cache line
    for t in prange(S * nib * njb):
        fz = ftz_enter()
        s = t // (nib * njb)
        ib = ((t // njb) % nib) * ROWS
        jb = (t % njb) * COLS
        ie = min(M, ib + ROWS)
        je = min(Nb, jb + COLS)
        cb = s * M * N
        for r in range(shard_ptr[s], shard_ptr[s + 1]):
            first = r == shard_ptr[s]
            last = plus0 and r == shard_ptr[s + 1] - 1
            nt = stream and r == shard_ptr[s + 1] - 1
            k0 = ranges[r, 0]
            k1 = ranges[r, 1]
            for i in range(ib, ie, 4):
                i1 = min(i + 1, M - 1)
                i2 = min(i + 2, M - 1)
                i3 = min(i + 3, M - 1)
                if rows_k:  # rows two tiles ahead on their way to the cache (a hint)
                    for q in range(i + 8, min(i + 12, M)):
                        for k in range(k0, k1, 16):
                            prefetch(A, q, k)
                        prefetch(A, q, k1 - 1)
                j = jb
                while j + 32 <= je:
                    _tile(A, B, Nb, i, i1, i2, i3, j, k0, k1, C, cb, N, M, first, last, nt, 32)
                    j += 32
                rem = je - j
                if rem == 24:
                    _tile(A, B, Nb, i, i1, i2, i3, j, k0, k1, C, cb, N, M, first, last, nt, 24)
                elif rem == 16:
                    _tile(A, B, Nb, i, i1, i2, i3, j, k0, k1, C, cb, N, M, first, last, nt, 16)
                elif rem == 8:
                    _tile(A, B, Nb, i, i1, i2, i3, j, k0, k1, C, cb, N, M, first, last, nt, 8)
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
def gemv_t(X, W, Y, s, e):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """oneDNN's gemv_t over k in [s, e), in place on each row Y[i] [R] with W[i] [K]
    (X [R, K], W, Y C-contiguous; a row of W per image, all in one call): 8 FMA lanes
    over the first 16*floor(K/16) (lane l: k = l mod 8), the horizontal sum
    ((l0+l1)+(l4+l5)) + ((l2+l3)+(l6+l7)) added; then chunks of 8, 4, 2, 1 of products
    (fma from 0), each summed as the lanes are and added."""
    fz = ftz_enter()
    zero = np.float32(0.0)
    p = np.zeros(8, np.float32)
    K = e - s
    k16 = s + K - K % 16
    Xf = X.reshape(-1)  # (X and W C-contiguous: the lanes are vector loads)
    for i in range(W.shape[0]):
        w = W[i]
        y = Y[i]
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


def _eigen_gemv(A, B, block, Y):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Eigen's own column-major GEMV (no FMA) for each row of A: Y[r, j] = sum_k B[k, j]
    A[r, k] in blocks of ``block`` k (tfgrad._tf.conv2d.gemv_block), each a mul-then-add
    chain from 0, added to Y[r, j] (Y zeroed by the caller). B [K, N] C-contiguous: a
    block's chains advance for all j at once, one k at a time (vectorised across outputs;
    each output's order Eigen's)."""
    K, N = B.shape
    zero = np.float32(0.0)
    for r in prange(A.shape[0]):
        fz = ftz_enter()
        c = np.empty(N, np.float32)
        for s in range(0, K, block):
            for j in range(N):
                c[j] = zero
            for k in range(s, min(K, s + block)):
                ak = A[r, k]
                for j in range(N):
                    c[j] = c[j] + B[k, j] * ak
            for j in range(N):
                Y[r, j] = Y[r, j] + c[j]
        ftz_exit(fz)


eigen_gemv = Twins(_eigen_gemv)


# --------------------------------------------------------------------------------------
# oneDNN's AVX2 edge tiles (the NumPy model: tfgrad._tf.onednn.two_sets)
# --------------------------------------------------------------------------------------
@intrinsic
def vmul(typingctx, a, b):  # type: ignore[no-untyped-def]
    """a * b lane by lane, 16 or 8 lanes (one float32 rounding each); ``a`` a float32
    (broadcast) or a vector of b's type."""
    if not (b in (_V, _V8) and (a == b or a == types.float32)):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        x = args[0] if a == b else _splat(builder, b, args[0])
        return builder.fmul(x, args[1])

    return b(a, b), codegen


@inline(force=True)
def _b8(B, i, n):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """B.flat[i:i + n] in eight lanes (a whole load where the row has room)."""
    return vload8(B, i) if n == 8 else vload8_part(B, i, n)


@inline(force=True)
def _step(acc, a, b, f):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """One step of an edge tile's accumulator: fma(a, b, acc), or acc + a*b (two roundings)."""
    return vfma(a, b, acc) if f else vadd(acc, vmul(a, b))


def _two_sets(A, B, Nb, ranges, rows, fused, runs, C):  # type: ignore[no-untyped-def]  # pragma: no cover  # noqa: E501
    """C[r, lo:hi] (C [M, N]) for each ``rows[t]`` (fused: ``fused[t]``) and each column
    run (lo, hi) of ``runs`` [R, 2]: the AVX2 kernel's edge-tile sum of A [M, K] (any
    strides) x B (flat, [K, Nb], zeros past N) over ``ranges`` [P, 2], each pass two
    accumulators from +0 over its even and odd steps, added, the odd last step into
    their sum, the first pass's result stored as it is (a -0 kept), each later one added
    to the running one; a step an FMA where fused,
    else a product then a sum. Eight columns at a time in vector lanes, two rows at once
    (four independent chains; each output's order oneDNN's)."""
    R = rows.shape[0]
    for tt in prange((R + 1) // 2):
        fz = ftz_enter()
        t = 2 * tt
        r0 = rows[t]
        r1 = rows[min(t + 1, R - 1)]
        f0 = fused[t]
        f1 = fused[min(t + 1, R - 1)]
        for q in range(runs.shape[0]):
            for j0 in range(runs[q, 0], runs[q, 1], 8):
                n = min(8, runs[q, 1] - j0)
                c0 = vzeros8()
                c1 = vzeros8()
                for p in range(ranges.shape[0]):
                    s = ranges[p, 0]
                    e = ranges[p, 1]
                    ev0 = vzeros8()
                    od0 = vzeros8()
                    ev1 = vzeros8()
                    od1 = vzeros8()
                    for k in range(s, e - (e - s) % 2, 2):
                        b0 = _b8(B, k * Nb + j0, n)
                        b1 = _b8(B, (k + 1) * Nb + j0, n)
                        ev0 = _step(ev0, A[r0, k], b0, f0)
                        od0 = _step(od0, A[r0, k + 1], b1, f0)
                        ev1 = _step(ev1, A[r1, k], b0, f1)
                        od1 = _step(od1, A[r1, k + 1], b1, f1)
                    ev0 = vadd(ev0, od0)
                    ev1 = vadd(ev1, od1)
                    if (e - s) % 2:
                        b0 = _b8(B, (e - 1) * Nb + j0, n)
                        ev0 = _step(ev0, A[r0, e - 1], b0, f0)
                        ev1 = _step(ev1, A[r1, e - 1], b0, f1)
                    if p == 0:
                        c0 = ev0
                        c1 = ev1
                    else:
                        c0 = vadd(c0, ev0)
                        c1 = vadd(c1, ev1)
                vstore8_part(C, r0 * C.shape[1] + j0, c0, n)
                vstore8_part(C, r1 * C.shape[1] + j0, c1, n)
        ftz_exit(fz)


two_sets = Twins(_two_sets)
