"""Softmax in torch operations (any device): TF's order (max, shifted, exp, row sum,
reciprocal, one multiply) with torch's exp and sum: a few ulps from TF (BOUNDS); the exact
path (CPU) is ``tfgrad.ops.softmax``.

Its derivative is TF's ``_SoftmaxGrad`` (nn_grad.py), the composite
``(grad - sum(grad * softmax, -1, keepdims=True)) * softmax`` of TF ops: ``softmax`` is
recomputed by ``tfgrad.torch.softmax`` and the sum is ``tfgrad.torch.sum``, both TF's
bits on CPU (the exact kernels), and the multiplies and the subtraction are single
float32 roundings flushed as TF's FTZ: on CPU the first-order gradient is TF's tape's
bits. Both are tfgrad operators, so the gradient is itself differentiable (the Softmax
op's LINEARISED entry differentiates this function with torch's autograd).
"""

from __future__ import annotations

from typing import Any

import torch

_TINY = 1.1754943508222875e-38

BOUNDS: dict[str, dict[str, dict[str, float]]] = {"Softmax": {"softmax": {"float32": 8}}}

NOTES: dict[str, str] = {
    "Softmax": "torch's exp and sum order, and an exact reciprocal where TF uses rcpps and "
    "a Newton step: a few ulps.",
}


def _ftz(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v.abs() < _TINY, torch.zeros_like(v), v)


def _forward(logits: torch.Tensor) -> torch.Tensor:
    if logits.numel() == 0:
        return torch.empty_like(logits)
    x = _ftz(logits)
    mx = x.amax(dim=-1, keepdim=True)
    e = _ftz(torch.exp(_ftz(x - mx)))
    s = e.sum(dim=-1, keepdim=True)
    return _ftz(e * (1.0 / s))


def softmax_grad(grad: torch.Tensor, softmax: torch.Tensor) -> torch.Tensor:
    """TF's ``_SoftmaxGrad``: Mul, Sum(axis -1, keep_dims), Sub, Mul, as TF's ops."""
    from .. import sum as tf_sum  # (tfgrad.torch: TF's Sum on CPU, portable elsewhere)

    if softmax.numel() == 0:
        return torch.zeros_like(softmax)
    s = tf_sum(_ftz(grad * softmax), [-1], keep_dims=True)
    return _ftz(_ftz(grad - s) * softmax)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(logits)
        return _forward(logits)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        from .. import softmax as tf_softmax  # (TF's bits on CPU: the op's output)

        (logits,) = ctx.saved_tensors
        return softmax_grad(grad, tf_softmax(logits))


def Softmax(*, logits: torch.Tensor) -> torch.Tensor:
    return _Softmax.apply(logits)
