"""Data-parallel quantization-aware training on TF's kernels: DistributedDataParallel over
two CPU processes (gloo), with the tiny MobileNet-style network of torch_qat_mobilenet.py.

Each process trains on its half of every batch; DDP averages the gradients. With
``--check`` the first step's synchronised gradients are compared with the same
computation in one process (each half-batch through the network, gradients averaged):
with a power-of-two number of processes the average is exact, so they must be the same
bits.

    python examples/torch_ddp_qat.py              # 2 processes, 20 steps
    python examples/torch_ddp_qat.py --quick      # 2 tiny steps (CI)
    python examples/torch_ddp_qat.py --check      # also check the first step's gradients
    torchrun --nproc-per-node 2 examples/torch_ddp_qat.py   # started by torchrun instead
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_qat_mobilenet as qat  # noqa: E402

import tfgrad.torch as tt  # noqa: E402

WORLD = 2


def make_model(fixed_regions: bool) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights in every process
    model = qat.TinyMobileNet()
    if fixed_regions:  # the same pooling regions in every process and in the reference
        for m in model.modules():
            if isinstance(m, tt.FractionalMaxPool2d):
                m.seed = (5, 7)
    return model


def batches(steps: int, batch: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [qat.stripes(batch, size, gen) for _ in range(steps)]


def worker(rank: int, args: argparse.Namespace, out_path: str) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    steps, batch, size = (2, 8, 16) if args.quick else (args.steps, 32, 24)
    model = DistributedDataParallel(make_model(args.check))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches(steps, batch, size), 1):
        half = batch // WORLD
        xs, ys = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
        loss = nn.functional.cross_entropy(model(xs), ys)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        if step == 1 and args.check and rank == 0:
            torch.save([p.grad for p in model.parameters()], out_path)
        opt.step()
        if rank == 0 and (step == 1 or step % 10 == 0 or step == steps):
            print(f"step {step:3d}  loss on rank 0's half {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"{steps} steps on {WORLD} processes in {time.perf_counter() - t0:.1f}s")
    dist.destroy_process_group()


def _spawned(rank: int, port: int, args: argparse.Namespace, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    worker(rank, args, out_path)
    # The work is done and the process group destroyed: leave without the interpreter's
    # teardown, where torch 2.13's gloo sometimes aborts ("terminate called without an
    # active exception"; also with a plain torch model and no tfgrad).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def reference_gradients(quick: bool) -> list[torch.Tensor]:
    """The first step in one process: each half-batch through the network, gradients
    averaged as DDP averages them."""
    _, batch, size = (2, 8, 16) if quick else (0, 32, 24)
    model = make_model(fixed_regions=True)
    x, y = batches(1, batch, size)[0]
    half = batch // WORLD
    per_half = []
    for r in range(WORLD):
        loss = nn.functional.cross_entropy(model(x[r * half:(r + 1) * half]),
                                           y[r * half:(r + 1) * half])
        per_half.append(torch.autograd.grad(loss, list(model.parameters())))
    return [sum(g) / WORLD for g in zip(*per_half)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 tiny steps (for CI)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--check", action="store_true",
                        help="compare the first step's gradients with one process's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "ddp_grads.pt")
        if "RANK" in os.environ:  # started by torchrun
            worker(int(os.environ["RANK"]), args, out_path)
            if int(os.environ["RANK"]) != 0:
                return 0
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(_spawned, args=(port, args, out_path), nprocs=WORLD, join=True)
        if not args.check:
            return 0
        ddp = torch.load(out_path)
    ref = reference_gradients(args.quick)
    worst = max(float((a - b).abs().max()) for a, b in zip(ddp, ref))
    same = all(torch.equal(a, b) for a, b in zip(ddp, ref))
    print(f"DDP gradients vs one process: {'identical' if same else 'differ'} "
          f"(largest difference {worst:.3g}, {len(ref)} parameters)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
