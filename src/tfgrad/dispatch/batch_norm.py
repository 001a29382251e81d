"""The batch-norm ops on the compiled kernels (``tfgrad.kernels.batch_norm``,
``batch_norm_grad``): x viewed as flat float32 rows, the kernel for the layout, Eigen's
rsqrt of the variance, TF's thread split of the gradient sums, the blocks, the threads.

The caller (``tfgrad.ops.batch_norm``) sets TF's FTZ / DAZ and silences NumPy's inf / NaN
warnings (results here, as in TF).
"""

from __future__ import annotations

import math

import numpy as np

from .._compile import Twins, kernel_array, launch, num_threads
from .._config import tf_intra_op_threads
from .._tf.eigen import redux_plan
from .._tf.rsqrt import GRAD_DX_TILE, GRAD_SCALE_TILE, eigen_rsqrt
from ..kernels import batch_norm as kf
from ..kernels import batch_norm_grad as kg
from ..kernels import batch_norm_vectors as kv
from ..kernels._simd import STREAM_MIN_BYTES, aligned_empty
from ..kernels.batch_norm_common import ROWS_VEC, SLOT, VEC_BLOCK, L

_F32 = np.float32
_FAMILY = "batch_norm"


def _run(kernel: Twins, x: np.ndarray, units: int, *args: object) -> None:
    """``kernel(*args)`` over x's elements in ``units`` independent parts."""
    launch(_FAMILY, kernel, x.size, *args, units=units)


def _layout(x: np.ndarray, channel_last: bool) -> tuple[int, int, int]:
    """(N, C, S) with rows j = n*S + s; NHWC is N = R rows of S = 1."""
    if channel_last:
        c = x.shape[-1]
        return (x.size // c if c else 0), c, 1
    n, c = x.shape[0], x.shape[1]
    return n, c, math.prod(x.shape[2:])


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


def _rows_vec(grad: bool, x: np.ndarray, *args: object) -> None:
    """The vector elementwise pass; args end with the output, whose alignment and size
    decide streaming."""
    _run(ROWS_VEC[grad, _streams(args[-1])], x, 2, *args)  # type: ignore[arg-type]


def forward(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, mean: np.ndarray,
            variance: np.ndarray, eps: float, factor: float, channel_last: bool,
            is_training: bool) -> tuple[np.ndarray, ...]:
    """FusedBatchNorm on a non-empty x: (y, batch_mean, batch_variance, saved mean,
    saved variance)."""
    N, C, S = _layout(x, channel_last)
    R = N * S
    xf = _f32_flat(x)
    vec = channel_last and C % L == 0
    yf = aligned_empty((xf.size,), np.dtype(_F32))
    if is_training:  # the batch's statistics, the kernels' output (slack: whole vectors)
        mv = np.zeros((2, C + 4 * L), _F32)
        m, v = mv[0, :C], mv[1, :C]
    else:
        m, v = _vec(mean), _vec(variance)
    args = (_read(scale), _read(offset), m, v, _F32(eps), bool(is_training), yf)
    if vec:
        if is_training:
            cb = _channel_block(C, VEC_BLOCK)
            _run(kf.stats_nhwc_vec, xf, -(-C // cb), xf, R, C, cb, mv[0], mv[1])
        pads = np.zeros((3, C + 4 * L), _F32)  # mean, scale factor, offset: zero slack
        kv.fwd_vectors(m, v, args[0], args[1], _F32(eps), pads)
        _rows_vec(False, xf, xf, xf, R, C, pads[0], pads[1], pads[2], pads[0], yf)
    elif channel_last:
        cb = _channel_block(C)
        if is_training:
            _run(kf.stats_nhwc, xf, -(-C // cb), xf, R, C, cb, m, v)
        pads = np.empty((3, C), _F32)  # mean, scale factor, offset
        kv.fwd_vectors(m, v, args[0], args[1], _F32(eps), pads)
        _run(kf.affine_rows, xf, R, xf, R, C, pads[0], pads[1], pads[2], yf)
    else:
        _run(kf.fwd_nchw, xf, -(-C // 8), xf, N, C, S, *args, _streams(yf))
    y = yf.reshape(x.shape)
    if x.dtype != _F32:
        y = y.astype(x.dtype)  # float16 overflows to inf, as TF's cast
    if not is_training:
        return y, m, v, m, v
    run = np.empty((2, C), _F32)  # (Bessel's correction, the running average)
    kv.running_stats(m, v, _read(mean), _read(variance), factor, R, run)
    return y, run[0], run[1], m, v


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


def grad(dy: np.ndarray, x: np.ndarray, scale: np.ndarray, mean: np.ndarray, var: np.ndarray,
         eps: float, channel_last: bool, is_training: bool,
         plan: tuple[int, bool, bool]) -> tuple[np.ndarray, ...]:
    """FusedBatchNormGrad on a non-empty x: (x_backprop, scale_backprop, offset_backprop),
    the sums split as ``plan`` (``grad_plan``) says."""
    N, C, S = _layout(x, channel_last)
    R = N * S
    row_block, zb, za = plan[0], bool(plan[1]), bool(plan[2])
    dyf = _f32_flat(dy)
    xf = _f32_flat(x)
    dxf = aligned_empty((xf.size,), np.dtype(_F32))
    sb = np.empty(C, _F32)
    ob = np.empty(C, _F32)
    if not channel_last:
        a = _read(var) + _F32(eps)
        if is_training:
            c0s = eigen_rsqrt(a, GRAD_SCALE_TILE)
            c0d = eigen_rsqrt(a, GRAD_DX_TILE)
        else:
            c0s = c0d = eigen_rsqrt(a)  # evaluated once, as a [C] vector
        _run(kg.grad_nchw, xf, -(-C // 8), dyf, xf, N, C, S, row_block, zb, za, _read(scale),
             _read(mean), c0s, c0d, bool(is_training), dxf, sb, ob, _streams(dxf))
    else:  # NHWC: the [C] arithmetic around the passes compiled (kernels.batch_norm_vectors)
        vec = C % L == 0
        slack = 4 * L if vec else 0  # (the vector kernels load whole vectors: zeros)
        pre = np.zeros((2, C + slack), _F32)  # mean, the sums' factor
        c0d = np.empty(C, _F32)
        whole = max(C, 1)  # (frozen statistics: one rsqrt of the whole vector)
        tiles = (GRAD_SCALE_TILE, GRAD_DX_TILE) if is_training else (whole, whole)
        sc = _read(scale)
        kv.grad_prologue(_read(var), _read(mean), sc, _F32(eps), bool(is_training), *tiles,
                         pre, c0d)
        if vec:
            cb = _channel_block(C, VEC_BLOCK)
            sums = np.empty((3, C + slack), _F32)
            # with frozen statistics dx = dy * (rsqrt(var + eps) * scale) in this pass
            _run(kg.grad_sums_nhwc_vec, xf, -(-C // cb), dyf, xf, R, C, cb, row_block, zb,
                 za, pre[0], pre[1], bool(is_training), sums.reshape(-1), dxf,
                 not is_training and _streams(dxf))
        else:
            cb = _channel_block(C)
            sums = np.empty((3, C), _F32)
            _run(kg.grad_sums_nhwc, xf, -(-C // cb), dyf, xf, R, C, cb, row_block, zb, za,
                 pre[0], pre[1] if is_training else c0d, bool(is_training), sums)
        if is_training:
            post = np.zeros((3, C + slack), _F32)  # coef1, coef2, the mean of dy
            kv.grad_epilogue(sums, c0d, sc, R, sb, ob, post)
            if vec:
                _rows_vec(True, xf, dyf, xf, R, C, post[0], post[1], post[2], pre[0], dxf)
            else:
                _run(kg.dx_rows, xf, R, dyf, xf, R, C, post[0], post[1], post[2], pre[0],
                     True, dxf)
        else:
            sb[:] = sums[2, :C] * c0d
            ob[:] = sums[1, :C]
            if not vec:  # (the vector sums wrote dx already)
                f1 = c0d * sc
                _run(kg.dx_rows, xf, R, dyf, xf, R, C, f1, f1, f1, pre[0], False, dxf)
    dx = dxf.reshape(x.shape)
    if x.dtype != _F32:
        dx = dx.astype(x.dtype)
    return dx, sb, ob
