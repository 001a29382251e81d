"""oneDNN's sgemm arithmetic on NumPy arrays (float32 under TF's FTZ / DAZ): the exact FMA,
the two GEMV kernels oneDNN runs instead of its nocopy kernel for a block with one row
(``gemv_t``) or one column (``gemv_n``), and the edge tiles of its AVX2 nocopy kernel
(:func:`avx2_tiles`). Shared by the NumPy reference and the dispatch (which runs the
nocopy blocks compiled and these edges here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .fpenv import flushed

if TYPE_CHECKING:
    from .contraction import Shard

F32 = np.float32
F64 = np.float64


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fma(a, b, c) with one rounding (as ``vfmadd231ps``), the result flushed
    (FTZ; callers flush the inputs, DAZ). a*b is exact in float64; the float64 sum
    s = p + c is made round-to-odd (TwoSum's error term moves s off an even last bit
    towards the exact sum), after which rounding to float32 is the one correct rounding."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.asarray(a, F64) * np.asarray(b, F64)
        c64 = np.asarray(c, F64)
        s = p + c64
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)
        even = (s.view(np.int64) & 1) == 0
        nudge = (e != 0) & even & np.isfinite(s)
        s = np.where(nudge, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
        return flushed(s.astype(F32))


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 a + b, flushed."""
    with np.errstate(invalid="ignore", over="ignore"):
        return flushed(np.add(a, b, dtype=F32))


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 a * b, flushed."""
    with np.errstate(invalid="ignore", over="ignore"):
        return flushed(np.multiply(a, b, dtype=F32))


def _hsum8(v: np.ndarray) -> np.ndarray:
    """gemv_t's horizontal sum of 8 lanes (last axis): ((l0+l1)+(l4+l5)) + ((l2+l3)+(l6+l7))."""
    return add(add(add(v[..., 0], v[..., 1]), add(v[..., 4], v[..., 5])),
               add(add(v[..., 2], v[..., 3]), add(v[..., 6], v[..., 7])))


def gemv_t(X: np.ndarray, w: np.ndarray, y: np.ndarray, s: int, e: int) -> np.ndarray:
    """oneDNN's ``gemv_t`` over k in [s, e): y[r] += sum_k X[r, k] w[k] (X [R, K], w [K]):
    8 lanes, lane l a FMA chain from 0 over the k = l (mod 8) of the first 16*floor(K/16),
    their horizontal sum added to y; the rest in chunks of 8, 4, 2, 1, each products
    summed as the lanes are, then added."""
    K = e - s
    k16 = s + K - K % 16
    acc = np.zeros(X.shape[:1] + (8,), F32)
    for j in range(s, k16, 8):
        acc = fma(X[:, j:j + 8], w[None, j:j + 8], acc)
    if k16 > s:
        y = add(y, _hsum8(acc))
    j = k16
    for width in (8, 4, 2, 1):
        if e - j >= width:
            p = fma(X[:, j:j + width], w[None, j:j + width], np.zeros((1, width), F32))
            if width == 8:
                r = _hsum8(p)
            elif width == 4:
                r = add(add(p[:, 0], p[:, 1]), add(p[:, 2], p[:, 3]))
            elif width == 2:
                r = add(p[:, 0], p[:, 1])
            else:
                r = p[:, 0]
            y = add(y, r)
            j += width
    return y


def gemv_n(X: np.ndarray, w: np.ndarray, y: np.ndarray, s: int, e: int) -> np.ndarray:
    """oneDNN's ``gemv_n`` over k in [s, e): y[r] = fma(X[r, k], w[k], y[r]) in k order,
    straight into y."""
    for k in range(s, e):
        y = fma(X[:, k], w[k], y)
    return y


def edges(A: np.ndarray, B: np.ndarray, blocks: tuple[tuple[int, int], ...], one_row: bool,
          one_col: bool, C: np.ndarray) -> None:
    """Recompute, in C [M, N] (one shard's sum of A [M, K] x B [K, N] over ``blocks``),
    the outputs of Eigen's one-wide edge blocks: TF's last row (``one_col``: oneDNN
    N = 1, gemv_n; it has the corner) and last column (``one_row``: M = 1, gemv_t), each
    from zero over the blocks."""
    M, N = C.shape
    if one_row:
        y = np.zeros(M, F32)
        for s, e in blocks:
            y = gemv_t(A, B[:, N - 1], y, s, e)
        C[:, N - 1] = y
    if one_col:
        y = np.zeros(N, F32)
        for s, e in blocks:
            y = gemv_n(B.T, A[M - 1], y, s, e)
        C[M - 1, :] = y


# --------------------------------------------------------------------------------------
# The AVX2 nocopy kernel's edge tiles (jit_avx_gemm_f32.cpp)
# --------------------------------------------------------------------------------------
def nocopy_sizes(n: int, b: int, over: int) -> list[int]:
    """How ``sgemm_nocopy_driver`` cuts one dimension of a call: while 2 b or more remain,
    b; else more than ``over`` in two halves (ceil first); else the rest."""
    out = []
    while n > 0:
        size = b if n >= 2 * b else (n + 1) // 2 if n > over else n
        out.append(size)
        n -= size
    return out


def avx2_kinds(rows: int, cols: int, nc: int, mc: int, trans_a: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """Which of the AVX2 kernel's tiles each output sits in. Each call (Eigen's block of
    ``mc`` TF columns x ``nc`` TF rows; 0: all) is cut by the driver (columns in 4032s,
    rows in 48s, 96s with A transposed), each piece into tiles of 16 columns x 6 rows.
    Returns ``un`` per TF row (6, or the rows of a piece's last partial tile, 1-5) and
    ``um`` per TF column (16; 8 for the last 1-8 columns of a piece, which run the 8-wide
    kernel)."""
    un = np.full(rows, 6, np.int8)
    bn = 96 if trans_a else 48
    for s, size in _pieces(rows, nc, bn, bn + bn // 2):
        if size % 6:
            un[s + size - size % 6:s + size] = size % 6
    um = np.full(cols, 16, np.int8)
    for s, size in _pieces(cols, mc, 4032, 4032 + 2016):
        if 1 <= size % 16 <= 8:
            um[s + size - size % 16:s + size] = 8
    return un, um


def _pieces(total: int, block: int, b: int, over: int) -> list[tuple[int, int]]:
    """(start, size) of the driver's pieces of ``total``, cut in Eigen's blocks of
    ``block`` (0: one), each cut by :func:`nocopy_sizes`."""
    out = []
    for j0 in range(0, total, block or total):
        s = j0
        for size in nocopy_sizes(min(total, j0 + (block or total)) - j0, b, over):
            out.append((s, size))
            s += size
    return out


def two_sets(A: np.ndarray, B: np.ndarray, ranges: tuple[tuple[int, int], ...],
             fused: np.ndarray) -> np.ndarray:
    """The AVX2 kernel's edge-tile sum of A [R, K] x B [K, C] over ``ranges`` (its K
    passes: the first pass's sum stored as it is, each later one added to the running
    result, so that a first pass flushed to -0 stays -0, as TF gives it): per pass two
    accumulators from +0, one over the even, one over the odd steps of the pass's whole
    pairs, added; an odd pass's last step into their sum. A step is an FMA where
    ``fused`` [R] (tiles of 3 rows or more), else a product then a sum (1 and 2 rows:
    ``useFma = false``)."""
    f = fused[:, None]

    def step(acc: np.ndarray, k: int) -> np.ndarray:
        a, b = A[:, k:k + 1], B[k:k + 1, :]
        return np.where(f, fma(a, b, acc), add(acc, mul(a, b)))

    c = np.zeros((A.shape[0], B.shape[1]), F32)
    for p, (s, e) in enumerate(ranges):
        even = np.zeros_like(c)
        odd = np.zeros_like(c)
        for k in range(s, e - (e - s) % 2, 2):
            even = step(even, k)
            odd = step(odd, k + 1)
        acc = add(even, odd)
        if (e - s) % 2:
            acc = step(acc, e - 1)
        c = acc if p == 0 else add(c, acc)
    return c


def avx2_tiles(A: np.ndarray, B: np.ndarray, ranges: tuple[tuple[int, int], ...],
               un: np.ndarray, um: np.ndarray, C: np.ndarray) -> None:
    """Recompute in C [M, N] (A [M, K] x B [K, N] over ``ranges``) the outputs that the
    AVX2 kernel sums with two accumulator sets (:func:`two_sets`): those of the 8-wide
    column tiles (``um == 8``) and of row tiles of 1-3 rows (``un <= 3``); the others
    (16 x 4-6 tiles) are one FMA chain a pass, as on AVX-512."""
    rows = np.flatnonzero(un <= 3)
    cols = np.flatnonzero(um == 8)
    if rows.size:
        C[rows, :] = two_sets(A[rows], B, ranges, un[rows] >= 3)
    if cols.size:
        C[:, cols] = two_sets(A, B[:, cols], ranges, un >= 3)


def copy_fixes(sh: Shard, un: np.ndarray, um: np.ndarray
               ) -> list[tuple[int, int, int, int]]:
    """The copy-based blocks of an AVX2 shard (TF's rows r0:r1, columns c0:c1, in the
    shard's contraction) whose outputs the nocopy model (its K passes, then
    :func:`avx2_tiles`) does not give: all of them where the copy-based K passes differ,
    else those holding edge-tile outputs."""
    if tuple(sh.copy_ranges) != tuple(sh.ranges):
        return list(sh.copy)
    return [(r0, r1, c0, c1) for r0, r1, c0, c1 in sh.copy
            if (un[r0:r1] <= 3).any() or (um[c0:c1] == 8).any()]
