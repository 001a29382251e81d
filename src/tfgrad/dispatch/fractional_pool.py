"""The fractional-pooling ops on the compiled kernels (``tfgrad.kernels.fractional_pool``):
contiguous inputs, the cells each input index lies in, output buffers (streamed when
large), the kernel for the dtype and the threads. Cells and sequences arrive checked by
``tfgrad.ops.fractional_pool``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compile import kernel_array
from ..kernels import fractional_pool as k
from ..kernels._pool import launch
from ..kernels._simd import STREAM_MIN_BYTES, stream_output

_FAMILY = "fractional_pool"
_Arr = np.ndarray

_STREAM_MIN_BYTES = STREAM_MIN_BYTES
"""Float outputs this big are written with non-temporal stores (they would mostly leave
the caches before use anyway, and skipping the read-for-ownership saves a fifth of the
op's memory traffic), and their inputs prefetched a row cell ahead. (Tests change it.)"""


def philox_blocks(counter: int, key: tuple[int, int], n: int) -> np.ndarray:
    """Compiled twin of ``tfgrad.ops.fractional_pool._philox_blocks``: uint32 [n, 4]."""
    out = np.empty(4 * n, np.uint64)
    m = 0xFFFFFFFF
    lanes = [np.uint64((counter >> (32 * j)) & m) for j in range(4)]
    k.philox(*lanes, np.uint64(key[0]), np.uint64(key[1]), n, out)
    return out.astype(np.uint32).reshape(n, 4)


def _covering(starts: np.ndarray, ends: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """Per index 0..n-1: first and last cell containing it (last < first: none), and per
    cell the index range it owns (the indices whose last covering cell it is; indices
    before the first cell go to cell 0, after the last to the last)."""
    idx = np.arange(n)
    first = np.searchsorted(ends, idx, side="left").astype(np.int64)
    last = (np.searchsorted(starts, idx, side="right") - 1).astype(np.int64)
    # Strictly increasing sequences: an index lies in at most two cells (the kernels
    # rely on it).
    assert np.all(last - first <= 1)
    owner = np.maximum(last, 0)
    cells = np.arange(starts.size)
    own_lo = np.searchsorted(owner, cells, side="left").astype(np.int64)
    own_hi = (np.searchsorted(owner, cells, side="right") - 1).astype(np.int64)
    return first, last, own_lo, own_hi


def _whole_lines(depth: int, dtype: np.dtype) -> bool:
    """Whether a pixel's channels are whole 64-byte lines (whole vectors)."""
    return depth * dtype.itemsize % 64 == 0


def _pool(x: _Arr, rs: _Arr, re: _Arr, cs: _Arr, ce: _Arr, is_max: bool, lowest: Any) -> _Arr:
    x = kernel_array(x)
    shape = (x.shape[0], rs.size, cs.size, x.shape[3])
    counts = np.outer(re - rs + 1, ce - cs + 1).astype(x.dtype)
    tasks = x.shape[0] * rs.size  # (batch, row cell)
    if x.dtype.kind == "f":
        out, stream = stream_output(shape, x.dtype, _STREAM_MIN_BYTES)
        launch(_FAMILY, k.POOL_VEC[is_max, stream], x.size, x, rs, re, cs, ce, lowest, counts,
               out, units=tasks)
    elif is_max:
        out = np.empty(shape, x.dtype)
        launch(_FAMILY, k.max_pool_int, x.size, x, rs, re, cs, ce, lowest, out, units=tasks)
    else:
        out = np.empty(shape, x.dtype)
        launch(_FAMILY, k.avg_pool_int, x.size, x, rs, re, cs, ce, counts, out, units=tasks)
    return out


def max_pool(x: _Arr, rs: _Arr, re: _Arr, cs: _Arr, ce: _Arr, lowest: Any) -> _Arr:
    """The max pooling of x over the cells, each maximum starting at ``lowest`` (T's)."""
    return _pool(x, rs, re, cs, ce, True, lowest)


def avg_pool(x: _Arr, rs: _Arr, re: _Arr, cs: _Arr, ce: _Arr) -> _Arr:
    """The average pooling of x over the cells."""
    return _pool(x, rs, re, cs, ce, False, x.dtype.type(0))


def avg_pool_grad(in_shape: tuple[int, ...], g: _Arr, rs: _Arr, re: _Arr, cs: _Arr,
                  ce: _Arr) -> _Arr:
    """The input gradient of the average pooling over the cells."""
    g = kernel_array(g)
    out = np.empty(in_shape, g.dtype)
    r_first, r_last, own_lo, own_hi = _covering(rs, re, in_shape[1])
    c_first, c_last, _, _ = _covering(cs, ce, in_shape[2])
    # static_cast<T>(double) for ints: in range it truncates, outside x86 gives T's min.
    lo = -float(2 ** (8 * g.dtype.itemsize - 1)) if g.dtype.kind == "i" else 0.0
    launch(_FAMILY, k.AVG_POOL_GRAD[g.dtype.kind == "i"], out.size, g, rs, re, cs, ce, own_lo,
           own_hi, r_first, r_last, c_first, c_last, lo, out, units=g.shape[0] * rs.size)
    return out


def max_pool_grad(x: _Arr, y: _Arr, g: _Arr, rs: _Arr, re: _Arr, cs: _Arr,
                  ce: _Arr) -> _Arr | None:
    """The input gradient, or None when orig_output does not match the replayed maxima."""
    x, y, g = kernel_array(x), kernel_array(y), kernel_array(g)
    r_first, r_last, own_lo, own_hi = _covering(rs, re, x.shape[1])
    zero = g.dtype.type(0)
    cell = int((re - rs).max() + 1) * int((ce - cs).max() + 1) if rs.size and cs.size else 0
    if (x.dtype.kind == "f" and _whole_lines(x.shape[3], x.dtype)
            and cell < 2 ** (np.finfo(x.dtype).nmant + 1)):  # codes exact in T
        c_first, c_last, _, _ = _covering(cs, ce, x.shape[2])
        out, stream = stream_output(x.shape, x.dtype, _STREAM_MIN_BYTES)
        tasks = x.shape[0] * -(-rs.size // k.ROWS_PER_TASK)
        bad = np.zeros(tasks, np.bool_)  # a task whose replayed maxima differ from y
        launch(_FAMILY, k.MAX_GRAD_VEC[stream], x.size, x, y, g, rs, re, cs, ce, own_lo,
               own_hi, r_first, r_last, c_first, c_last, out, bad, units=tasks)
        return None if bad.any() else out
    tasks = x.shape[0] * rs.size
    arg = np.empty(y.shape, np.int32)
    bad = np.zeros(tasks, np.bool_)
    launch(_FAMILY, k.max_pool_argmax, x.size, x, y, rs, re, cs, ce, arg, bad, units=tasks)
    if bad.any():
        return None
    c_first, c_last, _, _ = _covering(cs, ce, x.shape[2])
    out = np.empty(x.shape, x.dtype)
    launch(_FAMILY, k.max_pool_grad, x.size, g, arg, rs, cs, ce, own_lo, own_hi, r_first,
           r_last, c_first, c_last, zero, out, units=tasks)
    return out
