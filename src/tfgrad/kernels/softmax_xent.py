"""Numba kernel for SparseSoftmaxCrossEntropyWithLogits (the spec:
tfgrad.ops.softmax_xent and docs/softmax_xent.md).

One task is a block of rows, run with TF's FTZ / DAZ set on its thread (``ftz_enter``);
each row is computed in TF's order: the max, the shifted
logits, the exponentials (Eigen's ``pexp`` where TF loads packets, the C library's
``expf`` elsewhere) summed by Eigen's tree (``tfgrad.kernels.reduction._tree``), the loss
with ``logf``, then the backprop. The elementwise passes run on 16-lane vectors
(``vpexp``: Eigen's packet operations lane by lane, ``tfgrad.kernels.softmax_pexp``), which
change no bit; ``_pexp`` is the same on one value (the tails). Float32 throughout.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types

from .._compile import Twins, inline
from .._tf.expf import C1, C2, EXP_HI, EXP_LO, FLT_MIN64, HALF, LOG2EF, P2, P3, P4, P5, P6
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._simd import (
    aligned_scratch,
    flush_denormal,
    vdiv,
    vfull,
    vlane,
    vload,
    vload_part,
    vstore,
    vstore_part,
    vsub,
)
from .reduction import _ftz, _tree
from .softmax_pexp import vany_nan, vgt, vpexp

F32 = np.float32
_ZERO = F32(0.0)
_ONE = F32(1.0)
_LEAF = 8 * 1024
_ROWS = 16
_W = 16  # lanes of a vector

# The C library's functions, called by name (never Numba's math.exp, which LLVM may
# vectorise into another library's approximation).
# 2**m for the exponents pexp can produce (m in [-151, 128]), exact float64 constants
_POW2 = np.array([2.0**m for m in range(-160, 161)], np.float64)
_expf = types.ExternalFunction("expf", types.float32(types.float32))
_logf = types.ExternalFunction("logf", types.float32(types.float32))


@inline
def _madd(a, b, c):
    # pmadd without FMA: two roundings (flushed by the thread's FTZ / DAZ)
    return a * b + c


@inline
def _pexp(x0):
    """Eigen's pexp_float on one lane (x0 already flushed)."""
    if x0 != x0:
        return x0
    if x0 < EXP_LO:
        return _ZERO
    x = EXP_HI if x0 > EXP_HI else x0
    m = np.floor(_madd(x, LOG2EF, HALF))
    r = _madd(m, C1, x)
    r = _madd(m, C2, r)
    r2 = r * r
    p_even = _madd(r2, P6, P4)
    p_odd = _madd(r2, P5, P3)
    p_even = _madd(r2, p_even, P2)
    p_low = r + _ONE
    y = _madd(r, p_odd, p_even)
    y = _madd(r2, y, p_low)
    s = np.float64(y) * _POW2[int(m) + 160]  # exact: y * 2**m
    out = _ZERO if abs(s) < FLT_MIN64 else F32(s)
    return out if out >= x0 else x0  # pmax(ldexp(y, m), x)


@inline
def _exp_scalar(x):
    return _ftz(_expf(x))


@inline
def _row_max(x, base, c):
    """The row's max as TF's loop takes it (the first NaN if there is one, else the
    largest value): by vectors, then the NaN rows by TF's loop. (Without a NaN the order
    only decides which of equal zeros is kept, and exp(+-0) is 1.)"""
    c16 = (c // _W) * _W
    mx = _ftz(x[base])
    nan = mx != mx
    if c16 > 0:
        p = vfull(x, mx)
        for j in range(0, c16, _W):
            v = flush_denormal(vload(x, base + j))
            nan |= vany_nan(v)
            p = vgt(v, p)
        for k in range(_W):
            t = vlane(p, k)
            mx = t if t > mx else mx
    for j in range(c16, c):
        v = _ftz(x[base + j])
        nan |= v != v
        mx = v if v > mx else mx
    if nan:
        mx = _ftz(x[base])
        for j in range(1, c):
            v = _ftz(x[base + j])
            if v > mx or v != v:  # (NaN-propagating; any NaN makes the row NaN)
                mx = v if mx == mx else mx
    return mx


@Twins
def xent(x, labels, loss, backprop, b, c):  # pragma: no cover - compiled
    """x, backprop: the flat [b, c] logits and backprop."""
    n8 = ((b * c) // 8) * 8  # the flat exp's packets end here
    c16 = (c // _W) * _W
    for blk in prange((b + _ROWS - 1) // _ROWS):
        fz = ftz_enter()  # (the shared tree sums rely on it)
        acc = np.empty(32, F32)
        sh = aligned_scratch(c, x)
        e = aligned_scratch(c, x)
        tails = np.empty(c, np.int64)
        starts = np.empty(64, np.int64)
        lens = np.empty(64, np.int64)
        for i in range(blk * _ROWS, min(b, (blk + 1) * _ROWS)):
            first = i * c
            mx = _row_max(x, first, c)
            # shifted logits and their pexp by vectors (the flushes: the thread's DAZ, FTZ)
            mv = vfull(e, mx)
            for j in range(0, c16, _W):
                v = vsub(vload(x, first + j), mv)
                vstore(sh, j, v)
                vstore(e, j, vpexp(v))
            if c16 < c:
                v = vsub(vload_part(x, first + c16, c - c16), mv)
                vstore_part(sh, c16, v, c - c16)
                vstore_part(e, c16, vpexp(v), c - c16)
            # exp for the sum: per leaf of the row's tree, packets then a scalar tail
            nt = 0
            top = 0
            starts[0] = first
            lens[0] = c
            while top >= 0:
                f = starts[top]
                m = lens[top]
                top -= 1
                if m <= _LEAF:
                    for k in range(f + (m // 8) * 8, f + m):
                        e[k - first] = _exp_scalar(sh[k - first])
                        tails[nt] = k - first
                        nt += 1
                else:
                    at = 8 * ((f + (m + 1) // 2 + 7) // 8)
                    top += 1
                    starts[top] = f
                    lens[top] = at - f
                    top += 1
                    starts[top] = at
                    lens[top] = m - (at - f)
            s = _tree(e, first, c, acc, first)
            lab = labels[i]
            loss[i] = _ftz(_ftz(_logf(s)) - sh[lab])
            # the backprop's exp: the flat tensor's packets, its last (b * c) % 8 scalar
            for q in range(nt):
                if first + tails[q] < n8:
                    e[tails[q]] = _pexp(sh[tails[q]])
            for j in range(max(n8 - first, 0), c):
                e[j] = _exp_scalar(sh[j])
            sv = vfull(e, s)
            for j in range(0, c16, _W):  # exp / sum - 0 (FTZ flushes the quotients)
                vstore(backprop, first + j, vdiv(vload(e, j), sv))
            if c16 < c:
                vstore_part(backprop, first + c16, vdiv(vload_part(e, c16, c - c16), sv),
                            c - c16)
            backprop[first + lab] = _ftz(_ftz(e[lab] / s) - _ONE)
        ftz_exit(fz)
