"""How TF 2.21's CPU contractions order their sums (MatMul now; 1x1 Conv2D and the conv
backprops reuse it): Eigen's ThreadPool tensor contraction (TensorContractionThreadPool.h)
chooses k-blocks, and each block goes to oneDNN's JIT sgemm
(``TENSORFLOW_USE_MKLDNN_CONTRACTION_KERNEL``), whose AVX-512 nocopy kernel keeps one
accumulator per output and runs one FMA chain from +0 over each of its K passes.

So every output is ``C = ((0 + chain(r0)) + chain(r1)) + ...`` over consecutive k-ranges
``r`` (Eigen's k-blocks, each split further by oneDNN's K passes), each chain
``acc = fma(a[k], b[k], acc)`` from +0, each ``+`` one float32 add; with K-sharding, the
shards' partial results (each such a sum over its own range) are added in Eigen's order.

Eigen's names are used: the contraction is ``C[m, n] = sum_k L[m, k] R[k, n]`` in
column-major terms; TF's MatMul ``[M, K] x [K, N]`` (row-major) is Eigen's m = N, n = M.
What depends on the machine: the thread count (sequential vs parallel blocking, K-sharding),
the L1 size Eigen reads (CPUID: leaf 0x80000005 on AMD, leaf 4 on Intel) and oneDNN's
instruction set (AVX-512 here: FMA, K passes of 384). This module is plain Python: the
plan, which the NumPy reference and the compiled kernels both follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .eigen import num_threads as _num_threads
from .fpenv import flushed

# This build's Eigen gebp traits for float (AVX packets, no FMA in Eigen's own code):
# mr = 2 packets of 8, nr = 4 (Traits::mr, Traits::nr).
MR, NR = 16, 4
PACKET = 8
_K_DIV = MR * 4 + NR * 4  # KcFactor * (mr * sizeof(float) + nr * sizeof(float)) = 80
_K_SUB = MR * NR * 4  # mr * nr * sizeof(float) = 256
# oneDNN's nocopy sgemm: K passes of at most BK, 384 in its AVX-512 kernel
# (jit_avx512_common_gemm_f32.cpp), 256 in its AVX2 one (jit_avx_gemm_f32.cpp, B not
# transposed, as Eigen's packed blocks are).
ONEDNN_BK = {"avx512_core": 384, "avx2": 256}
# Eigen's TensorCostModel constants (load / store cycles per byte).
LOAD = 11.0 / 64
STORE = 11.0 / 64


@dataclass(frozen=True)
class Shard:
    """One K-shard's sums (Eigen's whole contraction when it does not shard by K)."""

    blocks: tuple[tuple[int, int], ...]
    """Eigen's k-blocks, in order: each one call of oneDNN's sgemm per output block."""
    ranges: tuple[tuple[int, int], ...]
    """The FMA chains of the nocopy kernel: ``blocks`` split by oneDNN's K passes."""
    gemv_m: bool
    """Eigen's last m-block has one row (oneDNN M = 1: ``gemv_t``): TF's last column
    (all of it when m == 1: Conv2D with one output channel, verified)."""
    gemv_n: bool
    """Eigen's last n-block has one column (oneDNN N = 1: ``gemv_n``): TF's last row."""
    mc: int = 0
    """Eigen's m-block (TF's columns per oneDNN call; 0: all of them)."""
    nc: int = 0
    """Eigen's n-block (TF's rows per oneDNN call; 0: all of them)."""
    isa: str = "avx512_core"
    """oneDNN's kernel: ``"avx512_core"`` (one FMA chain per output and pass) or
    ``"avx2"`` (its edge tiles sum otherwise: :func:`tfgrad._tf.onednn.avx2_tiles`)."""
    trans_a: bool = False
    """oneDNN's A transposed (Conv2DBackpropInput's direct sgemm): the AVX2 driver cuts
    rows in 96s instead of 48s."""
    copy: tuple[tuple[int, int, int, int], ...] = ()
    """AVX2: the Eigen blocks (TF's rows r0:r1, columns c0:c1) that oneDNN runs on its
    copy-based kernel (:func:`copy_based`): one FMA chain per output over ``copy_ranges``,
    no edge tiles."""
    copy_ranges: tuple[tuple[int, int], ...] = ()
    """``blocks`` split by the copy-based kernel's K passes (:func:`copy_passes`)."""


@dataclass(frozen=True)
class Plan:
    """The order of the outputs' sums: ``shards`` (one unless Eigen shards by the inner
    dimension), each a sum over its k-blocks added in order to a zero; the shards'
    results combined as :func:`combine_order` says."""

    shards: tuple[Shard, ...]
    path: str
    """``"sequential"``, ``"parallel"`` or ``"sharded"`` (which blocking Eigen ran)."""


# --------------------------------------------------------------------------------------
# Block sizes
# --------------------------------------------------------------------------------------
def _heuristic(k: int, m: int, n: int, t: int, l1: int, l2: int, l3: int
               ) -> tuple[int, int, int]:
    """Eigen's ``evaluateProductBlockingSizesHeuristic`` (GeneralBlockPanelKernel.h):
    (kc, mc, nc) for an m x k times k x n product on ``t`` threads (1: sequential)."""
    if t > 1:
        # kc capped at 320 ("once the latency is hidden there is no point in increasing k")
        k_cache = max(8, min((l1 - _K_SUB) // _K_DIV, 320))
        if k_cache < k:
            k = k_cache - k_cache % 8
        n_cache = (l2 - l1) // (NR * 4 * k)
        n_per = -(-n // t)
        if n_cache <= n_per:
            n = n_cache - n_cache % NR
        else:
            n = min(n, n_per + NR - 1 - (n_per + NR - 1) % NR)
        if l3 > l2:
            m_cache = (l3 - l2) // (4 * k * t)
            m_per = -(-m // t)
            if MR <= m_cache < m_per:
                m = m_cache - m_cache % MR
            else:
                m = min(m, m_per + MR - 1 - (m_per + MR - 1) % MR)
        return k, m, n
    if max(k, m, n) < 48:  # small problems are not blocked
        return k, m, n
    max_kc = max(((l1 - _K_SUB) // _K_DIV) & ~7, 1)
    old_k = k
    if k > max_kc:  # the last block as large as possible, the same number of sweeps
        k = max_kc if k % max_kc == 0 else (
            max_kc - 8 * ((max_kc - 1 - k % max_kc) // (8 * (k // max_kc + 1))))
    actual_l2 = 1572864  # Eigen's fixed 1.5 MB
    remaining_l1 = l1 - _K_SUB - m * k * 4
    if remaining_l1 >= NR * 4 * k:
        max_nc = remaining_l1 // (k * 4)
    else:
        max_nc = (3 * actual_l2) // (2 * 2 * max_kc * 4)
    nc = min(actual_l2 // (2 * k * 4), max_nc) & ~(NR - 1)
    if n > nc:
        n = nc if n % nc == 0 else nc - NR * ((nc - n % nc) // (NR * (n // nc + 1)))
    elif old_k == k:
        problem = k * n * 4
        actual_lm, max_mc = actual_l2, m
        if problem <= 1024:
            actual_lm = l1
        elif l3 != 0 and problem <= 32768:
            actual_lm, max_mc = l2, min(576, max_mc)
        mc = min(actual_lm // (3 * k * 4), max_mc)
        if mc > MR:
            mc -= mc % MR
        elif mc == 0:
            return k, m, n
        m = mc if m % mc == 0 else mc - MR * ((mc - m % mc) // (MR * (m // mc + 1)))
    return k, m, n


def tf_blocking(k: int, m: int, n: int, t: int, by_col: bool, l1: int, l2: int, l3: int
                ) -> tuple[int, int, int]:
    """TF's ``TensorContractionBlocking<float>`` (eigen_contraction_kernel.h): Eigen's
    heuristic (m and n swapped when sharding by row), then mc x1.5 rounded up to 48,
    nc up to 24, and k cut in equal slices rounded up to 8. Returns (kc, mc, nc)."""
    if by_col:
        kc, mc, nc = _heuristic(k, m, n, t, l1, l2, l3)
    else:
        kc, nc, mc = _heuristic(k, n, m, t, l1, l2, l3)
    if kc <= 0 or mc <= 0 or nc <= 0:
        return kc, mc, nc
    mc = min(m, -(-int(mc * 1.5) // 48) * 48)
    nc = min(n, -(-nc // 24) * 24)
    slices = max(1, -(-k // kc))
    return min(k, -(-(k // slices) // 8) * 8), mc, nc


def onednn_passes(start: int, end: int, isa: str = "avx512_core") -> list[tuple[int, int]]:
    """oneDNN's K passes over one Eigen block (BK 384 on AVX-512, 256 on AVX2): K <= BK
    one pass; BK < K < 2 BK halves (ceil first); K >= 2 BK passes of BK until under 2 BK
    remain, then halves."""
    out = []
    kk = end - start
    bk = ONEDNN_BK[isa]
    while kk >= 2 * bk:
        out.append((start, start + bk))
        start += bk
        kk -= bk
    if kk > bk:
        h = -(-kk // 2)
        out += [(start, start + h), (start + h, end)]
    elif kk > 0:
        out.append((start, end))
    return out


def copy_based(m: int, n: int, k: int) -> bool:
    """Whether oneDNN's AVX2 sgemm (one thread, B not transposed) takes its copy-based
    kernel for an m x n x k call (``nocopy_checker_avx2``): unless 1/m + 1/n >= 0.0038
    (its "crude threshold"), only k <= 2 stays on the nocopy kernel."""
    return 1.0 / m + 1.0 / n < 0.0038 and k > 2


def copy_passes(start: int, end: int) -> list[tuple[int, int]]:
    """The copy-based AVX2 kernel's K passes over one Eigen block (``get_k_padd``: bk 192,
    bk_traditional 256): K <= 256 one pass; K < 384 ceil(K / 2), then the rest; else
    passes of 192, the last what remains."""
    kk = end - start
    step = kk if kk <= 256 else (kk + 1) // 2 if kk < 384 else 192
    return [(s, min(end, s + step)) for s in range(start, end, step)]


def copy_blocks(m: int, n: int, mc: int, nc: int, blocks: tuple[tuple[int, int], ...]
                ) -> tuple[tuple[int, int, int, int], ...]:
    """The Eigen blocks (TF's rows r0:r1, columns c0:c1) of an [m, k] x [k, n] (Eigen's
    names) contraction that oneDNN's AVX2 sgemm runs copy-based (every k-block more
    than 2 deep; a k <= 2 block alone is not modelled)."""
    if min(e - s for s, e in blocks) <= 2:
        return ()
    return tuple((j, min(n, j + nc), i, min(m, i + mc)) for j in range(0, n, nc)
                 for i in range(0, m, mc) if copy_based(min(mc, m - i), min(nc, n - j), 3))


def shard(start: int, end: int, blocking: tuple[int, int, int], m: int, n: int,
          isa: str = "avx512_core") -> Shard:
    kc, mc, nc = blocking
    blocks = tuple((s, min(end, s + kc)) for s in range(start, end, kc))
    ranges = tuple(r for s, e in blocks for r in onednn_passes(s, e, isa))
    copy = copy_blocks(m, n, mc, nc, blocks) if isa == "avx2" else ()
    copy_ranges = tuple(r for s, e in blocks for r in copy_passes(s, e)) if copy else ()
    # the last block along m (n) has m - mc * (ceil(m / mc) - 1) rows (columns); m == 1
    # (Conv2D with one output channel) is all gemv_t. (n == 1 never gets here in TF:
    # Eigen's evalGemv, its own non-FMA GEMV, computes it; not modelled.)
    return Shard(blocks, ranges, m - mc * (-(-m // mc) - 1) == 1,
                 n > 1 and n - nc * (-(-n // nc) - 1) == 1, mc, nc, isa, copy=copy,
                 copy_ranges=copy_ranges)


# --------------------------------------------------------------------------------------
# Eigen's choices (evalProductImpl)
# --------------------------------------------------------------------------------------
def shard_by_col(m: int, n: int, t: int) -> bool:
    """Eigen's ``shardByCol``."""
    if m // t >= NR and (n // t < NR or (
            n // t < 4 * NR and n % (t * NR) != 0
            and (m % (t * NR) == 0 or m // n >= 6))):
        return False
    return not (n // t < 16 * NR and m > n * 32)


def cost(m: int, n: int, k: int, l1: int, l2: int, l3: int) -> float:
    """Eigen's ``contractionCost(m, n, bm, bn, bk, shard_by_col, false)`` in cycles per
    output, with the blocking Eigen computes for 2 threads (its first approximation)."""
    by_col = shard_by_col(m, n, 2)
    bk, bm, bn = tf_blocking(k, m, n, 2, by_col, l1, l2, l3)
    # computeBandwidth(false, bm, bn, bk): Eigen passes false whatever the sharding (so
    # bm < nr or bn < mr); 0.5 at full vectorisation, 1.0 without Eigen's FMA (this build)
    bw = 4.0 if bk == 1 else (2.0 if bm < NR or bn < MR else 1.0)
    cost = bk * bw / PACKET + 4 * STORE  # compute (vectorised) + the output's store
    # lhs / rhs loads (4 bytes a coefficient) per output; one side's memory cost dropped
    cost += 4 * LOAD * bk / m if by_col else 4 * LOAD * bk / n
    return cost


def _threads_inner_dim(m: int, n: int, k: int, threads: int) -> int:
    """Eigen's ``numThreadsInnerDim``."""
    bw = 4.0 if k == 1 else (2.0 if n < NR or m < MR else 1.0)  # computeBandwidth(true..)
    cost = bw * m * n / PACKET + 4 * STORE + 4 * LOAD * n  # lhs memory cost dropped
    total = k * cost
    reduction = m * n * (2 * LOAD + 1 * STORE + 1.0 / PACKET)
    best, best_cost = 1, total
    for nt in range(2, threads + 1, 2):
        c = total / nt + 100000 + nt * (reduction + 3000)
        if c < best_cost:
            best, best_cost = nt, c
    return best


def shard_by_inner_dim(m: int, n: int, k: int, nt: int, nt_k: int, l3: int) -> bool:
    """Eigen's ``shardByInnerDim``."""
    if (n == 1 or nt_k < 2 or nt_k < nt or m * n * 4 > l3 // nt_k or k // nt_k < 2 * NR):
        return False
    return max(m, n) // nt < NR or (k // nt_k > 8 * NR and (min(m, n) < 2 * NR or nt_k > nt))


@lru_cache(maxsize=1024)
def plan(m: int, n: int, k: int, threads: int, l1: int, l2: int, l3: int,
         isa: str = "avx512_core") -> Plan:
    """The order of every output's sum for Eigen's contraction [m, k] x [k, n] (Eigen's
    column-major names) on ``threads`` intra-op threads (k, m, n > 0), with the caches
    Eigen reads (l1, l2, l3 bytes) and oneDNN's kernel ``isa``."""
    nt = _num_threads(m * n, cost(m, n, k, l1, l2, l3), threads)
    nt_k = _threads_inner_dim(m, n, k, threads)
    if shard_by_inner_dim(m, n, k, nt, nt_k, l3):
        # EvalShardedByInnerDimContext: blocks of max(96, roundup8(k / nt_k)); each a
        # partial GEMM (evalGemmPartial) blocked by column for num_blocks threads.
        per_thread = -(-k // nt_k)
        block = min(k, max(12 * PACKET, -(-per_thread // 8) * 8))
        nb = -(-k // block)
        shards = tuple(
            shard(s, min(k, s + block),
                  tf_blocking(min(k, s + block) - s, m, n, nb, True, l1, l2, l3), m, n, isa)
            for s in range(0, k, block))
        return Plan(shards, "sharded")
    if n == 1:
        nt = 1
    if nt == 1:  # evalProductSequential: blocked by column for one thread
        return Plan((shard(0, k, tf_blocking(k, m, n, 1, True, l1, l2, l3), m, n, isa),),
                    "sequential")
    by_col = shard_by_col(m, n, nt)
    return Plan((shard(0, k, tf_blocking(k, m, n, nt, by_col, l1, l2, l3), m, n, isa),),
                "parallel")


def combine_order(shards: int) -> list[tuple[int, ...]]:
    """How Eigen adds the K-shards' buffers into shard 0's (``aggregateL0Blocks``): groups
    of 4 consecutive shards, a full group as ``(b0 + b1) + (b2 + b3)`` (tuple of 4), a
    partial one one buffer at a time into its first; then the group leaders into b0 in
    threes ``(b0 + G1) + (G2 + G3)``, the rest one at a time. Returned as steps: a 2-tuple
    ``(dst, src)`` is ``dst += src``; a 4-tuple ``(dst, s0, s1, s2)`` is
    ``dst = (dst + s0) + (s1 + s2)`` on whole packets of 8 outputs and
    ``dst + ((s0 + s1) + s2)`` on the outputs past them."""
    steps: list[tuple[int, ...]] = []
    groups = -(-shards // 4)
    for g in range(groups):
        size = min(4, shards - 4 * g)
        d = 4 * g
        if size == 4:
            steps.append((d, d + 1, d + 2, d + 3))
        else:
            steps += [(d, d + i) for i in range(1, size)]
    g = 1
    while g + 2 < groups:
        steps.append((0, 4 * g, 4 * (g + 1), 4 * (g + 2)))
        g += 3
    steps += [(0, 4 * i) for i in range(g, groups)]
    return steps


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 a + b with the result flushed (TF's FTZ)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return flushed(np.add(a, b, dtype=np.float32))


def combine_tail(m: int, n: int, rows: tuple[int, int] | None = None) -> np.ndarray:
    """The flat indices of an [m, n] piece of TF's output (row-major: Eigen's buffer) that
    Eigen's aggregation adds as its tail, past the buffer's last whole packet of 8.
    ``rows`` (first, period): piece row i is row (first + i) mod period of a contraction
    of period rows (a chunk of Conv2D's patches, BackpropInput's images stacked, each its
    own contraction); None: the piece is the whole output."""
    first, period = rows or (0, m)
    total = period * n
    start = total - total % PACKET
    g = (first + np.arange(m, dtype=np.int64)) % period
    r = np.flatnonzero((g + 1) * n > start)  # the rows holding one (< 8 per contraction)
    cols = np.arange(n, dtype=np.int64)
    hit = g[r, None] * n + cols >= start
    return (r[:, None] * n + cols)[hit]


def combine(bufs: list[np.ndarray], tail: np.ndarray | None = None) -> np.ndarray:
    """Eigen's aggregation of the K-shards' buffers (``combine_order``); ``tail``: the
    flat indices added as the tail (:func:`combine_tail`; None: the last size % 8)."""
    b = [x.copy() for x in bufs]
    size = b[0].size
    if tail is None:
        tail = np.arange(size - size % PACKET, size)
    for step in combine_order(len(b)):
        if len(step) == 2:
            d, s = step
            b[d] = _add(b[d], b[s])
        else:
            d, s0, s1, s2 = step
            t = _add(b[d][tail], _add(_add(b[s0][tail], b[s1][tail]), b[s2][tail]))
            b[d] = _add(_add(b[d], b[s0]), _add(b[s1], b[s2]))
            b[d][tail] = t
    return b[0]
