"""JAX adapter: tfgrad's ops as ``jax.custom_vjp`` functions.

The functions have the names, argument names, defaults, layouts and outputs of
:mod:`tfgrad.torch`'s (and tfgrad's functional API), take and return JAX arrays, and work
under ``jax.jit``, ``jax.grad`` and ``jax.vmap``. Each op runs on the host through
``jax.pure_callback`` into tfgrad's kernels, so the values are TF 2.21's bit for bit; the
backward is TF's gradient op (FakeQuant*Gradient, FusedBatchNormGrad*,
DepthwiseConv2dNativeBackprop*, Fractional*PoolGrad) with the inputs TF's registered
gradient functions give it.

- Only the first output of a multi-output op is differentiable (TF's gradient functions
  ignore the others' gradients); batch norm's ``mean`` and ``variance`` get zero
  cotangents (TF returns None).
- ``jax.vmap`` batches over the leading axis: the callback gets the stacked arrays
  (``vmap_method="expand_dims"``) and runs the op once per batch element.
- Output shapes are found at trace time by running the forward op once on zeros of the
  input shapes (cached per shape, dtype and attrs); this also raises argument errors
  (``tfgrad.InvalidArgumentError``) at trace time instead of from inside XLA.
- Second derivatives: depthwise conv's backprops are custom_vjp functions of each other
  and of the forward op, so ``jax.hessian`` & co. work there; elsewhere the backward is a
  plain callback, which JAX refuses to differentiate ("Pure callbacks do not support JVP").
- Without ``jax_enable_x64`` JAX has no int64 or float64: the pooling sequences come back
  as int32 (same values), and float64 ops are unavailable.
- Fractional pooling: ``seed`` and ``seed2`` may be Python ints (attrs, as in TF) or
  integer JAX arrays (traced operands, so a jitted step can draw new regions each call
  without recompiling). ``deterministic=False`` draws fresh seeds inside the callback on
  every run, as TF does; that breaks ``pure_callback``'s purity contract, so under ``jit``
  prefer ``deterministic=True`` with explicit seeds.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

try:
    import jax
    import jax.numpy as jnp
except ImportError as _e:  # pragma: no cover - exercised only without jax
    raise ImportError("tfgrad.jax needs JAX: pip install tfgrad[jax]") from _e

import numpy as np

from .. import raw_ops
from .._opdefs import get_op_def
from .._validate import DTYPES, dtype_name

__all__ = [
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

Attrs = tuple  # attrs travel as a sorted tuple of (name, value) pairs: hashable, static


def _freeze(**attrs: Any) -> Attrs:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in attrs.items()))


# --------------------------------------------------------------------------------------
# Calling an op through pure_callback
# --------------------------------------------------------------------------------------
def _as_input(v: Any, op_name: str, name: str) -> jax.Array:
    """A JAX array of a dtype the op takes; Python numbers take the op's dtype."""
    op = get_op_def(op_name)
    inp = next(i for i in op.inputs if i.name == name)
    allowed = (inp.dtype,) if inp.dtype else op.type_attr(inp.type_attr).allowed
    if isinstance(v, (int, float, list, tuple)):
        want = DTYPES[allowed[0] if inp.dtype or "float32" not in allowed else "float32"]
        return jnp.asarray(np.asarray(v, dtype=want))
    v = jnp.asarray(v)
    if dtype_name(v.dtype) not in allowed:
        raise TypeError(f"tfgrad.jax ({op_name}): '{name}' has dtype {v.dtype}, but the op "
                        f"takes {', '.join(allowed)} (as TF's CPU kernel); convert it "
                        "explicitly with .astype(...)")
    return v


def _jax_dtype(dt: np.dtype) -> np.dtype:
    """int64/float64 become int32/float32 when jax_enable_x64 is off."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dt))


@functools.lru_cache(maxsize=256)
def _forward_spec(op_name: str, shapes: tuple, attrs: Attrs) -> tuple:
    """Output shapes and dtypes of a forward op, by running it once on zeros."""
    arrays = {name: np.zeros(shape, dtype) for name, shape, dtype in shapes}
    out = getattr(raw_ops, op_name)(**arrays, **dict(attrs))
    outs = tuple(out) if isinstance(out, tuple) else (out,)
    return tuple((np.shape(o), np.asarray(o).dtype) for o in outs)


def _call(op_name: str, inputs: dict[str, jax.Array], attrs: Attrs,
          out_spec: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None,
          static: dict[str, np.ndarray] | None = None,
          dynamic_attrs: dict[str, jax.Array] | None = None) -> tuple[jax.Array, ...]:
    """Run ``raw_ops.<op_name>`` on the host via pure_callback.

    ``inputs``: array operands; ``static``: NumPy inputs fixed at trace time (shapes);
    ``dynamic_attrs``: integer attrs given as traced arrays (seeds); ``out_spec``: the
    outputs' (shape, dtype), found by a dry run of the op when omitted.
    """
    names = list(inputs)
    dyn = list(dynamic_attrs or {})
    operands = [inputs[n] for n in names] + [dynamic_attrs[n] for n in dyn]  # type: ignore
    base_ndim = [o.ndim for o in operands]
    if out_spec is None:
        shapes = tuple((n, tuple(inputs[n].shape), np.dtype(inputs[n].dtype)) for n in names)
        out_spec = _forward_spec(op_name, shapes, attrs)
    result = tuple(jax.ShapeDtypeStruct(s, _jax_dtype(d)) for s, d in out_spec)
    fn = getattr(raw_ops, op_name)

    def run_one(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        kw = dict(zip(names, arrays[:len(names)]))
        kw_attrs = {**dict(attrs), **{n: int(v) for n, v in zip(dyn, arrays[len(names):])}}
        out = fn(**kw, **(static or {}), **kw_attrs)
        outs = tuple(out) if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o, dtype=r.dtype) for o, r in zip(outs, result))

    def callback(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        arrays = tuple(np.asarray(a) for a in arrays)
        extra = arrays[0].ndim - base_ndim[0]
        if extra == 0:
            return run_one(arrays)
        # Under vmap (expand_dims): leading batch axes, size 1 on unbatched operands.
        lead = np.broadcast_shapes(*(a.shape[:extra] for a in arrays))
        if 0 in lead:
            return tuple(np.zeros(lead + r.shape, r.dtype) for r in result)
        per = []
        for idx in np.ndindex(*lead):
            per.append(run_one([a[tuple(i if n > 1 else 0 for i, n in zip(idx, a.shape))]
                                for a in arrays]))
        return tuple(np.stack([p[k] for p in per]).reshape(lead + r.shape)
                     for k, r in enumerate(result))

    return tuple(jax.pure_callback(callback, result, *operands, vmap_method="expand_dims"))


# --------------------------------------------------------------------------------------
# Fake quantization
# --------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _fq_args(inputs: jax.Array, attrs: Attrs) -> jax.Array:
    return _call("FakeQuantWithMinMaxArgs", {"inputs": inputs}, attrs,
                 [(inputs.shape, np.float32)])[0]


def _fq_args_fwd(inputs: jax.Array, attrs: Attrs) -> tuple:
    return _fq_args(inputs, attrs), inputs


def _fq_args_bwd(attrs: Attrs, x: jax.Array, g: jax.Array) -> tuple:
    return _call("FakeQuantWithMinMaxArgsGradient", {"gradients": g, "inputs": x}, attrs,
                 [(x.shape, np.float32)])


_fq_args.defvjp(_fq_args_fwd, _fq_args_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fq_vars(inputs: jax.Array, min: jax.Array, max: jax.Array, op: str,
             attrs: Attrs) -> jax.Array:
    return _call(op, {"inputs": inputs, "min": min, "max": max}, attrs,
                 [(inputs.shape, np.float32)])[0]


def _fq_vars_fwd(inputs: jax.Array, min: jax.Array, max: jax.Array, op: str,
                 attrs: Attrs) -> tuple:
    return _fq_vars(inputs, min, max, op, attrs), (inputs, min, max)


def _fq_vars_bwd(op: str, attrs: Attrs, res: tuple, g: jax.Array) -> tuple:
    x, lo, hi = res
    spec = [(x.shape, np.float32), (lo.shape, np.float32), (hi.shape, np.float32)]
    return _call(op + "Gradient", {"gradients": g, "inputs": x, "min": lo, "max": hi}, attrs,
                 spec)


_fq_vars.defvjp(_fq_vars_fwd, _fq_vars_bwd)


def fake_quant_with_min_max_args(inputs: Any, min: float = -6.0, max: float = 6.0,
                                 num_bits: int = 8, narrow_range: bool = False, *,
                                 name: str | None = None) -> jax.Array:
    """``tfgrad.fake_quant_with_min_max_args`` in JAX; backward:
    ``FakeQuantWithMinMaxArgsGradient`` (gradient inside the nudged range, else 0)."""
    x = _as_input(inputs, "FakeQuantWithMinMaxArgs", "inputs")
    return _fq_args(x, _freeze(min=min, max=max, num_bits=num_bits, narrow_range=narrow_range))


def fake_quant_with_min_max_vars(inputs: Any, min: Any, max: Any, num_bits: int = 8,
                                 narrow_range: bool = False, *,
                                 name: str | None = None) -> jax.Array:
    """``tfgrad.fake_quant_with_min_max_vars`` in JAX; gradients to inputs, min and max
    from ``FakeQuantWithMinMaxVarsGradient``."""
    op = "FakeQuantWithMinMaxVars"
    return _fq_vars(_as_input(inputs, op, "inputs"), _as_input(min, op, "min"),
                    _as_input(max, op, "max"), op,
                    _freeze(num_bits=num_bits, narrow_range=narrow_range))


def fake_quant_with_min_max_vars_per_channel(inputs: Any, min: Any, max: Any,
                                             num_bits: int = 8, narrow_range: bool = False,
                                             *, name: str | None = None) -> jax.Array:
    """``tfgrad.fake_quant_with_min_max_vars_per_channel`` in JAX (channels last); gradients
    from ``FakeQuantWithMinMaxVarsPerChannelGradient``."""
    op = "FakeQuantWithMinMaxVarsPerChannel"
    return _fq_vars(_as_input(inputs, op, "inputs"), _as_input(min, op, "min"),
                    _as_input(max, op, "max"), op,
                    _freeze(num_bits=num_bits, narrow_range=narrow_range))


# --------------------------------------------------------------------------------------
# Fused batch normalization
# --------------------------------------------------------------------------------------
_BN_GRAD_OP = {"FusedBatchNorm": "FusedBatchNormGrad",
               "FusedBatchNormV2": "FusedBatchNormGradV2",
               "FusedBatchNormV3": "FusedBatchNormGradV3"}
_CHANNELS_FIRST = ("NCHW", "NCDHW")


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _bn(x: jax.Array, scale: jax.Array, offset: jax.Array, mean: jax.Array,
        variance: jax.Array, op: str, attrs: Attrs) -> tuple:
    return _call(op, {"x": x, "scale": scale, "offset": offset, "mean": mean,
                      "variance": variance}, attrs)


def _bn_fwd(x: jax.Array, scale: jax.Array, offset: jax.Array, mean: jax.Array,
            variance: jax.Array, op: str, attrs: Attrs) -> tuple:
    outs = _bn(x, scale, offset, mean, variance, op, attrs)
    if dict(attrs)["is_training"]:
        rs = outs[3:]  # the batch mean and biased variance (and V3's reserve_space_3)
    else:  # TF's gradient function passes the population statistics
        rs = (mean, variance) + outs[5:]
    return outs, (x, scale, rs)


def _bn_bwd(op: str, attrs: Attrs, res: tuple, cotangents: tuple) -> tuple:
    x, scale, rs = res
    dy = cotangents[0]
    a = dict(attrs)
    fmt, training = a["data_format"], a["is_training"]
    transposed = not training and fmt in _CHANNELS_FIRST
    if transposed:  # as TF's gradient function: no NCHW inference gradient on CPU
        x, dy = jnp.moveaxis(x, 1, -1), jnp.moveaxis(dy, 1, -1)
        fmt = "NHWC" if fmt == "NCHW" else "NDHWC"
    names = ["reserve_space_1", "reserve_space_2", "reserve_space_3"][:len(rs)]
    grad_op = _BN_GRAD_OP[op]
    u = np.float32
    c = scale.shape
    spec = [(x.shape, np.dtype(x.dtype)), (c, u), (c, u), ((0,), u), ((0,), u)]
    dx, dscale, doffset, _, _ = _call(
        grad_op, {"y_backprop": dy, "x": x, "scale": scale, **dict(zip(names, rs))},
        _freeze(epsilon=a["epsilon"], data_format=fmt, is_training=training), spec)
    if transposed:
        dx = jnp.moveaxis(dx, -1, 1)
    return dx, dscale, doffset, None, None


_bn.defvjp(_bn_fwd, _bn_bwd)


def _fused_batch_norm(op: str, x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                      epsilon: float, exponential_avg_factor: float, data_format: str,
                      is_training: bool) -> Any:
    arrays = [_as_input(v, op, n) for v, n in zip(
        (x, scale, offset, mean, variance), ("x", "scale", "offset", "mean", "variance"))]
    attrs = _freeze(epsilon=epsilon, exponential_avg_factor=exponential_avg_factor,
                    data_format=data_format, is_training=is_training)
    return getattr(raw_ops, op).Output(*_bn(*arrays, op, attrs))


def fused_batch_norm(x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                     epsilon: float = 0.0001, exponential_avg_factor: float = 1.0,
                     data_format: str = "NHWC", is_training: bool = True, *,
                     name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm`` in JAX; ``y`` is differentiable (FusedBatchNormGrad)."""
    return _fused_batch_norm("FusedBatchNorm", x, scale, offset, mean, variance, epsilon,
                             exponential_avg_factor, data_format, is_training)


def fused_batch_norm_v2(x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                        epsilon: float = 0.0001, exponential_avg_factor: float = 1.0,
                        data_format: str = "NHWC", is_training: bool = True, *,
                        name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm_v2`` in JAX; ``y`` is differentiable (FusedBatchNormGradV2)."""
    return _fused_batch_norm("FusedBatchNormV2", x, scale, offset, mean, variance, epsilon,
                             exponential_avg_factor, data_format, is_training)


def fused_batch_norm_v3(x: Any, scale: Any, offset: Any, mean: Any, variance: Any,
                        epsilon: float = 0.0001, exponential_avg_factor: float = 1.0,
                        data_format: str = "NHWC", is_training: bool = True, *,
                        name: str | None = None) -> Any:
    """``tfgrad.fused_batch_norm_v3`` in JAX: the namedtuple (y, batch_mean, batch_variance,
    reserve_space_1, reserve_space_2, reserve_space_3). ``y`` is differentiable
    (FusedBatchNormGradV3, gradients to x, scale and offset)."""
    return _fused_batch_norm("FusedBatchNormV3", x, scale, offset, mean, variance, epsilon,
                             exponential_avg_factor, data_format, is_training)


# --------------------------------------------------------------------------------------
# Depthwise convolution: forward and backprops differentiate each other (any order)
# --------------------------------------------------------------------------------------
def _sizes(shape: Sequence[int]) -> np.ndarray:
    return np.array(shape, dtype=np.int32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dw(input: jax.Array, filter: jax.Array, attrs: Attrs) -> jax.Array:
    return _call("DepthwiseConv2dNative", {"input": input, "filter": filter}, attrs)[0]


def _dw_fwd(input: jax.Array, filter: jax.Array, attrs: Attrs) -> tuple:
    return _dw(input, filter, attrs), (input, filter)


def _dw_bwd(attrs: Attrs, res: tuple, g: jax.Array) -> tuple:
    x, w = res
    return (_dw_input(w, g, tuple(x.shape), attrs), _dw_filter(x, g, tuple(w.shape), attrs))


_dw.defvjp(_dw_fwd, _dw_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dw_input(filter: jax.Array, g: jax.Array, input_sizes: tuple, attrs: Attrs) -> jax.Array:
    return _call("DepthwiseConv2dNativeBackpropInput", {"filter": filter, "out_backprop": g},
                 attrs, [(input_sizes, np.dtype(g.dtype))],
                 static={"input_sizes": _sizes(input_sizes)})[0]


def _dw_input_fwd(filter: jax.Array, g: jax.Array, input_sizes: tuple, attrs: Attrs) -> tuple:
    return _dw_input(filter, g, input_sizes, attrs), (filter, g)


def _dw_input_bwd(input_sizes: tuple, attrs: Attrs, res: tuple, gg: jax.Array) -> tuple:
    w, g = res
    return _dw_filter(gg, g, tuple(w.shape), attrs), _dw(gg, w, attrs)


_dw_input.defvjp(_dw_input_fwd, _dw_input_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dw_filter(input: jax.Array, g: jax.Array, filter_sizes: tuple, attrs: Attrs) -> jax.Array:
    return _call("DepthwiseConv2dNativeBackpropFilter", {"input": input, "out_backprop": g},
                 attrs, [(filter_sizes, np.dtype(g.dtype))],
                 static={"filter_sizes": _sizes(filter_sizes)})[0]


def _dw_filter_fwd(input: jax.Array, g: jax.Array, filter_sizes: tuple, attrs: Attrs) -> tuple:
    return _dw_filter(input, g, filter_sizes, attrs), (input, g)


def _dw_filter_bwd(filter_sizes: tuple, attrs: Attrs, res: tuple, gg: jax.Array) -> tuple:
    x, g = res
    return _dw_input(gg, g, tuple(x.shape), attrs), _dw(x, gg, attrs)


_dw_filter.defvjp(_dw_filter_fwd, _dw_filter_bwd)


def depthwise_conv2d_native(input: Any, filter: Any, strides: Sequence[int], padding: str,
                            explicit_paddings: Sequence[int] = (), data_format: str = "NHWC",
                            dilations: Sequence[int] = (1, 1, 1, 1), *,
                            name: str | None = None) -> jax.Array:
    """``tfgrad.depthwise_conv2d_native`` in JAX, differentiable to any order (backward:
    DepthwiseConv2dNativeBackpropInput / ...BackpropFilter)."""
    op = "DepthwiseConv2dNative"
    attrs = _freeze(strides=tuple(strides), padding=padding,
                    explicit_paddings=tuple(explicit_paddings), data_format=data_format,
                    dilations=tuple(dilations))
    return _dw(_as_input(input, op, "input"), _as_input(filter, op, "filter"), attrs)


# --------------------------------------------------------------------------------------
# Fractional pooling
# --------------------------------------------------------------------------------------
def _seed_operands(seed: Any, seed2: Any) -> tuple[dict[str, Any], dict[str, jax.Array]]:
    """Python-int seeds stay attrs; if either is an array, both become traced operands."""
    if isinstance(seed, int) and isinstance(seed2, int):
        return {"seed": seed, "seed2": seed2}, {}
    return {}, {"seed": jnp.asarray(seed), "seed2": jnp.asarray(seed2)}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _pool(value: jax.Array, seeds: dict, op: str, attrs: Attrs) -> tuple:
    return _call(op, {"value": value}, attrs, dynamic_attrs=seeds)


def _pool_fwd(value: jax.Array, seeds: dict, op: str, attrs: Attrs) -> tuple:
    out, rows, cols = _pool(value, seeds, op, attrs)
    res = (value, rows, cols) if op == "FractionalAvgPool" else (value, out, rows, cols)
    return (out, rows, cols), (res, seeds)


def _pool_bwd(op: str, attrs: Attrs, res: tuple, cotangents: tuple) -> tuple:
    (res, seeds) = res
    g = cotangents[0]
    overlapping = _freeze(overlapping=dict(attrs)["overlapping"])
    if op == "FractionalAvgPool":
        value, rows, cols = res
        dv = _call("FractionalAvgPoolGrad", {"out_backprop": g, "row_pooling_sequence": rows,
                                             "col_pooling_sequence": cols}, overlapping,
                   [(value.shape, np.dtype(value.dtype))],
                   static={"orig_input_tensor_shape": np.array(value.shape, np.int64)})[0]
    else:
        value, out, rows, cols = res
        dv = _call("FractionalMaxPoolGrad",
                   {"orig_input": value, "orig_output": out, "out_backprop": g,
                    "row_pooling_sequence": rows, "col_pooling_sequence": cols},
                   overlapping, [(value.shape, np.dtype(value.dtype))])[0]
    return dv, jax.tree_util.tree_map(lambda s: None, seeds)


_pool.defvjp(_pool_fwd, _pool_bwd)


def _fractional_pool(op: str, value: Any, pooling_ratio: Sequence[float], pseudo_random: bool,
                     overlapping: bool, deterministic: bool, seed: Any, seed2: Any) -> Any:
    static_seeds, seeds = _seed_operands(seed, seed2)
    attrs = _freeze(pooling_ratio=tuple(pooling_ratio), pseudo_random=pseudo_random,
                    overlapping=overlapping, deterministic=deterministic,
                    **(static_seeds or {"seed": 0, "seed2": 0}))
    return getattr(raw_ops, op).Output(*_pool(_as_input(value, op, "value"), seeds, op, attrs))


def fractional_avg_pool(value: Any, pooling_ratio: Sequence[float], pseudo_random: bool = False,
                        overlapping: bool = False, deterministic: bool = False, seed: Any = 0,
                        seed2: Any = 0, *, name: str | None = None) -> Any:
    """``tfgrad.fractional_avg_pool`` in JAX: (output, row_pooling_sequence,
    col_pooling_sequence). ``value`` is NHWC; the sequences are kept for the backward
    (FractionalAvgPoolGrad). ``seed``/``seed2`` may be traced integer arrays."""
    return _fractional_pool("FractionalAvgPool", value, pooling_ratio, pseudo_random,
                            overlapping, deterministic, seed, seed2)


def fractional_max_pool(value: Any, pooling_ratio: Sequence[float], pseudo_random: bool = False,
                        overlapping: bool = False, deterministic: bool = False, seed: Any = 0,
                        seed2: Any = 0, *, name: str | None = None) -> Any:
    """``tfgrad.fractional_max_pool`` in JAX: (output, row_pooling_sequence,
    col_pooling_sequence); backward FractionalMaxPoolGrad (to each cell's first maximum)."""
    return _fractional_pool("FractionalMaxPool", value, pooling_ratio, pseudo_random,
                            overlapping, deterministic, seed, seed2)
