"""TF's ``redux_functor.h`` sums as NumPy models: ``ReduceOuterDimensions`` (BiasAddGrad
NHWC: column sums of ``[R, C]``) and ``ReduceMiddleDimensions`` (BiasAddGrad NCHW: sums of
``[B, C, HW]`` over B and HW), in TF's order on TF's thread count, under FTZ / DAZ.

``ReduceOuterDimensions`` splits the rows into ``redux_blocks`` (``tfgrad._tf.eigen``):
each block's rows are added in sequence from +0, then the blocks' buffers in order.
``ReduceMiddleDimensions`` splits the flat tensor into ``nb`` equal ranges of
``ceil(B*C*HW / nb)`` values (nb = min(B*C, ceil(total / ceil(2000 / HW)), threads));
a range reduces its leading partial row, its whole rows and its trailing partial row each
with Eigen's full reducer (``eigen.full_sum``: packets of 8, a tree over leaves of 8192)
and adds each result to its channel's buffer in order (empty pieces add +0); Eigen's
``parallelFor`` may give one call several ranges (the call's buffer gets them all, the
others stay +0); the buffers are then added in order.
"""

from __future__ import annotations

import numpy as np

from .eigen import parallel_for_block, redux_blocks
from .fpenv import flush_denormals

_LOAD_CYCLES = 11.0 / 64


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` as x86 adds (under ``flush_denormals``): a NaN result is a's NaN
    (quietened) if a is one, else b's, else the default NaN (inf - inf); NumPy's loops
    may put the operands the other way round."""
    with np.errstate(invalid="ignore"):
        s = a + b
        return np.where(np.isnan(a), a + a, np.where(np.isnan(b), b + b, s))


def seq_sum(a: np.ndarray) -> np.ndarray:
    """Column sums ``((0 + a[0]) + a[1]) + ...`` in a's float type (FTZ applies when
    run under ``flush_denormals``). Starting from +0 turns a -0 first row into +0. A
    NaN sum is the NaN of the first row where the running sum became NaN: that row's
    (quietened) or the default NaN of inf - inf."""
    if a.shape[0] == 0:
        return np.zeros(a.shape[1], a.dtype)
    rows = np.concatenate([a[:1] + a.dtype.type(0), a[1:]])
    with np.errstate(invalid="ignore"):
        run = np.add.accumulate(rows, axis=0)  # (sequential)
    out = run[-1].copy()
    for j in np.flatnonzero(np.isnan(out)):
        k = int(np.argmax(np.isnan(run[:, j])))
        out[j] = add(np.zeros((), a.dtype) if k == 0 else run[k - 1, j], rows[k, j])
    return out


def reduce_outer(a: np.ndarray, threads: int) -> np.ndarray:
    """``ReduceOuterDimensions`` over the rows of the 2-D ``a`` (float32 or float64)."""
    r, c = a.shape
    if r == 1:
        return a[0].copy()  # TF casts the single row through: no addition, no flush
    with flush_denormals():
        nb, rows, per_call = redux_blocks(r, c, a.dtype.itemsize, threads)
        buffers = [np.zeros(c, a.dtype) for _ in range(nb)]
        for s in range(0, nb, per_call):
            buffers[s] = seq_sum(a[s * rows:(s + per_call) * rows])
        total = buffers[0]
        for b in buffers[1:]:
            total = add(total, b)
    return total


def packet(dtype: np.dtype) -> int:
    """Values per AVX packet (TF's build): 8 float32, 4 float64."""
    return 32 // np.dtype(dtype).itemsize


def _leaf_sums(v: np.ndarray) -> np.ndarray:
    """Eigen's leaf sum of each row of ``v`` [M, n <= 1024 packets] (InnerMostDimReducer):
    four packet accumulators over blocks of 4 packets, then whole packets, the scalar
    tail, the packet's horizontal sum (halves added pairwise: for float32
    (l0+l4 + l2+l6) + (l1+l5 + l3+l7)), tail + that."""
    m, n = v.shape
    dt = v.dtype
    pk = packet(dt)
    acc = np.zeros((m, 4, pk), dt)
    n4 = (n // (4 * pk)) * (4 * pk)
    n8 = (n // pk) * pk
    for j in range(0, n4, 4 * pk):
        acc = add(acc, v[:, j:j + 4 * pk].reshape(m, 4, pk))
    p = acc[:, 0]
    for k in (1, 2, 3):
        p = add(p, acc[:, k])
    for j in range(n4, n8, pk):
        p = add(p, v[:, j:j + pk])
    tail = np.zeros(m, dt)
    for j in range(n8, n):
        tail = add(tail, v[:, j])
    while p.shape[1] > 1:  # predux: fold the upper half onto the lower
        half = p.shape[1] // 2
        p = add(p[:, :half], p[:, half:])
        if half == 4:  # (float32: then (b0 + b2) + (b1 + b3))
            p = np.stack([add(p[:, 0], p[:, 2]), add(p[:, 1], p[:, 3])], axis=1)
    return add(tail, p[:, 0])


def full_sums(v: np.ndarray, first: int = 0) -> np.ndarray:
    """``eigen.full_sum`` of every row of ``v`` [M, n] (rows start at index ``first`` of
    their tensor), vectorized over the rows: leaves of 1024 packets under a binary tree
    split half way, up to a packet."""
    m, n = v.shape
    pk = packet(v.dtype)
    if n <= 1024 * pk:
        return _leaf_sums(v)
    at = pk * (-(-(first + -(-n // 2)) // pk))
    nl = min(at - first, n)
    acc = add(np.zeros(m, v.dtype), full_sums(v[:, :nl], first))
    if nl < n:
        # (compiled as right + left: the right subtree's NaN wins, measured)
        acc = add(full_sums(v[:, nl:], at), acc)
    return acc


def middle_blocks(b: int, c: int, hw: int, itemsize: int, threads: int
                  ) -> tuple[int, int, int]:
    """``(nb, size, per_call)``: the ranges of ``ReduceMiddleDimensions`` (``size``
    values each) and the ranges per ``parallelFor`` call."""
    total = b * c * hw
    min_block = -(-2000 // hw)
    nb = min(b * c, -(-total // min_block), threads)
    size = -(-total // nb)
    work = size * hw  # (TF's cost counts the range's size times hw)
    cost = _LOAD_CYCLES * work * itemsize + 1.0 * work
    return nb, size, parallel_for_block(nb, cost, threads) if nb > 1 else 1


def reduce_middle(a: np.ndarray, threads: int) -> np.ndarray:
    """``ReduceMiddleDimensions`` of the 3-D ``a`` [B, C, HW] over B and HW."""
    b, c, hw = a.shape
    if b * hw == 1:
        return a.reshape(c).copy()  # passed through
    if hw == 1:
        return reduce_outer(a.reshape(b, c), threads)
    flat = np.ascontiguousarray(a).reshape(-1)
    total = flat.size
    with flush_denormals():
        nb, size, per_call = middle_blocks(b, c, hw, a.dtype.itemsize, threads)
        buffers = np.zeros((nb, c), a.dtype)
        for s in range(0, nb, per_call):
            start, limit = s * size, min(total, (s + per_call) * size)
            buf = buffers[s]
            lo = -(-start // hw) * hw
            hi = (limit // hw) * hw
            coord = start // hw % c
            buf[coord] = add(buf[coord], full_sums(flat[start:lo].reshape(1, -1))[0])
            rows = full_sums(flat[lo:hi].reshape(-1, hw)) if hi > lo else ()
            coord = lo // hw % c
            for r in rows:
                buf[coord] = add(buf[coord], r)
                coord = coord + 1 if coord + 1 < c else 0
            buf[coord] = add(buf[coord], full_sums(flat[hi:limit].reshape(1, -1))[0])
        total_sum = buffers[0].copy()
        for k in range(1, nb):
            total_sum = add(total_sum, buffers[k])
    return total_sum
