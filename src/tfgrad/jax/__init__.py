"""JAX adapter: tfgrad's ops as JAX primitives with TF 2.21's semantics and gradients.

The functions have the names, argument names, defaults, layouts and outputs of tfgrad's
functional API (and :mod:`tfgrad.torch`'s), take and return JAX arrays, and work under
``jax.jit``, ``jax.grad`` / ``jax.vjp``, ``jax.jvp`` / ``jax.jacfwd``, ``jax.vmap``,
``shard_map`` and sharded ``jit``. :mod:`tfgrad.jax.raw_ops` has every op (gradient ops
included) by TF name.

Two implementations of every op (:func:`use_impl`):

- ``"exact"``: a host callback into tfgrad's CPU kernels: TF 2.21's bits.
- ``"native"``: jax.numpy / jax.lax code (:mod:`tfgrad.jax._native`) that XLA compiles for
  any backend and partitions over meshes: TF's semantics (nudging, rounding, masks,
  pooling sequences), values within the distances each family module documents (its
  ``BOUNDS``).
- ``"auto"`` (the default) decides when the computation is lowered: ``"exact"`` on the
  CPU for a single device, ``"native"`` on GPUs/TPUs and in computations over several
  devices (sharded ``jit``, ``shard_map``), where a callback would copy to the host or
  gather the operands onto one device.

Gradients are TF's: the backward of each op is the gradient op(s) TF's registered gradient
function calls (:mod:`tfgrad._gradients`), with the same inputs, in either implementation.
So only the first output of a multi-output op is differentiable, batch norm's ``mean`` and
``variance`` get zero gradients, and fake quantization passes gradients inside the nudged
range. Second (and higher) derivatives follow the table where TF defines them: depthwise
convolution's three ops differentiate each other; batch norm's and average pooling's
gradients are differentiated through their native implementation (as TF differentiates its
composite), in both implementations. Forward mode (``jax.jvp``, ``jax.jacfwd``,
``jax.hessian``) transposes TF's gradient. Differentiating an op TF gives no gradient
(fake quantization's and fractional max pooling's gradient ops) raises ``LookupError``.

- ``jax.vmap``: the native code is batched by XLA; the exact callback runs once per element.
- Argument errors raise while tracing: ``TypeError`` for a dtype the op does not take (no
  silent casts), ``tfgrad.InvalidArgumentError`` for shapes and attrs (shapes and dtypes
  come from :func:`tfgrad._shapes.infer`, without running the op).
- Without ``jax_enable_x64`` JAX has no int64 or float64: the pooling sequences are int32
  (same values) and the float64 ops are unavailable. Set it globally for the exact
  implementation (JAX checks callback results on XLA's threads, where the thread-local
  ``jax.enable_x64()`` context is not in force).
- Fractional pooling's ``seed`` and ``seed2`` may be Python ints (attrs, as in TF) or
  integer JAX arrays (traced: a jitted step draws new regions every call without
  recompiling). ``deterministic=False`` draws fresh seeds on every run in the exact
  implementation, as TF does (which breaks ``pure_callback``'s purity contract: under
  ``jit`` prefer ``deterministic=True`` with explicit seeds); see the fractional-pool
  native module for the native behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    import jax
except ImportError as _e:  # pragma: no cover - exercised only without jax
    raise ImportError("tfgrad.jax needs JAX: pip install tfgrad[jax]") from _e

from . import raw_ops
from ._choice import use_impl

__all__ = [
    "avg_pool",
    "bias_add",
    "conv2d",
    "depthwise_conv2d_native",
    "fake_quant_with_min_max_args",
    "fake_quant_with_min_max_vars",
    "fake_quant_with_min_max_vars_per_channel",
    "fractional_avg_pool",
    "fractional_max_pool",
    "fused_batch_norm",
    "fused_batch_norm_v2",
    "fused_batch_norm_v3",
    "mat_mul",
    "max_pool",
    "mean",
    "raw_ops",
    "relu",
    "relu6",
    "rsqrt",
    "softmax",
    "sparse_softmax_cross_entropy_with_logits",
    "squared_difference",
    "sum",
    "use_impl",
]


def fake_quant_with_min_max_args(inputs: Any, min: float = -6.0, max: float = 6.0,
                                 num_bits: int = 8, narrow_range: bool = False, *,
                                 name: str | None = None) -> jax.Array:
    """``tfgrad.fake_quant_with_min_max_args`` in JAX; backward:
    ``FakeQuantWithMinMaxArgsGradient`` (the gradient inside the nudged range, else 0)."""
    return raw_ops.FakeQuantWithMinMaxArgs(inputs=inputs, min=min, max=max, num_bits=num_bits,
                                           narrow_range=narrow_range)


def fake_quant_with_min_max_vars(inputs: Any, min: Any, max: Any, num_bits: int = 8,
                                 narrow_range: bool = False, *,
                                 name: str | None = None) -> jax.Array:
    """``tfgrad.fake_quant_with_min_max_vars`` in JAX; gradients to inputs, min and max
    from ``FakeQuantWithMinMaxVarsGradient``."""
    return raw_ops.FakeQuantWithMinMaxVars(inputs=inputs, min=min, max=max, num_bits=num_bits,
                                           narrow_range=narrow_range)


def fake_quant_with_min_max_vars_per_channel(inputs: Any, min: Any, max: Any,
                                             num_bits: int = 8, narrow_range: bool = False,
                                             *, name: str | None = None) -> jax.Array:
    """``tfgrad.fake_quant_with_min_max_vars_per_channel`` in JAX (channels last); gradients
    from ``FakeQuantWithMinMaxVarsPerChannelGradient``."""
    return raw_ops.FakeQuantWithMinMaxVarsPerChannel(inputs=inputs, min=min, max=max,
                                                     num_bits=num_bits,
                                                     narrow_range=narrow_range)


def _batch_norm(op: str, x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                epsilon: float, exponential_avg_factor: float, data_format: str,
                is_training: bool) -> Any:
    return getattr(raw_ops, op)(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                                epsilon=epsilon, exponential_avg_factor=exponential_avg_factor,
                                data_format=data_format, is_training=is_training)


def fused_batch_norm(x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                     epsilon: float = 0.0001, exponential_avg_factor: float = 1.0,
                     data_format: str = "NHWC", is_training: bool = True, *,
                     name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm`` in JAX; ``y`` is differentiable (FusedBatchNormGrad)."""
    return _batch_norm("FusedBatchNorm", x, scale, offset, mean, variance, epsilon,
                       exponential_avg_factor, data_format, is_training)


def fused_batch_norm_v2(x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                        epsilon: float = 0.0001, exponential_avg_factor: float = 1.0,
                        data_format: str = "NHWC", is_training: bool = True, *,
                        name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm_v2`` in JAX; ``y`` is differentiable (FusedBatchNormGradV2)."""
    return _batch_norm("FusedBatchNormV2", x, scale, offset, mean, variance, epsilon,
                       exponential_avg_factor, data_format, is_training)


def fused_batch_norm_v3(x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                        epsilon: float = 0.0001, exponential_avg_factor: float = 1.0,
                        data_format: str = "NHWC", is_training: bool = True, *,
                        name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm_v3`` in JAX: the namedtuple (y, batch_mean, batch_variance,
    reserve_space_1, reserve_space_2, reserve_space_3). ``y`` is differentiable
    (FusedBatchNormGradV3, gradients to x, scale and offset)."""
    return _batch_norm("FusedBatchNormV3", x, scale, offset, mean, variance, epsilon,
                       exponential_avg_factor, data_format, is_training)


def depthwise_conv2d_native(input: Any, filter: Any, strides: Sequence[int], padding: str,
                            explicit_paddings: Sequence[int] = (), data_format: str = "NHWC",
                            dilations: Sequence[int] = (1, 1, 1, 1), *,
                            name: str | None = None) -> jax.Array:
    """``tfgrad.depthwise_conv2d_native`` in JAX, differentiable to any order (backward:
    DepthwiseConv2dNativeBackpropInput / ...BackpropFilter)."""
    return raw_ops.DepthwiseConv2dNative(input=input, filter=filter, strides=strides,
                                         padding=padding, explicit_paddings=explicit_paddings,
                                         data_format=data_format, dilations=dilations)


def fractional_avg_pool(value: Any, pooling_ratio: Sequence[float], pseudo_random: bool = False,
                        overlapping: bool = False, deterministic: bool = False, seed: Any = 0,
                        seed2: Any = 0, *, name: str | None = None) -> Any:
    """``tfgrad.fractional_avg_pool`` in JAX: (output, row_pooling_sequence,
    col_pooling_sequence). ``value`` is NHWC; the backward is FractionalAvgPoolGrad over
    the forward's sequences. ``seed``/``seed2`` may be traced integer arrays."""
    return raw_ops.FractionalAvgPool(value=value, pooling_ratio=pooling_ratio,
                                     pseudo_random=pseudo_random, overlapping=overlapping,
                                     deterministic=deterministic, seed=seed, seed2=seed2)


def fractional_max_pool(value: Any, pooling_ratio: Sequence[float], pseudo_random: bool = False,
                        overlapping: bool = False, deterministic: bool = False, seed: Any = 0,
                        seed2: Any = 0, *, name: str | None = None) -> Any:
    """``tfgrad.fractional_max_pool`` in JAX: (output, row_pooling_sequence,
    col_pooling_sequence); backward FractionalMaxPoolGrad (to each cell's first maximum)."""
    return raw_ops.FractionalMaxPool(value=value, pooling_ratio=pooling_ratio,
                                     pseudo_random=pseudo_random, overlapping=overlapping,
                                     deterministic=deterministic, seed=seed, seed2=seed2)



def conv2d(input: Any, filter: Any, strides: Sequence[int], padding: str,
           use_cudnn_on_gpu: bool = True, explicit_paddings: Sequence[int] = (),
           data_format: str = "NHWC", dilations: Sequence[int] = (1, 1, 1, 1), *,
           name: str | None = None) -> jax.Array:
    """``tfgrad.conv2d`` in JAX (NHWC), differentiable to any order (backward:
    Conv2DBackpropInput / Conv2DBackpropFilter)."""
    return raw_ops.Conv2D(input=input, filter=filter, strides=strides, padding=padding,
                          use_cudnn_on_gpu=use_cudnn_on_gpu,
                          explicit_paddings=explicit_paddings, data_format=data_format,
                          dilations=dilations)


def mat_mul(a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False,
            grad_a: bool = False, grad_b: bool = False, *,
            name: str | None = None) -> jax.Array:
    """``tfgrad.mat_mul`` in JAX; backward: MatMul with TF's _MatMulGrad transposes."""
    return raw_ops.MatMul(a=a, b=b, transpose_a=transpose_a, transpose_b=transpose_b,
                          grad_a=grad_a, grad_b=grad_b)


def bias_add(value: Any, bias: Any, data_format: str = "NHWC", *,
             name: str | None = None) -> jax.Array:
    """``tfgrad.bias_add`` in JAX; backward: the incoming gradient and BiasAddGrad."""
    return raw_ops.BiasAdd(value=value, bias=bias, data_format=data_format)


def relu(features: Any, *, name: str | None = None) -> jax.Array:
    """``tfgrad.relu`` in JAX; backward: ReluGrad on the output."""
    return raw_ops.Relu(features=features)


def relu6(features: Any, *, name: str | None = None) -> jax.Array:
    """``tfgrad.relu6`` in JAX; backward: Relu6Grad."""
    return raw_ops.Relu6(features=features)


def sum(input: Any, axis: Any, keep_dims: bool = False, *,
        name: str | None = None) -> jax.Array:
    """``tfgrad.sum`` in JAX (Eigen's reduction order); backward: a broadcast."""
    return raw_ops.Sum(input=input, axis=axis, keep_dims=keep_dims)


def mean(input: Any, axis: Any, keep_dims: bool = False, *,
         name: str | None = None) -> jax.Array:
    """``tfgrad.mean`` in JAX; backward: a broadcast divided by the float32 count."""
    return raw_ops.Mean(input=input, axis=axis, keep_dims=keep_dims)


def sparse_softmax_cross_entropy_with_logits(features: Any, labels: Any, *,
                                             name: str | None = None) -> Any:
    """``tfgrad.sparse_softmax_cross_entropy_with_logits`` in JAX: (loss, backprop); the
    loss is differentiable (grad_loss * backprop)."""
    return raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=features, labels=labels)


def softmax(logits: Any, *, name: str | None = None) -> jax.Array:
    """``tfgrad.softmax`` in JAX (over the last axis); backward: TF's _SoftmaxGrad
    composite on tfgrad's Sum (TF's bits on the exact path)."""
    return raw_ops.Softmax(logits=logits)


def avg_pool(value: Any, ksize: list[int], strides: list[int], padding: str,
             data_format: str = "NHWC", *, name: str | None = None) -> jax.Array:
    """``tfgrad.avg_pool`` in JAX; backward: AvgPoolGrad."""
    return raw_ops.AvgPool(value=value, ksize=ksize, strides=strides, padding=padding,
                           data_format=data_format)


def max_pool(input: Any, ksize: list[int], strides: list[int], padding: str,
             explicit_paddings: Sequence[int] = (), data_format: str = "NHWC", *,
             name: str | None = None) -> jax.Array:
    """``tfgrad.max_pool`` in JAX; backward: MaxPoolGrad (TF's first-maximum argmax)."""
    return raw_ops.MaxPool(input=input, ksize=ksize, strides=strides, padding=padding,
                           explicit_paddings=list(explicit_paddings),
                           data_format=data_format)


def squared_difference(x: Any, y: Any, *, name: str | None = None) -> jax.Array:
    """``tfgrad.squared_difference`` in JAX (TF's broadcasting); backward: JAX's."""
    return raw_ops.SquaredDifference(x=x, y=y)


def rsqrt(x: Any, *, name: str | None = None) -> jax.Array:
    """``tfgrad.rsqrt`` in JAX (TF's approximate packets); backward: RsqrtGrad."""
    return raw_ops.Rsqrt(x=x)
