"""tfmot QAT models in JAX: :func:`load_keras` builds a pure model from a tf_keras model file
through :mod:`tfgrad.qat`'s plan; :meth:`KerasModel.save_keras` writes it back.

``model = load_keras("qat.h5")`` gives ``model.variables``::

    {"params": {layer: {attr: array}},   # exactly the Keras model's trainable weights
     "state":  {layer: {attr: array}}}   # ranges (kernel_min, output_max, ...), batch norm's
                                         # moving_mean / moving_variance, optimizer_step

keyed by the Keras layer names (``quant_conv2d``) and weight attributes, and
``model.apply(variables, *inputs, training=...) -> (outputs, new_variables)``, a pure
function of NHWC float32 arrays: ``training=True`` is Keras' training call (each quantizer
updates its range before use, as tfmot does; batch norm uses and folds in the batch
statistics), ``training=False`` uses the stored ranges and statistics and returns the
variables unchanged. Jit it with ``training`` (and ``axis_name``) static; differentiate it
with respect to ``variables["params"]``: the state receives no gradient (tfmot's ranges
are non-trainable: ``stop_gradient``). Fake quantization, depthwise convolution and 4-D
batch norm run :mod:`tfgrad.jax`'s ops (TF's bits on a single CPU device, see
``tfgrad.jax.use_impl``). With ``exact=True`` (the default) so does the rest of each Keras
layer's computation, op for op as tf_keras runs it: Conv2D (``tf.nn.convolution``: the
Conv2D op, then ``tf.nn.bias_add``), Dense (MatMul, BiasAdd), ReLU / ``relu`` (Relu),
``ReLU(6.)`` / ``relu6`` (Relu6), GlobalAveragePooling2D (Mean over [1, 2]), average and
max pooling (AvgPool, MaxPool), softmax over the last axis (Softmax; its gradient TF's
composite on Sum) and the 2-D batch norm (Mean, SquaredDifference, Rsqrt, and TF's eager
tape for its gradient); ``exact=False`` runs those on ``jax.lax`` / ``jax.numpy``. Dilated
Conv2D and Dense on inputs of rank > 2 always run ``jax.numpy`` (see docs/qat.md for the
distances). Around the ops, what remains is XLA's own arithmetic: elementwise adds
(Add layers, the sum of a tensor's gradients where it has several consumers), pads,
concatenations and the range arithmetic below. A whole jitted training step
is TF's bit for bit when its loss gradient and update are TF's too
(``tests/test_qat_exact_step.py``): tf_keras' SGD ``var + (-grad * lr)`` needs the product
fenced as below, and ``jax.grad`` of :mod:`tfgrad.jax`'s SparseSoftmaxCrossEntropyWithLogits
multiplies by its native backprop (some entries an ulp off TF's), so the test states TF's
gradient for the loss (``jax.custom_vjp`` over the op's own backprop).

Exact range arithmetic under ``jit``: XLA's CPU compiler contracts a multiply feeding an
add into one FMA (``xla`` always allows LLVM's FP-op fusion; ``lax.optimization_barrier``
does not stop it, it is removed before fusion), and rewrites a division by a constant as a
multiplication by its reciprocal. Measured with jax 0.10.2 on 200,000 random pairs:
``var - (var - v) * d`` differed from float32 numpy in 513, ``x / -0.9921875`` in 9,116.
TF's own elementwise code is compiled without FMA, and tfmot's moving average is
``var - ((var - v) * d)`` with each operation rounded. So each product that TF rounds
before an add passes through a select on itself (``p if p == p else NaN``, which is ``p``;
the add then consumes a select, not a multiply: 0 differences), and constant divisors are
made data-dependent with a ``where`` (0 differences). Both are plain elementwise ops: they
hold under ``jit``, ``grad``, ``vmap`` and ``shard_map`` and cost no synchronisation.
``tests/test_qat_jax.py`` checks that XLA still contracts without them and not with them.

Data parallelism: under ``shard_map`` or ``pmap`` pass ``axis_name`` (the mapped axis) to
``apply``. Each moving-average quantizer then averages its new batch value over the
replicas (``lax.pmean``) before the moving-average update, as ``tf.distribute`` does in
``assign_moving_average`` (the value is MEAN-reduced across replicas, then applied). Batch
norm normalises with each replica's own batch (Keras' BatchNormalization under
MirroredStrategy is not synchronised) and the new moving statistics are averaged over the
replicas: TF keeps them per replica (ON_READ variables, MEAN when read or saved), the
average of the replicas' running averages; the pmean-ed state is that average up to float32
rounding, and keeps every replica's state identical. The model-input quantizer
(AllValues) takes the range of the whole global batch (``pmin`` / ``pmax``), so its state
too is identical on every replica. Weight ranges need no collective (replicated weights).
Without ``axis_name`` a ``jit`` over a sharded batch computes the global batch's ranges
and statistics (XLA partitions the reductions), like a single device.

Where every op would run exact and no ``axis_name`` is given, ``apply`` runs the whole
model as :mod:`tfgrad.qat._exec`'s program in one host callback forward and one backward
(``KerasModel.fused``; the same bits as a callback per op: ``tfgrad.jax._qat_fused``).
"""

from __future__ import annotations

import functools
import math
import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import qat as _qat
from ..qat import KerasFileError, Node, Plan, Quantizer, Weight, _exec
from ..qat._ranges import RangeOps, updated_range
from . import depthwise_conv2d_native as _depthwise
from . import fake_quant_with_min_max_vars as _fq
from . import fake_quant_with_min_max_vars_per_channel as _fq_pc
from . import fused_batch_norm_v3 as _fbn
from . import raw_ops as _raw
from ._qat_fused import Fused
from ._qat_fused import range_attrs as _range_attrs

Variables = dict[str, dict[str, dict[str, jax.Array]]]

# float32(1 - 0.999), as assign_moving_average converts the Python float
_EMA = np.float32(1.0 - 0.999)


# --- float32 rounding as TF's elementwise kernels do ------------------------------------

def _times(a: Any, b: Any) -> Any:
    """``a * b`` rounded to float32 before anything uses it: the product goes through a
    select on itself (``p`` where ``p == p``, else NaN: ``p`` in every case), so no add
    consumes the multiply directly and LLVM cannot contract the two into an FMA."""
    p = jnp.multiply(a, b)
    return jnp.where(p == p, p, jnp.full((), jnp.nan, p.dtype))


def _divide(x: Any, divisor: Any) -> Any:
    """``x / divisor`` as an IEEE division: XLA rewrites a division by a constant into a
    multiplication by the constant's reciprocal (off by an ulp for most divisors), so the
    divisor is made data-dependent (``divisor`` where ``x`` is a number; where ``x`` is NaN
    the quotient is NaN whatever the divisor)."""
    x = jnp.asarray(x)
    return x / jnp.where(x == x, jnp.asarray(divisor, x.dtype), jnp.ones((), x.dtype))


# --- quantizers -------------------------------------------------------------------------

# (the products and the division by the symmetric ratio fenced: no FMA, no reciprocal)
_JAX_OPS = RangeOps(jnp.minimum, jnp.maximum, _divide, _times)


def _batch_range(q: Quantizer, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    # TF's Min / Max of nothing (a batch of 0) are +inf / -inf.
    if q.per_axis:
        if x.ndim >= 2:  # tfmot reduces over [0] (rank 2) or [0, 1, 2] (rank 4)
            flat = x.reshape(-1, x.shape[-1])
            return flat.min(0, initial=np.inf), flat.max(0, initial=-np.inf)
        return x, x
    return x.min(initial=np.inf), x.max(initial=-np.inf)


def quantize(q: Quantizer, x: jax.Array, lo: jax.Array, hi: jax.Array, training: bool,
             axis_name: str | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One of tfmot's quantizers: ``(fake-quantized x, new min, new max)``.

    Training: the batch range (min/max, the symmetric rule), then the update of the
    quantizer's kind (last value; moving average from the stored range; all values), and
    the fake quant uses the updated range (tfmot assigns, then quantizes with the assigned
    values). Inference: the stored range, unchanged. The range never gets a gradient.
    """
    if training:
        xs = lax.stop_gradient(x)
        bmin, bmax = _batch_range(q, xs)
        ops = _JAX_OPS
        if axis_name is not None:  # all values: the global batch's range (identical
            ops = ops._replace(  # replicas); moving averages: the mean of the new values
                global_range=lambda a, b: (lax.pmin(a, axis_name), lax.pmax(b, axis_name)),
                replica_mean=lambda a, b: lax.pmean((a, b), axis_name))
        new_lo, new_hi = updated_range(q, lo, hi, bmin, bmax, jnp.zeros((), xs.dtype), _EMA,
                                       ops)
        lo, hi = lax.stop_gradient(new_lo), lax.stop_gradient(new_hi)
    else:
        lo, hi = lax.stop_gradient(lo), lax.stop_gradient(hi)
    fq = _fq_pc if q.per_axis else _fq
    return fq(x, lo, hi, num_bits=q.num_bits, narrow_range=q.narrow_range), lo, hi


# --- layers -----------------------------------------------------------------------------

def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


@jax.custom_vjp
def _softmax(x: jax.Array) -> jax.Array:
    """TF's CPU softmax over the last axis: ``exp(x - max) * (1 / sum)`` (Eigen multiplies
    by the sum's inverse); its gradient is TF's SoftmaxGrad."""
    e = jnp.exp(x - lax.stop_gradient(x.max(-1, keepdims=True)))
    return e * (1.0 / e.sum(-1, keepdims=True))


def _softmax_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    y = _softmax(x)
    return y, y


def _softmax_bwd(y: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    # TF's _SoftmaxGrad: (grad - sum(grad * softmax, -1, keepdims)) * softmax
    return ((g - (g * y).sum(-1, keepdims=True)) * y,)


_softmax.defvjp(_softmax_fwd, _softmax_bwd)


def _softmax_axis(x: jax.Array, axis: int) -> jax.Array:
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        return _softmax(x)
    return jnp.moveaxis(_softmax(jnp.moveaxis(x, axis, -1)), -1, axis)


def _activate(x: jax.Array, name: str) -> jax.Array:
    if name in ("linear", "noop"):
        return x
    if name == "relu":  # gradient 0 at 0, as TF's ReluGrad (jnp.maximum's would be 0.5)
        return jax.nn.relu(x)
    if name == "relu6":  # gradient 0 at 0 and 6, as TF's Relu6Grad
        return jax.nn.relu6(x)
    if name == "softmax":
        return _softmax(x)
    if name == "sigmoid":
        return jax.nn.sigmoid(x)
    if name == "tanh":
        return jnp.tanh(x)
    if name == "swish":
        return x * jax.nn.sigmoid(x)
    raise KerasFileError(f"activation {name!r}")  # the plan refuses these first


def _conv2d(x: jax.Array, k: jax.Array, s: tuple[int, int], d: tuple[int, int],
            padding: str) -> jax.Array:
    """Keras' Conv2D on NHWC with an HWIO kernel; JAX's SAME puts the extra padding at the
    end, as TF does."""
    return lax.conv_general_dilated(x, k, s, padding.upper(), rhs_dilation=d,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    precision=lax.Precision.HIGHEST)


def _same_pads(size: int, k: int, s: int) -> tuple[int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def _pool(x: jax.Array, cfg: Mapping[str, Any], is_max: bool, exact: bool = False
          ) -> jax.Array:
    k = _pair(cfg.get("pool_size", 2))
    s = _pair(cfg.get("strides") or k)
    window, strides = (1, *k, 1), (1, *s, 1)
    if exact:  # TF's MaxPool / AvgPool (their gradients MaxPoolGrad / AvgPoolGrad)
        attrs = dict(ksize=list(window), strides=list(strides),
                     padding=str(cfg.get("padding", "valid")).upper())
        return _raw.MaxPool(input=x, **attrs) if is_max else _raw.AvgPool(value=x, **attrs)
    if str(cfg.get("padding", "valid")).lower() == "same":
        pads = ((0, 0), _same_pads(x.shape[1], k[0], s[0]), _same_pads(x.shape[2], k[1], s[1]),
                (0, 0))
    else:
        pads = ((0, 0),) * 4
    if is_max:
        return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pads)
    total = lax.reduce_window(x, 0.0, lax.add, window, strides, pads)
    # TF's AvgPool divides each window's sum by its number of in-bounds elements
    return _divide(total, _window_counts(x.shape[1], x.shape[2], k, s, pads))


def _window_counts(h: int, w: int, k: tuple[int, int], s: tuple[int, int],
                   pads: Sequence[tuple[int, int]]) -> np.ndarray:
    """The number of in-bounds elements of each pooling window, (1, OH, OW, 1)."""
    def axis(size: int, kk: int, ss: int, pad: tuple[int, int]) -> np.ndarray:
        n = (size + pad[0] + pad[1] - kk) // ss + 1
        start = np.arange(n) * ss - pad[0]
        return np.minimum(start + kk, size) - np.maximum(start, 0)
    rows, cols = axis(h, k[0], s[0], pads[1]), axis(w, k[1], s[1], pads[2])
    return (rows[:, None] * cols[None, :]).astype(np.float32)[None, :, :, None]


def _relu_layer(x: jax.Array, cfg: Mapping[str, Any], exact: bool = False) -> jax.Array:
    """tf_keras' backend.relu: Relu6 for max_value 6, else Relu then a clip."""
    if float(cfg.get("negative_slope", 0.0) or 0.0) != 0.0 or float(
            cfg.get("threshold", 0.0) or 0.0) != 0.0:
        raise KerasFileError("ReLU with negative_slope or threshold is not supported")
    mx = cfg.get("max_value")
    if mx is not None and float(mx) == 6.0:  # tf_keras' backend.relu takes tf.nn.relu6
        return _raw.Relu6(features=x) if exact else jax.nn.relu6(x)
    y = _raw.Relu(features=x) if exact else jax.nn.relu(x)
    return y if mx is None else jnp.clip(y, None, float(mx))


def _mean(x: jax.Array, axes: tuple[int, ...], keepdims: bool) -> jax.Array:
    """tf.reduce_mean: the sum divided by the count (a division, as TF's MeanReducer)."""
    n = int(np.prod([x.shape[a] for a in axes]))
    return _divide(x.sum(axes, keepdims=keepdims), np.float32(n))


# --- TF's ops for the rest of a Keras layer (the exact path) ---------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _keras_bn2d(x: jax.Array, gamma: jax.Array, beta: jax.Array, eps: float
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """tf_keras' BatchNormalization of a [N, C] batch in training (tf.nn.moments, then
    tf.nn.batch_normalization) on TF's ops; its gradient TF's eager tape (as
    tfgrad.torch.qat's): returns y and the batch mean and variance."""
    return _keras_bn2d_fwd(x, gamma, beta, eps)[0]


def _keras_bn2d_fwd(x: jax.Array, gamma: jax.Array, beta: jax.Array, eps: float
                    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], tuple]:
    mean = _raw.Mean(input=x, axis=[0], keep_dims=True)
    var = _raw.Mean(input=_raw.SquaredDifference(x=x, y=mean), axis=[0], keep_dims=True)
    m, v = mean.reshape(-1), var.reshape(-1)
    r = _raw.Rsqrt(x=v + np.float32(eps))  # AddV2 of the float32 epsilon
    inv = _times(r, gamma)
    y = _times(x, inv) + (beta - _times(m, inv))
    return (y, m, v), (x, gamma, mean, m, r, inv)


def _keras_bn2d_bwd(eps: float, res: tuple, cts: tuple) -> tuple:
    x, gamma, mean, m, r, inv = res
    dy = cts[0]
    n = np.float32(x.shape[0])
    db = _raw.Sum(input=dy, axis=[0])
    neg = -db
    d_inv = _raw.Sum(input=_times(x, dy), axis=[0]) + _times(neg, m)  # AddN of two
    dgamma = _times(d_inv, r)
    dv = _raw.RsqrtGrad(y=r, dy=_times(d_inv, gamma))
    dmean = _divide(jnp.broadcast_to(_times(neg, inv), x.shape), n)  # Tile, RealDiv
    dsd = _divide(jnp.broadcast_to(dv, x.shape), n)
    xg = _times(_times(np.float32(2), dsd), x - mean)
    dx = (_times(dy, inv) + dmean) + xg  # AddN(3): (a + b) + c
    return dx, dgamma, db


_keras_bn2d.defvjp(_keras_bn2d_fwd, _keras_bn2d_bwd)


def _tf_conv2d(x: jax.Array, k: jax.Array, s: tuple[int, int], padding: str) -> jax.Array:
    """tf.nn.convolution of tf_keras' Conv2D (no dilation): the Conv2D op, NHWC / HWIO."""
    return _raw.Conv2D(input=x, filter=k, strides=[1, s[0], s[1], 1],
                       padding=padding.upper())


def _tf_mean(x: jax.Array, axes: tuple[int, ...], keepdims: bool) -> jax.Array:
    return _raw.Mean(input=x, axis=list(axes), keep_dims=keepdims)


def _tf_softmax(x: jax.Array) -> jax.Array:
    """tf.nn.softmax over the last axis: TF's Softmax op, whose reverse mode in tfgrad.jax
    is TF's _SoftmaxGrad composite on TF's Sum, ``(g - Sum(g * y, -1, keepdims)) * y``."""
    return _raw.Softmax(logits=x)


def _tf_activate(x: jax.Array, name: str) -> jax.Array:
    if name == "relu":  # tf_keras' activations.relu: tf.nn.relu
        return _raw.Relu(features=x)
    if name == "relu6":
        return _raw.Relu6(features=x)
    if name == "softmax":
        return _tf_softmax(x)
    return _activate(x, name)


class _Run:
    """One apply: the variables in, the new state out."""

    def __init__(self, variables: Mapping[str, Any], training: bool, axis_name: str | None,
                 rng: jax.Array | None, exact: bool = True):
        self.params = variables.get("params", {})
        self.state = variables.get("state", {})
        self.new_state: dict[str, dict[str, jax.Array]] = {
            layer: dict(vs) for layer, vs in self.state.items()}
        self.training = training
        self.axis_name = axis_name
        self.rng = rng
        self.exact = exact

    def weight(self, node: Node, attr: str) -> jax.Array | None:
        for group in (self.params, self.state):
            vs = group.get(node.name, {})
            if attr in vs:
                return vs[attr]
        return None

    def quantize(self, node: Node, q: Quantizer | None, x: jax.Array) -> jax.Array:
        if q is None:
            return x
        a_lo, a_hi = _range_attrs(node, q)
        st = self.state[node.name]
        y, lo, hi = quantize(q, x, st[a_lo], st[a_hi], self.training, self.axis_name)
        if self.training:
            self.new_state[node.name][a_lo] = lo
            self.new_state[node.name][a_hi] = hi
        return y

    def kernel(self, node: Node, attr: str) -> jax.Array:
        w = self.weight(node, attr)
        assert w is not None  # the plan lists the weights every kind needs
        return self.quantize(node, node.weight_quantizers.get(attr), w)

    def bias(self, node: Node, y: jax.Array) -> jax.Array:
        b = self.weight(node, "bias")
        if b is None:
            return y
        return _raw.BiasAdd(value=y, bias=b) if self.exact else y + b

    def activate(self, x: jax.Array, name: str) -> jax.Array:
        return _tf_activate(x, name) if self.exact else _activate(x, name)

    def activation(self, node: Node, x: jax.Array) -> jax.Array:
        x = self.quantize(node, node.pre_activation, x)
        x = self.activate(x, node.activation)
        return self.quantize(node, node.post_activation, x)

    def conv2d(self, x: jax.Array, k: jax.Array, s: tuple[int, int], d: tuple[int, int],
               padding: str) -> jax.Array:
        if self.exact and d == (1, 1):
            return _tf_conv2d(x, k, s, padding)
        return _conv2d(x, k, s, d, padding)

    def mean(self, x: jax.Array, axes: tuple[int, ...], keepdims: bool) -> jax.Array:
        return _tf_mean(x, axes, keepdims) if self.exact else _mean(x, axes, keepdims)

    def layer(self, node: Node, xs: Sequence[jax.Array]) -> jax.Array:
        cfg, kind = node.config, node.kind
        x = xs[0] if xs else None
        if kind == "QuantizeLayer":
            y = x
        elif kind == "Conv2D":
            y = self.conv2d(x, self.kernel(node, "kernel"), _pair(cfg.get("strides", 1)),
                            _pair(cfg.get("dilation_rate", 1)), str(cfg["padding"]))
            y = self.activation(node, self.bias(node, y))
        elif kind == "DepthwiseConv2D":
            s, d = _pair(cfg.get("strides", 1)), _pair(cfg.get("dilation_rate", 1))
            y = _depthwise(x, self.kernel(node, "depthwise_kernel"), [1, s[0], s[1], 1],
                           str(cfg["padding"]).upper(), dilations=[1, d[0], d[1], 1])
            y = self.activation(node, self.bias(node, y))
        elif kind == "SeparableConv2D":  # float only: the QAT rewrite splits it
            s, d = _pair(cfg.get("strides", 1)), _pair(cfg.get("dilation_rate", 1))
            y = _depthwise(x, self.kernel(node, "depthwise_kernel"), [1, s[0], s[1], 1],
                           str(cfg["padding"]).upper(), dilations=[1, d[0], d[1], 1])
            y = self.conv2d(y, self.kernel(node, "pointwise_kernel"), (1, 1), (1, 1), "valid")
            y = self.activation(node, self.bias(node, y))
        elif kind == "Dense":
            k = self.kernel(node, "kernel")
            if self.exact and x.ndim == 2:  # tf_keras' Dense: MatMul (rank 2), BiasAdd
                y = _raw.MatMul(a=x, b=k)
            else:
                y = jnp.matmul(x, k, precision=lax.Precision.HIGHEST)
            y = self.activation(node, self.bias(node, y))
        elif kind == "BatchNormalization":
            y = self.batch_norm(node, x)
        elif kind == "ReLU":
            y = _relu_layer(x, cfg, self.exact)
        elif kind == "Activation":
            y = self.activate(x, node.activation)
        elif kind == "Add":
            y = xs[0]
            for other in xs[1:]:
                y = y + other
        elif kind == "Concatenate":
            y = jnp.concatenate(xs, axis=int(cfg.get("axis", -1)))
        elif kind == "ZeroPadding2D":
            (t, b), (lf, r) = _qat._plan._padding2d(cfg["padding"])
            y = jnp.pad(x, ((0, 0), (t, b), (lf, r), (0, 0)))
        elif kind in ("AveragePooling2D", "MaxPooling2D"):
            y = _pool(x, cfg, kind == "MaxPooling2D", self.exact)
        elif kind == "GlobalAveragePooling2D":
            y = self.mean(x, (1, 2), bool(cfg.get("keepdims", False)))
        elif kind == "Dropout":
            y = self.dropout(node, x, float(cfg.get("rate", 0.0)))
        elif kind == "Flatten":
            y = x.reshape(x.shape[0], math.prod(x.shape[1:]))  # (-1: ambiguous at batch 0)
        elif kind == "Reshape":
            y = x.reshape(x.shape[0], *[int(v) for v in cfg["target_shape"]])
        elif kind == "Softmax":
            axis = int(cfg.get("axis", -1))
            y = (_tf_softmax(x) if self.exact and axis % x.ndim == x.ndim - 1
                 else _softmax_axis(x, axis))
        else:  # the plan refuses any other kind
            raise KerasFileError(f"layer {node.name!r}: {kind}")
        return self.quantize(node, node.output, y)

    def dropout(self, node: Node, x: jax.Array, rate: float) -> jax.Array:
        if not self.training or rate == 0.0:  # tf_keras' Dropout returns its input then
            return x
        if self.rng is None:
            raise ValueError(f"layer {node.name!r}: Dropout(rate={rate}) in training needs "
                             "a random key: apply(..., training=True, rng=key)")
        key = jax.random.fold_in(self.rng, zlib.crc32(node.name.encode()) & 0x7FFFFFFF)
        keep = jax.random.uniform(key, x.shape) >= rate
        return jnp.where(keep, x * (1.0 / (1.0 - rate)), jnp.zeros((), x.dtype))

    def batch_norm(self, node: Node, x: jax.Array) -> jax.Array:
        cfg = node.config
        c = x.shape[-1]
        gamma = self.weight(node, "gamma")
        beta = self.weight(node, "beta")
        gamma = jnp.ones(c, x.dtype) if gamma is None else gamma
        beta = jnp.zeros(c, x.dtype) if beta is None else beta
        mean, var = self.state[node.name]["moving_mean"], self.state[node.name]["moving_variance"]
        eps = float(cfg.get("epsilon", 1e-3))
        momentum = float(cfg.get("momentum", 0.99))
        new = self.new_state[node.name]
        if x.ndim == 4:
            # Keras' fused path: tf.compat.v1.nn.fused_batch_norm raises epsilon to 1.001e-5
            eps = max(eps, 1.001e-5)
            if self.training:
                out = _fbn(x, gamma, beta, mean, var, epsilon=eps,
                           exponential_avg_factor=1.0 - momentum, data_format="NHWC",
                           is_training=True)
                if x.shape[0] > 0:
                    m, v = lax.stop_gradient(out.batch_mean), lax.stop_gradient(out.batch_variance)
                    if self.axis_name is not None:
                        m, v = lax.pmean((m, v), self.axis_name)
                    new["moving_mean"], new["moving_variance"] = m, v
                return out.y
            return _fbn(x, gamma, beta, mean, var, epsilon=eps, data_format="NHWC",
                        is_training=False).y
        # rank 2: Keras' unfused path (tf.nn.moments, tf.nn.batch_normalization)
        if self.exact:
            if self.training:
                y, bm, bv = _keras_bn2d(x, gamma, beta, float(eps))
                um, uv = lax.stop_gradient(bm), lax.stop_gradient(bv)
                if self.axis_name is not None:
                    um, uv = lax.pmean((um, uv), self.axis_name)
                decay = np.float32(1.0 - momentum)
                new["moving_mean"] = mean - _times(mean - um, decay)
                new["moving_variance"] = var - _times(var - uv, decay)
                return y
            inv = _times(_raw.Rsqrt(x=var + np.float32(eps)), gamma)
            return _times(x, inv) + (beta - _times(mean, inv))
        if self.training:  # tf.nn.moments: Mean, SquaredDifference, Mean
            bm = self.mean(x, (0,), False)
            bv = self.mean(jnp.square(x - lax.stop_gradient(bm)), (0,), False)
            decay = np.float32(1.0 - momentum)
            um, uv = lax.stop_gradient(bm), lax.stop_gradient(bv)
            if self.axis_name is not None:
                um, uv = lax.pmean((um, uv), self.axis_name)
            # Keras' _assign_moving_average: var - (var - value) * decay, each rounded
            new["moving_mean"] = mean - _times(mean - um, decay)
            new["moving_variance"] = var - _times(var - uv, decay)
            mean, var = bm, bv
        inv = _times(lax.rsqrt(var + eps), gamma)
        # tf.nn.batch_normalization: x * inv + (offset - mean * inv), each op rounded
        return _times(x, inv) + (beta - _times(mean, inv))


# --- the model --------------------------------------------------------------------------


class KerasModel:
    """A tf_keras model (tfmot QAT or float) as pure JAX functions, built from its plan.

    ``variables``: the weights read from the file (see the module docstring);
    ``apply(variables, *inputs, training)``: the forward pass. ``exact``: every layer's
    computation on TF's ops (:func:`load_keras`).
    """

    def __init__(self, plan: Plan, variables: Variables | None = None, exact: bool = True):
        self.plan = plan
        self.exact = exact
        self._fused = (Fused(plan) if exact and _exec.unsupported(plan) is None else None)
        self.fused = self._fused is not None
        """One host callback each way where the exact path can (``_qat_fused``); set it
        to False for a callback per op (read when the apply is traced)."""
        self.variables: Variables = variables if variables is not None else init_variables(
            plan)

    def apply(self, variables: Mapping[str, Any], *inputs: Any, training: bool = False,
              axis_name: str | None = None, rng: jax.Array | None = None
              ) -> tuple[Any, Variables]:
        """The Keras model's call: ``(outputs, new_variables)``.

        ``inputs``: NHWC float32 arrays, one per model input. Returns what the Keras model
        returns (one array, or a list for several outputs) and the variables with the new
        state (``training=True``: the updated ranges and moving statistics; ``False``: the
        same state). Pure: jit it with ``training`` and ``axis_name`` static.

        ``axis_name``: the mapped axis under ``shard_map`` / ``pmap``: moving averages take
        the replica mean of their new values, as tf.distribute does (module docstring).
        ``rng``: a key for Dropout layers with a non-zero rate in training (TF's random
        draws cannot be reproduced; without a key they raise).
        """
        if len(inputs) != len(self.plan.inputs):
            raise TypeError(f"the model takes {len(self.plan.inputs)} input(s) "
                            f"({', '.join(self.plan.inputs)}); got {len(inputs)}")
        run = _Run(variables, training, axis_name, rng, self.exact)
        values: dict[str, jax.Array] = {}
        for name, x in zip(self.plan.inputs, inputs):
            x = jnp.asarray(x)
            shape = self.plan.node(name).output_shape
            if x.ndim != len(shape) or any(
                    want is not None and got != want for got, want in zip(x.shape, shape)):
                raise ValueError(f"input {name!r}: expected shape {list(shape)} (None: any "
                                 f"size; NHWC), got {list(x.shape)}")
            values[name] = x
        if self.fused and self._fused is not None and self._fused.usable(training, axis_name):
            outs, state = self._fused.apply(variables, [values[n] for n in self.plan.inputs],
                                            training)
            new = {"params": variables.get("params", {}), "state": state}
            return (outs[0] if len(outs) == 1 else outs), new
        for node in self.plan.nodes:
            if node.kind != "InputLayer":
                values[node.name] = run.layer(node, [values[i] for i in node.inputs])
        outs = [values[o] for o in self.plan.outputs]
        new = {"params": variables.get("params", {}), "state": run.new_state}
        return (outs[0] if len(outs) == 1 else outs), new

    def keras_weights(self, variables: Mapping[str, Any] | None = None
                      ) -> dict[str, list[tuple[str, np.ndarray]]]:
        """Every weight as tf_keras names it, by layer, in the file's order (numpy)."""
        variables = self.variables if variables is None else variables
        out: dict[str, list[tuple[str, np.ndarray]]] = {}
        for node in self.plan.nodes:
            out[node.name] = [(w.name, np.asarray(_value_of(variables, node, w)))
                              for w in node.weights]
        return out

    def save_keras(self, variables: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
        """Write the model with ``variables`` as a tf_keras ``.h5`` file (tfmot's config,
        layer and weight names and order), loadable by ``tf_keras.models.load_model``
        inside tfmot's ``quantize_scope()``. Written atomically."""
        weights = self.keras_weights(variables)
        for node in self.plan.nodes:
            for (name, value), w in zip(weights[node.name], node.weights):
                if tuple(value.shape) != tuple(w.shape):
                    raise KerasFileError(f"weight {name!r} now has shape {list(value.shape)}; "
                                         f"the Keras model needs {list(w.shape)}")
                if value.dtype != np.dtype(w.dtype):
                    raise KerasFileError(f"weight {name!r} now has dtype {value.dtype}; "
                                         f"the Keras model needs {w.dtype}")
        _qat.write_keras_h5(path, dict(self.plan.config), weights,
                            [n.name for n in self.plan.nodes])


def _group(w: Weight) -> str:
    return "params" if w.trainable else "state"


def _value_of(variables: Mapping[str, Any], node: Node, w: Weight) -> Any:
    try:
        return variables[_group(w)][node.name][w.attr]
    except KeyError:
        raise KerasFileError(f"weight {w.name!r} of layer {node.name!r} is missing from the "
                             f"variables ({_group(w)}[{node.name!r}][{w.attr!r}])") from None


def init_variables(plan: Plan) -> Variables:
    """Variables with tfmot's and Keras' initial values for everything but the trained
    weights (zeros): ranges at the quantizers' initial values, moving_variance 1,
    optimizer_step -1."""
    params: dict[str, dict[str, jax.Array]] = {}
    state: dict[str, dict[str, jax.Array]] = {}
    for node in plan.nodes:
        inits = {}
        for q in (*node.weight_quantizers.values(), node.pre_activation,
                  node.post_activation, node.output):
            if q is not None:
                lo, hi = _range_attrs(node, q)
                inits[lo], inits[hi] = q.init
        for w in node.weights:
            if w.attr == "optimizer_step":
                value = jnp.full(w.shape, -1, jnp.int32)
            else:
                fill = inits.get(w.attr, 1.0 if w.attr == "moving_variance" else 0.0)
                value = jnp.full(w.shape, fill, jnp.dtype(w.dtype))
            (params if w.trainable else state).setdefault(node.name, {})[w.attr] = value
    return {"params": params, "state": state}


def load_keras(path: str | os.PathLike[str], quantize: bool | None = None,
               exact: bool = True) -> KerasModel:
    """Build a JAX model from a tf_keras ``.h5`` model file.

    ``quantize=None`` loads the model as saved: a tfmot QAT model (QuantizeWrapperV2,
    QuantizeLayer and their ranges) as QAT, a float model as float; ``quantize=True``
    quantizes a float model as tfmot's ``quantize_model`` would (its ranges start at tfmot's
    initial values). The file is only read.

    ``exact=True`` runs every layer's computation on TF's ops (:mod:`tfgrad.jax`'s Conv2D,
    MatMul, BiasAdd, Relu, Relu6, Mean besides the quantizers, depthwise convolution and
    batch norm), so that a jitted step on a single CPU device (``use_impl("exact")`` or
    ``"auto"``) gives TF's bits wherever XLA's own arithmetic between the ops does (module
    docstring); ``exact=False`` runs convolutions, dense layers, biases, activations and
    global average pooling on ``jax.lax`` / ``jax.numpy``.
    """
    plan, f = _qat.load_plan(path, quantize)
    variables = load_weights(plan, f.weights, path=os.fspath(path), partial=quantize is True)
    return KerasModel(plan, variables, exact)


def load_weights(plan: Plan, weights: Mapping[str, Sequence[tuple[str, np.ndarray]]],
                 path: str = "<weights>", partial: bool = False) -> Variables:
    """The variables of ``plan`` from tf_keras weights (by layer and weight name).
    ``partial``: the plan's range variables and steps may be missing (a float file
    quantized here: tfmot's initial values)."""
    variables = init_variables(plan)
    by_name = {w: v for layer in weights.values() for w, v in layer}
    for node in plan.nodes:
        for w in node.weights:
            value = by_name.get(w.name, by_name.get(plan.sources.get(w.name, "")))
            if value is None:
                if partial and (w.attr == "optimizer_step" or w.attr.endswith(("_min", "_max"))):
                    continue
                raise KerasFileError(f"{path}: weight {w.name!r} of layer {node.name!r} "
                                     "is missing from the file")
            if tuple(value.shape) != tuple(w.shape):
                raise KerasFileError(f"{path}: weight {w.name!r} has shape {list(value.shape)}"
                                     f" in the file; the model needs {list(w.shape)}")
            variables[_group(w)][node.name][w.attr] = jnp.asarray(
                np.asarray(value, dtype=np.dtype(w.dtype)))
    return variables


__all__: Sequence[str] = ["KerasModel", "Variables", "init_variables", "load_keras",
                          "load_weights", "quantize"]
