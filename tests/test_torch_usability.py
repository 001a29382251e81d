"""tfgrad.torch as a new user meets it: arguments refused with clear errors (at a layer's
construction where possible), seeds, per-channel and per-tensor fake-quant layers, state
dicts, memory formats, signatures, and errors raised under torch.compile."""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tfgrad[torch])")

import tfgrad  # noqa: E402
import tfgrad.torch as tt  # noqa: E402
from tests import oracle  # noqa: E402

RATIO = [1.0, 1.5, 1.5, 1.0]


# --------------------------------------------------------------------------------------
# Seeds and argument errors
# --------------------------------------------------------------------------------------
def _rows(seed, seed2=None):
    x = torch.randn(1, 9, 9, 1)
    seed2 = torch.tensor(3) if seed2 is None else seed2
    return tt.fractional_avg_pool(x, RATIO, True, False, seed=seed,
                                  seed2=seed2).row_pooling_sequence


@pytest.mark.parametrize("seed", [torch.tensor(1.9), torch.tensor(1.0, dtype=torch.float64),
                                  torch.tensor(True), torch.tensor([1, 2])],
                         ids=["float32", "float64", "bool", "two-values"])
def test_seed_tensor_must_be_one_integer(seed):
    # (a float seed was truncated: seed=tensor(1.9) acted as seed 1; JAX refuses it too)
    with pytest.raises(TypeError, match="'seed' must be an int or an integer tensor"):
        _rows(seed)
    with pytest.raises(TypeError, match="'seed2' must be an int or an integer tensor"):
        _rows(torch.tensor(1), seed2=seed)


def test_integer_seed_tensors_equal_int_seeds():
    x = torch.randn(1, 9, 9, 1)
    ints = tt.fractional_avg_pool(x, RATIO, True, False, True, 5, 3).row_pooling_sequence
    for dtype in (torch.int32, torch.int64, torch.uint8):
        assert torch.equal(_rows(torch.tensor(5, dtype=dtype)), ints)


@pytest.mark.parametrize("name,args,kwargs,words", [
    ("fractional_avg_pool", ("x", RATIO), {"seed": 2**64},
     "attr 'seed' = 18446744073709551616 does not fit in int64"),
    ("depthwise_conv2d_native", ("x", "w", [1, 1, 1, 1], "EXPLICIT",
                                 [0, 0, 2**63, 0, 0, 0, 0, 0]), {},
     "attr 'explicit_paddings' = 9223372036854775808 does not fit in int64"),
], ids=["seed", "explicit_paddings"])
def test_out_of_range_attrs_are_tfgrads_errors(name, args, kwargs, words):
    # torch's parser said "Expected a value of type 'int' ... but instead found type 'int'"
    tensors = {"x": torch.randn(1, 4, 4, 1), "w": torch.randn(2, 2, 1, 1)}
    with pytest.raises(tfgrad.InvalidArgumentError, match=words) as got:
        getattr(tt, name)(*[tensors.get(a, a) if isinstance(a, str) else a for a in args],
                          **kwargs)
    assert "instead found" not in str(got.value)
    with pytest.raises(tfgrad.InvalidArgumentError) as numpy_api:  # (the same class, words)
        getattr(tfgrad, name)(*[tensors[a].numpy() if isinstance(a, str) and a in tensors
                                else a for a in args], **kwargs)
    assert str(got.value) == str(numpy_api.value)


def test_wrong_attr_type_is_tfgrads_type_error():
    x = torch.randn(1, 4, 4, 1)
    with pytest.raises(TypeError) as got:
        tt.fractional_avg_pool(x, RATIO, seed=1.5)
    with pytest.raises(TypeError) as numpy_api:
        tfgrad.fractional_avg_pool(x.numpy(), RATIO, seed=1.5)
    assert str(got.value) == str(numpy_api.value)
    assert "attr 'seed' must be an int, got float" in str(got.value)


# --------------------------------------------------------------------------------------
# Layers check their arguments when constructed
# --------------------------------------------------------------------------------------
def test_fractional_pool_layer_checks_at_construction():
    with pytest.raises(ValueError, match="one number or a \\(row, col\\) pair"):
        tt.FractionalAvgPool2d((1.5, 1.5, 1.5))
    with pytest.raises(tfgrad.InvalidArgumentError, match="cannot be smaller than 1"):
        tt.FractionalMaxPool2d(0.5)
    with pytest.raises(TypeError, match="seed must be None, an int or a pair of ints"):
        tt.FractionalMaxPool2d(1.5, seed=1.5)
    tt.FractionalAvgPool2d((1.5, 2.0), seed=(1, 2))  # (fine)


def test_depthwise_layer_checks_at_construction():
    # TF's CPU kernel refuses different row and column strides (tested live below)
    with pytest.raises(tfgrad.InvalidArgumentError,
                       match="only supports equal length strides in the row and column"):
        tt.DepthwiseConv2d(3, 3, stride=(1, 2))
    with pytest.raises(tfgrad.InvalidArgumentError, match="only supports equal length"):
        tt.DepthwiseConv2d(3, 3, stride=(2, 1), data_format="NHWC")
    with pytest.raises(ValueError, match="padding must be"):
        tt.DepthwiseConv2d(3, 3, padding=(1, 2, 3))
    with pytest.raises(tfgrad.InvalidArgumentError, match="Dilated rates"):
        tt.DepthwiseConv2d(3, 3, dilation=0)
    m = tt.DepthwiseConv2d(3, (3, 2), stride=2, padding="VALID", dilation=(1, 2))
    assert m(torch.randn(1, 3, 8, 8)).shape == (1, 3, 3, 3)


@pytest.mark.live
def test_live_tf_refuses_unequal_depthwise_strides():
    tf = oracle.tensorflow()
    if tf is None:
        pytest.skip("TensorFlow is not installed")
    x, w = np.ones((1, 8, 8, 3), np.float32), np.ones((3, 3, 3, 1), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="equal length strides"):
        tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1, 2, 1],
                                         padding="SAME")


def test_fake_quant_layers_check_at_construction():
    with pytest.raises(tfgrad.InvalidArgumentError, match="num_bits"):
        tt.FakeQuantPerChannel(4, num_bits=1)
    with pytest.raises(tfgrad.InvalidArgumentError, match="num_bits"):
        tt.FakeQuantPerTensor(num_bits=17)
    with pytest.raises(tfgrad.InvalidArgumentError):
        tt.FakeQuantFixedRange(1.0, -1.0)  # (TF: min must be below max)


# --------------------------------------------------------------------------------------
# Fake-quant layers
# --------------------------------------------------------------------------------------
def test_fake_quant_per_channel_of_a_linear_weight():
    # axis=0: per output channel of a Linear weight [out, in] (TF's op quantizes the last
    # dim: the layer transposes around it, bit for bit, gradients included)
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 4)
    fq = tt.FakeQuantPerChannel(4, axis=0, init_min=-0.3, init_max=0.25)
    w = lin.weight
    y = fq(w)
    lo, hi = fq.min.detach().requires_grad_(), fq.max.detach().requires_grad_()
    ref = tt.fake_quant_with_min_max_vars_per_channel(w.t(), lo, hi).t()
    assert torch.equal(y, ref) and y.is_contiguous()
    g = torch.randn(4, 6)
    got = torch.autograd.grad(y, [w, fq.min, fq.max], g)
    exp = torch.autograd.grad(ref, [w, lo, hi], g)
    for a, b in zip(got, exp):
        assert torch.equal(a, b)
    with pytest.raises(IndexError, match="axis 2 is out of range"):
        tt.FakeQuantPerChannel(4, axis=2)(w)
    # axis=-1 and data_format="NHWC" agree
    x = torch.randn(2, 3, 4)
    a, b = tt.FakeQuantPerChannel(4, axis=-1), tt.FakeQuantPerChannel(4, data_format="NHWC")
    assert torch.equal(a(x), b(x))


def test_per_tensor_fake_quant_layers():
    x = torch.randn(3, 5) * 3
    fq = tt.FakeQuantPerTensor(num_bits=4, narrow_range=True, init_min=-2.0, init_max=1.5)
    assert fq.min.shape == () and fq.min.requires_grad
    y = fq(x)
    lo, hi = fq.min.detach().requires_grad_(), fq.max.detach().requires_grad_()
    ref = tt.fake_quant_with_min_max_vars(x, lo, hi, num_bits=4, narrow_range=True)
    assert torch.equal(y, ref)
    g = torch.randn(3, 5)
    for a, b in zip(torch.autograd.grad(y, [fq.min, fq.max], g),
                    torch.autograd.grad(ref, [lo, hi], g)):
        assert torch.equal(a, b)
    fixed = tt.FakeQuantFixedRange(-1.0, 2.0, num_bits=5)
    assert list(fixed.parameters()) == []
    assert torch.equal(fixed(x), tt.fake_quant_with_min_max_args(x, -1.0, 2.0, 5))


# --------------------------------------------------------------------------------------
# State dicts, memory formats, signatures
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_loads_an_nn_batch_norm_state_dict(affine):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(4, affine=affine)
    bn.train()(torch.randn(8, 4, 3, 3) * 2 + 1)  # (running statistics and the counter move)
    assert bn.num_batches_tracked.item() == 1
    ours = tt.FusedBatchNorm2d(4, affine=affine)
    ours.load_state_dict(bn.state_dict())  # strict: num_batches_tracked accepted
    assert torch.equal(ours.running_mean, bn.running_mean)
    assert torch.equal(ours.running_var, bn.running_var)
    assert set(ours.state_dict()) <= set(bn.state_dict())
    if affine:
        assert torch.equal(ours.weight, bn.weight)


CL = torch.channels_last


@pytest.mark.parametrize("make", [
    lambda: tt.DepthwiseConv2d(4, 3, channel_multiplier=2, stride=2, padding=(1, 0, 2, 1)),
    lambda: tt.FusedBatchNorm2d(4),
    lambda: tt.FusedBatchNorm2d(4).eval(),
    lambda: tt.FractionalMaxPool2d(1.5, seed=(1, 2)),
    lambda: tt.FractionalAvgPool2d(1.4, seed=(1, 2)),
    lambda: tt.FakeQuantPerChannel(4, init_min=-1.0, init_max=1.0),
], ids=["depthwise", "batch_norm", "batch_norm_eval", "max_pool", "avg_pool", "fake_quant"])
def test_channels_last_in_channels_last_out(make):
    # as torch's own layers; the NHWC op on the NHWC view gives the same bits
    torch.manual_seed(0)
    m1 = make()
    m2 = copy.deepcopy(m1)
    x = torch.randn(3, 4, 9, 10)
    x1, x2 = x.clone().requires_grad_(), x.to(memory_format=CL).requires_grad_()
    y1, y2 = m1(x1), m2(x2)
    assert y1.is_contiguous()
    assert y2.is_contiguous(memory_format=CL) and not y2.is_contiguous()
    assert torch.equal(y1, y2)
    g = torch.randn_like(y1)
    for a, b in zip(torch.autograd.grad(y1, [x1, *m1.parameters()], g),
                    torch.autograd.grad(y2, [x2, *m2.parameters()], g)):
        assert torch.equal(a, b)


def test_signatures_say_tensors_not_numpy():
    for name, fn in tt.FUNCTIONS.items():
        sig = inspect.signature(fn)
        assert "numpy" not in str(sig), (name, sig)
        op = tfgrad.get_op_def(name)
        assert sig.return_annotation == ("torch.Tensor" if len(op.outputs) == 1
                                         else f"tfgrad.raw_ops.{op.name}.Output")
        for i in op.inputs:
            assert "torch.Tensor" in sig.parameters[i.name].annotation, (name, i.name)


# --------------------------------------------------------------------------------------
# Errors under torch.compile
# --------------------------------------------------------------------------------------
def tfgrad_error(e: BaseException | None) -> BaseException | None:
    """The tfgrad error behind torch.compile's wrapping (docs/adapters.md)."""
    while e is not None and not isinstance(e, tfgrad.InvalidArgumentError):
        e = e.__cause__ or e.__context__
    return e


@pytest.mark.parametrize("fullgraph", [True, False])
def test_error_under_compile_is_torchs_runtime_error(fullgraph):
    # Pinned: torch.compile runs the fake implementation, and Dynamo wraps whatever it raises
    # in its TorchRuntimeError (a RuntimeError), with or without fullgraph; the tfgrad error
    # is in the chain and its words in the message. Eagerly it is tfgrad's own class.
    def f(a):
        return tt.fake_quant_with_min_max_args(a, num_bits=17)

    torch._dynamo.reset()
    x = torch.randn(4)
    with pytest.raises(tfgrad.InvalidArgumentError, match="num_bits") as eager:
        f(x)
    with pytest.raises(RuntimeError) as got:
        torch.compile(f, fullgraph=fullgraph)(x)
    assert type(got.value).__name__ == "TorchRuntimeError"
    assert not isinstance(got.value, tfgrad.InvalidArgumentError)
    assert str(eager.value) in str(got.value)
    cause = tfgrad_error(got.value)
    assert isinstance(cause, tfgrad.InvalidArgumentError) and str(cause) == str(eager.value)
