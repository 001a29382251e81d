"""tfgrad.jax: the JAX adapter (jit, grad and vmap, example), in its default implementation.

On one CPU device ``"auto"`` runs the exact kernels, so outputs and gradients are held
bit-equal to tfgrad.raw_ops (and, live, to TF's GradientTape); jax.test_util.check_grads
runs in float64 where the op is smooth and takes float64 (depthwise conv, also at order 2;
fractional pooling). The native implementation: tests/test_jax_native.py (every case),
tests/test_jax_impl.py (transformations), tests/test_jax_sharding.py (meshes).
"""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install tfgrad[jax])")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import tfgrad  # noqa: E402
import tfgrad.jax as tj  # noqa: E402
from tests import oracle  # noqa: E402
from tfgrad import raw_ops  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------
# Skip (only) families whose implementation has not landed yet
# --------------------------------------------------------------------------------------
_PROBES = {
    "fake_quant": lambda: raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
        gradients=np.ones((2, 3), np.float32), inputs=np.ones((2, 3), np.float32),
        min=-np.ones(3, np.float32), max=np.ones(3, np.float32)),
    "batch_norm": lambda: raw_ops.FusedBatchNormGradV3(
        y_backprop=np.ones((1, 2, 2, 3), np.float32), x=np.ones((1, 2, 2, 3), np.float32),
        scale=np.ones(3, np.float32), reserve_space_1=np.ones(3, np.float32),
        reserve_space_2=np.ones(3, np.float32), reserve_space_3=np.float32(0)),
    "depthwise_conv": lambda: raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=np.ones((1, 3, 3, 2), np.float32), filter_sizes=[2, 2, 2, 1],
        out_backprop=np.ones((1, 2, 2, 2), np.float32), strides=[1, 1, 1, 1],
        padding="VALID"),
    "fractional_pool": lambda: raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=[1, 4, 4, 1], out_backprop=np.ones((1, 2, 2, 1), np.float32),
        row_pooling_sequence=[0, 2, 4], col_pooling_sequence=[0, 2, 4]),
    "reduction": lambda: raw_ops.Mean(input=np.ones((2, 3), np.float32), axis=[1]),
    "softmax_xent": lambda: raw_ops.SparseSoftmaxCrossEntropyWithLogits(
        features=np.ones((2, 3), np.float32), labels=np.zeros(2, np.int32)),
    "activation": lambda: raw_ops.ReluGrad(gradients=np.ones(3, np.float32),
                                           features=np.ones(3, np.float32)),
    "bias_add": lambda: raw_ops.BiasAddGrad(out_backprop=np.ones((2, 3), np.float32)),
    "matmul": lambda: raw_ops.MatMul(a=np.ones((2, 3), np.float32),
                                     b=np.ones((3, 2), np.float32)),
    "conv2d": lambda: raw_ops.Conv2DBackpropFilter(
        input=np.ones((1, 3, 3, 2), np.float32), filter_sizes=[2, 2, 2, 1],
        out_backprop=np.ones((1, 2, 2, 1), np.float32), strides=[1, 1, 1, 1],
        padding="VALID"),
    "softmax": lambda: raw_ops.Softmax(logits=np.ones((2, 3), np.float32)),
    "cwise": lambda: raw_ops.RsqrtGrad(y=np.ones(3, np.float32), dy=np.ones(3, np.float32)),
    "max_pool": lambda: raw_ops.MaxPoolGrad(
        orig_input=np.ones((1, 2, 2, 1), np.float32), orig_output=np.ones((1, 1, 1, 1), np.float32),
        grad=np.ones((1, 1, 1, 1), np.float32), ksize=[1, 2, 2, 1], strides=[1, 1, 1, 1],
        padding="VALID"),
    "avg_pool": lambda: raw_ops.AvgPoolGrad(
        orig_input_shape=[1, 2, 2, 1], grad=np.ones((1, 1, 1, 1), np.float32),
        ksize=[1, 2, 2, 1], strides=[1, 1, 1, 1], padding="VALID"),
}
_FAMILY_OPS = {
    "fake_quant": lambda: [raw_ops.FakeQuantWithMinMaxArgs(inputs=np.ones(2, np.float32))],
    "batch_norm": lambda: [raw_ops.FusedBatchNormV3(x=np.ones((1, 2, 2, 3), np.float32),
                                                    **{k: np.ones(3, np.float32) for k in (
                                                        "scale", "offset", "mean",
                                                        "variance")})],
    "depthwise_conv": lambda: [raw_ops.DepthwiseConv2dNative(
        input=np.ones((1, 3, 3, 2), np.float32), filter=np.ones((2, 2, 2, 1), np.float32),
        strides=[1, 1, 1, 1], padding="VALID")],
    "fractional_pool": lambda: [raw_ops.FractionalMaxPool(
        value=np.ones((1, 4, 4, 1), np.float32), pooling_ratio=[1, 1.5, 1.5, 1])],
    "reduction": lambda: [raw_ops.Sum(input=np.ones((2, 3), np.float32), axis=[0])],
    "softmax_xent": lambda: [raw_ops.SparseSoftmaxCrossEntropyWithLogits(
        features=np.ones((2, 3), np.float32), labels=np.zeros(2, np.int32))],
    "activation": lambda: [raw_ops.Relu(features=np.ones(3, np.float32))],
    "bias_add": lambda: [raw_ops.BiasAdd(value=np.ones((2, 3), np.float32),
                                         bias=np.ones(3, np.float32))],
    "matmul": lambda: [raw_ops.MatMul(a=np.ones((2, 3), np.float32),
                                      b=np.ones((3, 2), np.float32))],
    "conv2d": lambda: [raw_ops.Conv2D(input=np.ones((1, 3, 3, 2), np.float32),
                                      filter=np.ones((2, 2, 2, 1), np.float32),
                                      strides=[1, 1, 1, 1], padding="VALID")],
    "softmax": lambda: [raw_ops.Softmax(logits=np.ones((2, 3), np.float32))],
    "cwise": lambda: [raw_ops.SquaredDifference(x=np.ones((2, 3), np.float32),
                                                y=np.ones((1, 3), np.float32))],
    "max_pool": lambda: [raw_ops.MaxPool(input=np.ones((1, 2, 2, 1), np.float32),
                                         ksize=[1, 2, 2, 1], strides=[1, 1, 1, 1],
                                         padding="VALID")],
    "avg_pool": lambda: [raw_ops.AvgPool(value=np.ones((1, 2, 2, 1), np.float32),
                                         ksize=[1, 2, 2, 1], strides=[1, 1, 1, 1],
                                         padding="VALID")],
}


@functools.cache
def _missing(family: str) -> str | None:
    try:
        _PROBES[family]()
        _FAMILY_OPS[family]()
    except (ModuleNotFoundError, AttributeError) as e:
        return f"tfgrad.ops.{family} is not implemented yet ({type(e).__name__}: {e})"
    return None


def need(*families: str) -> None:
    for family in families:
        reason = _missing(family)
        if reason:
            pytest.skip(reason)


def rand(*shape: int, dtype=np.float32, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed + 1000 * len(shape) + sum(shape))
    return (rng.standard_normal(shape) * scale).astype(dtype)


def same(actual, expected, what: str = "") -> None:
    oracle.assert_same(np.asarray(actual), np.asarray(expected), what=what)


def vjp(fn, args, g):
    """Gradients of fn at args for the cotangent g of its (first) output."""
    out, pull = jax.vjp(lambda *a: fn(*a), *args)
    if isinstance(out, tuple):
        cot = tuple(jnp.asarray(g) if i == 0 else jax.tree_util.tree_map(jnp.zeros_like, o)
                    for i, o in enumerate(out))
        cot = type(out)(*cot) if hasattr(out, "_fields") else cot
    else:
        cot = jnp.asarray(g)
    return out, pull(cot)


@pytest.fixture
def x64():
    # The global flag, not the jax.enable_x64() context manager: JAX checks a callback's
    # results on XLA's threads, where that thread-local context is not in force.
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


# --------------------------------------------------------------------------------------
# Module-level behaviour
# --------------------------------------------------------------------------------------
def test_import_tfgrad_does_not_import_jax():
    code = ("import sys, tfgrad; import tfgrad.raw_ops; "
            "assert 'jax' not in sys.modules and 'torch' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_import_error_names_the_extra():
    code = ("import sys; sys.modules['jax'] = None\n"
            "try:\n    import tfgrad.jax\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=ROOT).stdout
    assert "pip install tfgrad[jax]" in out


@pytest.mark.parametrize("name", [n for n in tj.__all__ if n not in ("raw_ops", "use_impl")])
def test_same_signature_as_functional_api(name):
    def params(fn):
        return [(p.name, p.kind == p.KEYWORD_ONLY,
                 tuple(p.default) if isinstance(p.default, list) else p.default)
                for p in inspect.signature(fn).parameters.values()]
    assert params(getattr(tj, name)) == params(getattr(tfgrad, name))


def test_dtype_errors(x64):
    with pytest.raises(TypeError, match="float64, but the op takes float32"):
        tj.fake_quant_with_min_max_args(jnp.zeros(3, jnp.float64))
    with pytest.raises(TypeError, match="int16"):
        tj.fractional_avg_pool(jnp.zeros((1, 4, 4, 1), jnp.int16), [1, 2, 2, 1])


def test_argument_errors_raise_at_trace_time():
    need("depthwise_conv")
    f = jax.jit(lambda x, w: tj.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "VALID"))
    with pytest.raises(tfgrad.InvalidArgumentError, match="same depth"):
        f(jnp.ones((1, 4, 4, 2)), jnp.ones((2, 2, 3, 1)))


# --------------------------------------------------------------------------------------
# Fake quantization
# --------------------------------------------------------------------------------------
def test_fake_quant_args_under_jit():
    need("fake_quant")
    x, g = rand(6, 5, scale=3.0), rand(6, 5, seed=1)
    attrs = dict(min=-2.0, max=1.5, num_bits=5, narrow_range=True)
    f = jax.jit(lambda a: tj.fake_quant_with_min_max_args(a, **attrs))
    y, (dx,) = vjp(f, [jnp.asarray(x)], g)
    same(y, raw_ops.FakeQuantWithMinMaxArgs(inputs=x, **attrs))
    same(dx, raw_ops.FakeQuantWithMinMaxArgsGradient(gradients=g, inputs=x, **attrs))


@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quant_vars_grads_equal_raw_ops(per_channel):
    need("fake_quant")
    x, g = rand(4, 5, 3, scale=3.0), rand(4, 5, 3, seed=2)
    if per_channel:
        lo, hi = np.array([-1, -2, -0.5], np.float32), np.array([1, 0.5, 2], np.float32)
        fn, op = tj.fake_quant_with_min_max_vars_per_channel, "FakeQuantWithMinMaxVarsPerChannel"
    else:
        lo, hi = np.float32(-1.2), np.float32(0.9)
        fn, op = tj.fake_quant_with_min_max_vars, "FakeQuantWithMinMaxVars"
    y, got = vjp(jax.jit(lambda a, b, c: fn(a, b, c, num_bits=6)),
                 [jnp.asarray(x), jnp.asarray(lo), jnp.asarray(hi)], g)
    kw = dict(inputs=x, min=lo, max=hi, num_bits=6)
    same(y, getattr(raw_ops, op)(**kw))
    for a, e in zip(got, getattr(raw_ops, op + "Gradient")(gradients=g, **kw)):
        same(a, e)


# --------------------------------------------------------------------------------------
# Fused batch norm
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,training,factor", [("NHWC", True, 1.0), ("NCHW", True, 0.3),
                                                 ("NCHW", False, 1.0)])
def test_batch_norm_grads_equal_raw_ops(fmt, training, factor):
    need("batch_norm")
    shape = (3, 4, 5, 2) if fmt == "NHWC" else (3, 2, 4, 5)
    x, g = rand(*shape) * 2 + 1, rand(*shape, seed=3)
    scale, offset = rand(2, seed=1) + 1, rand(2, seed=2)
    mean, var = rand(2, seed=4), np.abs(rand(2, seed=5)) + 0.5
    attrs = dict(epsilon=0.001, exponential_avg_factor=factor, data_format=fmt,
                 is_training=training)
    f = jax.jit(lambda *a: tj.fused_batch_norm_v3(*a, **attrs))
    out, (dx, dscale, doffset, dmean, dvar) = vjp(
        f, [jnp.asarray(a) for a in (x, scale, offset, mean, var)], g)
    assert type(out) is raw_ops.FusedBatchNormV3.Output
    want = raw_ops.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=var,
                                    **attrs)
    for name in out._fields[:5 if training else 3]:
        same(getattr(out, name), getattr(want, name), name)
    gx, gy, f2 = x, g, fmt
    if training:
        rs = dict(reserve_space_1=want.reserve_space_1, reserve_space_2=want.reserve_space_2)
    else:
        rs = dict(reserve_space_1=mean, reserve_space_2=var)
        gx, gy, f2 = x.transpose(0, 2, 3, 1), g.transpose(0, 2, 3, 1), "NHWC"
    exp = raw_ops.FusedBatchNormGradV3(y_backprop=gy, x=gx, scale=scale, **rs,
                                       reserve_space_3=want.reserve_space_3, epsilon=0.001,
                                       data_format=f2, is_training=training)
    ex = exp.x_backprop.transpose(0, 3, 1, 2) if f2 != fmt else exp.x_backprop
    same(dx, ex, "dx")
    same(dscale, exp.scale_backprop, "dscale")
    same(doffset, exp.offset_backprop, "doffset")
    assert not np.any(np.asarray(dmean)) and not np.any(np.asarray(dvar))


@pytest.mark.parametrize("fmt,training", [("NCHW", True), ("NHWC", False)])
def test_batch_norm_check_grads_float32(fmt, training):
    """TF has no float64 batch norm: check_grads in float32 with a large step and loose
    tolerances (float32 rounding in the finite differences)."""
    need("batch_norm")
    shape = (3, 2, 4, 4) if fmt == "NCHW" else (3, 4, 4, 2)
    x = jnp.asarray(rand(*shape) * 2 + 1)
    scale, offset = jnp.asarray(rand(2, seed=1) + 1), jnp.asarray(rand(2, seed=2))
    mean, var = jnp.asarray(rand(2, seed=4)), jnp.asarray(np.abs(rand(2, seed=5)) + 0.5)

    def f(x_, s_, o_):
        y = tj.fused_batch_norm_v3(x_, s_, o_, mean, var, epsilon=0.01, data_format=fmt,
                                   is_training=training).y
        return y * jnp.arange(y.size, dtype=y.dtype).reshape(y.shape) / y.size

    check_grads(f, (x, scale, offset), order=1, modes=["rev"], eps=1e-2, atol=2e-2,
                rtol=2e-2)


def test_batch_norm_vmap_over_leading_axis():
    need("batch_norm")
    xs = rand(3, 2, 4, 4, 2)
    scale, offset = np.ones(2, np.float32), np.zeros(2, np.float32)
    empty = np.zeros(0, np.float32)

    def f(x):
        return tj.fused_batch_norm_v3(x, scale, offset, empty, empty).y

    ys = jax.jit(jax.vmap(f))(jnp.asarray(xs))
    for i in range(3):
        same(ys[i], raw_ops.FusedBatchNormV3(x=xs[i], scale=scale, offset=offset, mean=empty,
                                             variance=empty).y)
    gs = jax.vmap(jax.grad(lambda x: (f(x) ** 2).sum()))(jnp.asarray(xs))
    same(gs[1], jax.grad(lambda x: (f(x) ** 2).sum())(jnp.asarray(xs[1])))


# --------------------------------------------------------------------------------------
# Depthwise convolution
# --------------------------------------------------------------------------------------
DW_CASES = [
    ((2, 6, 5, 3), (3, 3, 3, 2), [1, 1, 1, 1], "SAME", [], [1, 1, 1, 1], "NHWC"),
    ((1, 7, 7, 2), (2, 3, 2, 1), [1, 2, 2, 1], "VALID", [], [1, 1, 1, 1], "NHWC"),
    ((1, 5, 6, 2), (3, 3, 2, 1), [1, 1, 1, 1], "EXPLICIT", [0, 0, 1, 2, 2, 0, 0, 0],
     [1, 1, 1, 1], "NHWC"),
    ((1, 2, 7, 6), (2, 2, 2, 2), [1, 1, 1, 1], "SAME", [], [1, 1, 2, 2], "NCHW"),
]


def _dw_attrs(case):
    return dict(strides=case[2], padding=case[3], explicit_paddings=case[4],
                dilations=case[5], data_format=case[6])


@pytest.mark.parametrize("case", DW_CASES[:3], ids=lambda c: c[3])
def test_depthwise_grads_equal_raw_ops(case):
    need("depthwise_conv")
    x, w = rand(*case[0]), rand(*case[1], seed=1)
    attrs = _dw_attrs(case)
    f = jax.jit(lambda a, b: tj.depthwise_conv2d_native(a, b, **attrs))
    y = raw_ops.DepthwiseConv2dNative(input=x, filter=w, **attrs)
    g = rand(*y.shape, seed=2)
    out, (dx, dw) = vjp(f, [jnp.asarray(x), jnp.asarray(w)], g)
    same(out, y)
    same(dx, raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=list(x.shape), filter=w, out_backprop=g, **attrs), "dx")
    same(dw, raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=x, filter_sizes=list(w.shape), out_backprop=g, **attrs), "dw")


@pytest.mark.parametrize("case", [DW_CASES[0], DW_CASES[3]], ids=["SAME", "NCHW-dilated"])
def test_depthwise_check_grads_order_2(case, x64):
    need("depthwise_conv")
    attrs = _dw_attrs(case)
    x, w = rand(*case[0], dtype=np.float64), rand(*case[1], dtype=np.float64, seed=1)
    check_grads(lambda a, b: tj.depthwise_conv2d_native(a, b, **attrs),
                (jnp.asarray(x), jnp.asarray(w)), order=2, modes=["rev"])


def test_depthwise_vmap():
    need("depthwise_conv")
    attrs = _dw_attrs(DW_CASES[1])
    xs, ws = rand(3, 1, 7, 7, 2), rand(3, 2, 3, 2, 1, seed=1)

    def f(x, w):
        return tj.depthwise_conv2d_native(x, w, **attrs)

    one_filter = jax.jit(jax.vmap(f, in_axes=(0, None)))(jnp.asarray(xs), jnp.asarray(ws[0]))
    both = jax.vmap(f)(jnp.asarray(xs), jnp.asarray(ws))
    for i in range(3):
        same(one_filter[i], raw_ops.DepthwiseConv2dNative(input=xs[i], filter=ws[0], **attrs))
        same(both[i], raw_ops.DepthwiseConv2dNative(input=xs[i], filter=ws[i], **attrs))
    gw = jax.vmap(jax.grad(lambda x, w: f(x, w).sum(), argnums=1))(jnp.asarray(xs),
                                                                    jnp.asarray(ws))
    same(gw[2], jax.grad(lambda w: f(jnp.asarray(xs[2]), w).sum())(jnp.asarray(ws[2])))


# --------------------------------------------------------------------------------------
# Fractional pooling
# --------------------------------------------------------------------------------------
POOL = dict(pooling_ratio=[1.0, 1.44, 1.73, 1.0], deterministic=True, seed=3, seed2=7)


@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize("overlapping", [False, True])
def test_fractional_pool_check_grads(kind, overlapping, x64):
    need("fractional_pool")
    fn = getattr(tj, f"fractional_{kind}_pool")
    v = jnp.asarray(rand(2, 9, 8, 2, dtype=np.float64))
    check_grads(lambda a: fn(a, overlapping=overlapping, **POOL).output, (v,), order=1,
                modes=["rev"])


@pytest.mark.parametrize("kind", ["Avg", "Max"])
def test_fractional_pool_grads_equal_raw_ops(kind):
    need("fractional_pool")
    fn = getattr(tj, f"fractional_{kind.lower()}_pool")
    v = rand(2, 10, 9, 3)
    want = getattr(raw_ops, f"Fractional{kind}Pool")(value=v, **POOL)
    g = rand(*want.output.shape, seed=4)
    out, (dv,) = vjp(jax.jit(lambda a: fn(a, **POOL)), [jnp.asarray(v)], g)
    same(out.output, want.output)
    # Without jax_enable_x64 the sequences are int32 (same values)
    same(np.asarray(out.row_pooling_sequence, np.int64), want.row_pooling_sequence)
    seqs = dict(row_pooling_sequence=want.row_pooling_sequence,
                col_pooling_sequence=want.col_pooling_sequence)
    if kind == "Avg":
        exp = raw_ops.FractionalAvgPoolGrad(orig_input_tensor_shape=list(v.shape),
                                            out_backprop=g, **seqs)
    else:
        exp = raw_ops.FractionalMaxPoolGrad(orig_input=v, orig_output=want.output,
                                            out_backprop=g, **seqs)
    same(dv, exp)


def test_fractional_pool_traced_seeds_and_x64_sequences(x64):
    need("fractional_pool")
    v = jnp.asarray(rand(1, 11, 11, 1))
    f = jax.jit(lambda a, s: tj.fractional_avg_pool(a, [1, 1.5, 1.5, 1], deterministic=True,
                                                    seed=s, seed2=9))
    for s in (1, 2):
        out = f(v, jnp.int64(s))
        want = raw_ops.FractionalAvgPool(value=np.asarray(v), pooling_ratio=[1, 1.5, 1.5, 1],
                                         deterministic=True, seed=s, seed2=9)
        assert out.row_pooling_sequence.dtype == jnp.int64
        for a, e in zip(out, want):
            same(a, e)
    seeds = jnp.array([1, 2, 3])
    batched = jax.vmap(lambda s: f(v, s).output)(seeds)
    same(batched[2], f(v, jnp.int64(3)).output)


def test_example_runs_quick():
    need("fractional_pool")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "jax_fractional_pool.py"),
                        "--quick"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "loss" in r.stdout


# --------------------------------------------------------------------------------------
# Live: TF's GradientTape on the same inputs gives the same bits
# --------------------------------------------------------------------------------------
def _tf_grads(fn, inputs, g):
    tf = oracle.tensorflow()
    with tf.device("/CPU:0"):
        ts = [tf.constant(a) for a in inputs]
        with tf.GradientTape() as tape:
            for t in ts:
                tape.watch(t)
            y = fn(tf, *ts)
        out = tape.gradient(y, ts, output_gradients=tf.constant(g))
        return [None if d is None else d.numpy() for d in out]


@pytest.mark.live
def test_live_all_families():
    need(*tfgrad._opdefs.FAMILIES)
    # fake quant, per channel
    x, lo, hi = rand(5, 3, scale=3.0), np.array([-1, -2, 0.2], np.float32), np.ones(3, np.float32)
    g = rand(5, 3, seed=1)
    _, mine = vjp(tj.fake_quant_with_min_max_vars_per_channel, [x, lo, hi], g)
    theirs = _tf_grads(lambda tf, a, b, c: tf.raw_ops.FakeQuantWithMinMaxVarsPerChannel(
        inputs=a, min=b, max=c), [x, lo, hi], g)
    for a, e in zip(mine, theirs):
        same(a, e)
    # batch norm, NCHW training
    x, g = rand(2, 3, 4, 5) + 1, rand(2, 3, 4, 5, seed=2)
    c = [rand(3, seed=3) + 1, rand(3, seed=4), np.zeros(0, np.float32), np.zeros(0, np.float32)]
    _, mine = vjp(lambda *a: tj.fused_batch_norm_v3(*a, data_format="NCHW"), [x, *c], g)
    theirs = _tf_grads(lambda tf, *a: tf.raw_ops.FusedBatchNormV3(
        x=a[0], scale=a[1], offset=a[2], mean=a[3], variance=a[4], data_format="NCHW")[0],
        [x, *c], g)
    for a, e in zip(mine[:3], theirs[:3]):
        same(a, e)
    # depthwise, strided SAME
    x, w = rand(1, 6, 6, 2), rand(2, 3, 2, 2, seed=1)
    g = rand(1, 3, 3, 4, seed=5)
    attrs = dict(strides=[1, 2, 2, 1], padding="SAME")
    _, mine = vjp(lambda a, b: tj.depthwise_conv2d_native(a, b, **attrs), [x, w], g)
    theirs = _tf_grads(lambda tf, a, b: tf.raw_ops.DepthwiseConv2dNative(
        input=a, filter=b, **attrs), [x, w], g)
    for a, e in zip(mine, theirs):
        same(a, e)
    # fractional avg pool, overlapping, pseudo random
    attrs = dict(pooling_ratio=[1.0, 1.5, 1.4, 1.0], overlapping=True, pseudo_random=True,
                 deterministic=True, seed=21, seed2=4)
    v = rand(2, 9, 10, 2)
    out, (mine,) = vjp(lambda a: tj.fractional_avg_pool(a, **attrs), [v],
                       g := rand(2, 6, 7, 2, seed=6))
    assert out.output.shape == g.shape
    (theirs,) = _tf_grads(lambda tf, a: tf.raw_ops.FractionalAvgPool(value=a, **attrs)[0],
                          [v], g)
    same(mine, theirs)
