"""Per-call cost of the framework adapters, and one training step of the torch example.

    python benchmarks/adapters.py [--smoke] [--rounds R] [--calls N] [--no-step]
                                  [--json FILE] [--clock cpu]

Tiny calls measure what the adapters add around a kernel (argument binding and checks,
operator dispatch, tensor <-> NumPy views, autograd bookkeeping), for a fake quant of 8
values and a depthwise convolution of [1, 4, 4, 2] with a 3x3 filter:

- **kernel**: the op's host side on the compiled kernels with the checks done
  (``tfgrad.dispatch.<family>``; for the backward, each gradient op's);
- ``tfgrad.raw_ops`` on NumPy arrays, a repeated signature;
- ``tfgrad.torch`` forward (inputs not requiring grad) and forward + backward
  (``op(x).sum().backward()``, every input requiring grad);
- torch's nearest native op, the same ways (``fake_quantize_per_tensor_affine``; a grouped
  ``conv2d``), and torch's **autograd floor**: the same forward + backward with
  ``clone`` as the op (the engine, ``sum`` and its backward, which every op pays); and
  what any op written in Python pays on top: the same with a do-nothing
  ``autograd.Function`` handing NumPy-backed copies back.

Overheads are paired per round (each round times every row in turn), then the median
and range over rounds: raw_ops - kernel; torch forward - kernel; torch forward + backward
- forward and gradient kernels - autograd floor. One training step of
examples/torch_qat_mobilenet.py's model follows, against the same net in plain torch ops
(batch 8 and 32, 1 and 2 threads, eager and compiled; with --smoke batch 8, 1 thread,
eager), and one jitted step of examples/jax_sharded_qat.py's model on one device with
tfgrad.jax exact and native against the same net in plain JAX ops (batch 8 and 32).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


CLOCK = time.perf_counter


def interleaved_us(fns: dict, n: int, rounds: int) -> dict[str, list[float]]:
    """Per round, the mean time of n calls of each function in turn, in microseconds."""
    for fn in fns.values():
        for _ in range(min(n, 50)):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = CLOCK()
            for _ in range(n):
                fn()
            samples[k].append((CLOCK() - t0) / n * 1e6)
    return samples


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def tiny_calls(n: int, rounds: int) -> tuple[dict, dict]:
    import numpy as np
    import torch
    import torch.nn.functional as F

    import tfgrad
    import tfgrad.torch as tt
    from tfgrad.dispatch import depthwise_conv as DD
    from tfgrad.dispatch import fake_quant as DF
    from tfgrad.ops import depthwise_conv as OD
    from tfgrad.ops import fake_quant as OF

    torch.manual_seed(0)
    x8 = torch.randn(8)
    x8g = x8.clone().requires_grad_()
    x = torch.randn(1, 4, 4, 2)
    w = torch.randn(3, 3, 2, 1)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    x8n, xn, wn = x8.numpy(), x.numpy(), w.numpy()
    g8, gdw = np.ones(8, np.float32), np.ones((1, 4, 4, 2), np.float32)
    # torch's nearest ops: the same range [-6, 6] on 8 bits; the convolution in NCHW
    scale, zero = 12 / 255, 128
    xc = x.permute(0, 3, 1, 2).contiguous()
    wc = w.permute(2, 3, 0, 1).reshape(2, 1, 3, 3).contiguous()
    x8t, xct, wct = x8.clone().requires_grad_(), xc.clone().requires_grad_(), wc.clone()
    wct.requires_grad_()
    # the kernels, with the checks done
    p = OF.nudge(*OF._args_range(-6.0, 6.0), 8, False)
    attrs = {"strides": (1, 1, 1, 1), "padding": "SAME", "explicit_paddings": (),
             "data_format": "NHWC", "dilations": (1, 1, 1, 1)}
    geo, _ = OD._checked("DepthwiseConv2dNative", {"input": xn, "filter": wn, **attrs})

    class Identity(torch.autograd.Function):
        """What any op written in Python pays in torch: an autograd.Function whose
        forward and backward hand NumPy-backed tensors back (copies, no compute)."""

        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return torch.from_numpy(t.detach().numpy().copy())

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            return torch.from_numpy(g.numpy().copy())

    from tfgrad.torch._ops import OPERATORS

    def under_no_grad(call: Any) -> Any:
        def run() -> None:
            with torch.no_grad():
                call()
        return run

    def dw_grads() -> None:
        DD.backprop_input(wn, gdw, geo)
        DD.backprop_filter(xn, gdw, geo)

    fns = {
        "fq kernel forward": lambda: DF.quantize(x8n, p, False),
        "fq kernel gradient": lambda: DF.mask_gradient(g8, x8n, p),
        "fq raw_ops": lambda: tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x8n),
        "fq tfgrad.torch forward": lambda: tt.fake_quant_with_min_max_args(x8),
        "fq tfgrad.torch forward + backward":
            lambda: tt.fake_quant_with_min_max_args(x8g).sum().backward(),
        # (the operator through torch's dispatcher: what a compiled graph calls per op)
        "fq operator (dispatcher, no grad)": under_no_grad(
            lambda: OPERATORS["FakeQuantWithMinMaxArgs"](x8)),
        "fq torch native forward":
            lambda: torch.fake_quantize_per_tensor_affine(x8, scale, zero, 0, 255),
        "fq torch native forward + backward":
            lambda: torch.fake_quantize_per_tensor_affine(x8t, scale, zero, 0, 255)
            .sum().backward(),
        "fq torch autograd floor (clone)": lambda: x8t.clone().sum().backward(),
        "fq Python autograd.Function floor (NumPy copies)":
            lambda: Identity.apply(x8t).sum().backward(),
        "dw kernel forward": lambda: DD.forward(xn, wn, geo),
        "dw kernel gradients (input, filter)": dw_grads,
        "dw raw_ops": lambda: tfgrad.raw_ops.DepthwiseConv2dNative(
            input=xn, filter=wn, strides=[1, 1, 1, 1], padding="SAME"),
        "dw tfgrad.torch forward":
            lambda: tt.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME"),
        "dw tfgrad.torch forward + backward":
            lambda: tt.depthwise_conv2d_native(xg, wg, [1, 1, 1, 1], "SAME").sum().backward(),
        "dw operator (dispatcher, no grad)": under_no_grad(
            lambda: OPERATORS["DepthwiseConv2dNative"](x, w, [1, 1, 1, 1], "SAME")),
        "dw torch native forward":
            lambda: F.conv2d(xc, wc, padding=1, groups=2),
        "dw torch native forward + backward":
            lambda: F.conv2d(xct, wct, padding=1, groups=2).sum().backward(),
        "dw torch autograd floor (clone x, w)":
            lambda: (xct.clone().sum() + wct.clone().sum()).backward(),
    }
    s = interleaved_us(fns, n, rounds)

    def paired(*terms: tuple[int, str]) -> list[float]:
        return [sum(sign * s[k][r] for sign, k in terms) for r in range(rounds)]

    over = {}
    for f in ("fq", "dw"):
        grads = "fq kernel gradient" if f == "fq" else "dw kernel gradients (input, filter)"
        floor = ("fq torch autograd floor (clone)" if f == "fq"
                 else "dw torch autograd floor (clone x, w)")
        over[f"{f} raw_ops over the kernel"] = paired(
            (1, f"{f} raw_ops"), (-1, f"{f} kernel forward"))
        over[f"{f} tfgrad.torch forward over the kernel"] = paired(
            (1, f"{f} tfgrad.torch forward"), (-1, f"{f} kernel forward"))
        over[f"{f} operator (dispatcher) over the kernel"] = paired(
            (1, f"{f} operator (dispatcher, no grad)"), (-1, f"{f} kernel forward"))
        over[f"{f} tfgrad.torch forward + backward over the kernels and the floor"] = paired(
            (1, f"{f} tfgrad.torch forward + backward"), (-1, f"{f} kernel forward"),
            (-1, grads), (-1, floor))
        if f == "fq":
            over["fq tfgrad.torch forward + backward over the kernels and a Python "
                 "autograd.Function"] = paired(
                (1, "fq tfgrad.torch forward + backward"), (-1, "fq kernel forward"),
                (-1, grads), (-1, "fq Python autograd.Function floor (NumPy copies)"))
        over[f"{f} tfgrad.torch forward over torch native"] = paired(
            (1, f"{f} tfgrad.torch forward"), (-1, f"{f} torch native forward"))
        over[f"{f} tfgrad.torch forward + backward over torch native"] = paired(
            (1, f"{f} tfgrad.torch forward + backward"),
            (-1, f"{f} torch native forward + backward"))
    return ({k: summary(v) for k, v in s.items()}, {k: summary(v) for k, v in over.items()})


def plain_twin(classes: int = 4, width: int = 8) -> Any:
    """examples/torch_qat_mobilenet.py's TinyMobileNet in plain torch ops, the same shapes
    and work: grouped Conv2d for the depthwise convolutions, BatchNorm2d, torch's learnable
    per-channel fake quant (its rounding and nudging are not TF's: a speed twin only) and
    F.fractional_max_pool2d (2x2 regions)."""
    import torch
    from torch import nn

    class FQ(nn.Module):
        def __init__(self, c: int, lo: int, hi: int, axis: int):
            super().__init__()
            self.scale = nn.Parameter(torch.full((c,), 12.0 / 255))
            self.zero = nn.Parameter(torch.zeros(c))
            self.lo, self.hi, self.axis = lo, hi, axis

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch._fake_quantize_learnable_per_channel_affine(
                x, self.scale, self.zero, self.axis, self.lo, self.hi, 1.0)

    class Block(nn.Module):
        def __init__(self, c_in: int, c_out: int, stride: int):
            super().__init__()
            self.dw = nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False)
            self.wq = FQ(c_in, -127, 127, 0)
            self.bn1, self.q1 = nn.BatchNorm2d(c_in, momentum=0.1), FQ(c_in, 0, 255, 1)
            self.pw = nn.Conv2d(c_in, c_out, 1, bias=False)
            self.bn2, self.q2 = nn.BatchNorm2d(c_out, momentum=0.1), FQ(c_out, 0, 255, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = self.wq(self.dw.weight)
            x = nn.functional.conv2d(x, w, None, self.dw.stride, 1, 1, self.dw.groups)
            x = self.q1(nn.functional.relu6(self.bn1(x)))
            return self.q2(nn.functional.relu6(self.bn2(self.pw(x))))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(1, width, 3, padding=1)
            self.block1 = Block(width, 2 * width, 1)
            self.block2 = Block(2 * width, 4 * width, 2)
            self.head = nn.Linear(4 * width, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.block1(nn.functional.relu6(self.stem(x)))
            x = nn.functional.fractional_max_pool2d(x, 2, output_ratio=(0.7071, 0.7071))
            return self.head(self.block2(x).mean((2, 3)))

    return Net()


def training_steps_ms(steps: int, rounds: int, batches: tuple[int, ...] = (8, 32),
                      threads: tuple[int, ...] = (1, 2), compiled: bool = True
                      ) -> dict[str, dict[str, float]]:
    """One training step (cross entropy, Adam) of the torch example's TinyMobileNet on
    tfgrad.torch against its plain-torch twin, eager and torch.compile'd, per batch size
    and thread count (torch's and Numba's): the two nets interleaved in every round."""
    import numba
    import torch
    import torch_qat_mobilenet as qat

    out: dict[str, dict[str, float]] = {}
    for t in threads:
        torch.set_num_threads(t)
        numba.set_num_threads(min(t, numba.config.NUMBA_NUM_THREADS))
        for batch in batches:
            xb, yb = qat.stripes(batch, 24, torch.Generator().manual_seed(0))
            fns = {}
            for name, make in (("tfgrad.torch", qat.TinyMobileNet), ("plain torch", plain_twin)):
                for mode in ("eager", "compiled") if compiled else ("eager",):
                    torch.manual_seed(0)
                    model = make()
                    run = torch.compile(model) if mode == "compiled" else model
                    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

                    def step(run: Any = run, opt: Any = opt, xb: Any = xb, yb: Any = yb
                             ) -> None:
                        loss = torch.nn.functional.cross_entropy(run(xb), yb)
                        opt.zero_grad()
                        loss.backward()
                        opt.step()

                    for _ in range(3 if mode == "compiled" else 1):  # (compiles)
                        step()
                    fns[f"{name} {mode}"] = step
            us = interleaved_us(fns, steps, rounds)
            for k, v in us.items():
                out[f"batch {batch}, {t} thread{'s' if t > 1 else ''}: {k}"] = summary(
                    [x / 1e3 for x in v])
    return out


def plain_jax_forward(params: dict, state: dict, x: Any, training: bool = True
                      ) -> tuple[Any, dict]:
    """examples/jax_sharded_qat.py's forward in plain JAX ops, the same shapes and work:
    lax's grouped convolution, batch norm in jnp (batch statistics, the running ones moved
    as the example's), a straight-through fake quant in jnp (per output channel for the
    filters, learned ranges for the activations; its rounding and nudging are not TF's: a
    speed twin only)."""
    import jax
    import jax.numpy as jnp

    def fake_quant(v: Any, lo: Any, hi: Any, qmin: int, qmax: int) -> Any:
        scale = (hi - lo) / (qmax - qmin)
        clipped = jnp.clip(v, lo, hi)
        q = jnp.round((clipped - lo) / scale) * scale + lo
        return clipped + jax.lax.stop_gradient(q - clipped)

    def block(v: Any, w: Any, bn: dict, act: dict, stats: dict, stride: int) -> tuple:
        kh, kw, c, m = w.shape
        flat = w.reshape(kh, kw, 1, c * m)
        lo = jax.lax.stop_gradient(jnp.minimum(flat.min(axis=(0, 1, 2)), 0.0))
        hi = jax.lax.stop_gradient(jnp.maximum(flat.max(axis=(0, 1, 2)), 0.0))
        y = jax.lax.conv_general_dilated(
            v, fake_quant(flat, lo, hi, 1, 255), (stride, stride), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=c)
        mean, var = y.mean(axis=(0, 1, 2)), y.var(axis=(0, 1, 2))
        y = (y - mean) * jax.lax.rsqrt(var + 1e-3) * bn["scale"] + bn["offset"]
        y = fake_quant(jnp.clip(y, 0.0, 6.0), act["min"], act["max"], 0, 255)
        n = y.size // y.shape[-1]
        f = 0.01
        new = {"mean": (1 - f) * stats["mean"] + f * mean,
               "variance": (1 - f) * stats["variance"] + f * var * n / max(n - 1, 1)}
        return y, new if training else stats

    y, s1 = block(x, params["dw1"], params["bn1"], params["act1"], state["bn1"], 1)
    y, s2 = block(y, params["dw2"], params["bn2"], params["act2"], state["bn2"], 2)
    return y.mean(axis=(1, 2)) @ params["w"] + params["b"], {"bn1": s1, "bn2": s2}


def jax_training_steps_ms(steps: int, rounds: int, batches: tuple[int, ...] = (8, 32)
                          ) -> dict[str, dict[str, float]]:
    """One jitted SGD step of examples/jax_sharded_qat.py's model on one device: tfgrad's
    ops exact (host callbacks into the kernels) and native (tfgrad's XLA implementation),
    against the same net in plain JAX ops, interleaved in every round (XLA's own
    threads: all of the machine's cores)."""
    import jax
    import jax_sharded_qat as ex

    import tfgrad.jax as tj

    def plain_loss(params: dict, state: dict, x: Any, labels: Any) -> tuple[Any, dict]:
        logits, new_state = plain_jax_forward(params, state, x)
        logp = jax.nn.log_softmax(logits)
        return -(logp[jax.numpy.arange(labels.shape[0]), labels]).mean(), new_state

    def plain_step(params: dict, state: dict, x: Any, labels: Any) -> tuple:
        (loss, new_state), grads = jax.value_and_grad(plain_loss, has_aux=True)(
            params, state, x, labels)
        return ex._sgd(params, grads, 0.05), new_state, loss

    out: dict[str, dict[str, float]] = {}
    for batch in batches:
        x, labels = ex.blobs(jax.random.PRNGKey(1), batch)
        fns = {}
        for name, impl, fn in (("tfgrad.jax exact", "exact", ex.train_step),
                               ("tfgrad.jax native", "native", ex.train_step),
                               ("plain JAX", "exact", plain_step)):
            with tj.use_impl(impl):  # (read when the step is traced: here, on its first call)
                step = jax.jit(fn)
                box = list(ex.init(jax.random.PRNGKey(0)))
                jax.block_until_ready(step(box[0], box[1], x, labels))

            def run(step: Any = step, box: list = box, x: Any = x, labels: Any = labels
                    ) -> None:
                box[0], box[1], loss = step(box[0], box[1], x, labels)
                jax.block_until_ready(loss)

            fns[name] = run
        for k, v in interleaved_us(fns, steps, rounds).items():
            out[f"batch {batch}: {k}"] = summary([t / 1e3 for t in v])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="a few calls each (CI)")
    p.add_argument("--rounds", type=int, default=15, help="rounds of interleaved samples")
    p.add_argument("--calls", type=int, default=1000, help="calls per sample")
    p.add_argument("--no-step", action="store_true", help="tiny calls only")
    p.add_argument("--qat", action="store_true",
                   help="also a tfmot QAT training step: tfmot in TF against tfgrad.torch.qat "
                        "and tfgrad.jax.qat (benchmarks/qat_step.py; MobileNetV2, or its "
                        "small CNN with --smoke; needs the test extra)")
    p.add_argument("--json", help="also write the results as JSON")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this process's CPU time (steadier on a shared machine; the "
                        "training step then counts every thread's time)")
    args = p.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    n, rounds, steps = (5, 1, 1) if args.smoke else (args.calls, args.rounds, 20)

    import torch

    import tfgrad

    times, overheads = tiny_calls(n, rounds)
    step = None if args.no_step else training_steps_ms(
        steps, 1 if args.smoke else 7, (8,) if args.smoke else (8, 32),
        (1,) if args.smoke else (1, 2), compiled=not args.smoke)
    jax_step = None if args.no_step or importlib.util.find_spec("jax") is None else \
        jax_training_steps_ms(steps, 1 if args.smoke else 7, (8,) if args.smoke else (8, 32))
    print(f"tfgrad {tfgrad.__version__}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch threads; {rounds} interleaved rounds of {n} "
          "calls: median [min, max], us per call")
    width = max(map(len, [*times, *overheads]))
    for title, rows in (("Times", times), ("Overheads (paired per round)", overheads)):
        print(title)
        for k, v in rows.items():
            print(f"  {k:<{width}}  {v['median']:8.2f}  [{v['min']:.2f}, {v['max']:.2f}]")
    if step is not None:
        print("torch example (24x24): one training step, ms: median [min, max]; ratio of "
              "medians to plain torch")
        for k, v in step.items():
            plain = step[k.replace("tfgrad.torch", "plain torch")]["median"]
            print(f"  {k:<44}  {v['median']:8.2f}  [{v['min']:.2f}, {v['max']:.2f}]  "
                  f"{v['median'] / plain:5.2f}x")
    if jax_step is not None:
        print("JAX example (examples/jax_sharded_qat.py, 16x16, one device): one jitted "
              "training step, ms: median [min, max]; ratio of medians to plain JAX")
        for k, v in jax_step.items():
            plain = jax_step[k.split(": ")[0] + ": plain JAX"]["median"]
            print(f"  {k:<44}  {v['median']:8.2f}  [{v['min']:.2f}, {v['max']:.2f}]  "
                  f"{v['median'] / plain:5.2f}x")
    qat = None
    if args.qat:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import qat_step

        model = "cnn" if args.smoke else "mobilenet_v2"
        qat = qat_step.measure(args.smoke, 32, model)
        qat_step.report(qat, model, 32)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"times_us": times, "overheads_us": overheads, "training_step_ms": step,
             "jax_training_step_ms": jax_step, "qat_step_ms": qat}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
