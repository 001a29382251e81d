"""TF's ``Min`` / ``Max`` reductions on float32 (Eigen, AVX2), as tfmot's range quantizers
call them: over every axis (a per-tensor range) and over every axis but the last (per
channel). Without denormals, only a tie between +0 and -0 and a NaN's bits can differ
from NumPy's min / max; which zero or which NaN TF returns follows from Eigen's order
(docs/qat.md):

- TF's reducers propagate NaN (``MinReducer<float, PropagateNaN>``); Eigen's packet op
  ``op(acc, p)`` returns a NaN ``acc``, else ``p`` on a tie (a NaN ``p`` too); its scalar
  op ``op(t, acc)`` returns a NaN ``t``, else a NaN ``acc``, else ``t`` on a tie.
- A full reduction runs in shards (Eigen's cost model on TF's intra-op threads), each one
  with four packet accumulators from 32 values on, the rest of the packets into the
  first, a scalar tail, the lanes combined in the order 0, 4, 2, 6, 1, 5, 3, 7; the shards
  fold as (tail, shard 0, shard 1, ...). Per channel, the channels in whole packets
  accumulate rows as four interleaved sets (from 16 rows on), the others row by row.

The NumPy model here is TF's reference, checked bit for bit against TF live
(tests/test_tf_minmax.py); it runs only where the result is a zero or a NaN. Not
modelled: denormal inputs, which TF flushes on some of these paths and not on others
(its min of [1e-40, 1] is +0, of 40 twos then -1e-40 is -1e-40; docs/qat.md).
"""

from __future__ import annotations

import numpy as np

from .._config import tf_intra_op_threads
from .eigen import _LOAD_CYCLES, num_threads, shards

_F32 = np.float32
_LANES = (0, 4, 2, 6, 1, 5, 3, 7)  # predux's leaf order
_COST = 4 * _LOAD_CYCLES + 10 / 8  # a float32 load and MinReducer's cost, per lane


def _init(is_max: bool) -> np.float32:
    return _F32(-np.inf if is_max else np.inf)


def _pick(v: np.ndarray, is_max: bool, nan_first: bool) -> np.float32:
    """A fold of ``v`` in order: its first (or last) NaN, else its last extreme value."""
    if v.size == 0:
        return _init(is_max)
    nan = np.flatnonzero(np.isnan(v))
    if nan.size:
        return v[nan[0] if nan_first else nan[-1]]
    return v[np.flatnonzero(v == (v.max() if is_max else v.min()))[-1]]


def _scalar(t: np.float32, acc: np.float32, is_max: bool) -> np.float32:
    """Eigen's scalar ``op(t, acc)``: a NaN t, else a NaN acc, else t on a tie."""
    if np.isnan(t):
        return t
    if np.isnan(acc):
        return acc
    if is_max:
        return acc if t < acc else t
    return acc if acc < t else t


def _shard(x: np.ndarray, is_max: bool) -> np.float32:
    """``InnerMostDimReducer`` on one shard (lanes counted from its first value)."""
    n = x.size
    n32, n8 = (n // 32) * 32, (n // 8) * 8
    vector = _init(is_max)
    if n8:
        order = np.concatenate([np.concatenate([np.arange(8 * k + lane, n32, 32)
                                                for k in range(4)]
                                               + [np.arange(n32 + lane, n8, 8)])
                                for lane in _LANES])
        vector = _pick(x[order], is_max, nan_first=True)
    return _scalar(_pick(x[n8:], is_max, nan_first=False), vector, is_max)


def reduce_all(x: np.ndarray, is_max: bool, threads: int | None = None) -> np.float32:
    """TF's Min (Max) of float32 ``x`` over all its axes, on ``threads`` TF intra-op
    threads (default: the count TF would use here)."""
    v = np.ascontiguousarray(x, _F32).reshape(-1)
    if v.size == 0:  # (the reducer's initial value: +inf for Min, -inf for Max)
        return _init(is_max)
    fast = v.max() if is_max else v.min()
    if fast != 0 and not np.isnan(fast):
        return _F32(fast)
    count = num_threads(v.size, _COST, threads or tf_intra_op_threads())
    blocks, rest = shards(v.size, count)
    if count <= 1:
        return _shard(v, is_max)
    acc = _shard(v[rest[0]:], is_max) if rest else _init(is_max)
    for first, m in blocks:
        acc = _scalar(_shard(v[first:first + m], is_max), acc, is_max)
    return acc


def reduce_rows(x: np.ndarray, is_max: bool) -> np.ndarray:
    """TF's Min (Max) of a float32 [R, C] over axis 0 (any thread count)."""
    r, c = x.shape
    x = np.asarray(x, _F32)
    if r == 0:  # (no rows: the reducer's initial value per channel)
        return np.full(c, _init(is_max), _F32)
    out = x.max(axis=0) if is_max else x.min(axis=0)
    redo = np.flatnonzero((out == 0) | np.isnan(out))
    if redo.size == 0:
        return out.astype(_F32, copy=True)
    r4 = (r // 4) * 4
    order = (np.concatenate([np.arange(k, r4, 4) for k in range(4)] + [np.arange(r4, r)])
             if r >= 16 else np.arange(r))
    out = out.astype(_F32, copy=True)
    for ch in redo:
        packet = ch < (c // 8) * 8
        out[ch] = _pick(x[order, ch] if packet else x[:, ch], is_max, nan_first=packet)
    return out


def numpy_batch_range(x: np.ndarray, per_axis: bool) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's min / max over the same axes as :func:`batch_range` (its values; not TF's
    zero or NaN where the order decides). A 1-D input per axis comes back unreduced."""
    if per_axis:
        if x.ndim < 2:
            return x, x
        r = x.reshape(-1, x.shape[-1])
        return r.min(axis=0, initial=np.inf), r.max(axis=0, initial=-np.inf)
    return np.asarray(x.min(initial=np.inf)), np.asarray(x.max(initial=-np.inf))


def batch_range(x: np.ndarray, per_axis: bool, threads: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """tfmot's batch range of ``x``: ``reduce_min`` / ``reduce_max`` over every axis, or
    (``per_axis``) every axis but the last, as TF computes them (a [C] pair, or 0-d)."""
    x = np.asarray(x, _F32)
    if not per_axis or x.ndim < 2:
        if per_axis:  # (tfmot leaves a 1-D input's per-axis range unreduced)
            return x.copy(), x.copy()
        return (np.asarray(reduce_all(x, False, threads)),
                np.asarray(reduce_all(x, True, threads)))
    c = x.shape[-1]
    rows = x.reshape(-1, c)
    if rows.shape[0] == 1:  # (TF's Simplify: nothing left to reduce)
        return rows[0].copy(), rows[0].copy()
    if c == 1:  # (the size-1 channel joins the reduced run: a full reduction)
        return (np.asarray([reduce_all(rows, False, threads)]),
                np.asarray([reduce_all(rows, True, threads)]))
    return reduce_rows(rows, False), reduce_rows(rows, True)
