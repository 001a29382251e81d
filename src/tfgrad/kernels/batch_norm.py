"""Fused Numba kernels for FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}.

Every kernel reproduces TF 2.21's Eigen CPU kernel bit for bit (the formulas are in
docs/batch_norm.md; the NumPy reference in ``tfgrad.ops.batch_norm``). The data are viewed
channel-last as flat ``[R, C]`` (NHWC) or as flat ``[N, C, S]`` (NCHW, S = H*W or D*H*W);
a *row* is one (n, spatial) position, in TF's NHWC order.

Reduction orders (what makes the results exact and independent of the thread count):

- Forward mean/variance (Eigen's column reduction): channels ``c < 8*(C//8)`` of inputs
  with ``R >= 16`` rows use four interleaved accumulators (rows ``j = k mod 4``) combined as
  ``((a0+a1)+a2)+a3``, then the leftover rows in sequence; other channels sum rows in
  sequence.
- Gradient sums (TF's ``ReduceOuterDimensions``): rows in sequence, optionally in row
  blocks whose partial sums are added in order, with TF's +0 buffers in between or after
  (``rb``, ``zb``, ``za``: TF's split on several intra-op threads,
  ``ops.batch_norm.redux_plan``).

Both orders are per channel, so the sums are parallel over channels and never split rows;
each thread owns its channels' accumulators, and the elementwise passes (y, x_backprop)
are parallel over anything. Passes over the data:

- NHWC: the sums run over blocks of channels, one per thread (whole rows on one thread;
  the forward's second pass over a block follows the first); y / x_backprop are written
  in a second kernel, parallel over blocks of rows with whole rows in the inner loop.
  Forward: 3 reads of x (2 by block) and 1 write; gradient: 2 reads of dy and x, 1 write.
  With C a multiple of 16 (the usual case) these are register-blocked vector kernels
  with software prefetch and non-temporal output stores (section "NHWC with C a
  multiple of 16"); other C take the scalar-loop kernels.
- NCHW: eight channels at a time, their sums then the write pass while their values are
  in cache; the write pass in whole vectors (``_span``), non-temporal for large outputs.
  The sums put one channel in each lane of an eight-lane vector: eight positions of
  eight channels are loaded and transposed in registers (``_simd.vload8_t``), so each
  lane adds its channel's rows in TF's order (``_eigen_sum8``, ``_nchw_sums8``): much
  faster than scalar chains over a few channels. Eight, not sixteen: sixteen channels of
  dy and x are 32 concurrent memory streams, more than the hardware prefetchers follow.
  A last group of fewer than eight channels sums the lanes of the last eight and writes
  only its own; C < 8 keeps scalar chains.

Denormals: TF runs these kernels with FTZ and DAZ set (``tfgrad._fpenv``). The op sets
them on the calling thread; every parallel loop body sets them on its own (Numba's)
thread with ``ftz_enter`` and restores that thread's MXCSR with ``ftz_exit``.

No temporary the size of x is allocated for float32; float16 / bfloat16 inputs are
converted to a float32 copy (Numba has no half types). Problems under 65536 elements run
single-threaded twins of the kernels (waking a thread pool costs more than the work).
"""

from __future__ import annotations

import platform
import types as pytypes

import numba
import numpy as np
from numba import prange, types, uint64
from numba.core import cgutils
from numba.extending import intrinsic

from .._compile import num_threads
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._simd import (
    STREAM_MIN_BYTES,
    aligned_empty,
    prefetch,
    vadd,
    vfull,
    vfull8,
    vgather8,
    vlane,
    vload,
    vload8_t,
    vmul,
    vput,
    vstore,
    vstore_nt,
    vsub,
    vzeros,
)

_F32 = np.float32
_SLOT = 256  # most channels per NHWC column-sum block (buffer slot size)
_ROWS = 128  # NHWC row block of the elementwise passes

HAVE_HW_RSQRT = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")
"""Whether the processor's approximate reciprocal square root (``rsqrtps``) is available.

Eigen's AVX packet ``prsqrt`` is ``vrsqrtps`` plus one Newton step; TF's x86 wheel uses it
for the channels in full packets of 8. ``rsqrtps`` (SSE, on every x86-64 processor) gives
the same per-lane result as ``vrsqrtps`` on the same processor. Elsewhere (ARM) TF's Eigen
uses another approximation; there we fall back to the exact ``1/sqrt`` (documented: not
bit-identical to TF on such machines)."""


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

    @numba.njit(cache=True, error_model="numpy")
    def _rsqrtps(x):  # type: ignore[no-redef]
        return _F32(1) / np.sqrt(x)


@numba.njit(cache=True, error_model="numpy")
def _packet_rsqrt(a: np.float32) -> np.float32:
    """Eigen's AVX ``prsqrt``: y0 = vrsqrtps(a), one Newton step without FMA, y0 if NaN."""
    y0 = _rsqrtps(a)
    r = (_F32(-0.5) * y0) * ((a * y0) * y0 - _F32(1)) + y0
    return y0 if np.isnan(r) else r


# Eigen evaluates the grad's ``rsqrt(var + eps)`` lazily inside [R, C] expressions, in
# tiles of at most this many channels (its cost model's block size for each expression;
# measured on TF 2.21, the same for float32, float16 and bfloat16). The packet rule then
# applies per tile: full packets of 8 from the tile's first channel.
GRAD_SCALE_TILE = 10322  # scratch = y_backprop * x_scaled (-> scale_backprop)
GRAD_DX_TILE = 4050  # x_backprop = coef1 * (y_backprop_centered - x_centered * coef2)


@numba.njit(cache=True, error_model="numpy")
def eigen_rsqrt(v: np.ndarray, tile: int) -> np.ndarray:
    """``rsqrt`` of a [C] float32 vector as Eigen evaluates it in tiles of ``tile``
    channels: in each tile, full packets of 8 from its first channel use the approximation
    and the tail channels the exact ``1/sqrt``. ``tile >= C`` is the plain channel rule
    (c < 8*(C//8) approximate)."""
    n = v.shape[0]
    out = np.empty(n, np.float32)
    for start in range(0, n, tile):
        stop = min(n, start + tile)
        k = start + ((stop - start) // 8) * 8
        for c in range(start, stop):
            a = v[c]
            if c < k and HAVE_HW_RSQRT:
                out[c] = _packet_rsqrt(a)
            else:
                out[c] = _F32(1) / np.sqrt(a)
    return out


# --------------------------------------------------------------------------------------
# Column sums, NHWC. Arrays are flat; indices are formed as uint64 so that Numba emits no
# negative-index wraparound and LLVM vectorizes the channel loops.
# --------------------------------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _eigen_sum_nhwc(x: np.ndarray, R: int, C: int, cs: int, ce: int, four: bool,
                    center: np.ndarray, out: np.ndarray) -> None:
    """out[t] = Eigen colsum over the R rows of x[:, cs+t] (x flat [R, C]); of
    (x - center[t])**2 when center has entries. ``four``: the four-accumulator order.

    The four accumulators and the centre share one buffer: with a single base pointer
    LLVM's runtime alias checks stay few enough for it to vectorize the channel loop."""
    w = ce - cs
    sq = center.shape[0] > 0
    # [a0 | a1 | a2 | a3 | center] in slots of _SLOT >= w: constant distances let LLVM
    # prove that the slots do not overlap.
    buf = np.zeros(5 * _SLOT, np.float32)
    if sq:
        for t in range(w):
            buf[4 * _SLOT + t] = center[t]
    c1, c2, c3 = uint64(C), uint64(2 * C), uint64(3 * C)
    w1, w2, w3, w4 = uint64(_SLOT), uint64(2 * _SLOT), uint64(3 * _SLOT), uint64(4 * _SLOT)
    start = 0
    if four:
        start = (R // 4) * 4
        for j in range(0, start, 4):
            b = uint64(j * C + cs)
            if sq:
                for t in range(w):
                    i = b + uint64(t)
                    q = uint64(t)
                    m = buf[q + w4]
                    d0 = x[i] - m
                    d1 = x[i + c1] - m
                    d2 = x[i + c2] - m
                    d3 = x[i + c3] - m
                    buf[q] += d0 * d0
                    buf[q + w1] += d1 * d1
                    buf[q + w2] += d2 * d2
                    buf[q + w3] += d3 * d3
            else:
                for t in range(w):
                    i = b + uint64(t)
                    q = uint64(t)
                    buf[q] += x[i]
                    buf[q + w1] += x[i + c1]
                    buf[q + w2] += x[i + c2]
                    buf[q + w3] += x[i + c3]
        for t in range(w):
            buf[t] = ((buf[t] + buf[t + _SLOT]) + buf[t + 2 * _SLOT]) + buf[t + 3 * _SLOT]
    for j in range(start, R):
        b = uint64(j * C + cs)
        if sq:
            for t in range(w):
                q = uint64(t)
                d = x[b + q] - buf[q + w4]
                buf[q] += d * d
        else:
            for t in range(w):
                q = uint64(t)
                buf[q] += x[b + q]
    for t in range(w):
        out[t] = buf[t]


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _rsqrt_channel(a: np.float32, approx: bool) -> np.float32:
    if approx and HAVE_HW_RSQRT:
        return _packet_rsqrt(a)
    return _F32(1) / np.sqrt(a)


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _stats_nhwc(x: np.ndarray, R: int, C: int, cb: int, mean: np.ndarray,
                var: np.ndarray) -> None:
    """Batch mean and biased variance of flat x[R, C], in parallel over blocks of ``cb``
    channels (the sums never split rows); the second pass over a block follows the first."""
    k8 = (C // 8) * 8
    inv = _F32(1) / _F32(R)
    nblk = (C + cb - 1) // cb
    empty = np.zeros(0, np.float32)
    for blk in prange(nblk):
        fz = ftz_enter()
        c0 = blk * cb
        c1 = min(C, c0 + cb)
        w = c1 - c0
        m = np.empty(w, np.float32)
        v = np.empty(w, np.float32)
        # packet channels [c0, cp) and tail channels [cp, c1)
        cp = min(c1, max(c0, k8))
        if cp > c0:
            _eigen_sum_nhwc(x, R, C, c0, cp, R >= 16, empty, m[: cp - c0])
        if c1 > cp:
            _eigen_sum_nhwc(x, R, C, cp, c1, False, empty, m[cp - c0:])
        for t in range(w):
            m[t] = m[t] * inv
        if cp > c0:
            _eigen_sum_nhwc(x, R, C, c0, cp, R >= 16, m[: cp - c0], v[: cp - c0])
        if c1 > cp:
            _eigen_sum_nhwc(x, R, C, cp, c1, False, m[cp - c0:], v[cp - c0:])
        for t in range(w):
            mean[c0 + t] = m[t]
            var[c0 + t] = v[t] * inv
        ftz_exit(fz)


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _affine_rows(x: np.ndarray, R: int, C: int, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                 y: np.ndarray) -> None:
    """y = (x - a) * b + c per channel on flat [R, C], in parallel over row blocks."""
    for blk in prange((R + _ROWS - 1) // _ROWS):
        fz = ftz_enter()
        for j in range(blk * _ROWS, min(R, blk * _ROWS + _ROWS)):
            base = uint64(j * C)
            for t in range(C):
                i = base + uint64(t)
                q = uint64(t)
                y[i] = (x[i] - a[q]) * b[q] + c[q]
        ftz_exit(fz)


@numba.njit(cache=True, error_model="numpy")
def _eigen_sum_nchw(x: np.ndarray, N: int, C: int, S: int, c: int, nc: int, four: bool,
                    center: np.ndarray, sq: bool, out: np.ndarray) -> None:
    """Eigen colsums of channels c .. c+nc-1 (nc = 1 or 2, interleaved for twice the
    independent add chains) of flat x[N, C, S] over rows j = n*S + s, in the order of
    _eigen_sum_nhwc; of (x - center[k])**2 when ``sq``. Results in out[:nc]."""
    R = N * S
    u = (R // 4) * 4 if four else 0
    acc = np.zeros(8, np.float32)  # accumulator j % 4 of channel k at acc[4*k + j % 4]
    m0 = center[0] if sq else _F32(0)
    m1 = center[nc - 1] if sq else _F32(0)
    d1 = uint64(S if nc == 2 else 0)  # offset of the second channel (itself when nc = 1)
    j = 0
    while j < u:  # rows [0, u): accumulator j % 4
        n = j // S
        s = j - n * S
        e = min(S, s + (u - j))
        b = uint64((n * C + c) * S)
        while s < e and (j & 3) != 0:  # peel to a multiple of 4
            v = x[b + uint64(s)]
            w = x[b + uint64(s) + d1]
            acc[j & 3] += (v - m0) * (v - m0) if sq else v
            acc[4 + (j & 3)] += (w - m1) * (w - m1) if sq else w
            s += 1
            j += 1
        a0, a1, a2, a3 = acc[0], acc[1], acc[2], acc[3]
        b0, b1, b2, b3 = acc[4], acc[5], acc[6], acc[7]
        while s + 4 <= e:
            i = b + uint64(s)
            k = i + d1
            v0, v1, v2, v3 = x[i], x[i + uint64(1)], x[i + uint64(2)], x[i + uint64(3)]
            w0, w1, w2, w3 = x[k], x[k + uint64(1)], x[k + uint64(2)], x[k + uint64(3)]
            if sq:
                v0 = (v0 - m0) * (v0 - m0)
                v1 = (v1 - m0) * (v1 - m0)
                v2 = (v2 - m0) * (v2 - m0)
                v3 = (v3 - m0) * (v3 - m0)
                w0 = (w0 - m1) * (w0 - m1)
                w1 = (w1 - m1) * (w1 - m1)
                w2 = (w2 - m1) * (w2 - m1)
                w3 = (w3 - m1) * (w3 - m1)
            a0 += v0
            a1 += v1
            a2 += v2
            a3 += v3
            b0 += w0
            b1 += w1
            b2 += w2
            b3 += w3
            s += 4
            j += 4
        acc[0], acc[1], acc[2], acc[3] = a0, a1, a2, a3
        acc[4], acc[5], acc[6], acc[7] = b0, b1, b2, b3
        while s < e:
            v = x[b + uint64(s)]
            w = x[b + uint64(s) + d1]
            acc[j & 3] += (v - m0) * (v - m0) if sq else v
            acc[4 + (j & 3)] += (w - m1) * (w - m1) if sq else w
            s += 1
            j += 1
    if four:
        t0 = ((acc[0] + acc[1]) + acc[2]) + acc[3]
        t1 = ((acc[4] + acc[5]) + acc[6]) + acc[7]
    else:
        t0 = t1 = _F32(0)
    while j < R:  # rows [u, R) in sequence
        n = j // S
        s = j - n * S
        b = uint64((n * C + c) * S)
        while s < S:
            v = x[b + uint64(s)]
            w = x[b + uint64(s) + d1]
            t0 += (v - m0) * (v - m0) if sq else v
            t1 += (w - m1) * (w - m1) if sq else w
            s += 1
            j += 1
    out[0] = t0
    if nc == 2:
        out[1] = t1


@numba.njit(inline="always", error_model="numpy")
def _term8(v, m, sq):  # type: ignore[no-untyped-def]
    if sq:
        d = vsub(v, m)
        return vmul(d, d)
    return v


@numba.njit(inline="always", error_model="numpy")
def _add_row8(v, j, a0, a1, a2, a3):  # type: ignore[no-untyped-def]
    """v added to accumulator j % 4."""
    r = j & 3
    if r == 0:
        a0 = vadd(a0, v)
    elif r == 1:
        a1 = vadd(a1, v)
    elif r == 2:
        a2 = vadd(a2, v)
    else:
        a3 = vadd(a3, v)
    return a0, a1, a2, a3


@numba.njit(cache=True, error_model="numpy")
def _eigen_sum8(x: np.ndarray, N: int, C: int, S: int, c: int, four: bool, m, sq: bool):  # type: ignore[no-untyped-def]  # noqa: E501
    """_eigen_sum_nchw for channels c..c+7, lane k for channel c + k (the same additions
    in the same order per lane): eight positions at a time transposed in registers
    (_simd.vload8_t) from a row j = 0 mod 4, so that row j + r goes to accumulator r % 4;
    positions before and after such runs one at a time. Of (x - m)**2 when ``sq``."""
    R = N * S
    u = (R // 4) * 4 if four else 0
    z = vfull8(x, 0.0)
    a0 = a1 = a2 = a3 = z
    j = 0
    while j < u:  # rows [0, u): accumulator j % 4
        base, q, e = _image_span(j, u, C, S, c)
        while q < e and (j & 3) != 0:
            v = _term8(vgather8(x, base + q, S), m, sq)
            a0, a1, a2, a3 = _add_row8(v, j, a0, a1, a2, a3)
            q += 1
            j += 1
        while q + 8 <= e:
            v0, v1, v2, v3, v4, v5, v6, v7 = vload8_t(x, base + q, S)
            a0 = vadd(a0, _term8(v0, m, sq))
            a1 = vadd(a1, _term8(v1, m, sq))
            a2 = vadd(a2, _term8(v2, m, sq))
            a3 = vadd(a3, _term8(v3, m, sq))
            a0 = vadd(a0, _term8(v4, m, sq))
            a1 = vadd(a1, _term8(v5, m, sq))
            a2 = vadd(a2, _term8(v6, m, sq))
            a3 = vadd(a3, _term8(v7, m, sq))
            q += 8
            j += 8
        while q < e:
            v = _term8(vgather8(x, base + q, S), m, sq)
            a0, a1, a2, a3 = _add_row8(v, j, a0, a1, a2, a3)
            q += 1
            j += 1
    t = vadd(vadd(vadd(a0, a1), a2), a3) if four else z
    while j < R:  # rows [u, R) in sequence
        base, q, e = _image_span(j, R, C, S, c)
        for p in range(q, e):
            t = vadd(t, _term8(vgather8(x, base + p, S), m, sq))
        j += e - q
    return t


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _fwd_nchw(x: np.ndarray, N: int, C: int, S: int, scale: np.ndarray, offset: np.ndarray,
              mean: np.ndarray, var: np.ndarray, eps: np.float32, training: bool,
              y: np.ndarray, stream: bool) -> None:
    """NCHW forward in groups of 8 channels, whose N*S values stay in cache: their sums,
    then their y. The sums take a vector lane per channel (_eigen_sum8). A last group of
    fewer than eight channels sums the lanes of the last eight and writes only its own:
    channels past 8*(C//8) sum their rows in sequence (Eigen), and so do those lanes.
    C < 8 takes the scalar chains, two channels at a time."""
    R = N * S
    k8 = (C // 8) * 8
    inv = _F32(1) / _F32(R)
    for grp in prange((C + 7) // 8):
        fz = ftz_enter()
        c0 = 8 * grp
        nc = min(8, C - c0)
        lo = max(0, min(c0, C - 8))  # the channel of the sums' first lane
        m = np.empty(8, np.float32)  # mean / variance per channel from lo
        v = np.empty(8, np.float32)
        if not training:
            for t in range(nc):
                m[c0 - lo + t] = mean[c0 + t]
        elif C >= 8:
            four = c0 < k8 and R >= 16
            f = vfull8(x, inv)
            mv = vmul(_eigen_sum8(x, N, C, S, lo, four, f, False), f)
            vv = vmul(_eigen_sum8(x, N, C, S, lo, four, mv, True), f)
            for t in range(8):
                m[t], v[t] = vlane(mv, t), vlane(vv, t)
        else:
            for t in range(0, nc, 2):
                k = min(2, nc - t)
                _eigen_sum_nchw(x, N, C, S, t, k, False, m[t:], False, m[t:])
                for q in range(t, t + k):
                    m[q] = m[q] * inv
                _eigen_sum_nchw(x, N, C, S, t, k, False, m[t:], True, v[t:])
                for q in range(t, t + k):
                    v[q] = v[q] * inv
        for t in range(nc):
            c = c0 + t
            if training:
                mean[c], var[c] = m[c - lo], v[c - lo]
            sf = _rsqrt_channel(var[c] + eps, c < k8) * scale[c]
            mc = m[c - lo]
            for n in range(N):
                b = (n * C + c) * S
                _span(0, x, x, y, b, b + S, mc, sf, offset[c], mc, stream)
        ftz_exit(fz)


# --------------------------------------------------------------------------------------
# Gradient
# --------------------------------------------------------------------------------------
@numba.njit(inline="always", error_model="numpy")
def _zero_follows(seg: int, rb: int, R: int, zb: bool, za: bool) -> bool:
    """Whether TF adds an untouched (+0) partial-sum buffer after the partial sum of rows
    [seg, seg + rb): ``zb`` after all but the last, ``za`` after the last (redux_plan)."""
    return za if seg + rb >= R else zb


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _grad_sums_nhwc(dy: np.ndarray, x: np.ndarray, R: int, C: int, cb: int, rb: int,
                    zb: bool, za: bool, mean: np.ndarray, c0s: np.ndarray, training: bool,
                    sums: np.ndarray) -> None:
    """The gradient's column sums on flat [R, C] into sums[3, C] = (sum dy*(xc*c0s) [training
    only], sum dy, sum dy*xc), in parallel over blocks of ``cb <= _SLOT`` channels: rows in
    sequence, partial sums over row blocks of ``rb`` added in order (see _nchw_sums1)."""
    nblk = (C + cb - 1) // cb
    for blk in prange(nblk):
        fz = ftz_enter()
        c0 = blk * cb
        c1 = min(C, c0 + cb)
        w = c1 - c0
        w1, w2, w3, w4 = uint64(_SLOT), uint64(2 * _SLOT), uint64(3 * _SLOT), uint64(4 * _SLOT)
        # [p_sb | p_ob | p_sx | mean | c0s] in slots of _SLOT (see _eigen_sum_nhwc)
        buf = np.zeros(5 * _SLOT, np.float32)
        tot = np.full(3 * _SLOT, -0.0, np.float32)  # -0 + p is p: the first passes
        for t in range(w):
            buf[3 * _SLOT + t] = mean[c0 + t]
            buf[4 * _SLOT + t] = c0s[c0 + t]
        for seg in range(0, R, rb):
            buf[: 3 * _SLOT] = 0
            for j in range(seg, min(R, seg + rb)):
                b = uint64(j * C + c0)
                if training:
                    for t in range(w):
                        i = b + uint64(t)
                        q = uint64(t)
                        g = dy[i]
                        xc = x[i] - buf[q + w3]
                        buf[q] += g * (xc * buf[q + w4])
                        buf[q + w1] += g
                        buf[q + w2] += g * xc
                else:
                    for t in range(w):
                        i = b + uint64(t)
                        q = uint64(t)
                        g = dy[i]
                        buf[q + w1] += g
                        buf[q + w2] += g * (x[i] - buf[q + w3])
            for t in range(3 * _SLOT):
                tot[t] += buf[t]
            if _zero_follows(seg, rb, R, zb, za):
                for t in range(3 * _SLOT):
                    tot[t] += _F32(0)
        for q in range(3):
            for t in range(w):
                sums[q, c0 + t] = tot[q * _SLOT + t]
        ftz_exit(fz)


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _dx_rows(dy: np.ndarray, x: np.ndarray, R: int, C: int, f1: np.ndarray, f2: np.ndarray,
             f3: np.ndarray, m: np.ndarray, training: bool, dx: np.ndarray) -> None:
    """x_backprop on flat [R, C] in parallel over row blocks: f1*((dy - f3) - (x - m)*f2)
    (training; TF's coef1, coef2 and mean of dy) or dy*f1 (frozen statistics)."""
    for blk in prange((R + _ROWS - 1) // _ROWS):
        fz = ftz_enter()
        for j in range(blk * _ROWS, min(R, blk * _ROWS + _ROWS)):
            base = uint64(j * C)
            if training:
                for t in range(C):
                    i = base + uint64(t)
                    q = uint64(t)
                    dx[i] = f1[q] * ((dy[i] - f3[q]) - (x[i] - m[q]) * f2[q])
            else:
                for t in range(C):
                    i = base + uint64(t)
                    dx[i] = dy[i] * f1[uint64(t)]
        ftz_exit(fz)


@numba.njit(inline="always", error_model="numpy")
def _image_span(j, stop, C, S, c):  # type: ignore[no-untyped-def]
    """The rows [j, stop) have in their first image n = j // S: channel c's flat offset
    there and the positions [s, e) they cover (rows j = n*S + s of flat [N, C, S])."""
    n = j // S
    s = j - n * S
    return (n * C + c) * S, s, min(S, s + (stop - j))


@numba.njit(cache=True, error_model="numpy")
def _nchw_sums1(dy: np.ndarray, x: np.ndarray, N: int, C: int, S: int, rb: int,
                zb: bool, za: bool, c: int, m: np.float32, k: np.float32, training: bool,
                out: np.ndarray) -> None:
    """Grad sums of one channel of flat [N, C, S] over rows j = n*S + s in sequence (row
    blocks of ``rb`` summed separately from +0, then added in order) into out[0:3]. The
    total starts at -0, which passes the first block's sum through unchanged as TF's
    combine does (a sum flushed to -0 stays -0); +0 is added after a block where TF adds
    an untouched buffer there (``zb``, ``za``: ops.batch_norm.redux_plan)."""
    R = N * S
    t_sb = t_ob = t_sx = _F32(-0.0)
    for seg in range(0, R, rb):
        p_sb = p_ob = p_sx = _F32(0)
        j = seg
        stop = min(R, seg + rb)
        while j < stop:
            b, s, e = _image_span(j, stop, C, S, c)
            for q in range(s, e):
                i = uint64(b) + uint64(q)
                g = dy[i]
                xc = x[i] - m
                if training:
                    p_sb += g * (xc * k)
                p_ob += g
                p_sx += g * xc
            j += e - s
        t_sb += p_sb
        t_ob += p_ob
        t_sx += p_sx
        if _zero_follows(seg, rb, R, zb, za):
            t_sb += _F32(0)
            t_ob += _F32(0)
            t_sx += _F32(0)
    out[0], out[1], out[2] = t_sb, t_ob, t_sx


@numba.njit(inline="always", error_model="numpy")
def _sums8_row(g, v, m, k, training, a, b, d):  # type: ignore[no-untyped-def]
    """One row of eight channels (a lane each): _nchw_sums1's updates."""
    xc = vsub(v, m)
    if training:
        a = vadd(a, vmul(g, vmul(xc, k)))
    return a, vadd(b, g), vadd(d, vmul(g, xc))


@numba.njit(cache=True, error_model="numpy")
def _nchw_sums8(dy: np.ndarray, x: np.ndarray, N: int, C: int, S: int, rb: int,
                zb: bool, za: bool, c: int, mean: np.ndarray, c0s: np.ndarray,
                training: bool, out: np.ndarray) -> None:
    """_nchw_sums1 for channels c..c+7, one vector lane per channel: every lane makes the
    same additions in the same order as the scalar chains. Eight rows of eight channels
    are loaded and transposed in registers (_simd.vload8_t); rows that do not make a
    whole eight within one image and one row block are gathered one at a time."""
    R = N * S
    m = vgather8(mean, c, 1)
    k = vgather8(c0s, c, 1)
    z = vfull8(x, 0.0)
    ta = tb = td = vfull8(x, -0.0)
    for seg in range(0, R, rb):
        a = b = d = z
        j = seg
        stop = min(R, seg + rb)
        while j < stop:
            base, s, e = _image_span(j, stop, C, S, c)
            q = s
            while q + 8 <= e:
                g0, g1, g2, g3, g4, g5, g6, g7 = vload8_t(dy, base + q, S)
                x0, x1, x2, x3, x4, x5, x6, x7 = vload8_t(x, base + q, S)
                a, b, d = _sums8_row(g0, x0, m, k, training, a, b, d)
                a, b, d = _sums8_row(g1, x1, m, k, training, a, b, d)
                a, b, d = _sums8_row(g2, x2, m, k, training, a, b, d)
                a, b, d = _sums8_row(g3, x3, m, k, training, a, b, d)
                a, b, d = _sums8_row(g4, x4, m, k, training, a, b, d)
                a, b, d = _sums8_row(g5, x5, m, k, training, a, b, d)
                a, b, d = _sums8_row(g6, x6, m, k, training, a, b, d)
                a, b, d = _sums8_row(g7, x7, m, k, training, a, b, d)
                q += 8
            while q < e:
                a, b, d = _sums8_row(vgather8(dy, base + q, S), vgather8(x, base + q, S), m,
                                     k, training, a, b, d)
                q += 1
            j += e - s
        ta = vadd(ta, a)
        tb = vadd(tb, b)
        td = vadd(td, d)
        if _zero_follows(seg, rb, R, zb, za):
            ta = vadd(ta, z)
            tb = vadd(tb, z)
            td = vadd(td, z)
    for t in range(8):
        out[3 * t] = vlane(ta, t)
        out[3 * t + 1] = vlane(tb, t)
        out[3 * t + 2] = vlane(td, t)


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _grad_nchw(dy: np.ndarray, x: np.ndarray, N: int, C: int, S: int, rb: int,
               zb: bool, za: bool, scale: np.ndarray, mean: np.ndarray, c0s: np.ndarray,
               c0d: np.ndarray, training: bool, dx: np.ndarray, sb: np.ndarray, ob: np.ndarray,
               stream: bool) -> None:
    """NCHW gradient in groups of 8 channels: the sums (rows j = n*S + s in sequence, per
    channel), then dx while the group's values are in cache. A last group of fewer than
    eight channels sums the lanes of the last eight (each lane's bits do not depend on
    its neighbours) and writes only its own; C < 8 takes the scalar chains."""
    R = N * S
    inv = _F32(1) / _F32(R)
    for grp in prange((C + 7) // 8):
        fz = ftz_enter()
        c0 = 8 * grp
        nc = min(8, C - c0)
        lo = max(0, min(c0, C - 8))  # the channel of the sums' first lane
        sums = np.empty(24, np.float32)  # (sb, ob, sx) per channel from lo
        if C >= 8:
            _nchw_sums8(dy, x, N, C, S, rb, zb, za, lo, mean, c0s, training, sums)
        else:
            for t in range(nc):
                _nchw_sums1(dy, x, N, C, S, rb, zb, za, c0 + t, mean[c0 + t], c0s[c0 + t],
                            training, sums[3 * t:])
        for t in range(nc):
            c = c0 + t
            q = 3 * (c - lo)
            m = mean[c]
            ob[c] = sums[q + 1]
            if training:
                sb[c] = sums[q]
                f1 = scale[c] * c0d[c]
                f2 = (c0d[c] * c0d[c]) * (sums[q + 2] / _F32(R))
                f3 = sums[q + 1] * inv
                for n in range(N):
                    b = (n * C + c) * S
                    _span(1, dy, x, dx, b, b + S, f1, f2, f3, m, stream)
            else:
                sb[c] = sums[q + 2] * c0d[c]
                f1 = c0d[c] * scale[c]
                for n in range(N):
                    b = (n * C + c) * S
                    _span(2, dy, x, dx, b, b + S, f1, f1, f1, f1, stream)
        ftz_exit(fz)


# --------------------------------------------------------------------------------------
# NHWC with C a multiple of 16: explicit float32 x 16 vectors (kernels._simd), up to four
# channel vectors (64 channels) per block with every accumulator in a register. The sums
# are the same per-lane additions in the same order as above (one lane per channel), so
# the results are the same bits; what changes is the memory traffic:
# - the sums prefetch _PF rows ahead into L2 (a block reads 256 of every C*4 bytes, a
#   strided pattern the hardware prefetcher alone follows at a fraction of the streaming
#   bandwidth);
# - y / x_backprop go out with non-temporal stores when large (no read for ownership,
#   and x stays in the last-level cache instead of being evicted by the output).
# --------------------------------------------------------------------------------------
_L = 16  # float32 lanes of a _simd vector
_PF = 16  # rows prefetched ahead by the column sums
_VEC_BLOCK = 4 * _L  # most channels per block: four vectors of accumulators


@numba.njit(inline="always", error_model="numpy")
def _term(x: np.ndarray, i: uint64, sq: bool, m):  # type: ignore[no-untyped-def]
    v = vload(x, i)
    if sq:
        d = vsub(v, m)
        return vmul(d, d)
    return v


@numba.njit(inline="always", error_model="numpy")
def _row_acc(x, i, nv, sq, m0, m1, m2, m3, a0, a1, a2, a3):  # type: ignore[no-untyped-def]
    """One row's nv (1-4) channel vectors at x[i:], added to a0..a3."""
    a0 = vadd(a0, _term(x, i, sq, m0))
    if nv > 1:
        a1 = vadd(a1, _term(x, i + uint64(_L), sq, m1))
    if nv > 2:
        a2 = vadd(a2, _term(x, i + uint64(2 * _L), sq, m2))
    if nv > 3:
        a3 = vadd(a3, _term(x, i + uint64(3 * _L), sq, m3))
    return a0, a1, a2, a3


@numba.njit(inline="always", error_model="numpy")
def _prefetch_row(x, i, nv):  # type: ignore[no-untyped-def]
    for v in range(nv):
        prefetch(x, i + uint64(v * _L))


@numba.njit(inline="always", error_model="numpy")
def _colsum_vec(x, R, C, c0, nv, four, sq, m0, m1, m2, m3):  # type: ignore[no-untyped-def]
    """Eigen's column sums (_eigen_sum_nhwc's order) of the nv channel vectors from c0 of
    flat x[R, C], or of (x - m)**2 with ``sq``: four row-interleaved accumulators per
    vector (rows j = k mod 4), combined ((a0+a1)+a2)+a3, then the leftover rows."""
    cc = uint64(C)
    z = vzeros(x)
    p0 = p1 = p2 = p3 = q0 = q1 = q2 = q3 = z
    r0 = r1 = r2 = r3 = s0 = s1 = s2 = s3 = z
    u = (R // 4) * 4 if four else 0
    for j in range(0, u, 4):
        i = uint64(j) * cc + uint64(c0)
        if j + _PF + 4 <= R:
            f = i + uint64(_PF) * cc
            for k in range(4):
                _prefetch_row(x, f + uint64(k) * cc, nv)
        p0, p1, p2, p3 = _row_acc(x, i, nv, sq, m0, m1, m2, m3, p0, p1, p2, p3)
        q0, q1, q2, q3 = _row_acc(x, i + cc, nv, sq, m0, m1, m2, m3, q0, q1, q2, q3)
        r0, r1, r2, r3 = _row_acc(x, i + 2 * cc, nv, sq, m0, m1, m2, m3, r0, r1, r2, r3)
        s0, s1, s2, s3 = _row_acc(x, i + 3 * cc, nv, sq, m0, m1, m2, m3, s0, s1, s2, s3)
    if four:
        p0 = vadd(vadd(vadd(p0, q0), r0), s0)
        p1 = vadd(vadd(vadd(p1, q1), r1), s1)
        p2 = vadd(vadd(vadd(p2, q2), r2), s2)
        p3 = vadd(vadd(vadd(p3, q3), r3), s3)
    for j in range(u, R):
        p0, p1, p2, p3 = _row_acc(x, uint64(j) * cc + uint64(c0), nv, sq, m0, m1, m2, m3,
                                  p0, p1, p2, p3)
    return p0, p1, p2, p3


@numba.njit(inline="always", error_model="numpy")
def _store4(out, i, nv, a0, a1, a2, a3):  # type: ignore[no-untyped-def]
    vstore(out, uint64(i), a0)
    if nv > 1:
        vstore(out, uint64(i + _L), a1)
    if nv > 2:
        vstore(out, uint64(i + 2 * _L), a2)
    if nv > 3:
        vstore(out, uint64(i + 3 * _L), a3)


@numba.njit(inline="always", error_model="numpy")
def _load4(a, i):  # type: ignore[no-untyped-def]
    """Four vectors from a[i:]; a has 4 * _L slack entries past its end (see _padded)."""
    return (vload(a, uint64(i)), vload(a, uint64(i + _L)), vload(a, uint64(i + 2 * _L)),
            vload(a, uint64(i + 3 * _L)))


def _padded(a: np.ndarray) -> np.ndarray:
    """A float32 copy of a [C] vector with 4 * _L zeros after it (whole-vector loads)."""
    out = np.zeros(a.size + 4 * _L, np.float32)
    out[: a.size] = a
    return out


@numba.njit(forceinline=True, error_model="numpy")
def _stats_block(x, R, C, c0, nv, four, inv, mean, var):  # type: ignore[no-untyped-def]
    """Mean and variance of the nv channel vectors from c0: two _colsum_vec passes.

    Inlined by LLVM at call sites that pass nv as a constant, so that the row loops
    carry no tests of nv (a run-time nv cost the passes about a fifth of their time).
    The gradient sums (_grad_sums_nhwc_vec) gained nothing from it: they are bound by
    reading half of every row on each thread, not by their arithmetic."""
    z = vzeros(x)
    a0, a1, a2, a3 = _colsum_vec(x, R, C, c0, nv, four, False, z, z, z, z)
    f = vfull(x, inv)
    m0, m1, m2, m3 = vmul(a0, f), vmul(a1, f), vmul(a2, f), vmul(a3, f)
    a0, a1, a2, a3 = _colsum_vec(x, R, C, c0, nv, four, True, m0, m1, m2, m3)
    _store4(mean, c0, nv, m0, m1, m2, m3)
    _store4(var, c0, nv, vmul(a0, f), vmul(a1, f), vmul(a2, f), vmul(a3, f))


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _stats_nhwc_vec(x: np.ndarray, R: int, C: int, cb: int, mean: np.ndarray,
                    var: np.ndarray) -> None:
    """_stats_nhwc for C % 16 == 0: blocks of cb (16-64) channels, registers only.
    mean and var have 4 * _L slack entries."""
    inv = _F32(1) / _F32(R)
    four = R >= 16
    for blk in prange((C + cb - 1) // cb):
        fz = ftz_enter()
        c0 = blk * cb
        nv = min(cb, C - c0) // _L
        if nv == 4:  # (constants: see _stats_block)
            _stats_block(x, R, C, c0, 4, four, inv, mean, var)
        elif nv == 3:
            _stats_block(x, R, C, c0, 3, four, inv, mean, var)
        elif nv == 2:
            _stats_block(x, R, C, c0, 2, four, inv, mean, var)
        else:
            _stats_block(x, R, C, c0, 1, four, inv, mean, var)
        ftz_exit(fz)


def _make_rows_vec(grad: bool, stream: bool, parallel: bool):  # type: ignore[no-untyped-def]
    """The elementwise pass on flat [R, C], C % 16 == 0, in parallel over row blocks:
    y = (x - a) * b + c (forward) or dx = a * ((dy - c) - (x - m) * b) (training
    gradient; with frozen statistics dx is written by the sums pass). a, b, c, m carry
    4 * _L slack entries. With ``stream`` the output (64-byte aligned) is written with
    non-temporal stores. ``parallel=False``: the single-threaded twin (see _pick)."""

    def rows(dy, x, R, C, a, b, c, m, out):  # type: ignore[no-untyped-def]
        nblk = (R + _ROWS - 1) // _ROWS
        for blk in prange(nblk):
            fz = ftz_enter()
            for j in range(blk * _ROWS, min(R, blk * _ROWS + _ROWS)):
                base = uint64(j) * uint64(C)
                for t in range(0, C, _L):
                    q = uint64(t)
                    i = base + q
                    if not grad:
                        vput(out, i, vadd(vmul(vsub(vload(x, i), vload(a, q)), vload(b, q)),
                                          vload(c, q)), stream)
                    else:
                        xc = vmul(vsub(vload(x, i), vload(m, q)), vload(b, q))
                        vput(out, i, vmul(vload(a, q), vsub(vsub(vload(dy, i), vload(c, q)),
                                                            xc)), stream)
            ftz_exit(fz)

    # A name per variant: Numba's cache key holds the closure's values (grad, stream) but
    # not the parallel flag, and a serial and a parallel twin must not share an entry.
    rows.__name__ = rows.__qualname__ = (
        f"_rows_vec_{'grad' if grad else 'fwd'}{'_nt' if stream else ''}"
        f"{'' if parallel else '_serial'}")
    return numba.njit(parallel=parallel, cache=True, error_model="numpy")(rows)


@numba.njit(inline="always", error_model="numpy")
def _span(kind, dy, x, out, s, e, a, b, c, m, stream):  # type: ignore[no-untyped-def]
    """The elementwise pass over one contiguous NCHW span out[s:e] with one channel's
    scalars: kind 0 y = (x - a) * b + c, kind 1 dx = a * ((dy - c) - (x - m) * b), kind 2
    dx = dy * a. Whole vectors from the first index that is a multiple of _L (out is
    64-byte aligned when ``stream``: non-temporal stores there), single values around."""
    va, vb, vc, vm = vfull(x, a), vfull(x, b), vfull(x, c), vfull(x, m)
    v0 = min(e, -(-s // _L) * _L)
    v1 = v0 + (e - v0) // _L * _L
    for i in range(s, v0):
        out[i] = _span1(kind, dy[i], x[i], a, b, c, m)
    for i in range(v0, v1, _L):
        q = uint64(i)
        if kind == 0:
            v = vadd(vmul(vsub(vload(x, q), va), vb), vc)
        elif kind == 1:
            v = vmul(va, vsub(vsub(vload(dy, q), vc), vmul(vsub(vload(x, q), vm), vb)))
        else:
            v = vmul(vload(dy, q), va)
        if stream:
            vstore_nt(out, q, v)
        else:
            vstore(out, q, v)
    for i in range(v1, e):
        out[i] = _span1(kind, dy[i], x[i], a, b, c, m)


@numba.njit(inline="always", error_model="numpy")
def _span1(kind, g, v, a, b, c, m):  # type: ignore[no-untyped-def]
    if kind == 0:
        return (v - a) * b + c
    if kind == 1:
        return a * ((g - c) - (v - m) * b)
    return g * a


_ROWS_VEC = {(g, s, p): _make_rows_vec(g, s, p)
             for g in (False, True) for s in (False, True) for p in (False, True)}
_STREAM_MIN_BYTES = STREAM_MIN_BYTES
"""Outputs this big are written with non-temporal stores (see the section comment)."""


def _streams(out: np.ndarray) -> bool:
    """Whether ``out`` (from aligned_empty) is written with non-temporal stores."""
    return out.nbytes >= _STREAM_MIN_BYTES and out.ctypes.data % 64 == 0


def _rows_vec(grad: bool, size: int, *args: object) -> None:
    """Run the elementwise pass (args end with the output, whose alignment and size
    decide streaming) threaded or not as _pick decides for other kernels."""
    stream = _streams(args[-1])  # type: ignore[arg-type]
    parallel = size >= _SERIAL_BELOW and num_threads() > 1
    kernel = _ROWS_VEC[grad, stream, parallel]
    (_dynamic(kernel) if parallel else kernel)(*args)


@numba.njit(inline="always", error_model="numpy")
def _grad_row(dy, x, i, m, kc, training, sb, ob, sx, dx, stream):  # type: ignore[no-untyped-def]
    """One channel vector of one row: the sums; with frozen statistics also dx = dy * kc
    (x_backprop needs no sum then, so it is written in the same pass)."""
    g = vload(dy, i)
    xc = vsub(vload(x, i), m)
    if training:
        sb = vadd(sb, vmul(g, vmul(xc, kc)))
    else:
        vput(dx, i, vmul(g, kc), stream)
    return sb, vadd(ob, g), vadd(sx, vmul(g, xc))


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _grad_sums_nhwc_vec(dy: np.ndarray, x: np.ndarray, R: int, C: int, cb: int, rb: int,
                        zb: bool, za: bool, mean: np.ndarray, kc: np.ndarray, training: bool,
                        sums: np.ndarray, dx: np.ndarray, stream: bool) -> None:
    """_grad_sums_nhwc for C % 16 == 0, same order (rows in sequence; partial sums over
    row blocks of ``rb`` added in order), the accumulators of up to four channel vectors
    (cb <= 64) in registers. ``kc``: rsqrt(var + eps) when training, else the x_backprop
    factor, and dx = dy * kc is written on the way. sums is flat [3, C + 4 * _L]; mean and
    kc have 4 * _L slack entries."""
    cc = uint64(C)
    st = uint64(C + 4 * _L)
    for blk in prange((C + cb - 1) // cb):
        fz = ftz_enter()
        c0 = blk * cb
        nv = min(cb, C - c0) // _L
        ms = _load4(mean, c0)
        ks = _load4(kc, c0)
        z = vzeros(x)
        tot = np.full(12 * _L, -0.0, np.float32)
        for seg in range(0, R, rb):
            a0 = b0 = d0 = a1 = b1 = d1 = a2 = b2 = d2 = a3 = b3 = d3 = z
            for j in range(seg, min(R, seg + rb)):
                i = uint64(j) * cc + uint64(c0)
                if j + _PF < R:
                    f = i + uint64(_PF) * cc
                    _prefetch_row(dy, f, nv)
                    _prefetch_row(x, f, nv)
                a0, b0, d0 = _grad_row(dy, x, i, ms[0], ks[0], training, a0, b0, d0,
                                        dx, stream)
                if nv > 1:
                    i1 = i + uint64(_L)
                    a1, b1, d1 = _grad_row(dy, x, i1, ms[1], ks[1], training, a1, b1, d1,
                                        dx, stream)
                if nv > 2:
                    i2 = i + uint64(2 * _L)
                    a2, b2, d2 = _grad_row(dy, x, i2, ms[2], ks[2], training, a2, b2, d2,
                                        dx, stream)
                if nv > 3:
                    i3 = i + uint64(3 * _L)
                    a3, b3, d3 = _grad_row(dy, x, i3, ms[3], ks[3], training, a3, b3, d3,
                                        dx, stream)
            part = (a0, b0, d0, a1, b1, d1, a2, b2, d2, a3, b3, d3)
            for k in range(12):
                q = uint64(k * _L)
                vstore(tot, q, vadd(vload(tot, q), part[k]))
            if _zero_follows(seg, rb, R, zb, za):
                for k in range(12):
                    q = uint64(k * _L)
                    vstore(tot, q, vadd(vload(tot, q), z))
        for v in range(nv):
            for k in range(3):
                vstore(sums, uint64(k) * st + uint64(c0 + v * _L),
                       vload(tot, uint64((3 * v + k) * _L)))
        ftz_exit(fz)


# Small problems run the same kernels compiled without threads: waking a thread pool
# costs more than the work (and, on a loaded machine, a whole scheduler time slice).
_SERIAL_BELOW = 1 << 16  # elements of x
_serial: dict[str, object] = {}


def _pick(kernel: object, size: int, units: int) -> object:
    """``kernel`` itself, or its single-threaded twin when ``size`` elements are few or
    there are fewer than two parallel units (channel blocks or channels)."""
    if size >= _SERIAL_BELOW and units > 1 and num_threads() > 1:
        return _dynamic(kernel)
    py = kernel.py_func  # type: ignore[attr-defined]
    fn = _serial.get(py.__name__)
    if fn is None:
        # A renamed copy of the Python function: Numba's cache is per qualified name and
        # does not key on the parallel flag.
        twin = pytypes.FunctionType(py.__code__, py.__globals__, py.__name__ + "_serial",
                                    py.__defaults__, py.__closure__)
        twin.__qualname__ = py.__qualname__ + "_serial"
        fn = _serial[py.__name__] = numba.njit(cache=True, error_model="numpy")(twin)
    return fn


def _channel_block(C: int, most: int = _SLOT) -> int:
    """Channels per NHWC column-sum block: as wide as possible (whole rows stream from
    memory), narrow enough to give every thread a block. The sums do not depend on it."""
    cb = -(-C // max(num_threads(), 1))
    return int(min(most, max(16, -(-cb // 16) * 16)))


def _dynamic(kernel: object) -> object:
    """Run a parallel kernel with chunks of one iteration handed out on demand, so that a
    thread that is descheduled (a busy machine) does not hold the others up."""

    def run(*args: object) -> None:
        old = numba.get_parallel_chunksize()
        numba.set_parallel_chunksize(1)
        try:
            kernel(*args)  # type: ignore[operator]
        finally:
            numba.set_parallel_chunksize(old)

    return run


def _f32_flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1)


def _vec(a: np.ndarray) -> np.ndarray:
    return np.array(a, np.float32).reshape(-1)


def _layout(x: np.ndarray, channel_last: bool) -> tuple[int, int, int]:
    """(N, C, S) with rows j = n*S + s; NHWC is N = R rows of S = 1."""
    if channel_last:
        c = x.shape[-1]
        return (x.size // c if c else 0), c, 1
    n, c = x.shape[0], x.shape[1]
    return n, c, int(np.prod(x.shape[2:]))


def forward(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, mean: np.ndarray,
            variance: np.ndarray, eps: float, factor: float, channel_last: bool,
            is_training: bool) -> tuple[np.ndarray, ...]:
    """FusedBatchNorm on a non-empty x: (y, batch_mean, batch_variance, saved mean,
    saved variance). The caller sets TF's FTZ / DAZ and silences NumPy's inf / NaN
    warnings (results here, as in TF)."""
    N, C, S = _layout(x, channel_last)
    R = N * S
    xf = _f32_flat(x)
    vec = channel_last and C % _L == 0
    yf = aligned_empty((xf.size,), np.dtype(np.float32))
    # Small vectors are always fresh writable copies: one compiled specialization.
    m = np.empty(C, np.float32) if is_training else np.array(mean, np.float32).reshape(-1)
    v = np.empty(C, np.float32) if is_training else np.array(variance, np.float32).reshape(-1)
    args = (_vec(scale), _vec(offset), m, v, np.float32(eps), bool(is_training), yf)
    if vec:
        if is_training:
            cb = _channel_block(C, _VEC_BLOCK)
            mp, vp = _padded(m), _padded(v)
            _pick(_stats_nhwc_vec, xf.size, -(-C // cb))(xf, R, C, cb, mp, vp)
            m[:], v[:] = mp[:C], vp[:C]
        sf = eigen_rsqrt(v + np.float32(eps), C) * args[0]
        mp = _padded(m)
        _rows_vec(False, xf.size, xf, xf, R, C, mp, _padded(sf), _padded(args[1]), mp, yf)
    elif channel_last:
        cb = _channel_block(C)
        if is_training:
            _pick(_stats_nhwc, xf.size, -(-C // cb))(xf, R, C, cb, m, v)
        sf = eigen_rsqrt(v + np.float32(eps), max(C, 1)) * args[0]
        _pick(_affine_rows, xf.size, R)(xf, R, C, m, sf, args[1], yf)
    else:
        _pick(_fwd_nchw, xf.size, -(-C // 8))(xf, N, C, S, *args, _streams(yf))
    y = yf.reshape(x.shape)
    if x.dtype != np.float32:
        y = y.astype(x.dtype)  # float16 overflows to inf, as TF's cast
    if not is_training:
        return y, m, v, m, v
    adj = np.float32(R) / np.float32(max(R - 1, 1))
    f = np.float32(factor)
    if f == np.float32(1):
        return y, m, v * adj, m, v
    om = np.float32(1) - f
    bm = om * _f32_flat(mean) + f * m
    bv = om * _f32_flat(variance) + (f * adj) * v
    return y, bm, bv, m, v


def grad(dy: np.ndarray, x: np.ndarray, scale: np.ndarray, mean: np.ndarray, var: np.ndarray,
         eps: float, channel_last: bool, is_training: bool,
         row_block: int, zero_between: bool, zero_after: bool) -> tuple[np.ndarray, ...]:
    """FusedBatchNormGrad on a non-empty x with R > 1 rows: (x_backprop, scale_backprop,
    offset_backprop). ``row_block``, ``zero_between``, ``zero_after``: TF's thread
    split of the sums (ops.batch_norm.redux_plan). The caller sets FTZ / DAZ and
    silences NumPy's warnings, as for forward."""
    N, C, S = _layout(x, channel_last)
    R = N * S
    zb, za = bool(zero_between), bool(zero_after)
    a = _vec(var) + np.float32(eps)
    if is_training:
        c0s = eigen_rsqrt(a, GRAD_SCALE_TILE)
        c0d = eigen_rsqrt(a, GRAD_DX_TILE)
    else:
        c0s = c0d = eigen_rsqrt(a, max(C, 1))  # evaluated once, as a [C] vector
    dyf = _f32_flat(dy)
    xf = _f32_flat(x)
    vec = channel_last and C % _L == 0
    dxf = aligned_empty((xf.size,), np.dtype(np.float32))
    sb = np.empty(C, np.float32)
    ob = np.empty(C, np.float32)
    args = (_vec(scale), _vec(mean), c0s, c0d, bool(is_training), dxf, sb, ob)
    if not channel_last:
        _pick(_grad_nchw, xf.size, -(-C // 8))(dyf, xf, N, C, S, row_block, zb, za, *args,
                                               _streams(dxf))
    else:
        if vec:
            cb = _channel_block(C, _VEC_BLOCK)
            sp = np.empty((3, C + 4 * _L), np.float32)
            # with frozen statistics dx = dy * (rsqrt(var + eps) * scale) in this pass
            kc = c0s if is_training else c0d * args[0]
            _pick(_grad_sums_nhwc_vec, xf.size, -(-C // cb))(
                dyf, xf, R, C, cb, row_block, zb, za, _padded(args[1]), _padded(kc),
                bool(is_training), sp.reshape(-1), dxf, not is_training and _streams(dxf))
            sums = sp[:, :C]
        else:
            sums = np.empty((3, C), np.float32)
            cb = _channel_block(C)
            _pick(_grad_sums_nhwc, xf.size, -(-C // cb))(dyf, xf, R, C, cb, row_block, zb, za,
                                                         args[1], c0s, bool(is_training), sums)
        ob[:] = sums[1]
        # the same float32 operations as _grad_nchw
        if is_training:
            sb[:] = sums[0]
            f1 = args[0] * c0d  # TF's coef1
            f2 = (c0d * c0d) * (sums[2] / np.float32(R))  # coef2
            f3 = sums[1] * (np.float32(1) / np.float32(R))  # mean of y_backprop
        else:
            sb[:] = sums[2] * c0d
            f1 = c0d * args[0]
            f2 = f3 = f1
        if vec:
            if is_training:
                _rows_vec(True, xf.size, dyf, xf, R, C, _padded(f1), _padded(f2), _padded(f3),
                          _padded(args[1]), dxf)
        else:
            _pick(_dx_rows, xf.size, R)(dyf, xf, R, C, f1, f2, f3, args[1],
                                        bool(is_training), dxf)
    dx = dxf.reshape(x.shape)
    if x.dtype != np.float32:
        dx = dx.astype(x.dtype)
    return dx, sb, ob
