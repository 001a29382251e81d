"""Numba kernel for Softmax (the spec: tfgrad.ops.softmax and docs/softmax.md).

One task is a block of rows, run with TF's FTZ / DAZ set on its thread; each row in TF's
order: the max, the shifted logits, the exponentials (``pexp`` where TF's tiled
assignment evaluates packets, ``expf`` on each block's tail), the row sum in Eigen's tree,
its reciprocal (Eigen's ``rcpps`` + Newton step for rows in full packets of 8 outputs, an
exact division for the others), then one multiply per value. Float32 throughout.

The elementwise passes run on 16-lane vectors (``tfgrad.kernels._simd``): every lane is
the scalar operation of its value (``vpexp``: Eigen's pexp lane by lane), so the vectors
change no bit. The max's packet part is the maximum of the row's non-NaN packet values in
any order (``maxps`` never lets a NaN into its accumulator, and the sign of a zero
maximum changes no output: exp(+-0) is 1), then the scalar tail in TF's order.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._compile import Twins, inline
from .._tf.mxcsr import ftz_enter, ftz_exit
from .._tf.rcp import rcpps
from ._simd import (
    aligned_scratch,
    flush_denormal,
    vfull,
    vlane,
    vload,
    vload_part,
    vmul,
    vstore,
    vstore_part,
    vsub,
)
from .reduction import _ftz, _tree
from .softmax_pexp import vgt, vpexp
from .softmax_xent import _exp_scalar

F32 = np.float32
_ONE = F32(1.0)
_NEG_INF = F32(-np.inf)
_ROWS = 16
_W = 16  # lanes of a vector


@inline
def _preciprocal(a):
    x = rcpps(a)
    e = _ONE - a * x
    return x + x * e if e == e else x


@inline
def _gt(a, b):
    return a if a > b else b  # maxps(a, b): b when either is NaN


@inline
def _row_max(x, base, c):
    """Eigen's MaxReducer along the row at x[base:base + c] (tfgrad.ops.softmax.row_max):
    the packets' non-NaN maximum, the scalar tail in order, then std::max(tail, packets)."""
    v = (c // 8) * 8
    acc = _NEG_INF
    for j in range(v, c):
        t = _ftz(x[base + j])
        acc = acc if t < acc else t
    if v == 0:
        return acc
    p = vfull(x, _NEG_INF)
    j = 0
    while j + _W <= v:
        p = vgt(flush_denormal(vload(x, base + j)), p)
        j += _W
    red = _NEG_INF
    for k in range(_W):
        red = _gt(vlane(p, k), red)
    while j < v:  # one packet of 8 left
        red = _gt(_ftz(x[base + j]), red)
        j += 1
    return red if acc < red else acc


@inline
def _exp_row(x, base, c, mx, e):
    """e[:c] = pexp(ftz(ftz(x) - mx)) over the row, by vectors (the flushes are the
    thread's DAZ and FTZ: a denormal x is read as a zero of its sign, a denormal
    difference is written as one)."""
    mv = vfull(e, mx)
    c16 = (c // _W) * _W
    for j in range(0, c16, _W):
        vstore(e, j, vpexp(vsub(vload(x, base + j), mv)))
    if c16 < c:
        vstore_part(e, c16, vpexp(vsub(vload_part(x, base + c16, c - c16), mv)), c - c16)


@inline
def _scalar_from(i, rows, c, block):
    """The first class of row i from which TF's exp assignment evaluates values one by one
    (``expf``) when rows fit in a block: all classes below it are in packets."""
    n = rows * c
    if n <= block:
        return max((n // 8) * 8 - i * c, 0)
    per = (block + c - 1) // c
    r0 = (i // per) * per
    return max(((min(per, rows - r0) * c) // 8) * 8 - (i - r0) * c, 0)


@Twins
def softmax(x, out, rows, c, block):  # pragma: no cover - compiled
    """x, out: the flat [rows, c] logits and output."""
    r8 = (rows // 8) * 8
    for blk in prange((rows + _ROWS - 1) // _ROWS):
        fz = ftz_enter()
        acc = np.empty(32, F32)
        e = aligned_scratch(c, x)
        for i in range(blk * _ROWS, min(rows, (blk + 1) * _ROWS)):
            first = i * c
            mx = _row_max(x, first, c)
            _exp_row(x, first, c, mx, e)
            # the values TF evaluates one by one: each block's last len % 8
            if c >= block and rows * c > block:
                for s in range(0, c, block):
                    ln = min(block, c - s)
                    for j in range(s + (ln // 8) * 8, s + ln):
                        e[j] = _exp_scalar(_ftz(_ftz(x[first + j]) - mx))
            else:
                for j in range(_scalar_from(i, rows, c, block), c):
                    e[j] = _exp_scalar(_ftz(_ftz(x[first + j]) - mx))
            s = _tree(e, first, c, acc, first)
            inv = _preciprocal(s) if i < r8 else _ONE / s
            iv = vfull(e, inv)
            c16 = (c // _W) * _W
            for j in range(0, c16, _W):  # (FTZ flushes the products)
                vstore(out, first + j, vmul(vload(e, j), iv))
            if c16 < c:
                vstore_part(out, first + c16, vmul(vload_part(e, c16, c - c16), iv), c - c16)
        ftz_exit(fz)
