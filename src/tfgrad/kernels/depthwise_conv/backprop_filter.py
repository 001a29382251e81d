"""DepthwiseConv2dNativeBackpropFilter's kernels: per-image filter gradients (generic,
by filter rows, and register-blocked: :func:`make_vec`), then their sum in batch order
(docs/depthwise_conv.md, "How the kernels compute it")."""

from __future__ import annotations

import numpy as np

from ..._compile import inline, jit
from .._pool import claim
from .._simd import (
    HOST_AVX512,
    aligned_scratch,
    nlanes,
    prefetch,
    vload,
    vload_part,
    vmuladd,
    vstore,
    vstore_part,
    vzeros,
)
from . import filter_rows_per_sweep
from .common import (
    NONE,
    _mac,
    _ring_row,
    _ring_rows,
    _round,
    _round_all,
    _tap_range,
)


@inline
def _mac_flat(o, ob, a, b, ia0, ib0, ia1, ib1, ia2, ib2, ia3, ib3, nt, L):
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


@jit(nogil=True)
def by_channel_blocks(x, g, bufs, kblock, sh, sw, dh, dw, pt, pl, mode, G, ctl, size, ntasks):
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


@inline
def _filter_border(br, gt, jt, xr, j, sw, pl, fw, W, CM, mode):
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


@jit(nogil=True)
def by_rows(x, g, bufs, sh, sw, dh, pt, pl, mode, G, ctl, size, ntasks):
    """bufs[n] as by_channel_blocks, for dilation 1 along W and one task per image: the fw
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


@jit(nogil=True)
def sum_images(bufs, total, mode):
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


# BackpropFilter's helpers are inlined by LLVM (forceinline), not by Numba (inline=
# "always"): Numba deep-copies a callee's IR at every site, and these nest 3 x 3 x 7 deep,
# which made each filter size compile several times longer. Same speed, same bits.
@inline(force=True)
def _tap_x(src, check, ok, jj, W, i):
    """src's lanes at i; with ``check``, +0 unless the tap's pixel (row ok, column jj) is
    inside (a padding tap still adds g * 0, as TF)."""
    if not check or (ok and 0 <= jj < W):
        return vload(src, i)
    return vzeros(src)


@inline(force=True)
def _filter_row(a, gv, src, xi, tc, FW, check, ok, j0, dw, W):
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


@inline(force=True)
def _load_row(bf, b, CM, FW, z):
    return (vload(bf, b), vload(bf, b + CM) if FW > 1 else z,
            vload(bf, b + 2 * CM) if FW > 2 else z, vload(bf, b + 3 * CM) if FW > 3 else z,
            vload(bf, b + 4 * CM) if FW > 4 else z, vload(bf, b + 5 * CM) if FW > 5 else z,
            vload(bf, b + 6 * CM) if FW > 6 else z)


@inline(force=True)
def _store_row(bf, b, CM, FW, a):
    for c in range(FW):
        vstore(bf, b + c * CM, a[c])


@inline(force=True)
def _filter_cols(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, check, ja, jb, sw, pl, tc, dw, W,
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


@inline(force=True)
def _filter_sweep(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, ja, jb, ow, sw, pl, tc, dw, W,
                  pg, px, npx, WC, two, NL, XS, XQ):
    """All ow output columns of one output row for lane vector ch (``two``: and ch + NL):
    the border columns [0, ja) and [jb, ow) with each tap's pixel checked, the inside
    ones unchecked and prefetching the next output row's lines. An empty border range
    is not called, here rather than by an early return inside _filter_cols (which
    compiled much slower): its accumulators' loads and stores cost time for nothing."""
    if ja > 0:  # (from a run-time 0: a literal 0 would compile _filter_cols once more)
        _filter_cols(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, True, ja - ja, ja, sw, pl, tc, dw,
                     W, -1, 0, 0, 0, two=two, NL=NL, XS=XS, XQ=XQ)
    _filter_cols(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, False, ja, jb, sw, pl, tc, dw,
                 W, pg, px, npx, WC, two=two, NL=NL, XS=XS, XQ=XQ)
    if jb < ow:
        _filter_cols(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, True, jb, ow, sw, pl, tc, dw,
                     W, -1, 0, 0, 0, two=two, NL=NL, XS=XS, XQ=XQ)


@inline(force=True)
def _filter_sweep_blocked(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, ja, jb, ow, sw, pl, W,
                          pg, NL):
    """_filter_sweep over the lane-vector-blocked ring of M = 2, dilation 1 across: the
    strides are constants there, so each tap's operand is its row's pointer plus a fixed
    displacement. With them as run-time values LLVM keeps a pointer per tap (15 for a 5x5
    filter's three rows), spills them to the stack and reloads one per multiply-add."""
    _filter_sweep(bf, gf, src, go, ch, CM, ro, ok, nr, b, FW, ja, jb, ow, sw, pl, NL, 1, W, pg,
                  0, 0, 0, two=False, NL=NL, XS=NL, XQ=W * NL)


@inline
def _filter_group(xf, n, top, dh, rg, nr, H, W, C, M, NL, ring, tags, blocked, ro, ok):
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


def make_vec(FH: int, FW: int, *, pair: bool):
    NR = filter_rows_per_sweep(FW)
    # 5x5 with AVX-512: all five rows' 25 accumulators in one sweep where every row is
    # inside: each out_backprop vector is loaded once, not twice as with rows 3 + 2. Not
    # where a padding row is among the five: that would put the whole sweep on the
    # checked path.
    NRI = 5 if HOST_AVX512 and FH == 5 and FW == 5 else NR
    # Variant.pair (the dispatch sets it exactly where C * M is two lane vectors and
    # filter_pairs holds): without it Numba prunes the branch that tests it first, and the
    # pair sweep is not compiled. (With it the other sweeps stay: without them the pair
    # kernel's registers were allocated otherwise and it ran slower; RESULTS.md.)
    PAIR = pair

    @jit(nogil=True)
    def kernel(x, g, bufs, sh, sw, dh, dw, pt, pl, ctl, size, ntasks):
        """bufs[n] = image n's filter gradient, one task per image: for each output row,
        lane vector (or both, PAIR) and group of NR (up to three; NRI, five, for 5x5 rows
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
                                                  two=True, NL=NL, XS=XS, XQ=XQ)
                                continue
                            if blocked and dw == 1:
                                _filter_sweep_blocked(bf, gf, src, go, ch, CM, ro, ok, nr, b + ch,
                                                      FW, ja, jb, ow, sw, pl, W, pg, NL)
                                continue
                            _filter_sweep(bf, gf, src, go, ch, CM, ro, ok, nr, b + ch, FW, ja, jb,
                                          ow, sw, pl, tc, dw, W, pg, px, npx, W * C, two=False,
                                          NL=NL, XS=XS, XQ=XQ)
                        for k in range(nr):  # lanes past the last full vector
                            for c in range(FW):
                                e = b + (k * FW + c) * CM
                                if CM - CV == 1:  # one: scalar
                                    s_ = bf[e + CV]
                                    for j in range(ow):
                                        jj = j * sw - pl + c * dw
                                        xv = zero
                                        if ok[k] and 0 <= jj < W:
                                            xv = src[ro[k] + jj * CM + CV]
                                        s_ = s_ + gf[go + j * CM + CV] * xv
                                    bf[e + CV] = s_
                                elif CV < CM:  # more: one partial vector, the same order
                                    sv = vload_part(bf, e + CV, CM - CV)
                                    for j in range(ow):
                                        jj = j * sw - pl + c * dw
                                        if ok[k] and 0 <= jj < W:
                                            xv_ = vload_part(src, ro[k] + jj * CM + CV, CM - CV)
                                        else:
                                            xv_ = vzeros(src)
                                        sv = vmuladd(sv, vload_part(gf, go + j * CM + CV,
                                                                    CM - CV), xv_)
                                    vstore_part(bf, e + CV, sv, CM - CV)

    return kernel
