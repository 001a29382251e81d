"""Per-call cost of the framework adapters, and one training step of the torch example.

    python benchmarks/adapters.py [--smoke] [--json FILE]

Tiny calls measure what the adapter adds around a kernel (argument binding, operator
dispatch, tensor <-> NumPy views, autograd bookkeeping): ``tfgrad.raw_ops`` on NumPy
arrays, the same op through ``tfgrad.torch`` (forward, and forward + backward), and one
training step of examples/torch_qat_mobilenet.py's model (batch 32, 24x24, CPU). Only
public functions are called, so the script times any version of tfgrad (A/B runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


CLOCK = time.perf_counter


def per_call_us(fn, n: int, rounds: int) -> float:
    """Median over rounds of the mean time of n calls, in microseconds."""
    for _ in range(min(n, 50)):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = CLOCK()
        for _ in range(n):
            fn()
        samples.append((CLOCK() - t0) / n * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="a few calls each (CI)")
    p.add_argument("--json", help="also write the results as JSON")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this process's CPU time (steadier on a shared machine; the "
                        "training step then counts every thread's time)")
    args = p.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    n, rounds, steps = (5, 1, 1) if args.smoke else (2000, 7, 20)

    import torch

    import tfgrad
    import tfgrad.torch as tt

    torch.manual_seed(0)
    x8 = torch.randn(8)
    x = torch.randn(1, 4, 4, 2)
    w = torch.randn(3, 3, 2, 1)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    x8n, xn, wn = x8.numpy(), x.numpy(), w.numpy()

    def fwd_bwd() -> None:
        tt.depthwise_conv2d_native(xg, wg, [1, 1, 1, 1], "SAME").sum().backward()

    rows = {
        "raw_ops FakeQuantWithMinMaxArgs, 8 floats (NumPy)":
            per_call_us(lambda: tfgrad.raw_ops.FakeQuantWithMinMaxArgs(inputs=x8n), n, rounds),
        "tfgrad.torch fake_quant_with_min_max_args, 8 floats":
            per_call_us(lambda: tt.fake_quant_with_min_max_args(x8), n, rounds),
        "raw_ops DepthwiseConv2dNative, [1, 4, 4, 2] (NumPy)":
            per_call_us(lambda: tfgrad.raw_ops.DepthwiseConv2dNative(
                input=xn, filter=wn, strides=[1, 1, 1, 1], padding="SAME"), n, rounds),
        "tfgrad.torch depthwise_conv2d_native, [1, 4, 4, 2]":
            per_call_us(lambda: tt.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME"),
                        n, rounds),
        "tfgrad.torch depthwise forward + backward, [1, 4, 4, 2]":
            per_call_us(fwd_bwd, max(1, n // 4), rounds),
    }

    import torch_qat_mobilenet as qat

    model = qat.TinyMobileNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xb, yb = qat.stripes(32, 24, torch.Generator().manual_seed(0))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()

    rows["torch example: one training step (batch 32, 24x24), ms"] = (
        per_call_us(step, steps, rounds) / 1e3)
    width = max(map(len, rows))
    print(f"tfgrad {tfgrad.__version__}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch threads; us per call unless marked ms")
    for k, v in rows.items():
        print(f"  {k:<{width}}  {v:9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
