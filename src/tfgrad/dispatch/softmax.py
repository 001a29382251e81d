"""Softmax on the compiled kernel (``tfgrad.kernels.softmax``): contiguous float32 logits
as [rows, classes], row blocks."""

from __future__ import annotations

import numpy as np

from .._compile import launch
from .._tf.expf import SOFTMAX_BLOCK as BLOCK
from ..kernels import softmax as k

F32 = np.float32
_FAMILY = "softmax"


def softmax(logits: np.ndarray) -> np.ndarray:
    """The softmax of checked, non-empty logits over the last axis."""
    shape = logits.shape
    x = np.ascontiguousarray(logits, F32).reshape(-1, shape[-1])
    rows, c = x.shape
    out = np.empty(x.size, F32)
    launch(_FAMILY, k.softmax, x.size, x.reshape(-1), out, rows, c, BLOCK,
           units=-(-rows // 16))
    return out.reshape(shape)
