"""MatMul in jax.numpy, for any XLA backend: ``jnp.matmul`` at HIGHEST precision on
denormal-flushed operands (TF's DAZ), the product flushed (FTZ).

Not TF's summation order (Eigen's k-blocks, oneDNN's FMA chains and K passes: see
:mod:`tfgrad._tf.contraction`): XLA's dot. BOUNDS holds the distance measured on the case
table (tfgrad._distance: ulps of the output's largest magnitude).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

Array = Any

_TINY = float(np.finfo(np.float32).tiny)

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "MatMul": {"product": {"float32": 64}},  # measured: 18 (torch CPU), 28 (JAX CPU)
}
NOTES: dict[str, str] = {
    "MatMul": "XLA's dot: sums in its order, not Eigen's k-blocks and oneDNN's FMA chains "
    "(which depend on TF's thread count and processor).",
}


def _ftz(v: Array) -> Array:
    """Denormals to zeros of their sign (TF's FTZ / DAZ); NaN and inf unchanged."""
    return jnp.where(jnp.abs(v) < _TINY, v * 0.0, v)


def MatMul(*, a: Array, b: Array, transpose_a: bool, transpose_b: bool,
           grad_a: bool = False, grad_b: bool = False) -> Array:
    x = _ftz(a.T if transpose_a else a)
    y = _ftz(b.T if transpose_b else b)
    return _ftz(jnp.matmul(x, y, precision=lax.Precision.HIGHEST))
