"""PyTorch adapter: tfgrad's ops as differentiable functions and ``nn.Module`` layers.

Each function has the name, argument names, defaults, layouts and outputs of tfgrad's
functional API (``tfgrad.<op_name>``, i.e. TF 2.21's generated wrappers), but takes and
returns ``torch.Tensor``\\s. Forward and backward are TF's ops: the backward of
``depthwise_conv2d_native`` is ``DepthwiseConv2dNativeBackpropInput`` / ``...Filter``, the
backward of ``fused_batch_norm_v3`` is ``FusedBatchNormGradV3``, and so on, with the inputs
TF's registered gradient functions give them. So the gradients are TF's bit for bit,
including where they are not the derivative of the forward (fake quantization's
straight-through estimator, whose mask is the *nudged* range).

Conventions (each mirrors TF's gradient registry):

- Only the first output of a multi-output op is differentiable. ``batch_mean``,
  ``batch_variance`` and the reserve spaces of batch norm, and the pooling sequences, are
  marked non-differentiable: TF's gradient functions ignore their incoming gradients too.
- ``mean`` and ``variance`` of batch norm get no gradient (TF returns None for them).
- Double backward (``create_graph=True``) works where TF defines it: depthwise conv (its
  backprops are differentiated with each other and the forward op, to any order), fused
  batch norm (TF's ``_FusedBatchNormGradGrad``: the vjp of TF's composite batch-norm
  gradient, in float32 torch ops, not bit-exact) and fractional average pooling (its
  gradient is linear; its adjoint is average pooling over the saved sequences, in torch
  ops). Fake quantization and fractional max pooling have no second derivative in TF; a
  second backward through them raises ``RuntimeError``.

Tensors: CPU only (a tensor on another device raises ``ValueError`` saying to move it with
``.cpu()``; tfgrad never copies between devices behind your back), strided layout, and a
dtype the op takes (``TypeError`` otherwise; nothing is cast silently: fake quantization and
batch norm take no float64, as in TF). Inputs are shared with NumPy without a copy
(``Tensor.numpy()``; bfloat16 through an int16 view); non-contiguous inputs are fine (the
kernels copy them once); outputs are wrapped with ``torch.from_numpy``, zero-copy.

The ``nn.Module`` layers take NCHW input by default, as torch users expect; pass
``data_format="NHWC"`` for channels-last input (which reaches the kernels without a
transpose for depthwise conv and batch norm).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

try:
    import torch
    from torch import nn
except ImportError as _e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "tfgrad.torch needs PyTorch (torch==2.13.0): pip install tfgrad[torch]"
    ) from _e

import ml_dtypes
import numpy as np

from .. import raw_ops
from .._opdefs import get_op_def

__all__ = [
    "DepthwiseConv2d",
    "FakeQuantPerChannel",
    "FractionalAvgPool2d",
    "FractionalMaxPool2d",
    "FusedBatchNorm2d",
    "depthwise_conv2d_native",
    "fake_quant_with_min_max_args",
    "fake_quant_with_min_max_vars",
    "fake_quant_with_min_max_vars_per_channel",
    "fractional_avg_pool",
    "fractional_max_pool",
    "fused_batch_norm",
    "fused_batch_norm_v2",
    "fused_batch_norm_v3",
]

_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
}


# --------------------------------------------------------------------------------------
# Conversion between torch and NumPy (zero-copy on the CPU)
# --------------------------------------------------------------------------------------
def _allowed_dtypes(op_name: str, input_name: str) -> tuple[str, ...]:
    op = get_op_def(op_name)
    for i in op.inputs:
        if i.name == input_name:
            return (i.dtype,) if i.dtype else op.type_attr(i.type_attr).allowed
    raise KeyError(input_name)


def _to_numpy(t: Any, op_name: str, input_name: str) -> np.ndarray:
    """A NumPy view of a CPU tensor (no copy), after checking device, layout and dtype."""
    where = f"tfgrad.torch ({op_name}): '{input_name}'"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where} must be a torch.Tensor, got {type(t).__name__}; "
                        "wrap values with torch.tensor(...)")
    if t.device.type != "cpu":
        raise ValueError(
            f"{where} is on device '{t.device}', but tfgrad's kernels run on the CPU only. "
            f"Move the inputs with .cpu() and the results back with .to('{t.device}'); "
            "tfgrad does not copy between devices implicitly."
        )
    if t.layout != torch.strided:
        raise TypeError(f"{where} has layout {t.layout}; only dense (strided) tensors are "
                        "supported: call .to_dense() first")
    allowed = _allowed_dtypes(op_name, input_name)
    name = _DTYPE_NAMES.get(t.dtype)
    if name not in allowed:
        raise TypeError(
            f"{where} has dtype {t.dtype}, but the op takes "
            f"{', '.join('torch.' + a for a in allowed)} (as TF's CPU kernel); convert it "
            "explicitly, e.g. with .float()"
        )
    t = t.detach().resolve_neg()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: reinterpret the bits
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_torch(a: Any, others: Sequence[np.ndarray]) -> torch.Tensor:
    """Wrap an op output as a tensor without copying, unless it aliases one of ``others``."""
    a = np.asarray(a)
    if not a.flags.writeable or any(np.may_share_memory(a, i) for i in others):
        a = a.copy()  # outputs must be fresh, as TF's are
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _run(op_name: str, tensors: dict[str, Any], attrs: dict[str, Any],
         arrays: dict[str, np.ndarray] | None = None) -> tuple[torch.Tensor, ...]:
    """Run ``raw_ops.<op_name>`` on torch tensors (plus ready NumPy inputs); tuple out."""
    np_in = {k: _to_numpy(v, op_name, k) for k, v in tensors.items()}
    out = getattr(raw_ops, op_name)(**np_in, **(arrays or {}), **attrs)
    outs = tuple(out) if isinstance(out, tuple) else (out,)
    seen = list(np_in.values())
    result = []
    for o in outs:  # never alias an input or another output (e.g. mean and reserve space)
        result.append(_to_torch(o, seen))
        seen.append(np.asarray(o))
    return tuple(result)


def _no_double_backward(fwd_op: str, grad_op: str) -> RuntimeError:
    return RuntimeError(
        f"tfgrad.torch: {fwd_op} has no second derivative: TF registers no gradient for "
        f"{grad_op}. Take the first gradient without create_graph=True (or detach it)."
    )


def _vjp(fn: Callable[..., Sequence[torch.Tensor]], primals: Sequence[torch.Tensor],
         cotangents: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor | None, ...]:
    """Vector-Jacobian product of a torch composite, connected to the graph when
    ``create_graph=True`` (grad mode is on inside backward exactly then)."""
    create = torch.is_grad_enabled()
    with torch.enable_grad():
        leaves = [p if create and p.requires_grad else p.detach().requires_grad_()
                  for p in primals]
        outs = fn(*leaves)
        pairs = [(o, c) for o, c in zip(outs, cotangents) if c is not None]
        grads = torch.autograd.grad([o for o, _ in pairs], leaves, [c for _, c in pairs],
                                    create_graph=create, allow_unused=True)
    return tuple(grads)


# --------------------------------------------------------------------------------------
# Fake quantization
# --------------------------------------------------------------------------------------
class _FakeQuantArgs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, attrs: dict) -> torch.Tensor:
        ctx.attrs = attrs
        ctx.save_for_backward(inputs)
        return _run("FakeQuantWithMinMaxArgs", {"inputs": inputs}, attrs)[0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        return _FakeQuantArgsGrad.apply(g, x, ctx.attrs), None


class _FakeQuantArgsGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, g: torch.Tensor, x: torch.Tensor, attrs: dict) -> torch.Tensor:
        return _run("FakeQuantWithMinMaxArgsGradient", {"gradients": g, "inputs": x}, attrs)[0]

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        raise _no_double_backward("FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxArgsGradient")


class _FakeQuantVars(torch.autograd.Function):
    """FakeQuantWithMinMaxVars or ...PerChannel (``ctx.op``); gradients to min and max."""

    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, min: torch.Tensor, max: torch.Tensor,
                op: str, attrs: dict) -> torch.Tensor:
        ctx.op, ctx.attrs = op, attrs
        ctx.save_for_backward(inputs, min, max)
        return _run(op, {"inputs": inputs, "min": min, "max": max}, attrs)[0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, lo, hi = ctx.saved_tensors
        dx, dmin, dmax = _FakeQuantVarsGrad.apply(g, x, lo, hi, ctx.op, ctx.attrs)
        return dx, dmin, dmax, None, None


class _FakeQuantVarsGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, g: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                op: str, attrs: dict) -> tuple:
        ctx.op = op
        return _run(op + "Gradient", {"gradients": g, "inputs": x, "min": lo, "max": hi}, attrs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        raise _no_double_backward(ctx.op, ctx.op + "Gradient")


def fake_quant_with_min_max_args(inputs: torch.Tensor, min: float = -6.0, max: float = 6.0,
                                 num_bits: int = 8, narrow_range: bool = False, *,
                                 name: str | None = None) -> torch.Tensor:
    """``tfgrad.fake_quant_with_min_max_args`` on torch tensors, differentiable.

    The gradient is ``FakeQuantWithMinMaxArgsGradient``: the incoming gradient where
    nudged_min <= inputs <= nudged_max, else 0 (TF's straight-through estimator).
    """
    attrs = {"min": min, "max": max, "num_bits": num_bits, "narrow_range": narrow_range}
    return _FakeQuantArgs.apply(inputs, attrs)


def fake_quant_with_min_max_vars(inputs: torch.Tensor, min: torch.Tensor, max: torch.Tensor,
                                 num_bits: int = 8, narrow_range: bool = False, *,
                                 name: str | None = None) -> torch.Tensor:
    """``tfgrad.fake_quant_with_min_max_vars`` on torch tensors, differentiable.

    ``min`` and ``max`` are scalar tensors; the gradients are
    ``FakeQuantWithMinMaxVarsGradient``'s: to ``inputs`` inside the nudged range, to
    ``min`` (``max``) the sum of the incoming gradient below (above) it.
    """
    attrs = {"num_bits": num_bits, "narrow_range": narrow_range}
    return _FakeQuantVars.apply(inputs, min, max, "FakeQuantWithMinMaxVars", attrs)


def fake_quant_with_min_max_vars_per_channel(
    inputs: torch.Tensor, min: torch.Tensor, max: torch.Tensor, num_bits: int = 8,
    narrow_range: bool = False, *, name: str | None = None,
) -> torch.Tensor:
    """``tfgrad.fake_quant_with_min_max_vars_per_channel`` on torch tensors, differentiable.

    Channels are the last dimension of ``inputs`` (TF's layout); ``min`` and ``max`` have
    shape [d] and get ``FakeQuantWithMinMaxVarsPerChannelGradient``'s gradients.
    """
    attrs = {"num_bits": num_bits, "narrow_range": narrow_range}
    return _FakeQuantVars.apply(inputs, min, max, "FakeQuantWithMinMaxVarsPerChannel", attrs)


# --------------------------------------------------------------------------------------
# Fused batch normalization
# --------------------------------------------------------------------------------------
_BN_GRAD_OP = {"FusedBatchNorm": "FusedBatchNormGrad",
               "FusedBatchNormV2": "FusedBatchNormGradV2",
               "FusedBatchNormV3": "FusedBatchNormGradV3"}
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


def _to_channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.movedim(1, -1)


class _FusedBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                mean: torch.Tensor, variance: torch.Tensor, op: str, attrs: dict) -> tuple:
        outs = _run(op, {"x": x, "scale": scale, "offset": offset, "mean": mean,
                         "variance": variance}, attrs)
        ctx.op, ctx.attrs = op, attrs
        if attrs["is_training"]:
            ctx.save_for_backward(x, scale, *outs[3:])  # reserve spaces: batch mean and var
        else:  # TF's gradient uses the population statistics given to the forward op
            ctx.save_for_backward(x, scale, mean, variance, *outs[5:])
        ctx.mark_non_differentiable(*outs[1:])
        return outs

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, *unused: Any) -> tuple:
        x, scale, *rs = ctx.saved_tensors
        dx, dscale, doffset = _FusedBatchNormGrad.apply(dy, x, scale, *rs, ctx.op, ctx.attrs)
        return dx, dscale, doffset, None, None, None, None


class _FusedBatchNormGrad(torch.autograd.Function):
    """FusedBatchNormGrad{,V2,V3}; double backward as TF's ``_FusedBatchNormGradGrad``."""

    @staticmethod
    def forward(ctx: Any, dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor,
                *rest: Any) -> tuple:
        *rs, op, attrs = rest
        fmt, training = attrs["data_format"], attrs["is_training"]
        ctx.fmt, ctx.eps, ctx.training = fmt, attrs["epsilon"], training
        ctx.save_for_backward(dy, x, scale, rs[0], rs[1])
        dy_, x_ = dy, x
        transposed = not training and fmt in _CHANNELS_FIRST
        if transposed:
            # TF's gradient function transposes to channels-last for frozen statistics
            # (the CPU kernel has no NCHW inference gradient) and transposes dx back.
            dy_, x_ = _to_channels_last(dy), _to_channels_last(x)
            fmt = "NHWC" if fmt == "NCHW" else "NDHWC"
        names = ["reserve_space_1", "reserve_space_2", "reserve_space_3"][:len(rs)]
        dx, dscale, doffset = _run(
            _BN_GRAD_OP[op],
            {"y_backprop": dy_, "x": x_, "scale": scale, **dict(zip(names, rs))},
            {"epsilon": attrs["epsilon"], "data_format": fmt, "is_training": training},
        )[:3]
        if transposed:
            dx = dx.movedim(-1, 1).contiguous()
        return dx, dscale, doffset

    @staticmethod
    def backward(ctx: Any, ggx: torch.Tensor, ggscale: torch.Tensor,
                 ggoffset: torch.Tensor) -> tuple:
        dy, x, scale, m, v = ctx.saved_tensors

        def f(dy_: torch.Tensor, x_: torch.Tensor, scale_: torch.Tensor) -> tuple:
            return _bn_grad_composite(dy_, x_, scale_, m, v, ctx.eps, ctx.fmt, ctx.training)

        gdy, gx, gscale = _vjp(f, (dy, x, scale), (ggx, ggscale, ggoffset))
        n_rest = len(ctx.needs_input_grad) - 3
        return (gdy, gx, gscale) + (None,) * n_rest


def _fused_batch_norm(op: str, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                      mean: torch.Tensor, variance: torch.Tensor, epsilon: float,
                      exponential_avg_factor: float, data_format: str,
                      is_training: bool) -> Any:
    attrs = {"epsilon": epsilon, "exponential_avg_factor": exponential_avg_factor,
             "data_format": data_format, "is_training": is_training}
    outs = _FusedBatchNorm.apply(x, scale, offset, mean, variance, op, attrs)
    return getattr(raw_ops, op).Output(*outs)


def fused_batch_norm(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                     mean: torch.Tensor, variance: torch.Tensor, epsilon: float = 0.0001,
                     exponential_avg_factor: float = 1.0, data_format: str = "NHWC",
                     is_training: bool = True, *, name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm`` on torch tensors; ``y`` is differentiable (backward:
    ``FusedBatchNormGrad``). Returns the namedtuple of ``raw_ops.FusedBatchNorm``."""
    return _fused_batch_norm("FusedBatchNorm", x, scale, offset, mean, variance, epsilon,
                             exponential_avg_factor, data_format, is_training)


def fused_batch_norm_v2(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                        mean: torch.Tensor, variance: torch.Tensor, epsilon: float = 0.0001,
                        exponential_avg_factor: float = 1.0, data_format: str = "NHWC",
                        is_training: bool = True, *, name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm_v2`` on torch tensors; ``y`` is differentiable (backward:
    ``FusedBatchNormGradV2``). Returns the namedtuple of ``raw_ops.FusedBatchNormV2``."""
    return _fused_batch_norm("FusedBatchNormV2", x, scale, offset, mean, variance, epsilon,
                             exponential_avg_factor, data_format, is_training)


def fused_batch_norm_v3(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                        mean: torch.Tensor, variance: torch.Tensor, epsilon: float = 0.0001,
                        exponential_avg_factor: float = 1.0, data_format: str = "NHWC",
                        is_training: bool = True, *, name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm_v3`` on torch tensors.

    Returns the namedtuple of ``raw_ops.FusedBatchNormV3``: (y, batch_mean,
    batch_variance, reserve_space_1, reserve_space_2, reserve_space_3). Only ``y`` is
    differentiable; its backward is ``FusedBatchNormGradV3`` (training: with the batch
    statistics in the reserve spaces; inference: with ``mean`` and ``variance``), giving
    gradients to ``x``, ``scale`` and ``offset``.
    """
    return _fused_batch_norm("FusedBatchNormV3", x, scale, offset, mean, variance, epsilon,
                             exponential_avg_factor, data_format, is_training)


# --------------------------------------------------------------------------------------
# Depthwise convolution: the forward op and its two backprops differentiate each other
# --------------------------------------------------------------------------------------
def _sizes(shape: Sequence[int]) -> np.ndarray:
    return np.array(shape, dtype=np.int32)


class _DepthwiseConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, filter: torch.Tensor,
                attrs: dict) -> torch.Tensor:
        ctx.attrs = attrs
        ctx.save_for_backward(input, filter)
        return _run("DepthwiseConv2dNative", {"input": input, "filter": filter}, attrs)[0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = _DepthwiseBackpropInput.apply(w, g, tuple(x.shape), ctx.attrs)
        if ctx.needs_input_grad[1]:
            dw = _DepthwiseBackpropFilter.apply(x, g, tuple(w.shape), ctx.attrs)
        return dx, dw, None


class _DepthwiseBackpropInput(torch.autograd.Function):
    """dx = BackpropInput(filter, g): bilinear in (filter, g)."""

    @staticmethod
    def forward(ctx: Any, filter: torch.Tensor, g: torch.Tensor, input_sizes: tuple,
                attrs: dict) -> torch.Tensor:
        ctx.attrs = attrs
        ctx.save_for_backward(filter, g)
        return _run("DepthwiseConv2dNativeBackpropInput", {"filter": filter, "out_backprop": g},
                    attrs, {"input_sizes": _sizes(input_sizes)})[0]

    @staticmethod
    def backward(ctx: Any, gg: torch.Tensor) -> tuple:
        w, g = ctx.saved_tensors
        dw = dg = None
        if ctx.needs_input_grad[0]:
            dw = _DepthwiseBackpropFilter.apply(gg, g, tuple(w.shape), ctx.attrs)
        if ctx.needs_input_grad[1]:
            dg = _DepthwiseConv.apply(gg, w, ctx.attrs)
        return dw, dg, None, None


class _DepthwiseBackpropFilter(torch.autograd.Function):
    """dw = BackpropFilter(input, g): bilinear in (input, g)."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, g: torch.Tensor, filter_sizes: tuple,
                attrs: dict) -> torch.Tensor:
        ctx.attrs = attrs
        ctx.save_for_backward(input, g)
        return _run("DepthwiseConv2dNativeBackpropFilter", {"input": input, "out_backprop": g},
                    attrs, {"filter_sizes": _sizes(filter_sizes)})[0]

    @staticmethod
    def backward(ctx: Any, gg: torch.Tensor) -> tuple:
        x, g = ctx.saved_tensors
        dx = dg = None
        if ctx.needs_input_grad[0]:
            dx = _DepthwiseBackpropInput.apply(gg, g, tuple(x.shape), ctx.attrs)
        if ctx.needs_input_grad[1]:
            dg = _DepthwiseConv.apply(x, gg, ctx.attrs)
        return dx, dg, None, None


def depthwise_conv2d_native(input: torch.Tensor, filter: torch.Tensor, strides: Sequence[int],
                            padding: str, explicit_paddings: Sequence[int] = (),
                            data_format: str = "NHWC", dilations: Sequence[int] = (1, 1, 1, 1),
                            *, name: str | None = None) -> torch.Tensor:
    """``tfgrad.depthwise_conv2d_native`` on torch tensors, differentiable to any order.

    ``input`` is [N, H, W, C] (or [N, C, H, W] with data_format="NCHW"), ``filter`` is
    TF's [fh, fw, C, M]. Backward: ``DepthwiseConv2dNativeBackpropInput`` and
    ``...BackpropFilter`` with the same attrs.
    """
    attrs = {"strides": tuple(strides), "padding": padding,
             "explicit_paddings": tuple(explicit_paddings), "data_format": data_format,
             "dilations": tuple(dilations)}
    return _DepthwiseConv.apply(input, filter, attrs)


# --------------------------------------------------------------------------------------
# Fractional pooling
# --------------------------------------------------------------------------------------
def _cell_matrix(seq: torch.Tensor, n: int, overlapping: bool, dtype: torch.dtype
                 ) -> torch.Tensor:
    """[cells, n] matrix averaging each pooling cell (TF's cell bounds, clamped to n-1)."""
    start = seq[:-1]
    end = (seq[1:] if overlapping else seq[1:] - 1).clamp(max=n - 1)
    idx = torch.arange(n)
    member = (idx[None, :] >= start[:, None]) & (idx[None, :] <= end[:, None])
    count = (end - start + 1).clamp(min=1)
    return member.to(dtype) / count[:, None].to(dtype)


def _avg_pool_over_sequences(v: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                             overlapping: bool) -> torch.Tensor:
    """Average of v [N, H, W, C] over the cells the sequences define (differentiable).

    The adjoint of FractionalAvgPoolGrad, used for its double backward (not bit-exact).
    """
    mr = _cell_matrix(rows, v.shape[1], overlapping, v.dtype)
    mc = _cell_matrix(cols, v.shape[2], overlapping, v.dtype)
    return torch.einsum("ir,nrsc,js->nijc", mr, v, mc)


class _FractionalAvgPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, attrs: dict) -> tuple:
        out, rows, cols = _run("FractionalAvgPool", {"value": value}, attrs)
        ctx.shape, ctx.overlapping = tuple(value.shape), attrs["overlapping"]
        ctx.save_for_backward(rows, cols)
        ctx.mark_non_differentiable(rows, cols)
        return out, rows, cols

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, *unused: Any) -> tuple:
        rows, cols = ctx.saved_tensors
        return _FractionalAvgPoolGrad.apply(g, rows, cols, ctx.shape, ctx.overlapping), None


class _FractionalAvgPoolGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, g: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                shape: tuple, overlapping: bool) -> torch.Tensor:
        ctx.overlapping = overlapping
        ctx.save_for_backward(rows, cols)
        return _run("FractionalAvgPoolGrad",
                    {"out_backprop": g, "row_pooling_sequence": rows,
                     "col_pooling_sequence": cols},
                    {"overlapping": overlapping},
                    {"orig_input_tensor_shape": np.array(shape, dtype=np.int64)})[0]

    @staticmethod
    def backward(ctx: Any, gg: torch.Tensor) -> tuple:
        rows, cols = ctx.saved_tensors
        return _avg_pool_over_sequences(gg, rows, cols, ctx.overlapping), None, None, None, None


class _FractionalMaxPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, attrs: dict) -> tuple:
        out, rows, cols = _run("FractionalMaxPool", {"value": value}, attrs)
        ctx.overlapping = attrs["overlapping"]
        ctx.save_for_backward(value, out, rows, cols)
        ctx.mark_non_differentiable(rows, cols)
        return out, rows, cols

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, *unused: Any) -> tuple:
        value, out, rows, cols = ctx.saved_tensors
        return _FractionalMaxPoolGrad.apply(value, out, g, rows, cols, ctx.overlapping), None


class _FractionalMaxPoolGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, out: torch.Tensor, g: torch.Tensor,
                rows: torch.Tensor, cols: torch.Tensor, overlapping: bool) -> torch.Tensor:
        return _run("FractionalMaxPoolGrad",
                    {"orig_input": value, "orig_output": out, "out_backprop": g,
                     "row_pooling_sequence": rows, "col_pooling_sequence": cols},
                    {"overlapping": overlapping})[0]

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        raise _no_double_backward("FractionalMaxPool", "FractionalMaxPoolGrad")


def _pool_attrs(pooling_ratio: Sequence[float], pseudo_random: bool, overlapping: bool,
                deterministic: bool, seed: int, seed2: int) -> dict:
    return {"pooling_ratio": tuple(pooling_ratio), "pseudo_random": pseudo_random,
            "overlapping": overlapping, "deterministic": deterministic, "seed": seed,
            "seed2": seed2}


def fractional_avg_pool(value: torch.Tensor, pooling_ratio: Sequence[float],
                        pseudo_random: bool = False, overlapping: bool = False,
                        deterministic: bool = False, seed: int = 0, seed2: int = 0, *,
                        name: str | None = None) -> Any:
    """``tfgrad.fractional_avg_pool`` on torch tensors: (output, row_pooling_sequence,
    col_pooling_sequence) as ``raw_ops.FractionalAvgPool``'s namedtuple.

    ``value`` is NHWC. The sequences are drawn as the raw op draws them (fixed by
    (seed, seed2) when deterministic=True) and saved for the backward,
    ``FractionalAvgPoolGrad``.
    """
    attrs = _pool_attrs(pooling_ratio, pseudo_random, overlapping, deterministic, seed, seed2)
    return raw_ops.FractionalAvgPool.Output(*_FractionalAvgPool.apply(value, attrs))


def fractional_max_pool(value: torch.Tensor, pooling_ratio: Sequence[float],
                        pseudo_random: bool = False, overlapping: bool = False,
                        deterministic: bool = False, seed: int = 0, seed2: int = 0, *,
                        name: str | None = None) -> Any:
    """``tfgrad.fractional_max_pool`` on torch tensors: (output, row_pooling_sequence,
    col_pooling_sequence) as ``raw_ops.FractionalMaxPool``'s namedtuple.

    ``value`` is NHWC; the backward is ``FractionalMaxPoolGrad`` with the saved input,
    output and sequences (the gradient goes to the first maximum of each cell).
    """
    attrs = _pool_attrs(pooling_ratio, pseudo_random, overlapping, deterministic, seed, seed2)
    return raw_ops.FractionalMaxPool.Output(*_FractionalMaxPool.apply(value, attrs))


# --------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------
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

    def _seeds(self) -> tuple[int, int]:
        if self.seed is None:
            # Drawn from torch's generator, so torch.manual_seed makes runs repeatable.
            s = torch.randint(1, 2**62, (2,))
            return int(s[0]), int(s[1])
        if isinstance(self.seed, int):  # as tf.nn.fractional_*_pool without a global seed
            return 87654321, self.seed
        return int(self.seed[0]), int(self.seed[1])

    def forward(self, x: torch.Tensor) -> Any:
        nchw = self.data_format == "NCHW"
        seed, seed2 = self._seeds()
        out = type(self)._fn(x.permute(0, 2, 3, 1) if nchw else x, self.pooling_ratio,
                             self.pseudo_random, self.overlapping, True, seed, seed2)
        y = out.output.permute(0, 3, 1, 2) if nchw else out.output
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
