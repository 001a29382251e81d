"""``nn.Module`` layers over tfgrad's operators (NCHW by default, ``data_format="NHWC"``
for channels-last input, which reaches the operators without a transpose)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ._functions import FUNCTIONS

depthwise_conv2d_native = FUNCTIONS["depthwise_conv2d_native"]
fake_quant_with_min_max_vars_per_channel = FUNCTIONS["fake_quant_with_min_max_vars_per_channel"]
fractional_avg_pool = FUNCTIONS["fractional_avg_pool"]
fractional_max_pool = FUNCTIONS["fractional_max_pool"]
fused_batch_norm_v3 = FUNCTIONS["fused_batch_norm_v3"]


def _check_format(data_format: str) -> str:
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    return data_format


def _pair(v: int | Sequence[int], what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    v = tuple(v)
    if len(v) != 2:
        raise ValueError(f"{what} must be an int or a pair of ints, got {v!r}")
    return int(v[0]), int(v[1])


class FakeQuantPerChannel(nn.Module):
    """Per-channel fake quantization with learnable ranges (FakeQuantWithMinMaxVarsPerChannel).

    ``min`` and ``max`` are parameters of shape [num_channels], initialised to -6 and 6
    (TF's defaults: FakeQuantWithMinMaxArgs's and tfmot's range variables) and trained by
    the op's gradients. The channel is dim 1 for ``data_format="NCHW"`` (any rank >= 2:
    [N, C], [N, C, H, W], ...) and the last dim for ``"NHWC"``.
    """

    def __init__(self, num_channels: int, num_bits: int = 8, narrow_range: bool = False,
                 init_min: float = -6.0, init_max: float = 6.0, data_format: str = "NCHW"):
        super().__init__()
        self.num_bits, self.narrow_range = num_bits, narrow_range
        self.data_format = _check_format(data_format)
        self.min = nn.Parameter(torch.full((num_channels,), float(init_min)))
        self.max = nn.Parameter(torch.full((num_channels,), float(init_max)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels_first = self.data_format == "NCHW" and x.dim() > 1
        if channels_first:
            x = x.movedim(1, -1)
        y = fake_quant_with_min_max_vars_per_channel(x, self.min, self.max, self.num_bits,
                                                     self.narrow_range)
        return y.movedim(-1, 1) if channels_first else y

    def extra_repr(self) -> str:
        return (f"{self.min.numel()}, num_bits={self.num_bits}, "
                f"narrow_range={self.narrow_range}, data_format={self.data_format!r}")


class FusedBatchNorm2d(nn.Module):
    """Batch normalization with TF's fused kernels (FusedBatchNormV3 / GradV3).

    Training normalizes with the batch statistics and updates the running ones as TF does:
    ``running = (1 - f) * running + f * batch`` with ``f = exponential_avg_factor`` and
    the Bessel-corrected batch variance (computed by the op itself). Evaluation uses the
    running statistics. Defaults follow Keras' BatchNormalization (epsilon 1e-3, momentum
    0.99, i.e. exponential_avg_factor 0.01; running mean 0, running variance 1).
    """

    def __init__(self, num_features: int, epsilon: float = 1e-3,
                 exponential_avg_factor: float = 0.01, affine: bool = True,
                 data_format: str = "NCHW"):
        super().__init__()
        self.num_features, self.epsilon = num_features, epsilon
        self.exponential_avg_factor = exponential_avg_factor
        self.data_format = _check_format(data_format)
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_buffer("weight", torch.ones(num_features))
            self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = fused_batch_norm_v3(
            x, self.weight, self.bias, self.running_mean, self.running_var,
            epsilon=self.epsilon, exponential_avg_factor=self.exponential_avg_factor,
            data_format=self.data_format, is_training=self.training)
        if self.training:
            with torch.no_grad():
                self.running_mean.copy_(out.batch_mean)
                self.running_var.copy_(out.batch_variance)
        return out.y

    def extra_repr(self) -> str:
        return (f"{self.num_features}, epsilon={self.epsilon}, "
                f"exponential_avg_factor={self.exponential_avg_factor}, "
                f"data_format={self.data_format!r}")


class DepthwiseConv2d(nn.Module):
    """Depthwise 2-D convolution (DepthwiseConv2dNative and its backprops).

    ``weight`` is stored in TF's layout [kh, kw, in_channels, channel_multiplier] (so
    Keras weights load as they are) and initialised as Keras' DepthwiseConv2D
    (Glorot uniform; bias 0). ``padding`` is "SAME", "VALID", an int or a pair
    (symmetric explicit padding), or four ints (top, bottom, left, right). Output
    channel ``k * channel_multiplier + q`` comes from input channel k.

    ``weight_fake_quant`` (e.g. ``FakeQuantPerChannel(in_channels * channel_multiplier,
    data_format="NHWC")``) is applied to the weight, viewed as [kh, kw, out_channels],
    before every convolution: quantization-aware training of the filter per output channel.
    """

    def __init__(self, in_channels: int, kernel_size: int | Sequence[int],
                 channel_multiplier: int = 1, stride: int | Sequence[int] = 1,
                 padding: str | int | Sequence[int] = "SAME",
                 dilation: int | Sequence[int] = 1, bias: bool = True,
                 data_format: str = "NCHW", weight_fake_quant: nn.Module | None = None):
        super().__init__()
        self.weight_fake_quant = weight_fake_quant
        kh, kw = _pair(kernel_size, "kernel_size")
        self.stride, self.dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
        self.data_format = _check_format(data_format)
        if isinstance(padding, str):
            self.padding, self.explicit = padding, ()
        else:
            p = (padding, padding) if isinstance(padding, int) else tuple(padding)
            pt, pb, pl, pr = (p[0], p[0], p[1], p[1]) if len(p) == 2 else p
            self.padding = "EXPLICIT"
            hw = (pt, pb, pl, pr)
            self.explicit = ((0, 0, 0, 0) + hw if data_format == "NCHW"
                             else (0, 0) + hw + (0, 0))
        self.weight = nn.Parameter(torch.empty(kh, kw, in_channels, channel_multiplier))
        self.bias = nn.Parameter(torch.zeros(in_channels * channel_multiplier)) if bias else None
        limit = math.sqrt(6.0 / ((in_channels + channel_multiplier) * kh * kw))
        with torch.no_grad():
            self.weight.uniform_(-limit, limit)

    def _spatial(self, v: tuple[int, int]) -> tuple[int, ...]:
        return (1, 1) + v if self.data_format == "NCHW" else (1,) + v + (1,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if self.weight_fake_quant is not None:
            kh, kw, c, m = w.shape
            w = self.weight_fake_quant(w.reshape(kh, kw, c * m)).reshape(kh, kw, c, m)
        y = depthwise_conv2d_native(x, w, self._spatial(self.stride), self.padding,
                                    self.explicit, self.data_format,
                                    self._spatial(self.dilation))
        if self.bias is not None:
            y = y + (self.bias[:, None, None] if self.data_format == "NCHW" else self.bias)
        return y

    def extra_repr(self) -> str:
        kh, kw, c, m = self.weight.shape
        return (f"{c}, kernel_size=({kh}, {kw}), channel_multiplier={m}, stride={self.stride}, "
                f"padding={self.padding!r}, dilation={self.dilation}, "
                f"data_format={self.data_format!r}")


class _FractionalPool2d(nn.Module):
    _fn: Callable[..., Any]

    def __init__(self, pooling_ratio: float | Sequence[float], pseudo_random: bool = False,
                 overlapping: bool = False, seed: int | tuple[int, int] | None = None,
                 data_format: str = "NCHW", return_sequences: bool = False):
        super().__init__()
        rh, rw = ((pooling_ratio, pooling_ratio) if isinstance(pooling_ratio, (int, float))
                  else tuple(pooling_ratio))
        self.pooling_ratio = (1.0, float(rh), float(rw), 1.0)
        self.pseudo_random, self.overlapping = pseudo_random, overlapping
        self.seed, self.return_sequences = seed, return_sequences
        self.data_format = _check_format(data_format)

    def _seeds(self) -> tuple[Any, Any]:
        if self.seed is None:
            # Drawn from torch's generator, so torch.manual_seed makes runs repeatable; kept
            # as a tensor, read by the operator when it runs (no graph break, no recompile).
            s = torch.randint(1, 2**62, (2,))
            return s[0], s[1]
        if isinstance(self.seed, int):  # as tf.nn.fractional_*_pool without a global seed
            return 87654321, self.seed
        return int(self.seed[0]), int(self.seed[1])

    def forward(self, x: torch.Tensor) -> Any:
        nchw = self.data_format == "NCHW"
        seed, seed2 = self._seeds()
        out = type(self)._fn(x.permute(0, 2, 3, 1) if nchw else x, self.pooling_ratio,
                             self.pseudo_random, self.overlapping, True, seed, seed2)
        # (contiguous NCHW: a channels-last view makes the next conv's weight gradient
        # channels-last too, which DistributedDataParallel's buckets warn about)
        y = out.output.permute(0, 3, 1, 2).contiguous() if nchw else out.output
        if self.return_sequences:
            return y, out.row_pooling_sequence, out.col_pooling_sequence
        return y

    def extra_repr(self) -> str:
        return (f"pooling_ratio={self.pooling_ratio[1:3]}, pseudo_random={self.pseudo_random}, "
                f"overlapping={self.overlapping}, seed={self.seed}, "
                f"data_format={self.data_format!r}")


class FractionalAvgPool2d(_FractionalPool2d):
    """Fractional average pooling (FractionalAvgPool / FractionalAvgPoolGrad).

    ``pooling_ratio`` is one float or (row, col) ratios >= 1. ``seed``: None draws the
    op's (seed, seed2) from torch's generator on every call (new regions each step,
    repeatable under ``torch.manual_seed``); an int uses TF's ``tf.nn.fractional_avg_pool``
    convention (87654321, seed), fixed regions; a pair is (seed, seed2).
    ``return_sequences=True`` also returns the row and column pooling sequences.
    """

    _fn = staticmethod(fractional_avg_pool)


class FractionalMaxPool2d(_FractionalPool2d):
    """Fractional max pooling (FractionalMaxPool / FractionalMaxPoolGrad); arguments as
    :class:`FractionalAvgPool2d`."""

    _fn = staticmethod(fractional_max_pool)
