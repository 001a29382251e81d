"""How far an output is from TF's: the measure the portable (torch) and native (JAX)
implementations document and their tests bound.

``distance(actual, expected)`` is the largest ``|actual - expected|`` over the elements, in
units in the last place of the largest finite ``|expected|`` of that output (its dtype's
ulp there): 0 for equal values, 1 for a difference of one step at the top of the output's
range. Sums in another order differ by a few such ulps however small the element, so this
measures them fairly where an elementwise ulp distance would blow up near zero. Special
values must agree exactly: a NaN, an infinity or an integer that differs is ``inf``.
Zero signs and NaN payloads are not compared (``bit_identical`` compares everything).
"""

from __future__ import annotations

import math

import numpy as np


def _ulp(dtype: np.dtype, magnitude: float) -> float:
    """The spacing of ``dtype``'s values at ``magnitude`` (its smallest normal's at 0)."""
    import ml_dtypes

    info = ml_dtypes.finfo(dtype)
    m = max(float(magnitude), float(info.tiny))
    exp = np.floor(np.log2(m))
    return float(2.0 ** (exp - info.nmant))


def distance(actual: np.ndarray, expected: np.ndarray) -> float:
    """Largest difference in ulps of the output's largest finite |expected| (see above)."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape or a.dtype != e.dtype:
        raise ValueError(f"shapes/dtypes differ: {a.shape} {a.dtype} vs {e.shape} {e.dtype}")
    if a.size == 0:
        return 0.0
    if a.dtype.kind in "iub":
        return 0.0 if np.array_equal(a, e) else float("inf")
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    nan_a, nan_e = np.isnan(a64), np.isnan(e64)
    if not np.array_equal(nan_a, nan_e):
        return float("inf")
    inf_e = np.isinf(e64)
    if not np.array_equal(a64[inf_e], e64[inf_e]) or np.isinf(a64[~inf_e]).any():
        return float("inf")
    finite = ~(nan_e | inf_e)
    if not finite.any():
        return 0.0
    diff = np.abs(a64[finite] - e64[finite]).max()
    return float(diff / _ulp(a.dtype, np.abs(e64[finite]).max()))


def bit_identical(actual: np.ndarray, expected: np.ndarray) -> bool:
    """Same dtype, shape and bits (any NaN matches any NaN)."""
    a, e = np.ascontiguousarray(actual), np.ascontiguousarray(expected)
    if a.shape != e.shape or a.dtype != e.dtype:
        return False
    if a.dtype.kind in "iub":
        return bool(np.array_equal(a, e))
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    nan = np.isnan(a.astype(np.float64)) & np.isnan(e.astype(np.float64))
    return bool(((a.view(bits) == e.view(bits)) | nan).all())


Bounds = dict[str, dict[str, dict[str, float]]]
"""op -> output name -> output dtype -> the largest distance allowed (0: bit-identical)."""


def bounds_by_output(ops: tuple[str, ...], per_output: dict[str, dict[str, float]]) -> Bounds:
    """The same bounds (output name -> dtype -> bound) for several ops (e.g. the versions
    of one op), keeping for each op the outputs and dtypes it has."""
    from ._opdefs import get_op_def

    out: Bounds = {}
    for name in ops:
        op = get_op_def(name)
        out[name] = {}
        for o in op.outputs:
            dtypes = (o.dtype,) if o.dtype else op.type_attr(o.type_attr).allowed
            out[name][o.name] = {t: b for t, b in per_output[o.name].items() if t in dtypes}
    return out


def sum_bound(bound: float, count: int, measured_up_to: int) -> float:
    """A bound on an output that sums ``count`` values, from one measured on sums of up to
    ``measured_up_to``: two summation orders part by rounding errors that grow about as
    the square root of the count (a random walk of one-ulp steps)."""
    return bound * max(1.0, math.sqrt(count / measured_up_to))
