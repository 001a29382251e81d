"""MatMul in torch tensor ops, on any device: ``torch.matmul`` on denormal-flushed
operands (TF's DAZ), the product flushed (FTZ).

Not TF's summation order (Eigen's k-blocks, oneDNN's FMA chains and K passes: see
:mod:`tfgrad._tf.contraction`): the device's own GEMM, in float32 (TF32 must stay off:
``torch.backends.cuda.matmul.allow_tf32``). BOUNDS holds the distance measured on the
case table (tfgrad._distance: ulps of the output's largest magnitude).
"""

from __future__ import annotations

import numpy as np
import torch

_TINY = float(np.finfo(np.float32).tiny)

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype.
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "MatMul": {"product": {"float32": 64}},  # measured: 18 (torch CPU), 28 (JAX CPU)
}
NOTES: dict[str, str] = {
    "MatMul": "the device's GEMM: sums in its order, not Eigen's k-blocks and oneDNN's "
    "FMA chains (which depend on TF's thread count and processor).",
}


def _ftz(v: torch.Tensor) -> torch.Tensor:
    """Denormals to zeros of their sign (TF's FTZ / DAZ); NaN and inf unchanged."""
    return torch.where(v.abs() < _TINY, v * 0.0, v)


def MatMul(*, a: torch.Tensor, b: torch.Tensor, transpose_a: bool, transpose_b: bool,
           grad_a: bool = False, grad_b: bool = False) -> torch.Tensor:
    x = _ftz(a.T if transpose_a else a)
    y = _ftz(b.T if transpose_b else b)
    return _ftz(torch.matmul(x, y))
