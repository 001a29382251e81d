"""The batch-norm gradient's kernels (FusedBatchNormGrad{,V2,V3}): the column sums in
TF's ``ReduceOuterDimensions`` order (rows in sequence, in TF's row blocks; see
``tfgrad.kernels.batch_norm`` for the layouts and passes), then x_backprop."""

from __future__ import annotations

import numpy as np
from numba import prange, uint64

from .._compile import Twins, inline, jit
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._simd import vadd, vfull8, vgather8, vlane, vload, vload8_t, vmul, vput, vstore, vsub, vzeros
from .batch_norm_common import PF, ROWS, SLOT, L, image_span, prefetch_row, span

_F32 = np.float32


@inline
def _zero_follows(seg: int, rb: int, R: int, zb: bool, za: bool) -> bool:
    """Whether TF adds an untouched (+0) partial-sum buffer after the partial sum of rows
    [seg, seg + rb): ``zb`` after all but the last, ``za`` after the last
    (``tfgrad._tf.eigen.redux_plan``)."""
    return za if seg + rb >= R else zb


@Twins
def grad_sums_nhwc(dy: np.ndarray, x: np.ndarray, R: int, C: int, cb: int, rb: int,
                    zb: bool, za: bool, mean: np.ndarray, c0s: np.ndarray, training: bool,
                    sums: np.ndarray) -> None:
    """The gradient's column sums on flat [R, C] into sums[3, C] = (sum dy*(xc*c0s) [training
    only], sum dy, sum dy*xc), in parallel over blocks of ``cb <= SLOT`` channels: rows in
    sequence, partial sums over row blocks of ``rb`` added in order (see _nchw_sums1)."""
    nblk = (C + cb - 1) // cb
    for blk in prange(nblk):
        fz = ftz_enter()
        c0 = blk * cb
        c1 = min(C, c0 + cb)
        w = c1 - c0
        w1, w2, w3, w4 = uint64(SLOT), uint64(2 * SLOT), uint64(3 * SLOT), uint64(4 * SLOT)
        # [p_sb | p_ob | p_sx | mean | c0s] in slots of SLOT (see batch_norm._eigen_sum_nhwc)
        buf = np.zeros(5 * SLOT, np.float32)
        tot = np.full(3 * SLOT, -0.0, np.float32)  # -0 + p is p: the first passes
        for t in range(w):
            buf[3 * SLOT + t] = mean[c0 + t]
            buf[4 * SLOT + t] = c0s[c0 + t]
        for seg in range(0, R, rb):
            buf[: 3 * SLOT] = 0
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
            for t in range(3 * SLOT):
                tot[t] += buf[t]
            if _zero_follows(seg, rb, R, zb, za):
                for t in range(3 * SLOT):
                    tot[t] += _F32(0)
        for q in range(3):
            for t in range(w):
                sums[q, c0 + t] = tot[q * SLOT + t]
        ftz_exit(fz)


@Twins
def dx_rows(dy: np.ndarray, x: np.ndarray, R: int, C: int, f1: np.ndarray, f2: np.ndarray,
             f3: np.ndarray, m: np.ndarray, training: bool, dx: np.ndarray) -> None:
    """x_backprop on flat [R, C] in parallel over row blocks: f1*((dy - f3) - (x - m)*f2)
    (training; TF's coef1, coef2 and mean of dy) or dy*f1 (frozen statistics)."""
    for blk in prange((R + ROWS - 1) // ROWS):
        fz = ftz_enter()
        for j in range(blk * ROWS, min(R, blk * ROWS + ROWS)):
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


@jit
def _nchw_sums1(dy: np.ndarray, x: np.ndarray, N: int, C: int, S: int, rb: int,
                zb: bool, za: bool, c: int, m: np.float32, k: np.float32, training: bool,
                out: np.ndarray) -> None:
    """Grad sums of one channel of flat [N, C, S] over rows j = n*S + s in sequence (row
    blocks of ``rb`` summed separately from +0, then added in order) into out[0:3]. The
    total starts at -0, which passes the first block's sum through unchanged as TF's
    combine does (a sum flushed to -0 stays -0); +0 is added after a block where TF adds
    an untouched buffer there (``zb``, ``za``: tfgrad._tf.eigen.redux_plan)."""
    R = N * S
    t_sb = t_ob = t_sx = _F32(-0.0)
    for seg in range(0, R, rb):
        p_sb = p_ob = p_sx = _F32(0)
        j = seg
        stop = min(R, seg + rb)
        while j < stop:
            b, s, e = image_span(j, stop, C, S, c)
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


@inline
def _sums8_row(g, v, m, k, training, a, b, d):  # type: ignore[no-untyped-def]
    """One row of eight channels (a lane each): _nchw_sums1's updates."""
    xc = vsub(v, m)
    if training:
        a = vadd(a, vmul(g, vmul(xc, k)))
    return a, vadd(b, g), vadd(d, vmul(g, xc))


@jit
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
            base, s, e = image_span(j, stop, C, S, c)
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


@Twins
def grad_nchw(dy: np.ndarray, x: np.ndarray, N: int, C: int, S: int, rb: int,
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
                    span(1, dy, x, dx, b, b + S, f1, f2, f3, m, stream)
            else:
                sb[c] = sums[q + 2] * c0d[c]
                f1 = c0d[c] * scale[c]
                for n in range(N):
                    b = (n * C + c) * S
                    span(2, dy, x, dx, b, b + S, f1, f1, f1, f1, stream)
        ftz_exit(fz)


@inline
def _load4(a, i):  # type: ignore[no-untyped-def]
    """Four vectors from a[i:]; a has 4 * L slack entries past its end (zeros:
    ``tfgrad.dispatch.batch_norm``'s [C] rows)."""
    return (vload(a, uint64(i)), vload(a, uint64(i + L)), vload(a, uint64(i + 2 * L)),
            vload(a, uint64(i + 3 * L)))


@inline
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


@Twins
def grad_sums_nhwc_vec(dy: np.ndarray, x: np.ndarray, R: int, C: int, cb: int, rb: int,
                        zb: bool, za: bool, mean: np.ndarray, kc: np.ndarray, training: bool,
                        sums: np.ndarray, dx: np.ndarray, stream: bool) -> None:
    """grad_sums_nhwc for C % 16 == 0, same order (rows in sequence; partial sums over
    row blocks of ``rb`` added in order), the accumulators of up to four channel vectors
    (cb <= 64) in registers. ``kc``: rsqrt(var + eps) when training, else the x_backprop
    factor, and dx = dy * kc is written on the way. sums is flat [3, C + 4 * L]; mean and
    kc have 4 * L slack entries."""
    cc = uint64(C)
    st = uint64(C + 4 * L)
    for blk in prange((C + cb - 1) // cb):
        fz = ftz_enter()
        c0 = blk * cb
        nv = min(cb, C - c0) // L
        ms = _load4(mean, c0)
        ks = _load4(kc, c0)
        z = vzeros(x)
        tot = np.full(12 * L, -0.0, np.float32)
        for seg in range(0, R, rb):
            a0 = b0 = d0 = a1 = b1 = d1 = a2 = b2 = d2 = a3 = b3 = d3 = z
            for j in range(seg, min(R, seg + rb)):
                i = uint64(j) * cc + uint64(c0)
                if j + PF < R:
                    f = i + uint64(PF) * cc
                    prefetch_row(dy, f, nv)
                    prefetch_row(x, f, nv)
                a0, b0, d0 = _grad_row(dy, x, i, ms[0], ks[0], training, a0, b0, d0,
                                        dx, stream)
                if nv > 1:
                    i1 = i + uint64(L)
                    a1, b1, d1 = _grad_row(dy, x, i1, ms[1], ks[1], training, a1, b1, d1,
                                        dx, stream)
                if nv > 2:
                    i2 = i + uint64(2 * L)
                    a2, b2, d2 = _grad_row(dy, x, i2, ms[2], ks[2], training, a2, b2, d2,
                                        dx, stream)
                if nv > 3:
                    i3 = i + uint64(3 * L)
                    a3, b3, d3 = _grad_row(dy, x, i3, ms[3], ks[3], training, a3, b3, d3,
                                        dx, stream)
            part = (a0, b0, d0, a1, b1, d1, a2, b2, d2, a3, b3, d3)
            for k in range(12):
                q = uint64(k * L)
                vstore(tot, q, vadd(vload(tot, q), part[k]))
            if _zero_follows(seg, rb, R, zb, za):
                for k in range(12):
                    q = uint64(k * L)
                    vstore(tot, q, vadd(vload(tot, q), z))
        for v in range(nv):
            for k in range(3):
                vstore(sums, uint64(k) * st + uint64(c0 + v * L),
                       vload(tot, uint64((3 * v + k) * L)))
        ftz_exit(fz)
