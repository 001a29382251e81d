"""Fused Numba kernels for FusedBatchNorm{,V2,V3}: the batch statistics and y. The
gradient's kernels are in ``batch_norm_grad``, what both share in ``batch_norm_common``;
``tfgrad.dispatch.batch_norm`` runs them.

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
  ``tfgrad._tf.eigen.redux_plan``).

Both orders are per channel, so the sums are parallel over channels and never split rows;
each thread owns its channels' accumulators, and the elementwise passes (y, x_backprop)
are parallel over anything. Passes over the data:

- NHWC: the sums run over blocks of channels, one per thread (whole rows on one thread;
  the forward's second pass over a block follows the first); y / x_backprop are written
  in a second kernel, parallel over blocks of rows with whole rows in the inner loop.
  Forward: 3 reads of x (2 by block) and 1 write; gradient: 2 reads of dy and x, 1 write.
  With C a multiple of 16 (the usual case) these are register-blocked vector kernels
  with software prefetch and non-temporal output stores (``batch_norm_common``'s
  section "NHWC with C a multiple of 16"); other C take the scalar-loop kernels.
- NCHW: eight channels at a time, their sums then the write pass while their values are
  in cache; the write pass in whole vectors (``span``), non-temporal for large outputs.
  The sums put one channel in each lane of an eight-lane vector: eight positions of
  eight channels are loaded and transposed in registers (``_simd.vload8_t``), so each
  lane adds its channel's rows in TF's order (``_eigen_sum8``,
  ``batch_norm_grad._nchw_sums8``): much faster than scalar chains over a few channels.
  Eight, not sixteen: sixteen channels of dy and x are 32 concurrent memory streams, more
  than the hardware prefetchers follow.
  A last group of fewer than eight channels sums the lanes of the last eight and writes
  only its own; C < 8 keeps scalar chains.

Denormals: TF runs these kernels with FTZ and DAZ set (``tfgrad._tf.fpenv``). The op sets
them on the calling thread; every parallel loop body sets them on its own (Numba's)
thread with ``ftz_enter`` and restores that thread's MXCSR with ``ftz_exit``.

No temporary the size of x is allocated for float32; float16 / bfloat16 inputs are
converted to a float32 copy (Numba has no half types). Each threaded kernel is a
``tfgrad._compile.Twins``: small problems run its single-threaded twin.
"""

from __future__ import annotations

import numpy as np
from numba import boolean, int64, prange, uint64

from .._compile import Twins, inline, jit
from .._tf.mxcsr import ftz_enter, ftz_exit
from .._tf.rsqrt import rsqrt_channel
from ._simd import (
    prefetch,
    vadd,
    vfull,
    vfull8,
    vgather8,
    vlane,
    vload,
    vload8_t,
    vmul,
    vstore,
    vsub,
    vzeros,
)
from .batch_norm_common import PF, ROWS, SLOT, L, image_span, span

_F32 = np.float32


# --------------------------------------------------------------------------------------
# Column sums, NHWC. Arrays are flat; indices are formed as uint64 so that Numba emits no
# negative-index wraparound and LLVM vectorizes the channel loops.
# --------------------------------------------------------------------------------------
@jit
def _eigen_sum_nhwc(x: np.ndarray, R: int, C: int, cs: int, ce: int, four: bool,
                    center: np.ndarray, out: np.ndarray) -> None:
    """out[t] = Eigen colsum over the R rows of x[:, cs+t] (x flat [R, C]); of
    (x - center[t])**2 when center has entries. ``four``: the four-accumulator order.

    The four accumulators and the centre share one buffer: with a single base pointer
    LLVM's runtime alias checks stay few enough for it to vectorize the channel loop."""
    w = ce - cs
    sq = center.shape[0] > 0
    # [a0 | a1 | a2 | a3 | center] in slots of SLOT >= w: constant distances let LLVM
    # prove that the slots do not overlap.
    buf = np.zeros(5 * SLOT, np.float32)
    if sq:
        for t in range(w):
            buf[4 * SLOT + t] = center[t]
    c1, c2, c3 = uint64(C), uint64(2 * C), uint64(3 * C)
    w1, w2, w3, w4 = uint64(SLOT), uint64(2 * SLOT), uint64(3 * SLOT), uint64(4 * SLOT)
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
            buf[t] = ((buf[t] + buf[t + SLOT]) + buf[t + 2 * SLOT]) + buf[t + 3 * SLOT]
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


@Twins
def stats_nhwc(x: np.ndarray, R: int, C: int, cb: int, mean: np.ndarray,
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


@Twins
def affine_rows(x: np.ndarray, R: int, C: int, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                 y: np.ndarray) -> None:
    """y = (x - a) * b + c per channel on flat [R, C], in parallel over row blocks."""
    for blk in prange((R + ROWS - 1) // ROWS):
        fz = ftz_enter()
        for j in range(blk * ROWS, min(R, blk * ROWS + ROWS)):
            base = uint64(j * C)
            for t in range(C):
                i = base + uint64(t)
                q = uint64(t)
                y[i] = (x[i] - a[q]) * b[q] + c[q]
        ftz_exit(fz)


@jit
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


@inline
def _term8(v, m, sq):  # type: ignore[no-untyped-def]
    if sq:
        d = vsub(v, m)
        return vmul(d, d)
    return v


@inline
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


@jit
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
        base, q, e = image_span(j, u, C, S, c)
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
        base, q, e = image_span(j, R, C, S, c)
        for p in range(q, e):
            t = vadd(t, _term8(vgather8(x, base + p, S), m, sq))
        j += e - q
    return t


@Twins
def fwd_nchw(x: np.ndarray, N: int, C: int, S: int, scale: np.ndarray, offset: np.ndarray,
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
            sf = rsqrt_channel(var[c] + eps, c < k8) * scale[c]
            mc = m[c - lo]
            for n in range(N):
                b = (n * C + c) * S
                span(0, x, x, y, b, b + S, mc, sf, offset[c], mc, stream)
        ftz_exit(fz)


@inline
def _term(x: np.ndarray, i: uint64, sq: bool, m):  # type: ignore[no-untyped-def]
    v = vload(x, i)
    if sq:
        d = vsub(v, m)
        return vmul(d, d)
    return v


@inline
def _row_acc(x, i, nv, sq, m0, m1, m2, m3, a0, a1, a2, a3):  # type: ignore[no-untyped-def]
    """One row's nv (1-4) channel vectors at x[i:], added to a0..a3. (Numba's inlining,
    not LLVM's: inlined by LLVM, it compiled 0.5 s faster but LLVM then loaded each row's
    first 64 bytes last, and the four-vector sums ran ~10% slower from memory.)"""
    a0 = vadd(a0, _term(x, i, sq, m0))
    if nv > 1:
        a1 = vadd(a1, _term(x, i + uint64(L), sq, m1))
    if nv > 2:
        a2 = vadd(a2, _term(x, i + uint64(2 * L), sq, m2))
    if nv > 3:
        a3 = vadd(a3, _term(x, i + uint64(3 * L), sq, m3))
    return a0, a1, a2, a3


@inline
def _prefetch_vecs(x, i, nv):  # type: ignore[no-untyped-def]
    """prefetch_row without a loop: tests of nv that LLVM folds where nv is a constant
    after inlining (a loop over a run-time nv stays partly rolled)."""
    prefetch(x, i)
    if nv > 1:
        prefetch(x, i + uint64(L))
    if nv > 2:
        prefetch(x, i + uint64(2 * L))
    if nv > 3:
        prefetch(x, i + uint64(3 * L))


@inline(force=True)
def _colsum_vec(x, R, C, c0, nv, four, sq, m0, m1, m2, m3):  # type: ignore[no-untyped-def]
    """Eigen's column sums (_eigen_sum_nhwc's order) of the nv channel vectors from c0 of
    flat x[R, C], or of (x - m)**2 with ``sq``: four row-interleaved accumulators per
    vector (rows j = k mod 4), combined ((a0+a1)+a2)+a3, then the leftover rows.

    Compiled once, nv and sq at run time; LLVM inlines it where they are constants (see
    _stats_block)."""
    cc = uint64(C)
    z = vzeros(x)
    p0 = p1 = p2 = p3 = q0 = q1 = q2 = q3 = z
    r0 = r1 = r2 = r3 = s0 = s1 = s2 = s3 = z
    u = (R // 4) * 4 if four else 0
    for j in range(0, u, 4):
        i = uint64(j) * cc + uint64(c0)
        if j + PF + 4 <= R:
            f = i + uint64(PF) * cc
            for k in range(4):
                _prefetch_vecs(x, f + uint64(k) * cc, nv)
        p0, p1, p2, p3 = _row_acc(x, i, nv, sq, m0, m1, m2, m3, p0, p1, p2, p3)
        q0, q1, q2, q3 = _row_acc(x, i + cc, nv, sq, m0, m1, m2, m3, q0, q1, q2, q3)
        r0, r1, r2, r3 = _row_acc(x, i + uint64(2) * cc, nv, sq, m0, m1, m2, m3, r0, r1, r2, r3)
        s0, s1, s2, s3 = _row_acc(x, i + uint64(3) * cc, nv, sq, m0, m1, m2, m3, s0, s1, s2, s3)
    if four:
        p0 = vadd(vadd(vadd(p0, q0), r0), s0)
        p1 = vadd(vadd(vadd(p1, q1), r1), s1)
        p2 = vadd(vadd(vadd(p2, q2), r2), s2)
        p3 = vadd(vadd(vadd(p3, q3), r3), s3)
    for j in range(u, R):
        p0, p1, p2, p3 = _row_acc(x, uint64(j) * cc + uint64(c0), nv, sq, m0, m1, m2, m3,
                                  p0, p1, p2, p3)
    return p0, p1, p2, p3


@inline
def _store4(out, i, nv, a0, a1, a2, a3):  # type: ignore[no-untyped-def]
    vstore(out, uint64(i), a0)
    if nv > 1:
        vstore(out, uint64(i + L), a1)
    if nv > 2:
        vstore(out, uint64(i + 2 * L), a2)
    if nv > 3:
        vstore(out, uint64(i + 3 * L), a3)


@inline(force=True)
def _stats_block(x, R, C, c0, nv, four, inv, mean, var):  # type: ignore[no-untyped-def]
    """Mean and variance of the nv channel vectors from c0: two _colsum_vec passes.

    Inlined by LLVM at call sites that pass nv as a constant, so that the row loops
    carry no tests of nv (a run-time nv cost the passes about a fifth of their time).
    The gradient sums (grad_sums_nhwc_vec) gained nothing from it: they are bound by
    reading half of every row on each thread, not by their arithmetic.

    nv and sq reach _stats_block and _colsum_vec as run-time values (int64(4),
    boolean(False)): Numba compiles each of them once and LLVM folds the constants
    after inlining. A literal (4, False) would make Numba compile a copy per value
    (with its inlined IR copied each time: 5 s of CPU each)."""
    z = vzeros(x)
    a0, a1, a2, a3 = _colsum_vec(x, R, C, c0, nv, four, boolean(False), z, z, z, z)
    f = vfull(x, inv)
    m0, m1, m2, m3 = vmul(a0, f), vmul(a1, f), vmul(a2, f), vmul(a3, f)
    a0, a1, a2, a3 = _colsum_vec(x, R, C, c0, nv, four, boolean(True), m0, m1, m2, m3)
    _store4(mean, c0, nv, m0, m1, m2, m3)
    _store4(var, c0, nv, vmul(a0, f), vmul(a1, f), vmul(a2, f), vmul(a3, f))


@Twins
def stats_nhwc_vec(x: np.ndarray, R: int, C: int, cb: int, mean: np.ndarray,
                    var: np.ndarray) -> None:
    """stats_nhwc for C % 16 == 0: blocks of cb (16-64) channels, registers only.
    mean and var have 4 * L slack entries."""
    inv = _F32(1) / _F32(R)
    four = R >= 16
    for blk in prange((C + cb - 1) // cb):
        fz = ftz_enter()
        c0 = blk * cb
        nv = min(cb, C - c0) // L
        if nv == 4:  # (constants, not literals: see _stats_block)
            _stats_block(x, R, C, c0, int64(4), four, inv, mean, var)
        elif nv == 3:
            _stats_block(x, R, C, c0, int64(3), four, inv, mean, var)
        elif nv == 2:
            _stats_block(x, R, C, c0, int64(2), four, inv, mean, var)
        else:
            _stats_block(x, R, C, c0, int64(1), four, inv, mean, var)
        ftz_exit(fz)
