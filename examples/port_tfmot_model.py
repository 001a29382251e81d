"""Move a tfmot QAT model to PyTorch and back: tf_keras + tfmot -> tfgrad.torch.qat (one
process, then DistributedDataParallel on two) -> a tf_keras .h5 -> TFLite int8.

1. Builds a float tf_keras model, quantizes it with tfmot's ``quantize_model`` and saves
   it (``.h5``): MobileNetV2 (alpha 0.35, 32x32), or with ``--quick`` a small CNN.
2. Trains it in TF (Eigen kernels, and TF's default oneDNN build in a subprocess) and in
   PyTorch on the same batches, plain SGD, and prints each step's distances to TF-Eigen.
   The loss is ``sum(y * c)`` for fixed random ``c``: its gradient is exact in every
   framework, so the distances are the model's own.
3. Trains the PyTorch model with DDP on two processes (gloo) and writes it back to Keras
   (``tfgrad.torch.qat.save_keras``), reloads it in TF inside tfmot's ``quantize_scope``
   and compares TF's eval outputs with the port's.
4. Converts the reloaded model with TF's TFLite converter (int8) and reports how often
   the int8 model's top-1 agrees with the port's eval forward.

    python examples/port_tfmot_model.py            # MobileNetV2, 5 steps
    python examples/port_tfmot_model.py --quick    # small CNN, 2 steps (CI)
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # before anything imports TF
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

LR = 0.05
WORLD = 2



def tf_reference(path: str, onednn: bool, steps: int, batch: int) -> dict:
    from tfgrad.testing import qat as models

    k = models.load_tf(path, onednn=onednn)
    xs, cs = models.batches(k, steps, batch)
    return {"xs": xs, "cs": cs, "steps": models.tf_steps(k, xs, cs, LR)}


def torch_steps(path: str, xs: list[np.ndarray], cs: list[np.ndarray]) -> list[dict]:
    import tfgrad.torch.qat as tq
    from tfgrad.testing import qat as models

    steps = models.torch_steps(tq.load_keras(path), xs, cs, LR)
    return [{"y": s["y"], "weights": {k: [v for _, v in ws] for k, ws in s["weights"].items()}}
            for s in steps]


def distance(a: dict, b: dict, ranges: set[int]) -> tuple[float, int, int, int, int]:
    """(largest |y - y_ref|, variables not bit-identical, variables, range variables not
    bit-identical, range variables); variables by their position in the file."""
    n = differ = rdiffer = 0
    k = 0
    for layer, ws in b["weights"].items():
        for u, v in zip(a["weights"][layer], ws):
            n += 1
            same = np.array_equal(u, v)
            differ += not same
            rdiffer += (not same) and k in ranges
            k += 1
    return float(np.abs(a["y"] - b["y"]).max()), differ, n, rdiffer, len(ranges)


def ddp_worker(rank: int, port: int, path: str, out: str, xs: list, cs: list) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import tfgrad.torch.qat as tq

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    model = tq.load_keras(path).train()
    ddp = DistributedDataParallel(model)
    lr = torch.tensor(LR)
    for x, c in zip(xs, cs):
        half = len(x) // WORLD
        sl = slice(rank * half, (rank + 1) * half)
        y = ddp(torch.from_numpy(x[sl]))
        (y * torch.from_numpy(c[sl])).sum().backward()  # DDP averages the gradients
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(lr * p.grad)
                p.grad = None
    if rank == 0:
        tq.save_keras(model, out)
    dist.destroy_process_group()
    # leave without the interpreter's teardown, where torch 2.13's gloo sometimes aborts
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small CNN, 2 steps (for CI)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default=None,
                        help="one of tfgrad.testing.qat.MODELS (default mobilenet_v2; "
                             "cnn with --quick)")
    parser.add_argument("--out", default=None, help="folder for the .h5 / .tflite files")
    parser.add_argument("--tf-reference", help=argparse.SUPPRESS)  # the oneDNN subprocess
    args = parser.parse_args()
    steps, batch = (2, 8) if args.quick else (args.steps, 16)
    if args.tf_reference:
        path, out = args.tf_reference.split(os.pathsep)
        with open(out, "wb") as f:
            pickle.dump(tf_reference(path, True, steps, batch), f)
        return 0

    import torch.multiprocessing as mp

    from tfgrad.testing import qat as models

    folder = args.out or tempfile.mkdtemp(prefix="tfgrad-port-")
    os.makedirs(folder, exist_ok=True)
    name = args.model or ("cnn" if args.quick else "mobilenet_v2")
    t0 = time.perf_counter()
    _, qat_path = models.tfmot_qat(name, folder)
    print(f"tfmot QAT {name} saved: {qat_path} ({time.perf_counter() - t0:.1f}s)")

    eigen = tf_reference(qat_path, False, steps, batch)
    onednn_file = os.path.join(folder, "onednn.pkl")
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--tf-reference",
                    os.pathsep.join([qat_path, onednn_file])] + (["--quick"] if args.quick
                                                                  else ["--steps", str(steps)]),
                   check=True, env=env)
    with open(onednn_file, "rb") as f:
        onednn = pickle.load(f)
    port = torch_steps(qat_path, eigen["xs"], eigen["cs"])
    from tfgrad.qat import load_plan

    plan, _ = load_plan(qat_path)
    range_names = {x for n in plan.nodes for _, q in n.quantizers()
                   for x in (q.min_name, q.max_name)}
    ranges = {i for i, (_, w) in enumerate(plan.weights()) if w.name in range_names}
    print("\nafter step  PyTorch vs TF-Eigen                   TF-oneDNN vs TF-Eigen")
    print("            step's max|dy|  variables  ranges    step's max|dy|  variables  ranges")
    for s in range(steps):
        a = distance(port[s], eigen["steps"][s], ranges)
        b = distance(onednn["steps"][s], eigen["steps"][s], ranges)
        print(f"{s + 1:10d}  {a[0]:<14.3g}  {a[1]:3d}/{a[2]:<5d}  {a[3]:3d}/{a[4]:<4d}  "
              f"{b[0]:<14.3g}  {b[1]:3d}/{b[2]:<5d}  {b[3]:3d}/{b[4]}")
    print("(variables and range variables not bit-identical to TF-Eigen after the step)")

    trained = os.path.join(folder, f"{name}_torch_trained.h5")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    t0 = time.perf_counter()
    mp.spawn(ddp_worker, args=(free_port, qat_path, trained, eigen["xs"], eigen["cs"]),
             nprocs=WORLD, join=True)
    print(f"\nDDP on {WORLD} processes: {steps} steps in {time.perf_counter() - t0:.1f}s, "
          f"written back to {trained}")

    import tensorflow as tf
    import torch

    import tfgrad.torch.qat as tq

    k = models.load_tf(trained)
    m = tq.load_keras(trained).eval()
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, *models.input_shape(k))).astype(np.float32)
    mine = m(torch.from_numpy(x)).detach().numpy()
    theirs = k(x, training=False).numpy()
    print(f"reloaded in TF: eval outputs max|TF - port| = {np.abs(mine - theirs).max():.3g}")

    converter = tf.lite.TFLiteConverter.from_keras_model(k)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    tflite = converter.convert()
    with open(os.path.join(folder, f"{name}.tflite"), "wb") as f:
        f.write(tflite)
    with warnings.catch_warnings():  # tf.lite.Interpreter's deprecation in favour of LiteRT
        warnings.simplefilter("ignore")
        interp = tf.lite.Interpreter(model_content=tflite)
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    interp.resize_tensor_input(inp["index"], list(x.shape))
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], x)
    interp.invoke()
    lite = interp.get_tensor(out["index"])
    agree = float((lite.argmax(-1) == mine.argmax(-1)).mean())
    print(f"TFLite int8: top-1 agrees with the port's eval forward on {agree:.1%} of "
          f"{len(x)} inputs; max|dy| {np.abs(lite - mine).max():.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
