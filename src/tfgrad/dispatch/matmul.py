"""MatMul on the compiled contraction (``tfgrad.kernels.matmul``): A read in place
(transposed or not), B copied to rows of a multiple of 8 columns where it is not already,
one kernel launch for all the K-shards of TF's plan (each its own [M, N] buffer), Eigen's
one-wide edge blocks recomputed in oneDNN's GEMV order, the shards combined in Eigen's
order."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .._compile import launch
from .._tf.contraction import Plan, combine, combine_tail
from .._tf.fpenv import flush_denormals
from .._tf.onednn import avx2_kinds, copy_fixes, edges
from ..kernels import matmul as k
from ..kernels._simd import stream_output

F32 = np.float32
_FAMILY = "matmul"


def _padded(x: np.ndarray, cols: int) -> np.ndarray:
    """x [K, N] C-contiguous with ``cols`` >= N columns, zeros past N (copied if needed)."""
    if x.shape[1] == cols and x.flags.c_contiguous:
        return x
    out = np.empty((x.shape[0], cols), F32)
    k.pad_columns(x, out)
    return out


@lru_cache(maxsize=256)
def _ranges(p: Plan) -> tuple[np.ndarray, np.ndarray, bool]:
    """The kernel's view of a plan: every shard's k-ranges in one [R, 2] array, where
    each shard's start ([S + 1]), and whether any shard has one-wide edge blocks."""
    ranges = np.array([r for sh in p.shards for r in sh.ranges], np.int64).reshape(-1, 2)
    ptr = np.cumsum([0] + [len(sh.ranges) for sh in p.shards]).astype(np.int64)
    ranges.flags.writeable = False
    ptr.flags.writeable = False
    return ranges, ptr, any(sh.gemv_m or sh.gemv_n for sh in p.shards)


class _Edge(NamedTuple):
    """One AVX2 shard's outputs that its nocopy K passes' chains do not give, for the M
    rows of a call."""

    few: np.ndarray
    """Rows of 1-3-row tiles (all their columns: :func:`tfgrad.kernels.matmul.two_sets`)."""
    few_fused: np.ndarray
    """Whether each of ``few`` is fused (a 3-row tile)."""
    fused: np.ndarray
    """Every row's fused flag (for the columns of 8-wide tiles)."""
    runs: np.ndarray
    """[R, 2]: runs of consecutive columns of 8-wide tiles."""
    ranges: np.ndarray
    """[P, 2]: the shard's nocopy K passes."""
    copy: tuple[tuple[int, int, int, int], ...]
    """Rows i0:i1 (of the call), columns c0:c1 run copy-based: chains over ``copy_ranges``."""
    copy_ranges: np.ndarray
    full: np.ndarray
    """[[0, N]]: every column, as one run (for ``few``)."""
    every: bool
    """Every output is in an 8-wide tile (N <= 8): the chains need not be computed."""


def _frozen(*xs: np.ndarray) -> None:
    for x in xs:
        x.flags.writeable = False


def _runs(idx: np.ndarray) -> np.ndarray:
    """[R, 2]: the runs (lo, hi) of consecutive values in ``idx`` (sorted, distinct)."""
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    lo = idx[np.r_[0, cut]] if idx.size else idx
    hi = idx[np.r_[cut - 1, idx.size - 1]] + 1 if idx.size else idx
    return np.stack([lo, hi], 1).astype(np.int64)


@lru_cache(maxsize=64)
def _kinds(rows: int, cols: int, nc: int, mc: int, trans_a: bool
           ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`tfgrad._tf.onednn.avx2_kinds`, once per contraction (not per chunk)."""
    un, um = avx2_kinds(rows, cols, nc, mc, trans_a)
    _frozen(un, um)
    return un, um


@lru_cache(maxsize=256)
def _tiles(p: Plan, M: int, N: int, rows: tuple[int, int] | None
           ) -> tuple[_Edge | None, ...]:
    """Per shard, what the AVX2 kernel computes otherwise than the nocopy chains among
    these M rows (None: nothing): its edge tiles and its copy-based blocks. ``rows``: (the
    first row's index, the rows of the contraction TF runs), row i being row
    (first + i) mod that: a chunk of TF's contraction, or images stacked."""
    first, period = rows or (0, M)
    g = (first + np.arange(M)) % period
    out: list[_Edge | None] = []
    for sh in p.shards:
        if sh.isa != "avx2":
            out.append(None)
            continue
        un_all, um = _kinds(period, N, sh.nc, sh.mc, sh.trans_a)
        un = un_all[g]
        few = np.flatnonzero(un <= 3)
        cols = np.flatnonzero(um == 8)
        copy = tuple((int(i0), int(i1), c0, c1)
                     for r0, r1, c0, c1 in copy_fixes(sh, un_all, um)
                     for i0, i1 in _runs(np.flatnonzero((g >= r0) & (g < r1))))
        if not (few.size or cols.size or copy):
            out.append(None)
            continue
        edge = _Edge(few, un[few] >= 3, un >= 3, _runs(cols),
                     np.array(sh.ranges, np.int64).reshape(-1, 2), copy,
                     np.array(sh.copy_ranges, np.int64).reshape(-1, 2),
                     np.array([[0, N]], np.int64), cols.size == N and not copy)
        _frozen(edge.few, edge.few_fused, edge.fused, edge.runs, edge.ranges,
                edge.copy_ranges, edge.full)
        out.append(edge)
    return tuple(out)


def _edge_tiles(A: np.ndarray, B: np.ndarray, Nb: int, N: int, t: _Edge, c: np.ndarray
                ) -> None:
    """Recompute in c [M, N] what the AVX2 kernel computes otherwise than the nocopy
    chains (:func:`tfgrad._tf.onednn.avx2_tiles` and ``copy_fixes`` are the NumPy model):
    rows of 1-3-row tiles, all columns; columns of 8-wide tiles, all rows; then the
    copy-based blocks, chains over their own K passes."""
    K = 4 * A.shape[1]  # (work: an edge-tile output costs about four of the chains')
    if t.few.size:
        launch(_FAMILY, k.two_sets, t.few.size * N * K, A, B, Nb, t.ranges, t.few,
               t.few_fused, t.full, c, units=t.few.size // 2)
    if t.runs.size:
        cols = int((t.runs[:, 1] - t.runs[:, 0]).sum())
        launch(_FAMILY, k.two_sets, A.shape[0] * cols * K, A, B, Nb, t.ranges,
               np.arange(A.shape[0]), t.fused, t.runs, c, units=A.shape[0] // 2)
    Bm = B.reshape(-1, Nb)
    for i0, i1, c0, c1 in t.copy:
        w = -(-(c1 - c0) // 8) * 8
        Bs = _padded(Bm[:, c0:c1], w).reshape(-1)
        C = np.empty((1, i1 - i0, c1 - c0), F32)
        ptr = np.array([0, len(t.copy_ranges)], np.int64)
        launch(_FAMILY, k.contract, C.size * Bm.shape[0], A[i0:i1], Bs, w, c1 - c0,
               t.copy_ranges, ptr, False, False, C.reshape(-1),
               units=-(-(i1 - i0) // k.ROWS) * -(-w // k.COLS))
        c[i0:i1, c0:c1] = C[0]


def matmul(a: np.ndarray, b: np.ndarray, ta: bool, tb: bool, p: Plan,
           out: np.ndarray | None = None, plus0: bool = True, stream: bool = False,
           rows: tuple[int, int] | None = None) -> np.ndarray:
    """The contraction path (min(M, K, N) > 1) with TF's plan ``p``. With ``out``
    (C-contiguous [M, N] float32) the result goes there: ``0 + C`` when ``plus0``
    (Col2im of a 1x1, stride-1 conv: a zeroed dx plus the contraction, -0 made +0), else
    C itself; ``stream``: ``out`` starts on a 64-byte line and N % 16 == 0, so that it
    may be written with non-temporal stores. ``rows``: where these rows sit in the
    contraction TF runs (:func:`_tiles`; the AVX2 kernel's edge tiles depend on it)."""
    A = a.T if ta else a  # read in place, any strides
    K = A.shape[1]
    M, N = A.shape[0], (b.shape[0] if tb else b.shape[1])
    Nb = -(-N // 8) * 8
    B = _padded(b.T if tb else b, Nb).reshape(-1)
    S = len(p.shards)
    ranges, ptr, edge = _ranges(p)
    # (AVX-512 plans never look: the plan's hash is not free)
    tiles = _tiles(p, M, N, rows) if p.shards[0].isa == "avx2" else (None,) * S
    edge = edge or any(t is not None for t in tiles)
    # straight into out ("+ 0" in the kernel's last add; the edges, plain, rewritten after)
    direct = out is not None and S == 1 and not (edge and plus0)
    if direct:
        C = out.reshape(1, M, N)
        stream = stream and not edge
    elif S == 1 and not edge:  # a large output: written past the caches (no read for
        C, stream = stream_output((1, M, N), F32)  # ownership), when its rows are lines
    else:
        C = np.empty((S, M, N), F32)
        stream = False
    units = S * -(-M // k.ROWS) * -(-Nb // k.COLS)
    # (the kernel sets FTZ / DAZ itself: DAZ reads denormal inputs as 0); not where the
    # AVX2 kernel's edge tiles are every output
    if not all(t is not None and t.every for t in tiles):
        launch(_FAMILY, k.contract, M * N * K, A, B, Nb, N, ranges, ptr, direct and plus0,
               stream, C.reshape(-1), units=units)
    bufs = []
    for s, sh in enumerate(p.shards):
        c = C[s]
        t = tiles[s]
        if t is not None:  # the AVX2 kernel's edge tiles: two accumulator sets
            _edge_tiles(A, B, Nb, N, t, c)
        if sh.gemv_m or sh.gemv_n:  # Eigen's one-wide edge blocks: oneDNN's GEMVs
            with flush_denormals():
                edges(A, B.reshape(K, Nb)[:, :N], sh.blocks, sh.gemv_m, sh.gemv_n, c)
        bufs.append(c.reshape(-1))
    # (4 shards and more add a tail apart: where Eigen's buffer ends, not this piece)
    res = (bufs[0] if S == 1 else
           combine(bufs, combine_tail(M, N, rows) if S >= 4 else None)).reshape(M, N)
    if out is not None and not direct:
        if plus0:
            with flush_denormals():
                np.add(res, F32(0.0), out=out)  # (+0 added: -0 becomes +0)
        else:
            out[...] = res
        return out
    return res
