"""SparseSoftmaxCrossEntropyWithLogits on the compiled kernel
(``tfgrad.kernels.softmax_xent``): contiguous float32 logits, int64 labels, row blocks."""

from __future__ import annotations

import numpy as np

from .._compile import launch
from ..kernels import softmax_xent as k

F32 = np.float32
_FAMILY = "softmax_xent"


def xent(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(loss, backprop) of checked inputs (at least one row and one class, valid labels)."""
    b, c = features.shape
    x = np.ascontiguousarray(features, F32)
    lab = np.ascontiguousarray(labels, np.int64)
    loss = np.empty(b, F32)
    backprop = np.empty(b * c, F32)
    launch(_FAMILY, k.xent, x.size, x.reshape(-1), lab, loss, backprop, b, c,
           units=-(-b // 16))
    return loss, backprop.reshape(b, c)
