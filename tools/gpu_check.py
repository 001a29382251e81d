"""Check tfgrad's portable (torch) and native (JAX) implementations on a GPU.

    python tools/gpu_check.py [--out REPORT.md] [--device cuda] [--skip-jax] [--quick]

1. Every case of tests/cases through ``torch.ops.tfgrad.*`` on the device (the portable
   implementation) against the exact CPU kernels, within each family's BOUNDS
   (``tfgrad.torch._portable.<family>.BOUNDS``); the largest distance seen per op, output
   and dtype.
2. ``torch.compile(fullgraph=True)`` of a chain of tfgrad ops on the device: the same bits
   as eager on the device; a small QAT model trained under ``torch.autocast`` (CUDA
   float16): the autocast rules' dtypes, float32 batch-norm state, a falling loss.
3. Timings against torch's nearest native ops (``fake_quantize_per_channel_affine``,
   ``batch_norm``, ``conv2d`` with groups, ``FractionalMaxPool2d``), forward and
   forward+backward, and one training step of examples/torch_qat_mobilenet.py's model.
4. The JAX native path (tools/_gpu_check_jax.py), unless --skip-jax.
5. With ``--qat MODEL.h5`` (a tfmot QAT model: ``benchmarks/qat_step.py --build MODEL.h5``):
   the model trained on the device by tfgrad.torch.qat and (unless --skip-jax)
   tfgrad.jax.qat against tfgrad.torch.qat's exact CPU step (TF's bits; computed once
   and kept beside the model as MODEL.h5.cpu.npz, so a GPU machine needs no warm Numba
   cache for it): step-0 outputs, every weight and range after step 1, the losses.

Nothing in CI needs a GPU; ``--device cpu`` runs the same checks on the CPU (portable
path forced) to keep this script working. Meant to finish in under 5 minutes on one GPU.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402

import tfgrad  # noqa: E402
import tfgrad.torch as tt  # noqa: E402
from tests.cases import CASES  # noqa: E402
from tfgrad import _distance, _validate  # noqa: E402
from tfgrad.torch import _ops  # noqa: E402


def _to_device(kwargs: dict, op_name: str, device: str) -> dict:
    op = tfgrad.get_op_def(op_name)
    # (the op's dtypes, as tfgrad.raw_ops converts NumPy inputs; torch casts nothing)
    kwargs = {**kwargs, **_validate.bind_inputs(op, kwargs)[0]}
    args = {}
    for i in op.inputs:
        v = np.asarray(kwargs[i.name])
        if i.is_shape:
            args[i.name] = [int(x) for x in v.reshape(-1)]
        else:
            t = (torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
                 if v.dtype.name == "bfloat16" else torch.from_numpy(np.array(v, order="C")))
            args[i.name] = t.to(device)
    args.update({a.name: kwargs[a.name] for a in op.attrs if a.name in kwargs})
    if _ops.takes_seeds(op) and not args.get("deterministic"):
        args.update(deterministic=True, seed=7, seed2=11)
    return args


def _numpy(t: torch.Tensor) -> np.ndarray:
    return _ops.to_numpy(t.detach().cpu())


def check_cases(device: str, report: list[str]) -> bool:
    """Every case on the device against the exact CPU kernels, within BOUNDS."""
    worst: dict[tuple[str, str, str], float] = {}
    failures = []
    for case in CASES:
        op = tfgrad.get_op_def(case.op)
        bounds = importlib.import_module(f"tfgrad.torch._portable.{op.family}").BOUNDS
        kwargs = case.kwargs()
        args = _to_device(kwargs, case.op, device)
        exact_args = {k: (v if not isinstance(v, torch.Tensor) else v.cpu())
                      for k, v in args.items()}
        with tt.use_impl("exact"):
            want = _ops.OPERATORS[case.op](**exact_args)
        with tt.use_impl("portable"):
            got = _ops.OPERATORS[case.op](**args)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for o, w, g in zip(op.outputs, want, got):
            dt = _ops._DTYPE_NAMES[w.dtype]
            limit = bounds.get(case.op, {}).get(o.name, {}).get(dt, 0)
            gn, wn = _numpy(g), _numpy(w)
            d = 0.0 if _distance.bit_identical(gn, wn) else _distance.distance(gn, wn)
            key = (case.op, o.name, dt)
            worst[key] = max(worst.get(key, 0.0), d)
            if (limit == 0 and d != 0) or d > limit:
                failures.append(f"{case.id} {o.name} {dt}: distance {d:.3g} > bound {limit}")
    report.append(f"## Portable path on {device} vs the exact CPU kernels ({len(CASES)} cases)\n")
    report.append("| op | output | dtype | largest distance |")
    report.append("|---|---|---|---|")
    for (op_name, out, dt), d in sorted(worst.items()):
        report.append(f"| {op_name} | {out} | {dt} | {'bit-identical' if d == 0 else f'{d:.3g}'} |")
    report.append("")
    report.append(f"Outside the bounds: {len(failures)}")
    report.extend(f"- {f}" for f in failures[:50])
    report.append("")
    return not failures


def _chain(x, w, scale, offset, lo, hi):
    y = tt.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")
    z = tt.fused_batch_norm_v3(y, scale, offset, torch.zeros(0, device=x.device),
                               torch.zeros(0, device=x.device)).y
    q = tt.fake_quant_with_min_max_vars_per_channel(z, lo, hi)
    return tt.fractional_avg_pool(q, [1.0, 1.5, 1.5, 1.0], deterministic=True, seed=3,
                                  seed2=4).output


def check_compile(device: str, report: list[str]) -> bool:
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(4, 17, 17, 8, generator=g), torch.randn(3, 3, 8, 2, generator=g),
              torch.rand(16, generator=g) + 0.5, torch.randn(16, generator=g),
              torch.full((16,), -2.0), torch.full((16,), 2.5)]
    inputs = [t.to(device).requires_grad_() for t in inputs]

    def run(fn):
        out = fn(*inputs)
        return [out.detach(), *torch.autograd.grad(out.square().sum(), inputs)]

    with tt.use_impl("portable"):
        eager = run(_chain)
        t0 = time.perf_counter()
        compiled = run(torch.compile(_chain, fullgraph=True))
        secs = time.perf_counter() - t0
    same = all(torch.equal(a, b) for a, b in zip(eager, compiled))
    report.append(f"## torch.compile(fullgraph=True) on {device}\n")
    report.append(f"A chain of depthwise conv, batch norm, per-channel fake quant and fractional "
                  f"average pooling: compiled in {secs:.1f}s; outputs and gradients "
                  f"{'the same bits as eager' if same else 'DIFFER from eager'}.\n")
    return same


def check_autocast(device: str, report: list[str]) -> bool:
    """A small QAT model trains under torch.autocast on the device (CUDA: float16; the CPU:
    bfloat16): depthwise conv in autocast's dtype, batch norm's statistics and the fake
    quant ranges in float32, fake quant's output float32; a few SGD steps lower the loss."""
    dtype = torch.float16 if device.startswith("cuda") else torch.bfloat16
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 1), tt.DepthwiseConv2d(8, 3), tt.FusedBatchNorm2d(8),
        tt.FakeQuantPerChannel(8), tt.FractionalMaxPool2d(1.5, seed=(1, 2)),
        torch.nn.Flatten(), torch.nn.Linear(8 * 10 * 10, 2)).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, 16, 16, generator=g).to(device)
    y = (x.mean((1, 2, 3)) > 0).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, problems = [], []
    for _ in range(10):
        with torch.autocast(device.split(":")[0], dtype=dtype):
            h = model[1](model[0](x))
            b = model[2](h)
            q = model[3](b)
            loss = torch.nn.functional.cross_entropy(model[4:](q), y)
        if (h.dtype, b.dtype, q.dtype) != (dtype, dtype, torch.float32):
            problems.append(f"dtypes depthwise/batch norm/fake quant: {h.dtype}, {b.dtype}, "
                            f"{q.dtype}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if not all(np.isfinite(losses)) or not losses[-1] < losses[0]:
        problems.append(f"loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}")
    kept = {n: t.dtype for n, t in model[2].state_dict().items()}
    if set(kept.values()) != {torch.float32}:
        problems.append(f"batch norm state not float32: {kept}")
    report.append(f"## torch.autocast({device!r}, {dtype}) training\n")
    report.append(f"10 SGD steps of a small QAT model: loss {losses[0]:.4f} -> "
                  f"{losses[-1]:.4f}; "
                  + ("; ".join(problems) if problems else "dtypes as the autocast rules say")
                  + ".\n")
    return not problems


def _time(fn, device: str, reps: int) -> float:
    """Median milliseconds of fn() over reps runs (after warm-up)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def timings(device: str, report: list[str], quick: bool) -> None:
    n, h, c = (4, 28, 32) if quick else (32, 56, 64)
    reps = 5 if quick else 20
    dev = torch.device(device)
    x = torch.randn(n, h, h, c, device=dev)  # NHWC
    x_cl = x.permute(0, 3, 1, 2)  # the same memory as NCHW channels-last, for torch's ops
    lo, hi = torch.full((c,), -3.0, device=dev), torch.full((c,), 3.0, device=dev)
    scale_q = (hi - lo) / 255
    zp = torch.full((c,), 128, dtype=torch.int32, device=dev)
    w = torch.randn(3, 3, c, 1, device=dev)
    w_t = w.permute(2, 3, 0, 1).contiguous()
    gamma, beta = torch.ones(c, device=dev), torch.zeros(c, device=dev)
    empty = torch.zeros(0, device=dev)
    rows = [
        ("fake quant per channel", lambda: tt.fake_quant_with_min_max_vars_per_channel(x, lo, hi),
         lambda: torch.fake_quantize_per_channel_affine(x, scale_q, zp, 3, 0, 255)),
        ("batch norm (training)",
         lambda: tt.fused_batch_norm_v3(x, gamma, beta, empty, empty).y,
         lambda: torch.nn.functional.batch_norm(x_cl, None, None, gamma, beta, training=True)),
        ("depthwise conv 3x3", lambda: tt.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME"),
         lambda: torch.nn.functional.conv2d(x_cl, w_t, padding=1, groups=c)),
        ("fractional max pool",
         lambda: tt.fractional_max_pool(x, [1.0, 1.44, 1.44, 1.0], deterministic=True,
                                        seed=1, seed2=2).output,
         lambda: torch.nn.functional.fractional_max_pool2d(x_cl, 2,
                                                           output_ratio=(1 / 1.44, 1 / 1.44))),
    ]
    report.append(f"## Timings on {device}: tfgrad (portable) vs torch's nearest op, "
                  f"[{n}, {h}, {h}, {c}] float32, median ms\n")
    report.append("| op | tfgrad fwd | torch fwd | tfgrad fwd+bwd | torch fwd+bwd |")
    report.append("|---|---|---|---|---|")
    with tt.use_impl("portable"):
        for name, ours, theirs in rows:
            cells = []
            for fn in (ours, theirs):
                cells.append(_time(fn, device, reps))
            for fn in (ours, theirs):
                for t in (x, w, gamma, beta, lo, hi):
                    t.requires_grad_(t.is_floating_point())

                def fb(fn=fn):
                    out = fn()
                    out.sum().backward()
                cells.append(_time(fb, device, reps))
                for t in (x, w, gamma, beta, lo, hi):
                    t.requires_grad_(False)
                    t.grad = None
            report.append(f"| {name} | {cells[0]:.3f} | {cells[1]:.3f} | {cells[2]:.3f} | "
                          f"{cells[3]:.3f} |")
    report.append("")
    import torch_qat_mobilenet as qat

    torch.manual_seed(0)
    model = qat.TinyMobileNet().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xb, yb = qat.stripes(32, 24, torch.Generator().manual_seed(0))
    xb, yb = xb.to(dev), yb.to(dev)

    def step():
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()

    with tt.use_impl("portable"):
        ms = _time(step, device, reps)
    report.append(f"One training step of examples/torch_qat_mobilenet.py's model (batch 32, "
                  f"24x24) on {device}: {ms:.2f} ms.\n")


def _flat(weights: dict) -> dict[str, np.ndarray]:
    return {f"w1/{layer}/{name}": np.asarray(v) for layer, ws in weights.items()
            for name, v in ws}


def _qat_torch(device: str, path: str, x: np.ndarray, c: np.ndarray, steps: int,
               timed: int) -> dict[str, np.ndarray]:
    """``steps`` SGD steps (loss sum(y * c), lr 0.05) of tfgrad.torch.qat on ``device``:
    the step-0 outputs, every weight after step 1, the losses, then ``timed`` steps' ms."""
    import tfgrad.torch.qat as tq

    m = tq.load_keras(path).train().to(device)
    xt, ct = torch.from_numpy(x).to(device), torch.from_numpy(c).to(device)
    out: dict[str, np.ndarray] = {}
    losses, times = [], []
    for step in range(steps + timed):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = m(xt)
        loss = (y * ct).sum()
        loss.backward()
        with torch.no_grad():
            for p in m.parameters():
                p.sub_(0.05 * p.grad)
                p.grad = None
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        if step == 0:
            out["out0"] = y.detach().cpu().numpy()
            out.update(_flat(m.keras_weights()))
        if step < steps:
            losses.append(loss.item())
    out["loss"] = np.array(losses, np.float32)
    out["ms"] = np.array(statistics.median(times[steps:]) if timed else np.nan)
    return out


def _qat_jax(path: str, x: np.ndarray, c: np.ndarray, steps: int, timed: int
             ) -> dict[str, np.ndarray]:
    """The same steps with tfgrad.jax.qat under jit on JAX's default device."""
    import jax
    import jax.numpy as jnp

    import tfgrad.jax.qat as jq

    m = jq.load_keras(path)

    def loss(params: dict, state: dict) -> tuple:
        y, new = m.apply({"params": params, "state": state}, x, training=True)
        return jnp.sum(y * c), (y, new["state"])

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    lr = jnp.float32(0.05)
    v = {"params": m.variables["params"], "state": m.variables["state"]}
    out: dict[str, np.ndarray] = {}
    losses, times = [], []
    for i in range(steps + timed):
        t0 = time.perf_counter()
        (value, (y, state)), g = grad(v["params"], v["state"])
        # SGD eagerly: p - lr * g rounded twice, as TF's assign_sub (jit would fuse an FMA)
        v = jax.block_until_ready({"params": jax.tree.map(lambda p, d: p - lr * d,
                                                          v["params"], g), "state": state})
        times.append((time.perf_counter() - t0) * 1e3)
        if i == 0:
            out["out0"] = np.asarray(y)
            out.update(_flat(m.keras_weights(v)))
        if i < steps:
            losses.append(float(value))
    out["loss"] = np.array(losses, np.float32)
    out["ms"] = np.array(statistics.median(times[steps:]) if timed else np.nan)
    return out


def check_qat(device: str, path: str, report: list[str], jax_too: bool, batch: int = 8,
              steps: int = 3) -> bool:
    """A tfmot QAT model trained on the device against tfgrad.torch.qat's exact CPU step."""
    from tfgrad.testing.qat import file_batch

    x, c = file_batch(path, batch)
    ref_path = Path(path + ".cpu.npz")
    if not ref_path.exists():
        with tt.use_impl("exact"):
            ref = _qat_torch("cpu", path, x, c, steps, 0)
        np.savez(ref_path, **ref)
    ref = dict(np.load(ref_path))
    t0 = time.perf_counter()
    runs = {f"tfgrad.torch.qat on {device}": _qat_torch(device, path, x, c, steps, 5)}
    print(f"[qat: torch {time.perf_counter() - t0:.1f}s]", file=sys.stderr, flush=True)
    if jax_too:
        import jax

        t0 = time.perf_counter()
        runs[f"tfgrad.jax.qat (jit) on {jax.devices()[0].platform}"] = _qat_jax(
            path, x, c, steps, 5)
        print(f"[qat: jax {time.perf_counter() - t0:.1f}s]", file=sys.stderr, flush=True)
    names = [k for k in ref if k.startswith("w1/")]
    ranges = [k for k in names if k.rsplit("/", 1)[1].split(":")[0].endswith(("min", "max"))]
    report.append(f"## A tfmot QAT model trained on the device: {Path(path).name}, batch "
                  f"{batch}, {steps} SGD steps, against tfgrad.torch.qat's exact CPU step\n")
    report.append("| run | step-0 outputs | weights after step 1 | ranges after step 1 | "
                  "losses (CPU exact: " + ", ".join(f"{v:.6g}" for v in ref["loss"])
                  + ") | ms a step |")
    report.append("|---|---|---|---|---|---|")
    ok = True

    def dist(a: np.ndarray, b: np.ndarray) -> float:
        return 0.0 if _distance.bit_identical(a, b) else float(_distance.distance(a, b))

    for label, got in runs.items():
        d0 = dist(got["out0"], ref["out0"])
        dw = [dist(got[k], ref[k]) for k in names if k not in ranges]
        dr = [dist(got[k], ref[k]) for k in ranges]
        same = sum(d == 0 for d in dr)
        ok = ok and bool(np.isfinite(got["loss"]).all())
        report.append(
            f"| {label} | {'bit-identical' if d0 == 0 else f'{d0:.3g}'} | "
            f"{sum(d == 0 for d in dw)} of {len(dw)} bit-identical, largest {max(dw):.3g} | "
            f"{same} of {len(dr)} bit-identical, largest {max(dr, default=0):.3g} | "
            + ", ".join(f"{v:.6g}" for v in got["loss"]) + f" | {float(got['ms']):.1f} |")
    report.append("")
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", help="also write the report to this markdown file")
    p.add_argument("--skip-jax", action="store_true")
    p.add_argument("--quick", action="store_true", help="small timing shapes")
    p.add_argument("--qat", metavar="MODEL.h5", help="also train this tfmot QAT model")
    p.add_argument("--only", help="only these parts, comma-separated (cases, compile, "
                   "autocast, timings, qat, jax)")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu to check the portable path on the CPU")
        return 2
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    report = [f"# tfgrad GPU check: {name}, torch {torch.__version__}\n"]
    ok = True
    steps = [("cases", lambda: check_cases(args.device, report)),
             ("compile", lambda: check_compile(args.device, report)),
             ("autocast", lambda: check_autocast(args.device, report)),
             ("timings", lambda: timings(args.device, report, args.quick) or True)]
    if args.qat:
        steps.append(("qat", lambda: check_qat(args.device, args.qat, report,
                                               not args.skip_jax)))
    if not args.skip_jax:
        def jax_part() -> bool:
            sys.path.insert(0, str(ROOT / "tools"))
            import _gpu_check_jax

            _gpu_check_jax.run(report)
            return True
        steps.append(("jax", jax_part))
    for label, fn in steps:
        if args.only and label not in args.only.split(","):
            continue
        t0 = time.perf_counter()
        try:
            ok = bool(fn()) and ok
        except Exception:
            ok = False
            report.append(f"## {label}: FAILED\n\n```\n{traceback.format_exc()}```\n")
        print(f"[{label}: {time.perf_counter() - t0:.1f}s]", file=sys.stderr)
    text = "\n".join(report)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
