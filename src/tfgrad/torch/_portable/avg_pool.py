"""AvgPool and AvgPoolGrad in torch tensor ops, on any device (TF 2.21's semantics; the
spec is :mod:`tfgrad.ops.avg_pool`, TF's behaviours docs/avg_pool.md).

TF's arithmetic, one elementwise operation at a time, so the bits are TF's wherever
torch's elementwise float operations round once (the CPU; CUDA's IEEE add, multiply and
divide): AvgPool adds the padded input's strided slices for each window offset in
row-major order onto +0, skipping the padding cells (a flushed sum can be -0, which
adding a +0 would change), then divides by TF's counts in T; AvgPoolGrad multiplies
grad by TF's coefficients in T, then adds the products into a zeroed padded dx for the
window offsets from the last to the first (the outputs' row-major order), and cuts the
padding off. Denormals are flushed after each operation as TF's FTZ / DAZ (float32,
float64 and bfloat16; not half, whose denormals are normal float32s).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from ...ops import avg_pool as _ap

# Largest distance from the exact kernels (tfgrad._distance), op -> output -> dtype:
# TF's operations in TF's order, bit-identical (measured over the case table).
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    op: {"output": {dt: 0 for dt in ("float32", "float64", "float16", "bfloat16")}}
    for op in ("AvgPool", "AvgPoolGrad")
}
NOTES: dict[str, str] = {}


def _ftz(v: torch.Tensor) -> torch.Tensor:
    """Denormals to zeros of their sign (TF's FTZ / DAZ); NaN and inf unchanged."""
    if v.dtype == torch.float16:
        return v
    tiny = float(np.finfo(np.float64 if v.dtype == torch.float64 else np.float32).tiny)
    return torch.where(v.abs() < tiny, v * 0, v)


def _np_dtype(dt: torch.dtype) -> np.dtype:
    return np.dtype({torch.float32: np.float32, torch.float64: np.float64,
                     torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}[dt])


def _table(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A [OH, OW] table in T as a [1, OH, OW, 1] tensor on the input's device."""
    t = torch.from_numpy(np.ascontiguousarray(a).astype(np.float64))
    return t.to(device=like.device, dtype=like.dtype)[None, :, :, None]


def AvgPool(*, value: torch.Tensor, ksize: tuple[int, ...], strides: tuple[int, ...],
            padding: str, data_format: str = "NHWC") -> torch.Tensor:
    geo = _ap.geometry_of(tuple(value.shape), ksize, strides, padding)
    if geo.N * geo.OH * geo.OW * geo.C == 0:
        return value.new_zeros((geo.N, geo.OH, geo.OW, geo.C))
    xp = value.new_zeros(_ap.padded_shape(geo))
    xp[:, geo.PT:geo.PT + geo.H, geo.PL:geo.PL + geo.W] = _ftz(value)
    inside = torch.from_numpy(_ap.inside(geo)).to(value.device)
    acc = value.new_zeros((geo.N, geo.OH, geo.OW, geo.C))
    for dr in range(geo.KH):
        for dc in range(geo.KW):
            rs, cs = _ap.taps(geo, dr, dc)
            acc = torch.where(inside[rs, cs][None, :, :, None], _ftz(acc + xp[:, rs, cs]), acc)
    counts = _ap.counts(geo, _np_dtype(value.dtype)).astype(np.float64)  # (exact in T)
    return _ftz(acc / _table(counts, value))


def AvgPoolGrad(*, orig_input_shape: tuple[int, ...], grad: torch.Tensor,
                ksize: tuple[int, ...], strides: tuple[int, ...], padding: str,
                data_format: str = "NHWC") -> torch.Tensor:
    shape = tuple(int(v) for v in orig_input_shape)
    if int(np.prod(shape)) == 0:
        return grad.new_zeros(shape)
    geo = _ap.geometry_of(shape, ksize, strides, padding)
    if geo.OH * geo.OW == 0:
        return grad.new_zeros(shape)
    coeff = _ap.coefficients(geo, _np_dtype(grad.dtype)).astype(np.float64)
    prod = _ftz(grad * _table(coeff, grad))
    dxp = grad.new_zeros(_ap.padded_shape(geo))
    for dr in reversed(range(geo.KH)):
        for dc in reversed(range(geo.KW)):
            rs, cs = _ap.taps(geo, dr, dc)
            dxp[:, rs, cs] = _ftz(dxp[:, rs, cs] + prod)
    return dxp[:, geo.PT:geo.PT + geo.H, geo.PL:geo.PL + geo.W].clone()
