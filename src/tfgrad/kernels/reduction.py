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

The entry points are task-pool kernels (``tfgrad.kernels._pool.launch``: one compiled
function for any thread count) run by ``tfgrad.dispatch.reduction``.
"""

from __future__ import annotations

import numpy as np

from .._compile import inline, jit
from .._tf.mxcsr import ftz_enter, ftz_exit
from ._pool import claim, tasks
from ._simd import aligned_scratch, vadd, vload, vload_part, vstore, vstore_part, vzeros

F32 = np.float32
_FLT_MIN = np.float32(2.0**-126)
_ZERO = np.float32(0.0)
_LEAF = 8 * 1024  # Eigen's LeafSize<float>() (1024) packets of 8
_ROWS = 64  # rows of an inner reduction per parallel task
_COLS = 512  # columns of an outer / middle reduction per parallel task
_RB = 64  # rows of an outer / middle reduction per register block (a multiple of 4)
_W = 16  # lanes of a vector
_GROUPS = 16  # task groups of an outer / middle reduction (each group one scratch)
_U = np.uint64  # unsigned offsets: no negative-index fix-ups in the vectorised loops


@inline
def _ftz(v):
    # FTZ/DAZ: a denormal becomes a zero of the same sign; NaN and inf pass.
    return v if abs(v) >= _FLT_MIN else v * _ZERO


@inline
def _leaf(v, s, n, acc):
    """Eigen's vectorised leaf over v[s:s + n] (n <= 8192); ``acc``: 32 floats of scratch.
    (``tfgrad.kernels.softmax_xent`` sums its exponentials with it too.)"""
    n4 = (n // 32) * 32  # four packets a step, into four accumulators
    a0 = vzeros(acc)  # (acc[0:16], acc[16:32] in registers: each lane's sum in order)
    a1 = vzeros(acc)
    for j in range(0, n4, 32):
        a0 = vadd(a0, vload(v, s + j))
        a1 = vadd(a1, vload(v, s + j + 16))
    vstore(acc, 0, a0)
    vstore(acc, 16, a1)
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


@jit(nogil=True)
def tree_sums(v, firsts, lengths, out, ctl, nthreads):  # pragma: no cover - compiled
    """out[t] = Eigen's tree over v[firsts[t]:firsts[t] + lengths[t]]."""
    m = firsts.size
    ntasks = (m + _ROWS - 1) // _ROWS
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for blk in range(cur[0], cur[1]):
            fz = ftz_enter()
            acc = np.empty(32, F32)
            for t in range(blk * _ROWS, min(m, (blk + 1) * _ROWS)):
                out[t] = _tree(v, firsts[t], lengths[t], acc)
            ftz_exit(fz)


@jit(nogil=True)
def row_sums(v, c, out, ctl, nthreads):  # pragma: no cover - compiled
    """Rows of c values of the flat v (an inner reduction): out[i] = tree of row i."""
    r = out.size
    ntasks = (r + _ROWS - 1) // _ROWS
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for blk in range(cur[0], cur[1]):
            fz = ftz_enter()
            acc = np.empty(32, F32)
            for i in range(blk * _ROWS, min(r, (blk + 1) * _ROWS)):
                out[i] = _tree(v, i * c, c, acc)
            ftz_exit(fz)


@inline
def _xload(xf, p, n):
    """xf[p:p + n] in the first n lanes (n <= 16), +0 in the others."""
    return vload(xf, p) if n == _W else vload_part(xf, p, n)


@inline(force=True)
def _lanes64(xf, acc, p0, c, rows, k, fresh):
    """Four accumulators (rows j mod 4) of the 64 columns at acc[q * _COLS + k:][:64]
    (q < 4), in registers over ``rows`` rows (a multiple of 4) from xf[p0 + k], c apart."""
    if fresh:
        a00 = vzeros(acc)
        a01 = vzeros(acc)
        a02 = vzeros(acc)
        a03 = vzeros(acc)
        a10 = vzeros(acc)
        a11 = vzeros(acc)
        a12 = vzeros(acc)
        a13 = vzeros(acc)
        a20 = vzeros(acc)
        a21 = vzeros(acc)
        a22 = vzeros(acc)
        a23 = vzeros(acc)
        a30 = vzeros(acc)
        a31 = vzeros(acc)
        a32 = vzeros(acc)
        a33 = vzeros(acc)
    else:
        a00 = vload(acc, k)
        a01 = vload(acc, k + 16)
        a02 = vload(acc, k + 32)
        a03 = vload(acc, k + 48)
        a10 = vload(acc, _COLS + k)
        a11 = vload(acc, _COLS + k + 16)
        a12 = vload(acc, _COLS + k + 32)
        a13 = vload(acc, _COLS + k + 48)
        a20 = vload(acc, 2 * _COLS + k)
        a21 = vload(acc, 2 * _COLS + k + 16)
        a22 = vload(acc, 2 * _COLS + k + 32)
        a23 = vload(acc, 2 * _COLS + k + 48)
        a30 = vload(acc, 3 * _COLS + k)
        a31 = vload(acc, 3 * _COLS + k + 16)
        a32 = vload(acc, 3 * _COLS + k + 32)
        a33 = vload(acc, 3 * _COLS + k + 48)
    p = p0 + k
    for _ in range(rows // 4):
        a00 = vadd(a00, vload(xf, p))
        a01 = vadd(a01, vload(xf, p + 16))
        a02 = vadd(a02, vload(xf, p + 32))
        a03 = vadd(a03, vload(xf, p + 48))
        p += c
        a10 = vadd(a10, vload(xf, p))
        a11 = vadd(a11, vload(xf, p + 16))
        a12 = vadd(a12, vload(xf, p + 32))
        a13 = vadd(a13, vload(xf, p + 48))
        p += c
        a20 = vadd(a20, vload(xf, p))
        a21 = vadd(a21, vload(xf, p + 16))
        a22 = vadd(a22, vload(xf, p + 32))
        a23 = vadd(a23, vload(xf, p + 48))
        p += c
        a30 = vadd(a30, vload(xf, p))
        a31 = vadd(a31, vload(xf, p + 16))
        a32 = vadd(a32, vload(xf, p + 32))
        a33 = vadd(a33, vload(xf, p + 48))
        p += c
    vstore(acc, k, a00)
    vstore(acc, k + 16, a01)
    vstore(acc, k + 32, a02)
    vstore(acc, k + 48, a03)
    vstore(acc, _COLS + k, a10)
    vstore(acc, _COLS + k + 16, a11)
    vstore(acc, _COLS + k + 32, a12)
    vstore(acc, _COLS + k + 48, a13)
    vstore(acc, 2 * _COLS + k, a20)
    vstore(acc, 2 * _COLS + k + 16, a21)
    vstore(acc, 2 * _COLS + k + 32, a22)
    vstore(acc, 2 * _COLS + k + 48, a23)
    vstore(acc, 3 * _COLS + k, a30)
    vstore(acc, 3 * _COLS + k + 16, a31)
    vstore(acc, 3 * _COLS + k + 32, a32)
    vstore(acc, 3 * _COLS + k + 48, a33)


@inline(force=True)
def _lanes16(xf, acc, p0, c, rows, k, n, fresh):
    """_lanes64 for the n <= 16 columns at k (a masked load when n < 16)."""
    if fresh:
        a0 = vzeros(acc)
        a1 = vzeros(acc)
        a2 = vzeros(acc)
        a3 = vzeros(acc)
    else:
        a0 = vload(acc, k)
        a1 = vload(acc, _COLS + k)
        a2 = vload(acc, 2 * _COLS + k)
        a3 = vload(acc, 3 * _COLS + k)
    p = p0 + k
    for _ in range(rows // 4):
        a0 = vadd(a0, _xload(xf, p, n))
        a1 = vadd(a1, _xload(xf, p + c, n))
        a2 = vadd(a2, _xload(xf, p + 2 * c, n))
        a3 = vadd(a3, _xload(xf, p + 3 * c, n))
        p += 4 * c
    vstore(acc, k, a0)
    vstore(acc, _COLS + k, a1)
    vstore(acc, 2 * _COLS + k, a2)
    vstore(acc, 3 * _COLS + k, a3)


@inline
def _put(arr, p, v, n):
    """arr[p:p + n] = v's first n lanes (n <= 16)."""
    if n == _W:
        vstore(arr, p, v)
    else:
        vstore_part(arr, p, v, n)


@jit(nogil=True)
def lane_sums(x, packet, all_packet, out, ctl, nthreads):  # pragma: no cover - compiled
    """x [a, b, c] summed along b into out [a * c]: where ``packet`` (per output; all of
    them when ``all_packet``), Eigen's InnerMostDimPreserver lanes (four accumulators over
    the rows j mod 4 below 4 * (b // 4), combined, then the other rows, when b >= 16);
    elsewhere the sequential sum.

    Each lane of a vector is one column, so every column's sums are in that order. The
    four accumulators of 64 columns stay in registers over blocks of _RB rows (then in
    scratch): a task reads each line of its columns once. Tasks are blocks of _COLS
    columns of one i, run in groups (one scratch per group)."""
    a, b, c = x.shape
    xf = x.reshape(-1)
    nblk = (c + _COLS - 1) // _COLS
    ntask = a * nblk
    ngroup = min(ntask, _GROUPS)
    b4 = (b // 4) * 4
    lanes_path = b >= 16
    ntasks = ngroup
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for g in range(cur[0], cur[1]):
            fz = ftz_enter()
            acc = aligned_scratch(4 * _COLS, x)
            lanes = aligned_scratch(_COLS, x)
            seq = aligned_scratch(_COLS, x)
            for task in range(g * ntask // ngroup, (g + 1) * ntask // ngroup):
                i = task // nblk
                k0 = (task % nblk) * _COLS
                w = min(c, k0 + _COLS) - k0
                o0 = i * c + k0  # the task's first output
                p0 = i * b * c + k0  # row 0 of the task's columns
                any_packet = all_packet
                if not all_packet:
                    for k in range(w):
                        any_packet |= packet[o0 + k]
                direct = all_packet or not any_packet  # one kind of sum for every output
                if lanes_path and any_packet:
                    for r0 in range(0, b4, _RB):
                        rows = min(b4 - r0, _RB)
                        k = 0
                        while k + 64 <= w:
                            _lanes64(xf, acc, p0 + r0 * c, c, rows, k, r0 == 0)
                            k += 64
                        while k < w:
                            _lanes16(xf, acc, p0 + r0 * c, c, rows, k, min(_W, w - k), r0 == 0)
                            k += _W
                    for k in range(0, w, _W):  # ((a0 + a1) + a2) + a3, then the rows past b4
                        n = min(_W, w - k)
                        v = vadd(vadd(vadd(vload(acc, k), vload(acc, _COLS + k)),
                                      vload(acc, 2 * _COLS + k)), vload(acc, 3 * _COLS + k))
                        for j in range(b4, b):
                            v = vadd(v, _xload(xf, p0 + j * c + k, n))
                        if direct:
                            _put(out, o0 + k, v, n)
                        else:
                            vstore(lanes, k, v)
                    if direct:
                        continue
                for k in range(0, w, _W):  # the sequential sums, for the vectors needing one
                    n = min(_W, w - k)
                    need = direct or not lanes_path
                    if not need:
                        for q in range(n):
                            need |= not packet[o0 + k + q]
                    if need:
                        v = vzeros(seq)
                        for j in range(b):
                            v = vadd(v, _xload(xf, p0 + j * c + k, n))
                        if direct or not lanes_path:
                            _put(out, o0 + k, v, n)
                        else:
                            vstore(seq, k, v)
                if not (direct or not lanes_path):
                    for k in range(w):
                        out[o0 + k] = lanes[k] if packet[o0 + k] else seq[k]
            ftz_exit(fz)


@jit(nogil=True)
def lane_sums_rows(x, packet, out, ctl, nthreads):  # pragma: no cover - compiled
    """x [a, b, c] summed along b into out [a * c]: where ``packet`` (per output), Eigen's
    InnerMostDimPreserver lanes (four accumulators over the rows j mod 4 below
    4 * (b // 4), combined, then the other rows, when b >= 16); elsewhere the sequential
    sum. Row by row, the accumulators in scratch: one sequential stream through the
    input, for tasks of more rows than the caches hold (``lane_sums`` reads a block of
    rows once per 64 columns, which the prefetchers do not follow out of memory)."""
    a, b, c = x.shape
    xf = x.reshape(-1)
    nblk = (c + _COLS - 1) // _COLS
    ntasks = a * nblk
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for task in range(cur[0], cur[1]):
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


@jit(nogil=True)
def zero_two_sums(x, out, ctl, nthreads):  # pragma: no cover - compiled
    """x [a, b, c] summed along a and c into out [b]: for k in c, for i in a, from +0."""
    a, b, c = x.shape
    ntasks = b
    size, cur = tasks(ctl, ntasks, nthreads)
    while claim(ctl, size, ntasks, cur):
        for bb in range(cur[0], cur[1]):
            fz = ftz_enter()
            s = _ZERO
            for k in range(c):
                for i in range(a):
                    s += x[i, bb, k]
            out[bb] = s
            ftz_exit(fz)
