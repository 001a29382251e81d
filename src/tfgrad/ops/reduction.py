"""Reductions: Sum and Mean, bit for bit with TensorFlow 2.21's CPU kernels.

TF's ``ReductionOp`` (``reduction_ops_common.h``) first collapses the input
(``ReductionHelper::Simplify``): leading size-1 dims are dropped, a size-1 dim joins the
run before it, and consecutive dims that are all reduced (or all kept) merge. The
collapsed tensor has alternating runs, and TF picks one Eigen expression per shape:

=====================  ====================================  ============================
collapsed              Eigen reduction (row-major)           order of each output's sum
=====================  ====================================  ============================
nothing reduced        none: the input is copied             (no addition: -0 stays -0)
[n], reduce 0          full reduction (``FullReducer``)      Eigen's tree, in shards by
                                                             the cost model (TF threads)
[r, c], reduce 1       inner (``ReducingInnerMostDims``)     Eigen's tree over the row
[r, c], reduce 0       outer (``PreservingInnerMostDims``)   8-column packets: 4 lanes of
                                                             rows when r >= 16; sequential
                                                             for the columns past c // 8
[a, b, c], reduce 1    middle (preserving, stride c)         as outer, per packet of the
                                                             flat output that stays in a row
[a, b, c], reduce 0,2  generic (``GenericDimReducer``)       k outer, i inner, sequential
4+ runs                transpose to [kept, reduced], inner   Eigen's tree over the row
=====================  ====================================  ============================

Every sum starts from +0 (Eigen's ``SumReducer::initialize``) and runs in float32 under
TF's FTZ/DAZ. Mean is that sum divided by ``float32(in.size() / out.size())`` (one IEEE
division, TF's ``ReduceEigenImpl<MeanReducer>``). An empty input with a non-empty output
gives 0 (Sum) or NaN (Mean, TF's ``FIX_MEAN_IDENTITY``).

This module holds the checks, the plan (which path, which shapes) and the NumPy
reference (the spec); the kernels are ``tfgrad.kernels.reduction`` run by
``tfgrad.dispatch.reduction``. Behaviours and the tests that pin them: docs/reduction.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf.eigen import full_sum, num_threads, sharded_sum
from .._tf.fpenv import flush_denormals, flushed

F32 = np.float32
_ZERO = F32(0.0)

# Eigen's cost per value of a full sum (FullReducer): 4 bytes loaded at 11/64 cycles a
# byte, plus functor_traits<SumReducer>::Cost, which Eigen does not specialise (its
# default, 10 cycles), over a packet of 8: 31/16 cycles. TF therefore splits a full
# Sum/Mean over its 2 threads from 108388 values (measured: 108387 one shard, 108388 two).
COST_SUM = 4 * 11 / 64 + 10 / 8
PACKET = 8


@cache
def _dispatch() -> Any:
    from ..dispatch import reduction

    return reduction


def ftz(a: Any) -> np.ndarray:
    return flushed(np.asarray(a, F32))


# --------------------------------------------------------------------------------------
# The plan: TF's ReductionHelper and the choice of Eigen expression
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    kind: str
    """``copy``, ``empty`` (no output values), ``identity`` (empty input), ``full``,
    ``inner``, ``outer``, ``middle``, ``zero_two`` or ``transpose``."""
    dims: tuple[int, ...]
    """The collapsed input shape (``data_reshape``)."""
    out_shape: tuple[int, ...]
    """The op's output shape."""
    count: int
    """Values summed into each output (Mean divides by it); 0 when nothing is summed."""
    perm: tuple[int, ...] = ()
    """``transpose``: the permutation of ``dims`` that puts the kept runs first."""


def _axes_bitmap(op: str, rank: int, axis: np.ndarray) -> list[bool]:
    """TF's SimplifyHelper: axes in [-rank, rank), no duplicates (TF's words)."""
    bitmap = [False] * rank
    for v in np.asarray(axis).reshape(-1).tolist():
        if v < -rank or v >= rank:
            # (TF's message has no closing parenthesis)
            raise InvalidArgumentError(
                f"{op}: Invalid reduction dimension ({v} for input with {rank} dimension(s)")
        i = (v + rank) % rank
        if bitmap[i]:
            raise InvalidArgumentError(
                f"{op}: Invalid reduction arguments: Axes contains duplicate dimension: {i}")
        bitmap[i] = True
    return bitmap


@lru_cache(maxsize=512)
def make_plan(op: str, shape: tuple[int, ...], axes: tuple[int, ...], keep_dims: bool
              ) -> Plan:
    """TF's ``ReductionHelper::Simplify`` and ``ReductionOp::Compute``'s case analysis."""
    rank = len(shape)
    bitmap = _axes_bitmap(op, rank, np.asarray(axes, np.int64))
    out_shape = tuple(1 if r else s for s, r in zip(shape, bitmap) if keep_dims or not r)
    size = math.prod(shape)
    out_size = math.prod(out_shape)
    first = next((i for i, s in enumerate(shape) if s != 1), rank)
    dims: list[int] = []
    reduce_first = True  # an input of size-1 dims only is "essentially a scalar"
    if first < rank:
        reduce_first = bitmap[first]
        dims.append(shape[first])
        for i in range(first + 1, rank):
            if shape[i] == 1:  # a size-1 dim joins the run before it
                bitmap[i] = bitmap[i - 1]
            if bitmap[i] != bitmap[i - 1]:
                dims.append(shape[i])
            else:
                dims[-1] *= shape[i]
    nd = len(dims)
    count = size // out_size if out_size else 0
    if nd == 0 or (nd == 1 and not reduce_first):
        return Plan("copy", tuple(dims), out_shape, 1)
    if out_size == 0:
        return Plan("empty", tuple(dims), out_shape, 0)
    if size == 0:
        return Plan("identity", tuple(dims), out_shape, 0)
    if nd == 1:
        kind = "full"
    elif nd == 2:
        kind = "outer" if reduce_first else "inner"
    elif nd == 3:
        kind = "zero_two" if reduce_first else "middle"
    else:
        kept = list(range(1 if reduce_first else 0, nd, 2))
        gone = list(range(0 if reduce_first else 1, nd, 2))
        return Plan("transpose", tuple(dims), out_shape, count, tuple(kept + gone))
    return Plan(kind, tuple(dims), out_shape, count)


# --------------------------------------------------------------------------------------
# The NumPy reference
# --------------------------------------------------------------------------------------
def _seq_sum(cols: np.ndarray) -> np.ndarray:
    """Sequential sums down axis 0 from +0 (GenericDimReducer, the scalar path)."""
    acc = np.zeros(cols.shape[1:], F32)
    for row in cols:
        acc = ftz(acc + row)
    return acc


def _lanes_sum(cols: np.ndarray) -> np.ndarray:
    """InnerMostDimPreserver on packets (down axis 0, each column one lane): with 16 rows
    or more, rows j = 0, 1, 2, 3 (mod 4) below 4 * (n // 4) go to four accumulators,
    combined ((a0 + a1) + a2) + a3 before the remaining rows; else sequential."""
    n = cols.shape[0]
    if n < 16:
        return _seq_sum(cols)
    n4 = (n // 4) * 4
    acc = [_seq_sum(cols[k:n4:4]) for k in range(4)]
    total = ftz(ftz(ftz(acc[0] + acc[1]) + acc[2]) + acc[3])
    for row in cols[n4:]:
        total = ftz(total + row)
    return total


def _outer(x: np.ndarray) -> np.ndarray:
    """[r, c] summed over rows: columns below 8 * (c // 8) as packets, the rest sequential."""
    c = x.shape[1]
    cp = (c // PACKET) * PACKET
    return np.concatenate([_lanes_sum(x[:, :cp]), _seq_sum(x[:, cp:])])


def _middle(x: np.ndarray) -> np.ndarray:
    """[a, b, c] summed over b. The executor evaluates the flat output [a * c] in packets
    of 8 (the last (a * c) % 8 values one by one); a packet starting at output (i, k)
    uses InnerMostDimPreserver when k + 7 < c, else each of its values sequentially."""
    a, _, c = x.shape
    lanes = _lanes_sum(x.transpose(1, 0, 2)).reshape(-1)
    seq = _seq_sum(x.transpose(1, 0, 2)).reshape(-1)
    total = a * c
    o = np.arange(total)
    start = o - o % PACKET
    packet = (o < (total // PACKET) * PACKET) & ((start % c) + PACKET - 1 < c)
    return np.where(packet, lanes, seq).astype(F32)


def _zero_two(x: np.ndarray) -> np.ndarray:
    """[a, b, c] summed over a and c: for k in c, for i in a (GenericDimReducer loops the
    last reduced dim outermost)."""
    return _seq_sum(x.transpose(2, 0, 1).reshape(-1, x.shape[1]))


def _inner(x: np.ndarray) -> np.ndarray:
    """[r, c] summed along rows, each by Eigen's tree from its flat index r * c."""
    c = x.shape[1]
    return np.array([full_sum(row, i * c) for i, row in enumerate(x)], F32)


def reference_sum(x: np.ndarray, plan: Plan) -> np.ndarray:
    """The reduced sums, in the collapsed output shape (flat)."""
    v = ftz(x).reshape(plan.dims)  # DAZ: denormal inputs read as zero
    if plan.kind == "full":
        return np.array([sharded_sum(v, full_threads(v.size))], F32)
    if plan.kind == "inner":
        return _inner(v)
    if plan.kind == "outer":
        return _outer(v)
    if plan.kind == "middle":
        return _middle(v)
    if plan.kind == "zero_two":
        return _zero_two(v)
    assert plan.kind == "transpose"
    t = np.ascontiguousarray(v.transpose(plan.perm))
    out = math.prod(plan.out_shape)
    return _inner(t.reshape(out, -1))


def full_threads(n: int) -> int:
    """The shards of TF's full reduction of n values (its cost model, TF's threads)."""
    return num_threads(n, COST_SUM, _config.tf_intra_op_threads())


def _finish(x: np.ndarray, plan: Plan, mean: bool, sums: Callable[[], np.ndarray]
            ) -> np.ndarray:
    if plan.kind == "copy":
        return np.array(x, F32).reshape(plan.out_shape)
    if plan.kind == "empty":
        return np.empty(plan.out_shape, F32)
    if plan.kind == "identity":
        return np.full(plan.out_shape, np.nan if mean else 0.0, F32)
    s = sums()
    if mean:  # float32(in.size() / out.size())
        if _config.X86:  # (FTZ / DAZ in MXCSR: what ftz() of the quotient gives, in one op)
            with flush_denormals():
                s = s / F32(plan.count)
        else:
            with np.errstate(all="ignore"):
                s = ftz(s / F32(plan.count))
    return s.reshape(plan.out_shape)


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------
def _axes(axis: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(axis).reshape(-1).tolist())


def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shape checks (TF's order and words); returns the output's shape."""
    plan = make_plan(op, tuple(args["input"].shape), _axes(args["axis"]),
                     bool(args["keep_dims"]))
    return {"output": plan.out_shape}


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], np.ndarray]:
    """``check``, then the rest as a function of the arguments: the plan follows from the
    shape and the axes' values, both in ``tfgrad._api``'s signature."""
    plan = make_plan(op, tuple(args["input"].shape), _axes(args["axis"]),
                     bool(args["keep_dims"]))
    mean = op == "Mean"
    return lambda a: _run(a["input"], plan, mean)


def _run(x: np.ndarray, plan: Plan, mean: bool) -> np.ndarray:
    if _config.use_reference():
        return _finish(x, plan, mean, lambda: reference_sum(x, plan))
    return _finish(x, plan, mean,
                   lambda: _dispatch().sums(x, plan, full_threads(x.size)))


def Sum(*, input: np.ndarray, axis: Any, keep_dims: bool = False) -> np.ndarray:  # noqa: A002
    args = locals()
    return prepare("Sum", args)(args)


def Mean(*, input: np.ndarray, axis: Any, keep_dims: bool = False) -> np.ndarray:  # noqa: A002
    args = locals()
    return prepare("Mean", args)(args)
