"""Numba kernel for Softmax (the spec: tfgrad.ops.softmax and docs/softmax.md).

One task is a block of rows, run with TF's FTZ / DAZ set on its thread; each row in TF's
order: the max, the shifted logits, the exponentials (``pexp`` where TF's tiled
assignment evaluates packets, ``expf`` on each block's tail), the row sum in Eigen's tree,
its reciprocal (Eigen's ``rcpps`` + Newton step for rows in full packets of 8 outputs, an
exact division for the others), then one multiply per value. Float32 throughout.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._compile import Twins, inline
from .._tf.mxcsr import ftz_enter, ftz_exit
from .._tf.rcp import rcpps
from .reduction import _ftz, _tree
from .softmax_xent import _exp_scalar, _pexp

F32 = np.float32
_ONE = F32(1.0)
_NEG_INF = F32(-np.inf)
_ROWS = 16


@inline
def _in_packet(k, i, j, rows, c, block):
    """Whether flat value k = i * c + j is in a packet of TF's exp assignment."""
    n = rows * c
    if n <= block:
        return k < (n // 8) * 8
    if c >= block:
        s = (j // block) * block
        return j - s < (min(block, c - s) // 8) * 8
    per = (block + c - 1) // c
    r0 = (i // per) * per
    return k - r0 * c < ((min(per, rows - r0) * c) // 8) * 8


@inline
def _preciprocal(a):
    x = rcpps(a)
    e = _ONE - a * x
    return x + x * e if e == e else x


@inline
def _gt(a, b):
    return a if a > b else b  # maxps(a, b): b when either is NaN


@inline
def _row_max(x, i, c, p):
    """Eigen's MaxReducer along row i in its order (tfgrad.ops.softmax.row_max)."""
    v = (c // 8) * 8
    acc = _NEG_INF
    for j in range(v, c):
        t = _ftz(x[i, j])
        acc = acc if t < acc else t
    if v == 0:
        return acc
    for k in range(8):
        p[k] = _NEG_INF
    for j in range(0, v, 8):
        for k in range(8):
            p[k] = _gt(_ftz(x[i, j + k]), p[k])
    red = _gt(_gt(_gt(p[0], p[4]), _gt(p[2], p[6])), _gt(_gt(p[1], p[5]), _gt(p[3], p[7])))
    return red if acc < red else acc


@Twins
def softmax(x, out, block):  # pragma: no cover - compiled
    rows, c = x.shape
    r8 = (rows // 8) * 8
    for blk in prange((rows + _ROWS - 1) // _ROWS):
        fz = ftz_enter()
        acc = np.empty(32, F32)
        e = np.empty(c, F32)
        lanes = np.empty(8, F32)
        for i in range(blk * _ROWS, min(rows, (blk + 1) * _ROWS)):
            first = i * c
            mx = _row_max(x, i, c, lanes)
            for j in range(c):
                sh = _ftz(_ftz(x[i, j]) - mx)
                if _in_packet(first + j, i, j, rows, c, block):
                    e[j] = _pexp(sh)
                else:
                    e[j] = _exp_scalar(sh)
            s = _tree(e, first, c, acc, first)
            inv = _preciprocal(s) if i < r8 else _ONE / s
            for j in range(c):
                out[i, j] = _ftz(e[j] * inv)
        ftz_exit(fz)
