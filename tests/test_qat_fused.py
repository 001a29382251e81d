"""tfgrad.torch.qat's fused path (tfgrad.qat._exec): a whole eager forward as one program of
TF's ops on NumPy arrays and one autograd node, bit-identical to the layer-by-layer path
(which tests/test_qat_exact_step.py holds to TF live): outputs, gradients (of the weights
and of the input), every variable and buffer after each step, inference; and the calls it
leaves to the layer-by-layer path."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("h5py")
pytest.importorskip("tf_keras")
pytest.importorskip("tensorflow_model_optimization")

import tfgrad.torch.qat as tq  # noqa: E402
from tfgrad.qat import _exec  # noqa: E402
from tfgrad.testing import qat as models  # noqa: E402
from tfgrad.torch import _qat_fused  # noqa: E402

FUSED = ("depthwise_chain", "mobilenet_v2_logits", "separable", "mlp", "mobilenet_v2")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = str(tmp_path_factory.mktemp("qat_fused"))
    return {name: models.tfmot_qat(name, folder)[1] for name in (*FUSED, "cnn")}


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view(np.uint8)


def _state(m: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def _steps(m: torch.nn.Module, xs: list, cs: list, input_grad: bool,
           run: object = None) -> list[dict]:
    """Training steps, then an inference call; ``run``: what to call instead of ``m``
    (a compiled ``m``)."""
    run = m if run is None else run
    m.train()
    lr = torch.tensor(0.05, dtype=torch.float32)
    out = []
    for x, c in zip(xs, cs):
        xt = torch.from_numpy(x.copy()).requires_grad_(input_grad)
        y = run(xt)
        (y * torch.from_numpy(c)).sum().backward()
        grads = {n: p.grad.numpy().copy() for n, p in m.named_parameters()}
        with torch.no_grad():
            for p in m.parameters():
                p.sub_(lr * p.grad)
                p.grad = None
        out.append({"y": y.detach().numpy(), "grads": grads, "state": _state(m),
                    "dx": xt.grad.numpy() if input_grad else None})
    m.eval()
    with torch.no_grad():
        out.append({"eval": run(torch.from_numpy(xs[0])).numpy()})
    return out


@pytest.mark.parametrize("name", FUSED)
def test_fused_is_layer_by_layer(saved: dict, name: str) -> None:
    k = models.load_tf(saved[name])
    xs, cs = models.batches(k, 3, 4)
    fused, layered = tq.load_keras(saved[name]), tq.load_keras(saved[name])
    layered.fused = False
    assert fused.fused and fused._program is not None
    calls = []
    real = fused._program.forward
    fused._program.forward = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    a = _steps(fused, xs, cs, input_grad=name == "depthwise_chain")
    b = _steps(layered, xs, cs, input_grad=name == "depthwise_chain")
    assert len(calls) == 4  # (three training steps and the inference call ran fused)
    _same_steps(a, b)


def _same_steps(a: list[dict], b: list[dict]) -> None:
    for step, (s, t) in enumerate(zip(a[:-1], b[:-1])):
        assert np.array_equal(_bits(s["y"]), _bits(t["y"])), step
        for n in t["grads"]:
            assert np.array_equal(_bits(s["grads"][n]), _bits(t["grads"][n])), (step, n)
        for n in t["state"]:
            assert np.array_equal(_bits(s["state"][n]), _bits(t["state"][n])), (step, n)
        if t["dx"] is not None:
            assert np.array_equal(_bits(s["dx"]), _bits(t["dx"])), step
    assert np.array_equal(_bits(a[-1]["eval"]), _bits(b[-1]["eval"]))


@pytest.mark.parametrize("name", ["depthwise_chain", "mobilenet_v2_logits"])
def test_compiled_runs_the_program_as_one_operator(saved: dict, name: str) -> None:
    """Under torch.compile(fullgraph=True) the forward is one operator of the graph
    (tfgrad::qat_program, its backward tfgrad::qat_program_backward) running the same
    program: every output, gradient (of the weights and the input) and buffer after each
    step bit-equal to the eager layer-by-layer path; no layer runs on its own."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    k = models.load_tf(saved[name])
    xs, cs = models.batches(k, 3, 4)
    compiled, layered = tq.load_keras(saved[name]), tq.load_keras(saved[name])
    layered.fused = False
    programs, layers = [], []
    real = compiled._program.forward
    compiled._program.forward = lambda *a, **kw: programs.append(1) or real(*a, **kw)
    parts: list[tuple] = []  # (the state's part of each forward's signature)
    sig = compiled._program._arrays_signature
    compiled._program._arrays_signature = lambda arrays: parts.append(sig(arrays)) or parts[-1]
    for layer in compiled.layers.values():
        layer.forward = (lambda f: lambda *a: layers.append(1) or f(*a))(layer.forward)
    counter = CompileCounterWithBackend("inductor")
    run = torch.compile(compiled, backend=counter, fullgraph=True)
    a = _steps(compiled, xs, cs, input_grad=name == "depthwise_chain", run=run)
    b = _steps(layered, xs, cs, input_grad=name == "depthwise_chain")
    _same_steps(a, b)
    assert len(programs) == 4 and not layers
    # worked out once: the graph passes the same tensors, the state as fresh copies
    assert len(parts) == 4 and all(p is parts[0] for p in parts)
    assert counter.frame_count == 2  # (training, then inference under no_grad)


def test_compiled_batch_stays_symbolic(saved: dict) -> None:
    """Ten batch sizes under torch.compile(fullgraph=True): two graphs, each step's bits
    those of the eager fused path."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    path = saved["depthwise_chain"]
    xs, cs = models.batches(models.load_tf(path), 1, 12)
    eager, compiled = tq.load_keras(path).train(), tq.load_keras(path).train()
    counter = CompileCounterWithBackend("aot_eager")
    run = torch.compile(compiled, backend=counter, fullgraph=True)
    for n in range(3, 13):
        x, c = torch.from_numpy(xs[0][:n]), torch.from_numpy(cs[0][:n])
        for call in (eager, run):
            (call(x) * c).sum().backward()
        for p, q in zip(eager.parameters(), compiled.parameters()):
            assert torch.equal(p.grad, q.grad), n
            p.grad = q.grad = None
        for u, v in zip(eager.state_dict().values(), compiled.state_dict().values()):
            assert torch.equal(u, v), n
    assert counter.frame_count <= 2


def test_compiled_forwards_before_one_backward(saved: dict) -> None:
    """Six compiled forwards, then one backward of their summed loss (gradient
    accumulation): each forward's tape is there for it, the bits the eager path's; a
    forward whose graph is dropped drops its tape."""
    torch._dynamo.reset()
    path = saved["depthwise_chain"]
    xs, cs = models.batches(models.load_tf(path), 6, 4)
    eager, compiled = tq.load_keras(path).train(), tq.load_keras(path).train()
    run = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    for call in (eager, run):
        loss = sum((call(torch.from_numpy(x)) * torch.from_numpy(c)).sum()
                   for x, c in zip(xs, cs))
        loss.backward()
    for p, q in zip(eager.parameters(), compiled.parameters()):
        assert torch.equal(p.grad, q.grad)
    for u, v in zip(eager.state_dict().values(), compiled.state_dict().values()):
        assert torch.equal(u, v)
    assert not _qat_fused.TAPES.tapes
    y = run(torch.from_numpy(xs[0]))
    assert len(_qat_fused.TAPES.tapes) == 1
    del y
    assert not _qat_fused.TAPES.tapes


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_retain_graph_second_backward(saved: dict, compiled: bool) -> None:
    """Two backwards of one forward under retain_graph (several losses over one graph)
    give the layer-by-layer path's gradients, summed; the tape goes with the backward
    that frees the graph, and a backward after that is torch's own error, as for the
    layers' nodes."""
    torch._dynamo.reset()
    path = saved["depthwise_chain"]
    xs, cs = models.batches(models.load_tf(path), 1, 4)
    m, ref = tq.load_keras(path).train(), tq.load_keras(path).train()
    ref.fused = False
    run = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
    got = []
    for model, call in ((m, run), (ref, ref)):
        x = torch.from_numpy(xs[0]).requires_grad_(True)
        y = call(x)
        loss = (y * torch.from_numpy(cs[0])).sum()
        loss.backward(retain_graph=True)
        first = x.grad.clone()
        loss.backward()
        got.append((first, x.grad, [p.grad for p in model.parameters()], y.grad_fn))
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
    (f1, g1, p1, node), (f2, g2, p2, _) = got
    assert torch.equal(f1, f2) and torch.equal(g1, g2)
    assert all(torch.equal(u, v) for u, v in zip(p1, p2))
    assert not _qat_fused.TAPES.tapes
    if not compiled:
        assert node.box == []  # (the tape freed with the saved tensors)


def test_compiled_with_hooks_or_exported_runs_layer_by_layer(saved: dict) -> None:
    """A hook on a layer under torch.compile, and torch.export: the layers one by one
    (the hook is called; the exported program holds no tfgrad::qat_program)."""
    torch._dynamo.reset()
    path = saved["depthwise_chain"]
    xs, _ = models.batches(models.load_tf(path), 1, 4)
    x = torch.from_numpy(xs[0])
    m = tq.load_keras(path).eval()
    seen = []
    layer = next(iter(m.layers.values()))
    handle = layer.register_forward_hook(lambda *a: seen.append(1))
    with torch.no_grad():
        torch.compile(m, backend="eager", fullgraph=True)(x)
    assert seen
    handle.remove()
    exported = torch.export.export(m, (x,))
    assert not any("qat_program" in str(n.target) for n in exported.graph.nodes)
    with torch.no_grad():
        assert torch.equal(exported.module()(x), m(x))


def test_frozen_weights_and_no_grad(saved: dict) -> None:
    """Weights that do not require grad get none (and are constants of the program); under
    no_grad the program records no tape and returns plain tensors."""
    path = saved["depthwise_chain"]
    k = models.load_tf(path)
    xs, cs = models.batches(k, 1, 4)
    m, ref = tq.load_keras(path).train(), tq.load_keras(path).train()
    ref.fused = False
    frozen = [n for n, _ in m.named_parameters()][:3]
    for mod in (m, ref):
        for n, p in mod.named_parameters():
            if n in frozen:
                p.requires_grad_(False)
        (mod(torch.from_numpy(xs[0])) * torch.from_numpy(cs[0])).sum().backward()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert (p.grad is None) == (n in frozen) == (q.grad is None)
        if p.grad is not None:
            assert np.array_equal(_bits(p.grad.numpy()), _bits(q.grad.numpy())), n
    with torch.no_grad():
        y = m(torch.from_numpy(xs[0]))
    assert y.grad_fn is None and not y.requires_grad


def test_second_derivative_is_refused(saved: dict) -> None:
    m = tq.load_keras(saved["depthwise_chain"]).train()
    x = torch.from_numpy(models.batches(models.load_tf(saved["depthwise_chain"]), 1, 2)[0][0])
    x.requires_grad_(True)
    (g,) = torch.autograd.grad(m(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


def test_layer_by_layer_where_the_program_cannot(saved: dict) -> None:
    """A plan it does not run (2-D batch norm), hooks on a layer: the layers run one by
    one (the hook is called)."""
    cnn = tq.load_keras(saved["cnn"])
    assert cnn._program is None and not cnn.fused
    assert "batch norm of rank 2" in str(_exec.unsupported(cnn.plan))
    m = tq.load_keras(saved["depthwise_chain"]).train()
    x = torch.from_numpy(models.batches(models.load_tf(saved["depthwise_chain"]), 1, 2)[0][0])
    seen = []
    layer = next(iter(m.layers.values()))
    handle = layer.register_forward_hook(lambda *a: seen.append(1))
    m(x)
    assert seen == [1]
    handle.remove()
    m(x)
    assert seen == [1]


def test_dropout_while_training_runs_layer_by_layer(tmp_path: object) -> None:
    """Dropout's mask is torch's random numbers: while training the model runs layer by
    layer, and the program never starts (no range is updated twice)."""
    k = models.keras()
    L = k.layers
    x = L.Input((6, 6, 2))
    y = L.Dropout(0.5)(L.Flatten()(L.Conv2D(3, 3, activation="relu")(x)))
    path = str(tmp_path) + "/drop.h5"
    models.tfmot().quantization.keras.quantize_model(
        k.Model(x, L.Dense(2)(y))).save(path)
    m = tq.load_keras(path)
    assert m.fused
    calls = []
    real = m._program.forward
    m._program.forward = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    xt = torch.ones(3, 6, 6, 2)
    m.train()
    m(xt).sum().backward()
    assert calls == []
    m.eval()
    with torch.no_grad():
        m(xt)
    assert calls == [1]


def test_repeated_steps_replay_the_first(saved: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step of a signature seen before (the same shapes, strides, dtypes and flags) runs
    the first forward's script (no layer walked) and calls the first step's prepared ops
    without computing each call's signature; a new batch size, TFGRAD_MAX_BYTES set, or
    a trace that no longer fits run the plain way. The bits are the layer-by-layer
    path's throughout."""
    from tfgrad import _api

    path = saved["depthwise_chain"]
    k = models.load_tf(path)
    (x4, x4b, x4c, x4d), (c4, c4b, c4c, c4d) = models.batches(k, 4, 4)
    (x2,), (c2,) = models.batches(k, 1, 2, seed=3)
    fused, layered = tq.load_keras(path).train(), tq.load_keras(path).train()
    layered.fused = False
    program = fused._program
    assert program is not None
    looked: list[str] = []
    real = _api.signature
    monkeypatch.setattr(_api, "signature", lambda op, a: looked.append(op.name) or real(op, a))
    walked: list[str] = []
    walks: list[int] = []
    layer = _exec.Program._layer
    monkeypatch.setattr(_exec.Program, "_layer",
                        lambda self, run, node, *a: walked.append(node.name) or layer(
                            self, run, node, *a))

    def step(x: np.ndarray, c: np.ndarray) -> int:
        looked.clear()
        walked.clear()
        got = []
        for m in (fused, layered):
            n = len(looked)
            xt = torch.from_numpy(x.copy()).requires_grad_(True)
            y = m(xt)
            (y * torch.from_numpy(c)).sum().backward()
            got.append([y.detach().numpy(), xt.grad.numpy(),
                        *(p.grad.numpy().copy() for p in m.parameters()),
                        *(v.numpy().copy() for v in m.state_dict().values())])
            if m is fused:
                plain = len(looked) - n
                walks.append(len(walked))
            for p in m.parameters():
                p.grad = None
        for s, t in zip(*got):
            assert np.array_equal(_bits(s), _bits(t))
        return plain

    assert step(x4, c4) > 0 and walks[-1] > 0  # (the first of its signature: traced)
    assert step(x4b, c4b) == 0 and walks[-1] == 0  # replayed, forward and backward
    assert step(x2, c2) > 0 and walks[-1] > 0  # a new batch size: a new signature
    assert step(x2[::-1].copy(), c2) == 0 and walks[-1] == 0
    monkeypatch.setenv("TFGRAD_MAX_BYTES", str(1 << 40))  # (checks that read it every call)
    assert step(x4c, c4c) > 0 and walks[-1] > 0
    monkeypatch.delenv("TFGRAD_MAX_BYTES")
    for traces in (program._traces, *(t for t, _ in program._backward_traces.values())):
        for trace in traces.values():  # a trace that does not fit: its calls run plain
            trace[len(trace) // 2] = ("Identity", None)
    assert step(x4d, c4d) > 0 and walks[-1] == 0  # (the backward's; the forward's script)


def test_state_part_of_the_signature(saved: dict) -> None:
    """The state arrays' part of a forward's signature is reused while the framework passes
    the same array objects (its parameters' views), and rebuilt when one changes: a
    parameter given new memory with other strides starts a new signature, as does one
    given other strides over the same memory and shape (a transposed square kernel, once
    read through its old view), and the bits stay the layer-by-layer path's."""
    path = saved["depthwise_chain"]
    xs, cs = models.batches(models.load_tf(path), 3, 4)
    fused, layered = tq.load_keras(path).train(), tq.load_keras(path).train()
    layered.fused = False
    program = fused._program
    assert program is not None

    def step(k: int) -> None:
        got = []
        for m in (fused, layered):
            y = m(torch.from_numpy(xs[k]))
            (y * torch.from_numpy(cs[k])).sum().backward()
            got.append([y.detach().numpy(), *(p.grad.numpy().copy() for p in m.parameters()),
                        *(v.numpy().copy() for v in m.state_dict().values())])
            for p in m.parameters():
                p.grad = None
        for s, t in zip(*got):
            assert np.array_equal(_bits(s), _bits(t))

    step(0)
    part = program._last_arrays[3]
    step(1)
    assert program._last_arrays[3] is part and len(program._traces) == 1
    for m in (fused, layered):  # a 4-D kernel in new memory, channels first in it
        p = next(p for p in m.parameters() if p.dim() == 4)
        with torch.no_grad():
            p.data = p.data.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    assert not next(p for p in fused.parameters() if p.dim() == 4).is_contiguous()
    step(2)
    assert program._last_arrays[3] is not part and program._last_arrays[3] != part
    assert len(program._traces) == 2
    for m in (fused, layered):  # the same memory and shape, other strides: a new view
        p = next(p for p in m.parameters() if p.dim() == 4 and p.shape[0] == p.shape[1])
        ptr = p.data_ptr()
        with torch.no_grad():
            p.data = p.data.transpose(0, 1)
        assert p.data_ptr() == ptr
    step(2)
    assert len(program._traces) == 3


def test_the_walk_kept_between_steps_follows_the_module(saved: dict) -> None:
    """The fused forward keeps its walk over the layers (the state's arrays on the tensors'
    memory, the trainable parameters) from step to step while nothing changed, and walks
    again when something did: a quantizer put in eval mode, a parameter frozen, one
    replaced, a layer's weights loaded in place (kept), a hook added (layer by layer), a
    range's memory given another dtype. The bits stay the layer-by-layer path's
    throughout."""
    path = saved["depthwise_chain"]
    xs, cs = models.batches(models.load_tf(path), 6, 4)
    fused, layered = tq.load_keras(path).train(), tq.load_keras(path).train()
    layered.fused = False

    def step(k: int) -> None:
        got = []
        for m in (fused, layered):
            y = m(torch.from_numpy(xs[k]))
            (y * torch.from_numpy(cs[k])).sum().backward()
            got.append([y.detach().numpy().copy(),
                        *(None if p.grad is None else p.grad.numpy().copy()
                          for p in m.parameters()),
                        *(v.numpy().copy() for v in m.state_dict().values())])
            for p in m.parameters():
                p.grad = None
        for s, t in zip(*got):
            assert (s is None) == (t is None)
            if s is not None:
                assert np.array_equal(_bits(s), _bits(t))

    def layer(m: torch.nn.Module, attr: str) -> torch.nn.Module:  # (Keras' names vary)
        return next(v for k, v in m.layers.items() if k != "quantize_layer"
                    and (attr in v._parameters or getattr(v, attr, None) is not None))

    step(0)
    bound = fused._bound
    assert bound is not None
    step(1)
    assert fused._bound is bound  # (nothing changed: kept)
    for m in (fused, layered):  # a quantizer in eval mode: its range stays
        layer(m, "output").output.eval()
    step(2)
    assert fused._bound is not bound
    bound = fused._bound
    for m in (fused, layered):  # a frozen kernel: no gradient for it
        layer(m, "depthwise_kernel").depthwise_kernel.requires_grad_(False)
    step(3)
    assert fused._bound is not bound
    assert layer(fused, "depthwise_kernel").depthwise_kernel.grad is None
    bound = fused._bound
    for m in (fused, layered):  # a parameter replaced by a new one
        dense = layer(m, "kernel")
        dense.kernel = torch.nn.Parameter(dense.kernel.detach() * 0.5)
    step(4)
    assert fused._bound is not bound
    bound = fused._bound
    with torch.no_grad():  # weights loaded in place: the same memory, kept
        fused.load_state_dict(layered.state_dict())
    step(4)
    assert fused._bound is bound
    seen = []
    add = next(v for k, v in fused.layers.items() if "add" in k)
    handle = add.register_forward_hook(lambda *a: seen.append(1))
    step(5)
    assert seen == [1]
    handle.remove()
    step(5)
    assert fused._bound is not None and fused._bound.holds()
    lo = layer(fused, "output").output.min  # (a range: a buffer)
    lo.data = lo.data.view(torch.int32)  # (the same memory, another dtype)
    assert not fused._bound.holds()


def test_a_stepped_model_pickles(saved: dict) -> None:
    """torch.save / pickle of a model after training steps (the program's replay traces
    hold closures: left out), and the copy steps on with the original's bits."""
    import io
    import pickle

    path = saved["depthwise_chain"]
    xs, cs = models.batches(models.load_tf(path), 3, 4)
    m = tq.load_keras(path).train()
    for x, c in zip(xs[:2], cs[:2]):
        (m(torch.from_numpy(x)) * torch.from_numpy(c)).sum().backward()
    buf = io.BytesIO()
    torch.save(m, buf)
    twin = pickle.loads(pickle.dumps(m))
    assert not twin._program._traces and m._program._traces
    outs = []
    for mod in (m, twin):
        for p in mod.parameters():
            p.grad = None
        y = mod(torch.from_numpy(xs[2]))
        (y * torch.from_numpy(cs[2])).sum().backward()
        outs.append([y.detach().numpy(), *(p.grad.numpy() for p in mod.parameters())])
    for a, b in zip(*outs):
        assert np.array_equal(_bits(a), _bits(b))
    # a pickle's derived tables are rebuilt on loading, whatever form it held them in
    # (an earlier tfgrad kept each quantizer as a (place, module) pair)
    m._quantizers = {k: [(w, q) for q, w, _, _ in v] for k, v in m._quantizers.items()}
    old = pickle.loads(pickle.dumps(m))
    m._quantizers = m._quantizer_table()
    for p in old.parameters():
        p.grad = None
    y = old(torch.from_numpy(xs[2]))
    assert old._quantizers == old._quantizer_table()
    assert y.grad_fn is not None and type(y.grad_fn).__name__.startswith("_Fused")
