"""Numba kernels for Sum / Mean (the spec: tfgrad.ops.reduction and docs/reduction.md).

Float32 throughout, run with TF's FTZ/DAZ set on the thread (``ftz_enter`` in every
task), so that plain additions flush as TF's do and LLVM can vectorise across columns.
Each output is summed by one thread, in Eigen's order for its path, so results do not
depend on the thread count:

- ``tree_sums``: Eigen's ``InnerMostDimReducer`` (tree of leaves of at most 8192 values,
  each leaf four 8-lane accumulators, then packets, then a scalar tail) over ranges of the
  flat input: the shards of a full reduction, or the rows of an inner reduction.
- ``lane_sums``: ``InnerMostDimPreserver`` over [a, b, c] summed along b (outer and middle
  reductions): four accumulators over the rows when b >= 16, or the plain sequential sum
  for the outputs Eigen computes one by one (``packet`` says which).
- ``zero_two_sums``: ``GenericDimReducer`` over [a, b, c] summed along a and c.

The entry points are ``Twins`` run by ``tfgrad.dispatch.reduction``.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._compile import Twins, inline
from .._tf.mxcsr import ftz_enter, ftz_exit

F32 = np.float32
_FLT_MIN = np.float32(2.0**-126)
_ZERO = np.float32(0.0)
_LEAF = 8 * 1024  # Eigen's LeafSize<float>() (1024) packets of 8
_ROWS = 64  # rows of an inner reduction per parallel task
_COLS = 512  # columns of an outer / middle reduction per parallel task
_U = np.uint64  # unsigned offsets: no negative-index fix-ups in the vectorised loops


@inline
def _ftz(v):
    # FTZ/DAZ: a denormal becomes a zero of the same sign; NaN and inf pass.
    return v if abs(v) >= _FLT_MIN else v * _ZERO


@inline
def _leaf(v, s, n, acc):
    """Eigen's vectorised leaf over v[s:s + n] (n <= 8192); ``acc``: 32 floats of scratch.
    (``tfgrad.kernels.softmax_xent`` sums its exponentials with it too.)"""
    for q in range(32):
        acc[q] = _ZERO
    n4 = (n // 32) * 32  # four packets a step, into four accumulators
    for j in range(0, n4, 32):
        for q in range(32):
            acc[q] += v[_U(s + j + q)]
    for q in range(8):  # paccum0 += paccum1; += paccum2; += paccum3
        acc[q] = ((acc[q] + acc[8 + q]) + acc[16 + q]) + acc[24 + q]
    j = n4
    while j + 8 <= n:  # the remaining whole packets
        for q in range(8):
            acc[q] += v[_U(s + j + q)]
        j += 8
    tail = _ZERO
    while j < n:  # the scalar tail, from its own +0
        tail += v[_U(s + j)]
        j += 1
    # finalizeBoth: tail + predux(paccum) = tail + ((l0+l4 + l2+l6) + (l1+l5 + l3+l7))
    return tail + (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5])
                                                              + (acc[3] + acc[7])))


@inline
def _tree(v, first, n, acc, off=0):
    """Eigen's tree over the flat indices [first, first + n), held at v[first - off:]
    (``first`` aligns the split points on packets of the whole tensor): a node is
    (0 + left) + right, split half way up to a packet boundary. Iterative, with explicit
    stacks (depth < 64)."""
    if n <= _LEAF:
        return _leaf(v, first - off, n, acc)
    fs = np.empty(64, np.int64)
    ns = np.empty(64, np.int64)
    state = np.zeros(64, np.int64)
    vals = np.empty(64, F32)
    top = 0
    nv = 0
    fs[0] = first
    ns[0] = n
    state[0] = 0
    while top >= 0:
        f = fs[top]
        m = ns[top]
        if m <= _LEAF:
            vals[nv] = _leaf(v, f - off, m, acc)
            nv += 1
            top -= 1
            continue
        at = 8 * ((f + (m + 1) // 2 + 7) // 8)
        nl = at - f
        if state[top] == 0:  # the left child
            state[top] = 1
            top += 1
            fs[top] = f
            ns[top] = nl
            state[top] = 0
        elif state[top] == 1:  # the right child
            state[top] = 2
            top += 1
            fs[top] = at
            ns[top] = m - nl
            state[top] = 0
        else:  # both done: (0 + left) + right
            right = vals[nv - 1]
            left = vals[nv - 2]
            nv -= 2
            vals[nv] = (_ZERO + left) + right
            nv += 1
            top -= 1
    return vals[0]


@Twins
def tree_sums(v, firsts, lengths, out):  # pragma: no cover - compiled
    """out[t] = Eigen's tree over v[firsts[t]:firsts[t] + lengths[t]]."""
    m = firsts.size
    for blk in prange((m + _ROWS - 1) // _ROWS):
        fz = ftz_enter()
        acc = np.empty(32, F32)
        for t in range(blk * _ROWS, min(m, (blk + 1) * _ROWS)):
            out[t] = _tree(v, firsts[t], lengths[t], acc)
        ftz_exit(fz)


@Twins
def row_sums(v, c, out):  # pragma: no cover - compiled
    """Rows of c values of the flat v (an inner reduction): out[i] = tree of row i."""
    r = out.size
    for blk in prange((r + _ROWS - 1) // _ROWS):
        fz = ftz_enter()
        acc = np.empty(32, F32)
        for i in range(blk * _ROWS, min(r, (blk + 1) * _ROWS)):
            out[i] = _tree(v, i * c, c, acc)
        ftz_exit(fz)


@Twins
def lane_sums(x, packet, out):  # pragma: no cover - compiled
    """x [a, b, c] summed along b into out [a * c]: where ``packet`` (per output), Eigen's
    InnerMostDimPreserver lanes (four accumulators over the rows j mod 4 below
    4 * (b // 4), combined, then the other rows, when b >= 16); elsewhere the sequential
    sum."""
    a, b, c = x.shape
    xf = x.reshape(-1)
    nblk = (c + _COLS - 1) // _COLS
    for task in prange(a * nblk):
        fz = ftz_enter()
        i = task // nblk
        k0 = (task % nblk) * _COLS
        k1 = min(c, k0 + _COLS)
        w = k1 - k0
        uw = _U(w)
        lanes = np.zeros(w, F32)
        seq = np.zeros(w, F32)
        any_packet = False
        any_seq = False
        for k in range(k0, k1):
            if packet[i * c + k]:
                any_packet = True
            else:
                any_seq = True
        if any_packet and b < 16:
            any_seq = True
        if any_packet and b >= 16:
            acc = np.zeros(4 * w, F32)
            b4 = (b // 4) * 4
            for j in range(0, b4, 4):
                for q in range(4):
                    base = _U((i * b + j + q) * c + k0)
                    qb = _U(q * w)
                    for k in range(uw):
                        acc[qb + k] += xf[base + k]
            for k in range(uw):
                lanes[k] = ((acc[k] + acc[uw + k]) + acc[2 * uw + k]) + acc[3 * uw + k]
            for j in range(b4, b):
                base = _U((i * b + j) * c + k0)
                for k in range(uw):
                    lanes[k] += xf[base + k]
        if any_seq:
            for j in range(b):
                base = _U((i * b + j) * c + k0)
                for k in range(uw):
                    seq[k] += xf[base + k]
        for k in range(w):
            o = i * c + k0 + k
            out[o] = lanes[k] if (packet[o] and b >= 16) else seq[k]
        ftz_exit(fz)


@Twins
def zero_two_sums(x, out):  # pragma: no cover - compiled
    """x [a, b, c] summed along a and c into out [b]: for k in c, for i in a, from +0."""
    a, b, c = x.shape
    for bb in prange(b):
        fz = ftz_enter()
        s = _ZERO
        for k in range(c):
            for i in range(a):
                s += x[i, bb, k]
        out[bb] = s
        ftz_exit(fz)
