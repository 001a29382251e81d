"""Conv2D's geometry and the arithmetic of TF's contractions that MatMul's plan does not
cover, shared by the NumPy reference (``tfgrad.ops.conv2d``) and the dispatch.

The plan of Eigen's SpatialConvolution contraction (Conv2D's general path):

TF's Conv2D contracts the filter [K, O] with ``extract_image_patches(x)`` [K, pixels]
(Eigen's m = O, n = pixels, as MatMul's), so its k-blocks follow
:func:`tfgrad._tf.contraction.plan` except for Eigen's cost model: the patches'
``TensorImagePatchOp::costPerCoeff`` adds index arithmetic to every coefficient of the
right-hand side, ``3 * DivCost<Index> + 6 * MulCost<Index> + 8 * MulCost<Index>`` cycles
(int64 division: 24; multiplication: 1) vectorised over a packet of 8. That raises
``contractionCost`` (the thread count) and ``contractionCostPerInnerDim`` (the K-sharding
decision), so a small-output, deep convolution is K-sharded where a MatMul of the same
(m, n, k) is not (probe: 1x3x3x256 -> 2, 3x3 SAME: K = 2304 in two shards; MatMul's plan,
sequential, differs in 16 of 18 outputs).

The 1x1 stride-1 and filter == input VALID convolutions are plain contractions
(MatMulConvFunctor), and the backprops' contractions are of plain tensors: MatMul's plan.

Shapes MatMul never contracts (Eigen Core takes its vector products): one output column
(Eigen's m = 1, oneDNN's ``gemv_t``: :func:`edge_plan`) and one output row (Eigen's
n = 1: Eigen's own GEMV, :func:`eigen_gemv`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import contraction as ct
from . import onednn
from .eigen import num_threads as _num_threads
from .fpenv import flushed

F32 = np.float32


@dataclass(frozen=True)
class Geometry:
    """One NHWC convolution: x [N, H, W, C], filter [KH, KW, C, O], y [N, OH, OW, O]."""

    N: int
    H: int
    W: int
    C: int
    O: int
    KH: int
    KW: int
    OH: int
    OW: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    padding: str = "VALID"

    @property
    def P(self) -> int:
        """Output pixels per image."""
        return self.OH * self.OW

    @property
    def F(self) -> int:
        """Filter taps times channels: the forward's contraction depth."""
        return self.KH * self.KW * self.C


def edge_plan(p: ct.Plan, n_cols: int) -> ct.Plan:
    """A contraction with one output column (Eigen's m = 1: a conv's O = 1): its only
    m-block has one row, which oneDNN runs as ``gemv_t``."""
    if n_cols != 1:
        return p
    return ct.Plan(tuple(dataclasses.replace(sh, gemv_m=True) for sh in p.shards), p.path)


def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return flushed(np.multiply(a, b, dtype=F32))


def gemv_block(B: np.ndarray) -> int:
    """The k-block of Eigen's column-major GEMV over B [K, N] as TF lays it out: all of K
    below 128, else 16, or 4 when the GEMV's lhs stride (B's stride along k, in elements)
    is 32000 bytes or more: Conv2D's filter [K, N] (stride N: 4 from 8000 output
    channels, probed) but not Conv2DBackpropInput's transposed filter (stride 1: 16 at
    every F, probed to 12000)."""
    K = B.shape[0]
    if K < 128:
        return K
    return 16 if abs(B.strides[0]) // B.itemsize * 4 < 32000 else 4


def eigen_gemv(a: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A contraction with one output row (Eigen's n = 1): Eigen's own column-major GEMV
    (``evalGemv``, no oneDNN, no FMA in this build): y[j] = sum_k B[k, j] a[k] in blocks
    of k (:func:`gemv_block`), each a mul-then-add chain from 0, added to y. ``a`` [1, K],
    B [K, N] (a view: its strides choose the block)."""
    K, N = B.shape
    block = gemv_block(B)
    y = np.zeros(N, F32)
    for s in range(0, K, block):
        c = np.zeros(N, F32)
        for k in range(s, min(K, s + block)):
            c = onednn.add(c, _mul(B[k], a[0, k]))
        y = onednn.add(y, c)
    return y[None, :]


def gemv_one(a: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Conv2DBackpropInput's direct sgemm for one output pixel (oneDNN's gemv_t over all
    of K = O): col [1, F] from a [1, O] and W [F, O]."""
    return onednn.gemv_t(W, a[0], np.zeros(W.shape[0], F32), 0, W.shape[1])[None, :]

# TensorImagePatchOp::costPerCoeff's index arithmetic per coefficient, vectorised
_PATCH_CYCLES = (3 * 24 + 6 * 1 + 8 * 1) / ct.PACKET


def cost(m: int, n: int, k: int, l1: int, l2: int, l3: int) -> float:
    """``contractionCost`` with the patches' compute cost (never dropped: only the memory
    cost of one side is)."""
    by_col = ct.shard_by_col(m, n, 2)
    bk = ct.tf_blocking(k, m, n, 2, by_col, l1, l2, l3)[0]
    return ct.cost(m, n, k, l1, l2, l3) + _PATCH_CYCLES * bk / m


def _threads_inner_dim(m: int, n: int, k: int, threads: int) -> int:
    """``numThreadsInnerDim`` with the patches' compute cost per inner-dimension step."""
    bw = 4.0 if k == 1 else (2.0 if n < ct.NR or m < ct.MR else 1.0)
    cost = (bw * m * n / ct.PACKET + 4 * ct.STORE + 4 * ct.LOAD * n
            + _PATCH_CYCLES * n)
    total = k * cost
    reduction = m * n * (2 * ct.LOAD + 1 * ct.STORE + 1.0 / ct.PACKET)
    best, best_cost = 1, total
    for nt in range(2, threads + 1, 2):
        c = total / nt + 100000 + nt * (reduction + 3000)
        if c < best_cost:
            best, best_cost = nt, c
    return best


@lru_cache(maxsize=1024)
def plan(m: int, n: int, k: int, threads: int, l1: int, l2: int, l3: int,
         isa: str = "avx512_core") -> ct.Plan:
    """:func:`tfgrad._tf.contraction.plan` for a contraction whose right-hand side is
    image patches (Eigen's m = O, n = output pixels, k = KH*KW*C)."""
    nt = _num_threads(m * n, cost(m, n, k, l1, l2, l3), threads)
    nt_k = _threads_inner_dim(m, n, k, threads)
    if ct.shard_by_inner_dim(m, n, k, nt, nt_k, l3):
        per = -(-k // nt_k)  # ceil(k / nt_k), rounded up to 8
        block = min(k, max(12 * ct.PACKET, -(-per // 8) * 8))
        nb = -(-k // block)
        shards = tuple(
            ct.shard(s, min(k, s + block),
                     ct.tf_blocking(min(k, s + block) - s, m, n, nb, True, l1, l2, l3), m, n,
                     isa)
            for s in range(0, k, block))
        return ct.Plan(shards, "sharded")
    if n == 1:
        nt = 1
    if nt == 1:
        return ct.Plan((ct.shard(0, k, ct.tf_blocking(k, m, n, 1, True, l1, l2, l3), m, n,
                                 isa),), "sequential")
    by_col = ct.shard_by_col(m, n, nt)
    return ct.Plan((ct.shard(0, k, ct.tf_blocking(k, m, n, nt, by_col, l1, l2, l3), m, n,
                             isa),), "parallel")
