"""Sum / Mean on the compiled kernels (``tfgrad.kernels.reduction``): the collapsed
shapes of the plan (``tfgrad.ops.reduction.Plan``), the full reduction's shards, which
outputs Eigen evaluates as packets."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .._compile import launch
from .._tf.eigen import shards
from ..kernels import reduction as k

F32 = np.float32
_FAMILY = "reduction"
_FLT_MIN = F32(2.0**-126)


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


def _full(v: np.ndarray, count: int) -> np.ndarray:
    """TF's FullReducer in ``count`` shards: (rest or +0) + shard 0 + shard 1 + ..."""
    n = v.size
    blocks, rest = shards(n, count)
    ranges = ([rest] if rest else []) + blocks
    firsts = np.array([f for f, _ in ranges], np.int64)
    lengths = np.array([m for _, m in ranges], np.int64)
    parts = np.empty(len(ranges), F32)
    launch(_FAMILY, k.tree_sums, n, v, firsts, lengths, parts, units=len(ranges))
    if count <= 1:
        return parts[:1].copy()
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
        r = int(np.prod(plan.out_shape, dtype=np.int64))
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
        launch(_FAMILY, k.lane_sums, v.size, v.reshape(a, b, c), _packets(a, c), out,
               units=a * -(-c // 512))
        return out
    assert plan.kind == "zero_two"
    a, b, c = dims
    out = np.empty(b, F32)
    launch(_FAMILY, k.zero_two_sums, v.size, v.reshape(a, b, c), out, units=b)
    return out
