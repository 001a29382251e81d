"""tfgrad.torch under mixed precision: autocast rules and half-precision layers.

Every operator has an autocast rule derived from the op table (``_ops.autocast_rules``):
inputs an op takes only in float32 (fake quantization, pooling, batch norm's statistics)
are cast to float32, as torch's float32 ops are; depthwise convolution runs in autocast's
dtype, as torch's conv2d; batch norm takes a half x with float32 statistics (TF's
FusedBatchNormV2/V3). Layers keep the parameters TF holds in float32 under ``.half()`` /
``.bfloat16()``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tfgrad[torch])")

import tfgrad  # noqa: E402
import tfgrad.torch as tt  # noqa: E402
from tfgrad.torch import _ops  # noqa: E402

bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32


def _autocast():
    return torch.autocast("cpu", dtype=bf16)


def test_every_operator_has_a_rule_for_every_float_input():
    for name, op in tfgrad._opdefs.OPS.items():
        rules = _ops.autocast_rules(op)
        floats = {i.name for i in op.inputs if not i.is_shape
                  and "float32" in _ops._ALLOWED[name, i.name]}
        assert set(rules) == floats, name
        for i, rule in rules.items():
            takes_half = "bfloat16" in _ops._ALLOWED[name, i]
            assert (rule == "float32") == (not takes_half), (name, i)
    assert set(_ops.autocast_rules(tfgrad.get_op_def("FusedBatchNormV3")).values()) == {
        "promote", "float32"}
    assert set(_ops.autocast_rules(tfgrad.get_op_def("DepthwiseConv2dNative")).values()) == {
        "lower"}


def test_float32_ops_take_float32_under_autocast():
    x = torch.randn(4, 6).to(bf16)
    lo, hi = torch.full((6,), -1.0).to(bf16), torch.full((6,), 1.5).to(bf16)
    with _autocast():
        y = tt.fake_quant_with_min_max_vars_per_channel(x, lo, hi)
        z = tt.fake_quant_with_min_max_args(x)
        p = tt.fractional_max_pool(x.reshape(1, 4, 6, 1), [1.0, 1.5, 1.5, 1.0],
                                   deterministic=True, seed=1, seed2=2)
    assert y.dtype == z.dtype == p.output.dtype == f32  # (as torch's float32 ops)
    assert torch.equal(y, tt.fake_quant_with_min_max_vars_per_channel(x.float(), lo.float(),
                                                                      hi.float()))
    assert torch.equal(z, tt.fake_quant_with_min_max_args(x.float()))
    ref = tt.fractional_max_pool(x.float().reshape(1, 4, 6, 1), [1.0, 1.5, 1.5, 1.0],
                                 deterministic=True, seed=1, seed2=2)
    assert torch.equal(p.output, ref.output)
    # outside autocast nothing is cast (a dtype the op does not take is a TypeError)
    with pytest.raises(TypeError, match="bfloat16"):
        tt.fake_quant_with_min_max_args(x)


def test_depthwise_runs_in_autocast_dtype_like_conv2d():
    x, w = torch.randn(2, 6, 6, 3), torch.randn(3, 3, 3, 2)
    with _autocast():
        y = tt.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")
        ref_dtype = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), torch.randn(6, 1, 3, 3),
                                               groups=3).dtype
    assert y.dtype == ref_dtype == bf16
    assert torch.equal(y, tt.depthwise_conv2d_native(x.to(bf16), w.to(bf16), [1, 1, 1, 1],
                                                     "SAME"))


def test_batch_norm_takes_half_x_with_float32_statistics():
    x = torch.randn(2, 3, 3, 4).to(bf16)
    stats = [torch.rand(4).to(bf16) + 0.5 for _ in range(4)]
    with _autocast():
        out = tt.fused_batch_norm_v3(x, *stats, is_training=False)
    assert out.y.dtype == bf16 and out.batch_mean.dtype == f32
    ref = tt.fused_batch_norm_v3(x, *[s.float() for s in stats], is_training=False)
    assert torch.equal(out.y, ref.y)
    # the gradient op: x and y_backprop at the wider of their dtypes, scale in float32
    dy = torch.randn(2, 3, 3, 4)
    with _autocast():
        g = tt.fused_batch_norm_grad_v3(dy, x, stats[0], ref.reserve_space_1,
                                        ref.reserve_space_2, ref.reserve_space_3)
    ref_g = tt.fused_batch_norm_grad_v3(dy, x.float(), stats[0].float(), ref.reserve_space_1,
                                        ref.reserve_space_2, ref.reserve_space_3)
    assert g.x_backprop.dtype == f32 and torch.equal(g.x_backprop, ref_g.x_backprop)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 1),
        tt.DepthwiseConv2d(4, 3, channel_multiplier=2,
                           weight_fake_quant=tt.FakeQuantPerChannel(8, data_format="NHWC")),
        tt.FusedBatchNorm2d(8),
        tt.FakeQuantPerChannel(8),
        tt.FractionalMaxPool2d(1.5, seed=(1, 2)),
        tt.FakeQuantPerTensor(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 5 * 5, 2),
    )


def test_model_trains_under_cpu_bfloat16_autocast():
    model = _model()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, 8, 8, generator=g)
    y = (x.mean((1, 2, 3)) > 0).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(15):
        with _autocast():
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
        assert out.dtype == bf16
        opt.zero_grad()
        loss.backward()
        for name, p in model.named_parameters():
            assert p.dtype == f32 and p.grad.dtype == f32, name
            assert torch.isfinite(p.grad).all(), name
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    # the batch norm layer saw bfloat16 activations, and its statistics stayed float32
    assert model[2].running_mean.dtype == f32


@pytest.mark.parametrize("dtype", [f16, bf16])
def test_layers_keep_float32_parameters_under_half(dtype):
    net = torch.nn.Sequential(*list(_model())[1:6])
    half = copy.deepcopy(net).to(dtype)
    dtypes = {k: v.dtype for k, v in half.state_dict().items()}
    assert dtypes.pop("0.weight") == dtypes.pop("0.bias") == dtype  # (depthwise takes halves)
    assert set(dtypes.values()) == {f32}, dtypes  # batch norm, the fake quant ranges
    x = torch.randn(2, 4, 8, 8).to(dtype)
    y = half(x)
    assert y.dtype == dtype
    y.float().sum().backward()
    for name, p in half.named_parameters():
        assert p.grad.dtype == p.dtype, name
    # A half x through a float32-only op: computed in float32, returned in x's dtype.
    x8 = torch.randn(2, 8, 5, 5).to(dtype)
    fq = half[2]
    assert torch.equal(fq(x8), tt.fake_quant_with_min_max_vars_per_channel(
        x8.float().movedim(1, -1), fq.min, fq.max).movedim(-1, 1).to(dtype))
    bn = half[1]
    out = tt.fused_batch_norm_v3(x8, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                 epsilon=bn.epsilon, data_format="NCHW", is_training=False)
    assert torch.equal(bn.eval()(x8), out.y)


def test_half_layers_match_raw_ops_bits():
    # FusedBatchNorm2d(...).half() on a float16 x: TF's V3 op with float32 statistics
    bn = tt.FusedBatchNorm2d(3).half()
    x = torch.randn(2, 3, 4, 4).half()
    y = bn(x)
    exp = tfgrad.raw_ops.FusedBatchNormV3(
        x=x.numpy(), scale=np.ones(3, np.float32), offset=np.zeros(3, np.float32),
        mean=np.zeros(3, np.float32), variance=np.ones(3, np.float32), epsilon=1e-3,
        exponential_avg_factor=0.01, data_format="NCHW", is_training=True)
    assert np.array_equal(y.detach().numpy(), exp.y)
    assert np.array_equal(bn.running_mean.numpy(), exp.batch_mean)


def test_cpu_float16_autocast_with_backward_inside_the_block():
    # (backward inside the autocast block runs the gradient operators through the same
    # rules; every parameter's gradient comes back float32 and finite)
    model = _model()
    x = torch.randn(4, 3, 8, 8)
    with torch.autocast("cpu", dtype=f16):
        out = model(x)
        out.float().square().mean().backward()
    assert out.dtype == f16
    for name, p in model.named_parameters():
        assert p.grad.dtype == f32 and torch.isfinite(p.grad).all(), name
