"""Fused Numba kernels for fractional max/avg pooling and their gradients.

Cells arrive as start/end (inclusive, clamped) index arrays that ``tfgrad.ops.
fractional_pool`` has validated: every index a kernel touches lies inside its arrays.
Each output element is owned by exactly one loop iteration and is computed in TF's order,
so the results do not depend on the thread count. The threaded kernels take their tasks
in chunks (``tfgrad.kernels._pool``: one compiled function for any thread count, where a
``prange`` kernel compiled a parallel and a serial twin, the parallel one several times
slower to compile); they run with TF's FTZ / DAZ, which the op sets on the calling thread
and the pool's threads keep for good (``tfgrad._tf.fpenv``). ``tfgrad.dispatch.
fractional_pool`` runs them.
"""

from __future__ import annotations

import numpy as np

from .._compile import inline, jit
from ._pool import claim, tasks
from ._simd import (
    flush_denormal,
    nlanes,
    prefetch,
    vadd,
    vany_ne,
    vdiv,
    vfull,
    vload,
    vmax_keep,
    vput,
    vstore,
    vwhere_eq,
    vwhere_lt,
    vzeros,
)


@jit
def philox(c0, c1, c2, c3, k0, k1, blocks, out):  # pragma: no cover - compiled
    """Philox4x32-10 outputs for ``blocks`` consecutive 128-bit counters (lanes c0..c3,
    c0 lowest), key (k0, k1); all values < 2**32 held in uint64."""
    m = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    for blk in range(blocks):
        x0, x1, x2, x3 = c0, c1, c2, c3
        a, bb = k0, k1
        for rnd in range(10):
            p0 = np.uint64(0xD2511F53) * x0
            p1 = np.uint64(0xCD9E8D57) * x2
            x0, x1, x2, x3 = ((p1 >> s32) ^ x1 ^ a) & m, p1 & m, ((p0 >> s32) ^ x3 ^ bb) & m, \
                p0 & m
            if rnd < 9:
                a = (a + np.uint64(0x9E3779B9)) & m
                bb = (bb + np.uint64(0xBB67AE85)) & m
        out[4 * blk] = x0
        out[4 * blk + 1] = x1
        out[4 * blk + 2] = x2
        out[4 * blk + 3] = x3
        # 128-bit counter increment
        c0 = (c0 + np.uint64(1)) & m
        if c0 == 0:
            c1 = (c1 + np.uint64(1)) & m
            if c1 == 0:
                c2 = (c2 + np.uint64(1)) & m
                if c2 == 0:
                    c3 = (c3 + np.uint64(1)) & m


@jit(nogil=True)
def max_pool_int(x, rs, re, cs, ce, lowest, out, ctl, nthreads):  # pragma: no cover
    """Integer T: out[b,i,j,:] = max over cell (i, j), starting at ``lowest``.

    Flat unsigned offsets: no negative-index fix-ups, so the depth loop vectorises."""
    n, H, W, D = x.shape
    mr, mc = rs.size, cs.size
    xf, of = x.reshape(-1), out.reshape(-1)
    ud = np.uint64(D)
    ntasks = n * mr
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            b = t // mr
            i = t - b * mr
            for j in range(mc):
                ob = np.uint64((t * mc + j) * D)
                for d in range(ud):
                    of[ob + d] = lowest
                for h in range(rs[i], re[i] + 1):
                    for w in range(cs[j], ce[j] + 1):
                        xb = np.uint64(((b * H + h) * W + w) * D)
                        for d in range(ud):
                            v = xf[xb + d]
                            a = of[ob + d]
                            of[ob + d] = v if a < v else a


@jit(nogil=True)
def avg_pool_int(x, rs, re, cs, ce, counts, out, ctl, nthreads):  # pragma: no cover
    """Integer T: out[b,i,j,:] = (sum in T over cell, row-major, wrapping) / count,
    truncated toward zero."""
    n, H, W, D = x.shape
    mr, mc = rs.size, cs.size
    xf, of = x.reshape(-1), out.reshape(-1)
    ud = np.uint64(D)
    ntasks = n * mr
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            b = t // mr
            i = t - b * mr
            for j in range(mc):
                ob = np.uint64((t * mc + j) * D)
                for d in range(ud):
                    of[ob + d] = 0
                for h in range(rs[i], re[i] + 1):
                    for w in range(cs[j], ce[j] + 1):
                        xb = np.uint64(((b * H + h) * W + w) * D)
                        for d in range(ud):
                            of[ob + d] = of[ob + d] + xf[xb + d]
                count = counts[i, j]
                for d in range(ud):
                    s = of[ob + d]
                    q = s // count
                    if s < 0 and q * count != s:
                        q += 1
                    of[ob + d] = q


@inline
def _acc(a, v, is_max):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    return vmax_keep(a, v) if is_max else vadd(a, v)


@inline
def _fin(a, cnt, is_max):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    # TF's max is an x86 max instruction, which under DAZ returns a denormal as 0
    return flush_denormal(a) if is_max else vdiv(a, cnt)


def _make_pool_vec(is_max: bool, stream: bool):  # type: ignore[no-untyped-def]
    """max_pool_int / avg_pool_int for float32/float64, register-blocked: a cell's running
    maxima (or sums, rounded to T after every add as TF's) for eight channel vectors stay
    in registers across its taps, and the output is written once. With ``stream`` (large
    tensors; out 64-byte aligned, a pixel's channels whole 64-byte lines), the outputs go
    out with non-temporal stores and each cell prefetches the input lines that the next
    row cell will add (a thread's tasks are consecutive rows).
    Channels past the last block of eight vectors go one vector, then one value, at a
    time. The max is order-independent (a NaN never wins, the earlier of -0/+0 stays)
    and every sum keeps TF's row-major order, so any blocking gives TF's bits."""

    def kernel(x, rs, re, cs, ce, lowest, counts, out, ctl, nthreads):  # type: ignore[no-untyped-def]  # pragma: no cover  # noqa: E501
        """``lowest`` starts every maximum or sum: T's lowest or +0."""
        n, H, W, D = x.shape
        mr, mc = rs.size, cs.size
        xf, of = x.reshape(-1), out.reshape(-1)
        L = nlanes(xf)
        D8 = D - D % (8 * L)
        D1 = D - D % L
        WD = W * D
        ntasks = n * mr
        size, cur = tasks(ctl, ntasks, nthreads)
        while claim(ctl, size, ntasks, cur):
            for t in range(cur[0], cur[1]):
                b = t // mr
                i = t - b * mr
                nh = re[i] - rs[i] + 1
                row0 = (b * H + rs[i]) * WD
                for j in range(mc):
                    o = (t * mc + j) * D
                    nw = ce[j] - cs[j] + 1
                    k0 = row0 + cs[j] * D
                    cnt = vfull(xf, counts[i, j])
                    init = vfull(xf, lowest)
                    if stream and i + 1 < mr:
                        for h in range(re[i] + 1, re[i + 1] + 1):
                            k = (b * H + h) * WD + cs[j] * D
                            for q in range(0, nw * D, L):
                                prefetch(xf, k + q)
                    for d in range(0, D8, 8 * L):
                        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = init
                        kr = k0 + d
                        for _ in range(nh):
                            k = kr
                            for _ in range(nw):
                                a0 = _acc(a0, vload(xf, k), is_max)
                                a1 = _acc(a1, vload(xf, k + L), is_max)
                                a2 = _acc(a2, vload(xf, k + 2 * L), is_max)
                                a3 = _acc(a3, vload(xf, k + 3 * L), is_max)
                                a4 = _acc(a4, vload(xf, k + 4 * L), is_max)
                                a5 = _acc(a5, vload(xf, k + 5 * L), is_max)
                                a6 = _acc(a6, vload(xf, k + 6 * L), is_max)
                                a7 = _acc(a7, vload(xf, k + 7 * L), is_max)
                                k += D
                            kr += WD
                        a0, a1 = _fin(a0, cnt, is_max), _fin(a1, cnt, is_max)
                        a2, a3 = _fin(a2, cnt, is_max), _fin(a3, cnt, is_max)
                        a4, a5 = _fin(a4, cnt, is_max), _fin(a5, cnt, is_max)
                        a6, a7 = _fin(a6, cnt, is_max), _fin(a7, cnt, is_max)
                        vput(of, o + d, a0, stream)
                        vput(of, o + d + L, a1, stream)
                        vput(of, o + d + 2 * L, a2, stream)
                        vput(of, o + d + 3 * L, a3, stream)
                        vput(of, o + d + 4 * L, a4, stream)
                        vput(of, o + d + 5 * L, a5, stream)
                        vput(of, o + d + 6 * L, a6, stream)
                        vput(of, o + d + 7 * L, a7, stream)
                    for d in range(D8, D1, L):
                        a0 = init
                        kr = k0 + d
                        for _ in range(nh):
                            k = kr
                            for _ in range(nw):
                                a0 = _acc(a0, vload(xf, k), is_max)
                                k += D
                            kr += WD
                        vput(of, o + d, _fin(a0, cnt, is_max), stream)
                    for d in range(D1, D):
                        s = lowest
                        kr = k0 + d
                        for _ in range(nh):
                            k = kr
                            for _ in range(nw):
                                v = xf[k]
                                if is_max:
                                    s = v if s < v else s
                                else:
                                    s = s + v
                                k += D
                            kr += WD
                        of[o + d] = flush_denormal(s) if is_max else s / counts[i, j]

    return jit(nogil=True)(kernel)


POOL_VEC = {(m, st): _make_pool_vec(m, st) for m in (False, True) for st in (False, True)}
"""The float kernels by (max, streamed stores)."""


@inline
def _shares(g, b, r, rs, re, cs, ce, q):  # pragma: no cover - compiled
    """q[c, d] = double(g[b, r, c, d]) / count of cell (r, c), TF's per-element share."""
    rows = re[r] - rs[r] + 1
    for c in range(cs.size):
        count = np.float64(rows * (ce[c] - cs[c] + 1))
        for d in range(g.shape[3]):
            q[c, d] = np.float64(g[b, r, c, d]) / count


@inline
def _to_t(a, is_int, lo):  # pragma: no cover - compiled
    """static_cast<T>(double): floats round once; ints truncate, and outside T's range
    x86's conversion gives T's minimum (returned here as ``lo``)."""
    if is_int and not (a >= lo and a < -lo):
        return lo
    return a


def _make_avg_pool_grad(is_int: bool):  # type: ignore[no-untyped-def]
    """The average pooling's gradient for float (``is_int`` False) or integer T: a
    compile-time flag, as a run-time one kept the float loops from vectorising as well
    (1.35x slower)."""

    def kernel(g, rs, re, cs, ce, own_lo, own_hi, r_first, r_last, c_first, c_last,
               lo, out, ctl, nthreads):  # type: ignore[no-untyped-def]  # pragma: no cover
        """Tasks are (batch, row cell r); task r writes the input rows whose last covering
        cell is r. An input element sums, in double from +0.0 and in output row-major
        order, the shares of the cells containing it (at most 2 x 2: the sequences are
        strictly increasing), then rounds to T once. Shares are computed once per task and
        output row (rows r-1 and r), not per input element, and not into a full-size buffer."""
        n, mr, mc, depth = g.shape
        h_in, w_in = out.shape[1], out.shape[2]
        q = np.empty((2, mc, depth), np.float64)  # slot 0: row r-1, slot 1: row r
        # flat unsigned offsets: no negative-index fix-ups, so the depth loops vectorise
        of, qf, ud = out.reshape(-1), q.reshape(-1), np.uint64(depth)
        ntasks = n * mr
        size, cur = tasks(ctl, ntasks, nthreads)
        while claim(ctl, size, ntasks, cur):
            for t in range(cur[0], cur[1]):
                b = t // mr
                r = t - b * mr
                _shares(g, b, r, rs, re, cs, ce, q[1])
                have_prev = False
                for h in range(own_lo[r], own_hi[r] + 1):
                    r0, r1 = r_first[h], r_last[h]
                    if r0 < r and r0 <= r1 and not have_prev:  # boundary row shared with r-1
                        _shares(g, b, r - 1, rs, re, cs, ce, q[0])
                        have_prev = True
                    s0 = r0 - r + 1
                    for w in range(w_in):
                        c0, c1 = c_first[w], c_last[w]
                        o = np.uint64(((b * h_in + h) * w_in + w) * depth)
                        if r1 < r0 or c1 < c0:  # outside every cell
                            for d in range(ud):
                                of[o + d] = 0
                            continue
                        p00 = np.uint64((s0 * mc + c0) * depth)
                        p01 = np.uint64((s0 * mc + c1) * depth)
                        p10 = np.uint64(((s0 + 1) * mc + c0) * depth)
                        p11 = np.uint64(((s0 + 1) * mc + c1) * depth)
                        if r0 == r1 and c0 == c1:
                            for d in range(ud):
                                of[o + d] = _to_t(0.0 + qf[p00 + d], is_int, lo)
                        elif r0 == r1:
                            for d in range(ud):
                                a = (0.0 + qf[p00 + d]) + qf[p01 + d]
                                of[o + d] = _to_t(a, is_int, lo)
                        elif c0 == c1:
                            for d in range(ud):
                                a = (0.0 + qf[p00 + d]) + qf[p10 + d]
                                of[o + d] = _to_t(a, is_int, lo)
                        else:
                            for d in range(ud):
                                a = (((0.0 + qf[p00 + d]) + qf[p01 + d]) + qf[p10 + d]) \
                                    + qf[p11 + d]
                                of[o + d] = _to_t(a, is_int, lo)

    return jit(nogil=True)(kernel)


AVG_POOL_GRAD = {i: _make_avg_pool_grad(i) for i in (False, True)}
"""The average pooling's gradient by integer T."""


@jit(nogil=True)
def max_pool_argmax(x, y, rs, re, cs, ce, arg, bad, ctl, nthreads):  # pragma: no cover
    """arg[b,r,c,d] = row-major position in cell (r, c) of its first maximum, replaying
    TF's scan (best = first element; best = v if best < v). False if a replayed maximum
    differs from y (TF's tensor_out_dup check)."""
    n, depth = x.shape[0], x.shape[3]
    mr, mc = rs.size, cs.size
    best = np.empty(depth, x.dtype)
    code = np.empty(depth, np.int32)
    ntasks = n * mr
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            b = t // mr
            r = t - b * mr
            for c in range(mc):
                h0, w0 = rs[r], cs[c]
                for d in range(depth):
                    best[d] = x[b, h0, w0, d]
                    code[d] = 0
                k = 0
                for h in range(h0, re[r] + 1):
                    for w in range(w0, ce[c] + 1):
                        for d in range(depth):
                            v = x[b, h, w, d]
                            better = best[d] < v  # ties keep the first maximum; NaN never wins
                            best[d] = v if better else best[d]
                            code[d] = k if better else code[d]
                        k += 1
                for d in range(depth):
                    if best[d] != y[b, r, c, d]:
                        bad[t] = True
                    arg[b, r, c, d] = code[d]


@inline
def _pick(g, arg, b, r, c, d, k, none):  # pragma: no cover - compiled
    return g[b, r, c, d] if arg[b, r, c, d] == k else none


@jit(nogil=True)
def max_pool_grad(g, arg, rs, cs, ce, own_lo, own_hi, r_first, r_last, c_first, c_last,
                   zero, out, ctl, nthreads):  # pragma: no cover - compiled
    """Each input element gathers, in T from zero and in output row-major order, the g of
    the (at most 2 x 2) cells whose argmax it is: the sums TF's scatter makes, without
    races. The other cells add -0 (``none``), which changes no sum, not even a sum
    flushed to -0 (TF's FTZ), which + 0 would turn into +0."""
    n, mr, mc, depth = g.shape
    w_in = out.shape[2]
    none = -zero
    ntasks = n * mr
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for t in range(cur[0], cur[1]):
            b = t // mr
            r = t - b * mr
            for h in range(own_lo[r], own_hi[r] + 1):
                r0, r1 = r_first[h], r_last[h]
                for w in range(w_in):
                    c0, c1 = c_first[w], c_last[w]
                    if r1 < r0 or c1 < c0:  # outside every cell
                        for d in range(depth):
                            out[b, h, w, d] = zero
                        continue
                    # position of (h, w) in each covering cell, row-major
                    k00 = (h - rs[r0]) * (ce[c0] - cs[c0] + 1) + (w - cs[c0])
                    k01 = (h - rs[r0]) * (ce[c1] - cs[c1] + 1) + (w - cs[c1])
                    k10 = (h - rs[r1]) * (ce[c0] - cs[c0] + 1) + (w - cs[c0])
                    k11 = (h - rs[r1]) * (ce[c1] - cs[c1] + 1) + (w - cs[c1])
                    if r0 == r1 and c0 == c1:
                        for d in range(depth):
                            out[b, h, w, d] = zero + _pick(g, arg, b, r0, c0, d, k00, none)
                    elif r0 == r1:
                        for d in range(depth):
                            out[b, h, w, d] = (zero + _pick(g, arg, b, r0, c0, d, k00, none)) \
                                + _pick(g, arg, b, r0, c1, d, k01, none)
                    elif c0 == c1:
                        for d in range(depth):
                            out[b, h, w, d] = (zero + _pick(g, arg, b, r0, c0, d, k00, none)) \
                                + _pick(g, arg, b, r1, c0, d, k10, none)
                    else:
                        for d in range(depth):
                            v = zero + _pick(g, arg, b, r0, c0, d, k00, none)
                            v = v + _pick(g, arg, b, r0, c1, d, k01, none)
                            v = v + _pick(g, arg, b, r1, c0, d, k10, none)
                            out[b, h, w, d] = v + _pick(g, arg, b, r1, c1, d, k11, none)


ROWS_PER_TASK = 8
"""Output rows per task of the fused max gradient: each task recomputes the argmax codes
of the row cell before its first one (needed for overlapping boundary rows)."""


@inline
def _argmax_codes(xf, yf, b, r, H, W, D, L, rs, re, cs, ce, codes, slot, pf):  # type: ignore[no-untyped-def]  # pragma: no cover  # noqa: E501
    """codes[slot + c*D + d] = row-major position (as T) in cell (r, c) of its first
    maximum, replaying TF's scan (best = first element; best = v if best < v); False if
    a replayed maximum differs from orig_output (TF's tensor_out_dup check). With
    ``pf``, prefetches the input lines that row cell r + 1 adds."""
    mr, mc = rs.size, cs.size
    WD = W * D
    ok = True
    nh = re[r] - rs[r] + 1
    for c in range(mc):
        nw = ce[c] - cs[c] + 1
        k0 = (b * H + rs[r]) * WD + cs[c] * D
        if pf and r + 1 < mr:
            for h in range(re[r] + 1, re[r + 1] + 1):
                k = (b * H + h) * WD + cs[c] * D
                for q in range(0, nw * D, L):
                    prefetch(xf, k + q)
        yo = ((b * mr + r) * mc + c) * D
        for d in range(0, D, L):
            best = vload(xf, k0 + d)
            code = vzeros(xf)
            kr = k0 + d
            pos = 0
            for _ in range(nh):
                k = kr
                for _ in range(nw):
                    v = vload(xf, k)
                    code = vwhere_lt(best, v, vfull(xf, pos), code)
                    best = vmax_keep(best, v)
                    pos += 1
                    k += D
                kr += WD
            if vany_ne(best, vload(yf, yo + d)):
                ok = False
            vstore(codes, slot + c * D + d, code)
    return ok


@inline
def _vpick(codes, s, i, pos, gf, j, none):  # type: ignore[no-untyped-def]  # pragma: no cover
    """_pick for a channel vector: g's lanes where the cell's argmax code is pos."""
    return vwhere_eq(vload(codes, s + i), vfull(gf, pos), vload(gf, j), none)


def _make_max_grad_vec(stream: bool):  # type: ignore[no-untyped-def]
    """max_pool_argmax and max_pool_grad fused, for float32/float64 with whole channel
    vectors: each task takes up to ROWS_PER_TASK row cells of one image, finds each
    cell's argmax codes (as T, exact: cells have < 2**24 elements) into a two-row
    buffer, and then gathers, per input element of the rows it owns, the g of the cells
    whose argmax it is, in TF's order. No output-sized argmax array; with ``stream``,
    non-temporal stores and a prefetch of the next row cell's input lines."""
    def kernel(x, y, g, rs, re, cs, ce, own_lo, own_hi, r_first, r_last, c_first, c_last,
               out, bad, ctl, nthreads):  # type: ignore[no-untyped-def]  # pragma: no cover
        n, H, W, D = x.shape
        mr, mc = rs.size, cs.size
        xf, yf, gf, of = x.reshape(-1), y.reshape(-1), g.reshape(-1), out.reshape(-1)
        L = nlanes(xf)
        per = (mr + ROWS_PER_TASK - 1) // ROWS_PER_TASK
        codes = np.empty(2 * mc * D, x.dtype)  # row cell r at (r % 2) * mc * D
        ntasks = n * per
        size, cur = tasks(ctl, ntasks, nthreads)
        while claim(ctl, size, ntasks, cur):
            for t in range(cur[0], cur[1]):
                b = t // per
                r_lo = (t - b * per) * ROWS_PER_TASK
                r_hi = min(r_lo + ROWS_PER_TASK, mr)
                if r_lo > 0 and r_first[own_lo[r_lo]] < r_lo:
                    _argmax_codes(xf, yf, b, r_lo - 1, H, W, D, L, rs, re, cs, ce, codes,
                                  (r_lo - 1) % 2 * mc * D, False)
                zero = vzeros(gf)
                none = vfull(gf, -0.0)  # the other cells add -0: no sum changes (max_pool_grad)
                for r in range(r_lo, r_hi):
                    if not _argmax_codes(xf, yf, b, r, H, W, D, L, rs, re, cs, ce, codes,
                                         r % 2 * mc * D, stream):
                        bad[t] = True
                    for h in range(own_lo[r], own_hi[r] + 1):
                        r0, r1 = r_first[h], r_last[h]
                        s0, s1 = r0 % 2 * mc * D, r1 % 2 * mc * D
                        for w in range(W):
                            c0, c1 = c_first[w], c_last[w]
                            o = ((b * H + h) * W + w) * D
                            if r1 < r0 or c1 < c0:  # outside every cell
                                for d in range(0, D, L):
                                    vput(of, o + d, zero, stream)
                                continue
                            # position of (h, w) in each covering cell, row-major
                            k00 = (h - rs[r0]) * (ce[c0] - cs[c0] + 1) + (w - cs[c0])
                            k01 = (h - rs[r0]) * (ce[c1] - cs[c1] + 1) + (w - cs[c1])
                            k10 = (h - rs[r1]) * (ce[c0] - cs[c0] + 1) + (w - cs[c0])
                            k11 = (h - rs[r1]) * (ce[c1] - cs[c1] + 1) + (w - cs[c1])
                            g00 = ((b * mr + r0) * mc + c0) * D
                            g01 = ((b * mr + r0) * mc + c1) * D
                            g10 = ((b * mr + r1) * mc + c0) * D
                            g11 = ((b * mr + r1) * mc + c1) * D
                            for d in range(0, D, L):
                                v = vadd(zero, _vpick(codes, s0, c0 * D + d, k00, gf, g00 + d,
                                                      none))
                                if c1 != c0:
                                    v = vadd(v, _vpick(codes, s0, c1 * D + d, k01, gf,
                                                       g01 + d, none))
                                if r1 != r0:
                                    v = vadd(v, _vpick(codes, s1, c0 * D + d, k10, gf,
                                                       g10 + d, none))
                                    if c1 != c0:
                                        v = vadd(v, _vpick(codes, s1, c1 * D + d, k11, gf,
                                                           g11 + d, none))
                                vput(of, o + d, v, stream)

    return jit(nogil=True)(kernel)


MAX_GRAD_VEC = {st: _make_max_grad_vec(st) for st in (False, True)}
"""The fused float max gradient by streamed stores."""
