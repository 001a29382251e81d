"""PyTorch adapter: tfgrad's ops as PyTorch operators, functions and ``nn.Module`` layers.

Every op is a ``torch.library`` custom operator, ``torch.ops.tfgrad.<op_name>``
(:mod:`tfgrad.torch._ops`), so it works under ``torch.compile`` (no graph break; the
operator runs as written inside the compiled graph), ``torch.export``, ``torch.func`` and
on every device:

- CPU tensors run tfgrad's exact kernels (zero-copy, TF 2.21's bits);
- tensors on other devices (CUDA first) run the portable implementation: TF's semantics in
  torch tensor ops (:mod:`tfgrad.torch._portable`), within the distances documented in
  docs/adapters.md; :func:`use_impl` chooses ("auto", "exact", "portable").

Backward passes call TF's gradient ops with the inputs TF's registered gradient functions
give them (the table in :mod:`tfgrad._gradients`), so CPU gradients are TF's bit for bit,
including where they are not the derivative of the forward (fake quantization's
straight-through estimator, whose mask is the *nudged* range). Only the outputs TF
differentiates are differentiable (batch norm's statistics and reserve spaces and the
pooling sequences are not); batch norm's ``mean``/``variance`` get no gradient. Double
backward works where TF defines it: depthwise conv (its three ops differentiate each
other, to any order), fused batch norm (TF's ``_FusedBatchNormGradGrad``: autograd through
the portable gradient, float32 torch ops, not bit-exact) and fractional average pooling
(its gradient is linear). Fake quantization and fractional max pooling have none in TF; a
second backward through them raises ``RuntimeError``.

Functions (:data:`FUNCTIONS`, one per op, forward and gradient) take TF's wrapper
signatures: ``tfgrad.torch.depthwise_conv2d_native(input, filter, strides, padding, ...)``.
A dtype an op does not take is a ``TypeError`` (nothing is cast silently, except by the
operators' autocast rules under ``torch.autocast``); bad arguments raise
``tfgrad.InvalidArgumentError``, at trace time under ``torch.compile`` (where torch wraps
it in its ``TorchRuntimeError``: docs/adapters.md).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as _e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "tfgrad.torch needs PyTorch (torch==2.13.0): pip install tfgrad[torch]"
    ) from _e

from ._composite import _bn_grad_composite  # noqa: F401 (temporary, for tests)
from ._functions import FUNCTIONS
from ._layers import (
    DepthwiseConv2d,
    FakeQuantFixedRange,
    FakeQuantPerChannel,
    FakeQuantPerTensor,
    FractionalAvgPool2d,
    FractionalMaxPool2d,
    FusedBatchNorm2d,
)
from ._ops import OPERATORS, use_impl

__all__ = [
    "FUNCTIONS",
    "OPERATORS",
    "DepthwiseConv2d",
    "FakeQuantFixedRange",
    "FakeQuantPerChannel",
    "FakeQuantPerTensor",
    "FractionalAvgPool2d",
    "FractionalMaxPool2d",
    "FusedBatchNorm2d",
    "use_impl",
    *FUNCTIONS,
]

globals().update(FUNCTIONS)
