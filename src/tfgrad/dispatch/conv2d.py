"""Conv2D and its backprops on the compiled kernels: im2col / col2im
(``tfgrad.kernels.conv2d``) around the exact MatMul contraction
(``tfgrad.dispatch.matmul``) with TF's plan for each contraction (``tfgrad.ops.conv2d``).

Patch buffers are bounded as TF bounds its own: the backprops work per chunk of images
(BackpropFilter per TF's shard, whose contraction it is; BackpropInput per chunk of at
most ``_CHUNK`` floats of patches, each row's sum fixed by the plan and the row's place
in TF's contraction, which the AVX2 kernel's edge tiles depend on: ``rows``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._compile import launch
from .._tf.contraction import Plan
from .._tf.conv2d import Geometry, edge_plan, gemv_block
from .._tf.fpenv import flush_denormals
from ..kernels import conv2d as k
from ..kernels import matmul as km
from ..kernels._simd import stream_output
from . import matmul as mm

F32 = np.float32
_FAMILY = "conv2d"
_CHUNK = 1 << 23
_PATCHES = 1 << 21  # floats of Conv2D's patches built at a time (8 MiB)


def _contract(a: np.ndarray, b: np.ndarray, ta: bool, tb: bool, p: Plan,
              rows: tuple[int, int] | None = None) -> np.ndarray:
    """Eigen's tensor contraction on the matmul kernels; its one-row shape (Eigen's
    n = 1: its own GEMV) by the reference, which is O(K N). ``rows``: as
    ``dispatch.matmul``'s (images stacked)."""
    A = a.T if ta else a
    B = b.T if tb else b
    if A.shape[0] == 1:
        return _gemv_rows(A, B)
    return mm.matmul(a, b, ta, tb, edge_plan(p, B.shape[1]), rows=rows)


def _gemv_rows(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Eigen's own GEMV (TF's contraction with n = 1) of each row of A [R, K] with
    B [K, N], in one launch (compiled; tfgrad._tf.conv2d.eigen_gemv is its NumPy model)."""
    Y = np.zeros((A.shape[0], B.shape[1]), F32)
    launch(_FAMILY, km.eigen_gemv, Y.size * A.shape[1], np.ascontiguousarray(A),
           np.ascontiguousarray(B), gemv_block(B), Y, units=A.shape[0])
    return Y


def _one_by_one(geo: Geometry) -> bool:
    """A 1x1 filter at stride 1 without padding: each dx pixel is one row of col."""
    return (geo.KH == geo.KW == geo.sh == geo.sw == 1 and geo.pt == geo.pl == 0
            and (geo.OH, geo.OW) == (geo.H, geo.W))


def _own_patches(geo: Geometry) -> bool:
    """The input is its own patch matrix: a 1x1 stride-1 filter (a row per pixel), or a
    VALID filter the size of the image (a row per image)."""
    whole = ((geo.KH, geo.KW, geo.OH, geo.OW) == (geo.H, geo.W, 1, 1)
             and geo.pt == geo.pl == 0)
    return _one_by_one(geo) or whole


def _cols(x: np.ndarray, geo: Geometry, t0: int = 0, rows: int = -1,
          out: np.ndarray | None = None) -> np.ndarray:
    """im2col of x [n, H, W, C]; with ``rows``, only output rows t0 .. t0 + rows - 1
    (of OW pixels each, across images), into ``out`` if given."""
    if rows < 0:
        rows = x.shape[0] * geo.OH
        if _own_patches(geo) and x.flags.c_contiguous:
            return x.reshape(rows * geo.OW, geo.F)
    cols = np.empty((rows * geo.OW, geo.F), F32) if out is None else out
    launch(_FAMILY, k.im2col, cols.size, np.ascontiguousarray(x), geo.KH, geo.KW, geo.OH,
           geo.OW, geo.sh, geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, t0, cols, units=rows)
    return cols


def forward(x: np.ndarray, f: np.ndarray, geo: Geometry, p: Plan) -> np.ndarray:
    """The contraction of all of the images' patches at once, as TF's; a patch matrix
    above ``_PATCHES`` floats is built and contracted a chunk of output rows at a time
    (TF's Eigen path packs its blocks from the image, never building it). Each row's
    sums depend on the plan and the row's place (the AVX2 kernel's edge tiles: each
    chunk says where its rows sit), and Eigen's one-wide last n-block (TF's last pixel,
    ``gemv_n``) only the last chunk has."""
    W = np.ascontiguousarray(f).reshape(geo.F, geo.O)
    rows = geo.N * geo.OH
    step = max(2, _PATCHES // (geo.OW * geo.F))
    with flush_denormals():
        if step >= rows or _own_patches(geo) and x.flags.c_contiguous:
            out = _contract(_cols(x, geo), W, False, False, p)
            return out.reshape(geo.N, geo.OH, geo.OW, geo.O)
        x = np.ascontiguousarray(x)
        out, stream = stream_output((geo.N * geo.P, geo.O), F32)
        inner = Plan(tuple(dataclasses.replace(sh, gemv_n=False) for sh in p.shards),
                     p.path)
        buf = np.empty((step * geo.OW, geo.F), F32)
        for s in range(0, rows, step):
            e = min(rows, s + step)
            A = _cols(x, geo, s, e - s, buf[:(e - s) * geo.OW])
            mm.matmul(A, W, False, False, edge_plan(p if e == rows else inner, geo.O),
                      out=out[s * geo.OW:e * geo.OW], plus0=False, stream=stream,
                      rows=(s * geo.OW, geo.N * geo.P))
    return out.reshape(geo.N, geo.OH, geo.OW, geo.O)


def backprop_input(f: np.ndarray, g: np.ndarray, geo: Geometry, p: Plan, kind: str
                   ) -> np.ndarray:
    """``kind``: the direct sgemm's kernel ("nocopy", "smalln", "gemv") or "" (Eigen's
    contraction with plan ``p``). A 1x1 stride-1 filter's Col2im (dx = 0 + col) is the
    contraction's last step, written straight into dx."""
    W = np.ascontiguousarray(f).reshape(geo.F, geo.O)
    g = np.ascontiguousarray(g)
    one = _one_by_one(geo) and kind in ("", "nocopy")
    dx = (np.empty if one else np.zeros)((geo.N, geo.H, geo.W, geo.C), F32)
    if geo.P == 1 and kind == "":  # one pixel an image: each image's contraction is
        with flush_denormals():  # Eigen's GEMV (n = 1): every image in one launch
            col = _gemv_rows(g.reshape(geo.N, geo.O), W.T)
            if one:
                dx = np.zeros_like(dx)
            launch(_FAMILY, k.col2im, geo.N * geo.F, col, geo.KH, geo.KW, geo.OH, geo.OW,
                   geo.sh, geo.sw, geo.pt, geo.pl, dx, units=geo.N)
        return dx
    step = max(1, _CHUNK // max(1, geo.P * geo.F))
    if any(sh.gemv_m or sh.gemv_n for sh in p.shards):
        step = 1  # the plan's one-wide edge blocks are per image: one image a contraction
    with flush_denormals():
        for s in range(0, geo.N, step):
            e = min(geo.N, s + step)
            a = g[s:e].reshape((e - s) * geo.P, geo.O)
            if one and a.shape[0] > 1:  # (one row: Eigen's GEMV, below)
                mm.matmul(a, W, False, True, edge_plan(p, geo.F),
                          out=dx[s:e].reshape(a.shape[0], geo.C), rows=(0, geo.P))
                continue
            if kind == "smalln":
                col = np.empty((a.shape[0], geo.F), F32)
                launch(_FAMILY, k.smalln, col.size * geo.O, a, W, col, units=geo.F)
            elif kind == "gemv":  # one pixel per image: oneDNN's gemv_t over all of K = O
                # for each image, in one call (its NumPy model: tfgrad._tf.conv2d.gemv_one)
                col = np.zeros((e - s, geo.F), F32)
                km.gemv_t(W, np.ascontiguousarray(a), col, 0, geo.O)
            else:
                col = _contract(a, W, False, True, p, rows=(0, geo.P))
            if one:
                dx[s:e] = 0.0
            launch(_FAMILY, k.col2im, (e - s) * geo.P * geo.F, np.ascontiguousarray(col),
                   geo.KH, geo.KW, geo.OH, geo.OW, geo.sh, geo.sw, geo.pt, geo.pl, dx[s:e],
                   units=e - s)
    return dx


def backprop_filter(x: np.ndarray, g: np.ndarray, geo: Geometry,
                    shards: list[tuple[int, int, Plan]]) -> np.ndarray:
    """``shards``: TF's shards of images (first, end, plan of that shard's contraction)."""
    x = np.ascontiguousarray(x)
    g = np.ascontiguousarray(g)
    dw = np.zeros((geo.F, geo.O), F32)
    with flush_denormals():
        for s, e, p in shards:
            B = g[s:e].reshape((e - s) * geo.P, geo.O)
            # A^T = im2col(x)^T read in place, transposed (a 1x1 stride-1 filter's im2col
            # is x itself); TF's C += contraction: one float32 add per shard (FTZ)
            dw += _contract(_cols(x[s:e], geo), B, True, False, p)
    return dw
