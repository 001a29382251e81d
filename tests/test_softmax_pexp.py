"""The vectorised pexp of the Softmax / SparseSoftmaxCrossEntropyWithLogits kernels
(``tfgrad.kernels.softmax_pexp.vpexp``) against Eigen's pexp, the NumPy model
(``tfgrad._tf.expf.pexp``), and the kernels' one-lane ``_pexp``.

All 2**32 float32 inputs were compared once (bit-identical, 40 s on two cores); here a
stride through every bit pattern, every value near the places where the range reduction
``m`` changes and the scaling leaves the normal range, and the special values."""

from __future__ import annotations

import numba
import numpy as np

from tfgrad._distance import bit_identical
from tfgrad._tf.expf import EXP_HI, EXP_LO, LOG2EF, pexp
from tfgrad._tf.mxcsr import ftz_enter, ftz_exit
from tfgrad.kernels._simd import vload, vstore
from tfgrad.kernels.softmax_pexp import vpexp
from tfgrad.kernels.softmax_xent import _pexp

F32 = np.float32


@numba.njit
def _vector(x, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    fz = ftz_enter()
    for k in range(0, x.size, 16):
        vstore(out, k, vpexp(vload(x, k)))
    ftz_exit(fz)


@numba.njit
def _lane(x, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    fz = ftz_enter()
    for k in range(x.size):
        out[k] = _pexp(x[k])
    ftz_exit(fz)


def _around(v: float, ulps: int) -> np.ndarray:
    """The float32 values within ``ulps`` of v."""
    bits = np.array([v], F32).view(np.int32)[0]
    return (np.arange(bits - ulps, bits + ulps + 1, dtype=np.int64).astype(np.int32)
            .view(F32))


def _inputs() -> np.ndarray:
    stride = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(F32)
    edges = [_around(float(EXP_LO), 64), _around(float(EXP_HI), 64)]
    for m in list(range(-152, -122)) + list(range(124, 130)):  # where floor(x*log2e+.5) steps
        v = float(F32((m - 0.5) / float(LOG2EF)))
        if v != 0:
            edges.append(_around(v, 64))
            edges.append(_around(-v, 64))
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-39,
                        -1e-39, 1.1754942e-38, -1.1754942e-38, 3.4028235e38, -3.4028235e38,
                        88.72283, 88.72284, -87.33655, -103.97208, -104.0], F32)
    x = np.concatenate([stride, *edges, special]).astype(F32)
    pad = -x.size % 16
    return np.concatenate([x, np.zeros(pad, F32)])


def test_vpexp_is_eigens_pexp():
    x = _inputs()
    vec = np.empty_like(x)
    lane = np.empty_like(x)
    _vector(x, vec)
    _lane(x, lane)
    with np.errstate(all="ignore"):  # (the stride's signalling NaNs)
        model = pexp(x)
        assert bit_identical(vec, model)
        assert bit_identical(lane, model)
