"""How Eigen and TF split work over TF's intra-op threads, and the order of Eigen's sums.

A few of TF's sums depend on its thread count (``tfgrad._config.tf_intra_op_threads``):
the fake-quant gradients' full reductions are split into shards by Eigen's cost model,
and the batch-norm gradient's column sums into row blocks by ``ReduceOuterDimensions``.
This module computes those splits, and the order of Eigen's full reduction within a shard
(its tree of leaves, the packets within a leaf): as a NumPy sum (the references) and as
a plan, programs of leaves and combines that the compiled kernels run.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .._config import tf_intra_op_threads
from .fpenv import flushed

_F32 = np.float32
_ZERO = _F32(0.0)

# Eigen's cost model (TensorCostModel.h): cycles per byte loaded (an L2 line of 64 bytes
# in 11 cycles), the start-up / per-thread costs and the ideal task size.
_LOAD_CYCLES = 1.0 / 64 * 11
_STARTUP_CYCLES = 100000.0
_TASK_CYCLES = 40000.0


# --------------------------------------------------------------------------------------
# Eigen's cost model and TF's splits
# --------------------------------------------------------------------------------------
def num_threads(n: int, cost: float, threads: int) -> int:
    """Eigen's ``TensorCostModel::numThreads(n, cost, threads)``: the threads worth using
    for n items of ``cost`` cycles each (the shards of a full reduction, the calls of a
    ``parallelFor``)."""
    t = min((n * cost - _STARTUP_CYCLES) / _STARTUP_CYCLES + 0.9, 2.0**31 - 1)
    return min(threads, max(1, int(t)))  # int() truncates toward zero, as C++'s cast


def parallel_for_block(n: int, cost: float, threads: int) -> int:
    """How many consecutive items of [0, n) Eigen's ``ThreadPoolDevice::parallelFor(n,
    cost, f)`` hands to one call of f (TensorDeviceThreadPool.h): all n when the cost
    model wants one thread; else ``CalculateParallelForBlock``'s block size (items of
    ``1 / taskSize`` worth 40000 cycles, at least ``ceil(n / (4 * threads))``, coarsened
    up to twice that while the parallel efficiency does not drop by more than 0.01), and
    ``handleRange`` halves [0, n) at multiples of it, so the calls are
    ``[k * block, min(n, (k + 1) * block))``."""
    if n == 1 or threads == 1 or num_threads(n, cost, threads) == 1:
        return n
    block_size_f = 1.0 / (cost / _TASK_CYCLES)
    block = min(n, max(-(-n // (4 * threads)), int(block_size_f)))
    max_block = min(n, 2 * block)
    count = -(-n // block)
    best = count / (-(-count // threads) * threads)
    prev = count
    while best < 1.0 and prev > 1:
        coarser = -(-n // (prev - 1))
        if coarser > max_block:
            break
        prev = -(-n // coarser)
        eff = prev / (-(-prev // threads) * threads)
        if eff + 0.01 >= best:
            block, count = coarser, prev
            best = max(best, eff)
    return block


def redux_blocks(r: int, c: int, itemsize: int, threads: int) -> tuple[int, int, int]:
    """TF's ``ReduceOuterDimensions`` (redux_functor.h) over [r, c] on ``threads`` threads:
    ``(nb, rows, per_call)``. TF zeroes nb partial-sum buffers; buffer i is for rows
    ``[i * rows, (i + 1) * rows)``; Eigen's parallelFor runs the blocks in calls of
    ``per_call`` consecutive blocks, and a call [s, e) sums all its rows in sequence into
    buffer s (the others stay +0); then buffers 1..nb-1 are added to buffer 0 in order.

    With C > 32 * threads TF splits the columns instead (each still summed in sequence):
    one block. Otherwise nb = min(r, ceil(r*c / ceil(2000 / c)), threads) blocks of
    ``ceil(r / nb)`` rows (the last ones may be empty), each costing
    ``rows*c * (itemsize * 11/64 + 1)`` cycles (bytes loaded, one add a value)."""
    if threads <= 1 or r <= 1 or c > 32 * threads:
        return 1, max(r, 1), 1
    min_rows = -(-2000 // c)  # min_block_workload = 2000 values
    nb = min(r, -(-(r * c) // min_rows), threads)
    rows = -(-r // nb)
    size = rows * c  # values a block sums
    cost = (_LOAD_CYCLES * (size * itemsize) + _LOAD_CYCLES * 0.0) + 1.0 * size
    return nb, rows, parallel_for_block(nb, cost, threads)


def redux_plan(r: int, c: int, itemsize: int, threads: int) -> tuple[int, bool, bool]:
    """``redux_blocks`` as the kernels run it: ``(rows, zero_between, zero_after)``.

    Partial sums of ``rows`` rows each (from +0, rows in sequence; the calls that have
    rows) are added in order, the first unchanged. The untouched buffers TF adds too are
    +0: adding one changes nothing but turns a total of -0 (a sum flushed to zero, FTZ)
    into +0. ``zero_between``: such buffers follow every partial sum but the last (calls
    of several blocks); ``zero_after``: some follow the last one (a call of several
    blocks, or blocks past the last row). All blocks in one call (little work, e.g. C = 32
    on 2 threads with a few rows): every row in the first sum, +0 added after."""
    nb, rows, per_call = redux_blocks(r, c, itemsize, threads)
    span = per_call * rows  # rows of one call
    calls = -(-max(r, 1) // span)  # the calls that have rows
    return min(span, max(r, 1)), per_call > 1 and calls > 1, nb - 1 > (calls - 1) * per_call


# --------------------------------------------------------------------------------------
# Eigen's full sum reduction (AVX build of TF 2.21): packets of 8 floats, leaves of at
# most 8 * 1024 values below a binary split tree; with several shards, each shard's tree.
# --------------------------------------------------------------------------------------
PACKET = 8
LEAF = PACKET * 1024


def _ftz(a: np.ndarray) -> np.ndarray:
    return flushed(np.asarray(a, _F32))


def split(first: int, n: int) -> int:
    """Where Eigen splits [first, first + n) (n > LEAF): half way, up to a packet."""
    half = -(-n // 2)
    return PACKET * (-(-(first + half) // PACKET))


def shards(n: int, count: int) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """Eigen's FullReducer blocks for ``count`` shards: equal blocks and a remainder
    block (or None); the result is ((remainder or 0) + block 0) + block 1 + ..."""
    if count <= 1:
        return [(0, n)], None
    size = n // count
    k = n // size
    rest = (k * size, n - k * size) if k * size < n else None
    return [(i * size, size) for i in range(k)], rest


def _leaf_sum(v: np.ndarray) -> np.float32:
    n = v.size
    acc = np.zeros((4, PACKET), _F32)
    n4 = (n // (4 * PACKET)) * (4 * PACKET)
    n8 = (n // PACKET) * PACKET
    for j in range(0, n4, 4 * PACKET):
        acc = _ftz(acc + v[j:j + 4 * PACKET].reshape(4, PACKET))
    p = acc[0]
    for k in (1, 2, 3):  # paccum += paccum1; += paccum2; += paccum3
        p = _ftz(p + acc[k])
    for j in range(n4, n8, PACKET):
        p = _ftz(p + v[j:j + PACKET])
    tail = _ZERO
    for j in range(n8, n):
        tail = _ftz(tail + v[j])
    b = _ftz(p[:4] + p[4:])  # predux: (l0+l4 + l2+l6) + (l1+l5 + l3+l7)
    h = _ftz(_ftz(b[0] + b[2]) + _ftz(b[1] + b[3]))
    return _F32(_ftz(tail + h))


def full_sum(v: np.ndarray, first: int = 0) -> np.float32:
    """Sum of the 1-D float32 array ``v`` as Eigen's single-shard full reducer does it,
    under FTZ.

    ``first`` is the index of ``v[0]`` in the reduced tensor (split points are aligned
    on packets of the whole tensor).
    """
    n = v.size
    if n <= LEAF:
        return _leaf_sum(v)
    at = split(first, n)
    nl = min(at - first, n)
    acc = _ftz(_ZERO + full_sum(v[:nl], first))
    if nl < n:
        acc = _ftz(acc + full_sum(v[nl:], at))
    return _F32(acc)


def sharded_sum(v: np.ndarray, count: int) -> np.float32:
    """``full_sum`` of the whole tensor as TF's thread pool computes it in ``count``
    shards."""
    if count <= 1:
        return full_sum(v)
    blocks, rest = shards(v.size, count)
    acc = full_sum(v[rest[0]:], rest[0]) if rest else _ZERO
    for first, m in blocks:
        acc = _ftz(acc + full_sum(v[first:first + m], first))
    return _F32(acc)


# --------------------------------------------------------------------------------------
# The reduction plan: Eigen's shards and trees, cut into subtrees that threads take
# --------------------------------------------------------------------------------------
# Program opcodes (rows of an int64 [L, 3] array):
OP_LEAF = 0     # (0, first, length): push the leaf's sum
OP_COMBINE = 1  # pop right, pop left, push (0 + left) + right (a tree node)
OP_TASK = 2     # (2, t, 0): push subtree t's result (top-level program only)
OP_ADD = 3      # pop right, pop left, push left + right (the shards' final sum)
OP_ZERO = 4     # push 0

_TASKS = 8         # subtrees to aim for (a constant: the plan must not depend on threads)
_MIN_BLOCK = 16    # channels per task at least (a 64-byte line of float32)


def _postfix(first: int, n: int, out: list[tuple[int, int, int]]) -> None:
    if n <= LEAF:
        out.append((OP_LEAF, first, n))
        return
    at = split(first, n)
    nl = min(at - first, n)
    _postfix(first, nl, out)
    _postfix(at, n - nl, out)
    out.append((OP_COMBINE, 0, 0))


@lru_cache(maxsize=64)
def _plan(n: int, d: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    blocks, rest = shards(n, count)
    roots = ([rest] if rest else []) + blocks
    # Cut the trees into subtrees: split the nodes above leaves until there are _TASKS
    # of them (or only leaves are left). Nodes are (first, length).
    nodes = list(roots)
    while len(nodes) < _TASKS and any(m > LEAF for _, m in nodes):
        nxt = []
        for first, m in nodes:
            if m > LEAF:
                at = split(first, m)
                nxt += [(first, at - first), (at, m - (at - first))]
            else:
                nxt.append((first, m))
        nodes = nxt
    prog: list[tuple[int, int, int]] = []
    starts = []
    for first, m in nodes:
        starts.append(len(prog))
        _postfix(first, m, prog)
    starts.append(len(prog))
    # The top program rebuilds the trees above the subtrees, then adds up the shards.
    index = {node: t for t, node in enumerate(nodes)}
    top: list[tuple[int, int, int]] = []

    def build(first: int, m: int) -> None:
        if (first, m) in index:
            top.append((OP_TASK, index[(first, m)], 0))
            return
        at = split(first, m)
        build(first, at - first)
        build(at, m - (at - first))
        top.append((OP_COMBINE, 0, 0))

    if count <= 1:
        build(0, n)
    else:
        if rest:
            build(*rest)
        else:
            top.append((OP_ZERO, 0, 0))
        for block in blocks:
            build(*block)
            top.append((OP_ADD, 0, 0))
    # Channel blocks: enough tasks for the threads when there are few subtrees.
    nblocks = max(1, min(-(-_TASKS // len(nodes)), d // _MIN_BLOCK))
    width = max(1, -(-d // nblocks))
    depth = 3 + max(1, n).bit_length()  # bound on the stack depth of the programs
    return (np.array(prog, np.int64).reshape(-1, 3), np.array(starts, np.int64),
            np.array(top, np.int64).reshape(-1, 3), width, depth)


def reduction_plan(n: int, d: int, cost: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Eigen's reduction of columns of length ``n`` (d of them), each value of ``cost``
    cycles, on TF's thread count, as programs for kernels.

    Returns ``(prog, starts, top, width, depth)``: subtree ``t`` is the postfix program
    ``prog[starts[t]:starts[t + 1]]``; ``top`` combines the subtrees' results; threads
    take (subtree, block of ``width`` channels) pairs; ``depth`` bounds the stack. It
    depends on (n, d) and TF's thread count, never on tfgrad's, so results do not either.
    """
    return _plan(n, d, num_threads(n, cost, tf_intra_op_threads()))
