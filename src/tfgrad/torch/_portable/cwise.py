"""SquaredDifference, Rsqrt and RsqrtGrad in torch tensor ops, on any device.

TF's arithmetic (tfgrad.ops.cwise, the spec; docs/cwise.md) with its FTZ / DAZ written out
(denormal operands read as zeros, denormal results flushed; torch does not flush), each
operation one IEEE operation of T (the half types computed in float32 and rounded after
each, as Eigen does; bfloat16 NaN results as Eigen's conversions give them):
SquaredDifference and RsqrtGrad are bit-identical to the exact kernels. Rsqrt's packet
body is Eigen's approximate prsqrt (the processor's rsqrtps): here the exact 1 / sqrt,
an ulp or two away (BOUNDS); its scalar tail is exact.

SquaredDifference's derivative is TF's ``_SquaredDifferenceGrad`` (math_grad.py):
``x_grad = (2 * grad) * (x - y)``, summed over each input's broadcast axes with
``tfgrad.torch.sum`` (TF's Sum: its bits on CPU, for float32) and reshaped; y's gradient
negated. Rsqrt's is the RsqrtGrad op (the gradient table).
"""

from __future__ import annotations

from typing import Any

import torch

_FLOATS = ("float32", "float64", "float16", "bfloat16")
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "SquaredDifference": {"z": {dt: 0 for dt in _FLOATS}},
    "RsqrtGrad": {"z": {dt: 0 for dt in _FLOATS}},
    "Rsqrt": {"y": {"float32": 4, "float64": 2, "float16": 1, "bfloat16": 1}},
}
NOTES: dict[str, str] = {
    "Rsqrt": "the exact 1 / sqrt where TF's packets take the processor's rsqrtps and a "
    "Newton step: up to 4 ulps in float32 (2 on an AMD EPYC, 4 on an Intel Xeon with "
    "AVX-512: the processors' approximations differ), 1 in the half types (after "
    "rounding); float64 (exact in TF): torch's CPU sqrt of float64 is not correctly "
    "rounded: 2 ulps.",
}

_PACKET = {torch.float32: 8, torch.float64: 4, torch.float16: 8, torch.bfloat16: 8}
_TINY = {torch.float32: 1.1754943508222875e-38, torch.float64: 2.2250738585072014e-308}


def _ftz(v: torch.Tensor) -> torch.Tensor:
    """Denormals of a float32 / float64 tensor as zeros of their sign (FTZ / DAZ)."""
    return torch.where(v.abs() < _TINY[v.dtype], v * 0, v)


def _body(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.arange(n, device=device) < n - n % _PACKET[dtype]


class _T:
    """One dtype's arithmetic: compute type, reading (DAZ) and rounding (to T, FTZ)."""

    def __init__(self, dtype: torch.dtype, body: torch.Tensor | None) -> None:
        self.dtype, self.body = dtype, body
        self.half = dtype in (torch.float16, torch.bfloat16)
        self.ct = torch.float32 if self.half else dtype

    def read(self, a: torch.Tensor) -> torch.Tensor:
        v = a.to(self.ct)
        return v if self.dtype == torch.float16 else _ftz(v)  # (half denormals: normal)

    def round(self, v: torch.Tensor) -> torch.Tensor:
        """One result rounded to T (FTZ first: the float32 operation flushed), back in
        the compute type."""
        v = _ftz(v)
        if not self.half:
            return v
        r = v.to(self.dtype)
        if self.dtype == torch.bfloat16 and self.body is not None:
            # Eigen's conversions of NaN: canonical in packets, sign | 0x7fc0 in scalars
            neg = torch.signbit(v)
            nan = torch.where(self.body.reshape(v.shape) | ~neg,
                              torch.tensor(float("nan"), dtype=self.dtype, device=v.device),
                              torch.tensor(-float("nan"), dtype=self.dtype, device=v.device))
            r = torch.where(torch.isnan(v), nan, r)
        return r.to(self.ct)


def _bf16_nan_bits(r: torch.Tensor, v: torch.Tensor, body: torch.Tensor) -> torch.Tensor:
    """bfloat16 results with TF's NaN bits (0x7fc0 in packets, sign | 0x7fc0 in scalars)."""
    bits = r.view(torch.int16)
    sign = torch.signbit(v) & ~body
    canon = torch.where(sign, torch.tensor(-64, dtype=torch.int16, device=r.device),  # 0xffc0
                        torch.tensor(0x7FC0, dtype=torch.int16, device=r.device))
    return torch.where(torch.isnan(v), canon, bits).view(torch.bfloat16)


def _out(v: torch.Tensor, ar: _T) -> torch.Tensor:
    """The final compute-type values as T, with TF's NaN bits."""
    r = v.to(ar.dtype)
    if ar.dtype == torch.bfloat16 and ar.body is not None:
        return _bf16_nan_bits(r, v, ar.body.reshape(v.shape))
    return r


def _squared_difference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(x.shape, y.shape)
    n = 1
    for s in shape:
        n *= s
    ar = _T(x.dtype, _body(n, x.dtype, x.device).reshape(shape))
    a, b = ar.read(x), ar.read(y)
    d = ar.round(a - b)
    return _out(_ftz(d * d), ar)


def _reduce_to(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """TF's reshape(reduce_sum(g, broadcast axes), shape): tfgrad's Sum for float32."""
    lead = g.dim() - len(shape)
    axes = list(range(lead)) + [lead + i for i, s in enumerate(shape)
                                if s == 1 and g.shape[lead + i] != 1]
    if not axes:
        return g.reshape(shape)
    if g.dtype == torch.float32:
        from .. import sum as tf_sum  # (tfgrad.torch: TF's Sum on CPU, portable elsewhere)

        return tf_sum(g, axes).reshape(shape)
    return g.sum(dim=axes).reshape(shape)


class _SquaredDifference(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return _squared_difference(x, y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, y = ctx.saved_tensors
        # x_grad = scalar_mul(2.0, grad) * (x - y): Mul, Sub, Mul, each rounded to T
        ar = _T(grad.dtype, None)
        two = ar.round(2 * ar.read(grad))
        d = ar.round(ar.read(x) - ar.read(y))
        xg = ar.round(two * d).to(grad.dtype)
        gx = _reduce_to(xg, x.shape) if ctx.needs_input_grad[0] else None
        gy = -_reduce_to(xg, y.shape) if ctx.needs_input_grad[1] else None
        return gx, gy


def SquaredDifference(*, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _SquaredDifference.apply(x, y)


def Rsqrt(*, x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    flat = x.reshape(-1)
    ar = _T(x.dtype, _body(n, x.dtype, x.device))
    v = ar.read(flat)
    one = torch.ones_like(v)  # (a tensor division: torch's 1 / t is not correctly rounded)
    if not ar.half:
        return _ftz(one / torch.sqrt(v)).to(x.dtype).reshape(x.shape)
    # the tail rounds sqrt to T first; the body is float32's prsqrt (here exact) rounded once
    tail = one / ar.round(torch.sqrt(v))
    body = one / torch.sqrt(v)
    return _out(torch.where(ar.body, body, tail), ar).reshape(x.shape)


def RsqrtGrad(*, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    n = y.numel()
    ar = _T(y.dtype, _body(n, y.dtype, y.device))
    a, g = ar.read(y.reshape(-1)), ar.read(dy.reshape(-1))
    zero = torch.zeros((), dtype=ar.ct, device=a.device)
    yy = ar.round(a * a)
    # packets: mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy)); scalars: dy == 0 ? 0 :
    # (-0.5 * (dy * y)) * (y * y)
    t = torch.where(g == 0, zero, ar.round(a * g))
    packet = torch.where(t == 0, zero, ar.round(ar.round(-0.5 * yy) * t))
    scalar = torch.where(g == 0, zero, ar.round(ar.round(-0.5 * ar.round(g * a)) * yy))
    return _out(torch.where(ar.body, packet, scalar), ar).reshape(y.shape)
