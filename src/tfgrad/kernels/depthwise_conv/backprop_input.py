"""DepthwiseConv2dNativeBackpropInput's kernels: a finite filter's (taps that meet no
out_backprop value skipped; generic and register-blocked, :func:`make_vec`), a non-finite
filter's (every ``w * 0`` computed), the exact redo of -0 outputs, and the reduction over
the channel multiplier in TF's packet order (docs/depthwise_conv.md, "How the kernels
compute it")."""

from __future__ import annotations

import numpy as np

from ..._compile import inline, jit
from .._pool import claim
from .._simd import (
    aligned_scratch,
    nlanes,
    prefetch,
    vhas_negzero,
    vload,
    vload4_chk,
    vload_chk,
    vload_part,
    vmin_bits,
    vmuladd,
    vmuladd4,
    vpairsum,
    vput,
    vstore_part,
    vzeros_opaque,
    zero_opaque,
)
from .common import (
    _P,
    NONE,
    _any_negzero,
    _gap_turns_plus,
    _mac,
    _negzero,
    _prefetch_part,
    _prefetch_step,
    _ring_rows,
    _round,
    _round_all,
    _row_offset_blocked,
    _tap_step,
)


@inline
def _hsum(v, p, lanes):
    """AVX horizontal sum of v[p:p + lanes] (8 float32 lanes or 4 float64 lanes)."""
    if lanes == 4:
        return (v[p] + v[p + 2]) + (v[p + 1] + v[p + 3])
    b0, b1 = v[p] + v[p + 4], v[p + 1] + v[p + 5]
    b2, b3 = v[p + 2] + v[p + 6], v[p + 3] + v[p + 7]
    return (b0 + b2) + (b1 + b3)


@inline
def _reduce_multiplier(v, base, M, lanes, mode, zero):
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


@jit(nogil=True)
def finite(w, wtile, g, out, sh, sw, dh, dw, pt, pl, mode, lanes, G, negz, ctl, size, ntasks):
    """BackpropInput for a finite float32 / float64 filter: a tap that meets no
    out_backprop value adds w * 0 = +-0, which leaves the accumulator unchanged unless
    it is a flushed -0, so only the taps that hit are computed, and rows that end with a
    -0 are marked in ``negz`` (see redo_negzero). One task per input row; its
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


@jit(nogil=True)
def generic(w, g, out, sh, sw, dh, dw, pt, pl, mode, lanes, ctl, size, ntasks):
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


@inline
def _backprop_input_exact(w, g, n, ii, jj, k, sh, sw, dh, dw, pt, pl, mode, lanes, per):
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


@jit(nogil=True)
def redo_negzero(w, g, out, sh, sw, dh, dw, pt, pl, mode, lanes, rows):
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


@inline
def _sum_pairs(of, o, per, p, n, zero):
    """of[o + e] = (0 + per[p + 2e]) + per[p + 2e + 1] for e < n: a multiplier of 2
    summed in _reduce_multiplier's order (M < plane); unsigned, so that it vectorises."""
    u = np.uint64
    o, p = u(o), u(p)
    for e in range(u(n)):
        of[o + e] = (zero + per[p + u(2) * e]) + per[p + u(2) * e + u(1)]


@inline(force=True)
def _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit, u, o, ps, CM, ch0, ch1, GS, CS, NL,
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
                # (with check, a column outside [0, ow) reads +0: w * 0 for a finite w,
                # the bits TF computes for that tap)
                g0, g1, g2, g3 = vload4_chk(gs, check, oj, ow, a + ca, GS)
                h0, h1, h2, h3 = (vload4_chk(gs, check, oj, ow, a + cb, GS) if pair
                                  else (g0, g0, g0, g0))
                for c in range(FW):
                    wv = vload(wf, (r * FW + c) * CM + ch)
                    # g3 first: it leaves the window after this tap (so its register
                    # frees early, and LLVM spills far fewer vectors on AVX2)
                    v3, v2, v1, v0 = vmuladd4(v3, v2, v1, v0, wv, g3, g2, g1, g0)
                    if pair:
                        wv = vload(wf, (r * FW + c) * CM + ch + NL)
                        q3, q2, q1, q0 = vmuladd4(q3, q2, q1, q0, wv, h3, h2, h1, h0)
                    if c + 1 < FW:
                        g1, g2, g3 = g0, g1, g2
                        g0 = vload_chk(gs, check, oj - c - 1, ow, a - (c + 1) * GS + ca)
                        if pair:
                            h1, h2, h3 = h0, h1, h2
                            h0 = vload_chk(gs, check, oj - c - 1, ow, a - (c + 1) * GS + cb)
                continue
            for c in range(FW):
                if not taphit[c]:
                    continue
                wv = vload(wf, (r * FW + c) * CM + ch)
                oj = tapb[c] + u
                a = rowoff[r] + oj * GS
                g0, g1, g2, g3 = vload4_chk(gs, check, oj, ow, a + ca, GS)
                v0, v1, v2, v3 = vmuladd4(v0, v1, v2, v3, wv, g0, g1, g2, g3)
                if pair:
                    wv = vload(wf, (r * FW + c) * CM + ch + NL)
                    g0, g1, g2, g3 = vload4_chk(gs, check, oj, ow, a + cb, GS)
                    q0, q1, q2, q3 = vmuladd4(q0, q1, q2, q3, wv, g0, g1, g2, g3)
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


@inline
def _bi_part4(wf, gf, dst, rowoff, rowok, tapb, taphit, u, o, ps, CM, CV, FH, FW):
    """The lanes past the last whole vector (CV .. CM) of 4 pixels of one phase (u ..
    u + 3) where every tap that hits meets a column (g's own layout, never blocked), taps
    in order as the one-pixel path: 4 chains at a time instead of one (a pixel's taps are
    a dependent chain of adds). Returns whether a lane it stored was -0."""
    n = CM - CV
    v0 = v1 = v2 = v3 = vzeros_opaque(wf)  # (so that a -0 is not ruled out)
    for r in range(FH):
        if not rowok[r]:
            continue
        for c in range(FW):
            if not taphit[c]:
                continue
            wv = vload_part(wf, (r * FW + c) * CM + CV, n)
            a = rowoff[r] + (tapb[c] + u) * CM + CV
            v0 = vmuladd(v0, wv, vload_part(gf, a, n))
            v1 = vmuladd(v1, wv, vload_part(gf, a + CM, n))
            v2 = vmuladd(v2, wv, vload_part(gf, a + 2 * CM, n))
            v3 = vmuladd(v3, wv, vload_part(gf, a + 3 * CM, n))
    vstore_part(dst, o + CV, v0, n)
    vstore_part(dst, o + ps + CV, v1, n)
    vstore_part(dst, o + 2 * ps + CV, v2, n)
    vstore_part(dst, o + 3 * ps + CV, v3, n)
    return vhas_negzero(vmin_bits(vmin_bits(v0, v1), vmin_bits(v2, v3)))


def make_vec(FH: int, FW: int, *, blocked: bool, pair: bool):
    # Variant.pair (AVX-512, every blocked kernel: two lane vectors' 8 accumulators and
    # operands fit; the blocks take them where the run-time ``pair`` below holds): without
    # it Numba prunes the branches that test it first, and _bi_block's pair instances go
    # uncompiled.
    PAIR = pair

    @jit(nogil=True)
    def kernel(w, g, out, sh, sw, dh, dw, pt, pl, plane, negz, stream, pstream, ctl, size,
               ntasks):
        """BackpropInput for a finite filter, skipping the taps that meet no out_backprop
        value (w * 0 = +-0 changes nothing but a -0: rows that hold one are marked in
        ``negz`` and redone exactly, see redo_negzero). One task per input row; its
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
        phase go through the per-lane scratch. ``stream`` / ``pstream`` are run-time
        flags: one compiled kernel serves a streamed output and the others (as literals
        they compiled the kernel and _bi_block once more each; the stores' branch costs
        nothing measurable, benchmarks/RESULTS.md)."""
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
        # (a run-time 0 for the first channel vector: a literal 0 would compile _bi_block
        # once more for each of its call sites' other arguments)
        ch00 = CM - CM
        # (only M = 1 streams, in the kernels without blocks, and only pair blocks pstream:
        # the compile-time flags fold the other kernels' stores back to plain ones)
        S = stream and not blocked
        PS = pstream and PAIR
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
                    u = ch00  # (run-time: see ch00)
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
                                if PAIR and pair and inner:
                                    neg |= _bi_block(wf, gs, of, rowoff, rowok, tapb, taphit, uk,
                                                     op, sw * C, CM, ch, ch + V, GS, CS, NL, FH,
                                                     FW, ow, check=False, unit=unit,
                                                     stream=PS, pair=True)
                                elif PAIR and pair:
                                    neg |= _bi_block(wf, gs, of, rowoff, rowok, tapb, taphit, uk,
                                                     op, sw * C, CM, ch, ch + V, GS, CS, NL, FH,
                                                     FW, ow, check=True, unit=unit,
                                                     stream=PS, pair=True)
                                elif inner:
                                    neg |= _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit,
                                                     uk, o, sw * CM, CM, ch, ch + V, GS, CS, NL,
                                                     FH, FW, ow, check=False, unit=unit,
                                                     stream=S, pair=False)
                                else:
                                    neg |= _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit,
                                                     uk, o, sw * CM, CM, ch, ch + V, GS, CS, NL,
                                                     FH, FW, ow, check=True, unit=unit,
                                                     stream=S, pair=False)
                        u = nb * _P
                    u2 = u  # (pair: the pixels from here on go through per)
                    while u < Up:
                        pu = u  # (the first pixel whose partial vector is still to do)
                        if u + _P <= Up:  # 4 pixels; near the borders, missed taps add w * 0
                            o = db + (ph + u * sw) * CM
                            if U0 <= u and u + _P <= U1:
                                if rowok[0]:  # the next input row's new out_backprop row
                                    pa = rowoff[0] + ow * CM + (tapb[0] + u) * CM
                                    for e in range(0, _P * CM, 16):
                                        prefetch(gf, pa + e)
                                neg |= _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit, u,
                                                 o, sw * CM, CM, ch00, CV, GS, CS, NL, FH, FW, ow,
                                                 check=False, unit=unit, stream=S,
                                                 pair=False)
                                if CV < CM:  # (and their lanes past the last full vector)
                                    neg |= _bi_part4(wf, gf, dst, rowoff, rowok, tapb, taphit,
                                                     u, o, sw * CM, CM, CV, FH, FW)
                                    pu = u + _P
                            else:
                                neg |= _bi_block(wf, gs, dst, rowoff, rowok, tapb, taphit, u,
                                                 o, sw * CM, CM, ch00, CV, GS, CS, NL, FH, FW, ow,
                                                 check=True, unit=unit, stream=S,
                                                 pair=False)
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
                                vput(dst, db + (ph + u * sw) * CM + ch, v, S)
                                neg = neg or vhas_negzero(v)
                            u1 = u + 1
                        for up in range(pu, u1):  # lanes past the last full vector (never
                            if CM - CV == 1:  # blocked: g's own layout): one lane, scalar
                                s_ = zero_opaque(w)
                                for r in range(FH):
                                    if not rowok[r]:
                                        continue
                                    for c in range(FW):
                                        oj = tapb[c] + up
                                        if taphit[c] and 0 <= oj < ow:
                                            wv_ = wf[(r * FW + c) * CM + CV]
                                            s_ = s_ + wv_ * gf[rowoff[r] + oj * CM + CV]
                                dst[db + (ph + up * sw) * CM + CV] = s_
                                neg = neg or _negzero(s_)
                            elif CV < CM:  # more: one partial vector, taps in the same order
                                v = vzeros_opaque(w)
                                for r in range(FH):
                                    if not rowok[r]:
                                        continue
                                    for c in range(FW):
                                        oj = tapb[c] + up
                                        if taphit[c] and 0 <= oj < ow:
                                            v = vmuladd(
                                                v, vload_part(wf, (r * FW + c) * CM + CV, CM - CV),
                                                vload_part(gf, rowoff[r] + oj * CM + CV, CM - CV))
                                vstore_part(dst, db + (ph + up * sw) * CM + CV, v, CM - CV)
                                neg = neg or vhas_negzero(v)
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
