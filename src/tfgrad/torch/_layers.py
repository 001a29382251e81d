"""``nn.Module`` layers over tfgrad's operators (NCHW by default, ``data_format="NHWC"``
for channels-last input, which reaches the operators without a transpose)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .. import _shapes
from ._eager import plain_eager
from ._functions import FUNCTIONS

depthwise_conv2d_native = FUNCTIONS["depthwise_conv2d_native"]
fake_quant_with_min_max_args = FUNCTIONS["fake_quant_with_min_max_args"]
fake_quant_with_min_max_vars = FUNCTIONS["fake_quant_with_min_max_vars"]
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


def _check_op(op_name: str, **arguments: Any) -> None:
    """Run the op's checks of its attrs at construction (inputs as shape-only placeholders),
    so a layer TF's kernel would refuse fails at once, with the op's error and words."""
    _shapes.infer(op_name, arguments)


def _f32(*shape: int) -> Any:
    return _shapes.placeholder(shape, "float32")


def _channels_last(x: torch.Tensor) -> bool:
    """An NCHW tensor stored channels-last (``x.to(memory_format=torch.channels_last)``):
    the layers then run the NHWC op on its contiguous NHWC view and return channels-last
    NCHW, as torch's own layers do."""
    return (x.dim() == 4 and not x.is_contiguous()
            and x.is_contiguous(memory_format=torch.channels_last))


def _to_nchw(y: torch.Tensor) -> torch.Tensor:
    return y.permute(0, 3, 1, 2)


class _Float32Parameters(nn.Module):
    """Parameters and buffers that stay float32 under ``.half()`` / ``.bfloat16()`` /
    ``.to(dtype)``, because TF's op takes them only in float32 (moving to a device still
    applies; submodules follow their own rules)."""

    def _apply(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        was_f32 = {n for n, t in [*self._parameters.items(), *self._buffers.items()]
                   if t is not None and t.dtype == torch.float32}
        super()._apply(fn, *args, **kwargs)
        for name in was_f32:
            t = getattr(self, name)
            if t.dtype == torch.float32:
                continue
            if name in self._parameters:  # (the same Parameter object, as _apply keeps it)
                t.data = t.data.float()
                if t.grad is not None:
                    t.grad = t.grad.float()
            else:
                self._buffers[name] = t.float()
        return self


def _via_float32(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """A layer over an op that takes no half dtype, given a float16/bfloat16 x outside
    autocast (a model converted with ``.half()``): computed in float32 and returned in x's
    dtype. Under autocast the operator's own rule casts x and the output stays float32,
    as torch's float32 ops."""
    if x.dtype in (torch.float16, torch.bfloat16) and not torch.is_autocast_enabled(
            x.device.type):
        return fn(x.float()).to(x.dtype)
    return fn(x)


class FakeQuantPerChannel(_Float32Parameters):
    """Per-channel fake quantization with learnable ranges (FakeQuantWithMinMaxVarsPerChannel).

    ``min`` and ``max`` are parameters of shape [num_channels], initialised to -6 and 6
    (TF's defaults: FakeQuantWithMinMaxArgs's and tfmot's range variables) and trained by
    the op's gradients. The channel is dim 1 for ``data_format="NCHW"`` (any rank >= 2:
    [N, C], [N, C, H, W], ...) and the last dim for ``"NHWC"``; ``axis`` names it
    explicitly (``axis=0`` quantizes a ``Linear`` weight [out, in] per output channel).
    TF's op quantizes the last dim: the layer moves the channel there and back, which
    changes no bit (views: eager, the kernels run on the input's memory as it is). The
    output has the input's memory format (a contiguous input gives a contiguous output, a
    channels-last one a channels-last output); under ``torch.compile`` a 4-D NCHW output is
    channels-last (as Inductor lays out tensors near convolutions; the same values).
    """

    def __init__(self, num_channels: int, num_bits: int = 8, narrow_range: bool = False,
                 init_min: float = -6.0, init_max: float = 6.0, data_format: str = "NCHW",
                 axis: int | None = None):
        super().__init__()
        self.num_bits, self.narrow_range = num_bits, narrow_range
        self.data_format = _check_format(data_format)
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
            raise TypeError(f"axis must be an int or None, got {axis!r}")
        self.axis = axis
        _check_op("FakeQuantWithMinMaxVarsPerChannel", inputs=_f32(1, num_channels),
                  min=_f32(num_channels), max=_f32(num_channels), num_bits=num_bits,
                  narrow_range=narrow_range)
        self.min = nn.Parameter(torch.full((num_channels,), float(init_min)))
        self.max = nn.Parameter(torch.full((num_channels,), float(init_max)))

    def _channel_dim(self, x: torch.Tensor) -> int:
        if self.axis is None:
            return 1 if self.data_format == "NCHW" and x.dim() > 1 else x.dim() - 1
        if not -x.dim() <= self.axis < x.dim():
            raise IndexError(f"FakeQuantPerChannel: axis {self.axis} is out of range for an "
                             f"input of rank {x.dim()} (shape {list(x.shape)})")
        return self.axis % x.dim()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _via_float32(self._quantize, x)

    def _quantize(self, x: torch.Tensor) -> torch.Tensor:
        dim = self._channel_dim(x)
        last = dim == x.dim() - 1
        if dim == 1 and x.dim() == 4 and torch.compiler.is_compiling():
            # (Inductor's layout optimisation gives every 4-D tensor near a convolution
            # channels-last strides as if dim 1 held channels: an NHWC view would be laid
            # out (N, W, C, H) and copied by scalar loops on both sides of the op. The
            # channel moved last in 3-D instead: the same rows, the same bits; the output
            # channels-last, which Inductor keeps near convolutions.)
            n, c, h, w = x.shape
            y = fake_quant_with_min_max_vars_per_channel(
                x.reshape(n, c, h * w).transpose(1, 2), self.min, self.max,
                self.num_bits, self.narrow_range)
            return y.transpose(1, 2).reshape(n, c, h, w)
        y = fake_quant_with_min_max_vars_per_channel(x if last else x.movedim(dim, -1),
                                                     self.min, self.max, self.num_bits,
                                                     self.narrow_range)
        if last:
            return y
        y = y.movedim(-1, dim)
        return y.contiguous() if x.is_contiguous() else y

    def extra_repr(self) -> str:
        axis = "" if self.axis is None else f", axis={self.axis}"
        return (f"{self.min.numel()}, num_bits={self.num_bits}, "
                f"narrow_range={self.narrow_range}, data_format={self.data_format!r}{axis}")


class FakeQuantPerTensor(_Float32Parameters):
    """Fake quantization of a whole tensor with a learnable range (FakeQuantWithMinMaxVars).

    ``min`` and ``max`` are scalar parameters initialised to -6 and 6 and trained by the
    op's gradients (TF's straight-through estimator; the rest goes to ``min``/``max``).
    """

    def __init__(self, num_bits: int = 8, narrow_range: bool = False,
                 init_min: float = -6.0, init_max: float = 6.0):
        super().__init__()
        self.num_bits, self.narrow_range = num_bits, narrow_range
        _check_op("FakeQuantWithMinMaxVars", inputs=_f32(1), min=_f32(), max=_f32(),
                  num_bits=num_bits, narrow_range=narrow_range)
        self.min = nn.Parameter(torch.tensor(float(init_min)))
        self.max = nn.Parameter(torch.tensor(float(init_max)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _via_float32(lambda t: fake_quant_with_min_max_vars(
            t, self.min, self.max, self.num_bits, self.narrow_range), x)

    def extra_repr(self) -> str:
        return f"num_bits={self.num_bits}, narrow_range={self.narrow_range}"


class FakeQuantFixedRange(nn.Module):
    """Fake quantization to a fixed range (FakeQuantWithMinMaxArgs): ``min`` and ``max``
    are attributes (floats, rounded to float32 as TF stores them), not trained."""

    def __init__(self, min: float = -6.0, max: float = 6.0, num_bits: int = 8,
                 narrow_range: bool = False):
        super().__init__()
        _check_op("FakeQuantWithMinMaxArgs", inputs=_f32(1), min=min, max=max,
                  num_bits=num_bits, narrow_range=narrow_range)
        self.min, self.max = float(min), float(max)
        self.num_bits, self.narrow_range = num_bits, narrow_range

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _via_float32(lambda t: fake_quant_with_min_max_args(
            t, self.min, self.max, self.num_bits, self.narrow_range), x)

    def extra_repr(self) -> str:
        return (f"min={self.min}, max={self.max}, num_bits={self.num_bits}, "
                f"narrow_range={self.narrow_range}")


class FusedBatchNorm2d(_Float32Parameters):
    """Batch normalization with TF's fused kernels (FusedBatchNormV3 / GradV3).

    Training normalizes with the batch statistics and updates the running ones as TF does:
    ``running = (1 - f) * running + f * batch`` with ``f = exponential_avg_factor`` and
    the Bessel-corrected batch variance (computed by the op itself). Evaluation uses the
    running statistics. Defaults follow Keras' BatchNormalization (epsilon 1e-3, momentum
    0.99, i.e. exponential_avg_factor 0.01; running mean 0, running variance 1).

    The state dict has ``nn.BatchNorm2d``'s keys, so its state loads as it is (its
    ``num_batches_tracked`` is accepted and ignored: TF keeps no count). ``weight``,
    ``bias`` and the running statistics stay float32 under ``.half()`` /
    ``.bfloat16()``, as TF's FusedBatchNormV3 takes float32 scale, offset and statistics
    with a half x; a half x gives a half output. A channels-last NCHW input runs the NHWC
    op on its NHWC view (the same bits) and gives a channels-last output.
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
        else:  # (not in the state dict, as nn.BatchNorm2d(affine=False) has none)
            self.register_buffer("weight", torch.ones(num_features), persistent=False)
            self.register_buffer("bias", torch.zeros(num_features), persistent=False)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.affine = affine
        _check_op("FusedBatchNormV3", x=_f32(1, 1, 1, num_features), scale=_f32(num_features),
                  offset=_f32(num_features), mean=_f32(num_features),
                  variance=_f32(num_features), epsilon=epsilon,
                  exponential_avg_factor=exponential_avg_factor)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any
                              ) -> None:
        state_dict.pop(prefix + "num_batches_tracked", None)  # (nn.BatchNorm2d's counter)
        if not self.affine:  # (earlier tfgrad state dicts held the constant 1 and 0)
            state_dict.pop(prefix + "weight", None)
            state_dict.pop(prefix + "bias", None)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nhwc_view = self.data_format == "NCHW" and _channels_last(x)
        out = fused_batch_norm_v3(
            x.permute(0, 2, 3, 1) if nhwc_view else x, self.weight, self.bias,
            self.running_mean, self.running_var,
            epsilon=self.epsilon, exponential_avg_factor=self.exponential_avg_factor,
            data_format="NHWC" if nhwc_view else self.data_format, is_training=self.training)
        if self.training:
            with torch.no_grad():
                self.running_mean.copy_(out.batch_mean)
                self.running_var.copy_(out.batch_variance)
        return _to_nchw(out.y) if nhwc_view else out.y

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

    The constructor runs the op's checks of the attrs: a stride TF's kernel refuses (row
    and column strides differ) fails here, with TF's message. A channels-last NCHW input
    runs the NHWC op on its NHWC view (the same bits) and gives a channels-last output.
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
            self.padding, self._pads = padding, ()
        else:
            p = (padding, padding) if isinstance(padding, int) else tuple(padding)
            if len(p) not in (2, 4):
                raise ValueError(f"padding must be 'SAME', 'VALID', an int, a pair or four "
                                 f"ints (top, bottom, left, right), got {padding!r}")
            self.padding = "EXPLICIT"
            self._pads = (p[0], p[0], p[1], p[1]) if len(p) == 2 else p
        strides, explicit, dilations = self._attrs(self.data_format)
        self.explicit = explicit
        eh, ew = (kh - 1) * self.dilation[0] + 1, (kw - 1) * self.dilation[1] + 1
        x = (1, in_channels, eh, ew) if self.data_format == "NCHW" else (1, eh, ew, in_channels)
        _check_op("DepthwiseConv2dNative", input=_f32(*x),
                  filter=_f32(kh, kw, in_channels, channel_multiplier), strides=strides,
                  padding=self.padding, explicit_paddings=explicit,
                  data_format=self.data_format, dilations=dilations)
        self.weight = nn.Parameter(torch.empty(kh, kw, in_channels, channel_multiplier))
        self.bias = nn.Parameter(torch.zeros(in_channels * channel_multiplier)) if bias else None
        limit = math.sqrt(6.0 / ((in_channels + channel_multiplier) * kh * kw))
        with torch.no_grad():
            self.weight.uniform_(-limit, limit)

    def _attrs(self, data_format: str) -> tuple[tuple[int, ...], ...]:
        """strides, explicit_paddings and dilations in ``data_format``'s order."""
        def spatial(v: tuple[int, ...]) -> tuple[int, ...]:
            return (1, 1) + v if data_format == "NCHW" else (1,) + v + (1,)

        pads = self._pads
        if pads:
            pads = (0, 0, 0, 0) + pads if data_format == "NCHW" else (0, 0) + pads + (0, 0)
        return spatial(self.stride), pads, spatial(self.dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if self.weight_fake_quant is not None:
            kh, kw, c, m = w.shape
            w = self.weight_fake_quant(w.reshape(kh, kw, c * m)).reshape(kh, kw, c, m)
        nhwc_view = self.data_format == "NCHW" and _channels_last(x)
        fmt = "NHWC" if nhwc_view else self.data_format
        strides, explicit, dilations = self._attrs(fmt)
        y = depthwise_conv2d_native(x.permute(0, 2, 3, 1) if nhwc_view else x, w, strides,
                                    self.padding, explicit, fmt, dilations)
        if nhwc_view:
            y = _to_nchw(y)
        if self.bias is not None:  # (in y's dtype: autocast's, as torch's conv2d's bias)
            b = self.bias.to(y.dtype)
            y = y + (b[:, None, None] if self.data_format == "NCHW" else b)
        return y

    def extra_repr(self) -> str:
        kh, kw, c, m = self.weight.shape
        return (f"{c}, kernel_size=({kh}, {kw}), channel_multiplier={m}, stride={self.stride}, "
                f"padding={self.padding!r}, dilation={self.dilation}, "
                f"data_format={self.data_format!r}")


class _FractionalPool2d(nn.Module):
    _fn: Callable[..., Any]
    _op: str

    def __init__(self, pooling_ratio: float | Sequence[float], pseudo_random: bool = False,
                 overlapping: bool = False, seed: int | tuple[int, int] | None = None,
                 data_format: str = "NCHW", return_sequences: bool = False):
        super().__init__()
        ratio = ((pooling_ratio, pooling_ratio) if isinstance(pooling_ratio, numbers.Real)
                 else tuple(pooling_ratio))
        if len(ratio) != 2 or not all(isinstance(r, numbers.Real) for r in ratio):
            raise ValueError(f"pooling_ratio must be one number or a (row, col) pair, got "
                             f"{pooling_ratio!r}")
        self.pooling_ratio = (1.0, float(ratio[0]), float(ratio[1]), 1.0)
        if not (seed is None or isinstance(seed, numbers.Integral) or (
                isinstance(seed, (tuple, list)) and len(seed) == 2
                and all(isinstance(v, numbers.Integral) for v in seed))):
            raise TypeError(f"seed must be None, an int or a pair of ints, got {seed!r}")
        self.pseudo_random, self.overlapping = pseudo_random, overlapping
        self.seed, self.return_sequences = seed, return_sequences
        self.data_format = _check_format(data_format)
        rows, cols = (math.ceil(r) if math.isfinite(r) else 1 for r in ratio)
        _check_op(self._op, value=_f32(1, rows, cols, 1), pooling_ratio=self.pooling_ratio,
                  pseudo_random=pseudo_random, overlapping=overlapping)

    def _seeds(self) -> tuple[Any, Any]:
        if self.seed is None:
            # Drawn from torch's generator, so torch.manual_seed makes runs repeatable; kept
            # as a tensor, read by the operator when it runs (no graph break, no recompile).
            # Eager, the same values as ints: the call then skips torch's dispatcher.
            s = torch.randint(1, 2**62, (2,))
            if not torch.compiler.is_compiling() and plain_eager():
                a, b = s.tolist()
                return a, b
            return s[0], s[1]
        if isinstance(self.seed, numbers.Integral):
            return 87654321, int(self.seed)  # (as tf.nn.fractional_*_pool, no global seed)
        return int(self.seed[0]), int(self.seed[1])

    def forward(self, x: torch.Tensor) -> Any:
        nchw = self.data_format == "NCHW"
        seed, seed2 = self._seeds()
        sequences = []

        def pool(v: torch.Tensor) -> torch.Tensor:
            out = type(self)._fn(v.permute(0, 2, 3, 1) if nchw else v, self.pooling_ratio,
                                 self.pseudo_random, self.overlapping, True, seed, seed2)
            sequences.extend((out.row_pooling_sequence, out.col_pooling_sequence))
            return out.output

        y = _via_float32(pool, x)  # (the ops take no half dtype; a max is exact in any)
        if nchw:
            # (channels-last in, channels-last out; otherwise contiguous NCHW: a channels-
            # last view makes the next conv's weight gradient channels-last too, which
            # DistributedDataParallel's buckets warn about)
            y = _to_nchw(y) if _channels_last(x) else _to_nchw(y).contiguous()
        if self.return_sequences:
            return y, *sequences
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
    _op = "FractionalAvgPool"


class FractionalMaxPool2d(_FractionalPool2d):
    """Fractional max pooling (FractionalMaxPool / FractionalMaxPoolGrad); arguments as
    :class:`FractionalAvgPool2d`."""

    _fn = staticmethod(fractional_max_pool)
    _op = "FractionalMaxPool"
