"""Sum and Mean in torch tensor ops, on any device (TF 2.21's semantics; the spec is
:mod:`tfgrad.ops.reduction`, TF's behaviours docs/reduction.md).

TF's plan is followed exactly (:func:`tfgrad.ops.reduction.make_plan`): nothing reduced
copies the input (-0 and denormals survive), an empty input gives 0 (Sum) or NaN (Mean),
inputs are read with DAZ, and Mean divides the float32 sum by the float32 count (a tensor,
so that no device turns it into a multiplication by a reciprocal), flushed as TF's FTZ.
The sums themselves are ``torch.sum`` in float32: torch's order, not Eigen's tree, lanes
and shards (see BOUNDS); their gradient (a broadcast, divided by the count for Mean, as
TF's _SumGrad / _MeanGrad) is exact.
"""

from __future__ import annotations

import numpy as np
import torch

from ...ops import reduction as _r

_TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype:
# torch's summation order against Eigen's, within 2.4 U * sum(|terms|) (U = 2**-24),
# thousands of ulps of the largest output where the terms cancel.
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "Sum": {"output": {"float32": 8192}},
    "Mean": {"output": {"float32": 8192}},
}

NOTES: dict[str, str] = {
    "Sum": "Summed in torch's order, not Eigen's (tree, lanes, TF's thread split).",
    "Mean": "Summed in torch's order, not Eigen's (tree, lanes, TF's thread split); "
    "then divided by the float32 count as TF.",
}


def _ftz(v: torch.Tensor) -> torch.Tensor:
    """Denormals to zero (TF's FTZ / DAZ); NaN and inf unchanged. Straight through for
    autograd: TF's gradient (a broadcast) does not depend on the values, so the flush
    must not zero it."""
    d = v.detach()
    return torch.where(d.abs() < _TINY, (v - d) + d * 0.0, v)


def _reduce(name: str, x: torch.Tensor, axis: tuple[int, ...], keep_dims: bool,
            mean: bool) -> torch.Tensor:
    plan = _r.make_plan(name, tuple(x.shape), tuple(int(a) for a in axis), bool(keep_dims))
    if plan.kind == "copy":
        return x.reshape(plan.out_shape).clone()
    if plan.kind in ("empty", "identity"):
        fill = float("nan") if mean and plan.kind == "identity" else 0.0
        return torch.full(plan.out_shape, fill, dtype=x.dtype, device=x.device)
    rank = x.dim()
    dims = sorted({(int(a) + rank) % rank for a in axis})
    s = _ftz(torch.sum(_ftz(x), dim=dims, keepdim=keep_dims))
    if mean:
        s = _ftz(s / torch.tensor(np.float32(plan.count), device=x.device))
    return s.reshape(plan.out_shape)


def Sum(*, input: torch.Tensor, axis: tuple[int, ...], keep_dims: bool = False  # noqa: A002
        ) -> torch.Tensor:
    return _reduce("Sum", input, axis, keep_dims, mean=False)


def Mean(*, input: torch.Tensor, axis: tuple[int, ...], keep_dims: bool = False  # noqa: A002
         ) -> torch.Tensor:
    return _reduce("Mean", input, axis, keep_dims, mean=True)
