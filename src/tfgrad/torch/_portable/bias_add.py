"""BiasAdd, BiasAddGrad and Identity in torch tensor ops, on any device.

BiasAdd follows :mod:`tfgrad.ops.bias_add`'s reference (the spec; docs/bias_add.md): one
addition per value with TF's FTZ / DAZ explicit (operands and sum flushed) and x86's
choice of NaN (value's, else bias's), so it is bit-identical to the exact kernels.
BiasAddGrad is ``torch.sum`` over the non-channel dimensions: float sums in torch's
order, not TF's blocks (nor its thread-count-dependent split), partial sums not flushed
(see BOUNDS). Identity is a copy.
"""

from __future__ import annotations

import torch

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "BiasAdd": {"output": {"float32": 0, "float64": 0}},
    # torch's summation order: within a few units of rounding of sum(|terms|), which is
    # up to thousands of ulps of a sum whose terms cancel
    "BiasAddGrad": {"output": {"float32": 8192, "float64": 8192}},
    "Identity": {"output": {dt: 0 for dt in ("float16", "bfloat16", "float32", "float64")}},
}
NOTES: dict[str, str] = {
    "BiasAddGrad": "summed in torch's order, not TF's ReduceOuterDimensions / "
    "ReduceMiddleDimensions blocks (which depend on TF's thread count).",
}


def _ftz(v: torch.Tensor) -> torch.Tensor:
    """Denormals to zeros of their sign (TF's FTZ / DAZ); NaN and inf unchanged."""
    return torch.where(v.abs() < torch.finfo(v.dtype).tiny, v * 0.0, v)


def _shape(ndim: int, c: int, data_format: str) -> list[int]:
    shape = [1] * ndim
    shape[1 if data_format == "NCHW" else ndim - 1] = c
    return shape


def BiasAdd(*, value: torch.Tensor, bias: torch.Tensor, data_format: str) -> torch.Tensor:
    b = bias.reshape(_shape(value.dim(), bias.shape[0], data_format))
    s = _ftz(_ftz(value) + _ftz(b))
    # x86's NaN: the first operand's (value), else the second's, quietened (x + x)
    return torch.where(value.isnan(), value + value, torch.where(b.isnan(), b + b, s))


def BiasAddGrad(*, out_backprop: torch.Tensor, data_format: str) -> torch.Tensor:
    axis = 1 if data_format == "NCHW" else out_backprop.dim() - 1
    dims = [d for d in range(out_backprop.dim()) if d != axis]
    return _ftz(out_backprop).sum(dims) if dims else out_backprop.clone()


def Identity(*, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - TF's name
    return input.clone()
