"""Numba kernel for SparseSoftmaxCrossEntropyWithLogits (the spec:
tfgrad.ops.softmax_xent and docs/softmax_xent.md).

One task is a block of rows, run with TF's FTZ / DAZ set on its thread (``ftz_enter``);
each row is computed in TF's order: the max, the shifted
logits, the exponentials (Eigen's ``pexp`` where TF loads packets, the C library's
``expf`` elsewhere) summed by Eigen's tree (``tfgrad.kernels.reduction._tree``), the loss
with ``logf``, then the backprop. ``pexp`` is evaluated one value at a time: its packet
operations are lane by lane. Float32 throughout.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types

from .._compile import Twins, inline
from .._tf.expf import C1, C2, EXP_HI, EXP_LO, FLT_MIN64, HALF, LOG2EF, P2, P3, P4, P5, P6
from .._tf.mxcsr import ftz_enter, ftz_exit
from .reduction import _ftz, _tree

F32 = np.float32
_ZERO = F32(0.0)
_ONE = F32(1.0)
_LEAF = 8 * 1024
_ROWS = 16

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


@Twins
def xent(x, labels, loss, backprop):  # pragma: no cover - compiled
    b, c = x.shape
    n8 = ((b * c) // 8) * 8  # the flat exp's packets end here
    for blk in prange((b + _ROWS - 1) // _ROWS):
        fz = ftz_enter()  # (the shared tree sums rely on it)
        acc = np.empty(32, F32)
        sh = np.empty(c, F32)
        e = np.empty(c, F32)
        pk = np.empty(c, np.bool_)
        starts = np.empty(64, np.int64)
        lens = np.empty(64, np.int64)
        for i in range(blk * _ROWS, min(b, (blk + 1) * _ROWS)):
            first = i * c
            mx = _ftz(x[i, 0])
            for j in range(1, c):
                v = _ftz(x[i, j])
                if v > mx or v != v:  # (NaN-propagating; any NaN makes the row NaN)
                    mx = v if mx == mx else mx
            for j in range(c):
                sh[j] = _ftz(_ftz(x[i, j]) - mx)
            # exp for the sum: per leaf of the row's tree, packets then a scalar tail
            top = 0
            nleaf = 0
            starts[0] = first
            lens[0] = c
            while top >= 0:
                f = starts[top]
                m = lens[top]
                top -= 1
                if m <= _LEAF:
                    p_end = f + (m // 8) * 8
                    for k in range(f, f + m):
                        pk[k - first] = k < p_end
                        e[k - first] = _pexp(sh[k - first]) if k < p_end else \
                            _exp_scalar(sh[k - first])
                    nleaf += 1
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
            for j in range(c):
                flat_packet = first + j < n8
                if flat_packet == pk[j]:  # the same exp as in the sum
                    ex = e[j]
                else:
                    ex = _pexp(sh[j]) if flat_packet else _exp_scalar(sh[j])
                sub = _ONE if j == lab else _ZERO
                backprop[i, j] = _ftz(_ftz(ex / s) - sub)
        ftz_exit(fz)
