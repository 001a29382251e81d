"""tfmot's update of a quantizer's range variables in a training step, written once for
any array type: each framework passes its operations (:class:`RangeOps`), so that the
order of the float32 operations is tfmot's in all of them (docs/qat.md, "The quantizers,
as tfmot computes them")."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, NamedTuple

from ._plan import Quantizer


class RangeOps(NamedTuple):
    """One framework's operations for :func:`updated_range` (each float32, rounded)."""

    minimum: Callable[[Any, Any], Any]
    maximum: Callable[[Any, Any], Any]
    divide: Callable[[Any, float], Any] = operator.truediv
    times: Callable[[Any, Any], Any] = operator.mul
    global_range: Callable[[Any, Any], tuple[Any, Any]] | None = None
    """All-values quantizers under data parallelism: the global batch's (min, max)."""
    replica_mean: Callable[[Any, Any], tuple[Any, Any]] | None = None
    """Moving averages under data parallelism: the replicas' mean of the new values
    (tf.distribute MEAN-reduces assign_moving_average's value)."""


def ratio(q: Quantizer) -> float:
    """tfmot's symmetric rule's factor: -1 (narrow range) or -(2**bits - 2) / 2**bits."""
    return -1.0 if q.narrow_range else -((1 << q.num_bits) - 2) / (1 << q.num_bits)


def updated_range(q: Quantizer, lo: Any, hi: Any, bmin: Any, bmax: Any, zero: Any, ema: Any,
                  ops: RangeOps) -> tuple[Any, Any]:
    """The new (min, max) of quantizer ``q`` from its variables ``lo`` / ``hi`` and the
    batch's ``bmin`` / ``bmax``: last value, the moving average ``var - (var - v) * ema``
    (``ema`` = float32(1 - 0.999)) or all values (from 0 / 0), with tfmot's symmetric rule
    (for all values tfmot updates batch_min first, then uses it)."""
    r = ratio(q)
    if q.kind == "all_values":
        if ops.global_range is not None:
            bmin, bmax = ops.global_range(bmin, bmax)
        if q.symmetric:
            bmin = ops.minimum(bmin, ops.divide(bmax, r))
            bmax = ops.maximum(bmax, ops.times(bmin, r))
        return (ops.minimum(ops.minimum(lo, bmin), zero),
                ops.maximum(ops.maximum(hi, bmax), zero))
    if q.symmetric:
        new_lo = ops.minimum(bmin, ops.divide(bmax, r))
        new_hi = ops.maximum(bmax, ops.times(bmin, r))
    else:
        new_lo, new_hi = ops.minimum(bmin, zero), ops.maximum(bmax, zero)
    if q.kind == "moving_average":
        if ops.replica_mean is not None:
            new_lo, new_hi = ops.replica_mean(new_lo, new_hi)
        new_lo = lo - ops.times(lo - new_lo, ema)
        new_hi = hi - ops.times(hi - new_hi, ema)
    return new_lo, new_hi
