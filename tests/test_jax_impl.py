"""tfgrad.jax's two implementations: choosing them, and what each gives under JAX's
transformations (gradients to any order and in forward mode, vmap, raw ops).

Native results are held to the family modules' BOUNDS (tests/test_jax_native.py has the
per-case sweep); exact results to tfgrad.raw_ops' bits.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install tfgrad[jax])")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import tfgrad  # noqa: E402
import tfgrad.jax as tj  # noqa: E402
from tests.oracle import assert_same  # noqa: E402
from tests.test_jax_native import check_outputs  # noqa: E402
from tfgrad import raw_ops  # noqa: E402
from tfgrad.jax._native import batch_norm as bn_native  # noqa: E402
from tfgrad.jax._native import depthwise_conv as dw_native  # noqa: E402
from tfgrad.jax._native import fake_quant as fq_native  # noqa: E402
from tfgrad.jax._native import fractional_pool as fp_native  # noqa: E402

IMPLS = ["exact", "native"]
DW = dict(strides=[1, 1, 1, 1], padding="SAME")
POOL = dict(pooling_ratio=[1.0, 1.44, 1.73, 1.0], deterministic=True, seed=3, seed2=7)


def rand(*shape: int, dtype=np.float32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.fixture
def x64():
    # The global flag, not the jax.enable_x64() context manager: JAX checks a callback's
    # results on XLA's threads, where that thread-local context is not in force.
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def lowered(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


# --------------------------------------------------------------------------------------
# Choosing
# --------------------------------------------------------------------------------------
def test_use_impl_function_and_context_manager():
    assert tj._choice.current() == "auto"
    with tj.use_impl("native"):
        assert tj._choice.current() == "native"
        with tj.use_impl("exact"):
            assert tj._choice.current() == "exact"
        assert tj._choice.current() == "native"
    assert tj._choice.current() == "auto"
    tj.use_impl("exact")
    try:
        assert tj._choice.current() == "exact"
    finally:
        tj.use_impl("auto")
    with pytest.raises(ValueError, match="'auto', 'exact', 'native'"):
        tj.use_impl("portable")


def test_auto_is_exact_on_one_cpu_device_and_jit_retraces():
    x = jnp.linspace(-7, 7, 9)
    f = jax.jit(tj.fake_quant_with_min_max_args)
    assert "callback" in lowered(tj.fake_quant_with_min_max_args, x)  # auto: exact
    with tj.use_impl("native"):
        assert "callback" not in lowered(tj.fake_quant_with_min_max_args, x)
        assert_same(np.asarray(f(x)), raw_ops.FakeQuantWithMinMaxArgs(inputs=np.asarray(x)))
    with tj.use_impl("exact"):
        assert "callback" in lowered(tj.fake_quant_with_min_max_args, x)


@pytest.mark.parametrize("impl", IMPLS)
def test_vmap_batches_natively(impl):
    x, w = rand(3, 1, 6, 6, 2), rand(3, 3, 2, 1, seed=1)

    def f(x: jax.Array) -> jax.Array:
        return tj.depthwise_conv2d_native(x, w, **DW)

    with tj.use_impl(impl):
        text = lowered(jax.vmap(f), x)
        ys = jax.jit(jax.vmap(f))(x)
    assert ("callback" in text) == (impl == "exact")
    for i in range(3):
        want = raw_ops.DepthwiseConv2dNative(input=x[i], filter=w, **DW)
        check_outputs("DepthwiseConv2dNative", ys[i], want, dw_native.BOUNDS)


def test_disable_jit_runs_the_implementations():
    x = jnp.linspace(-7, 7, 9)
    want = raw_ops.FakeQuantWithMinMaxArgs(inputs=np.asarray(x))
    with jax.disable_jit():
        for impl in IMPLS:
            with tj.use_impl(impl):
                assert_same(np.asarray(tj.fake_quant_with_min_max_args(x)), want)


# --------------------------------------------------------------------------------------
# raw_ops
# --------------------------------------------------------------------------------------
def test_raw_ops_has_every_op():
    assert sorted(tj.raw_ops.__all__) == sorted(tfgrad._opdefs.OPS)
    out = tj.raw_ops.FusedBatchNormGradV3(
        y_backprop=jnp.ones((1, 2, 2, 3)), x=jnp.ones((1, 2, 2, 3)), scale=jnp.ones(3),
        reserve_space_1=jnp.ones(3), reserve_space_2=jnp.ones(3), reserve_space_3=jnp.zeros(()))
    assert type(out) is raw_ops.FusedBatchNormGradV3.Output


def test_raw_ops_argument_errors():
    g = jnp.ones((1, 2, 2, 2))
    f = jax.jit(lambda s: tj.raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=s, filter=jnp.ones((2, 2, 2, 1)), out_backprop=g, **DW))
    with pytest.raises(TypeError, match="must be static"):
        f(jnp.array([1, 2, 2, 2]))
    with pytest.raises(TypeError, match="unexpected argument"):
        tj.raw_ops.FakeQuantWithMinMaxArgs(inputs=g, bits=3)
    with pytest.raises(TypeError, match="missing input 'max'"):
        tj.raw_ops.FakeQuantWithMinMaxVars(inputs=g, min=0.0)
    with pytest.raises(tfgrad.InvalidArgumentError, match="num_bits"):
        tj.raw_ops.FakeQuantWithMinMaxArgs(inputs=g, num_bits=1)


# --------------------------------------------------------------------------------------
# Native gradients: TF's gradient ops, within the bounds
# --------------------------------------------------------------------------------------
def _vjp(fn, args, g):
    out, pull = jax.vjp(fn, *args)
    first = out[0] if isinstance(out, tuple) else out
    cot = jax.tree_util.tree_map(jnp.zeros_like, out)
    cot = (type(out)(jnp.asarray(g), *cot[1:]) if isinstance(out, tuple) else jnp.asarray(g))
    return first, pull(cot)


def test_native_gradients_are_tf_gradient_ops():
    with tj.use_impl("native"):
        # fake quantization, per channel: gradients to inputs, min and max
        x, g = rand(6, 3) * 3, rand(6, 3, seed=1)
        lo, hi = np.array([-1, -2, 0.5], np.float32), np.array([1, 0.5, 2], np.float32)
        _, grads = _vjp(jax.jit(tj.fake_quant_with_min_max_vars_per_channel), (x, lo, hi), g)
        want = raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(gradients=g, inputs=x, min=lo,
                                                                 max=hi)
        check_outputs("FakeQuantWithMinMaxVarsPerChannelGradient", tuple(grads), want,
                      fq_native.BOUNDS)
        # batch norm, NCHW training
        x, g = rand(2, 3, 4, 4) + 1, rand(2, 3, 4, 4, seed=2)
        c = [rand(3, seed=3) + 1, rand(3, seed=4), np.zeros(0, np.float32),
             np.zeros(0, np.float32)]
        fwd = jax.jit(lambda *a: tj.fused_batch_norm_v3(*a, data_format="NCHW"))
        _, grads = _vjp(fwd, (x, *c), g)
        y = raw_ops.FusedBatchNormV3(x=x, scale=c[0], offset=c[1], mean=c[2], variance=c[3],
                                     data_format="NCHW")
        want = raw_ops.FusedBatchNormGradV3(
            y_backprop=g, x=x, scale=c[0], reserve_space_1=y.reserve_space_1,
            reserve_space_2=y.reserve_space_2, reserve_space_3=y.reserve_space_3,
            data_format="NCHW")
        check_outputs("FusedBatchNormGradV3", tuple(grads[:3]) + tuple(want[3:]), want,
                      bn_native.BOUNDS)
        # fractional max pooling: each gradient to its cell's first maximum
        v = rand(1, 9, 8, 2)
        out = raw_ops.FractionalMaxPool(value=v, **POOL)
        g = rand(*out.output.shape, seed=5)
        _, (dv,) = _vjp(jax.jit(lambda a: tj.fractional_max_pool(a, **POOL)), (v,), g)
        want = raw_ops.FractionalMaxPoolGrad(orig_input=v, orig_output=out.output,
                                             out_backprop=g,
                                             row_pooling_sequence=out.row_pooling_sequence,
                                             col_pooling_sequence=out.col_pooling_sequence)
        check_outputs("FractionalMaxPoolGrad", dv, want, fp_native.BOUNDS)


# --------------------------------------------------------------------------------------
# Higher derivatives and forward mode
# --------------------------------------------------------------------------------------
def test_exact_forward_mode_is_tf_ops():
    """The tangent of depthwise conv is DW(tx, w) + DW(x, tw): TF's forward op, twice."""
    x, w, tx, tw = rand(1, 5, 5, 2), rand(3, 3, 2, 1, seed=1), rand(1, 5, 5, 2, seed=2), \
        rand(3, 3, 2, 1, seed=3)
    with tj.use_impl("exact"):
        _, t = jax.jvp(lambda a, b: tj.depthwise_conv2d_native(a, b, **DW), (x, w), (tx, tw))
    want = (raw_ops.DepthwiseConv2dNative(input=tx, filter=w, **DW)
            + raw_ops.DepthwiseConv2dNative(input=x, filter=tw, **DW))
    assert_same(np.asarray(t), want)


def test_hessians_where_tf_defines_them(x64):
    """``jax.hessian`` (forward over reverse) equals reverse over reverse, and the native
    and exact implementations agree, for depthwise conv (through its table) and average
    pooling (through its linearised gradient); float64."""
    x, w = rand(1, 5, 5, 2, dtype=np.float64), rand(3, 3, 2, 2, dtype=np.float64, seed=1)
    v = rand(1, 9, 8, 2, dtype=np.float64)
    cases = [(lambda b: (tj.depthwise_conv2d_native(x, b, **DW) ** 3).sum(), w),
             (lambda a: (tj.fractional_avg_pool(a, **POOL).output ** 3).sum(), v)]
    for f, arg in cases:
        results = []
        for impl in IMPLS:
            with tj.use_impl(impl):
                h = np.asarray(jax.jit(jax.hessian(f))(arg)).reshape(arg.size, arg.size)
                rr = np.asarray(jax.jit(jax.jacrev(jax.jacrev(f)))(arg))
            assert np.allclose(h, rr.reshape(h.shape), rtol=1e-12, atol=1e-12)
            assert np.allclose(h, h.T, rtol=1e-12, atol=1e-12)
            results.append(h)
        assert np.allclose(results[0], results[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_batch_norm_second_derivative(impl):
    """TF's _FusedBatchNormGradGrad: the derivative of the gradient, through the native
    code in both implementations (float32: check_grads with a large step)."""
    x = jnp.asarray(rand(3, 4, 4, 2) * 2 + 1)
    scale, offset = jnp.asarray(rand(2, seed=1) + 1), jnp.asarray(rand(2, seed=2))
    empty = jnp.zeros(0)
    weights = jnp.asarray(rand(3, 4, 4, 2, seed=3))

    def f(x_: jax.Array, s_: jax.Array) -> jax.Array:
        y = tj.fused_batch_norm_v3(x_, s_, offset, empty, empty, epsilon=0.01).y
        return (y * weights).sum() ** 2

    with tj.use_impl(impl):
        check_grads(f, (x, scale), order=2, modes=["rev"], eps=1e-2, atol=5e-2, rtol=5e-2)
        h = jax.jit(jax.hessian(f, argnums=1))(x, scale)
    assert np.all(np.isfinite(np.asarray(h)))


@pytest.mark.parametrize("impl", IMPLS)
def test_no_second_derivative_where_tf_has_none(impl):
    x = jnp.linspace(-7, 7, 9)
    v = jnp.asarray(rand(1, 6, 6, 1))
    with tj.use_impl(impl):
        with pytest.raises(LookupError, match="FakeQuantWithMinMaxArgsGradient"):
            jax.grad(lambda a: jax.grad(
                lambda b: (tj.fake_quant_with_min_max_args(b) ** 2).sum())(a).sum())(x)
        with pytest.raises(LookupError, match="FractionalMaxPoolGrad"):
            jax.hessian(lambda a: (tj.fractional_max_pool(a, **POOL).output ** 2).sum())(v)
        # first-order forward mode exists (the transpose of the gradient op)
        _, t = jax.jvp(tj.fake_quant_with_min_max_args, (x,), (jnp.ones(9),))
    assert_same(np.asarray(t), raw_ops.FakeQuantWithMinMaxArgsGradient(
        gradients=np.ones(9, np.float32), inputs=np.asarray(x)))


# --------------------------------------------------------------------------------------
# Fractional pooling: seeds
# --------------------------------------------------------------------------------------
def test_native_traced_seeds_give_tf_sequences():
    v = jnp.asarray(rand(2, 11, 10, 1))
    ratio = [1.0, 1.5, 1.4, 1.0]
    with tj.use_impl("native"):
        f = jax.jit(lambda a, s: tj.fractional_avg_pool(a, ratio, pseudo_random=True,
                                                        deterministic=True, seed=s, seed2=9))
        batched = jax.jit(jax.vmap(lambda s: f(v, s)))(jnp.array([1, 2]))
        with pytest.raises(tfgrad.InvalidArgumentError, match="deterministic"):
            jax.jit(lambda a: tj.fractional_max_pool(a, ratio))(v)
    for i, s in enumerate((1, 2)):
        want = raw_ops.FractionalAvgPool(value=np.asarray(v), pooling_ratio=ratio,
                                         pseudo_random=True, deterministic=True, seed=s,
                                         seed2=9)
        got = tuple(np.asarray(a[i]) for a in batched)
        check_outputs("FractionalAvgPool", (got[0], *(np.asarray(a, np.int64) for a in got[1:])),
                      want, fp_native.BOUNDS)
