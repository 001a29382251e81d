"""tfgrad.torch under dynamic shapes: the batch stays symbolic.

The fake (meta) implementations keep every output size TF takes straight from an input
size symbolic (the batch; depthwise convolution's channels, in_depth * multiplier;
fractional pooling's batch and channels), so ``torch.compile`` settles on one dynamic graph
after the first recompile, as torch's own convolution and batch norm do, and
``torch.export`` takes a ``Dim`` for the batch. Spatial sizes that TF derives from the
image size and the attrs (strides, padding, the pooling ratio) specialise the graph.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tfgrad[torch])")

import tfgrad.torch as tt  # noqa: E402

BATCHES = range(1, 11)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        tt.DepthwiseConv2d(3, 3, channel_multiplier=2, stride=2),
        tt.FusedBatchNorm2d(6),
        tt.FakeQuantPerChannel(6, init_min=-2.0, init_max=2.0),
        tt.FractionalMaxPool2d(1.5, seed=(3, 4)),
        tt.FractionalAvgPool2d((1.4, 1.2), seed=(1, 2)),
    )


def _value_and_grads(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    y = model(x)
    g = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
    return [y.detach(), *torch.autograd.grad(y, [x, *model.parameters()], g)]


def test_compile_ten_batch_sizes_two_graphs_eager_bits():
    # Before: each batch size recompiled ("size mismatch at index 0") and the 9th failed
    # (recompile_limit). Now: the static first graph, then one dynamic graph for the rest.
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model, eager = _net(), _net()
    counter = CompileCounterWithBackend("aot_eager")  # (AOTAutograd traces the backward too)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for n in BATCHES:
        x = torch.randn(n, 3, 12, 13)
        for a, b in zip(_value_and_grads(compiled, x), _value_and_grads(eager, x)):
            assert torch.equal(a, b), n
    assert counter.frame_count <= 2, counter.frame_count
    assert torch.equal(model[1].running_mean, eager[1].running_mean)


def test_functions_with_seed_tensors_compile_once_for_all_batches():
    # NHWC functions, fresh pooling regions each call (seed tensors): one dynamic graph.
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    w = torch.randn(3, 3, 4, 1)

    def f(x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        y = tt.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")
        return tt.fractional_max_pool(y, [1.0, 1.5, 1.5, 1.0], seed=seeds[0],
                                      seed2=seeds[1]).output

    counter = CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, backend=counter, fullgraph=True)
    for n in range(2, 8):
        x = torch.randn(n, 9, 9, 4)
        torch._dynamo.mark_dynamic(x, 0)  # (gave ConstraintViolationError before)
        seeds = torch.tensor([n, 7])
        assert torch.equal(cf(x, seeds), f(x, seeds))
    assert counter.frame_count == 1


@pytest.mark.parametrize("training", [False, True])
def test_export_with_a_batch_dim_runs_every_batch_size(training):
    model = _net().train(training)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(model, (torch.randn(4, 3, 12, 13),),
                             dynamic_shapes={"input": {0: batch}})
    (out,) = [n for n in ep.graph.nodes if n.op == "output"][0].args[0]
    assert isinstance(out.meta["val"].shape[0], torch.SymInt)  # symbolic, not 4
    eager = _net().train(training)
    run = ep.module()
    for n in BATCHES:
        x = torch.randn(n, 3, 12, 13)
        assert torch.equal(run(x), eager(x)), n
    if training:  # (the running statistics are updated by the exported program too)
        state = run.state_dict()
        assert torch.equal(state["1.running_mean"], eager[1].running_mean)
        assert torch.equal(state["1.running_var"], eager[1].running_var)


def test_spatial_sizes_specialise_the_graph():
    # What stays concrete: a new image size compiles a new graph (the fake implementation
    # guards on it), and the outputs are right for it.
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = copy.deepcopy(_net()).eval()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for h in (12, 14, 16):
        x = torch.randn(2, 3, h, 12)
        assert torch.equal(compiled(x), model(x))
    assert counter.frame_count == 3
