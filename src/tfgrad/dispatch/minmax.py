"""tfmot's batch ranges with TF's bits on the compiled kernels (``tfgrad.kernels.minmax``):
one pass, and TF's order (``tfgrad._tf.minmax``) only where it decides. No raw op runs
them: the QAT adapters pass :func:`batch_range` to ``tfgrad.qat._exec`` and call it in
their eager quantizers (docs/qat.md)."""

from __future__ import annotations

import numpy as np

from .._tf import minmax as _minmax
from ..kernels import minmax as k

_F32 = np.float32


def batch_range(x: np.ndarray, per_axis: bool) -> tuple[np.ndarray, np.ndarray]:
    """tfmot's batch range of ``x`` (reduce_min / reduce_max over all axes, or all but the
    last) with TF's bits: one compiled pass, and TF's order where the order decides, a
    tie of +0 and -0 or a NaN. Other float types: NumPy's min / max."""
    if x.dtype != _F32:
        return _minmax.numpy_batch_range(x, per_axis)
    c = x.shape[-1] if per_axis and x.ndim >= 2 else 1
    if x.size == 0 or (per_axis and (x.ndim < 2 or x.size == c)):
        return _minmax.batch_range(x, per_axis)  # (empty, or nothing to reduce)
    v = np.ascontiguousarray(x).view(np.int32)
    if c == 1:  # (per tensor, or a single channel: a full reduction in TF)
        lo, hi, ok = k.range_all(v.reshape(-1))
        if not ok:
            return _minmax.batch_range(x, per_axis)
        pair = np.array([lo, hi], np.int32).view(_F32)
        return (pair[:1], pair[1:]) if per_axis else (pair[:1].reshape(()), pair[1:].reshape(()))
    out = np.empty((4, c), np.int32)
    lo_ok, hi_ok = k.range_rows(v.reshape(-1, c), out)
    vals = out[:2].view(_F32)
    rows = v.reshape(-1, c).view(_F32)
    return (vals[0] if lo_ok else _minmax.reduce_rows(rows, False),
            vals[1] if hi_ok else _minmax.reduce_rows(rows, True))
