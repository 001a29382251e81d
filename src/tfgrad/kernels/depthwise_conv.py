"""Fused Numba kernels for depthwise convolution (NHWC, any stride / dilation / padding).

Every output element is accumulated in TF's order (docs/depthwise_conv.md; the NumPy
reference is in ``tfgrad.ops.depthwise_conv``);
the loops vectorise across contiguous (pixel, lane) runs, never across an element's own
terms. No im2col buffer and no pass over a whole tensor per tap:

- forward: one task per output row; each filter row's taps are applied 4 at a time
  (``_mac``: the accumulator stays in a register across the 4 products, each product
  and each sum rounded as TF's mul-then-add) over the run of output pixels where all 4
  fall inside the input; border pixels take their taps one by one (padding taps compute
  ``0 * w``). Strides > 1 and multipliers > 1 first split / expand the few input rows an
  output row needs into a per-task buffer (pixels by phase modulo the stride, channels
  repeated M times) so that each tap's pixels are one contiguous run.
- BackpropInput: one task per input row, accumulators split by pixel phase; only the
  taps that reach an out_backprop value are computed when the filter is finite (a miss
  adds ``w * 0 = +-0``, a no-op except on a flushed -0: the task marks its row when it
  writes a -0, and ``_redo_negzero`` recomputes those elements with every tap); a
  filter with inf / NaN takes the plain kernel that computes every ``w * 0``. Then the
  multiplier reduction in TF's packet order.
- BackpropFilter: one task per image (or per image and channel block when there are
  fewer images than threads); each tap's accumulators take ``g * x`` over the output
  positions in row-major order, 4 positions at a time; the per-image sums are then
  added in batch order.

Filter sizes 1x1, 2x2, 3x3, 5x5 and 7x7 in float32 / float64 take register-blocked
kernels instead (compiled per filter size, so the taps unroll): four output pixels' lane
vectors (``_simd``: 16 float32 / 8 float64 lanes) stay in registers across all taps, the
stride-1 forward and BackpropInput slide their input / out_backprop columns through
registers, and the next row's input is prefetched (without it a thread stalls on memory
for much of its time). BackpropInput takes the border pixels four at a time too, a
missed tap adding w * 0 (a no-op for a finite filter but on a -0, see above), so only
the last W mod 4 pixels of a phase go one by one; the integer minimum of a block's
stored vectors' bits (``vmin_bits``) tells whether it wrote a -0 (see _negzero). The
BackpropFilter one holds the tap accumulators of up to three filter rows (21 vectors; on
AVX2, where a vector is two of 16 registers, as many rows as keep 9 of them: one for
5x5; on AVX-512 all five rows of a 5x5 filter, 25 vectors, where they are all inside)
in registers over an output row, so each out_backprop vector is loaded once per group
of filter rows, and prefetches the next output row's lines. Where a pixel is exactly two
lane vectors (C * M = 32 float32 / 16 float64) and both vectors' accumulators fit (3x3
and smaller on AVX-512), one sweep takes the pair: each input row passes through L1 once
per output row, not once per lane vector (pairing the vectors of wider pixels was slower).
Multipliers M > 1 expand each input row once into a ring with every channel repeated M
times (and BackpropInput reduces over the multiplier per pixel); both loops vectorise
for M = 2. When M = 2 and C * M is whole lane vectors the forward's ring is blocked by
lane vector (``_row_offset_blocked``: a lane vector's pixels in consecutive lines) and
each output row's 4-pixel blocks go lane vector by lane vector, so the lines one sweep
reads stay in L1 from block to block; in the pixel-major layout a block's 8 pixels x 5
rows of every lane vector fill L1 and the 768-byte pixel stride defeats the prefetchers.
(M = 3 or 4 keep the pixel-major ring: blocked, their expansion goes lane by lane and
costs more than the layout saves.) BackpropFilter, which sweeps lane vector by lane
vector anyway, reads its M = 2 input rows from the same blocked ring (M = 1 keeps x's
own layout, where the ring's extra index arguments cost more than they save).
BackpropInput with M > 1 reads its out_backprop rows from such a ring too (a reorder of
g's rows, nothing repeated) and sweeps the same way; that sweep over the pixel-major
rows, without the ring, is slower, and for M = 1 a ring (with a row buffer) is no faster
at stride 1 and slower at stride 2. With M = 2 on an even number of lane vectors
(AVX-512) its blocks take two lane vectors at once and add each pixel's multiplier pairs
themselves (``vpairsum``), writing the output directly instead of through a per-lane
scratch and a pass over it. Each element's arithmetic is the same as in the kernels
above. The forward and BackpropInput ones (M = 1, and M = 2's
pair blocks) write outputs of 4 MiB or more whose pixels are whole 64-byte lines with
non-temporal stores (``_simd.stream_output``): no read-for-ownership of lines that are
only written, a third of a stride-1 op's traffic.

float16 / bfloat16 run on float32 copies of the inputs (exact) with ``mode`` 1 / 2
rounding to the half type after every step (one term at a time), as Eigen's half packets
do; the results are then exactly representable in T.

Threads: the kernels are ``njit(nogil=True, cache=True)`` functions that claim chunks
of tasks (output or input rows, or images) from a shared counter until none is left
(``_pool.claim``), run at once on the calling thread and on ``numba.get_num_threads() -
1`` pool threads (``_pool``), instead of ``parallel=True`` loops: on a loaded machine
Numba's OpenMP layer splits the work statically and ends on a barrier that waits for a
descheduled thread. Ops under 1M multiply-adds run on the calling thread alone: waking a
pool thread costs more than they take. No result depends on the chunking or the thread
count. (Measurements: benchmarks/RESULTS.md.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .._compile import num_threads
from ..ops.depthwise_conv import gap_turns_plus
from ._pool import claim
from ._pool import run as _pool_run
from ._simd import (
    HOST_AVX512,
    STREAM_MIN_BYTES,
    aligned_empty,
    aligned_scratch,
    nlanes,
    prefetch,
    stream_output,
    vhas_negzero,
    vload,
    vload_dup2,
    vmin_bits,
    vmuladd,
    vpairsum,
    vput,
    vstore,
    vzeros,
    vzeros_opaque,
    zero_opaque,
)

if TYPE_CHECKING:
    from ..ops.depthwise_conv import Geometry

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_HALF = np.float32(0.5)
NONE, F16, BF16 = 0, 1, 2


@intrinsic
def _bits(typingctx, x):  # type: ignore[no-untyped-def]
    """The bits of a float32 as uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _float(typingctx, u):  # type: ignore[no-untyped-def]
    """The float32 whose bits are the low 32 bits of the integer u."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = args[0]
        if u.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif u.bitwidth < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(u), codegen


@njit(inline="always")
def _round(v, mode):  # type: ignore[no-untyped-def]
    """v rounded to float16 (mode 1) or bfloat16 (mode 2), nearest-even, as float32."""
    f = np.float32(v)
    u = _bits(f)
    sign = u & np.uint32(0x80000000)
    a = u ^ sign
    if a > np.uint32(0x7F800000):  # NaN
        return f
    if mode == 2:
        a = (a + np.uint32(0x7FFF) + ((a >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return _float(a | sign)
    if a < np.uint32(0x38800000):  # below 2**-14: float16 subnormals, multiples of 2**-24
        r = (_float(a) + _HALF) - _HALF  # the sum's ulp is 2**-24: rounds to nearest even
        return _float(_bits(r) | sign)
    a = (a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    if a > np.uint32(0x477FE000):  # beyond 65504
        a = np.uint32(0x7F800000)
    return _float(a | sign)


@njit(inline="always")
def _hsum(v, p, lanes):  # type: ignore[no-untyped-def]
    """AVX horizontal sum of v[p:p + lanes] (8 float32 lanes or 4 float64 lanes)."""
    if lanes == 4:
        return (v[p] + v[p + 2]) + (v[p + 1] + v[p + 3])
    b0, b1 = v[p] + v[p + 4], v[p + 1] + v[p + 5]
    b2, b3 = v[p + 2] + v[p + 6], v[p + 3] + v[p + 7]
    return (b0 + b2) + (b1 + b3)


@njit(inline="always")
def _reduce_multiplier(v, base, M, lanes, mode, zero):  # type: ignore[no-untyped-def]
    """The sum of v[base:base + M] in TF's BackpropInput order: horizontal sums of
    lanes-wide packets added in order, then the remaining terms one by one (rounded to T
    after each step for the half types)."""
    s = zero
    nvec = M // lanes * lanes
    for q0 in range(0, nvec, lanes):
        h = _hsum(v, base + q0, lanes)
        if mode != NONE:
            h = _round(h, mode)
        s = s + h
        if mode != NONE:
            s = _round(s, mode)
    for q in range(nvec, M):
        s = s + v[base + q]
        if mode != NONE:
            s = _round(s, mode)
    return s


@njit(inline="always")
def _mac(o, a0, b0, a1, b1, a2, b2, a3, b3, nt, L):  # type: ignore[no-untyped-def]
    """o[e] = (((o[e] + a0*b0) + a1*b1) + a2*b2) + a3*b3 over e < L, for the first nt
    terms: each product rounded, then each sum, in term order, with the accumulator in a
    register across the terms."""
    if nt == 4:
        for e in range(L):
            v = o[e] + a0[e] * b0[e]
            v = v + a1[e] * b1[e]
            v = v + a2[e] * b2[e]
            o[e] = v + a3[e] * b3[e]
    elif nt == 3:
        for e in range(L):
            v = o[e] + a0[e] * b0[e]
            v = v + a1[e] * b1[e]
            o[e] = v + a2[e] * b2[e]
    elif nt == 2:
        for e in range(L):
            v = o[e] + a0[e] * b0[e]
            o[e] = v + a1[e] * b1[e]
    else:
        for e in range(L):
            o[e] = o[e] + a0[e] * b0[e]


@njit(inline="always")
def _mac_flat(o, ob, a, b, ia0, ib0, ia1, ib1, ia2, ib2, ia3, ib3, nt, L):  # type: ignore[no-untyped-def]  # noqa: E501
    """_mac on offsets into flat arrays: o[ob + e] takes a[ia_k + e] * b[ib_k + e].
    Unsigned indices need no negative-index fix-up, so the loop vectorises without the
    cost of slicing views (which dominates short runs)."""
    u = np.uint64
    ob, L = u(ob), u(L)
    ia0, ia1, ia2, ia3 = u(ia0), u(ia1), u(ia2), u(ia3)
    ib0, ib1, ib2, ib3 = u(ib0), u(ib1), u(ib2), u(ib3)
    if nt == 4:
        for e in range(L):
            v = o[ob + e] + a[ia0 + e] * b[ib0 + e]
            v = v + a[ia1 + e] * b[ib1 + e]
            v = v + a[ia2 + e] * b[ib2 + e]
            o[ob + e] = v + a[ia3 + e] * b[ib3 + e]
    elif nt == 3:
        for e in range(L):
            v = o[ob + e] + a[ia0 + e] * b[ib0 + e]
            v = v + a[ia1 + e] * b[ib1 + e]
            o[ob + e] = v + a[ia2 + e] * b[ib2 + e]
    elif nt == 2:
        for e in range(L):
            v = o[ob + e] + a[ia0 + e] * b[ib0 + e]
            o[ob + e] = v + a[ia1 + e] * b[ib1 + e]
    else:
        for e in range(L):
            o[ob + e] = o[ob + e] + a[ia0 + e] * b[ib0 + e]


@njit(inline="always")
def _round_all(v, mode):  # type: ignore[no-untyped-def]
    for e in range(v.size):
        v[e] = _round(v[e], mode)


@njit(inline="always")
def _split_row(x, n, ii, M, sw, xb):  # type: ignore[no-untyped-def]
    """xb[p, u*C*M + k*M + q] = x[n, ii, u*sw + p, k]: one input row with each channel
    repeated M times and its pixels split by phase modulo the stride, so that the pixels
    one filter tap meets form one contiguous run."""
    C = x.shape[3]
    for jj in range(x.shape[2]):
        dst = xb[jj % sw, (jj // sw) * C * M:(jj // sw + 1) * C * M]
        src = x[n, ii, jj]
        if M == 1:
            for k in range(C):
                dst[k] = src[k]
        else:
            for k in range(C):
                for q in range(M):
                    dst[k * M + q] = src[k]


@njit(inline="always")
def _tap_range(off, sw, W, ow):  # type: ignore[no-untyped-def]
    """[j0, j1): the output columns j whose pixel j*sw + off lies inside [0, W)."""
    j0 = min(ow, max(0, -(off // sw)))
    j1 = max(j0, min(ow, (W - 1 - off) // sw + 1))
    return j0, j1


@njit(nogil=True, cache=True)
def _forward(x, w, wtile, out, sh, sw, dh, dw, pt, pl, mode, G, negz, ctl, size, ntasks):  # type: ignore[no-untyped-def]  # noqa: E501
    """One task per output row. The taps of each filter row are applied G at a time
    (in row-major order) in contiguous runs over (pixel, lane) where all G taps fall
    inside the input; the pixels at the borders take them one by one, padding taps
    computing 0 * w (inf * 0 = NaN) as TF. wtile holds each tap's weights repeated for
    JT pixels. Dilated: rows that hold a -0 are marked in ``negz`` (see _negzero)."""
    N, H, W, C = x.shape
    fh, fw = w.shape[0], w.shape[1]
    oh, ow, CM = out.shape[1], out.shape[2], out.shape[3]
    M = CM // C
    JT = wtile.shape[2] // CM
    direct = sw == 1 and M == 1  # the input row itself is the contiguous run
    U = (W + sw - 1) // sw
    x4 = x.reshape(N, H, 1, W * C)
    of = out.reshape(N, oh, ow * CM)
    wf = w.reshape(fh, fw, CM)
    zero = np.zeros(1, x.dtype)[0]
    cur = np.zeros(2, np.int64)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            n, i = t // oh, t % oh
            orow = of[n, i]
            orow[:] = zero
            xb = np.empty((sw, 0 if direct else U * CM), x.dtype)
            for r in range(fh):
                ii = i * sh - pt + r * dh
                if not 0 <= ii < H:  # a padding row: every tap adds 0 * w
                    for c in range(fw):
                        wt = wf[r, c]
                        for j in range(ow):
                            a = orow[j * CM:(j + 1) * CM]
                            for ch in range(CM):
                                a[ch] = a[ch] + zero * wt[ch]
                        if mode != NONE:
                            _round_all(orow, mode)
                    continue
                if not direct:
                    _split_row(x, n, ii, M, sw, xb)
                rowb = x4[n, ii] if direct else xb
                for c0 in range(0, fw, G):
                    nt = min(G, fw - c0)
                    J0, J1 = 0, ow
                    for c in range(c0, c0 + nt):
                        j0, j1 = _tap_range(c * dw - pl, sw, W, ow)
                        J0, J1 = max(J0, j0), min(J1, j1)
                    J1 = max(J0, J1)
                    # Term k is tap c0 + k (clamped: unused terms repeat the last one).
                    o0, o1 = c0 * dw - pl, (c0 + min(1, nt - 1)) * dw - pl
                    o2, o3 = (c0 + min(2, nt - 1)) * dw - pl, (c0 + min(3, nt - 1)) * dw - pl
                    p0, p1, p2, p3 = o0 % sw, o1 % sw, o2 % sw, o3 % sw
                    u0, u1 = (o0 - p0) // sw, (o1 - p1) // sw
                    u2, u3 = (o2 - p2) // sw, (o3 - p3) // sw
                    for jc in range(J0, J1, JT):
                        L = (min(J1, jc + JT) - jc) * CM
                        _mac(orow[jc * CM:jc * CM + L],
                             rowb[p0, (jc + u0) * CM:(jc + u0) * CM + L],
                             wtile[r, c0, :L],
                             rowb[p1, (jc + u1) * CM:(jc + u1) * CM + L],
                             wtile[r, c0 + min(1, nt - 1), :L],
                             rowb[p2, (jc + u2) * CM:(jc + u2) * CM + L],
                             wtile[r, c0 + min(2, nt - 1), :L],
                             rowb[p3, (jc + u3) * CM:(jc + u3) * CM + L],
                             wtile[r, c0 + min(3, nt - 1), :L], nt, L)
                        if mode != NONE:
                            _round_all(orow[jc * CM:jc * CM + L], mode)
                    for j in range(ow):  # the border pixels, tap by tap
                        if J0 <= j < J1:
                            continue
                        a = orow[j * CM:(j + 1) * CM]
                        for c in range(c0, c0 + nt):
                            jj = j * sw + c * dw - pl
                            wt = wf[r, c]
                            if 0 <= jj < W:
                                xr = rowb[jj % sw, (jj // sw) * CM:(jj // sw + 1) * CM]
                                for ch in range(CM):
                                    a[ch] = a[ch] + xr[ch] * wt[ch]
                            else:
                                for ch in range(CM):
                                    a[ch] = a[ch] + zero * wt[ch]
                            if mode != NONE:
                                _round_all(a, mode)
            if dh > 1 or dw > 1:
                negz[t] = _any_negzero(orow)


@njit(nogil=True, cache=True)
def _backprop_input_finite(w, wtile, g, out, sh, sw, dh, dw, pt, pl, mode, lanes, G, negz, ctl, size, ntasks):  # type: ignore[no-untyped-def]  # noqa: E501
    """BackpropInput for a finite float32 / float64 filter: a tap that meets no
    out_backprop value adds w * 0 = +-0, which leaves the accumulator unchanged unless
    it is a flushed -0, so only the taps that hit are computed, and rows that end with a
    -0 are marked in ``negz`` (see _redo_negzero). One task per input row; its
    accumulators are split by pixel
    phase modulo the stride. A pixel of phase p meets the taps c with (c*dw - pl) % sw
    == p; those are applied G at a time, in row-major order, in contiguous runs."""
    N, H, W, C = out.shape
    fh, fw = w.shape[0], w.shape[1]
    oh, ow, CM = g.shape[1], g.shape[2], g.shape[3]
    M = CM // C
    JT = wtile.shape[2] // CM
    U = (W + sw - 1) // sw
    gf = g.reshape(N, oh, ow * CM)
    wf = w.reshape(fh, fw, CM)
    zero = np.zeros(1, w.dtype)[0]
    cur = np.zeros(2, np.int64)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            n, ii = t // H, t % H
            acc = np.zeros((sw, U * CM), w.dtype)  # pixel jj at [jj % sw, (jj // sw) * CM]
            taps = np.empty(max(fw, 1), np.int64)
            for r in range(fh):
                pr = ii + pt - r * dh
                oi = pr // sh
                if pr - oi * sh != 0 or not 0 <= oi < oh:
                    continue
                grow = gf[n, oi]
                for p in range(min(sw, W)):
                    m = 0
                    for c in range(fw):
                        if (c * dw - pl) % sw == p:
                            taps[m] = c
                            m += 1
                    Up = (W - p + sw - 1) // sw  # pixels of phase p
                    ap = acc[p]
                    for k0 in range(0, m, G):
                        nt = min(G, m - k0)
                        # Tap c reaches u = oj + ub for out_backprop columns oj in [0, ow).
                        V0, V1, A0, A1 = 0, Up, Up, 0
                        for k in range(k0, k0 + nt):
                            ub = (taps[k] * dw - pl - p) // sw
                            lo, hi = max(0, ub), min(Up, ub + ow)
                            V0, V1 = max(V0, lo), min(V1, hi)
                            A0, A1 = min(A0, lo), max(A1, hi)
                        V1 = max(V0, V1)
                        c0, c1 = taps[k0], taps[k0 + min(1, nt - 1)]
                        c2, c3 = taps[k0 + min(2, nt - 1)], taps[k0 + min(3, nt - 1)]
                        b0, b1 = (c0 * dw - pl - p) // sw, (c1 * dw - pl - p) // sw
                        b2, b3 = (c2 * dw - pl - p) // sw, (c3 * dw - pl - p) // sw
                        for uc in range(V0, V1, JT):
                            L = (min(V1, uc + JT) - uc) * CM
                            _mac(ap[uc * CM:uc * CM + L],
                                 wtile[r, c0, :L], grow[(uc - b0) * CM:(uc - b0) * CM + L],
                                 wtile[r, c1, :L], grow[(uc - b1) * CM:(uc - b1) * CM + L],
                                 wtile[r, c2, :L], grow[(uc - b2) * CM:(uc - b2) * CM + L],
                                 wtile[r, c3, :L], grow[(uc - b3) * CM:(uc - b3) * CM + L],
                                 nt, L)
                        for u in range(A0, A1):  # pixels some but not all of the taps reach
                            if V0 <= u < V1:
                                continue
                            a = ap[u * CM:(u + 1) * CM]
                            for k in range(k0, k0 + nt):
                                oj = u - (taps[k] * dw - pl - p) // sw
                                if 0 <= oj < ow:
                                    wt = wf[r, taps[k]]
                                    gr = grow[oj * CM:(oj + 1) * CM]
                                    for ch in range(CM):
                                        a[ch] = a[ch] + wt[ch] * gr[ch]
            negz[t] = _any_negzero(acc)
            for jj in range(W):
                pj = acc[jj % sw, (jj // sw) * CM:(jj // sw + 1) * CM]
                o = out[n, ii, jj]
                if M == 1:
                    for ch in range(CM):
                        o[ch] = pj[ch]
                    continue
                for k in range(C):  # reduce over the multiplier
                    o[k] = _reduce_multiplier(pj, k * M, M, lanes, mode, zero)


@njit(nogil=True, cache=True)
def _backprop_filter(x, g, bufs, kblock, sh, sw, dh, dw, pt, pl, mode, G, ctl, size, ntasks):  # type: ignore[no-untyped-def]  # noqa: E501
    """bufs[n] = image n's filter gradient: each tap's lanes accumulate g * x over the
    output positions in row-major order, G positions at a time with the accumulator in a
    register. Tasks are (image, block of input channels); padding taps add g * 0."""
    N, H, W, C = x.shape
    oh, ow, CM = g.shape[1], g.shape[2], g.shape[3]
    fh, fw = bufs.shape[1], bufs.shape[2]
    M = CM // C
    nkb = (C + kblock - 1) // kblock
    zero = np.zeros(1, x.dtype)[0]
    cur = np.zeros(2, np.int64)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            n, kb = t // nkb, t % nkb
            k0, k1 = kb * kblock, min(C, (kb + 1) * kblock)
            l0, l1 = k0 * M, k1 * M
            nl = l1 - l0
            buf = bufs[n]
            buf[:, :, l0:l1] = zero
            xe = np.empty((W if M > 1 else 0, nl), x.dtype)
            for i in range(oh):
                gi = g[n, i]
                for r in range(fh):
                    ii = i * sh - pt + r * dh
                    row_ok = 0 <= ii < H
                    if row_ok and M > 1:
                        for jj in range(W):
                            src = x[n, ii, jj]
                            dst = xe[jj]
                            for k in range(k0, k1):
                                for q in range(M):
                                    dst[(k - k0) * M + q] = src[k]
                    for c in range(fw):
                        br = buf[r, c, l0:l1]
                        off = c * dw - pl
                        j0, j1 = _tap_range(off, sw, W, ow) if row_ok else (ow, ow)
                        for j in range(j0):  # padding taps before, in order
                            gr = gi[j, l0:l1]
                            for ch in range(nl):
                                br[ch] = br[ch] + gr[ch] * zero
                            if mode != NONE:
                                _round_all(br, mode)
                        for jg in range(j0, j1, G):
                            nt = min(G, j1 - jg)
                            ja, jb = jg + min(1, nt - 1), jg + min(2, nt - 1)
                            jc = jg + min(3, nt - 1)
                            if M == 1:
                                xa = x[n, ii, jg * sw + off, k0:k1]
                                xb_ = x[n, ii, ja * sw + off, k0:k1]
                                xc = x[n, ii, jb * sw + off, k0:k1]
                                xd = x[n, ii, jc * sw + off, k0:k1]
                            else:
                                xa, xb_ = xe[jg * sw + off], xe[ja * sw + off]
                                xc, xd = xe[jb * sw + off], xe[jc * sw + off]
                            _mac(br, gi[jg, l0:l1], xa, gi[ja, l0:l1], xb_, gi[jb, l0:l1], xc,
                                 gi[jc, l0:l1], xd, nt, nl)
                            if mode != NONE:
                                _round_all(br, mode)
                        for j in range(max(j1, j0), ow):  # padding taps after
                            gr = gi[j, l0:l1]
                            for ch in range(nl):
                                br[ch] = br[ch] + gr[ch] * zero
                            if mode != NONE:
                                _round_all(br, mode)


@njit(inline="always")
def _filter_border(br, gt, jt, xr, j, sw, pl, fw, W, CM, mode):  # type: ignore[no-untyped-def]
    """Output column j's contribution to one filter row, tap by tap (padding: g * 0);
    its out_backprop values are gt[jt, :CM]."""
    gj = gt[jt, :CM]
    zero = gj.dtype.type(0)  # (not gj[0] * 0: NaN when gj[0] is inf, float64 for float32)
    for c in range(fw):
        jj = j * sw + c - pl
        bc = br[c * CM:(c + 1) * CM]
        if 0 <= jj < W:
            xc = xr[jj * CM:(jj + 1) * CM]
            for ch in range(CM):
                bc[ch] = bc[ch] + gj[ch] * xc[ch]
        else:
            for ch in range(CM):
                bc[ch] = bc[ch] + gj[ch] * zero
        if mode != NONE:
            _round_all(bc, mode)


@njit(nogil=True, cache=True)
def _backprop_filter_rows(x, g, bufs, sh, sw, dh, pt, pl, mode, G, ctl, size, ntasks):  # type: ignore[no-untyped-def]  # noqa: E501
    """bufs[n] as _backprop_filter, for dilation 1 along W and one task per image: the fw
    taps of a filter row are then one contiguous run of fw * C * M accumulators, and so
    are the input pixels they meet from one output column; the out_backprop row is
    repeated fw times (gt) to match. Columns are taken in order: those where some tap
    falls in the padding one by one, the interior ones G at a time."""
    N, H, W, C = x.shape
    oh, ow, CM = g.shape[1], g.shape[2], g.shape[3]
    fh, fw = bufs.shape[1], bufs.shape[2]
    M = CM // C
    L = fw * CM
    zero = np.zeros(1, x.dtype)[0]
    x4 = x.reshape(N, H, W * C)
    # Output columns where every tap of a filter row is inside the input.
    a0, a1 = _tap_range(-pl, sw, W, ow)
    b0, b1 = _tap_range(fw - 1 - pl, sw, W, ow)
    J0 = max(a0, b0)
    J1 = max(J0, min(a1, b1))
    cur = np.zeros(2, np.int64)
    while claim(ctl, size, ntasks, cur):
        for n in range(cur[0], cur[1]):
            buf = bufs[n].reshape(fh, L)
            buf[:] = zero
            gt = np.empty((ow, L), x.dtype)
            gtf = gt.reshape(ow * L)
            bflat = bufs[n].reshape(fh * L)
            xe = np.empty(W * CM if M > 1 else 0, x.dtype)
            for i in range(oh):
                gi = g[n, i].reshape(ow * CM)
                for jc in range(ow * fw):  # gt[j, c*CM + ch] = g[n, i, j, ch]
                    so, do = np.uint64((jc // fw) * CM), np.uint64(jc * CM)
                    for ch in range(np.uint64(CM)):
                        gtf[do + ch] = gi[so + ch]
                for r in range(fh):
                    br = buf[r]
                    ii = i * sh - pt + r * dh
                    if not 0 <= ii < H:  # a padding row: g * 0 for every tap
                        for j in range(ow):
                            gj = gt[j]
                            for e in range(L):
                                br[e] = br[e] + gj[e] * zero
                            if mode != NONE:
                                _round_all(br, mode)
                        continue
                    if M > 1:
                        for jj in range(W):
                            sx, dx = x[n, ii, jj], xe[jj * CM:(jj + 1) * CM]
                            for k in range(C):
                                for q in range(M):
                                    dx[k * M + q] = sx[k]
                    xr = x4[n, ii] if M == 1 else xe
                    for j in range(J0):
                        _filter_border(br, gt, j, xr, j, sw, pl, fw, W, CM, mode)
                    for jg in range(J0, J1, G):
                        nt = min(G, J1 - jg)
                        ja, jb = jg + min(1, nt - 1), jg + min(2, nt - 1)
                        jc = jg + min(3, nt - 1)
                        _mac_flat(bflat, r * L, gtf, xr, jg * L, (jg * sw - pl) * CM,
                                  ja * L, (ja * sw - pl) * CM, jb * L, (jb * sw - pl) * CM,
                                  jc * L, (jc * sw - pl) * CM, nt, L)
                        if mode != NONE:
                            _round_all(br, mode)
                    for j in range(J1, ow):
                        _filter_border(br, gt, j, xr, j, sw, pl, fw, W, CM, mode)


@njit(nogil=True, cache=True)
def _backprop_input_any(w, g, out, sh, sw, dh, dw, pt, pl, mode, lanes, ctl, size, ntasks):  # type: ignore[no-untyped-def]  # noqa: E501
    """BackpropInput for any filter (used when it holds inf or NaN): one task per input
    row. Input pixel jj meets tap (r, c) at out_backprop position ((ii + pt - r*dh) / sh,
    (jj + pl - c*dw) / sw) when both divide and are in range; every other tap computes
    w * 0 (NaN for an inf w), as TF's zero-filled buffer does."""
    N, H, W, C = out.shape
    fh, fw = w.shape[0], w.shape[1]
    oh, ow, CM = g.shape[1], g.shape[2], g.shape[3]
    M = CM // C
    wf = w.reshape(fh, fw, CM)
    zero = np.zeros(1, w.dtype)[0]
    cur = np.zeros(2, np.int64)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            n, ii = t // H, t % H
            per = out[n, ii] if M == 1 else np.empty((W, CM), w.dtype)
            per[:] = zero
            for r in range(fh):
                p = ii + pt - r * dh
                oi = p // sh
                row_hit = p - oi * sh == 0 and 0 <= oi < oh
                for c in range(fw):
                    wt = wf[r, c]
                    for jj in range(W):
                        q = jj + pl - c * dw
                        oj = q // sw
                        a = per[jj]
                        if row_hit and q - oj * sw == 0 and 0 <= oj < ow:
                            gr = g[n, oi, oj]
                            for ch in range(CM):
                                a[ch] = a[ch] + wt[ch] * gr[ch]
                        else:
                            for ch in range(CM):
                                a[ch] = a[ch] + wt[ch] * zero
                        if mode != NONE:
                            _round_all(a, mode)
            if M > 1:  # reduce over the multiplier
                for jj in range(W):
                    for k in range(C):
                        out[n, ii, jj, k] = _reduce_multiplier(per[jj], k * M, M, lanes, mode,
                                                                 zero)


# --------------------------------------------------------------------------------------
# Signed zeros. A tap TF computes as w * 0 (or, for a dilated convolution, a tap of
# TF's explicitly dilated filter: x * 0, g * 0) adds +-0, which changes an accumulator
# only when it is -0 (a sum that flushed or underflowed), turning it into +0. A kernel
# that skips such taps therefore returns TF's bits except that some of TF's +0 come out
# -0 (never the reverse: adding a zero cannot make a -0), so its -0 outputs are redone
# exactly by the element functions below: every real tap computed, each gap of inserted
# taps between two decided by _gap_turns_plus. The register-blocked
# kernels start the sums they test from ``vzeros_opaque``: LLVM assumes no FTZ, where a
# sum started from +0 is never -0, and folded the test away when they started from +0.
# --------------------------------------------------------------------------------------
@njit(inline="always")
def _negzero(v):  # type: ignore[no-untyped-def]
    return v == 0 and np.signbit(v)


def _int_view(a):  # type: ignore[no-untyped-def]  # pragma: no cover - overloaded below
    pass


@overload(_int_view, inline="always")
def _int_view_impl(a):  # type: ignore[no-untyped-def]
    it = np.int32 if a.dtype == types.float32 else np.int64
    return lambda a: a.ravel().view(it)


@njit(inline="always")
def _any_negzero(a):  # type: ignore[no-untyped-def]
    """Whether a (contiguous) holds a -0: its bits as signed integers are the least."""
    u = _int_view(a)
    if u.size == 0:
        return False
    m = u[0]
    for v in u:
        m = min(m, v)  # (a min reduction vectorises; a search loop does not)
    return m == np.iinfo(u.dtype).min


@njit(inline="always")
def _tap_step(acc, wv, v, mode):  # type: ignore[no-untyped-def]
    """acc + wv * v, rounded to T."""
    acc = acc + wv * v
    return acc if mode == NONE else _round(acc, mode)


# (The reference's own function, compiled into the cached redo kernels below. Numba keys
# their cache on this file alone: after editing gap_turns_plus, clear __pycache__.)
_gap_turns_plus = njit(inline="always")(gap_turns_plus)


@njit(inline="always")
def _backprop_input_exact(w, g, n, ii, jj, k, sh, sw, dh, dw, pt, pl, mode, lanes, per):  # type: ignore[no-untyped-def]  # noqa: E501
    """One BackpropInput element as TF computes it with the explicitly dilated filter:
    every real tap, pairing w with the out_backprop value it reaches (0 where none);
    after each, the inserted zeros up to the next real tap (_gap_turns_plus)."""
    fh, fw, _, M = w.shape
    oh, ow = g.shape[1], g.shape[2]
    zero = np.zeros(1, w.dtype)[0]
    for m in range(M):
        acc = zero
        for r in range(fh):
            p = ii + pt - r * dh
            oi = p // sh
            rhit = p - oi * sh == 0 and 0 <= oi < oh
            for c in range(fw):
                q = jj + pl - c * dw
                oj = q // sw
                hit = rhit and q - oj * sw == 0 and 0 <= oj < ow
                gv = g[n, oi, oj, k * M + m] if hit else zero
                acc = _tap_step(acc, w[r, c, k, m], gv, mode)
                if _negzero(acc) and _gap_turns_plus(g, n, k * M + m, ii + pt, jj + pl, -1,
                                                     r, c, fh, fw, dh, dw, sh, sw):
                    acc = zero
        per[m] = acc
    if M == 1:  # (no reduction: 0 + v would turn a -0 into +0)
        return per[0]
    return _reduce_multiplier(per, 0, M, lanes, mode, zero)


@njit(nogil=True, cache=True)
def _redo_negzero(w, g, out, sh, sw, dh, dw, pt, pl, mode, lanes, rows):  # type: ignore[no-untyped-def]  # noqa: E501
    """BackpropInput: the -0 elements of the input rows marked in ``rows``, redone."""
    N, H, W, C = out.shape
    per = np.empty(max(w.shape[3], 1), w.dtype)
    for t in range(rows.size):
        if rows[t]:
            n, ii = t // H, t % H
            for jj in range(W):
                for k in range(C):
                    if _negzero(out[n, ii, jj, k]):
                        out[n, ii, jj, k] = _backprop_input_exact(
                            w, g, n, ii, jj, k, sh, sw, dh, dw, pt, pl, mode, lanes, per)


@njit(nogil=True, cache=True)
def _redo_negzero_forward(x, w, out, sh, sw, dh, dw, pt, pl, mode, rows):  # type: ignore[no-untyped-def]  # noqa: E501
    """Forward with dilations: the -0 outputs of the rows marked in ``rows`` redone with
    the explicitly dilated filter's inserted zeros, as TF computes that convolution
    (_gap_turns_plus)."""
    N, H, W, C = x.shape
    fh, fw, _, M = w.shape
    oh, ow = out.shape[1], out.shape[2]
    zero = np.zeros(1, x.dtype)[0]
    for t in range(rows.size):
        if rows[t]:
            n, i = t // oh, t % oh
            for j in range(ow):
                for oc in range(C * M):
                    if not _negzero(out[n, i, j, oc]):
                        continue
                    k, m = oc // M, oc % M
                    acc = zero
                    for r in range(fh):
                        ii = i * sh - pt + r * dh
                        for c in range(fw):
                            jj = j * sw - pl + c * dw
                            xv = x[n, ii, jj, k] if 0 <= ii < H and 0 <= jj < W else zero
                            acc = _tap_step(acc, w[r, c, k, m], xv, mode)
                            if _negzero(acc) and _gap_turns_plus(
                                    x, n, k, i * sh - pt, j * sw - pl, 1, r, c, fh, fw, dh,
                                    dw, 1, 1):
                                acc = zero
                    out[n, i, j, oc] = acc


@njit(nogil=True, cache=True)
def _sum_images(bufs, total, mode):  # type: ignore[no-untyped-def]
    """total = 0 + bufs[0] + bufs[1] + ... (batch order), per element."""
    N = bufs.shape[0]
    L = total.size
    bf = bufs.reshape(N, L)
    tf = total.reshape(L)
    for e in range(L):
        s = tf[e]  # +0 (zero-initialised; `tf[e] * 0` would make s float64)
        for n in range(N):
            s = s + bf[n, e]
            if mode != NONE:
                s = _round(s, mode)
        tf[e] = s


# ---------------------------------------------------------------------------------------
# Register-blocked kernels (float32 / float64, filter sizes in _VEC_SIZES): the filter
# size is a compile-time constant, the taps are unrolled, and four output pixels' lane
# vectors stay in registers across all taps (see ``_simd``). Same order per element as
# the kernels above; the pixels whose taps fall partly outside take them one by one.

_VEC_SIZES = frozenset({(1, 1), (2, 2), (3, 3), (5, 5), (7, 7)})  # (fw <= 7)
_VEC_KERNELS: dict[tuple, object] = {}
_STREAM_MIN_BYTES = STREAM_MIN_BYTES  # (tests lower it)
_P = 4  # output pixels per register block


@njit(inline="always")
def _ring_rows(FH, dh):  # type: ignore[no-untyped-def]
    """Rows of a kernel's row ring (slot: row mod its size). The span of a filter's rows,
    (FH - 1) * dh + 1, keeps a row in place for the next output rows that need it; past
    8 * FH rows (a large dilation, which would size the ring by the dilation) the
    smallest prime p >= FH that does not divide dh, where one output row's FH rows still
    take distinct slots (p divides no t * dh, 0 < t < FH)."""
    span = (FH - 1) * dh + 1
    if span <= 8 * FH:
        return span
    p = FH
    while True:
        prime = p >= 2
        f = 2
        while prime and f * f <= p:
            prime = p % f != 0
            f += 1
        if prime and dh % p != 0:
            return p
        p += 1


@njit(inline="always")
def _row_offset(xf, n, ii, H, W, C, M, ring, tags):  # type: ignore[no-untyped-def]
    """Where input row (n, ii) starts in the kernel's source: in x itself when M = 1,
    else in its ring slot (ii mod the ring's rows), expanded there on first use with each
    channel repeated M times, so that a tap's lanes k*M + q are contiguous."""
    if M == 1:
        return (n * H + ii) * W * C
    s = ii % tags.size
    d0 = s * W * C * M
    if tags[s] != n * H + ii:
        # Unsigned indices and M = 2 spelled out: LLVM vectorises these loops (the
        # generic scalar loop cost as much as the convolution's arithmetic).
        u = np.uint64
        s0, dd, m = u((n * H + ii) * W * C), u(d0), u(M)
        if M == 2:
            for e in range(u(W * C)):
                v = xf[s0 + e]
                ring[dd + u(2) * e] = v
                ring[dd + u(2) * e + u(1)] = v
        else:
            for e in range(u(W * C)):
                v = xf[s0 + e]
                for q in range(m):
                    ring[dd + e * m + q] = v
        tags[s] = n * H + ii
    return d0


@njit(inline="always")
def _mac4(v0, v1, v2, v3, wv, x0, x1, x2, x3, wfirst):  # type: ignore[no-untyped-def]
    """Four pixels' accumulators each take their operand times the tap's weights wv
    (``wfirst``: as wv * x, the operand order of the kernel it stands for)."""
    if wfirst:
        return (vmuladd(v0, wv, x0), vmuladd(v1, wv, x1), vmuladd(v2, wv, x2),
                vmuladd(v3, wv, x3))
    return (vmuladd(v0, x0, wv), vmuladd(v1, x1, wv), vmuladd(v2, x2, wv),
            vmuladd(v3, x3, wv))


@njit(inline="always")
def _row_offset_blocked(xf, n, ii, H, W, C, M, NL, ring, tags):  # type: ignore[no-untyped-def]
    """_row_offset for M = 2 and C * M a multiple of the lanes, into a ring whose rows
    are blocked by channel vector: lane l of channel vector q at pixel p is at
    q * W * NL + p * NL + l. A sweep of one channel vector along a row then reads
    consecutive lines, which stay in L1 from one 4-pixel block to the next (in the
    pixel-major layout they are C * M values apart and the prefetchers miss them).
    M = 1 only reorders (BackpropInput's out_backprop rows, whose C holds C * M). No
    other M: expanded lane by lane (a division per lane) the ring costs more than the
    layout saves (the pixel-major ring's expansion loop vectorises)."""
    s = ii % tags.size
    CM = C * M
    d0 = s * W * CM
    if tags[s] != n * H + ii:
        u = np.uint64
        src, dd, nl, w, nq = u((n * H + ii) * W * C), u(d0), u(NL), u(W), u(CM // NL)
        if M == 1:
            for p in range(w):
                for q in range(nq):
                    vstore(ring, dd + (q * w + p) * nl, vload(xf, src + p * u(C) + q * nl))
        else:
            for p in range(w):
                for q in range(nq):
                    vstore(ring, dd + (q * w + p) * nl,
                           vload_dup2(xf, src + p * u(C) + q * (nl // u(2))))
        tags[s] = n * H + ii
    return d0


@njit(inline="always")
def _ring_row(xf, n, ii, H, W, C, M, NL, ring, tags, blocked):  # type: ignore[no-untyped-def]
    """Input row (n, ii)'s offset in the kernel's source: _row_offset_blocked when
    ``blocked`` (M = 2 on whole lane vectors), else _row_offset."""
    if blocked:
        return _row_offset_blocked(xf, n, ii, H, W, C, M, NL, ring, tags)
    return _row_offset(xf, n, ii, H, W, C, M, ring, tags)


@njit(inline="always")
def _prefetch_step(pn, parts):  # type: ignore[no-untyped-def]
    """Elements per part (whole 16-element steps) when pn elements' prefetches are
    spread over ``parts`` blocks of work."""
    return 16 * -(-pn // (16 * max(1, parts)))


@njit(inline="always")
def _prefetch_part(a, pa, pn, step):  # type: ignore[no-untyped-def]
    """Prefetch the next ``step`` of the pn elements left at a[pa:]; returns where the
    rest starts and how many are left."""
    for e in range(0, step, 16):
        if e < pn:
            prefetch(a, pa + e)
    return pa + step, pn - step


@njit(inline="always")
def _fwd_block(src, wf, of, rowoff, a0, o, CM, ch0, ch1, CS, NL, FH, FW, ps, ts, P, stream):  # type: ignore[no-untyped-def]  # noqa: E501
    """P (4 or 1) output pixels at of[o:], pixel stride CM, all taps inside, channel
    vectors [ch0, ch1): pixel p's tap (r, c) reads the lanes at src[rowoff[r] + a0 +
    p*ps + c*ts + (ch // NL) * CS] (CS: NL in x's own layout, W * NL in a blocked ring).
    Returns whether a lane it stored was -0."""
    neg = False
    for ch in range(ch0, ch1, NL):
        v0 = v1 = v2 = v3 = vzeros_opaque(wf)  # (so that a -0 is not ruled out)
        for r in range(FH):
            b = rowoff[r] + a0 + (ch // NL) * CS
            for c in range(FW):
                wv = vload(wf, (r * FW + c) * CM + ch)
                a = b + c * ts
                v0 = vmuladd(v0, vload(src, a), wv)
                if P > 1:
                    v1 = vmuladd(v1, vload(src, a + ps), wv)
                    v2 = vmuladd(v2, vload(src, a + 2 * ps), wv)
                    v3 = vmuladd(v3, vload(src, a + 3 * ps), wv)
        vput(of, o + ch, v0, stream)
        if P > 1:
            vput(of, o + CM + ch, v1, stream)
            vput(of, o + 2 * CM + ch, v2, stream)
            vput(of, o + 3 * CM + ch, v3, stream)
            v0 = vmin_bits(vmin_bits(v0, v1), vmin_bits(v2, v3))
        neg = neg or vhas_negzero(v0)
    return neg


@njit(inline="always")
def _fwd_block_unit(src, wf, of, rowoff, a0, o, CM, ch0, ch1, CS, NL, FH, FW, ps, stream, track):  # type: ignore[no-untyped-def]  # noqa: E501
    """_fwd_block for 4 pixels at stride 1 along the row, no dilation along it (pixel
    stride ps in src): the 4 pixels' inputs for tap c are columns c..c+3, held in
    registers that slide by one column per tap, so each input vector is loaded once per
    filter row instead of up to 4 times. ``track`` (dilated in height): returns whether
    a lane it stored was -0, as _fwd_block."""
    neg = False
    for ch in range(ch0, ch1, NL):
        v0 = v1 = v2 = v3 = vzeros_opaque(wf)  # (so that a -0 is not ruled out)
        for r in range(FH):
            b = rowoff[r] + a0 + (ch // NL) * CS
            x0, x1 = vload(src, b), vload(src, b + ps)
            x2, x3 = vload(src, b + 2 * ps), vload(src, b + 3 * ps)
            for c in range(FW):
                wv = vload(wf, (r * FW + c) * CM + ch)
                v0, v1, v2, v3 = _mac4(v0, v1, v2, v3, wv, x0, x1, x2, x3, False)
                if c + 1 < FW:
                    x0, x1, x2 = x1, x2, x3
                    x3 = vload(src, b + (c + 4) * ps)
        vput(of, o + ch, v0, stream)
        vput(of, o + CM + ch, v1, stream)
        vput(of, o + 2 * CM + ch, v2, stream)
        vput(of, o + 3 * CM + ch, v3, stream)
        if track:
            neg = neg or vhas_negzero(vmin_bits(vmin_bits(v0, v1), vmin_bits(v2, v3)))
    return neg


def _make_forward_vec(FH: int, FW: int, stream: bool):  # type: ignore[no-untyped-def]
    @njit(nogil=True, cache=True)
    def kernel(x, w, out, sh, sw, dh, dw, pt, pl, negz, ctl, size, ntasks):  # type: ignore[no-untyped-def]  # noqa: E501
        """One task per output row. Rows of x are used in place (M = 1) or expanded
        into a ring of the FH-row span (channels repeated M times) so that every tap's
        lanes are contiguous; with whole channel vectors the ring is blocked by channel
        vector (_row_offset_blocked) and a row's 4-pixel blocks go channel vector by
        channel vector. ``stream``: the output's vectors go out with non-temporal
        stores (whole-line pixels of a large output; see backprop_input / forward).
        Rows that hold a -0 are marked in ``negz`` (used when dilated: _negzero)."""
        N, H, W, C = x.shape
        oh, ow, CM = out.shape[1], out.shape[2], out.shape[3]
        M = CM // C
        NL = nlanes(x)
        CV = CM - CM % NL
        WC = W * CM
        blocked = M == 2 and CV == CM  # (see _row_offset_blocked)
        PS = NL if blocked else CM  # src's pixel stride
        CS = W * NL if blocked else NL  # src's channel-vector stride
        xf, wf, of = x.reshape(x.size), w.reshape(w.size), out.reshape(out.size)
        zero = np.zeros(1, x.dtype)[0]
        R = _ring_rows(FH, dh) if M > 1 else 0
        ring = aligned_scratch(R * WC, x)
        tags = np.full(R, -1, np.int64)
        src = xf if M == 1 else ring
        rowoff = np.zeros(FH, np.int64)
        rowok = np.zeros(FH, np.bool_)
        J0 = min(ow, (pl + sw - 1) // sw)  # columns whose taps all fall inside
        J1 = max(J0, min(ow, (W - 1 - (FW - 1) * dw + pl) // sw + 1))
        cur = np.zeros(2, np.int64)
        while claim(ctl, size, ntasks, cur):
            for t in range(cur[0], cur[1]):
                n, i = t // oh, t % oh
                neg = False
                allok = True
                for r in range(FH):
                    ii = i * sh - pt + r * dh
                    rowok[r] = 0 <= ii < H
                    if not rowok[r]:
                        allok = False
                    else:
                        rowoff[r] = _ring_row(xf, n, ii, H, W, C, M, NL, ring, tags, blocked)
                ob = (n * oh + i) * ow * CM
                j = 0
                while j < ow:
                    if allok and blocked and j == J0 and J1 - J0 >= _P:
                        # the row's 4-pixel blocks, channel vector by channel vector
                        nb = (J1 - J0) // _P
                        # the next output row's new input rows, spread over the blocks
                        last = i * sh - pt + (FH - 1) * dh
                        pa = (n * H + last + 1) * W * C
                        pn = max(0, min(sh, 2, H - 1 - last)) * W * C
                        step = _prefetch_step(pn, nb * (CV // NL))
                        for ch in range(0, CV, NL):
                            for k in range(nb):
                                pa, pn = _prefetch_part(xf, pa, pn, step)
                                jk = j + k * _P
                                a0, o = (jk * sw - pl) * PS, ob + jk * CM
                                if sw == 1 and dw == 1:
                                    neg |= _fwd_block_unit(src, wf, of, rowoff, a0, o, CM, ch,
                                                           ch + NL, CS, NL, FH, FW, PS, stream,
                                                           dh > 1)
                                else:
                                    neg |= _fwd_block(src, wf, of, rowoff, a0, o, CM, ch,
                                                      ch + NL, CS, NL, FH, FW, sw * PS, dw * PS,
                                                      _P, stream)
                        j1 = j + nb * _P
                    elif allok and J0 <= j < J1:  # all taps inside: 4 pixels, or 1
                        a0, o = (j * sw - pl) * PS, ob + j * CM
                        j1 = j + _P if j + _P <= J1 else j + 1
                        if M == 1:  # the next output row's new input rows, these columns
                            for k in range(1, min(sh, 2) + 1):  # (strides can be huge)
                                pa = rowoff[FH - 1] + k * WC + a0
                                for e in range(0, (j1 - j) * sw * CM, 16):
                                    prefetch(xf, pa + e)
                        if j1 == j + 1:
                            neg |= _fwd_block(src, wf, of, rowoff, a0, o, CM, 0, CV, CS, NL, FH,
                                              FW, 0, dw * PS, 1, stream)
                        elif sw == 1 and dw == 1:  # (tracked when dilated in height: TF's
                            neg |= _fwd_block_unit(src, wf, of, rowoff, a0, o, CM, 0, CV, CS, NL,
                                                   FH, FW, PS, stream, dh > 1)  # inserted rows)
                        else:
                            neg |= _fwd_block(src, wf, of, rowoff, a0, o, CM, 0, CV, CS, NL, FH,
                                              FW, sw * PS, dw * PS, _P, stream)
                    else:  # one pixel; taps in the padding compute 0 * w
                        for ch in range(0, CV, NL):
                            v = vzeros_opaque(x)
                            cb = (ch // NL) * CS
                            for r in range(FH):
                                for c in range(FW):
                                    jj = j * sw - pl + c * dw
                                    wv = vload(wf, (r * FW + c) * CM + ch)
                                    if rowok[r] and 0 <= jj < W:
                                        v = vmuladd(v, vload(src, rowoff[r] + jj * PS + cb), wv)
                                    else:
                                        v = vmuladd(v, vzeros(x), wv)
                            vput(of, ob + j * CM + ch, v, stream)
                            neg = neg or vhas_negzero(v)
                        j1 = j + 1
                    for jp in range(j, j1):  # lanes past the last full vector (never blocked)
                        for ch in range(CV, CM):
                            s_ = zero_opaque(x)
                            for r in range(FH):
                                for c in range(FW):
                                    jj = jp * sw - pl + c * dw
                                    xv = zero
                                    if rowok[r] and 0 <= jj < W:
                                        xv = src[rowoff[r] + jj * CM + ch]
                                    s_ = s_ + xv * wf[(r * FW + c) * CM + ch]
                            of[ob + jp * CM + ch] = s_
                            neg = neg or _negzero(s_)
                    j = j1
                negz[t] = neg

    return kernel


@njit(inline="always")
def _g_at(gf, check, oj, ow, i):  # type: ignore[no-untyped-def]
    """gf's lanes at i (out_backprop column oj); with ``check``, +0 where oj is outside
    [0, ow): w * 0 for finite w, the bits TF computes for that tap."""
    if not check or 0 <= oj < ow:
        return vload(gf, i)
    return vzeros(gf)


@njit(inline="always")
def _sum_pairs(of, o, per, p, n, zero):  # type: ignore[no-untyped-def]
    """of[o + e] = (0 + per[p + 2e]) + per[p + 2e + 1] for e < n: a multiplier of 2
    summed in _reduce_multiplier's order (M < plane); unsigned, so that it vectorises."""
    u = np.uint64
    o, p = u(o), u(p)
    for e in range(u(n)):
        of[o + e] = (zero + per[p + u(2) * e]) + per[p + u(2) * e + u(1)]


@njit(inline="always")
def _g4(gs, check, oj, ow, a, GS):  # type: ignore[no-untyped-def]
    """_g_at for out_backprop columns oj .. oj + 3 (at a, a + GS, ...)."""
    return (_g_at(gs, check, oj, ow, a), _g_at(gs, check, oj + 1, ow, a + GS),
            _g_at(gs, check, oj + 2, ow, a + 2 * GS), _g_at(gs, check, oj + 3, ow, a + 3 * GS))


@njit(forceinline=True)
def _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit, u, o, ps, CM, ch0, ch1, GS, CS, NL,  # type: ignore[no-untyped-def]  # noqa: E501
              FH, FW, ow, check, unit, stream, pair):
    """4 BackpropInput pixels of one phase (u..u+3, at dst[o:], pixel stride ps), channel
    vectors [ch0, ch1): pixel u+p meets out_backprop column tapb[c] + u + p at tap c,
    whose lanes are at gs[rowoff[r] + column * GS + (ch // NL) * CS] (g itself: GS = CM,
    CS = NL; a blocked ring: GS = NL, CS = ow * NL). ``unit`` (stride 1, dilation 1):
    tapb[c] = tapb[0] - c, so tap c+1's 4 columns are tap c's moved down by one, held in
    registers that slide: one new load per tap instead of 4. ``pair`` (M = 2): channel
    vectors ch and ch + NL at a time (8 accumulators), each pixel's two multiplier lanes
    then summed as TF does, (0 + a) + b (vpairsum), into the NL channels at
    dst[o + p * ps + ch // 2]: no per-lane scratch and no pass over it. Returns whether
    a lane (a per-lane sum when ``pair``) was -0."""
    neg = False
    for ch in range(ch0, ch1, 2 * NL if pair else NL):
        v0 = v1 = v2 = v3 = vzeros_opaque(wf)  # (so that a -0 is not ruled out)
        q0 = q1 = q2 = q3 = v0  # (pair: the second channel vector's)
        ca = (ch // NL) * CS
        cb = ca + CS
        for r in range(FH):
            if not rowok[r]:
                continue
            if unit:
                oj = tapb[0] + u
                a = rowoff[r] + oj * GS
                g0, g1, g2, g3 = _g4(gs, check, oj, ow, a + ca, GS)
                h0, h1, h2, h3 = _g4(gs, check, oj, ow, a + cb, GS) if pair else (g0, g0,
                                                                                  g0, g0)
                for c in range(FW):
                    wv = vload(wf, (r * FW + c) * CM + ch)
                    # g3 first: it leaves the window after this tap (so its register
                    # frees early, and LLVM spills far fewer vectors on AVX2)
                    v3, v2, v1, v0 = _mac4(v3, v2, v1, v0, wv, g3, g2, g1, g0, True)
                    if pair:
                        wv = vload(wf, (r * FW + c) * CM + ch + NL)
                        q3, q2, q1, q0 = _mac4(q3, q2, q1, q0, wv, h3, h2, h1, h0, True)
                    if c + 1 < FW:
                        g1, g2, g3 = g0, g1, g2
                        g0 = _g_at(gs, check, oj - c - 1, ow, a - (c + 1) * GS + ca)
                        if pair:
                            h1, h2, h3 = h0, h1, h2
                            h0 = _g_at(gs, check, oj - c - 1, ow, a - (c + 1) * GS + cb)
                continue
            for c in range(FW):
                if not taphit[c]:
                    continue
                wv = vload(wf, (r * FW + c) * CM + ch)
                oj = tapb[c] + u
                a = rowoff[r] + oj * GS
                g0, g1, g2, g3 = _g4(gs, check, oj, ow, a + ca, GS)
                v0, v1, v2, v3 = _mac4(v0, v1, v2, v3, wv, g0, g1, g2, g3, True)
                if pair:
                    wv = vload(wf, (r * FW + c) * CM + ch + NL)
                    g0, g1, g2, g3 = _g4(gs, check, oj, ow, a + cb, GS)
                    q0, q1, q2, q3 = _mac4(q0, q1, q2, q3, wv, g0, g1, g2, g3, True)
        if pair:
            k = ch // 2
            vput(dst, o + k, vpairsum(v0, q0), stream)
            vput(dst, o + ps + k, vpairsum(v1, q1), stream)
            vput(dst, o + 2 * ps + k, vpairsum(v2, q2), stream)
            vput(dst, o + 3 * ps + k, vpairsum(v3, q3), stream)
            m = vmin_bits(vmin_bits(vmin_bits(v0, q0), vmin_bits(v1, q1)),
                          vmin_bits(vmin_bits(v2, q2), vmin_bits(v3, q3)))
        else:
            vput(dst, o + ch, v0, stream)
            vput(dst, o + ps + ch, v1, stream)
            vput(dst, o + 2 * ps + ch, v2, stream)
            vput(dst, o + 3 * ps + ch, v3, stream)
            m = vmin_bits(vmin_bits(v0, v1), vmin_bits(v2, v3))
        # (a bool: a vector carried from block to block would hold two more registers)
        neg = neg or vhas_negzero(m)
    return neg


def _make_backprop_input_vec(FH: int, FW: int, stream: bool, blocked: bool, pstream: bool):  # type: ignore[no-untyped-def]  # noqa: E501
    PAIR = HOST_AVX512  # (two lane vectors' 8 accumulators and operands fit)

    @njit(nogil=True, cache=True)
    def kernel(w, g, out, sh, sw, dh, dw, pt, pl, plane, negz, ctl, size, ntasks):  # type: ignore[no-untyped-def]  # noqa: E501
        """BackpropInput for a finite filter, skipping the taps that meet no out_backprop
        value (w * 0 = +-0 changes nothing but a -0: rows that hold one are marked in
        ``negz`` and redone exactly, see _redo_negzero). One task per input row; its
        pixels are taken by phase modulo the stride, four of one phase (which meet the
        same taps, at consecutive out_backprop columns) at a time. Then the multiplier
        reduction in TF's packet order (plane lanes). With M > 1 and whole channel
        vectors the out_backprop rows are read from a ring blocked by channel vector
        (_row_offset_blocked) and each phase's 4-pixel blocks go channel vector by
        channel vector, as in the forward. (``blocked`` is a compile-time constant, set
        by the caller exactly then: the pixel-major variant keeps its constant strides.)
        With M = 2 there (AVX-512) the blocks take two channel vectors at a time and sum
        the multiplier pairs themselves (_bi_block's ``pair``), writing out directly,
        with non-temporal stores when ``pstream``; only the last Up mod 4 pixels of a
        phase go through the per-lane scratch."""
        N, H, W, C = out.shape
        oh, ow, CM = g.shape[1], g.shape[2], g.shape[3]
        M = CM // C
        NL = nlanes(w)
        CV = CM - CM % NL
        gf, wf, of = g.reshape(g.size), w.reshape(w.size), out.reshape(out.size)
        GS = NL if blocked else CM  # gs's pixel stride
        CS = ow * NL if blocked else NL  # gs's channel-vector stride
        R = _ring_rows(FH, dh) if blocked else 0  # (an input row's out_backprop rows span
        ring = aligned_scratch(R * ow * CM, w)  # at most (FH - 1) * dh // sh + 1)
        tags = np.full(R, -1, np.int64)
        gs = ring if blocked else gf
        zero = np.zeros(1, w.dtype)[0]
        per = aligned_scratch(W * CM if M > 1 else 0, w)
        dst = of if M == 1 else per
        rowoff = np.zeros(FH, np.int64)
        rowok = np.zeros(FH, np.bool_)
        tapb = np.zeros(FW, np.int64)
        taphit = np.zeros(FW, np.bool_)
        unit = sw == 1 and dw == 1
        pair = PAIR and blocked and M == 2 and CV % (2 * NL) == 0
        cur = np.zeros(2, np.int64)
        while claim(ctl, size, ntasks, cur):
            for t in range(cur[0], cur[1]):
                n, ii = t // H, t % H
                neg = False
                o0 = (n * H + ii) * W * C
                for r in range(FH):
                    pr = ii + pt - r * dh
                    oi = pr // sh
                    rowok[r] = pr - oi * sh == 0 and 0 <= oi < oh
                    if blocked and rowok[r]:
                        rowoff[r] = _row_offset_blocked(gf, n, oi, oh, ow, CM, 1, NL, ring, tags)
                    else:
                        rowoff[r] = (n * oh + oi) * ow * CM
                db = (n * H + ii) * W * CM if M == 1 else 0
                # (blocked) the next input row's new out_backprop row, spread over the blocks
                nx = ii + 1 + pt
                pa = (n * oh + nx // sh) * ow * CM
                pn = ow * CM if ii + 1 < H and nx % sh == 0 and 0 <= nx // sh < oh else 0
                for ph in range(min(sw, W)):
                    Up = (W - ph + sw - 1) // sw  # pixels jj = ph + u*sw
                    U0, U1 = 0, Up  # where every tap of this phase meets a column
                    for c in range(FW):
                        q = ph + pl - c * dw
                        tapb[c] = q // sw  # pixel u meets column tapb[c] + u
                        taphit[c] = q - tapb[c] * sw == 0
                        if taphit[c]:
                            U0, U1 = max(U0, -tapb[c]), min(U1, ow - tapb[c])
                    u = 0
                    if blocked:
                        V = 2 * NL if pair else NL  # (the lanes a block takes)
                        nb = Up // _P
                        step = _prefetch_step(pn, nb * (CV // V))
                        for ch in range(0, CV, V):
                            for k in range(nb):
                                pa, pn = _prefetch_part(gf, pa, pn, step)
                                uk = k * _P
                                o, op = db + (ph + uk * sw) * CM, o0 + (ph + uk * sw) * C
                                inner = U0 <= uk and uk + _P <= U1  # (else: missed taps add 0)
                                if pair and inner:
                                    neg |= _bi_block(wf, gs, of, rowoff, rowok, tapb, taphit, uk,
                                                     op, sw * C, CM, ch, ch + V, GS, CS, NL, FH,
                                                     FW, ow, False, unit, pstream, True)
                                elif pair:
                                    neg |= _bi_block(wf, gs, of, rowoff, rowok, tapb, taphit, uk,
                                                     op, sw * C, CM, ch, ch + V, GS, CS, NL, FH,
                                                     FW, ow, True, unit, pstream, True)
                                elif inner:
                                    neg |= _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit,
                                                     uk, o, sw * CM, CM, ch, ch + V, GS, CS, NL,
                                                     FH, FW, ow, False, unit, stream, False)
                                else:
                                    neg |= _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit,
                                                     uk, o, sw * CM, CM, ch, ch + V, GS, CS, NL,
                                                     FH, FW, ow, True, unit, stream, False)
                        u = nb * _P
                    u2 = u  # (pair: the pixels from here on go through per)
                    while u < Up:
                        if u + _P <= Up:  # 4 pixels; near the borders, missed taps add w * 0
                            o = db + (ph + u * sw) * CM
                            if U0 <= u and u + _P <= U1:
                                if rowok[0]:  # the next input row's new out_backprop row
                                    pa = rowoff[0] + ow * CM + (tapb[0] + u) * CM
                                    for e in range(0, _P * CM, 16):
                                        prefetch(gf, pa + e)
                                neg |= _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit, u,
                                                 o, sw * CM, CM, 0, CV, GS, CS, NL, FH, FW, ow,
                                                 False, unit, stream, False)
                            else:
                                neg |= _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit, u,
                                                 o, sw * CM, CM, 0, CV, GS, CS, NL, FH, FW, ow,
                                                 True, unit, stream, False)
                            u1 = u + _P
                        else:
                            for ch in range(0, CV, NL):
                                v = vzeros_opaque(w)
                                cb = (ch // NL) * CS
                                for r in range(FH):
                                    if not rowok[r]:
                                        continue
                                    for c in range(FW):
                                        oj = tapb[c] + u
                                        if taphit[c] and 0 <= oj < ow:
                                            v = vmuladd(v, vload(wf, (r * FW + c) * CM + ch),
                                                        vload(gs, rowoff[r] + oj * GS + cb))
                                vput(dst, db + (ph + u * sw) * CM + ch, v, stream)
                                neg = neg or vhas_negzero(v)
                            u1 = u + 1
                        for up in range(u, u1):  # lanes past the last full vector (never
                            for ch in range(CV, CM):  # blocked: g's own layout)
                                s_ = zero_opaque(w)
                                for r in range(FH):
                                    if not rowok[r]:
                                        continue
                                    for c in range(FW):
                                        oj = tapb[c] + up
                                        if taphit[c] and 0 <= oj < ow:
                                            wv_ = wf[(r * FW + c) * CM + ch]
                                            s_ = s_ + wv_ * gf[rowoff[r] + oj * CM + ch]
                                dst[db + (ph + up * sw) * CM + ch] = s_
                                neg = neg or _negzero(s_)
                        u = u1
                    if pair:  # the pixels left to per
                        for up in range(u2, Up):
                            jj = ph + up * sw
                            _sum_pairs(of, o0 + jj * C, per, jj * CM, C, zero)
                # (M > 1: a -0 among the per-lane sums; they are TF's bits when none is)
                negz[t] = neg
                if M == 2 and not pair:
                    _sum_pairs(of, o0, per, 0, W * C, zero)
                elif M > 2:  # reduce over the multiplier
                    for jj in range(W):
                        for k in range(C):
                            of[o0 + jj * C + k] = _reduce_multiplier(per, jj * CM + k * M, M,
                                                                      plane, NONE, zero)

    return kernel


# BackpropFilter's helpers are inlined by LLVM (forceinline), not by Numba (inline=
# "always"): Numba deep-copies a callee's IR at every site, and these nest 3 x 3 x 7 deep,
# which made each filter size compile several times longer. Same speed, same bits.
@njit(forceinline=True)
def _tap_x(src, check, ok, jj, W, i):  # type: ignore[no-untyped-def]
    """src's lanes at i; with ``check``, +0 unless the tap's pixel (row ok, column jj) is
    inside (a padding tap still adds g * 0, as TF)."""
    if not check or (ok and 0 <= jj < W):
        return vload(src, i)
    return vzeros(src)


@njit(forceinline=True)
def _filter_row(a, gv, src, xi, tc, FW, check, ok, j0, dw, W):  # type: ignore[no-untyped-def]
    """One output pixel's out_backprop lanes gv times the FW (<= 7) taps of one filter
    row, added to that row's accumulators a (a 7-tuple; the unused ones stay zero)."""
    a0, a1, a2, a3, a4, a5, a6 = a
    a0 = vmuladd(a0, gv, _tap_x(src, check, ok, j0, W, xi))
    if FW > 1:
        a1 = vmuladd(a1, gv, _tap_x(src, check, ok, j0 + dw, W, xi + tc))
    if FW > 2:
        a2 = vmuladd(a2, gv, _tap_x(src, check, ok, j0 + 2 * dw, W, xi + 2 * tc))
    if FW > 3:
        a3 = vmuladd(a3, gv, _tap_x(src, check, ok, j0 + 3 * dw, W, xi + 3 * tc))
    if FW > 4:
        a4 = vmuladd(a4, gv, _tap_x(src, check, ok, j0 + 4 * dw, W, xi + 4 * tc))
    if FW > 5:
        a5 = vmuladd(a5, gv, _tap_x(src, check, ok, j0 + 5 * dw, W, xi + 5 * tc))
    if FW > 6:
        a6 = vmuladd(a6, gv, _tap_x(src, check, ok, j0 + 6 * dw, W, xi + 6 * tc))
    return a0, a1, a2, a3, a4, a5, a6


@njit(forceinline=True)
def _load_row(bf, b, CM, FW, z):  # type: ignore[no-untyped-def]
    return (vload(bf, b), vload(bf, b + CM) if FW > 1 else z,
            vload(bf, b + 2 * CM) if FW > 2 else z, vload(bf, b + 3 * CM) if FW > 3 else z,
            vload(bf, b + 4 * CM) if FW > 4 else z, vload(bf, b + 5 * CM) if FW > 5 else z,
            vload(bf, b + 6 * CM) if FW > 6 else z)


@njit(forceinline=True)
def _store_row(bf, b, CM, FW, a):  # type: ignore[no-untyped-def]
    for c in range(FW):
        vstore(bf, b + c * CM, a[c])


@njit(forceinline=True)
def _filter_cols(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, check, ja, jb, sw, pl, tc, dw, W,  # type: ignore[no-untyped-def]  # noqa: E501
                 pg, px, npx, WC, two, NL, XS, XQ):
    """Output columns [ja, jb) of one output row into the accumulators of nr (<= 5;
    ``two``: <= 3) filter rows for one lane vector (``two``: and the next, ch + NL), kept
    in registers over the columns. src's pixel stride is XS and its lane-vector stride XQ
    (x's own layout: CM and NL; a blocked ring: NL and W * NL). pg >= 0: prefetch the lines the
    next output row will read at these columns and lanes: its out_backprop row (at pg)
    and npx (<= 2) new input rows (at px, px + WC; x's own layout)."""
    z = vzeros(gf)
    zr = (z, z, z, z, z, z, z)
    rs = FW * CM
    r0 = _load_row(bf, b, CM, FW, z)
    r1 = _load_row(bf, b + rs, CM, FW, z) if nr > 1 else zr
    r2 = _load_row(bf, b + 2 * rs, CM, FW, z) if nr > 2 else zr
    r3 = _load_row(bf, b + 3 * rs, CM, FW, z) if nr > 3 else zr
    r4 = _load_row(bf, b + 4 * rs, CM, FW, z) if nr > 4 else zr
    q0 = _load_row(bf, b + NL, CM, FW, z) if two else zr
    q1 = _load_row(bf, b + NL + rs, CM, FW, z) if two and nr > 1 else zr
    q2 = _load_row(bf, b + NL + 2 * rs, CM, FW, z) if two and nr > 2 else zr
    for j in range(ja, jb):
        gv = vload(gf, go + j * CM + ch)
        j0 = j * sw - pl
        xi = j0 * XS + (ch // NL) * XQ
        if pg >= 0:
            for e in range(0, 2 * NL if two else NL, NL):
                prefetch(gf, pg + j * CM + ch + e)
                if npx > 0:
                    prefetch(src, px + xi + e)
                    if sw > 1:
                        prefetch(src, px + xi + CM + e)
                if npx > 1:
                    prefetch(src, px + WC + xi + e)
                    if sw > 1:
                        prefetch(src, px + WC + xi + CM + e)
        r0 = _filter_row(r0, gv, src, ro[0] + xi, tc, FW, check, ok[0], j0, dw, W)
        if nr > 1:
            r1 = _filter_row(r1, gv, src, ro[1] + xi, tc, FW, check, ok[1], j0, dw, W)
        if nr > 2:
            r2 = _filter_row(r2, gv, src, ro[2] + xi, tc, FW, check, ok[2], j0, dw, W)
        if nr > 3:
            r3 = _filter_row(r3, gv, src, ro[3] + xi, tc, FW, check, ok[3], j0, dw, W)
        if nr > 4:
            r4 = _filter_row(r4, gv, src, ro[4] + xi, tc, FW, check, ok[4], j0, dw, W)
        if two:
            hv = vload(gf, go + j * CM + ch + NL)
            q0 = _filter_row(q0, hv, src, ro[0] + xi + XQ, tc, FW, check, ok[0], j0, dw, W)
            if nr > 1:
                q1 = _filter_row(q1, hv, src, ro[1] + xi + XQ, tc, FW, check, ok[1], j0, dw,
                                 W)
            if nr > 2:
                q2 = _filter_row(q2, hv, src, ro[2] + xi + XQ, tc, FW, check, ok[2], j0, dw,
                                 W)
    _store_row(bf, b, CM, FW, r0)
    if nr > 1:
        _store_row(bf, b + rs, CM, FW, r1)
    if nr > 2:
        _store_row(bf, b + 2 * rs, CM, FW, r2)
    if nr > 3:
        _store_row(bf, b + 3 * rs, CM, FW, r3)
    if nr > 4:
        _store_row(bf, b + 4 * rs, CM, FW, r4)
    if two:
        _store_row(bf, b + NL, CM, FW, q0)
        if nr > 1:
            _store_row(bf, b + NL + rs, CM, FW, q1)
        if nr > 2:
            _store_row(bf, b + NL + 2 * rs, CM, FW, q2)


@njit(forceinline=True)
def _filter_sweep(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, ja, jb, ow, sw, pl, tc, dw, W,  # type: ignore[no-untyped-def]  # noqa: E501
                  pg, px, npx, WC, two, NL, XS, XQ):
    """All ow output columns of one output row for lane vector ch (``two``: and ch + NL):
    the border columns [0, ja) and [jb, ow) with each tap's pixel checked, the inside
    ones unchecked and prefetching the next output row's lines. An empty border range
    is not called, here rather than by an early return inside _filter_cols (which
    compiled much slower): its accumulators' loads and stores cost time for nothing."""
    if ja > 0:
        _filter_cols(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, True, 0, ja, sw, pl, tc, dw,
                     W, -1, 0, 0, 0, two, NL, XS, XQ)
    _filter_cols(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, False, ja, jb, sw, pl, tc, dw,
                 W, pg, px, npx, WC, two, NL, XS, XQ)
    if jb < ow:
        _filter_cols(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, True, jb, ow, sw, pl, tc, dw,
                     W, -1, 0, 0, 0, two, NL, XS, XQ)


@njit(forceinline=True)
def _filter_sweep_blocked(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, ja, jb, ow, sw, pl, W,  # type: ignore[no-untyped-def]  # noqa: E501
                          pg, NL):
    """_filter_sweep over the lane-vector-blocked ring of M = 2, dilation 1 across: the
    strides are constants there, so each tap's operand is its row's pointer plus a fixed
    displacement. With them as run-time values LLVM keeps a pointer per tap (15 for a 5x5
    filter's three rows), spills them to the stack and reloads one per multiply-add."""
    _filter_sweep(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, ja, jb, ow, sw, pl, NL, 1, W, pg,
                  0, 0, 0, False, NL, NL, W * NL)


@njit(inline="always")
def _filter_group(xf, n, top, dh, rg, nr, H, W, C, M, NL, ring, tags, blocked, ro, ok):  # type: ignore[no-untyped-def]  # noqa: E501
    """ro[k], ok[k] for filter rows rg .. rg + nr - 1 of the output row whose first input
    row is ``top``: where the row starts in the kernel's source, and whether it is inside
    (expanded into the ring on first use, _ring_row). Returns whether all of them are."""
    inside = True
    for k in range(nr):
        ii = top + (rg + k) * dh
        ok[k] = 0 <= ii < H
        ro[k] = _ring_row(xf, n, ii, H, W, C, M, NL, ring, tags, blocked) if ok[k] else 0
        inside = inside and ok[k]
    return inside


def _filter_rows_per_sweep(FW: int) -> int:
    """Filter rows whose tap accumulators share one sweep of out_backprop: as many (up to
    3) as fit in the vector registers beside the operands. On AVX2 a vector takes two of
    16 registers: 3x3 takes 3 rows, 5x5 one (two rows' 10 accumulators would spill)."""
    return min(3, max(1, (21 if HOST_AVX512 else 9) // FW))


def _make_backprop_filter_vec(FH: int, FW: int):  # type: ignore[no-untyped-def]
    NR = _filter_rows_per_sweep(FW)
    # 5x5 with AVX-512: all five rows' 25 accumulators in one sweep where every row is
    # inside: each out_backprop vector is loaded once, not twice as with rows 3 + 2. Not
    # where a padding row is among the five: that would put the whole sweep on the
    # checked path.
    NRI = 5 if HOST_AVX512 and FH == 5 and FW == 5 else NR
    PAIR = HOST_AVX512 and 2 * NR * FW <= 21  # (two lane vectors' accumulators fit)

    @njit(nogil=True, cache=True)
    def kernel(x, g, bufs, sh, sw, dh, dw, pt, pl, ctl, size, ntasks):  # type: ignore[no-untyped-def]
        """bufs[n] = image n's filter gradient, one task per image: for each output row,
        lane vector (or pair, PAIR) and group of NR (up to three; NRI, five, for 5x5 rows
        all inside) filter rows, those rows' taps' accumulators (up to 25 vectors) stay in
        registers over the output columns, taken in order (padding taps add g * 0). One
        sweep of the columns feeds every tap of the group, so each out_backprop vector is
        loaded once per group, not once per filter row."""
        N, H, W, C = x.shape
        oh, ow, CM = g.shape[1], g.shape[2], g.shape[3]
        M = CM // C
        NL = nlanes(x)
        CV = CM - CM % NL
        xf, gf = x.reshape(x.size), g.reshape(g.size)
        zero = np.zeros(1, x.dtype)[0]
        R = _ring_rows(FH, dh) if M > 1 else 0
        ring = aligned_scratch(R * W * CM, x)
        tags = np.full(R, -1, np.int64)
        src = xf if M == 1 else ring
        J0 = min(ow, (pl + sw - 1) // sw)  # columns whose taps all fall inside
        J1 = max(J0, min(ow, (W - 1 - (FW - 1) * dw + pl) // sw + 1))
        # M = 2 on whole lane vectors: x's rows expanded into a ring blocked by lane
        # vector (_row_offset_blocked), so that a sweep reads each row's lines in order
        # (in the pixel-major ring a sweep's lines are C * M values apart)
        blocked = M == 2 and CV == CM
        XS = NL if blocked else CM  # src's pixel stride
        XQ = W * NL if blocked else NL  # src's lane-vector stride
        tc = dw * XS
        ro = np.zeros(5, np.int64)
        ok = np.zeros(5, np.bool_)
        cur = np.zeros(2, np.int64)
        while claim(ctl, size, ntasks, cur):
            for n in range(cur[0], cur[1]):
                bf = bufs[n].reshape(FH * FW * CM)
                bf[:] = zero
                for i in range(oh):
                    go = (n * oh + i) * ow * CM
                    top = i * sh - pt
                    if NRI > NR and blocked and dw == 1 and top >= 0 and top + (FH - 1) * dh < H:
                        _filter_group(xf, n, top, dh, 0, FH, H, W, C, M, NL, ring, tags, True, ro,
                                      ok)
                        pg = go + ow * CM if i + 1 < oh else -1
                        for ch in range(0, CV, NL):
                            _filter_sweep_blocked(bf, gf, src, go, ch, CM, ro, ok, NRI, ch, FW, J0,
                                                  J1, ow, sw, pl, W, pg, NL)
                        continue
                    for rg in range(0, FH, NR):
                        nr = min(NR, FH - rg)
                        inside = _filter_group(xf, n, top, dh, rg, nr, H, W, C, M, NL, ring, tags,
                                               blocked, ro, ok)
                        ja, jb = (J0, J1) if inside else (ow, ow)
                        b = rg * FW * CM
                        pg, px, npx = -1, 0, 0
                        if rg == 0 and i + 1 < oh:
                            pg = go + ow * CM
                            if M == 1:  # (M > 1 expands rows sequentially)
                                last = top + (FH - 1) * dh  # row i's last input row
                                px = (n * H + last + 1) * W * C
                                npx = max(0, min(sh, 2, H - 1 - last))
                        for ch in range(0, CV, NL):
                            if PAIR and CM == 2 * NL:  # one sweep takes whole pixels (an
                                if ch == 0:  # if / else around the loop ran slower)
                                    _filter_sweep(bf, gf, src, go, 0, CM, ro, ok, nr, b, FW, ja,
                                                  jb, ow, sw, pl, tc, dw, W, pg, px, npx, W * C,
                                                  True, NL, XS, XQ)
                                continue
                            if blocked and dw == 1:
                                _filter_sweep_blocked(bf, gf, src, go, ch, CM, ro, ok, nr, b + ch,
                                                      FW, ja, jb, ow, sw, pl, W, pg, NL)
                                continue
                            _filter_sweep(bf, gf, src, go, ch, CM, ro, ok, nr, b + ch, FW, ja, jb,
                                          ow, sw, pl, tc, dw, W, pg, px, npx, W * C, False, NL,
                                          XS, XQ)
                        for k in range(nr):  # lanes past the last full vector
                            for c in range(FW):
                                e = b + (k * FW + c) * CM
                                for ch in range(CV, CM):
                                    s_ = bf[e + ch]
                                    for j in range(ow):
                                        jj = j * sw - pl + c * dw
                                        xv = zero
                                        if ok[k] and 0 <= jj < W:
                                            xv = src[ro[k] + jj * CM + ch]
                                        s_ = s_ + gf[go + j * CM + ch] * xv
                                    bf[e + ch] = s_

    return kernel


_FACTORIES = {"forward": _make_forward_vec, "backprop_input": _make_backprop_input_vec,
              "backprop_filter": _make_backprop_filter_vec}


def _vec_kernel(kind: str, fh: int, fw: int, mode: int, *flags: bool):  # type: ignore[no-untyped-def]  # noqa: E501
    """The register-blocked kernel for this filter size, or None where there is none
    (other sizes, and the half types, which round after every step). ``flags``: the
    forward's ``stream`` (its output written with non-temporal stores), BackpropInput's
    ``stream, blocked`` (see its factory); BackpropFilter, whose output is small, has
    none."""
    if mode != NONE or (fh, fw) not in _VEC_SIZES:
        return None
    key = (kind, fh, fw, *flags)
    if key not in _VEC_KERNELS:
        _VEC_KERNELS[key] = _FACTORIES[kind](fh, fw, *flags)
    return _VEC_KERNELS[key]


_INLINE_WORK = 1 << 20
"""Ops of fewer multiply-adds than this run on the calling thread alone: waking a pool
thread costs more than such an op takes. (Tests lower it.)"""


def _threads(work: int) -> int:
    return num_threads() if work >= _INLINE_WORK else 1


def _macs(geo: Geometry) -> int:
    """The op's multiply-adds: one per out_backprop (output) element and tap."""
    return geo.N * geo.oh * geo.ow * geo.C * geo.M * geo.fh * geo.fw


def _run(kernel, ntasks: int, work: int, *args) -> None:  # type: ignore[no-untyped-def]
    """kernel(*args, ctl, size, ntasks) over the tasks [0, ntasks), on
    numba.get_num_threads() threads (this one included) that claim chunks of tasks as
    they come free (``_pool``); on this thread alone when ``work`` (the op's
    multiply-adds) is under _INLINE_WORK. Every task computes the same bits whichever
    thread runs it."""
    _pool_run(kernel, ntasks, _threads(work), *args)


def _prepare(*arrays: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.dtype, int]:
    """Contiguous float32 / float64 arrays for the kernels, T and the rounding mode.

    Read-only inputs are copied (never written either way): one array type per dtype
    keeps the number of compiled specialisations at two."""
    dt = arrays[0].dtype
    mode = NONE if dt in (_F32, _F64) else F16 if dt == np.float16 else BF16
    wdt = _work_dtype(dt)
    return tuple(a if a.dtype == wdt and a.flags.c_contiguous and a.flags.writeable
                 else np.require(a, wdt, ("C", "W")) for a in arrays), dt, mode


def _work_dtype(dt: np.dtype) -> np.dtype:
    return _F64 if dt == _F64 else _F32


def _group(mode: int) -> int:
    """Terms per register-accumulated pass: 4, or 1 where T rounds after every step."""
    return 4 if mode == NONE else 1


def _weight_tile(w: np.ndarray, ow: int) -> np.ndarray:
    """[fh, fw, JT * C * M]: each tap's weights repeated for JT output pixels (about
    16 KiB per tap), the other operand of the kernels' contiguous runs."""
    fh, fw, C, M = w.shape
    cm = max(1, C * M)
    jt = max(1, min(ow, 4096 // cm))
    return np.ascontiguousarray(np.tile(w.reshape(fh, fw, 1, C * M), (1, 1, jt, 1))
                                .reshape(fh, fw, jt * C * M))


def forward(x: np.ndarray, w: np.ndarray, geo: Geometry) -> np.ndarray:
    (x, w), dt, mode = _prepare(x, w)
    work = _macs(geo)
    # A large output of whole-line pixels goes out with non-temporal stores (register
    # kernels): no read-for-ownership of lines that are only written.
    out, stream = stream_output((geo.N, geo.oh, geo.ow, geo.C * geo.M), _work_dtype(dt),
                                _STREAM_MIN_BYTES)
    vec = _vec_kernel("forward", geo.fh, geo.fw, mode, stream)
    negz = np.zeros(geo.N * geo.oh, np.bool_)  # output rows with a -0 (dilated: to redo)
    if out.size and vec is not None:
        _run(vec, geo.N * geo.oh, work, x, w, out, geo.sh, geo.sw, geo.dh, geo.dw, geo.pt,
             geo.pl, negz)
    elif out.size:
        _run(_forward, geo.N * geo.oh, work, x, w, _weight_tile(w, geo.ow), out, geo.sh,
             geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, mode, _group(mode), negz)
    if (geo.dh > 1 or geo.dw > 1) and negz.any():  # TF's inserted zeros (see _negzero)
        _redo_negzero_forward(x, w, out, geo.sh, geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, mode,
                              negz)
    return out.astype(dt, copy=False)


def backprop_input(w: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    (w, g), dt, mode = _prepare(w, g)
    work = _macs(geo)
    out, stream = stream_output((geo.N, geo.H, geo.W, geo.C), _work_dtype(dt),
                                _STREAM_MIN_BYTES)
    if out.size == 0:
        return out.astype(dt, copy=False)
    if geo.M == 0:  # the empty sum (TF leaves this output uninitialised)
        return np.zeros(out.shape, dt)
    lanes = 4 if dt == _F64 else 8
    args = (geo.sh, geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, mode, lanes)
    # (M > 1 writes out after the multiplier reduction, one value at a time: no streaming,
    # but for M = 2's pair blocks, which write whole lane vectors of out: ``pstream``)
    # (M > 1 on whole lane vectors: out_backprop rows through a ring blocked by lane vector)
    blocked = geo.M > 1 and geo.C * geo.M % (64 // g.dtype.itemsize) == 0
    vec = _vec_kernel("backprop_input", geo.fh, geo.fw, mode, stream and geo.M == 1, blocked,
                      stream and geo.M == 2)
    finite = bool(np.isfinite(w).all())
    negz = np.zeros(geo.N * geo.H, np.bool_)  # input rows with a -0 to redo
    if finite and vec is not None:
        _run(vec, geo.N * geo.H, work, w, g, out, *args[:6], lanes, negz)
    elif finite and mode == NONE:
        _run(_backprop_input_finite, geo.N * geo.H, work, w, _weight_tile(w, geo.ow), g, out,
             *args, _group(mode), negz)
    else:
        # The taps that miss compute w * 0: NaN for an inf filter value, and in the half
        # types a -0 (a product that underflowed) becomes +0 when w >= 0.
        _run(_backprop_input_any, geo.N * geo.H, work, w, g, out, *args)
        negz[:] = geo.dh > 1 or geo.dw > 1  # (TF's inserted zeros)
    if negz.any():
        _redo_negzero(w.reshape(geo.fh, geo.fw, geo.C, geo.M), g, out, *args, negz)
    return out.astype(dt, copy=False)


def backprop_filter(x: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    (x, g), dt, mode = _prepare(x, g)
    wdt = _work_dtype(dt)
    shape = (geo.fh, geo.fw, geo.C, geo.M)
    total = np.zeros(shape, wdt)
    if total.size == 0 or geo.N == 0 or geo.oh * geo.ow == 0:
        return total.astype(dt, copy=False)  # (TF returns uninitialised memory for these)
    work = _macs(geo)
    threads = _threads(work)
    bufs = aligned_empty((geo.N, geo.fh, geo.fw, geo.C * geo.M), wdt)
    vec = _vec_kernel("backprop_filter", geo.fh, geo.fw, mode)
    if vec is not None and geo.N >= threads:
        _run(vec, geo.N, work, x, g, bufs, geo.sh, geo.sw, geo.dh, geo.dw, geo.pt, geo.pl)
    elif geo.dw == 1 and geo.N >= threads:  # one task per image, filter rows as runs
        _run(_backprop_filter_rows, geo.N, work, x, g, bufs, geo.sh, geo.sw, geo.dh, geo.pt,
             geo.pl, mode, _group(mode))
    else:
        # Enough (image, channel block) tasks for every thread; the blocking does not
        # change any element's arithmetic.
        nkb = min(geo.C, max(1, -(-2 * threads // geo.N)))
        kblock = -(-geo.C // nkb)
        _run(_backprop_filter, geo.N * -(-geo.C // kblock), work, x, g, bufs, kblock, geo.sh,
             geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, mode, _group(mode))
    _sum_images(bufs, total, mode)
    return total.astype(dt, copy=False)
