"""Sum / Mean on the compiled kernels (``tfgrad.kernels.reduction``): the collapsed
shapes of the plan (``tfgrad.ops.reduction.Plan``), the full reduction's shards, which
outputs Eigen evaluates as packets."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from .._tf.eigen import shards
from ..kernels import reduction as k
from ..kernels._pool import launch, serial

F32 = np.float32
_FAMILY = "reduction"
_FLT_MIN = F32(2.0**-126)
_STREAM_BYTES = 2 << 20
"""An outer / middle reduction whose tasks (512 columns) read more than this runs row by
row (``kernels.reduction.lane_sums_rows``: one sequential stream, which the prefetchers
follow from memory; [16,56,56,128] over [0,1,2], 25 MB: 0.7 ms against 1.4 ms in column
blocks); smaller ones in register blocks of 64 columns (``lane_sums``: the global average
pool [32,7,7,1280], 100 KB a task: 0.12 ms against 0.37 ms row by row)."""


def _ftz(v: F32) -> F32:
    return v if abs(v) >= _FLT_MIN else F32(v * F32(0.0))


@lru_cache(maxsize=128)
def _packets(a: int, c: int) -> np.ndarray:
    """Per output of [a, c] (a middle / outer reduction): whether Eigen's executor
    evaluates it in a packet that InnerMostDimPreserver computes (its packet starts at a
    multiple of 8 below the last whole packet of the flat output, and stays in one row
    of c), rather than one value at a time."""
    total = a * c
    o = np.arange(total)
    start = o - o % 8
    m = (o < (total // 8) * 8) & ((start % c) + 7 < c)
    m.flags.writeable = False
    return m


@lru_cache(maxsize=128)
def _all_packets(a: int, c: int) -> bool:
    return bool(_packets(a, c).all())


@lru_cache(maxsize=128)
def _shard_plan(n: int, count: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """The ranges of TF's FullReducer in ``count`` shards (the remainder first, if any):
    their firsts and lengths, and whether there is a remainder."""
    blocks, rest = shards(n, count)
    ranges = ([rest] if rest else []) + blocks
    firsts = np.array([f for f, _ in ranges], np.int64)
    lengths = np.array([m for _, m in ranges], np.int64)
    firsts.flags.writeable = False
    lengths.flags.writeable = False
    return firsts, lengths, rest is not None


def _full(v: np.ndarray, count: int) -> np.ndarray:
    """TF's FullReducer in ``count`` shards: (rest or +0) + shard 0 + shard 1 + ..."""
    n = v.size
    if count <= 1:  # one tree over the whole input, on this thread
        out = np.empty(1, F32)
        serial(k.row_sums, v, n, out)
        return out
    firsts, lengths, rest = _shard_plan(n, count)
    parts = np.empty(firsts.size, F32)
    launch(_FAMILY, k.tree_sums, n, v, firsts, lengths, parts, units=firsts.size)
    acc = parts[0] if rest else F32(0.0)
    for p in parts[1:] if rest else parts:
        acc = _ftz(F32(acc + p))
    return np.array([acc], F32)


def sums(x: np.ndarray, plan: Any, shard_count: int) -> np.ndarray:
    """The flat float32 sums of ``plan`` (kinds full, inner, outer, middle, zero_two,
    transpose) over x; ``shard_count``: the shards of a full reduction (TF's threads)."""
    dims = plan.dims
    if plan.kind == "full":
        return _full(np.ascontiguousarray(x, F32).reshape(-1), shard_count)
    if plan.kind == "transpose":  # TF's DoTranspose to [kept, reduced], then rows
        t = np.ascontiguousarray(np.reshape(x, dims).transpose(plan.perm))
        r = math.prod(plan.out_shape)
        out = np.empty(r, F32)
        c = t.size // r
        launch(_FAMILY, k.row_sums, t.size, t.reshape(-1), c, out, units=-(-r // 64))
        return out
    v = np.ascontiguousarray(x, F32)
    if plan.kind == "inner":
        r, c = dims
        out = np.empty(r, F32)
        launch(_FAMILY, k.row_sums, v.size, v.reshape(-1), c, out, units=-(-r // 64))
        return out
    if plan.kind in ("outer", "middle"):
        a, b, c = (1, *dims) if plan.kind == "outer" else dims
        out = np.empty(a * c, F32)
        units = a * -(-c // 512)
        if b * min(c, 512) * 4 > _STREAM_BYTES:  # a task streams from memory: row by row
            launch(_FAMILY, k.lane_sums_rows, v.size, v.reshape(a, b, c), _packets(a, c),
                   out, units=units)
        else:  # register blocks
            launch(_FAMILY, k.lane_sums, v.size, v.reshape(a, b, c), _packets(a, c),
                   _all_packets(a, c), out, units=units)
        return out
    assert plan.kind == "zero_two"
    a, b, c = dims
    out = np.empty(b, F32)
    launch(_FAMILY, k.zero_two_sums, v.size, v.reshape(a, b, c), out, units=b)
    return out
