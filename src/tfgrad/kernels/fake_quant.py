"""Fused Numba kernels for the fake-quant ops (the spec: tfgrad.ops.fake_quant and
docs/fake_quant.md).

Every kernel makes one pass over its data. Float32 throughout, denormals flushed where
TF's FTZ/DAZ mode can change a result: the loaded inputs and gradients, ``c - nmin``, and
every partial sum. (The other forward intermediates cannot become denormal, or only
ever meet ``+ 0.5``, which absorbs them; the reference flushes everything and the tests
hold the two equal.)

The per-channel sums follow Eigen's reduction tree (``tfgrad._tf.eigen.reduction_plan``):
the tree is cut into subtrees, each a postfix program of leaves and combines; a task is
(subtree, block of channels), so threads never share a sum and the order of every
addition is fixed by the data's shape alone. A leaf walks its rows in order, adding row
``i`` of each channel into lane ``(i - first) % 32`` of that channel's four 8-lane
accumulators, exactly as Eigen's packet loop does on the strided column.

The entry points are ``Twins`` (``tfgrad._compile``): ``tfgrad.dispatch.fake_quant``
launches them serial or parallel.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._compile import Twins, inline, jit
from .._tf.eigen import OP_COMBINE, OP_LEAF, OP_TASK, OP_ZERO
from ._simd import (
    flush_denormal,
    vadd,
    vfull,
    vfull8,
    vload,
    vload8,
    vload_part,
    vmul,
    vstore,
    vstore8,
    vstore_part,
    vwhere_le,
    vwhere_lt,
)

F32 = np.float32
_FLT_MIN = np.float32(2.0**-126)
_ZERO = np.float32(0.0)
_HALF = np.float32(0.5)
_CHUNK = 1 << 15  # elements per parallel chunk of the elementwise kernels
# Hot loops index with unsigned integers: Numba adds a negative-index wraparound to every
# signed index it cannot prove >= 0 (an offset plus a loop counter), which stops LLVM
# from vectorizing the loop.
_U = np.uint64
_MASKED_MIN = 3  # channels past the whole vectors from which a masked vector beats a loop


@inline(force=True)
def _ftz(v):
    # FTZ/DAZ: a denormal becomes a zero of the same sign; NaN and inf pass.
    return v if abs(v) >= _FLT_MIN else v * _ZERO


@inline
def _quant(x, nmin, nmax, scale, inv, qz, divide):
    c = _ftz(x)
    if nmax < c:  # std::min(c, nmax); NaN stays NaN
        c = nmax
    if c < nmin:  # std::max(c, nmin)
        c = nmin
    shifted = _ftz(c - nmin)
    t = shifted / scale if divide else shifted * inv
    return np.floor((t - qz) + _HALF) * scale


# --------------------------------------------------------------------------------------
# The nudged range (O(channels); a QAT step's ranges change every step, so this runs per call)
# --------------------------------------------------------------------------------------
@jit
def nudge(mn, mx, qmin, qmax):  # pragma: no cover
    """``ops.fake_quant._nudge`` operation for operation, each result flushed as there:
    rows nmin, nmax, scale, inv, qz of a [5, channels] array, and the zero-range mask."""
    out = np.empty((5, mn.size), F32)
    nmin, nmax, scale, inv, qz = out[0], out[1], out[2], out[3], out[4]
    zero = np.empty(mn.size, np.bool_)
    span = qmax - qmin
    for i in range(mn.size):
        lo = _ftz(mn[i])
        hi = _ftz(mx[i])
        width = _ftz(hi - lo)
        s = _ftz(width / span)
        iv = _ftz(span / width)  # not 1 / scale: TF recomputes it for precision
        zf = _ftz(qmin - _ftz(lo / s))
        if zf < qmin:
            zp = qmin
        elif zf > qmax:
            zp = qmax
        elif zf != zf:  # NaN: x86's float -> int conversion, truncated to uint16
            zp = _ZERO
        else:  # std::round of zf >= 0, exact in float64
            zp = F32(np.floor(np.float64(zf) + 0.5))
        lo_n = _ftz((qmin - zp) * s)
        nmin[i] = lo_n
        nmax[i] = _ftz((qmax - zp) * s)
        scale[i] = s
        inv[i] = iv
        qz[i] = np.floor(_ftz(_ftz(-lo_n * iv) + _HALF))
        zero[i] = lo == _ZERO and hi == _ZERO
    return out, zero


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------
@Twins
def quantize_flat(x, nmin, nmax, scale, inv, qz, divide, out):
    """out = fake-quant(x) with one range; ``divide``: Vars (t = shifted / scale)."""
    lo_, hi_, s_, i_, z_ = F32(nmin), F32(nmax), F32(scale), F32(inv), F32(qz)
    n = x.size
    for ch in prange((n + _CHUNK - 1) // _CHUNK):
        a = ch * _CHUNK
        b = min(n, a + _CHUNK)
        if divide:
            for j in range(b - a):
                i = _U(a + j)
                out[i] = _quant(x[i], lo_, hi_, s_, i_, z_, True)
        else:
            for j in range(b - a):
                i = _U(a + j)
                out[i] = _quant(x[i], lo_, hi_, s_, i_, z_, False)


@Twins
def quantize_channels(x, nmin, nmax, scale, inv, qz, out):
    """out[i, c] = fake-quant(x[i, c]) with channel c's range (PerChannel multiplies)."""
    n, d = x.shape
    rows = max(1, _CHUNK // max(d, 1))
    for ch in prange((n + rows - 1) // rows):
        a = ch * rows
        b = min(n, a + rows)
        for i in range(a, b):
            for c in range(d):
                out[i, c] = _quant(x[i, c], nmin[c], nmax[c], scale[c], inv[c], qz[c], False)


@Twins
def quantize_channels_first(x, nmin, nmax, scale, inv, qz, out):
    """out[i, c, k] = fake-quant(x[i, c, k]) with channel c's range: channel-first
    [N, d, S] data (a channels-last view's memory; PerChannel multiplies)."""
    n, d, s = x.shape
    for t in prange(n * d):
        i = t // d
        c = t % d
        lo, hi, sc, iv, z = nmin[c], nmax[c], scale[c], inv[c], qz[c]
        for k in range(s):
            out[i, c, k] = _quant(x[i, c, k], lo, hi, sc, iv, z, False)


# --------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------
@Twins
def mask_gradient(g, x, nmin, nmax, dx):
    """dx = g * [nmin <= x <= nmax] (Args gradient: no sums)."""
    lo_, hi_ = F32(nmin), F32(nmax)
    n = x.size
    for ch in prange((n + _CHUNK - 1) // _CHUNK):
        a = ch * _CHUNK
        b = min(n, a + _CHUNK)
        for j in range(b - a):
            i = _U(a + j)
            gi = _ftz(g[i])
            xi = _ftz(x[i])
            dx[i] = gi if (xi >= lo_ and xi <= hi_) else gi * _ZERO


@inline
def _hsum(acc, k, c):
    # Eigen's predux of lanes acc[k, 0:8, c]: (l0+l4 + l2+l6) + (l1+l5 + l3+l7).
    b0 = _ftz(acc[k, 0, c] + acc[k, 4, c])
    b1 = _ftz(acc[k, 1, c] + acc[k, 5, c])
    b2 = _ftz(acc[k, 2, c] + acc[k, 6, c])
    b3 = _ftz(acc[k, 3, c] + acc[k, 7, c])
    return _ftz(_ftz(b0 + b2) + _ftz(b1 + b3))


@inline
def _fold(acc, w):
    # paccum += paccum1; paccum += paccum2; paccum += paccum3 (lanes 8-31 into 0-7):
    # acc[k, 0:8, :] is one run of 8 * w values, acc[k, 8q:8q+8, :] another.
    for k in range(2):
        a = acc[k].reshape(-1)
        for q in range(1, 4):
            b = _U(8 * q * w)
            for t in range(8 * w):
                i = _U(t)
                a[i] = _ftz(a[i] + a[i + b])


@inline
def _acc(accf, j, v):
    vstore(accf, j, flush_denormal(vadd(vload(accf, j), v)))


@inline
def _acc8(accf, j, v):
    vstore8(accf, j, flush_denormal(vadd(vload8(accf, j), v)))


@inline
def _terms(gi, xi, l, h, zeros):
    # The scalar rule per lane, on flushed g and x: dx = g where lo <= x <= hi, else
    # g * 0; and the sums' terms g * [x < lo], g * [x > hi].
    z = vmul(gi, zeros)
    return (vwhere_le(l, xi, vwhere_le(xi, h, gi, z), z), vwhere_lt(xi, l, gi, z),
            vwhere_lt(h, xi, gi, z))


@inline(force=True)
def _row(gf, xf, lo, hi, base, w, accf, a0, a1, dxf):
    # One row of a channel block, as vectors of 16 and 8 channels (the last few masked,
    # or scalar below 3): dx, and the terms summed into the accumulator rows at accf[a0:]
    # and accf[a1:] (dmin's, dmax's), flushed. (A loop over the block's channels ran
    # scalar below 16 of them, 5x slower.) Compiled once and inlined by LLVM: Numba's
    # copy at each of _subtree's two call sites cost a quarter of the gradients' compile.
    c = 0
    while c + 16 <= w:
        i = _U(base + c)
        dx, below, above = _terms(flush_denormal(vload(gf, i)), flush_denormal(vload(xf, i)),
                                  vload(lo, _U(c)), vload(hi, _U(c)), vfull(lo, _ZERO))
        vstore(dxf, i, dx)
        _acc(accf, _U(a0 + c), below)
        _acc(accf, _U(a1 + c), above)
        c += 16
    if c + 8 <= w:
        i = _U(base + c)
        dx, below, above = _terms(flush_denormal(vload8(gf, i)),
                                  flush_denormal(vload8(xf, i)), vload8(lo, _U(c)),
                                  vload8(hi, _U(c)), vfull8(lo, _ZERO))
        vstore8(dxf, i, dx)
        _acc8(accf, _U(a0 + c), below)
        _acc8(accf, _U(a1 + c), above)
        c += 8
    n = w - c
    if n >= _MASKED_MIN:  # (lo, hi and the accumulator rows are padded past w)
        i = _U(base + c)
        dx, below, above = _terms(flush_denormal(vload_part(gf, i, n)),
                                  flush_denormal(vload_part(xf, i, n)), vload(lo, _U(c)),
                                  vload(hi, _U(c)), vfull(lo, _ZERO))
        vstore_part(dxf, i, dx, n)
        _acc(accf, _U(a0 + c), below)
        _acc(accf, _U(a1 + c), above)
    else:
        for k in range(c, w):
            i = _U(base + k)
            gi = _ftz(gf[i])
            xi = _ftz(xf[i])
            z = gi * _ZERO
            dxf[i] = gi if (xi >= lo[k] and xi <= hi[k]) else z
            accf[_U(a0 + k)] = _ftz(accf[_U(a0 + k)] + (gi if xi < lo[k] else z))
            accf[_U(a1 + k)] = _ftz(accf[_U(a1 + k)] + (gi if xi > hi[k] else z))


@jit
def _subtree(g, x, nmin, nmax, prog, p0, p1, c0, c1, depth, dx, out):
    """Run subtree program prog[p0:p1] on channels [c0, c1); out[k, c]: its sums."""
    w = c1 - c0
    d = x.shape[1]
    wp = w + 16  # (a masked vector at c < w reads and adds to [c, c + 16): zeros past w)
    lo = np.zeros(wp, F32)
    hi = np.zeros(wp, F32)
    for c in range(w):
        lo[c] = nmin[c0 + c]
        hi[c] = nmax[c0 + c]
    gf = g.reshape(-1)
    xf = x.reshape(-1)
    dxf = dx.reshape(-1)
    # acc[k, 0:32, c]: Eigen's four 8-lane packet accumulators; acc[k, 32, c]: the
    # scalar tail (k = 0 for dmin, 1 for dmax).
    acc = np.empty((2, 33, wp), F32)
    accf = acc.reshape(-1)
    stack = np.empty((depth, 2, w), F32)
    sp = 0
    for op in range(p0, p1):
        if prog[op, 0] == OP_LEAF:
            first = prog[op, 1]
            m = prog[op, 2]
            n4 = (m // 32) * 32
            n8 = (m // 8) * 8
            acc[:] = 0
            for i in range(first, first + n4):
                s = (i - first) & 31
                _row(gf, xf, lo, hi, i * d + c0, w, accf, s * wp, (33 + s) * wp, dxf)
            _fold(acc, wp)
            for i in range(first + n4, first + m):  # lanes 0-7, then the scalar tail
                r = i - first
                s = r & 7 if r < n8 else 32
                _row(gf, xf, lo, hi, i * d + c0, w, accf, s * wp, (33 + s) * wp, dxf)
            for k in range(2):
                for c in range(w):
                    stack[sp, k, c] = _ftz(acc[k, 32, c] + _hsum(acc, k, c))
            sp += 1
        else:  # accum = 0; accum += left; accum += right
            sp -= 1
            for k in range(2):
                for c in range(w):
                    left = _ftz(_ZERO + stack[sp - 1, k, c])
                    stack[sp - 1, k, c] = _ftz(left + stack[sp, k, c])
    for k in range(2):
        for c in range(w):
            out[k, c0 + c] = stack[0, k, c]


@jit
def _combine_top(res, top, depth, dmin, dmax):
    """Combine the subtrees' results res[t, k, :] in the order of the tree above them.

    Copies are loops: an array assignment (stack[sp] = res[t]) compiles NumPy's shape
    check with its error message (string formatting: 4 s of compile)."""
    d = res.shape[2]
    stack = np.empty((depth, 2, d), F32)
    sp = 0
    for op in range(top.shape[0]):
        code = top[op, 0]
        if code == OP_TASK:
            t = top[op, 1]
            for k in range(2):
                for c in range(d):
                    stack[sp, k, c] = res[t, k, c]
            sp += 1
        elif code == OP_ZERO:
            for k in range(2):
                for c in range(d):
                    stack[sp, k, c] = _ZERO
            sp += 1
        else:  # a tree node: (0 + left) + right; or the shards' sum: left + right
            sp -= 1
            for k in range(2):
                for c in range(d):
                    left = stack[sp - 1, k, c]
                    if code == OP_COMBINE:
                        left = _ftz(_ZERO + left)
                    stack[sp - 1, k, c] = _ftz(left + stack[sp, k, c])
    for c in range(d):
        dmin[c] = stack[0, 0, c]
        dmax[c] = stack[0, 1, c]


@Twins
def gradient_channels(g, x, nmin, nmax, prog, starts, top, width, depth, dx, dmin, dmax):
    """PerChannel gradient on [N, d] rows: dx, and dmin/dmax[d] in Eigen's order."""
    d = x.shape[1]
    nsub = starts.size - 1
    nblk = (d + width - 1) // width
    res = np.empty((nsub, 2, d), F32)
    for task in prange(nsub * nblk):
        s = task // nblk
        c0 = (task % nblk) * width
        _subtree(g, x, nmin, nmax, prog, starts[s], starts[s + 1], c0, min(d, c0 + width),
                 depth, dx, res[s])
    _combine_top(res, top, depth, dmin, dmax)


@inline
def _masks(g, x, lo, hi, i, dx):
    # dx[i] = g * [lo <= x <= hi]; returns g * [x < lo] and g * [x > hi].
    gi = _ftz(g[i])
    xi = _ftz(x[i])
    z = gi * _ZERO
    dx[i] = gi if (xi >= lo and xi <= hi) else z
    return (gi if xi < lo else z), (gi if xi > hi else z)


@inline
def _at(r, s, step, off):
    # Row r's address in runs of s rows, step apart, from off: channel c of channel-first
    # [N, C, S] data is s = S, step = C * S, off = c * S; flat data is one run.
    o = r // s
    return _U(o * step + off + (r - o * s))


@inline
def _lane(g, x, lo, hi, i, dx, acc, lane):
    below, above = _masks(g, x, lo, hi, i, dx)
    acc[0, lane] = _ftz(acc[0, lane] + below)
    acc[1, lane] = _ftz(acc[1, lane] + above)


@jit
def _subtree_flat(g, x, lo, hi, prog, p0, p1, depth, dx, out):
    """Flat (one range) version of _subtree: the 32 lanes run over consecutive values."""
    acc = np.empty((2, 32), F32)
    stack = np.empty((depth, 2), F32)
    sp = 0
    for op in range(p0, p1):
        if prog[op, 0] == OP_LEAF:
            first = prog[op, 1]
            m = prog[op, 2]
            n4 = (m // 32) * 32
            n8 = (m // 8) * 8
            acc[:] = 0
            for j in range(first, first + n4, 32):
                for lane in range(32):
                    below, above = _masks(g, x, lo, hi, _U(j + lane), dx)
                    acc[0, lane] = _ftz(acc[0, lane] + below)
                    acc[1, lane] = _ftz(acc[1, lane] + above)
            for k in range(2):
                for q in range(1, 4):
                    for lane in range(8):
                        acc[k, lane] = _ftz(acc[k, lane] + acc[k, 8 * q + lane])
            for j in range(first + n4, first + n8, 8):
                for lane in range(8):
                    below, above = _masks(g, x, lo, hi, _U(j + lane), dx)
                    acc[0, lane] = _ftz(acc[0, lane] + below)
                    acc[1, lane] = _ftz(acc[1, lane] + above)
            tail0 = _ZERO
            tail1 = _ZERO
            for i in range(first + n8, first + m):
                below, above = _masks(g, x, lo, hi, _U(i), dx)
                tail0 = _ftz(tail0 + below)
                tail1 = _ftz(tail1 + above)
            for k in range(2):
                b0 = _ftz(acc[k, 0] + acc[k, 4])
                b1 = _ftz(acc[k, 1] + acc[k, 5])
                b2 = _ftz(acc[k, 2] + acc[k, 6])
                b3 = _ftz(acc[k, 3] + acc[k, 7])
                h = _ftz(_ftz(b0 + b2) + _ftz(b1 + b3))
                stack[sp, k] = _ftz((tail0 if k == 0 else tail1) + h)
            sp += 1
        else:
            sp -= 1
            for k in range(2):
                left = _ftz(_ZERO + stack[sp - 1, k])
                stack[sp - 1, k] = _ftz(left + stack[sp, k])
    out[0, 0] = stack[0, 0]
    out[1, 0] = stack[0, 1]


@jit
def _subtree_runs(g, x, lo, hi, prog, p0, p1, s, step, off, col, depth, dx, out):
    """_subtree_flat on rows in runs: row r at ``_at(r, s, step, off)`` of the flat g, x
    and dx (consecutive values within a run); the sums go to out[:, col]. (Kept apart
    from _subtree_flat, whose loop ran a quarter slower with the runs' arithmetic.)"""
    acc = np.empty((2, 32), F32)
    stack = np.empty((depth, 2), F32)
    sp = 0
    for op in range(p0, p1):
        if prog[op, 0] == OP_LEAF:
            first = prog[op, 1]
            m = prog[op, 2]
            n4 = (m // 32) * 32
            n8 = (m // 8) * 8
            acc[:] = 0
            for j in range(first, first + n4, 32):
                b = _at(j, s, step, off)
                if j % s + 32 <= s:  # one run: consecutive values
                    for lane in range(32):
                        _lane(g, x, lo, hi, b + _U(lane), dx, acc, lane)
                else:
                    for lane in range(32):
                        _lane(g, x, lo, hi, _at(j + lane, s, step, off), dx, acc, lane)
            for k in range(2):
                for q in range(1, 4):
                    for lane in range(8):
                        acc[k, lane] = _ftz(acc[k, lane] + acc[k, 8 * q + lane])
            for j in range(first + n4, first + n8, 8):
                for lane in range(8):
                    _lane(g, x, lo, hi, _at(j + lane, s, step, off), dx, acc, lane)
            tail0 = _ZERO
            tail1 = _ZERO
            for i in range(first + n8, first + m):
                below, above = _masks(g, x, lo, hi, _at(i, s, step, off), dx)
                tail0 = _ftz(tail0 + below)
                tail1 = _ftz(tail1 + above)
            for k in range(2):
                b0 = _ftz(acc[k, 0] + acc[k, 4])
                b1 = _ftz(acc[k, 1] + acc[k, 5])
                b2 = _ftz(acc[k, 2] + acc[k, 6])
                b3 = _ftz(acc[k, 3] + acc[k, 7])
                h = _ftz(_ftz(b0 + b2) + _ftz(b1 + b3))
                stack[sp, k] = _ftz((tail0 if k == 0 else tail1) + h)
            sp += 1
        else:
            sp -= 1
            for k in range(2):
                left = _ftz(_ZERO + stack[sp - 1, k])
                stack[sp - 1, k] = _ftz(left + stack[sp, k])
    out[0, col] = stack[0, 0]
    out[1, col] = stack[0, 1]


@Twins
def gradient_channels_first(g, x, nmin, nmax, prog, starts, top, depth, dx, dmin, dmax):
    """PerChannel gradient on channel-first [N, d, S] data, whose rows (n, s) are those of
    its channels-last view: dx, and dmin/dmax[d] in Eigen's order. A task is (subtree,
    channel), its 32 lanes over consecutive values of the channel's runs of S."""
    n, d, s = x.shape
    gf = g.reshape(-1)
    xf = x.reshape(-1)
    dxf = dx.reshape(-1)
    nsub = starts.size - 1
    res = np.empty((nsub, 2, d), F32)
    for task in prange(nsub * d):
        t = task // d
        c = task % d
        _subtree_runs(gf, xf, F32(nmin[c]), F32(nmax[c]), prog, starts[t], starts[t + 1], s,
                      d * s, c * s, c, depth, dxf, res[t])
    _combine_top(res, top, depth, dmin, dmax)


@Twins
def gradient_flat(g, x, nmin, nmax, prog, starts, top, width, depth, dx, sums):
    """Vars gradient: dx, and sums[0] = dmin, sums[1] = dmax in Eigen's order."""
    lo, hi = F32(nmin), F32(nmax)
    nsub = starts.size - 1
    res = np.empty((nsub, 2, 1), F32)
    for s in prange(nsub):
        _subtree_flat(g, x, lo, hi, prog, starts[s], starts[s + 1], depth, dx, res[s])
    dmin = np.empty(1, F32)
    dmax = np.empty(1, F32)
    _combine_top(res, top, depth, dmin, dmax)
    sums[0] = dmin[0]
    sums[1] = dmax[0]
