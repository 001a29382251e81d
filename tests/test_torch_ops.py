"""tfgrad's ops as PyTorch operators (torch.ops.tfgrad.*): opcheck, errors through both
implementations, torch.compile, torch.export, torch.func.

Samples come from the op-case table (tests/cases). opcheck compares eager outputs with
traced ones using torch.testing.assert_close, where NaN != NaN: samples whose outputs hold
NaN are replaced by their NaN-free inputs' results (NaN and inf inputs set to finite
values), which exercises the same mechanics.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tfgrad[torch])")

import tfgrad  # noqa: E402
import tfgrad.torch as tt  # noqa: E402
from tests.cases import CASES, ERROR_CASES  # noqa: E402
from tfgrad import _gradients, _validate  # noqa: E402
from tfgrad.torch import _ops  # noqa: E402


def as_torch(v):
    if isinstance(v, np.ndarray):
        if v.dtype == _validate.DTYPES["bfloat16"]:
            return torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(v.copy())
    return v


def operator_args(case_op: str, kwargs: dict, finite: bool = False,
                  fixed_seeds: bool = False) -> dict:
    """raw_ops keyword arguments -> the operator's (tensors, int lists for shape inputs)."""
    op = tfgrad.get_op_def(case_op)
    args = {}
    for i in op.inputs:
        v = kwargs[i.name]
        if i.is_shape:
            if np.ndim(v) != 1:
                raise ValueError("a shape input is a list of ints for the operator")
            args[i.name] = [int(x) for x in np.asarray(v)]
            continue
        a = np.asarray(v)
        if a.dtype.kind == "f" and finite:
            a = np.where(np.isfinite(a.astype(np.float64)), a, 0.5).astype(a.dtype)
        args[i.name] = as_torch(np.array(a, order="C"))  # (ascontiguousarray makes 0-d 1-d)
    args.update({a.name: kwargs[a.name] for a in op.attrs if a.name in kwargs})
    if fixed_seeds and _ops.takes_seeds(op) and not args.get("deterministic"):
        args.update(deterministic=True, seed=7, seed2=11)  # (opcheck runs the op repeatedly)
    return args


@functools.cache
def _opcheck_samples() -> dict[str, list]:
    """Per op, up to two cases whose outputs are finite (first float32, then others)."""
    out: dict[str, list] = {}
    for case in CASES:
        if len(out.get(case.op, [])) >= 2:
            continue
        args = operator_args(case.op, case.kwargs(), finite=True, fixed_seeds=True)
        try:
            res = _ops.OPERATORS[case.op](**args)
        except (tfgrad.InvalidArgumentError, TypeError):
            continue
        res = res if isinstance(res, tuple) else (res,)
        if all(torch.isfinite(r).all() for r in res if r.is_floating_point()):
            out.setdefault(case.op, []).append((case.id, args))
    return out


@pytest.mark.parametrize("op_name", sorted(tfgrad._opdefs.OPS))
def test_opcheck(op_name):
    samples = _opcheck_samples().get(op_name)
    assert samples, f"no finite sample for {op_name} in tests/cases"
    # (TF differentiates only these; FractionalAvgPoolGrad's derivative runs the portable
    # pooling, which reads its sequences on the host: it cannot be traced, see
    # test_compile_second_derivative_of_avg_pool_says_why)
    diff = set(_gradients.differentiable_inputs(op_name) if op_name != "FractionalAvgPoolGrad"
               else ())
    for _, args in samples:
        args = {k: (v.clone().requires_grad_(k in diff and v.is_floating_point())
                    if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
        torch.library.opcheck(_ops.OPERATORS[op_name], (), args)


def test_operator_cpu_kernel_on_the_cached_signature(monkeypatch):
    """The operators' CPU kernel runs raw_ops on the eager calls' cached signature (what
    compiled graphs call, ~30 us less a call): the same bits as its checked path, fresh
    C-contiguous outputs (as the fake implementations say), also from a kernel that keeps
    a strided input's layout."""
    hits = []
    fast = dict(_ops.OPERATOR_CPU)

    def counting(name):
        def call(a):
            out = fast[name](a)
            hits.append(out is not tt._eager.FALLBACK)
            return out
        return call

    x = torch.randn(2, 3, 4, 5)  # (a channel-first view: the kernel keeps its layout)
    samples = {name: [a for _, a in v] for name, v in _opcheck_samples().items()}
    samples["FakeQuantWithMinMaxVarsPerChannel"].append(
        {"inputs": x.movedim(1, -1), "min": -torch.ones(3), "max": torch.ones(3)})
    for name, cases in samples.items():
        for args in cases:
            with torch.no_grad():
                monkeypatch.setitem(_ops.OPERATOR_CPU, name, counting(name))
                got = _ops.OPERATORS[name](**args)
                assert hits.pop() is True, name
                monkeypatch.setitem(_ops.OPERATOR_CPU, name, lambda a: tt._eager.FALLBACK)
                want = _ops.OPERATORS[name](**args)
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            inputs = {v.untyped_storage().data_ptr() for v in args.values()
                      if isinstance(v, torch.Tensor) and v.numel()}
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape, name
                assert torch.equal(g.view(torch.int16) if g.dtype == torch.bfloat16 else g,
                                   w.view(torch.int16) if w.dtype == torch.bfloat16 else w)
                assert g.is_contiguous(), name
                if g.numel():
                    assert g.untyped_storage().data_ptr() not in inputs, name
    monkeypatch.undo()
    with pytest.raises(tfgrad.InvalidArgumentError, match="min"):  # (the checked path's)
        _ops.OPERATORS["FakeQuantWithMinMaxVarsPerChannel"](x, -torch.ones(4), torch.ones(4))


def test_every_op_is_registered_under_its_snake_name():
    for name, op in tfgrad._opdefs.OPS.items():
        assert getattr(torch.ops.tfgrad, op.snake_name).default is _ops.OPERATORS[name]
        assert callable(getattr(tt, op.snake_name))


def _raises(fn):
    try:
        fn()
    except (tfgrad.InvalidArgumentError, TypeError) as e:
        return e
    return None


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.id)
def test_errors_through_both_implementations(case):
    # Bad input is rejected before any computing, by the exact and the portable path alike
    # (the portable one is what runs off the CPU): same class, same message.
    kwargs = case.kwargs()
    try:
        args = operator_args(case.op, kwargs)
    except (ValueError, TypeError, OverflowError):
        pytest.skip("the arguments have no torch form (the operator's parser refuses them)")
    fn = getattr(tt, tfgrad.get_op_def(case.op).snake_name)
    exact = _raises(lambda: fn(**args))
    assert exact is not None, "the exact path accepted a bad input"
    try:
        with tt.use_impl("portable"):
            portable = _raises(lambda: fn(**args))
    except ModuleNotFoundError as e:
        pytest.skip(f"no portable implementation yet: {e}")
    assert portable is not None, "the portable path accepted a bad input"
    assert type(portable) is type(exact) and str(portable) == str(exact)


def test_use_impl_function_and_context_manager():
    assert _ops.current_impl() == "auto"
    with tt.use_impl("portable"):
        assert _ops.current_impl() == "portable"
        with tt.use_impl("exact"):
            assert _ops.current_impl() == "exact"
        assert _ops.current_impl() == "portable"
    assert _ops.current_impl() == "auto"
    try:
        tt.use_impl("exact")
        assert _ops.current_impl() == "exact"
    finally:
        tt.use_impl("auto")
    with pytest.raises(ValueError, match="one of 'auto', 'exact', 'portable'"):
        tt.use_impl("fast")


def test_exact_refuses_other_devices():
    x = torch.zeros(2, 3, device="meta")
    with tt.use_impl("exact"):
        # (meta tensors run the fake implementation, which only computes shapes)
        assert tt.fake_quant_with_min_max_args(x).shape == (2, 3)


# --------------------------------------------------------------------------------------
# torch.compile, torch.export, torch.func
# --------------------------------------------------------------------------------------
def _tfgrad_only(x, w, scale, offset, lo, hi):
    """A chain of tfgrad ops only (no torch op that Inductor could fuse differently)."""
    y = tt.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")
    z = tt.fused_batch_norm_v3(y, scale, offset, torch.zeros(0), torch.zeros(0)).y
    q = tt.fake_quant_with_min_max_vars_per_channel(z, lo, hi)
    p = tt.fractional_avg_pool(q, [1.0, 1.5, 1.5, 1.0], deterministic=True, seed=3, seed2=4)
    return tt.fake_quant_with_min_max_args(p.output)


def _chain_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 9, 4, generator=g, requires_grad=True)
    w = torch.randn(3, 3, 4, 2, generator=g, requires_grad=True)
    scale = (torch.rand(8, generator=g) + 0.5).requires_grad_()
    offset = torch.randn(8, generator=g).requires_grad_()
    lo = torch.full((8,), -2.0, requires_grad=True)
    hi = torch.full((8,), 2.5, requires_grad=True)
    return [x, w, scale, offset, lo, hi]


def _value_and_grads(fn, inputs):
    out = fn(*inputs)
    g = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    grads = torch.autograd.grad(out, inputs, g)
    return [out.detach(), *grads]


@pytest.mark.slow
def test_compile_fullgraph_gives_eager_bits():
    inputs = _chain_inputs()
    eager = _value_and_grads(_tfgrad_only, inputs)
    compiled = _value_and_grads(torch.compile(_tfgrad_only, fullgraph=True), inputs)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_compile_per_channel_layer_gives_eager_bits(memory_format):
    # Compiled, the NCHW layer runs the op on a 3-D [N, H*W, C] view (Inductor lays out
    # 4-D tensors near convolutions as if dim 1 held channels): the same rows, the same bits
    def make():
        torch.manual_seed(0)
        fq = tt.FakeQuantPerChannel(5, init_min=-1.5, init_max=2.0)
        return torch.nn.Sequential(torch.nn.ReLU6(), fq)

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 5, 6, 7, generator=g) * 3).to(memory_format=memory_format)
    out_g = torch.randn(3, 5, 6, 7, generator=g)
    results = []
    for model in (make(), torch.compile(make(), fullgraph=True)):
        xi = x.clone(memory_format=torch.preserve_format).requires_grad_()
        y = model(xi)
        params = list(model.parameters())
        grads = torch.autograd.grad(y, [xi, *params], out_g)
        results.append([y.detach(), *grads])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_compile_example_model_without_graph_breaks():
    import sys

    sys.path.insert(0, str(tfgrad.__file__).rsplit("/src/", 1)[0] + "/examples")
    import torch_qat_mobilenet as ex

    torch.manual_seed(0)
    model = ex.TinyMobileNet()
    for m in model.modules():  # fixed pooling regions, so eager and compiled see the same
        if isinstance(m, tt.FractionalMaxPool2d):
            m.seed = (5, 6)
    x, y = ex.stripes(8, 16, torch.Generator().manual_seed(1))
    eager_model = ex.TinyMobileNet()
    eager_model.load_state_dict(model.state_dict())
    for m in eager_model.modules():
        if isinstance(m, tt.FractionalMaxPool2d):
            m.seed = (5, 6)
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(2):  # (the second step runs with updated running statistics)
        le = torch.nn.functional.cross_entropy(eager_model(x), y)
        lc = torch.nn.functional.cross_entropy(compiled(x), y)
        ge = torch.autograd.grad(le, list(eager_model.parameters()))
        gc = torch.autograd.grad(lc, list(model.parameters()))
        torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-6)
        for a, b in zip(gc, ge):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def _five_layer_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        tt.DepthwiseConv2d(4, 3, channel_multiplier=2, stride=1),
        tt.FusedBatchNorm2d(8),
        tt.FakeQuantPerChannel(8),
        tt.FractionalAvgPool2d(1.5, seed=(1, 2)),
        tt.FractionalMaxPool2d(1.3, seed=(3, 4)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True])
def test_export_runs_and_gives_eager_outputs(training):
    model = _five_layer_model().train(training)
    x = torch.randn(2, 4, 12, 12)
    ep = torch.export.export(model, (x,))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("tfgrad.") for t in targets), targets
    eager = _five_layer_model().train(training)
    assert torch.equal(ep.module()(x), eager(x))


def test_torch_func_vmap_and_a_clear_error_for_func_grad():
    # vmap: one call per batch element, the same bits as the unbatched calls
    xs = torch.randn(3, 2, 5, 5, 2)
    w = torch.randn(3, 3, 2, 1)
    got = torch.vmap(lambda t: tt.depthwise_conv2d_native(t, w, [1, 1, 1, 1], "SAME"))(xs)
    for i in range(3):
        assert torch.equal(got[i], tt.depthwise_conv2d_native(xs[i], w, [1, 1, 1, 1], "SAME"))
    lo, hi = torch.full((4,), -1.0), torch.full((4,), 1.0)
    ys = torch.randn(3, 6, 4)
    got = torch.vmap(tt.fake_quant_with_min_max_vars_per_channel, in_dims=(0, None, None))(
        ys, lo, hi)
    assert torch.equal(got[1], tt.fake_quant_with_min_max_vars_per_channel(ys[1], lo, hi))
    # torch.func's autodiff cannot differentiate custom operators in torch 2.13: a clear error
    with pytest.raises(RuntimeError, match="torch.func.grad .* use torch.autograd.grad"):
        torch.func.grad(lambda t: tt.fake_quant_with_min_max_args(t).sum())(torch.randn(3))


@pytest.mark.slow
def test_ddp_example_gradients_equal_one_process():
    # Two gloo processes on the CPU, each on half the batch: DDP's averaged gradients are
    # those of the two halves computed in one process (an exact average: 2 processes).
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(root / "examples" / "torch_ddp_qat.py"), "--quick",
                        "--check"], capture_output=True, text=True, timeout=600, cwd=root)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "DDP gradients vs one process: identical" in r.stdout


def test_compile_second_derivative_of_avg_pool_says_why():
    # AOTAutograd traces the backward of FractionalAvgPoolGrad (the second derivative of
    # fractional average pooling) through its portable implementation, which reads the
    # pooling sequences on the host: a clear error, not a wrong graph. Eagerly it works.
    (_, args), *_ = _opcheck_samples()["FractionalAvgPoolGrad"]
    args = dict(args, out_backprop=args["out_backprop"].clone().requires_grad_())
    out = _ops.OPERATORS["FractionalAvgPoolGrad"](**args)
    (gg,) = torch.autograd.grad(out.square().sum(), [args["out_backprop"]])
    assert gg.shape == args["out_backprop"].shape
    with pytest.raises(Exception, match="cannot be traced"):
        torch.library.opcheck(_ops.OPERATORS["FractionalAvgPoolGrad"], (), args,
                              test_utils=("test_aot_dispatch_dynamic",))
