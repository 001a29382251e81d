"""TF's ``_BatchNormGrad`` (nn_grad.py) in torch ops: the composite form of the batch-norm
gradient that TF's ``_FusedBatchNormGradGrad`` differentiates (a test oracle for the
second derivative taken through the portable gradient)."""

from __future__ import annotations

import torch

_CHANNELS_FIRST = ("NCHW", "NCDHW")


def _bn_grad_composite(dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor,
                       pop_mean: torch.Tensor, pop_var: torch.Tensor, epsilon: float,
                       data_format: str, is_training: bool) -> tuple[torch.Tensor, ...]:
    """TF's ``_BatchNormGrad`` (nn_grad.py) in torch ops: the differentiable form of the
    batch-norm gradient that TF's ``_FusedBatchNormGradGrad`` differentiates."""
    x_dtype = x.dtype
    x, dy = x.float(), dy.float()  # TF casts half types to float32 here
    c_axis = 1 if data_format in _CHANNELS_FIRST else x.dim() - 1
    axes = [d for d in range(x.dim()) if d != c_axis]
    shape = [1] * x.dim()
    shape[c_axis] = -1

    def bc(v: torch.Tensor) -> torch.Tensor:
        return v.reshape(shape)

    grad_offset = dy.sum(axes)
    if is_training:
        mean_x = x.mean(axes, keepdim=True)
        var_x = (x - mean_x.detach()).square().mean(axes, keepdim=True)
        x_off = x - mean_x
        inv = torch.rsqrt(var_x + epsilon)
        mean = (dy * x_off).mean(axes, keepdim=True)
        grad_x = bc(scale) * inv * ((dy - dy.mean(axes, keepdim=True))
                                    - torch.reciprocal(var_x + epsilon) * mean * x_off)
        grad_scale = (inv * (dy * x_off).sum(axes, keepdim=True)).reshape(-1)
    else:
        inv = torch.rsqrt(bc(pop_var) + epsilon)
        grad_scale = (dy * (x - bc(pop_mean)) * inv).sum(axes)
        grad_x = dy * bc(scale) * inv
    return grad_x.to(x_dtype), grad_scale, grad_offset


