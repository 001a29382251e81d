"""Softmax, bit for bit with TensorFlow 2.21's CPU kernel.

TF's ``SoftmaxEigenImpl`` (``softmax_op_functor.h``) on the logits as [rows, classes]
(``flat_inner_dims``: softmax over the last axis):

1. ``max`` along classes (Eigen's order: ``row_max``); ``shifted = logits - max`` (one
   float32 subtraction);
2. ``softmax = exp(shifted)``: a tiled Eigen assignment (the broadcast prefers blocks).
   Blocks are TF's ``TensorBlockMapper`` blocks of ``BLOCK`` = 6956 coefficients
   (1 / the cost model's task size for this expression; skewed to the inner dimension:
   ``ceil(BLOCK / classes)`` whole rows, or pieces of ``BLOCK`` classes of one row), the
   whole tensor when it has at most ``BLOCK`` values. Each block is a contiguous run: its
   values go through Eigen's ``pexp`` in packets of 8, its last ``len % 8`` through the C
   library's ``expf``;
3. ``sum`` along classes (Eigen's tree per row, ``tfgrad._tf.eigen.full_sum``);
4. ``inverse()``: the rows in full packets of 8 outputs (rows below ``8 * (rows // 8)``)
   take Eigen's ``preciprocal`` (the processor's ``rcpps`` and a Newton step:
   ``tfgrad._tf.rcp``), the last ``rows % 8`` an exact ``1 / sum``;
5. ``softmax * inverse`` (one multiply, not a division).

Float32 under FTZ / DAZ. A NaN or +inf logit makes its row NaN; a row of -inf is NaN.
The NumPy reference is the spec; the kernel is ``tfgrad.kernels.softmax``. Behaviours and
the tests that pin them: docs/softmax.md.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf.eigen import full_sum
from .._tf.expf import SOFTMAX_BLOCK, expf, pexp
from .._tf.fpenv import flushed
from .._tf.rcp import preciprocal
from .._validate import shape_str

F32 = np.float32
BLOCK = SOFTMAX_BLOCK  # TF's block size for the exp assignment (probed: docs/softmax.md)


@cache
def _dispatch() -> Any:
    from ..dispatch import softmax

    return softmax


def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    x = args["logits"]
    if x.ndim < 1:
        raise InvalidArgumentError(f"{op}: logits must have >= 1 dimension, got "
                                   f"{shape_str(x.shape)}")
    return {"softmax": tuple(x.shape)}


def packet_mask(rows: int, c: int) -> np.ndarray:
    """Which flat values of the exp assignment TF evaluates in packets (``pexp``)."""
    n = rows * c
    m = np.zeros(n, bool)
    if n <= BLOCK:
        m[:(n // 8) * 8] = True
    elif c >= BLOCK:  # blocks of BLOCK classes along each row
        for i in range(rows):
            for s in range(0, c, BLOCK):
                ln = min(BLOCK, c - s)
                m[i * c + s:i * c + s + (ln // 8) * 8] = True
    else:  # blocks of ceil(BLOCK / c) whole rows
        per = -(-BLOCK // c)
        for r0 in range(0, rows, per):
            ln = min(per, rows - r0) * c
            m[r0 * c:r0 * c + (ln // 8) * 8] = True
    return m


def _gt(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``maxps(a, b)``: a where a > b, else b (b when either is NaN)."""
    return np.where(a > b, a, b)


def row_max(x: np.ndarray) -> np.ndarray:
    """Eigen's MaxReducer (PropagateFast) along rows, in its order: lanes of packets of 8
    (``maxps``), the scalar tail with ``std::max`` (the value unless it is below the
    accumulator), ``predux_max``'s shuffles, then ``std::max(tail, packets)``. Equal to
    the maximum on finite rows; on rows with NaNs it picks TF's NaN or value (which sets
    the sign of the row's NaNs)."""
    rows, c = x.shape
    v = (c // 8) * 8
    acc = np.full(rows, -np.inf, F32)
    for j in range(v, c):
        acc = np.where(x[:, j] < acc, acc, x[:, j])
    if v == 0:
        return acc
    p = np.full((rows, 8), -np.inf, F32)
    for j in range(0, v, 8):
        p = _gt(x[:, j:j + 8], p)
    red = _gt(_gt(_gt(p[:, 0], p[:, 4]), _gt(p[:, 2], p[:, 6])),
              _gt(_gt(p[:, 1], p[:, 5]), _gt(p[:, 3], p[:, 7])))
    return np.where(acc < red, red, acc)


def reference(logits: np.ndarray) -> np.ndarray:
    shape = logits.shape
    c = shape[-1]
    x = flushed(np.asarray(logits, F32).reshape(-1, c))
    rows = x.shape[0]
    with np.errstate(all="ignore"):
        mx = row_max(x)
        flat = flushed(x - mx[:, None]).reshape(-1)
        e = flushed(np.where(packet_mask(rows, c), pexp(flat), expf(flat)).astype(F32))
        e = e.reshape(rows, c)
        s = np.array([full_sum(e[i], i * c) for i in range(rows)], F32)
        r8 = (rows // 8) * 8
        inv = np.concatenate([preciprocal(s[:r8]), (F32(1) / s[r8:]).astype(F32)])
        out = flushed((e * inv[:, None]).astype(F32))
    return out.reshape(shape)


def Softmax(*, logits: np.ndarray) -> np.ndarray:
    check("Softmax", {"logits": logits})
    if logits.size == 0:
        return np.empty(logits.shape, F32)
    if _config.use_reference():
        return reference(logits)
    return _dispatch().softmax(logits)
