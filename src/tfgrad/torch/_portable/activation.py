"""Relu, Relu6 and their gradients in torch tensor ops, on any device.

The rules of :mod:`tfgrad.ops.activation`'s NumPy reference (the spec; docs/activation.md),
on the values' bit patterns viewed as signed integers of the float's width: TF's outputs
are always an input's bits, a zero, six or a NaN, chosen by comparisons that read
denormals as zeros (DAZ) and differ between Eigen's packet body and its scalar tail, so
integer selects reproduce them exactly on any device, whatever its floating-point
environment. Bit-identical to the exact kernels for every float type (BOUNDS: 0).
"""

from __future__ import annotations

import torch

from ..._tf.relu import CANONICAL, FORMATS, QUIET, SELECT, SIGNED, kinds

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    op: {out: {dt: 0 for dt in ("float32", "float64", "bfloat16", "float16")}}
    for op, out in (("Relu", "activations"), ("Relu6", "activations"),
                    ("ReluGrad", "backprops"), ("Relu6Grad", "backprops"))
}
NOTES: dict[str, str] = {}

_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
        torch.float16: torch.int16}
_NAME = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
         torch.float16: "float16"}


def _signed(v: int, bits: int) -> int:
    """The unsigned pattern ``v`` as the signed integer of ``bits`` bits."""
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def _flat_index(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, device=device)


def _forward(x: torch.Tensor, relu6: bool) -> torch.Tensor:
    fmt = FORMATS[_NAME[x.dtype]]
    u = x.contiguous().reshape(-1).view(_INT[x.dtype])
    bits = u.element_size() * 8
    low = (1 << (bits - 1)) - 1
    sign = _signed(fmt.sign, bits)
    zero = torch.zeros((), dtype=u.dtype, device=u.device)
    mag = u & low
    neg = u < 0
    small = mag < fmt.normal if fmt.daz else mag == 0
    body = torch.where(~neg & ~small, u, zero)                     # maxps(x, 0)
    select = torch.where(neg & ~small, zero, u)                    # x < 0 ? 0 : x
    pair = torch.where(neg & ~small, zero, torch.where(small, u & sign, u))
    end, kb, kf, kt = kinds(u.numel(), fmt, relu6)
    by_kind = {0: body, SELECT: select, 2: pair}
    i = _flat_index(u.numel(), u.device)
    out = torch.where(i < end, by_kind[kb], torch.where(i == end, by_kind[kf], by_kind[kt]))
    if relu6:
        out = torch.where((out >= 0) & (out > fmt.six), torch.full_like(out, fmt.six), out)
    out = torch.where(mag > fmt.inf, u, out)
    return out.view(x.dtype).reshape(x.shape)


def _backward(g: torch.Tensor, f: torch.Tensor, relu6: bool) -> torch.Tensor:
    fmt = FORMATS[_NAME[f.dtype]]
    it = _INT[f.dtype]
    gu = g.contiguous().reshape(-1).view(it)
    fu = f.contiguous().reshape(-1).view(it)
    bits = fu.element_size() * 8
    low = (1 << (bits - 1)) - 1
    sign = _signed(fmt.sign, bits)
    fmag, gmag = fu & low, gu & low
    pos = (fu >= 0) & (fmag <= fmt.inf) & (fmag >= fmt.normal if fmt.daz else fmag != 0)
    if relu6:
        pos = pos & (fmag < fmt.six)
    gs = gu & sign
    canon = fmt.inf | fmt.quiet
    n = fu.numel()
    end = n - n % fmt.packet if fmt.packet else n
    i = _flat_index(n, fu.device)

    def mode_of(m: int) -> torch.Tensor:
        return (torch.where(i < end, fmt.body_nan, fmt.tail_nan) == m)

    kept = torch.where(gmag < fmt.normal, gs, gu) if fmt.daz else gu
    full = torch.full_like(gu, _signed(fmt.sign | canon, bits))
    default_nan = torch.where(mode_of(CANONICAL), torch.full_like(gu, canon), full)
    out = torch.where(pos, kept, torch.where(gmag == fmt.inf, default_nan, gs))
    nan = torch.where(mode_of(QUIET), gu | fmt.quiet,
                      torch.where(mode_of(SIGNED), gs | canon, torch.full_like(gu, canon)))
    out = torch.where(gmag > fmt.inf, nan, out)
    return out.view(f.dtype).reshape(f.shape)


def Relu(*, features: torch.Tensor) -> torch.Tensor:
    return _forward(features, False)


def Relu6(*, features: torch.Tensor) -> torch.Tensor:
    return _forward(features, True)


def ReluGrad(*, gradients: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    return _backward(gradients, features, False)


def Relu6Grad(*, gradients: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    return _backward(gradients, features, True)
