"""DepthwiseConv2dNative's kernels: the generic one (any filter size and dtype), the
register-blocked ones (one per filter size and flags, built by :func:`make_vec`), and the
exact redo of the -0 outputs of a dilated convolution (docs/depthwise_conv.md, "How the
kernels compute it")."""

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
    vload4,
    vload_part,
    vmin_bits,
    vmuladd,
    vmuladd4,
    vput,
    vstore_part,
    vzeros,
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
    _ring_row,
    _ring_rows,
    _round_all,
    _tap_range,
    _tap_step,
)


@inline
def _split_row(x, n, ii, M, sw, xb):
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


@jit(nogil=True)
def generic(x, w, wtile, out, sh, sw, dh, dw, pt, pl, mode, G, negz, ctl, size, ntasks):
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


@jit(nogil=True)
def redo_negzero(x, w, out, sh, sw, dh, dw, pt, pl, mode, rows):
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


@inline(force=True)
def _fwd_block(src, wf, of, rowoff, a0, o, CM, ch0, ch1, CS, NL, FH, FW, ps, ts, P, stream):
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
                if P > 1:
                    x0, x1, x2, x3 = vload4(src, a, ps)
                    v0, v1, v2, v3 = vmuladd4(v0, v1, v2, v3, wv, x0, x1, x2, x3)
                else:
                    v0 = vmuladd(v0, vload(src, a), wv)
        vput(of, o + ch, v0, stream)
        if P > 1:
            vput(of, o + CM + ch, v1, stream)
            vput(of, o + 2 * CM + ch, v2, stream)
            vput(of, o + 3 * CM + ch, v3, stream)
            v0 = vmin_bits(vmin_bits(v0, v1), vmin_bits(v2, v3))
        neg = neg or vhas_negzero(v0)
    return neg


@inline  # (by Numba: inlined by LLVM, as _fwd_block is, the M = 4 kernels ran 5-17% slower)
def _fwd_block_unit(src, wf, of, rowoff, a0, o, CM, ch0, ch1, CS, NL, FH, FW, ps, stream, track):
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
                v0, v1, v2, v3 = vmuladd4(v0, v1, v2, v3, wv, x0, x1, x2, x3)
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


@inline(force=True)
def _fwd_part4(src, wf, of, rowoff, a0, o, CM, CV, FH, FW, ps, ts):
    """The lanes past the last whole vector (CV .. CM) of 4 output pixels whose taps all
    fall inside (src unblocked: pixel stride CM), taps in order as the one-pixel path: 4 chains
    at a time instead of one (a pixel's taps are a dependent chain of adds). Returns
    whether a lane it stored was -0."""
    n = CM - CV
    v0 = v1 = v2 = v3 = vzeros_opaque(wf)  # (so that a -0 is not ruled out)
    for r in range(FH):
        b = rowoff[r] + a0 + CV
        for c in range(FW):
            wv = vload_part(wf, (r * FW + c) * CM + CV, n)
            a = b + c * ts
            v0 = vmuladd(v0, vload_part(src, a, n), wv)
            v1 = vmuladd(v1, vload_part(src, a + ps, n), wv)
            v2 = vmuladd(v2, vload_part(src, a + 2 * ps, n), wv)
            v3 = vmuladd(v3, vload_part(src, a + 3 * ps, n), wv)
    vstore_part(of, o + CV, v0, n)
    vstore_part(of, o + CM + CV, v1, n)
    vstore_part(of, o + 2 * CM + CV, v2, n)
    vstore_part(of, o + 3 * CM + CV, v3, n)
    return vhas_negzero(vmin_bits(vmin_bits(v0, v1), vmin_bits(v2, v3)))


def make_vec(FH: int, FW: int):
    @jit(nogil=True)
    def kernel(x, w, out, sh, sw, dh, dw, pt, pl, negz, stream, ctl, size, ntasks):
        """One task per output row. Rows of x are used in place (M = 1) or expanded
        into a ring of the FH-row span (channels repeated M times) so that every tap's
        lanes are contiguous; with whole channel vectors the ring is blocked by channel
        vector (_row_offset_blocked) and a row's 4-pixel blocks go channel vector by
        channel vector. ``stream`` (a run-time flag: one compiled kernel serves both):
        the output's vectors go out with non-temporal stores (whole-line pixels of a
        large output; see backprop_input / forward).
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
                                                           ch + NL, CS, NL, FH, FW, PS,
                                                           stream=stream, track=dh > 1)
                                else:
                                    neg |= _fwd_block(src, wf, of, rowoff, a0, o, CM, ch,
                                                      ch + NL, CS, NL, FH, FW, sw * PS, dw * PS,
                                                      P=_P, stream=stream)
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
                                              FW, 0, dw * PS, P=1, stream=stream)
                        elif sw == 1 and dw == 1:  # (tracked when dilated in height: TF's
                            neg |= _fwd_block_unit(src, wf, of, rowoff, a0, o, CM, 0, CV, CS, NL,
                                                   FH, FW, PS, stream=stream,
                                                   track=dh > 1)  # inserted rows)
                        else:
                            neg |= _fwd_block(src, wf, of, rowoff, a0, o, CM, 0, CV, CS, NL, FH,
                                              FW, sw * PS, dw * PS, P=_P, stream=stream)
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
                    if CV < CM and allok and J0 <= j and j1 == j + _P <= J1:
                        # (4 pixels, taps all inside; never blocked: src's pixel stride is CM)
                        neg |= _fwd_part4(src, wf, of, rowoff, (j * sw - pl) * PS,
                                          ob + j * CM, CM, CV, FH, FW, sw * PS, dw * PS)
                    elif CM - CV == 1:  # one lane past the last full vector: scalar
                        for jp in range(j, j1):
                            s_ = zero_opaque(x)
                            for r in range(FH):
                                for c in range(FW):
                                    jj = jp * sw - pl + c * dw
                                    xv = zero_opaque(x)
                                    if rowok[r] and 0 <= jj < W:
                                        xv = src[rowoff[r] + jj * CM + CV]
                                    s_ = s_ + xv * wf[(r * FW + c) * CM + CV]
                            of[ob + jp * CM + CV] = s_
                            neg = neg or _negzero(s_)
                    elif CV < CM:  # lanes past the last full vector (never blocked): one
                        for jp in range(j, j1):  # partial vector, taps in order as above
                            v = vzeros_opaque(x)
                            for r in range(FH):
                                for c in range(FW):
                                    jj = jp * sw - pl + c * dw
                                    wv = vload_part(wf, (r * FW + c) * CM + CV, CM - CV)
                                    if rowok[r] and 0 <= jj < W:
                                        xv = vload_part(src, rowoff[r] + jj * CM + CV, CM - CV)
                                    else:
                                        xv = vzeros(x)
                                    v = vmuladd(v, xv, wv)
                            vstore_part(of, ob + jp * CM + CV, v, CM - CV)
                            neg = neg or vhas_negzero(v)
                    j = j1
                negz[t] = neg

    return kernel
