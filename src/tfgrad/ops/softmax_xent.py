"""SparseSoftmaxCrossEntropyWithLogits, bit for bit with TensorFlow 2.21's CPU kernel.

TF's ``SparseXentEigenImpl`` (``sparse_xent_op.h``) on logits [batch, classes]:

1. ``max`` along classes; ``shifted = logits - max`` (one float32 subtraction);
2. ``sum = sum(exp(shifted))`` along classes: an inner reduction (Eigen's tree per row,
   ``tfgrad._tf.eigen``) of an ``exp`` expression: the values a leaf loads as packets
   (all but the last ``n % 8`` of each leaf of the row) go through Eigen's ``pexp``, the
   others through the C library's ``expf`` (``tfgrad._tf.expf``);
3. ``loss = log(sum) - shifted[label]`` (``logf``; the generator's zeros add nothing);
4. ``backprop = exp(shifted)`` over the flat [batch * classes] tensor: ``pexp`` for
   the values below ``8 * (batch * classes // 8)``, ``expf`` for the last few; then
   ``backprop = backprop / sum - (class == label)``.

Everything in float32 under FTZ / DAZ. A NaN or +inf logit makes its row NaN; a -inf
logit has probability 0. Labels outside [0, classes) are TF's InvalidArgumentError.

This module holds the checks and the NumPy reference (the spec); the kernel is
``tfgrad.kernels.softmax_xent`` run by ``tfgrad.dispatch.softmax_xent``. Behaviours and
the tests that pin them: docs/softmax_xent.md.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._tf.eigen import LEAF, full_sum, split
from .._tf.expf import expf, logf, pexp
from .._tf.fpenv import flushed
from .._validate import shape_str

F32 = np.float32


@cache
def _dispatch() -> Any:
    from ..dispatch import softmax_xent

    return softmax_xent


def ftz(a: Any) -> np.ndarray:
    return flushed(np.asarray(a, F32))


# --------------------------------------------------------------------------------------
# Checks (TF's order and words)
# --------------------------------------------------------------------------------------
def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    f, labels = args["features"], args["labels"]
    if f.ndim != 2:
        raise InvalidArgumentError(f"{op}: logits must be 2-D, but got shape {shape_str(f.shape)}")
    if labels.ndim != 1:
        raise InvalidArgumentError(f"{op}: labels must be 1-D, but got shape "
                                   f"{shape_str(labels.shape)}")
    if f.shape[0] != labels.shape[0]:
        raise InvalidArgumentError(
            f"{op}: logits and labels must have the same first dimension, got logits shape "
            f"{shape_str(f.shape)} and labels shape {shape_str(labels.shape)}")
    if f.shape[1] == 0:
        raise InvalidArgumentError(f"{op}: Must have at least one class, but got logits "
                                   f"shape {shape_str(f.shape)}")
    return {"loss": (f.shape[0],), "backprop": tuple(f.shape)}


def check_labels(op: str, labels: np.ndarray, classes: int) -> None:
    """TF's CheckInvalidLabelIndex: the first label outside [0, classes), then them all."""
    bad = (labels < 0) | (labels >= classes)
    if bad.any():
        first = int(labels[np.argmax(bad)])
        values = " ".join(str(int(v)) for v in labels)
        raise InvalidArgumentError(
            f"{op}: Received a label value of {first} which is outside the valid range of "
            f"[0, {classes}).  Label values: {values}")


# --------------------------------------------------------------------------------------
# The NumPy reference
# --------------------------------------------------------------------------------------
def _packet_mask(first: int, n: int, mask: np.ndarray, base: int) -> None:
    """Which of the flat values [first, first + n) Eigen's tree loads as packets: in each
    leaf, all but the last (length % 8)."""
    if n <= LEAF:
        mask[first - base:first - base + (n // 8) * 8] = True
        return
    at = split(first, n)
    nl = min(at - first, n)
    _packet_mask(first, nl, mask, base)
    _packet_mask(at, n - nl, mask, base)


def reference(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b, c = features.shape
    x = ftz(features)
    with np.errstate(all="ignore"):
        mx = x.max(axis=1) if c else np.zeros(b, F32)  # (NaN-propagating: any NaN row is NaN)
        shifted = ftz(x - mx[:, None])
        sums = np.empty(b, F32)
        for i in range(b):
            mask = np.zeros(c, bool)
            _packet_mask(i * c, c, mask, i * c)
            e = pexp(shifted[i])
            e[~mask] = expf(shifted[i][~mask])  # the leaves' scalar tails
            sums[i] = full_sum(e, i * c)
        rows = np.arange(b)
        loss = ftz(logf(sums) - shifted[rows, labels.astype(np.int64)])
        flat = shifted.reshape(-1)
        n8 = (flat.size // 8) * 8
        e = np.concatenate([pexp(flat[:n8]), expf(flat[n8:])]).reshape(b, c)
        onehot = (np.arange(c)[None, :] == labels.astype(np.int64)[:, None]).astype(F32)
        backprop = ftz(ftz(e / sums[:, None]) - onehot)
    return loss.astype(F32), backprop.astype(F32)


# --------------------------------------------------------------------------------------
# The op
# --------------------------------------------------------------------------------------
def SparseSoftmaxCrossEntropyWithLogits(*, features: np.ndarray, labels: np.ndarray
                                        ) -> tuple[np.ndarray, np.ndarray]:
    op = "SparseSoftmaxCrossEntropyWithLogits"
    check(op, {"features": features, "labels": labels})
    b, c = features.shape
    if b == 0:
        return np.empty(0, F32), np.empty((0, c), F32)
    check_labels(op, labels, c)
    if _config.use_reference():
        return reference(features, labels)
    return _dispatch().xent(features, labels)
