"""One training step of a tfmot QAT MobileNetV2 (alpha 0.35, 32x32, 10 classes; with
``--smoke`` the small CNN of tfgrad.testing.qat): tfmot's
own step in TF (a tf.function: forward, GradientTape, SGD) against the same model loaded
by tfgrad.torch.qat (eager: one autograd node per forward, and layer by layer; and
torch.compile) and tfgrad.jax.qat (jit).

    python benchmarks/qat_step.py [--smoke] [--batch 32] [--json FILE]

TF runs in subprocesses, one per build (Eigen: TF_ENABLE_ONEDNN_OPTS=0; TF's default
oneDNN build), as the variable is read at TF's import; JAX in one of its own, without
torch. Each figure is the median (and
range) of the per-step wall times after warm-up steps; loss ``sum(y * c)``, SGD lr 0.05.
Needs tf_keras and tensorflow-model-optimization (the test extra) to build the model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np


def _times(step: Callable[[], object], warm: int, n: int) -> dict[str, float]:
    for _ in range(warm):
        step()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts)}


def _batch(path: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
    from tfgrad.testing.qat import file_batch

    return file_batch(path, batch)


def tf_child(path: str, batch: int, warm: int, n: int) -> dict[str, float]:
    import tensorflow as tf

    from tfgrad.testing import qat as models

    k = models.load_tf(path, onednn=os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "0")
    x, c = _batch(path, batch)
    lr = tf.constant(0.05)

    @tf.function
    def step(x: tf.Tensor, c: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(k(x, training=True) * c)
        for v, g in zip(k.trainable_weights, tape.gradient(loss, k.trainable_weights)):
            v.assign_sub(lr * g)

    return _times(lambda: step(x, c), warm, n)


def torch_rows(path: str, batch: int, warm: int, n: int, compiled: bool) -> dict[str, dict]:
    import torch

    import tfgrad.torch.qat as tq

    x, c = (torch.from_numpy(a) for a in _batch(path, batch))
    lr = torch.tensor(0.05)
    rows = {}
    names = ("eager", "eager, layer by layer", "compiled") if compiled else ("eager",)
    for name in names:
        m = tq.load_keras(path).train()
        m.fused = name != "eager, layer by layer"  # (compiled: the program as one operator)
        run = torch.compile(m) if name == "compiled" else m
        # (the parameters listed once, as an optimizer holds them: walking the module
        # tree each step cost ~1 ms; the update in torch's foreach ops, as its optimizers
        # run theirs: TF's p - lr * g, a product then a difference, the same bits as
        # p.sub_(lr * p.grad) per parameter)
        params = list(m.parameters())

        def step(run: Callable = run, params: list = params) -> None:
            (run(x) * c).sum().backward()
            with torch.no_grad():
                torch._foreach_sub_(params, torch._foreach_mul([p.grad for p in params], lr))
            for p in params:
                p.grad = None

        rows[f"tfgrad.torch.qat ({name})"] = _times(step, warm + (2 if compiled else 0), n)
    return rows


def jax_rows(path: str, batch: int, warm: int, n: int) -> dict[str, dict]:
    import jax
    import jax.numpy as jnp

    import tfgrad.jax as tj
    import tfgrad.jax.qat as jq

    m = jq.load_keras(path)
    x, c = (jnp.asarray(a) for a in _batch(path, batch))

    def loss(params: dict, state: dict) -> tuple[jax.Array, dict]:
        y, new = m.apply({"params": params, "state": state}, x, training=True)
        return jnp.sum(y * c), new["state"]

    def make_step() -> Callable[[dict], dict]:
        @jax.jit  # traced anew per implementation (use_impl is read at trace time)
        def step(v: dict) -> dict:
            g, state = jax.grad(loss, has_aux=True)(v["params"], v["state"])
            params = jax.tree_util.tree_map(lambda p, d: p - jnp.float32(0.05) * d,
                                            v["params"], g)
            return {"params": params, "state": state}

        return step

    rows = {}
    fused = m.fused  # (one callback each way, where the model allows it)
    runs = [("exact", "exact", fused), ("native", "native", fused)]
    if fused:
        runs.insert(1, ("exact", "exact, a callback per op", False))
    for impl, label, one_callback in runs:
        m.fused = one_callback
        with tj.use_impl(impl):
            step = make_step()
            box = [{"params": m.variables["params"], "state": m.variables["state"]}]

            def run(step: Callable = step, box: list = box) -> None:
                box[0] = step(box[0])
                jax.block_until_ready(box[0])

            rows[f"tfgrad.jax.qat (jit, {label})"] = _times(run, warm, n)
    m.fused = fused
    return rows


def measure(smoke: bool = False, batch: int = 32, model: str = "mobilenet_v2"
            ) -> dict[str, dict]:
    warm, n = (1, 2) if smoke else (3, 15)
    folder = tempfile.mkdtemp(prefix="tfgrad-qat-bench-")
    path = os.path.join(folder, f"{model}_qat.h5")
    subprocess.run([sys.executable, __file__, "--build", path, "--model", model], check=True,
                   env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0"))
    rows: dict[str, dict] = {}
    for label, flag in (("tfmot in TF (Eigen)", "0"), ("tfmot in TF (oneDNN, default)", "1")):
        out = subprocess.run([sys.executable, __file__, "--tf", path, "--batch", str(batch),
                              "--n", str(n), "--warm", str(warm)], check=True,
                             capture_output=True, text=True,
                             env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS=flag))
        rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
    rows.update(torch_rows(path, batch, warm, n, compiled=not smoke))
    # JAX in a process of its own, as a JAX user runs it: in this torch process Numba's
    # regions would run in torch's OpenMP team (tfgrad._compile.wake_us)
    out = subprocess.run([sys.executable, __file__, "--jax", path, "--batch", str(batch),
                          "--n", str(n), "--warm", str(warm)], check=True,
                         capture_output=True, text=True)
    rows.update(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def report(rows: dict[str, dict], model: str, batch: int) -> None:
    ref = rows["tfmot in TF (Eigen)"]["median_ms"]
    print(f"QAT {model} training step, batch {batch} (ms: median [min, max]; ratio to "
          "tfmot in TF-Eigen)")
    width = max(map(len, rows))
    for name, r in rows.items():
        print(f"  {name:{width}s} {r['median_ms']:9.1f} [{r['min_ms']:.1f}, {r['max_ms']:.1f}]"
              f"  {r['median_ms'] / ref:5.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="two steps each, no compile (CI)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--model", default=None, help="a tfgrad.testing.qat model (default "
                   "mobilenet_v2; cnn with --smoke)")
    p.add_argument("--json", help="also write the results as JSON")
    p.add_argument("--build", help=argparse.SUPPRESS)
    p.add_argument("--tf", help=argparse.SUPPRESS)
    p.add_argument("--jax", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=15, help=argparse.SUPPRESS)
    p.add_argument("--warm", type=int, default=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.build:
        from tfgrad.testing import qat as models

        k = models.keras()
        k.utils.set_random_seed(0)
        q = models.tfmot().quantization.keras.quantize_model(models.MODELS[args.model](k))
        q.save(args.build)
        return 0
    if args.tf:
        print(json.dumps(tf_child(args.tf, args.batch, args.warm, args.n)))
        return 0
    if args.jax:
        print(json.dumps(jax_rows(args.jax, args.batch, args.warm, args.n)))
        return 0
    model = args.model or ("cnn" if args.smoke else "mobilenet_v2")
    rows = measure(args.smoke, args.batch, model)
    report(rows, model, args.batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
