"""The batch-norm ops on the compiled kernels (``tfgrad.kernels.batch_norm``,
``batch_norm_grad``): x viewed as flat float32 rows, the kernel for the layout, Eigen's
rsqrt of the variance, TF's thread split of the gradient sums, the blocks, the threads.

The caller (``tfgrad.ops.batch_norm``) sets TF's FTZ / DAZ and silences NumPy's inf / NaN
warnings (results here, as in TF).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._compile import kernel_array, launch, launcher, num_threads
from .._config import tf_intra_op_threads
from .._tf.eigen import redux_plan
from .._tf.rsqrt import GRAD_DX_TILE, GRAD_SCALE_TILE, eigen_rsqrt
from ..kernels import batch_norm as kf
from ..kernels import batch_norm_grad as kg
from ..kernels import batch_norm_vectors as kv
from ..kernels._simd import STREAM_MIN_BYTES, aligned_empty
from ..kernels.batch_norm_common import ROWS_VEC, SLOT, VEC_BLOCK, L

_F32 = np.float32
_F32_DTYPE = np.dtype(_F32)
_FAMILY = "batch_norm"


def _layout(x: np.ndarray, channel_last: bool) -> tuple[int, int, int]:
    """(N, C, S) with rows j = n*S + s; NHWC is N = R rows of S = 1."""
    return _layout_of(x.shape, channel_last)


def _layout_of(shape: tuple[int, ...], channel_last: bool) -> tuple[int, int, int]:
    if channel_last:
        c = shape[-1]
        return (math.prod(shape) // c if c else 0), c, 1
    return shape[0], shape[1], math.prod(shape[2:])


def _f32_flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=_F32).reshape(-1)


def _vec(a: np.ndarray) -> np.ndarray:
    """A fresh writable float32 copy of a [C] vector: one compiled specialization."""
    return np.array(a, _F32).reshape(-1)


def _read(a: np.ndarray) -> np.ndarray:
    """A [C] vector (the ops check it is one) the kernels only read: as given where it is
    their type already."""
    return kernel_array(a, _F32)


def _streams(out: np.ndarray) -> bool:
    """Whether ``out`` (from aligned_empty) is written with non-temporal stores."""
    return out.nbytes >= STREAM_MIN_BYTES and out.ctypes.data % 64 == 0


def _channel_block(C: int, most: int = SLOT) -> int:
    """Channels per NHWC column-sum block: as wide as possible (whole rows stream from
    memory), narrow enough to give every thread a block. The sums do not depend on it."""
    cb = -(-C // max(num_threads(), 1))
    return int(min(most, max(16, -(-cb // 16) * 16)))


def forward_runner(shape: tuple[int, ...], dtype: np.dtype, eps: float, factor: float,
                 channel_last: bool, is_training: bool) -> Callable[..., tuple]:
    """FusedBatchNorm on a non-empty x of ``shape`` and ``dtype``, its layout, kernels and
    launches worked out once (an op's signature cache keeps it): ``run(x, scale, offset,
    mean, variance)`` (float32 vectors) -> (y, batch_mean, batch_variance, saved mean,
    saved variance)."""
    N, C, S = _layout_of(shape, channel_last)
    R = N * S
    size = R * C
    e = _F32(eps)
    training = bool(is_training)
    cast = np.dtype(dtype) != _F32
    blocks = _Blocks(C, VEC_BLOCK if channel_last and C % L == 0 else SLOT)
    if channel_last and C % L == 0:
        stats = kf.stats_nhwc_vec
        rows = {s: launcher(_FAMILY, ROWS_VEC[False, s], size) for s in (False, True)}
    elif channel_last:
        stats = kf.stats_nhwc
        affine = launcher(_FAMILY, kf.affine_rows, size, R)
    else:
        fwd = launcher(_FAMILY, kf.fwd_nchw, size, -(-C // 8))

    def run(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, mean: np.ndarray,
            variance: np.ndarray) -> tuple[np.ndarray, ...]:
        xf = _f32_flat(x)
        yf = aligned_empty((size,), _F32_DTYPE)
        if training:  # the batch's statistics, the kernels' output (slack: whole vectors)
            mv = np.zeros((2, C + 4 * L), _F32)
            m, v = mv[0, :C], mv[1, :C]
        else:
            m, v = _vec(mean), _vec(variance)
        sc, of = _read(scale), _read(offset)
        if not channel_last:
            fwd(xf, N, C, S, sc, of, m, v, e, training, yf, _streams(yf))
        elif C % L == 0:
            if training:
                cb, units = blocks.get()
                launch(_FAMILY, stats, size, xf, R, C, cb, mv[0], mv[1], units=units)
            pads = np.zeros((3, C + 4 * L), _F32)  # mean, scale factor, offset: zero slack
            kv.fwd_vectors(m, v, sc, of, e, pads)
            rows[_streams(yf)](xf, xf, R, C, pads[0], pads[1], pads[2], pads[0], yf)
        else:
            if training:
                cb, units = blocks.get()
                launch(_FAMILY, stats, size, xf, R, C, cb, m, v, units=units)
            pads = np.empty((3, C), _F32)  # mean, scale factor, offset
            kv.fwd_vectors(m, v, sc, of, e, pads)
            affine(xf, R, C, pads[0], pads[1], pads[2], yf)
        y = yf.reshape(shape)
        if cast:
            y = y.astype(dtype)  # float16 overflows to inf, as TF's cast
        if not training:
            return y, m, v, m, v
        out = np.empty((2, C), _F32)  # (Bessel's correction, the running average)
        kv.running_stats(m, v, _read(mean), _read(variance), factor, R, out)
        return y, out[0], out[1], m, v

    return run


class _Blocks:
    """``_channel_block``'s (block, blocks) for C channels, kept per thread count."""

    __slots__ = ("C", "most", "by_threads")

    def __init__(self, C: int, most: int) -> None:
        self.C, self.most, self.by_threads = C, most, {}

    def get(self) -> tuple[int, int]:
        t = num_threads()
        found = self.by_threads.get(t)
        if found is None:
            cb = _channel_block(self.C, self.most)
            found = self.by_threads[t] = (cb, -(-self.C // cb))
        return found


def grad_plan(x: np.ndarray, channel_last: bool) -> tuple[int, bool, bool] | None:
    """TF's thread split of the gradient's sums as the kernels run it (``row_block``,
    ``zero_between``, ``zero_after``: ``tfgrad._tf.eigen.redux_plan``), or None where the
    kernels do not reproduce TF's order: a single row (TF passes it through), or a
    half-precision y_backprop, whose sum TF splits differently from the float32 sums
    (only when emulating several TF threads)."""
    n, c, s = _layout(x, channel_last)
    threads = tf_intra_op_threads()
    plan = redux_plan(n * s, c, x.dtype.itemsize, threads)
    if n * s == 1 or plan != redux_plan(n * s, c, 4, threads):
        return None
    return plan


def grad_runner(shape: tuple[int, ...], dtype: np.dtype, eps: float, channel_last: bool,
                is_training: bool) -> Callable[..., tuple]:
    """FusedBatchNormGrad on a non-empty x of ``shape`` and ``dtype``, its layout, kernels
    and launches worked out once: ``run(dy, x, scale, mean, var, plan)`` (float32
    vectors) -> (x_backprop, scale_backprop, offset_backprop), the sums split as ``plan``
    (:func:`grad_plan`) says."""
    N, C, S = _layout_of(shape, channel_last)
    R = N * S
    size = R * C
    e = _F32(eps)
    training = bool(is_training)
    cast = np.dtype(dtype) != _F32
    vec = C % L == 0
    slack = 4 * L if vec else 0  # (the vector kernels load whole vectors: zeros)
    blocks = _Blocks(C, VEC_BLOCK if vec else SLOT)
    # (frozen statistics: one rsqrt of the whole vector)
    tiles = (GRAD_SCALE_TILE, GRAD_DX_TILE) if training else (max(C, 1), max(C, 1))
    if not channel_last:
        nchw = launcher(_FAMILY, kg.grad_nchw, size, -(-C // 8))
    elif vec:
        sums_kernel = kg.grad_sums_nhwc_vec
        rows = {s: launcher(_FAMILY, ROWS_VEC[True, s], size) for s in (False, True)}
    else:
        sums_kernel = kg.grad_sums_nhwc
        dx_rows = launcher(_FAMILY, kg.dx_rows, size, R)

    def run(dy: np.ndarray, x: np.ndarray, scale: np.ndarray, mean: np.ndarray,
            var: np.ndarray, plan: tuple[int, bool, bool]) -> tuple[np.ndarray, ...]:
        row_block, zb, za = plan[0], bool(plan[1]), bool(plan[2])
        dyf = _f32_flat(dy)
        xf = _f32_flat(x)
        dxf = aligned_empty((size,), _F32_DTYPE)
        sb = np.empty(C, _F32)
        ob = np.empty(C, _F32)
        if not channel_last:
            a = _read(var) + e
            if training:
                c0s = eigen_rsqrt(a, GRAD_SCALE_TILE)
                c0d = eigen_rsqrt(a, GRAD_DX_TILE)
            else:
                c0s = c0d = eigen_rsqrt(a)  # evaluated once, as a [C] vector
            nchw(dyf, xf, N, C, S, row_block, zb, za, _read(scale), _read(mean), c0s, c0d,
                 training, dxf, sb, ob, _streams(dxf))
        else:  # NHWC: the [C] arithmetic around the passes compiled (kernels.batch_norm_vectors)
            pre = np.zeros((2, C + slack), _F32)  # mean, the sums' factor
            c0d = np.empty(C, _F32)
            sc = _read(scale)
            kv.grad_prologue(_read(var), _read(mean), sc, e, training, *tiles, pre, c0d)
            cb, units = blocks.get()
            if vec:
                sums = np.empty((3, C + slack), _F32)
                # with frozen statistics dx = dy * (rsqrt(var + eps) * scale) in this pass
                launch(_FAMILY, sums_kernel, size, dyf, xf, R, C, cb, row_block, zb, za,
                       pre[0], pre[1], training, sums.reshape(-1), dxf,
                       not training and _streams(dxf), units=units)
            else:
                sums = np.empty((3, C), _F32)
                launch(_FAMILY, sums_kernel, size, dyf, xf, R, C, cb, row_block, zb, za,
                       pre[0], pre[1] if training else c0d, training, sums, units=units)
            if training:
                post = np.zeros((3, C + slack), _F32)  # coef1, coef2, the mean of dy
                kv.grad_epilogue(sums, c0d, sc, R, sb, ob, post)
                if vec:
                    rows[_streams(dxf)](dyf, xf, R, C, post[0], post[1], post[2], pre[0],
                                        dxf)
                else:
                    dx_rows(dyf, xf, R, C, post[0], post[1], post[2], pre[0], True, dxf)
            else:
                sb[:] = sums[2, :C] * c0d
                ob[:] = sums[1, :C]
                if not vec:  # (the vector sums wrote dx already)
                    f1 = c0d * sc
                    dx_rows(dyf, xf, R, C, f1, f1, f1, pre[0], False, dxf)
        dx = dxf.reshape(shape)
        if cast:
            dx = dx.astype(dtype)
        return dx, sb, ob

    return run
