"""tfgrad.torch: the PyTorch adapter (functions, autograd, layers, example).

Gradients are held bit-equal to tfgrad.raw_ops' gradient ops (and, live, to TF's own
GradientTape on the same inputs), checked with torch.autograd.gradcheck in float64 where
the op is smooth and takes float64 (depthwise conv, fractional pooling), and with central
finite differences in float32 for batch norm (TF has no float64 batch norm).
"""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tfgrad[torch])")

import tfgrad  # noqa: E402
import tfgrad.torch as tt  # noqa: E402
from tests import oracle  # noqa: E402
from tfgrad import raw_ops  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
f32, f64 = torch.float32, torch.float64


# --------------------------------------------------------------------------------------
# Skip (only) families whose implementation has not landed yet
# --------------------------------------------------------------------------------------
def _probe_calls(family: str) -> list:
    x4 = np.ones((1, 3, 3, 2), np.float32)
    if family == "fake_quant":
        x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
        lo, hi = np.full(3, -1, np.float32), np.ones(3, np.float32)
        s0, s1 = np.float32(-1), np.float32(1)
        return [lambda: raw_ops.FakeQuantWithMinMaxArgs(inputs=x),
                lambda: raw_ops.FakeQuantWithMinMaxArgsGradient(gradients=x, inputs=x),
                lambda: raw_ops.FakeQuantWithMinMaxVars(inputs=x, min=s0, max=s1),
                lambda: raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=x, inputs=x,
                                                                min=s0, max=s1),
                lambda: raw_ops.FakeQuantWithMinMaxVarsPerChannel(inputs=x, min=lo, max=hi),
                lambda: raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
                    gradients=x, inputs=x, min=lo, max=hi)]
    if family == "batch_norm":
        c = np.ones(2, np.float32)
        fw = dict(x=x4, scale=c, offset=c, mean=c, variance=c)
        bw = dict(y_backprop=x4, x=x4, scale=c, reserve_space_1=c, reserve_space_2=c)
        return [lambda: raw_ops.FusedBatchNorm(**fw), lambda: raw_ops.FusedBatchNormV2(**fw),
                lambda: raw_ops.FusedBatchNormV3(**fw), lambda: raw_ops.FusedBatchNormGrad(**bw),
                lambda: raw_ops.FusedBatchNormGradV2(**bw),
                lambda: raw_ops.FusedBatchNormGradV3(**bw, reserve_space_3=np.float32(0))]
    if family == "depthwise_conv":
        w = np.ones((2, 2, 2, 1), np.float32)
        a = dict(strides=[1, 1, 1, 1], padding="VALID")
        g = np.ones((1, 2, 2, 2), np.float32)
        return [lambda: raw_ops.DepthwiseConv2dNative(input=x4, filter=w, **a),
                lambda: raw_ops.DepthwiseConv2dNativeBackpropInput(
                    input_sizes=[1, 3, 3, 2], filter=w, out_backprop=g, **a),
                lambda: raw_ops.DepthwiseConv2dNativeBackpropFilter(
                    input=x4, filter_sizes=[2, 2, 2, 1], out_backprop=g, **a)]
    if family == "fractional_pool":
        v = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
        a = dict(pooling_ratio=[1, 1.5, 1.5, 1], deterministic=True, seed=1, seed2=1)
        seq = np.array([0, 2, 4], np.int64)
        g = np.ones((1, 2, 2, 1), np.float32)
        return [lambda: raw_ops.FractionalAvgPool(value=v, **a),
                lambda: raw_ops.FractionalMaxPool(value=v, **a),
                lambda: raw_ops.FractionalAvgPoolGrad(
                    orig_input_tensor_shape=[1, 4, 4, 1], out_backprop=g,
                    row_pooling_sequence=seq, col_pooling_sequence=seq),
                lambda: raw_ops.FractionalMaxPoolGrad(
                    orig_input=v, orig_output=raw_ops.FractionalMaxPool(value=v, **a).output,
                    out_backprop=g, row_pooling_sequence=seq, col_pooling_sequence=seq)]
    if family == "activation":
        return [lambda: raw_ops.Relu(features=x4), lambda: raw_ops.Relu6(features=x4),
                lambda: raw_ops.ReluGrad(gradients=x4, features=x4),
                lambda: raw_ops.Relu6Grad(gradients=x4, features=x4)]
    if family == "bias_add":
        c = np.ones(2, np.float32)
        return [lambda: raw_ops.BiasAdd(value=x4, bias=c),
                lambda: raw_ops.BiasAddGrad(out_backprop=x4), lambda: raw_ops.Identity(input=x4)]
    raise KeyError(family)


@functools.cache
def _missing(family: str) -> str | None:
    for call in _probe_calls(family):
        try:
            call()
        except (ModuleNotFoundError, AttributeError) as e:
            return f"tfgrad.ops.{family} is not implemented yet ({type(e).__name__}: {e})"
    return None


def need(family: str) -> None:
    reason = _missing(family)
    if reason:
        pytest.skip(reason)


def rand(*shape: int, dtype: torch.dtype = f32, seed: int = 0, grad: bool = True,
         scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1000 * len(shape) + sum(shape))
    t = (torch.randn(*shape, generator=g, dtype=f64) * scale).to(dtype)
    return t.requires_grad_(grad)


def npy(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def same(actual: torch.Tensor, expected: np.ndarray, what: str = "") -> None:
    oracle.assert_same(npy(actual), np.asarray(expected), what=what)


def grads(out: torch.Tensor, inputs: list[torch.Tensor], g: torch.Tensor) -> list:
    return list(torch.autograd.grad(out, inputs, g))


# --------------------------------------------------------------------------------------
# Module-level behaviour
# --------------------------------------------------------------------------------------
def test_import_tfgrad_does_not_import_torch_or_jax():
    code = ("import sys, tfgrad; import tfgrad.raw_ops; "
            "assert 'torch' not in sys.modules and 'jax' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_import_error_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import tfgrad.torch\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=ROOT).stdout
    assert "pip install tfgrad[torch]" in out


FUNCTIONS = ["fake_quant_with_min_max_args", "fake_quant_with_min_max_vars",
             "fake_quant_with_min_max_vars_per_channel", "fused_batch_norm",
             "fused_batch_norm_v2", "fused_batch_norm_v3", "depthwise_conv2d_native",
             "fractional_avg_pool", "fractional_max_pool"]


def _params(fn) -> list:
    def norm(d):
        return tuple(d) if isinstance(d, list) else d
    return [(p.name, p.kind == p.KEYWORD_ONLY, norm(p.default))
            for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_same_signature_as_functional_api(name):
    assert _params(getattr(tt, name)) == _params(getattr(tfgrad, name))


def test_meta_tensors_dtype_and_type_errors():
    meta = torch.empty(2, 3, device="meta")
    out = tt.fake_quant_with_min_max_args(meta)  # the fake implementation: shapes only
    assert out.device.type == "meta" and out.shape == (2, 3) and out.dtype == f32
    with pytest.raises(TypeError, match=r"torch.float64.*takes torch.float32.*\.float\(\)"):
        tt.fake_quant_with_min_max_args(torch.zeros(3, dtype=f64))
    with pytest.raises(TypeError, match="takes torch.float16, torch.bfloat16, torch.float32"):
        tt.fused_batch_norm_v3(torch.zeros(1, 1, 1, 1, dtype=f64), *[torch.ones(1)] * 4)
    with pytest.raises(TypeError, match="Expected a value of type 'Tensor'.*found type 'list'"):
        tt.depthwise_conv2d_native([[1.0]], torch.ones(1, 1, 1, 1), [1, 1, 1, 1], "SAME")
    with pytest.raises(TypeError, match="int16"):
        tt.fractional_avg_pool(torch.zeros(1, 4, 4, 1, dtype=torch.int16), [1, 2, 2, 1])
    with pytest.raises(TypeError, match="layout"):
        tt.fake_quant_with_min_max_args(torch.zeros(3).to_sparse())


def test_inputs_are_shared_not_copied():
    from tfgrad.torch import _ops

    t = torch.arange(12, dtype=f32).reshape(3, 4)[:, ::2]  # non-contiguous view
    assert np.shares_memory(_ops.to_numpy(t), t.numpy())
    b = torch.randn(5).to(torch.bfloat16)
    nb = _ops.to_numpy(b)
    assert nb.dtype.name == "bfloat16" and nb.ctypes.data == b.data_ptr()
    out = tt.fake_quant_with_min_max_args(t)
    assert out.is_contiguous()
    x = torch.randn(4)
    y = tt.fused_batch_norm_v3(x.reshape(1, 1, 1, 4), torch.ones(4), torch.zeros(4), x, x.abs(),
                               is_training=False)
    # outputs never alias an input or each other (inference copies mean and variance)
    ptrs = {t.untyped_storage().data_ptr() for t in y if t.numel()}
    assert len(ptrs) == sum(1 for t in y if t.numel())
    assert x.untyped_storage().data_ptr() not in ptrs


def _eager_and_operator(fn, op_name, *args, **kwargs):
    """The function's eager call (around the dispatcher) and the operator's, each with
    fresh leaves: outputs and input gradients."""
    from tfgrad._opdefs import OPS
    from tfgrad.torch import _ops

    results = []
    for call in (fn, _ops.OPERATORS[op_name]):
        leaves = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor)
                  and a.is_floating_point() else a for a in args]
        out = call(*leaves, **kwargs)
        outs = tuple(out) if isinstance(out, tuple) else (out,)
        y = outs[0]
        assert type(y.grad_fn).__name__ == (
            f"GeneratedBackwardFor_tfgrad_{OPS[op_name].snake_name}_defaultBackward")
        results.append((type(y.grad_fn), outs, torch.autograd.grad(
            y.pow(2).sum(), [a for a in leaves if isinstance(a, torch.Tensor)
                             and a.requires_grad])))
    return results


def test_eager_calls_equal_the_operator():
    """Plain eager calls on CPU tensors skip the dispatcher (its per-call cost): the
    same outputs, gradients and autograd node name as the operator's."""
    x = torch.randn(2, 5, 5, 3)
    w = torch.randn(3, 3, 3, 2)
    (k1, o1, g1), (k2, o2, g2) = _eager_and_operator(
        tt.depthwise_conv2d_native, "DepthwiseConv2dNative", x, w, [1, 2, 2, 1], "SAME")
    assert k1 is not k2  # (the eager path's autograd.Function, and torch.library's)
    for a, b in zip((*o1, *g1), (*o2, *g2)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    lo, hi = torch.tensor([-1.0, -0.5, -2.0]), torch.tensor([1.0, 0.5, 2.0])
    (_, o1, g1), (_, o2, g2) = _eager_and_operator(
        tt.fake_quant_with_min_max_vars_per_channel,
        "FakeQuantWithMinMaxVarsPerChannel", x * 2, lo, hi, num_bits=4)
    for a, b in zip((*o1, *g1), (*o2, *g2)):
        assert torch.equal(a, b)


def test_eager_multi_output_node_returns_only_differentiable_outputs():
    """Batch norm's eager node holds y alone (its other five outputs bypass it): those are
    plain tensors as the operator's non-differentiable outputs are, a saved one modified
    in place still stops the backward, and first and second derivatives equal the
    operator's."""
    from tfgrad.torch import _ops

    x, s, o = torch.randn(2, 3, 3, 4), torch.rand(4) + 0.5, torch.randn(4)
    e = torch.empty(0)
    results = []
    for call in (tt.fused_batch_norm_v3, _ops.OPERATORS["FusedBatchNormV3"]):
        leaves = [v.clone().requires_grad_() for v in (x, s, o)]
        out = call(*leaves, e, e)
        for t in out[1:]:
            assert not t.requires_grad and t.grad_fn is None
        results.append((*out, *torch.autograd.grad(out[0].pow(2).sum(), leaves)))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    for call in (tt.fused_batch_norm_v3, _ops.OPERATORS["FusedBatchNormV3"]):
        leaves = [v.clone().requires_grad_() for v in (x, s, o)]
        out = call(*leaves, e, e)
        out[3].add_(1.0)  # reserve_space_1: saved for the gradient
        with pytest.raises(RuntimeError, match="inplace operation"):
            out[0].sum().backward()
    second = []
    for call in (tt.fused_batch_norm_v3, _ops.OPERATORS["FusedBatchNormV3"]):
        leaves = [v.clone().requires_grad_() for v in (x, s, o)]
        (dx,) = torch.autograd.grad(call(*leaves, e, e)[0].pow(2).sum(), leaves[:1],
                                    create_graph=True)
        second.append(torch.autograd.grad(dx.pow(2).sum(), leaves))
    for a, b in zip(*second):
        assert torch.equal(a, b)


def test_eager_calls_fall_back_to_the_operator_where_they_must():
    """Under a torch-function mode, a functorch transform, autocast or no grad (with
    ints for float attrs) the calls give what the operator gives."""
    from torch.overrides import TorchFunctionMode

    seen = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(8)
    expected = tt.fake_quant_with_min_max_args(x, min=-1, max=1)  # (ints: as floats)
    assert torch.equal(expected, tt.fake_quant_with_min_max_args(x, min=-1.0, max=1.0))
    with Spy():
        assert torch.equal(tt.fake_quant_with_min_max_args(x, min=-1, max=1), expected)
    assert any("fake_quant_with_min_max_args" in s for s in seen)
    assert torch.equal(torch.vmap(lambda v: tt.fake_quant_with_min_max_args(
        v, min=-1.0, max=1.0))(x.reshape(2, 4)).reshape(-1), expected)
    # errors are the operator's
    with pytest.raises(TypeError, match="num_bits"):
        tt.fake_quant_with_min_max_args(x, num_bits=8.0)
    with pytest.raises(tfgrad.InvalidArgumentError, match="min has to be smaller than max"):
        tt.fake_quant_with_min_max_args(x, min=1.0, max=1.0)


def test_eager_outputs_alias_no_input():
    """Batch norm in inference returns its mean input as an output in NumPy: the eager
    call copies it, as the operator does."""
    x = torch.randn(1, 2, 2, 3)
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    y = tt.fused_batch_norm_v3(x, torch.ones(3), torch.zeros(3), mean, var,
                               is_training=False)
    for t in y:
        if t.numel():
            for i in (x, mean, var):
                assert not np.shares_memory(t.numpy(), i.numpy())


# --------------------------------------------------------------------------------------
# Fake quantization: gradients are TF's gradient ops, bit for bit
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,fn", [
    ((0, 3, 3, 4), lambda x: tt.mean(x, [1, 2])),
    ((2, 0, 3, 4), lambda x: tt.mean(x, [1, 2])),  # NaN from no values
    ((0, 3, 3, 4), lambda x: tt.mean(x, [0, 1, 2, 3])),
    ((0, 3, 3, 4), lambda x: tt.sum(x, [1, 2])),
    ((0, 10), lambda x: tt.sparse_softmax_cross_entropy_with_logits(
        x, torch.zeros(0, dtype=torch.int64))[0]),
], ids=["mean-batch", "mean-inner", "mean-all", "sum", "xent"])
def test_gradients_of_an_empty_input(shape, fn):
    """An op whose gradient differentiates its composite (Sum, Mean, the cross entropy),
    on an empty input (a data shard left empty: a QAT step on a batch of 0): its output
    then depends on no input value and has no graph; the gradient is the input's empty
    shape, first and second order (it raised "element 0 of tensors does not require
    grad")."""
    x = torch.zeros(shape, requires_grad=True)
    y = fn(x)
    w = torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape)
    (g,) = torch.autograd.grad((torch.nan_to_num(y) * w).sum(), x, create_graph=True)
    assert g.shape == x.shape and not g.count_nonzero()
    y2 = fn(x)
    y2.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("num_bits,narrow_range", [(8, False), (4, True)])
def test_fake_quant_args(num_bits, narrow_range):
    need("fake_quant")
    x = rand(7, 5, scale=2.0)
    attrs = dict(min=-1.5, max=2.0, num_bits=num_bits, narrow_range=narrow_range)
    y = tt.fake_quant_with_min_max_args(x, **attrs)
    same(y, raw_ops.FakeQuantWithMinMaxArgs(inputs=npy(x), **attrs))
    g = rand(7, 5, seed=1, grad=False)
    (dx,) = grads(y, [x], g)
    same(dx, raw_ops.FakeQuantWithMinMaxArgsGradient(gradients=npy(g), inputs=npy(x), **attrs))


@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quant_vars_gradients_reach_min_and_max(per_channel):
    need("fake_quant")
    x = rand(6, 4, 3, scale=3.0)
    if per_channel:
        lo = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
        hi = torch.tensor([1.0, 0.5, 2.0], requires_grad=True)
        fn, op = tt.fake_quant_with_min_max_vars_per_channel, "FakeQuantWithMinMaxVarsPerChannel"
    else:
        lo = torch.tensor(-1.2, requires_grad=True)
        hi = torch.tensor(0.9, requires_grad=True)
        fn, op = tt.fake_quant_with_min_max_vars, "FakeQuantWithMinMaxVars"
    y = fn(x, lo, hi, num_bits=6)
    kw = dict(inputs=npy(x), min=npy(lo), max=npy(hi), num_bits=6)
    same(y, getattr(raw_ops, op)(**kw))
    g = rand(6, 4, 3, seed=2, grad=False)
    got = grads(y, [x, lo, hi], g)
    want = getattr(raw_ops, op + "Gradient")(gradients=npy(g), **kw)
    for a, e, n in zip(got, want, ("inputs", "min", "max")):
        same(a, e, n)
    assert got[1].abs().sum() > 0 and got[2].abs().sum() > 0


def test_fake_quant_has_no_double_backward():
    need("fake_quant")
    x = rand(4, 3)
    lo, hi = torch.tensor(-1.0, requires_grad=True), torch.tensor(1.0, requires_grad=True)
    (dx,) = torch.autograd.grad(tt.fake_quant_with_min_max_vars(x, lo, hi).pow(2).sum(), [x],
                                create_graph=True)
    with pytest.raises(RuntimeError, match="no gradient for FakeQuantWithMinMaxVarsGradient"):
        dx.sum().backward()
    (dx,) = torch.autograd.grad(tt.fake_quant_with_min_max_args(x).sum(), [x],
                                create_graph=True)
    with pytest.raises(RuntimeError, match="no gradient for FakeQuantWithMinMaxArgsGradient"):
        (dx * x).sum().backward()


# --------------------------------------------------------------------------------------
# Fused batch norm
# --------------------------------------------------------------------------------------
BN_CASES = [  # (version, data_format, is_training, exponential_avg_factor)
    ("FusedBatchNormV3", "NHWC", True, 1.0),
    ("FusedBatchNormV3", "NCHW", True, 0.3),
    ("FusedBatchNormV3", "NHWC", False, 1.0),
    ("FusedBatchNormV3", "NCHW", False, 1.0),
    ("FusedBatchNorm", "NHWC", True, 1.0),
    ("FusedBatchNormV2", "NCHW", False, 1.0),
]
_BN_FN = {"FusedBatchNorm": "fused_batch_norm", "FusedBatchNormV2": "fused_batch_norm_v2",
          "FusedBatchNormV3": "fused_batch_norm_v3"}


def _bn_inputs(fmt: str, c: int = 3, dtype: torch.dtype = f32, seed: int = 0) -> list:
    shape = (4, 5, 6, c) if fmt == "NHWC" else (4, c, 5, 6)
    x = (rand(*shape, seed=seed) * 2 + 0.5).to(dtype).detach().requires_grad_()
    scale = (rand(c, seed=seed + 1, grad=False) * 0.5 + 1).requires_grad_()
    offset = rand(c, seed=seed + 2)
    mean = rand(c, seed=seed + 3, grad=False)
    var = rand(c, seed=seed + 4, grad=False).abs() + 0.5
    return [x, scale, offset, mean, var]


@pytest.mark.parametrize("op,fmt,training,factor", BN_CASES)
def test_batch_norm_outputs_and_grads_equal_raw_ops(op, fmt, training, factor):
    need("batch_norm")
    x, scale, offset, mean, var = _bn_inputs(fmt)
    attrs = dict(epsilon=0.001, exponential_avg_factor=factor, data_format=fmt,
                 is_training=training)
    out = getattr(tt, _BN_FN[op])(x, scale, offset, mean, var, **attrs)
    assert type(out) is getattr(raw_ops, op).Output
    np_in = dict(x=npy(x), scale=npy(scale), offset=npy(offset), mean=npy(mean),
                 variance=npy(var))
    want = getattr(raw_ops, op)(**np_in, **attrs)
    checked = 5 if training else 3  # frozen statistics: reserve spaces are placeholders
    for name in out._fields[:checked]:
        same(getattr(out, name), getattr(want, name), name)
    assert not any(t.requires_grad for t in out[1:])
    g = rand(*x.shape, seed=9, grad=False)
    dx, dscale, doffset = grads(out.y, [x, scale, offset], g)
    # What TF's registered gradient function (_BaseFusedBatchNormGrad) computes:
    grad_op = getattr(raw_ops, op.replace("Norm", "NormGrad"))
    gx, gy, f = npy(x), npy(g), fmt
    if training:
        rs = dict(reserve_space_1=want.reserve_space_1, reserve_space_2=want.reserve_space_2)
    else:
        rs = dict(reserve_space_1=npy(mean), reserve_space_2=npy(var))
        if fmt == "NCHW":  # transposed to NHWC, as TF's gradient function does
            gx, gy, f = gx.transpose(0, 2, 3, 1), gy.transpose(0, 2, 3, 1), "NHWC"
    if op == "FusedBatchNormV3":
        rs["reserve_space_3"] = want.reserve_space_3
    exp = grad_op(y_backprop=gy, x=gx, scale=npy(scale), **rs, epsilon=0.001, data_format=f,
                  is_training=training)
    ex = exp.x_backprop.transpose(0, 3, 1, 2) if f != fmt else exp.x_backprop
    same(dx, ex, "x_backprop")
    same(dscale, exp.scale_backprop, "scale_backprop")
    same(doffset, exp.offset_backprop, "offset_backprop")


@pytest.mark.parametrize("fmt,training", [("NHWC", True), ("NCHW", True), ("NCHW", False)])
def test_batch_norm_grads_match_finite_differences(fmt, training):
    """Float32 only (TF has no float64 batch norm): central differences along a random
    direction, with h large enough for float32 rounding (relative tolerance 2e-2)."""
    need("batch_norm")
    x, scale, offset, mean, var = _bn_inputs(fmt, c=2)
    w = rand(*x.shape, seed=5, grad=False)

    def loss(x_, s_, o_):
        y = tt.fused_batch_norm_v3(x_, s_, o_, mean, var, epsilon=0.01, data_format=fmt,
                                   is_training=training).y
        return (y.double() * w).sum() + (y.double() ** 2).sum() * 0.1

    params = [x, scale, offset]
    gs = torch.autograd.grad(loss(*params), params)
    h = 1e-2
    for i, p in enumerate(params):
        d = rand(*p.shape, seed=20 + i, grad=False)
        plus = [q.detach() + h * d if j == i else q.detach() for j, q in enumerate(params)]
        minus = [q.detach() - h * d if j == i else q.detach() for j, q in enumerate(params)]
        fd = (loss(*plus) - loss(*minus)).item() / (2 * h)
        an = (gs[i].double() * d.double()).sum().item()
        assert fd == pytest.approx(an, rel=2e-2, abs=1e-2), (i, fd, an)


def test_batch_norm_grads_match_torch_batch_norm():
    """An independent formula: torch's own batch_norm, float64, on the same data."""
    need("batch_norm")
    x, scale, offset, mean, var = _bn_inputs("NCHW")
    out = tt.fused_batch_norm_v3(x, scale, offset, mean, var, epsilon=0.001,
                                 data_format="NCHW")
    x64 = x.detach().double().requires_grad_()
    s64 = scale.detach().double().requires_grad_()
    o64 = offset.detach().double().requires_grad_()
    ref = torch.nn.functional.batch_norm(x64, None, None, s64, o64, training=True, eps=0.001)
    torch.testing.assert_close(out.y.double(), ref, rtol=1e-5, atol=1e-5)
    g = rand(*x.shape, seed=3, grad=False)
    mine = grads(out.y, [x, scale, offset], g)
    theirs = grads(ref, [x64, s64, o64], g.double())
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt,training", [("NCHW", True), ("NHWC", False)])
def test_batch_norm_double_backward(fmt, training):
    """TF's _FusedBatchNormGradGrad (vjp of its composite gradient), against torch's
    native batch_norm double backward in float64 (tolerance: our composite is float32)."""
    need("batch_norm")
    x, scale, offset, mean, var = _bn_inputs(fmt, c=2)
    to_nchw = (lambda t: t) if fmt == "NCHW" else (lambda t: t.permute(0, 3, 1, 2))
    y = tt.fused_batch_norm_v3(x, scale, offset, mean, var, epsilon=0.01, data_format=fmt,
                               is_training=training).y
    x64, s64, o64 = (t.detach().double().requires_grad_() for t in (x, scale, offset))
    ref = torch.nn.functional.batch_norm(to_nchw(x64), mean.double(), var.double(), s64, o64,
                                         training=training, eps=0.01)
    w = rand(*y.shape, seed=4, grad=False)

    def second(yy, inputs):
        first = torch.autograd.grad((yy.double() ** 2 * w.double()).sum(), inputs,
                                    create_graph=True)
        total = sum((f.double() ** 2).sum() for f in first)
        return torch.autograd.grad(total, inputs)

    mine = second(y, [x, scale])
    theirs = second(ref if fmt == "NCHW" else ref.permute(0, 2, 3, 1), [x64, s64])
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a.double(), b, rtol=2e-3, atol=2e-3)


def test_batch_norm_half_precision():
    need("batch_norm")
    x, scale, offset, mean, var = _bn_inputs("NHWC", dtype=torch.bfloat16)
    want_dt = tfgrad._validate.DTYPES["bfloat16"]
    out = tt.fused_batch_norm_v3(x, scale, offset, mean, var)
    assert out.y.dtype == torch.bfloat16 and out.batch_mean.dtype == f32
    want = raw_ops.FusedBatchNormV3(x=x.view(torch.int16).numpy().view(want_dt),
                                    scale=npy(scale), offset=npy(offset), mean=npy(mean),
                                    variance=npy(var))
    same(out.y.view(torch.int16), want.y.view(np.int16))
    g = torch.ones_like(out.y)
    dx, dscale = grads(out.y, [x, scale], g)
    assert dx.dtype == torch.bfloat16 and dscale.dtype == f32


# --------------------------------------------------------------------------------------
# Depthwise convolution
# --------------------------------------------------------------------------------------
DW_CASES = [  # (input NHWC shape, filter shape, strides, padding, explicit, dilations, fmt)
    ((2, 7, 6, 3), (3, 3, 3, 2), (1, 1, 1, 1), "SAME", (), (1, 1, 1, 1), "NHWC"),
    ((1, 8, 7, 2), (3, 2, 2, 1), (1, 2, 2, 1), "VALID", (), (1, 1, 1, 1), "NHWC"),
    ((1, 6, 6, 2), (2, 3, 2, 3), (1, 2, 2, 1), "SAME", (), (1, 1, 1, 1), "NHWC"),
    ((2, 5, 6, 2), (3, 3, 2, 1), (1, 1, 1, 1), "EXPLICIT", (0, 0, 1, 2, 2, 0, 0, 0),
     (1, 1, 1, 1), "NHWC"),
    ((1, 9, 8, 2), (2, 3, 2, 2), (1, 1, 1, 1), "SAME", (), (1, 2, 2, 1), "NHWC"),
    ((1, 2, 7, 6), (3, 3, 2, 2), (1, 1, 2, 2), "SAME", (), (1, 1, 1, 1), "NCHW"),
]


def _dw(case, dtype=f64, seed=0):
    xs, ws, strides, padding, explicit, dil, fmt = case
    x, w = rand(*xs, dtype=dtype, seed=seed), rand(*ws, dtype=dtype, seed=seed + 1)
    attrs = dict(strides=list(strides), padding=padding, explicit_paddings=list(explicit),
                 data_format=fmt, dilations=list(dil))
    return x, w, attrs


@pytest.mark.parametrize("case", DW_CASES, ids=lambda c: f"{c[3]}-s{c[2][2]}-d{c[5][1]}-{c[6]}")
def test_depthwise_gradcheck(case):
    need("depthwise_conv")
    x, w, attrs = _dw(case)

    def f(x_, w_):
        return tt.depthwise_conv2d_native(x_, w_, **attrs)

    # fast_mode: random projections of the Jacobian (few op calls); full mode below.
    assert torch.autograd.gradcheck(f, (x, w), fast_mode=True)
    assert torch.autograd.gradgradcheck(f, (x, w), fast_mode=True)


def test_depthwise_gradcheck_full_jacobian():
    need("depthwise_conv")
    case = ((1, 4, 3, 2), (2, 2, 2, 2), (1, 2, 2, 1), "SAME", (), (1, 1, 1, 1), "NHWC")
    x, w, attrs = _dw(case)

    def f(x_, w_):
        return tt.depthwise_conv2d_native(x_, w_, **attrs)

    assert torch.autograd.gradcheck(f, (x, w))


@pytest.mark.parametrize("case", DW_CASES[:4], ids=lambda c: c[3])
def test_depthwise_grads_equal_raw_ops(case):
    need("depthwise_conv")
    x, w, attrs = _dw(case, dtype=f32)
    y = tt.depthwise_conv2d_native(x, w, **attrs)
    same(y, raw_ops.DepthwiseConv2dNative(input=npy(x), filter=npy(w), **attrs))
    g = rand(*y.shape, seed=7, grad=False)
    dx, dw = grads(y, [x, w], g)
    same(dx, raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=list(x.shape), filter=npy(w), out_backprop=npy(g), **attrs), "dx")
    same(dw, raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=npy(x), filter_sizes=list(w.shape), out_backprop=npy(g), **attrs), "dw")


def test_depthwise_non_contiguous_inputs():
    need("depthwise_conv")
    x, w, attrs = _dw(DW_CASES[0], dtype=f32)
    xt = x.detach().permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3).requires_grad_()
    assert not xt.is_contiguous()
    y1, y2 = (tt.depthwise_conv2d_native(a, w, **attrs) for a in (x, xt))
    assert torch.equal(y1, y2)
    g = rand(*y1.shape, seed=2, grad=False).expand_as(y1)
    assert torch.equal(grads(y1, [x], g)[0], grads(y2, [xt], g.contiguous())[0])


# --------------------------------------------------------------------------------------
# Fractional pooling
# --------------------------------------------------------------------------------------
POOL_ATTRS = [
    dict(pooling_ratio=[1.0, 1.44, 1.73, 1.0], deterministic=True, seed=3, seed2=7),
    dict(pooling_ratio=[1.0, 2.0, 1.5, 1.0], overlapping=True, pseudo_random=True,
         deterministic=True, seed=11, seed2=0),
]


@pytest.mark.parametrize("attrs", POOL_ATTRS, ids=["random", "overlapping-pseudo"])
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_fractional_pool_gradcheck(kind, attrs):
    need("fractional_pool")
    fn = tt.fractional_avg_pool if kind == "avg" else tt.fractional_max_pool
    v = rand(2, 7, 6, 2, dtype=f64)
    out = fn(v, **attrs)
    assert out.row_pooling_sequence.dtype == torch.int64
    assert not out.row_pooling_sequence.requires_grad

    def f(v_):
        return fn(v_, **attrs).output  # deterministic: the same regions on every call

    assert torch.autograd.gradcheck(f, (v,))
    if kind == "avg":
        assert torch.autograd.gradgradcheck(f, (v,), fast_mode=True)
    else:
        (dv,) = torch.autograd.grad(f(v).pow(2).sum(), [v], create_graph=True)
        with pytest.raises(RuntimeError, match="no gradient for FractionalMaxPoolGrad"):
            dv.sum().backward()


@pytest.mark.parametrize("kind", ["Avg", "Max"])
def test_fractional_pool_grads_equal_raw_ops(kind):
    need("fractional_pool")
    fn = getattr(tt, f"fractional_{kind.lower()}_pool")
    v = rand(2, 10, 9, 3)
    out = fn(v, [1.0, 1.6, 1.3, 1.0], deterministic=True, seed=5, seed2=6)
    want = getattr(raw_ops, f"Fractional{kind}Pool")(
        value=npy(v), pooling_ratio=[1.0, 1.6, 1.3, 1.0], deterministic=True, seed=5, seed2=6)
    for a, e, n in zip(out, want, want._fields):
        same(a, e, n)
    g = rand(*out.output.shape, seed=8, grad=False)
    (dv,) = grads(out.output, [v], g)
    seqs = dict(row_pooling_sequence=want.row_pooling_sequence,
                col_pooling_sequence=want.col_pooling_sequence)
    if kind == "Avg":
        exp = raw_ops.FractionalAvgPoolGrad(orig_input_tensor_shape=list(v.shape),
                                            out_backprop=npy(g), **seqs)
    else:
        exp = raw_ops.FractionalMaxPoolGrad(orig_input=npy(v), orig_output=want.output,
                                            out_backprop=npy(g), **seqs)
    same(dv, exp)


def test_fractional_pool_random_regions_are_saved_for_backward():
    """deterministic=False draws new regions per call; the backward uses this call's."""
    need("fractional_pool")
    v = rand(1, 12, 12, 1)
    out = tt.fractional_avg_pool(v, [1.0, 1.5, 1.5, 1.0])
    (dv,) = grads(out.output, [v], torch.ones_like(out.output))
    exp = raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=list(v.shape), out_backprop=np.ones(out.output.shape, np.float32),
        row_pooling_sequence=npy(out.row_pooling_sequence),
        col_pooling_sequence=npy(out.col_pooling_sequence))
    same(dv, exp)


def test_fractional_pool_integer_input():
    need("fractional_pool")
    v = torch.arange(32, dtype=torch.int32).reshape(1, 4, 8, 1)
    out = tt.fractional_max_pool(v, [1.0, 2.0, 2.0, 1.0], deterministic=True, seed=1, seed2=2)
    assert out.output.dtype == torch.int32 and not out.output.requires_grad


# --------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------
def test_fake_quant_layer():
    need("fake_quant")
    layer = tt.FakeQuantPerChannel(3, num_bits=8)
    assert torch.equal(layer.min.data, torch.full((3,), -6.0))
    assert torch.equal(layer.max.data, torch.full((3,), 6.0))
    x = rand(2, 3, 4, 5, scale=4.0)
    y = layer(x)
    nhwc = tt.FakeQuantPerChannel(3, data_format="NHWC")
    assert torch.equal(y, nhwc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
    (y * rand(*y.shape, seed=3, grad=False)).sum().backward()
    assert layer.min.grad.shape == (3,) and layer.max.grad.abs().sum() > 0


@pytest.mark.parametrize("shape", [(4, 8, 6, 6), (2, 20, 3, 5), (3, 5, 7)])
def test_fake_quant_layer_nchw_runs_on_its_memory(shape):
    # An NCHW input's channels-last view goes to the kernels as it is: the output comes
    # back contiguous NCHW (no copy), and the output and every gradient are the bits of
    # the NHWC layer on a contiguous channels-last copy.
    need("fake_quant")
    c = shape[1]
    layer = tt.FakeQuantPerChannel(c, num_bits=6, init_min=-1.5, init_max=2.0)
    nhwc = tt.FakeQuantPerChannel(c, num_bits=6, init_min=-1.5, init_max=2.0,
                                  data_format="NHWC")
    x = rand(*shape, scale=3.0)
    xl = x.detach().movedim(1, -1).contiguous().requires_grad_()
    g = rand(*shape, seed=5, grad=False)
    y = layer(x)
    assert y.is_contiguous()
    yl = nhwc(xl)
    assert torch.equal(y, yl.movedim(-1, 1))
    y.backward(g)
    yl.backward(g.movedim(1, -1))
    assert torch.equal(x.grad, xl.grad.movedim(-1, 1))
    assert torch.equal(layer.min.grad, nhwc.min.grad)
    assert torch.equal(layer.max.grad, nhwc.max.grad)


def test_batch_norm_layer_running_statistics():
    need("batch_norm")
    torch.manual_seed(0)
    bn = tt.FusedBatchNorm2d(3, exponential_avg_factor=0.25)
    x = rand(4, 3, 5, 5, scale=2.0) + 1.0
    y = bn(x)
    xd = x.detach().double()
    mean = xd.mean((0, 2, 3))
    var = xd.var((0, 2, 3), unbiased=True)  # TF updates with the Bessel-corrected variance
    torch.testing.assert_close(bn.running_mean.double(), 0.25 * mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var.double(), 0.75 + 0.25 * var, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    assert bn.weight.grad is not None and bn.bias.grad is not None
    bn.eval()
    ye = bn(x)
    want = raw_ops.FusedBatchNormV3(x=npy(x), scale=npy(bn.weight), offset=npy(bn.bias),
                                    mean=npy(bn.running_mean), variance=npy(bn.running_var),
                                    epsilon=bn.epsilon, data_format="NCHW", is_training=False)
    same(ye, want.y)
    bn2 = tt.FusedBatchNorm2d(3, exponential_avg_factor=0.25, data_format="NHWC")
    torch.testing.assert_close(bn2(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2), y,
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("padding", ["SAME", 1])
def test_depthwise_layer_matches_torch_conv2d(padding):
    need("depthwise_conv")
    torch.manual_seed(0)
    layer = tt.DepthwiseConv2d(3, 3, channel_multiplier=2, padding=padding).double()
    x = rand(2, 3, 6, 7, dtype=f64)
    y = layer(x)
    kh, kw, c, m = layer.weight.shape
    wt = layer.weight.permute(2, 3, 0, 1).reshape(c * m, 1, kh, kw)  # channel k*m + q
    ref = torch.nn.functional.conv2d(x, wt, layer.bias, padding=1, groups=c)
    torch.testing.assert_close(y, ref)
    nhwc = tt.DepthwiseConv2d(3, 3, channel_multiplier=2, padding=padding,
                              data_format="NHWC").double()
    nhwc.load_state_dict(layer.state_dict())
    torch.testing.assert_close(nhwc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2), y)
    y.sum().backward()
    assert layer.weight.grad.shape == (3, 3, 3, 2)


def test_fractional_pool_layers_seeds():
    need("fractional_pool")
    x = rand(2, 3, 10, 10)
    torch.manual_seed(1)
    a = tt.FractionalAvgPool2d(1.5, return_sequences=True)
    y1, r1, c1 = a(x)
    torch.manual_seed(1)
    y2, r2, c2 = a(x)
    assert torch.equal(y1, y2) and torch.equal(r1, r2)  # torch.manual_seed repeats regions
    b = tt.FractionalMaxPool2d((1.5, 2.0), seed=7, return_sequences=True)
    yb, rb, cb = b(x)
    want = raw_ops.FractionalMaxPool(value=npy(x).transpose(0, 2, 3, 1),
                                     pooling_ratio=[1, 1.5, 2.0, 1], deterministic=True,
                                     seed=87654321, seed2=7)  # tf.nn.fractional_max_pool(seed=7)
    same(yb.permute(0, 2, 3, 1), want.output)
    same(rb, want.row_pooling_sequence)
    yb.sum().backward()
    assert x.grad.shape == x.shape


def test_fractional_pool_layer_eager_seeds_skip_the_dispatcher(monkeypatch):
    # Eager, the layer's drawn seeds go to the op as ints (the direct path), the values a
    # compiled graph's seed tensor would carry: the regions torch.manual_seed repeats.
    need("fractional_pool")
    from tfgrad.torch import _functions

    x = rand(2, 3, 10, 10)
    layer = tt.FractionalMaxPool2d(1.5, return_sequences=True)
    torch.manual_seed(3)
    s = torch.randint(1, 2**62, (2,))
    want = raw_ops.FractionalMaxPool(value=npy(x).transpose(0, 2, 3, 1),
                                     pooling_ratio=[1, 1.5, 1.5, 1], deterministic=True,
                                     seed=int(s[0]), seed2=int(s[1]))
    calls = []
    real = _functions.FUNCTIONS["fractional_max_pool"]
    monkeypatch.setattr(tt.FractionalMaxPool2d, "_fn",
                        staticmethod(lambda *a: calls.append(a[-2:]) or real(*a)))
    torch.manual_seed(3)
    y, rows, _ = layer(x)
    same(y.permute(0, 2, 3, 1), want.output)
    same(rows, want.row_pooling_sequence)
    assert [tuple(map(type, c)) for c in calls] == [(int, int)]


def test_example_runs_quick():
    for family in ("fake_quant", "batch_norm", "depthwise_conv", "fractional_pool"):
        need(family)  # (the example's)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "torch_qat_mobilenet.py"),
                        "--quick"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "loss" in r.stdout


# --------------------------------------------------------------------------------------
# Live: TF's GradientTape on the same inputs gives the same bits
# --------------------------------------------------------------------------------------
def _tf_grads(fn, inputs: list[np.ndarray], g: np.ndarray) -> list[np.ndarray]:
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
def test_live_fake_quant_per_channel():
    need("fake_quant")
    x = rand(5, 4, 3, scale=3.0)
    lo = torch.tensor([-1.0, -2.5, 0.3], requires_grad=True)
    hi = torch.tensor([1.0, 0.5, 2.0], requires_grad=True)
    y = tt.fake_quant_with_min_max_vars_per_channel(x, lo, hi, num_bits=5, narrow_range=True)
    g = rand(5, 4, 3, seed=1, grad=False)
    mine = grads(y, [x, lo, hi], g)
    theirs = _tf_grads(lambda tf, a, b, c: tf.raw_ops.FakeQuantWithMinMaxVarsPerChannel(
        inputs=a, min=b, max=c, num_bits=5, narrow_range=True), [npy(x), npy(lo), npy(hi)],
        npy(g))
    for a, e in zip(mine, theirs):
        same(a, e)


@pytest.mark.live
@pytest.mark.parametrize("fmt,training", [("NHWC", True), ("NCHW", True), ("NCHW", False)])
def test_live_batch_norm(fmt, training):
    need("batch_norm")
    x, scale, offset, mean, var = _bn_inputs(fmt, c=3)
    y = tt.fused_batch_norm_v3(x, scale, offset, mean, var, epsilon=0.001, data_format=fmt,
                               is_training=training).y
    g = rand(*x.shape, seed=6, grad=False)
    mine = grads(y, [x, scale, offset], g)
    theirs = _tf_grads(lambda tf, a, b, c, d, e: tf.raw_ops.FusedBatchNormV3(
        x=a, scale=b, offset=c, mean=d, variance=e, epsilon=0.001, data_format=fmt,
        is_training=training)[0], [npy(t) for t in (x, scale, offset, mean, var)], npy(g))
    for a, e in zip(mine, theirs[:3]):
        same(a, e)


@pytest.mark.live
@pytest.mark.parametrize("dtype", [f32, f64])
def test_live_depthwise(dtype):
    need("depthwise_conv")
    x, w, attrs = _dw(DW_CASES[2], dtype=dtype)
    y = tt.depthwise_conv2d_native(x, w, **attrs)
    g = rand(*y.shape, dtype=dtype, seed=4, grad=False)
    mine = grads(y, [x, w], g)
    theirs = _tf_grads(lambda tf, a, b: tf.raw_ops.DepthwiseConv2dNative(
        input=a, filter=b, **attrs), [npy(x), npy(w)], npy(g))
    for a, e in zip(mine, theirs):
        same(a, e)


@pytest.mark.live
@pytest.mark.parametrize("kind", ["Avg", "Max"])
def test_live_fractional_pool(kind):
    need("fractional_pool")
    attrs = dict(pooling_ratio=[1.0, 1.5, 1.4, 1.0], overlapping=True, deterministic=True,
                 seed=21, seed2=4)
    v = rand(2, 9, 10, 2)
    out = getattr(tt, f"fractional_{kind.lower()}_pool")(v, **attrs)
    g = rand(*out.output.shape, seed=5, grad=False)
    (mine,) = grads(out.output, [v], g)
    (theirs,) = _tf_grads(lambda tf, a: getattr(tf.raw_ops, f"Fractional{kind}Pool")(
        value=a, **attrs)[0], [npy(v)], npy(g))
    same(mine, theirs)


@pytest.mark.live
def test_live_depthwise_double_backward():
    """TF differentiates the backprops with each other and the forward op, as we do."""
    need("depthwise_conv")
    x, w, attrs = _dw(DW_CASES[1], dtype=f32)
    y = tt.depthwise_conv2d_native(x, w, **attrs)
    g = rand(*y.shape, seed=3, grad=False)
    u, v = rand(*x.shape, seed=4, grad=False), rand(*w.shape, seed=5, grad=False)
    dx, dw = torch.autograd.grad(y, [x, w], g, create_graph=True)
    mine = torch.autograd.grad((dx * u).sum() + (dw * v).sum(), [x, w])
    tf = oracle.tensorflow()
    with tf.device("/CPU:0"):
        tx, tw = tf.constant(npy(x)), tf.constant(npy(w))
        with tf.GradientTape() as outer:
            outer.watch([tx, tw])
            with tf.GradientTape() as inner:
                inner.watch([tx, tw])
                ty = tf.raw_ops.DepthwiseConv2dNative(input=tx, filter=tw, **attrs)
            gx, gw = inner.gradient(ty, [tx, tw], output_gradients=tf.constant(npy(g)))
            total = tf.reduce_sum(gx * npy(u)) + tf.reduce_sum(gw * npy(v))
        theirs = outer.gradient(total, [tx, tw])
    for a, e in zip(mine, theirs):
        same(a, e.numpy())
