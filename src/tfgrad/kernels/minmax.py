"""Numba kernels for tfmot's batch ranges: the minimum and maximum of float32 values, over
all of them or per column of [R, C] rows (the spec: tfgrad._tf.minmax, TF's Min / Max).

They work on order keys of the values' bits (int32: ``b ^ ((b >> 31) & 0x7fffffff)``,
-NaN < -inf < ... < -0 < +0 < ... < inf < +NaN), whose integer min / max LLVM vectorizes
without fastmath, and return the extremes' bits. Alongside, the extremes without a -0
(for the minimum) and without a +0 (for the maximum) tell whether a zero extreme has
the other zero beside it: then TF's choice between them follows its order, and so does
a NaN's (TF returns an input NaN's bits), and the kernels say "undecided": the caller
(``tfgrad.dispatch.minmax.batch_range``) asks the NumPy model of TF's order. Everywhere
else the extreme has one bit pattern, whatever the order. Serial: one pass at memory
speed.
"""

from __future__ import annotations

import numpy as np

from .._compile import inline, jit

_I = np.int32
_U = np.uint64  # unsigned indices: no negative-index fix-ups in the vectorised loops
_BIG = 0x7FFFFFFF
_SMALL = -0x80000000
_KEY_INF = 0x7F800000  # the keys of +inf and -inf: every NaN lies beyond them
_KEY_NINF = -0x7F800001


@inline
def _key(b):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    # (self-inverse: the key of a key is the bits again; every step kept int32, so that
    # LLVM's vectors hold eight lanes)
    return _I(b ^ ((b >> 31) & _I(_BIG)))


@inline
def _no_neg_zero(k):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    return k if k != _I(-1) else _I(_BIG)


@inline
def _no_pos_zero(k):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    return k if k != _I(0) else _I(_SMALL)


@inline
def _decided(lo, hi, lo2, hi2):  # type: ignore[no-untyped-def]  # pragma: no cover
    """(min decided, max decided): no NaN, no zero extreme beside the other zero."""
    nan = (lo < _I(_KEY_NINF)) | (hi > _I(_KEY_INF))
    return ((not nan) & ((lo != _I(-1)) | (lo2 != _I(0))),
            (not nan) & ((hi != _I(0)) | (hi2 != _I(-1))))


@jit
def range_all(v):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """(min's bits, max's bits, both decided) of the float32 values of int32 view ``v``
    (not empty)."""
    lo = _I(_BIG)
    hi = _I(_SMALL)
    lo2 = lo
    hi2 = hi
    for i in range(v.size):
        k = _key(v[_U(i)])
        lo = _I(min(lo, k))
        hi = _I(max(hi, k))
        lo2 = _I(min(lo2, _no_neg_zero(k)))
        hi2 = _I(max(hi2, _no_pos_zero(k)))
    lo_ok, hi_ok = _decided(lo, hi, lo2, hi2)
    return _key(lo), _key(hi), lo_ok & hi_ok


@jit
def range_rows(v, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Per column of the int32 view ``v`` [R, C] (R >= 1): the min's and max's bits into
    ``out[0]`` and ``out[1]`` (``out`` [4, C], rows 2 and 3 scratch); returns (every
    min decided, every max decided). Four rows a pass: a row at a time, the
    accumulators' loads and stores would bound it."""
    r, c = v.shape
    a0, a1, a2, a3 = out[0], out[1], out[2], out[3]
    for j in range(c):
        jj = _U(j)
        a0[jj] = _I(_BIG)
        a1[jj] = _I(_SMALL)
        a2[jj] = _I(_BIG)
        a3[jj] = _I(_SMALL)
    r4 = r - r % 4
    for i in range(0, r4, 4):
        p, q, s, t = v[i], v[i + 1], v[i + 2], v[i + 3]
        for j in range(c):
            jj = _U(j)
            k0, k1, k2, k3 = _key(p[jj]), _key(q[jj]), _key(s[jj]), _key(t[jj])
            a0[jj] = _I(min(a0[jj], _I(min(_I(min(k0, k1)), _I(min(k2, k3))))))
            a1[jj] = _I(max(a1[jj], _I(max(_I(max(k0, k1)), _I(max(k2, k3))))))
            m0, m1 = _no_neg_zero(k0), _no_neg_zero(k1)
            m2, m3 = _no_neg_zero(k2), _no_neg_zero(k3)
            a2[jj] = _I(min(a2[jj], _I(min(_I(min(m0, m1)), _I(min(m2, m3))))))
            n0, n1 = _no_pos_zero(k0), _no_pos_zero(k1)
            n2, n3 = _no_pos_zero(k2), _no_pos_zero(k3)
            a3[jj] = _I(max(a3[jj], _I(max(_I(max(n0, n1)), _I(max(n2, n3))))))
    for i in range(r4, r):
        row = v[i]
        for j in range(c):
            jj = _U(j)
            k = _key(row[jj])
            a0[jj] = _I(min(a0[jj], k))
            a1[jj] = _I(max(a1[jj], k))
            a2[jj] = _I(min(a2[jj], _no_neg_zero(k)))
            a3[jj] = _I(max(a3[jj], _no_pos_zero(k)))
    lo_ok = True
    hi_ok = True
    for j in range(c):
        jj = _U(j)
        lo, hi = a0[jj], a1[jj]
        ok_lo, ok_hi = _decided(lo, hi, a2[jj], a3[jj])
        lo_ok &= ok_lo
        hi_ok &= ok_hi
        a0[jj] = _key(lo)
        a1[jj] = _key(hi)
    return lo_ok, hi_ok
