"""Fused batch normalization: FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}.

Computed as TF 2.21's Eigen CPU kernels (``TF_ENABLE_ONEDNN_OPTS=0``) compute it, bit for
bit, in float32 (float16 / bfloat16 cast up exactly, outputs rounded to T at the end):
Eigen's column-sum orders, its approximate ``rsqrt`` for channels in full packets of 8, and
TF's thread-dependent split of the gradient sums. This module holds the ops' checks and the
NumPy reference (the spec); the fused kernels are in ``tfgrad.kernels.batch_norm``. The TF
behaviours reproduced, the differences from TF and the tests that pin them:
docs/batch_norm.md. TF's thread split of the gradient sums is ``tfgrad._tf.eigen``'s; the
kernels run through ``tfgrad.dispatch.batch_norm``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf.eigen import redux_blocks
from .._tf.fpenv import flush_denormals
from .._validate import check_alloc, check_float32_copies, shape_str

_F32 = np.float32
_CHANNEL_LAST = {"NHWC": True, "NDHWC": True, "NCHW": False, "NCDHW": False}


# --------------------------------------------------------------------------------------
# Layout helpers
# --------------------------------------------------------------------------------------
def _channels(x: np.ndarray, channel_last: bool) -> int:
    return int(x.shape[-1] if channel_last else x.shape[1])


def _to_rows(a: np.ndarray, channel_last: bool) -> np.ndarray:
    """View/copy of ``a`` as float32 ``[R, C]`` in NHWC row order."""
    if not channel_last:
        a = np.moveaxis(a, 1, -1)
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]), dtype=_F32)


def _from_rows(rows: np.ndarray, shape: tuple[int, ...], channel_last: bool,
               dtype: np.dtype) -> np.ndarray:
    """Inverse of ``_to_rows``, rounding to ``dtype`` (nearest-even, as Eigen's cast)."""
    if channel_last:
        out = rows.reshape(shape)
    else:
        nhwc = (shape[0],) + tuple(shape[2:]) + (shape[1],)
        out = np.moveaxis(rows.reshape(nhwc), -1, 1)
    with np.errstate(over="ignore"):  # float16 overflows to inf, as TF's cast
        return np.ascontiguousarray(out).astype(dtype, copy=False)


# --------------------------------------------------------------------------------------
# Reference building blocks (plain NumPy, float32 throughout)
# --------------------------------------------------------------------------------------
def _seq_sum(a: np.ndarray) -> np.ndarray:
    """Column sums ``((0 + a[0]) + a[1]) + ...`` in float32 (np.add.accumulate is
    sequential). Starting from +0 matters: it turns a -0 first row into +0, while a sum
    that flushes to -0 later (FTZ) stays -0, as in TF."""
    if a.shape[0] == 0:
        return np.zeros(a.shape[1], _F32)
    rows = np.concatenate([a[:1] + _F32(0), a[1:]]).astype(_F32, copy=False)
    return np.add.accumulate(rows, axis=0)[-1]


def _redux_sum(a: np.ndarray, itemsize: int = 4) -> np.ndarray:
    """TF's ``ReduceOuterDimensions`` sum over the rows of ``a``, literally (redux_blocks)."""
    r, c = a.shape
    if r == 1:
        return a[0].copy()  # TF passes the single row through (a -0 stays -0)
    nb, rows, per_call = redux_blocks(r, c, itemsize, _config.tf_intra_op_threads())
    buffers = [np.zeros(c, _F32) for _ in range(nb)]
    for s in range(0, nb, per_call):
        buffers[s] = _seq_sum(a[s * rows:(s + per_call) * rows])
    total = buffers[0]
    for b in buffers[1:]:
        total = total + b
    return total


def colsum_eigen(a: np.ndarray) -> np.ndarray:
    """Eigen's reduction of a row-major ``[R, C]`` float32 array over its rows."""
    r, c = a.shape
    out = _seq_sum(a)
    k = (c // 8) * 8
    if k and r >= 16:
        u = (r // 4) * 4
        acc = _seq_sum(a[:u, :k].reshape(u // 4, 4 * k)).reshape(4, k)
        s = ((acc[0] + acc[1]) + acc[2]) + acc[3]
        for j in range(u, r):
            s = s + a[j, :k]
        out[:k] = s
    return out


@cache
def _dispatch() -> Any:
    """``tfgrad.dispatch.batch_norm``, imported on first use (an import statement in the
    functions costs microseconds a call)."""
    from ..dispatch import batch_norm

    return batch_norm


def eigen_rsqrt(v: np.ndarray, tile: int = 0) -> np.ndarray:
    """Eigen's rsqrt of a [C] vector (``tfgrad._tf.rsqrt.eigen_rsqrt``); ``tile=0``: the
    whole vector is one tile (the channel rule)."""
    from .._tf import rsqrt  # (compiled: imported on first use, not with the ops)

    return rsqrt.eigen_rsqrt(v, tile)


def reference_forward_train(X: np.ndarray, scale: np.ndarray, offset: np.ndarray,
                            mean_in: np.ndarray, var_in: np.ndarray, eps: float,
                            factor: float) -> tuple[np.ndarray, ...]:
    """y, batch_mean, batch_variance, saved mean, saved (biased) variance of X[R, C]."""
    r = X.shape[0]
    inv = _F32(1) / _F32(r)
    mean = colsum_eigen(X) * inv
    xc = X - mean
    var = colsum_eigen(xc * xc) * inv
    sf = eigen_rsqrt(var + _F32(eps)) * scale
    y = xc * sf + offset
    adj = _F32(r) / _F32(max(r - 1, 1))
    f = _F32(factor)
    if f == _F32(1):
        bm, bv = mean, var * adj
    else:
        om = _F32(1) - f
        bm = om * mean_in + f * mean
        bv = om * var_in + (f * adj) * var
    return y, bm, bv, mean, var


def reference_forward_infer(X: np.ndarray, scale: np.ndarray, offset: np.ndarray,
                            mean_in: np.ndarray, var_in: np.ndarray,
                            eps: float) -> np.ndarray:
    sf = eigen_rsqrt(var_in + _F32(eps)) * scale
    return (X - mean_in) * sf + offset


def reference_grad_train(dy: np.ndarray, X: np.ndarray, scale: np.ndarray, mean: np.ndarray,
                         var: np.ndarray, eps: float, itemsize: int = 4) -> tuple[np.ndarray, ...]:
    r = X.shape[0]
    inv = _F32(1) / _F32(r)
    from .._tf.rsqrt import GRAD_DX_TILE, GRAD_SCALE_TILE

    c0 = eigen_rsqrt(var + _F32(eps), GRAD_DX_TILE)
    xc = X - mean
    sb = _redux_sum(dy * (xc * eigen_rsqrt(var + _F32(eps), GRAD_SCALE_TILE)))
    ob = _redux_sum(dy, itemsize)
    m = _redux_sum(dy * xc) / _F32(r)
    c1 = scale * c0
    c2 = (c0 * c0) * m
    dx = c1 * ((dy - ob * inv) - xc * c2)
    return dx, sb, ob


def reference_grad_infer(dy: np.ndarray, X: np.ndarray, scale: np.ndarray, mean: np.ndarray,
                         var: np.ndarray, eps: float, itemsize: int = 4) -> tuple[np.ndarray, ...]:
    s = eigen_rsqrt(var + _F32(eps))
    ob = _redux_sum(dy, itemsize)
    sb = _redux_sum(dy * (X - mean)) * s
    dx = dy * (s * scale)
    return dx, sb, ob


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------
def _check_rank1(op: str, what: str, a: np.ndarray, name: str = "") -> None:
    if a.ndim != 1:
        of = f"{name} of " if name else ""
        raise InvalidArgumentError(
            f"{op}: {what} must be 1-dimensional, got {of}shape {shape_str(a.shape)}")


def _check_x(op: str, what: str, x: np.ndarray) -> None:
    if x.ndim not in (4, 5):
        raise InvalidArgumentError(
            f"{op}: input must be 4 or 5-dimensional, got {what} of shape {shape_str(x.shape)}")


def _check_channels(op: str, what: str, a: np.ndarray, c: int, prefix: str = "") -> None:
    if a.size != c:
        raise InvalidArgumentError(
            f"{op}: {prefix}{what} must have the same number of elements as the channels of "
            f"x, got {a.size} and {c}")


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------
def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every check of ``op``'s arguments that needs only their shapes, dtypes and attrs, in
    TF's order (array inputs may be shape-only placeholders; see :mod:`tfgrad._shapes`).
    Every output's shape follows the op table's rule, so none is returned."""
    if "Grad" in op:
        _check_grad(op, **{k: args[k] for k in _GRAD_ARGS})
    else:
        _check_forward(op, **{k: args[k] for k in _FORWARD_ARGS})
    return {}


_FORWARD_ARGS = ("x", "scale", "offset", "mean", "variance", "exponential_avg_factor",
                 "data_format", "is_training")
_GRAD_ARGS = ("y_backprop", "x", "scale", "reserve_space_1", "reserve_space_2", "data_format")


def prepare(op: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """``check``, then the rest of the op as a function of the arguments (``tfgrad._api``
    keeps it per signature, with the kernels' runner for x's shape, worked out once)."""
    check(op, args)
    eps, fmt, training = args["epsilon"], args["data_format"], args["is_training"]
    x = args["x"]
    channel_last = _CHANNEL_LAST[fmt]
    if "Grad" in op:
        run = (_dispatch().grad_runner(x.shape, x.dtype, eps, channel_last, training)
               if x.size else None)
        plans: dict[int, Any] = {}  # (TF's split of the sums, per TF thread count)
        return lambda a: _grad_checked(a["y_backprop"], a["x"], a["scale"],
                                       a["reserve_space_1"], a["reserve_space_2"], eps, fmt,
                                       training, run, plans)
    version = 3 if op.endswith("V3") else 2 if op.endswith("V2") else 1
    factor = args["exponential_avg_factor"]
    run = (_dispatch().forward_runner(x.shape, x.dtype, eps, factor, channel_last, training)
           if x.size else None)
    return lambda a: _forward_checked(version, a["x"], a["scale"], a["offset"], a["mean"],
                                      a["variance"], eps, factor, fmt, training, run)


_NO_PLAN = object()


def _check_forward(op: str, x: np.ndarray, scale: np.ndarray, offset: np.ndarray,
                   mean: np.ndarray, variance: np.ndarray, exponential_avg_factor: float,
                   data_format: str, is_training: bool) -> None:
    _check_x(op, "x", x)
    _check_rank1(op, "scale", scale)
    _check_rank1(op, "offset", offset)
    _check_rank1(op, "estimated_mean", mean)
    _check_rank1(op, "estimated_variance", variance)
    c = _channels(x, _CHANNEL_LAST[data_format])
    _check_channels(op, "scale", scale, c)
    _check_channels(op, "offset", offset, c)
    if not is_training or _F32(exponential_avg_factor) != _F32(1):
        prefix = "When exponential_avg_factor != 1, " if is_training else \
            "When is_training=false, "
        _check_channels(op, "mean", mean, c, prefix)
        _check_channels(op, "variance", variance, c, prefix)
    check_alloc(op, "y", x.shape, x.dtype)
    check_float32_copies(op, {"x": x})


def _forward_checked(version: int, x: np.ndarray, scale: np.ndarray, offset: np.ndarray,
                     mean: np.ndarray, variance: np.ndarray, epsilon: float,
                     exponential_avg_factor: float, data_format: str, is_training: bool,
                     run: Callable[..., tuple] | None) -> tuple[np.ndarray, ...]:
    """``run``: the dispatch's runner for x's shape (``prepare``; None for an empty x)."""
    channel_last = _CHANNEL_LAST[data_format]
    c = _channels(x, channel_last)
    scale = scale.astype(_F32, copy=False)
    offset = offset.astype(_F32, copy=False)
    mean = mean.astype(_F32, copy=False)
    variance = variance.astype(_F32, copy=False)
    extra = (np.zeros((), _F32),) if version == 3 else ()
    if x.size == 0:
        # TF fills batch_mean/variance with NaN and leaves reserve_space_1/2 uninitialised.
        nan = np.full(c, np.nan, _F32)
        zeros = np.zeros(c, _F32)
        return (np.empty(x.shape, x.dtype), nan, nan.copy(), zeros, zeros.copy()) + extra

    with flush_denormals(), np.errstate(all="ignore"):  # inf and NaN are results, as TF's
        if _config.use_reference():
            y, bm, bv, sm, sv = _reference_forward(x, scale, offset, mean, variance,
                                                   epsilon, exponential_avg_factor,
                                                   channel_last, is_training)
        else:
            assert run is not None
            y, bm, bv, sm, sv = run(x, scale, offset, mean, variance)
    return (y, bm.copy(), bv.copy(), sm.copy(), sv.copy()) + extra


def _reference_forward(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, mean: np.ndarray,
                       variance: np.ndarray, epsilon: float, exponential_avg_factor: float,
                       channel_last: bool, is_training: bool) -> tuple[np.ndarray, ...]:
    X = _to_rows(x, channel_last)
    if is_training:
        y2, bm, bv, sm, sv = reference_forward_train(X, scale, offset, mean, variance,
                                                     epsilon, exponential_avg_factor)
    else:
        y2 = reference_forward_infer(X, scale, offset, mean, variance, epsilon)
        bm, bv, sm, sv = mean, variance, mean, variance
    return _from_rows(y2, x.shape, channel_last, x.dtype), bm, bv, sm, sv


def FusedBatchNorm(**kw: Any) -> tuple[np.ndarray, ...]:
    return prepare("FusedBatchNorm", kw)(kw)


def FusedBatchNormV2(**kw: Any) -> tuple[np.ndarray, ...]:
    return prepare("FusedBatchNormV2", kw)(kw)


def FusedBatchNormV3(**kw: Any) -> tuple[np.ndarray, ...]:
    return prepare("FusedBatchNormV3", kw)(kw)


# --------------------------------------------------------------------------------------
# Gradient
# --------------------------------------------------------------------------------------
def _check_grad(op: str, y_backprop: np.ndarray, x: np.ndarray, scale: np.ndarray,
                reserve_space_1: np.ndarray, reserve_space_2: np.ndarray,
                data_format: str) -> None:
    _check_x(op, "y_backprop", y_backprop)
    _check_x(op, "x", x)
    _check_rank1(op, "scale", scale)
    _check_rank1(op, "saved mean", reserve_space_1, "reserve_space_1")
    _check_rank1(op, "saved variance", reserve_space_2, "reserve_space_2")
    if x.shape != y_backprop.shape:
        raise InvalidArgumentError(
            f"{op}: x and y_backprop must have same shape, but x has shape "
            f"{shape_str(x.shape)} and y_backprop has shape {shape_str(y_backprop.shape)}")
    c = _channels(x, _CHANNEL_LAST[data_format])
    _check_channels(op, "scale", scale, c)
    _check_channels(op, "reserve_space_1", reserve_space_1, c)
    _check_channels(op, "reserve_space_2", reserve_space_2, c)
    check_alloc(op, "x_backprop", x.shape, x.dtype)
    check_float32_copies(op, {"x": x, "y_backprop": y_backprop})


def _grad_checked(y_backprop: np.ndarray, x: np.ndarray, scale: np.ndarray,
                  reserve_space_1: np.ndarray, reserve_space_2: np.ndarray, epsilon: float,
                  data_format: str, is_training: bool, run: Callable[..., tuple] | None,
                  plans: dict[int, Any]) -> tuple[np.ndarray, ...]:
    """``run``: the dispatch's runner for x's shape (``prepare``; None for an empty x);
    ``plans``: TF's split of the sums by TF thread count, filled as they are needed."""
    channel_last = _CHANNEL_LAST[data_format]
    c = _channels(x, channel_last)
    scale = scale.astype(_F32, copy=False)
    mean = reserve_space_1.astype(_F32, copy=False)
    var = reserve_space_2.astype(_F32, copy=False)
    empty = (np.zeros(0, _F32), np.zeros(0, _F32))
    if x.size == 0:
        return (np.empty(x.shape, x.dtype), np.zeros(c, _F32), np.zeros(c, _F32)) + empty

    plan = None
    if not _config.use_reference():
        threads = _config.tf_intra_op_threads()
        plan = plans.get(threads, _NO_PLAN)
        if plan is _NO_PLAN:
            plan = plans[threads] = _dispatch().grad_plan(x, channel_last)
    if plan is None:  # the reference, or a split the kernels do not reproduce
        dx, sb, ob = _reference_grad(y_backprop, x, scale, mean, var, epsilon, channel_last,
                                     is_training)
    else:
        assert run is not None
        with flush_denormals(), np.errstate(all="ignore"):
            dx, sb, ob = run(y_backprop, x, scale, mean, var, plan)
    return (dx, sb, ob) + empty


def _reference_grad(dy: np.ndarray, x: np.ndarray, scale: np.ndarray, mean: np.ndarray,
                    var: np.ndarray, epsilon: float, channel_last: bool,
                    is_training: bool) -> tuple[np.ndarray, ...]:
    dy2 = _to_rows(dy, channel_last)
    X = _to_rows(x, channel_last)
    ref = reference_grad_train if is_training else reference_grad_infer
    with flush_denormals(), np.errstate(all="ignore"):  # inf and NaN are results, as TF's
        dx2, sb, ob = ref(dy2, X, scale, mean, var, epsilon, x.dtype.itemsize)
    return _from_rows(dx2, x.shape, channel_last, x.dtype), sb, ob


def FusedBatchNormGrad(**kw: Any) -> tuple[np.ndarray, ...]:
    return prepare("FusedBatchNormGrad", kw)(kw)


def FusedBatchNormGradV2(**kw: Any) -> tuple[np.ndarray, ...]:
    return prepare("FusedBatchNormGradV2", kw)(kw)


def FusedBatchNormGradV3(**kw: Any) -> tuple[np.ndarray, ...]:
    # TF's CPU kernel ignores reserve_space_3 (any shape is accepted).
    return prepare("FusedBatchNormGradV3", kw)(kw)
