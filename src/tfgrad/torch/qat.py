"""tfmot QAT models in PyTorch: :func:`load_keras` builds a ``torch.nn.Module`` from a
tf_keras model file through :mod:`tfgrad.qat`'s plan; :func:`save_keras` writes it back.

The module takes and returns NHWC float32 tensors, as the Keras model does. Its
``parameters()`` are exactly the Keras model's trainable weights, in the file's order; the
range variables, batch norm's moving statistics and tfmot's ``optimizer_step`` are buffers
(never trained: tfmot's are non-trainable). ``module.train()`` is Keras' ``training=True``:
each quantizer updates its range before use, as tfmot does; ``module.eval()`` uses the
stored ranges. With ``exact=True`` (the default) every layer's computation runs on
tfgrad's operators (TF's bits on the CPU): fake quantization, depthwise convolution, batch
norm (fused, and the 2-D layer's moments, Rsqrt and TF's gradient tape), Conv2D, MatMul,
BiasAdd, Relu/Relu6, Softmax (last axis), Mean, average and max pooling; the rest (pads,
concatenations, adds, reshapes) is exact in any framework (docs/qat.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import qat as _qat
from ..dispatch.minmax import batch_range
from ..qat import KerasFileError, Node, Plan, Quantizer, _exec
from ..qat._ranges import RangeOps, updated_range
from . import _qat_fused as _fz
from ._eager import plain_eager
from ._functions import FUNCTIONS

_fq = FUNCTIONS["fake_quant_with_min_max_vars"]
_fq_pc = FUNCTIONS["fake_quant_with_min_max_vars_per_channel"]
_depthwise = FUNCTIONS["depthwise_conv2d_native"]
_fbn = FUNCTIONS["fused_batch_norm_v3"]
# TF's ops for the rest of a Keras layer's computation (the exact path)
_conv2d_tf = FUNCTIONS["conv2d"]
_matmul = FUNCTIONS["mat_mul"]
_bias_add = FUNCTIONS["bias_add"]
_relu = FUNCTIONS["relu"]
_relu6 = FUNCTIONS["relu6"]
_mean = FUNCTIONS["mean"]
_softmax = FUNCTIONS["softmax"]  # (tf.nn.softmax over the last axis: TF's Softmax op)
_sum = FUNCTIONS["sum"]
_rsqrt = FUNCTIONS["rsqrt"]
_rsqrt_grad = FUNCTIONS["rsqrt_grad"]
_squared_difference = FUNCTIONS["squared_difference"]
_avg_pool = FUNCTIONS["avg_pool"]
_max_pool = FUNCTIONS["max_pool"]

# float32(1 - 0.999), as assign_moving_average converts the Python float
_EMA = torch.tensor(1.0 - 0.999, dtype=torch.float32)


def _key(name: str) -> str:
    """A Keras name as a torch module/attribute name (no dots, slashes or colons)."""
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def _distributed() -> bool:
    """Whether this process is one of several torch.distributed replicas."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _replica_mean(v: torch.Tensor) -> torch.Tensor:
    """The mean over data-parallel replicas, as tf.distribute's MirroredStrategy reduces
    the moving averages' new values; the value itself outside torch.distributed."""
    import torch.distributed as dist

    if _distributed():
        v = v.clone()
        dist.all_reduce(v, op=dist.ReduceOp.SUM)
        v = v / dist.get_world_size()
    return v


_ZERO = torch.zeros((), dtype=torch.float32)
_TORCH_OPS = RangeOps(torch.minimum, torch.maximum)


def _zero(x: torch.Tensor) -> torch.Tensor:
    """A 0-d zero of x's dtype and device (one shared CPU float32 zero: never written)."""
    if x.is_cpu and x.dtype == torch.float32:
        return _ZERO
    return torch.zeros((), dtype=x.dtype, device=x.device)


class RangeQuantizer(nn.Module):
    """One of tfmot's quantizers: two float32 range buffers and its update rule."""

    def __init__(self, q: Quantizer):
        super().__init__()
        self.spec = q
        self.register_buffer("min", torch.full(q.shape, q.init[0], dtype=torch.float32))
        self.register_buffer("max", torch.full(q.shape, q.init[1], dtype=torch.float32))

    def _batch_range(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """reduce_min / reduce_max over all axes, or per axis over all but the last
        (tfmot's [0] for rank 2, [0, 1, 2] for rank 4); one pass for both. Eager on a
        plain CPU tensor: TF's bits (``dispatch.minmax.batch_range``: which zero of a
        +0 / -0 tie, which NaN); in a graph, torch's aminmax (the same values)."""
        x = x.detach()
        if (not torch.compiler.is_compiling() and type(x) is torch.Tensor and x.is_cpu
                and x.dtype == torch.float32 and x.layout is torch.strided
                and not x.is_neg() and plain_eager()):
            lo, hi = batch_range(x.numpy(), self.spec.per_axis)
            return torch.from_numpy(lo), torch.from_numpy(hi)
        if self.spec.per_axis:
            if x.dim() < 2:
                return x, x
            return torch.aminmax(x.reshape(-1, x.shape[-1]), dim=0)
        return torch.aminmax(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.spec
        mn, mx = self.min, self.max  # (nn.Module's attribute lookup, once)
        if self.training:
            with torch.no_grad():
                bmin, bmax = self._batch_range(x)
                ema = _EMA if x.is_cpu else _EMA.to(x.device)
                ops = _TORCH_OPS if not _distributed() else _TORCH_OPS._replace(
                    replica_mean=lambda lo, hi: (_replica_mean(lo), _replica_mean(hi)))
                lo, hi = updated_range(q, mn, mx, bmin, bmax, _zero(x), ema, ops)
                mn.copy_(lo)
                mx.copy_(hi)
        if q.per_axis:
            return _fq_pc(x, mn, mx, num_bits=q.num_bits, narrow_range=q.narrow_range)
        return _fq(x, mn, mx, num_bits=q.num_bits, narrow_range=q.narrow_range)

    def extra_repr(self) -> str:
        q = self.spec
        return (f"{q.kind}, num_bits={q.num_bits}, per_axis={q.per_axis}, "
                f"symmetric={q.symmetric}, narrow_range={q.narrow_range}")


def _same_pads(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    eff = (k - 1) * d + 1
    out = -(-size // s)
    total = max((out - 1) * s + eff - size, 0)
    return total // 2, total - total // 2


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _activate(x: torch.Tensor, name: str, exact: bool = False) -> torch.Tensor:
    if name in ("linear", "noop"):
        return x
    if name == "relu":
        return _relu(x) if exact else torch.relu(x)
    if name == "relu6":
        return _relu6(x) if exact else F.relu6(x)
    if name == "softmax":
        return _softmax(x) if exact else torch.softmax(x, -1)
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "tanh":
        return torch.tanh(x)
    if name == "swish":
        return x * torch.sigmoid(x)
    raise KerasFileError(f"activation {name!r}")  # the plan refuses these first


class Layer(nn.Module):
    """One node of the plan: its weights (parameters and buffers under their Keras
    attribute names) and quantizers, and the Keras layer's computation."""

    def __init__(self, node: Node, exact: bool = True):
        super().__init__()
        self.node = node
        self.exact = exact
        for w in node.weights:
            if w.attr == "optimizer_step":
                self.register_buffer("optimizer_step", torch.tensor(-1, dtype=torch.int32))
            elif w.attr.endswith(("_min", "_max")) and node.wrapped:
                continue  # a quantizer's, registered below
            elif w.trainable:
                self.register_parameter(w.attr, nn.Parameter(torch.zeros(w.shape)))
            else:
                init = 1.0 if w.attr == "moving_variance" else 0.0
                self.register_buffer(w.attr, torch.full(w.shape, init))
        self.weight_quantizers = nn.ModuleDict(
            {a: RangeQuantizer(q) for a, q in node.weight_quantizers.items()})
        self.pre_activation = RangeQuantizer(node.pre_activation) if node.pre_activation else None
        self.post_activation = (RangeQuantizer(node.post_activation)
                                if node.post_activation else None)
        self.output = RangeQuantizer(node.output) if node.output else None

    def _w(self, attr: str) -> torch.Tensor:
        t = getattr(self, attr)
        if attr in self.weight_quantizers:
            t = self.weight_quantizers[attr](t)
        return t

    def _activation(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_activation is not None:
            x = self.pre_activation(x)
        x = _activate(x, self.node.activation, self.exact)
        if self.post_activation is not None:
            x = self.post_activation(x)
        return x

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        n, cfg = self.node, self.node.config
        kind = n.kind
        x = xs[0] if xs else None
        if kind == "QuantizeLayer":
            y = x
        elif kind == "Conv2D":
            y = self._conv(x, cfg)
        elif kind == "DepthwiseConv2D":
            s, d = _pair(cfg.get("strides", 1)), _pair(cfg.get("dilation_rate", 1))
            y = _depthwise(x, self._w("depthwise_kernel"), strides=[1, s[0], s[1], 1],
                           padding=str(cfg["padding"]).upper(),
                           dilations=[1, d[0], d[1], 1])
            y = self._bias(y)
            y = self._activation(y)
        elif kind == "SeparableConv2D":  # float only: the QAT rewrite splits it
            s, d = _pair(cfg.get("strides", 1)), _pair(cfg.get("dilation_rate", 1))
            y = _depthwise(x, self.depthwise_kernel, strides=[1, s[0], s[1], 1],
                           padding=str(cfg["padding"]).upper(),
                           dilations=[1, d[0], d[1], 1])
            y = _conv2d(y, self.pointwise_kernel, (1, 1), (1, 1), "valid")
            y = self._activation(self._bias(y))
        elif kind == "Dense":
            k = self._w("kernel")
            y = _matmul(x, k) if self.exact and x.dim() == 2 else x @ k
            y = self._activation(self._bias(y))
        elif kind == "BatchNormalization":
            y = self._batch_norm(x, cfg)
        elif kind == "ReLU":
            y = _relu_layer(x, cfg, self.exact)
        elif kind == "Activation":
            y = _activate(x, n.activation, self.exact)
        elif kind == "Add":
            y = xs[0]
            for other in xs[1:]:
                y = y + other
        elif kind == "Concatenate":
            y = torch.cat(xs, dim=int(cfg.get("axis", -1)))
        elif kind == "ZeroPadding2D":
            (t, b), (lf, r) = _qat._plan._padding2d(cfg["padding"])
            y = F.pad(x, (0, 0, lf, r, t, b))
        elif kind in ("AveragePooling2D", "MaxPooling2D"):
            y = _pool(x, cfg, kind == "MaxPooling2D", self.exact)
        elif kind == "GlobalAveragePooling2D":
            keep = bool(cfg.get("keepdims", False))
            y = _mean(x, [1, 2], keep) if self.exact else x.mean(dim=(1, 2), keepdim=keep)
        elif kind == "Dropout":
            y = F.dropout(x, float(cfg.get("rate", 0.0)), self.training)
        elif kind == "Flatten":
            y = x.flatten(1)  # (not reshape(n, -1): ambiguous for a batch of 0)
        elif kind == "Reshape":
            y = x.reshape(x.shape[0], *[int(v) for v in cfg["target_shape"]])
        elif kind == "Softmax":
            axis = int(cfg.get("axis", -1))
            last = axis in (-1, x.dim() - 1)  # (TF's Softmax op; other axes transpose)
            y = _softmax(x) if self.exact and last else torch.softmax(x, axis)
        else:  # the plan refuses any other kind
            raise KerasFileError(f"layer {n.name!r}: {kind}")
        if self.output is not None:
            y = self.output(y)
        return y

    def _bias(self, y: torch.Tensor) -> torch.Tensor:
        bias = getattr(self, "bias", None)
        if not isinstance(bias, torch.Tensor):
            return y
        return _bias_add(y, bias) if self.exact else y + bias

    def _conv(self, x: torch.Tensor, cfg: Any) -> torch.Tensor:
        s, d = _pair(cfg.get("strides", 1)), _pair(cfg.get("dilation_rate", 1))
        if self.exact and d == (1, 1):
            y = _conv2d_tf(x, self._w("kernel"), strides=[1, s[0], s[1], 1],
                           padding=str(cfg["padding"]).upper())
        else:
            y = _conv2d(x, self._w("kernel"), s, d, str(cfg["padding"]).lower())
        return self._activation(self._bias(y))

    def _batch_norm(self, x: torch.Tensor, cfg: Any) -> torch.Tensor:
        c = x.shape[-1]
        gamma = getattr(self, "gamma", None)
        beta = getattr(self, "beta", None)
        if gamma is None:
            gamma = torch.ones(c, dtype=x.dtype, device=x.device)
        if beta is None:
            beta = torch.zeros(c, dtype=x.dtype, device=x.device)
        eps = float(cfg.get("epsilon", 1e-3))
        momentum = float(cfg.get("momentum", 0.99))
        if x.dim() == 4:
            # Keras' fused path: tf.compat.v1.nn.fused_batch_norm raises epsilon to 1.001e-5
            eps = max(eps, 1.001e-5)
            if self.training:
                out = _fbn(x, gamma, beta, self.moving_mean, self.moving_variance,
                           epsilon=eps, exponential_avg_factor=1.0 - momentum,
                           data_format="NHWC", is_training=True)
                if x.shape[0] > 0:
                    with torch.no_grad():
                        self.moving_mean.copy_(out[1])
                        self.moving_variance.copy_(out[2])
                return out[0]
            return _fbn(x, gamma, beta, self.moving_mean, self.moving_variance, epsilon=eps,
                        data_format="NHWC", is_training=False)[0]
        # rank 2: Keras' unfused path (tf.nn.moments, tf.nn.batch_normalization)
        if self.training and self.exact:
            y, mean, var = _KerasBN2D.apply(x, gamma, beta, eps)
            with torch.no_grad():
                decay = torch.tensor(1.0 - momentum, dtype=torch.float32)
                self.moving_mean.sub_((self.moving_mean - mean) * decay)
                self.moving_variance.sub_((self.moving_variance - var) * decay)
            return y
        if self.exact:  # inference: tf.nn.batch_normalization on the moving statistics
            inv = _rsqrt(self.moving_variance + eps) * gamma
            return x * inv + (beta - self.moving_mean * inv)
        if self.training:  # (tf.nn.moments: Mean, SquaredDifference, Mean)
            mean = x.mean(0)
            sq = (x - mean.detach()).square()
            var = sq.mean(0)
            with torch.no_grad():
                decay = torch.tensor(1.0 - momentum, dtype=torch.float32)
                self.moving_mean.sub_((self.moving_mean - mean) * decay)
                self.moving_variance.sub_((self.moving_variance - var) * decay)
        else:
            mean, var = self.moving_mean, self.moving_variance
        inv = torch.rsqrt(var + eps) * gamma
        return x * inv + (beta - mean * inv)


class _KerasBN2D(torch.autograd.Function):
    """tf_keras' BatchNormalization of a [N, C] batch in training, as TF's ops compute it
    (tf.nn.moments, then tf.nn.batch_normalization), and its gradient as TF's eager tape
    runs it: the sums over the batch on TF's Sum, the tensor's three gradients added as
    AddN adds them. (Under tf.function Grappler reorders dx's sum and multiplies by 1/N
    where the tape divides by N: docs/qat.md.) Returns y and the batch mean and variance."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = x.shape[-1]
        mean = _mean(x, [0], keep_dims=True)  # Mean
        var = _mean(_squared_difference(x, mean), [0], keep_dims=True)  # SqDiff, Mean
        m, v = mean.reshape(c), var.reshape(c)  # Squeeze
        r = _rsqrt(v + eps)  # AddV2, Rsqrt
        inv = r * gamma
        ctx.save_for_backward(x, gamma, mean, m, r, inv)
        return x * inv + (beta - m * inv), m, v

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        x, gamma, mean, m, r, inv = ctx.saved_tensors
        n = torch.tensor(float(x.shape[0]), dtype=torch.float32)
        db = _sum(dy, [0])  # AddV2's gradient for beta - m * inv: Sum (+ Reshape)
        neg = -db  # Sub's: Neg
        dx = dy * inv  # Mul's for x
        d_inv = _sum(x * dy, [0]) + neg * m  # Mul's, Sum; AddN of inv's two gradients
        dgamma = d_inv * r
        dv = _rsqrt_grad(r, d_inv * gamma)
        dmean = (neg * inv).expand_as(x) / n  # Mean's gradient: Tile, RealDiv
        dsd = dv.expand_as(x) / n
        xg = (2 * dsd) * (x - mean)  # SquaredDifference's (the mean's stopped)
        return (dx + dmean) + xg, dgamma, db, None  # AddN(3): (a + b) + c


def _conv2d(x: torch.Tensor, k: torch.Tensor, s: tuple[int, int], d: tuple[int, int],
            padding: str) -> torch.Tensor:
    """Keras' Conv2D on NHWC with an HWIO kernel, TF's SAME padding (more at the end)."""
    xc = x.permute(0, 3, 1, 2)
    if padding == "same":
        (t, b) = _same_pads(x.shape[1], k.shape[0], s[0], d[0])
        (lf, r) = _same_pads(x.shape[2], k.shape[1], s[1], d[1])
        if t or b or lf or r:
            xc = F.pad(xc, (lf, r, t, b))
    y = F.conv2d(xc, k.permute(3, 2, 0, 1), stride=s, dilation=d)
    return y.permute(0, 2, 3, 1)


def _relu_layer(x: torch.Tensor, cfg: Any, exact: bool = False) -> torch.Tensor:
    """tf_keras' backend.relu: Relu6 for max_value 6, else Relu then a clip."""
    mx = cfg.get("max_value")
    if float(cfg.get("negative_slope", 0.0) or 0.0) != 0.0 or float(
            cfg.get("threshold", 0.0) or 0.0) != 0.0:
        raise KerasFileError("ReLU with negative_slope or threshold is not supported")
    if mx is not None and float(mx) == 6.0:
        return _relu6(x) if exact else F.relu6(x)
    y = _relu(x) if exact else torch.relu(x)
    return y if mx is None else torch.clamp(y, max=float(mx))


def _pool(x: torch.Tensor, cfg: Any, is_max: bool, exact: bool = False) -> torch.Tensor:
    k = _pair(cfg.get("pool_size", 2))
    s = _pair(cfg.get("strides") or k)
    if exact:  # TF's MaxPool / AvgPool (and their gradients), NHWC as it is
        pool = _max_pool if is_max else _avg_pool
        return pool(x, [1, *k, 1], [1, *s, 1], str(cfg.get("padding", "valid")).upper())
    xc = x.permute(0, 3, 1, 2)
    if str(cfg.get("padding", "valid")).lower() == "same":
        t, b = _same_pads(x.shape[1], k[0], s[0], 1)
        lf, r = _same_pads(x.shape[2], k[1], s[1], 1)
        if is_max:
            xc = F.pad(xc, (lf, r, t, b), value=float("-inf"))
        else:
            ones = F.pad(torch.ones_like(xc[:1, :1]), (lf, r, t, b))
            total = F.avg_pool2d(F.pad(xc, (lf, r, t, b)), k, s, divisor_override=1)
            count = F.avg_pool2d(ones, k, s, divisor_override=1)
            return (total / count).permute(0, 2, 3, 1)
    y = F.max_pool2d(xc, k, s) if is_max else F.avg_pool2d(xc, k, s)
    return y.permute(0, 2, 3, 1)


def _replica_mean_np(v: np.ndarray) -> np.ndarray:
    return _replica_mean(torch.from_numpy(np.array(v, np.float32))).numpy()


class KerasModel(nn.Module):
    """A tf_keras model (tfmot QAT or float) as a torch module, built from its plan.

    ``fused`` (on by default where the exact path can): an eager call on CPU float32
    tensors runs the whole model as one program of TF's ops on NumPy arrays and one
    autograd node whose backward is TF's gradient (``tfgrad.qat._exec``): the same bits as
    the layer-by-layer path, without torch's per-op machinery. Under ``torch.compile``
    the same program is one operator of the graph (``tfgrad::qat_program``, its backward
    ``tfgrad::qat_program_backward``; the batch size symbolic). Calls under
    ``torch.export``, tracing, autocast, functorch transforms, hooks on the layers, or
    with dropout while training run layer by layer."""

    def __init__(self, plan: Plan, exact: bool = True):
        super().__init__()
        self.plan = plan
        self.exact = exact
        self._program = (_exec.Program(plan) if exact and _exec.unsupported(plan) is None
                         else None)
        self.fused = self._program is not None
        self._views: dict[int, tuple[torch.Tensor, int, np.ndarray, tuple]] = {}
        self.layers = nn.ModuleDict()
        # the graph walk, worked out once: (node name, module key, input names)
        self._walk: list[tuple[str, str, tuple[str, ...]]] = []
        for node in plan.nodes:
            if node.kind != "InputLayer":
                self.layers[_key(node.name)] = Layer(node, exact)
                self._walk.append((node.name, _key(node.name), node.inputs))
        self._input_shapes = [(name, plan.node(name).output_shape) for name in plan.inputs]
        self._output_shapes = [plan.node(name).output_shape for name in plan.outputs]
        self._quantizers = self._quantizer_table()
        self._layout: tuple[list, list] | None = None
        self._layout_keys()  # (now: torch.compile's tracing only reads it)
        self._bound: _fz.Bound | None = None
        _fz.MODELS[id(self)] = self

    def _quantizer_table(self) -> dict[str, list[tuple[Any, str, tuple, tuple]]]:
        """Per layer, its quantizers with the names the program reads them by (the
        training flag's key, the range arrays' keys), worked out once."""
        return {
            key: [(q, f"{name}/{w}", (name, w + "_min"), (name, w + "_max")) for w, q in (
                *((a, layer.weight_quantizers[a]) for a in layer.weight_quantizers),
                ("pre_activation", layer.pre_activation),
                ("post_activation", layer.post_activation), ("output", layer.output))
                if q is not None]
            for (name, key, _), layer in zip(self._walk, self.layers.values())}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_bound"], state["_views"] = None, {}  # (caches of this process's memory)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._quantizers = self._quantizer_table()  # (derived: whatever a pickle held)
        self._output_shapes = [self.plan.node(name).output_shape for name in self.plan.outputs]
        self._layout = None
        self._bound = None
        self._layout_keys()
        _fz.MODELS[id(self)] = self

    def forward(self, *inputs: torch.Tensor) -> Any:
        if len(inputs) != len(self.plan.inputs):
            raise TypeError(f"the model takes {len(self.plan.inputs)} input(s) "
                            f"({', '.join(self.plan.inputs)}); got {len(inputs)}")
        values: dict[str, torch.Tensor] = {}
        for (name, shape), x in zip(self._input_shapes, inputs):
            if x.dim() != len(shape) or any(
                    want is not None and got != want for got, want in zip(x.shape, shape)):
                raise ValueError(f"input {name!r}: expected shape {list(shape)} (None: any "
                                 f"size; NHWC), got {list(x.shape)}")
            values[name] = x
        if self.fused and self._program is not None:
            outs = (self._compiled(inputs) if torch.compiler.is_compiling()
                    else self._fused(inputs))
            if outs is not None:
                return outs[0] if len(outs) == 1 else list(outs)
        for name, key, sources in self._walk:
            values[name] = self.layers[key](*[values[i] for i in sources])
        outs = [values[o] for o in self.plan.outputs]
        return outs[0] if len(outs) == 1 else outs

    def _view(self, t: torch.Tensor | None) -> np.ndarray | None:
        """A CPU float32 tensor's memory as a NumPy array (kept while the tensor holds the
        same memory: an optimizer updates in place), else None."""
        if t is None or t.dtype != torch.float32 or not t.is_cpu:
            return None
        ptr = t.data_ptr()
        hit = self._views.get(id(t))
        if (hit is not None and hit[0] is t and hit[1] == ptr and hit[2].shape == t.shape
                and hit[3] == t.stride()):  # (a `.data =` may keep memory and shape only)
            return hit[2]
        a = t.detach().numpy()
        if len(self._views) > 4096:
            self._views.clear()
        self._views[id(t)] = (t, ptr, a, t.stride())
        return a

    def _fused(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
        """The forward as one program (see the class docstring), or None where it must run
        layer by layer."""
        if not plain_eager() or any(
                type(x) is not torch.Tensor or not x.is_cpu or x.dtype != torch.float32
                or x.layout is not torch.strided for x in inputs):
            return None
        if _fz.global_hooks():
            return None
        bound = self._bound
        if bound is None or not bound.holds():
            bound = self._bound = self._bind()
            if bound is None:
                return None
        program = self._program
        assert program is not None
        state, params, keys = bound.state, bound.params, bound.keys
        grad = torch.is_grad_enabled() and (bool(params) or any(x.requires_grad for x in inputs))
        xs = [x.detach().numpy() for x in inputs]
        need = [x.requires_grad for x in inputs]

        def run(_: Any) -> tuple[list[torch.Tensor], Any, list[int], list]:
            outs, tape, leaves, slots = program.forward(
                xs, state, grad, need, batch_range,
                _replica_mean_np if _distributed() else None)
            return _fz.as_tensors(outs, xs), tape, slots, [leaves[k] for k in keys]

        if not grad:
            return tuple(run(None)[0])
        return _fz._Fused.apply(run, len(inputs), *inputs, *params)

    def _bind(self) -> _fz.Bound | None:
        """The walk over the layers for :meth:`_fused`: the program's state on the
        tensors' memory, the trainable parameters; None where the model must run layer by
        layer (hooks on a layer, a tensor that is not CPU float32, dropout while
        training)."""
        arrays: dict[tuple[str, str], np.ndarray] = {}
        trainable: dict[tuple[str, str], bool] = {}
        training: dict[str, bool] = {}
        params: list[torch.Tensor] = []
        keys: list[tuple[str, str]] = []
        modules: list[tuple[nn.Module, bool]] = []
        tensors: list[tuple[dict, str, torch.Tensor, int, Any, tuple, tuple, bool]] = []
        view = self._view

        def held(owner: dict, attr: str, t: torch.Tensor | None) -> np.ndarray | None:
            a = view(t)
            if a is not None:
                assert t is not None
                tensors.append((owner, attr, t, t.data_ptr(), t.dtype, a.shape, t.stride(),
                                t.requires_grad))
            return a

        for name, key, _ in self._walk:
            layer = self.layers[key]
            if _fz.hooked(layer):
                return None
            training[name] = layer.training
            modules.append((layer, layer.training))
            for attr, p in layer._parameters.items():
                a = held(layer._parameters, attr, p)
                if a is None:
                    return None
                arrays[name, attr] = a
                if p.requires_grad:
                    trainable[name, attr] = True
                    params.append(p)
                    keys.append((name, attr))
            for attr, t in layer._buffers.items():
                if attr != "optimizer_step":
                    a = held(layer._buffers, attr, t)
                    if a is None:
                        return None
                    arrays[name, attr] = a
            for q, flag, kmin, kmax in self._quantizers[key]:
                if _fz.hooked(q):
                    return None
                training[flag] = q.training
                modules.append((q, q.training))
                buffers = q._buffers  # (min and max: buffers, read without nn.Module's lookup)
                lo = held(buffers, "min", buffers.get("min"))
                hi = held(buffers, "max", buffers.get("max"))
                if lo is None or hi is None:
                    return None
                arrays[kmin] = lo
                arrays[kmax] = hi
        program = self._program
        assert program is not None
        if not program.runs(training):
            return None
        layers = self.layers._modules
        walk = [(layers, key, layers[key]) for _, key, _ in self._walk]
        return _fz.Bound(_exec.State(arrays, trainable, training), params, keys, modules,
                      tensors, walk)

    def _layout_keys(self) -> tuple[list, list]:
        """The program's keys of the parameters and of the state (buffers, ranges) in the
        order :meth:`_compiled` passes their tensors: (program key, module, attribute)."""
        if self._layout is None:
            params: list = []
            state: list = []
            for name, key, _ in self._walk:
                layer = self.layers[key]
                params += [((name, a), layer, a) for a in layer._parameters]
                state += [((name, a), layer, a) for a in layer._buffers if a != "optimizer_step"]
                for q, _, kmin, kmax in self._quantizers[key]:
                    state += [(kmin, q, "min"), (kmax, q, "max")]
            self._layout = (params, state)
        return self._layout

    def _compiled(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """Under torch.compile: the forward as one operator of the graph (``tfgrad::
        qat_program``, its backward ``tfgrad::qat_program_backward``), the same program
        as the eager fused call; or None where the layers must run one by one (export,
        autocast, hooks, inputs other than CPU float32, dropout while training, outputs
        whose shapes are not fixed but for the batch)."""
        if (torch.compiler.is_exporting() or torch.is_autocast_enabled("cpu")
                or any(x.dtype != torch.float32 or x.device.type != "cpu" for x in inputs)
                or any(None in shape[1:] for shape in self._output_shapes)):
            return None
        if _fz.global_hooks():
            return None
        training: dict[str, bool] = {}
        for name, key, _ in self._walk:
            layer = self.layers[key]
            if _fz.hooked(layer) or any(_fz.hooked(q) for q, _, _, _ in self._quantizers[key]):
                return None
            training[name] = layer.training
        program = self._program
        assert program is not None
        if not program.runs(training):
            return None
        pkeys, skeys = self._layout_keys()
        params = [getattr(m, a) for _, m, a in pkeys]
        state = [getattr(m, a) for _, m, a in skeys]
        if any(t is None or t.dtype != torch.float32 or t.device.type != "cpu"
               for t in (*params, *state)):
            return None
        need = [x.requires_grad for x in inputs] + [p.requires_grad for p in params]
        grad = torch.is_grad_enabled() and any(need)
        got = _fz.program_op(id(self), list(inputs), params, state, need, grad)
        n_out = len(got) - 1 - len(state)
        with torch.no_grad():
            for t, new in zip(state, got[n_out + 1:]):
                t.copy_(new)
        return got[:n_out]

    def _run_lists(self, xs: list[torch.Tensor], params: list[torch.Tensor],
                   state: list[torch.Tensor], need: list[bool], grad: bool
                   ) -> list[torch.Tensor]:
        """:func:`_program_op`'s computation: the program on the tensors' memory (the state
        copied: the program updates it in place), with the layers' training flags now."""
        pkeys, skeys = self._layout_keys()
        arrays: dict[tuple[str, str], np.ndarray] = {}
        # (the program's signature from the tensors' own views, the same objects call
        # after call as the graph passes the same tensors: the state's fresh copies are
        # C-contiguous copies of them, whose layout follows from theirs)
        layout: dict[tuple[str, str], np.ndarray] = {}
        trainable: dict[tuple[str, str], bool] = {}
        view = self._view
        for (k, _, _), t, wanted in zip(pkeys, params, need[len(xs):]):
            a = view(t)
            arrays[k] = layout[k] = t.detach().numpy() if a is None else a
            if wanted:
                trainable[k] = True
        fresh = []
        for (k, _, _), t in zip(skeys, state):
            v = view(t)
            layout[k] = v = t.detach().numpy() if v is None else v
            arrays[k] = a = v.copy()
            fresh.append(a)
        training: dict[str, bool] = {}
        layers = self.layers._modules
        for name, key, _ in self._walk:
            training[name] = layers[key].training
            for q, flag, _, _ in self._quantizers[key]:
                training[flag] = q.training
        program = self._program
        assert program is not None
        xa = [x.detach().numpy() for x in xs]
        outs, tape, leaves, slots = program.forward(
            xa, _exec.State(arrays, trainable, training, layout), grad, need[:len(xs)],
            batch_range, _replica_mean_np if _distributed() else None)
        token = _fz.token((tape, slots, [leaves.get(k) for k, _, _ in pkeys]) if grad else None)
        return [*_fz.as_tensors(outs, xa), token, *(torch.from_numpy(a) for a in fresh)]

    def keras_weights(self) -> dict[str, list[tuple[str, np.ndarray]]]:
        """Every weight as tf_keras names it, by layer, in the file's order."""
        out: dict[str, list[tuple[str, np.ndarray]]] = {}
        for node in self.plan.nodes:
            if node.kind == "InputLayer":
                out[node.name] = []
                continue
            out[node.name] = [(w.name, _tensor_of(self.layers[_key(node.name)], w)
                               .detach().cpu().numpy().copy()) for w in node.weights]
        return out


def _tensor_of(layer: Layer, w: _qat.Weight) -> torch.Tensor:
    node = layer.node
    if w.attr == "optimizer_step" or not node.wrapped or not w.attr.endswith(("_min", "_max")):
        return getattr(layer, w.attr)
    base, end = w.attr[:-4], w.attr[-3:]
    if node.kind == "QuantizeLayer" or base == "output":
        q = layer.output
    elif base in ("pre_activation", "post_activation"):
        q = getattr(layer, base)
    else:
        q = layer.weight_quantizers[base]
    return getattr(q, end)


def load_keras(path: str | os.PathLike[str], quantize: bool | None = None,
               exact: bool = True) -> KerasModel:
    """Build a torch module from a tf_keras ``.h5`` model file.

    ``quantize=None`` loads the model as saved: a tfmot QAT model (QuantizeWrapperV2,
    QuantizeLayer and their ranges) as QAT, a float model as float; ``quantize=True``
    quantizes a float model as tfmot's ``quantize_model`` would (its ranges start at tfmot's
    initial values). The file is only read.

    ``exact=True`` runs every layer's computation on TF's ops (tfgrad's: Conv2D, MatMul,
    BiasAdd, Relu, Relu6, Mean besides the quantizers, depthwise convolution and batch
    norm), so that a step on the CPU gives TF's bits; ``exact=False`` runs convolutions,
    dense layers, biases, activations and pooling on torch's own ops.
    """
    plan, f = _qat.load_plan(path, quantize)
    model = KerasModel(plan, exact)
    load_weights(model, f.weights, path=os.fspath(path), partial=quantize is True)
    return model


def load_weights(model: KerasModel, weights: dict[str, list[tuple[str, np.ndarray]]],
                 path: str = "<weights>", partial: bool = False) -> None:
    """Copy tf_keras weights (by layer and weight name) into the module. ``partial``: the
    plan's range variables and steps may be missing (a float file quantized here)."""
    by_name = {w: v for layer in weights.values() for w, v in layer}
    for node in model.plan.nodes:
        if node.kind == "InputLayer":
            continue
        layer = model.layers[_key(node.name)]
        for w in node.weights:
            value = by_name.get(w.name, by_name.get(model.plan.sources.get(w.name, "")))
            if value is None:
                if partial and (w.attr == "optimizer_step" or w.attr.endswith(("_min", "_max"))):
                    continue  # a float file quantized here: tfmot's initial ranges
                raise KerasFileError(f"{path}: weight {w.name!r} of layer {node.name!r} "
                                     "is missing from the file")
            if tuple(value.shape) != tuple(w.shape):
                raise KerasFileError(f"{path}: weight {w.name!r} has shape {list(value.shape)}"
                                     f" in the file; the model needs {list(w.shape)}")
            t = _tensor_of(layer, w)
            with torch.no_grad():
                t.copy_(torch.from_numpy(np.array(value)).to(t.dtype))


def save_keras(module: KerasModel, path: str | os.PathLike[str]) -> None:
    """Write the module as a tf_keras ``.h5`` file (tfmot's config, layer and weight names
    and order), loadable by ``tf_keras.models.load_model`` inside tfmot's
    ``quantize_scope()``. Written atomically; never over the file the module came from
    unless asked to by that path."""
    if not isinstance(module, KerasModel):
        raise TypeError(f"save_keras takes a module from tfgrad.torch.qat.load_keras, not "
                        f"{type(module).__name__}")
    weights = module.keras_weights()
    for node in module.plan.nodes:
        for (name, value), w in zip(weights[node.name], node.weights):
            if tuple(value.shape) != tuple(w.shape):
                raise KerasFileError(f"weight {name!r} now has shape {list(value.shape)}; "
                                     f"the Keras model needs {list(w.shape)}")
    _qat.write_keras_h5(path, dict(module.plan.config), weights,
                        [n.name for n in module.plan.nodes])


__all__: Sequence[str] = ["KerasModel", "Layer", "RangeQuantizer", "load_keras",
                          "load_weights", "save_keras"]
