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

    python benchmarks/qat_step.py --interleave [--rounds 7]

runs TF-Eigen's step, tfgrad.torch.qat's (eager, compiled) and tfgrad.jax.qat's (exact)
each in a process of its own, all alive at once and each idle while another runs, in
rounds of 15 steps each, the order turned every round, and reports each one's ratio to
TF-Eigen per round (median and range): on a VM whose speed drifts from minute to minute
by a third, runs one after another cannot resolve the ratio.
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


def tf_step(path: str, batch: int) -> Callable[[], object]:
    import tensorflow as tf

    from tfgrad.testing import qat as models

    k = models.load_tf(path, onednn=os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "0")
    x, c = (tf.constant(a) for a in _batch(path, batch))
    lr = tf.constant(0.05)

    @tf.function
    def step(x: tf.Tensor, c: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(k(x, training=True) * c)
        for v, g in zip(k.trainable_weights, tape.gradient(loss, k.trainable_weights)):
            v.assign_sub(lr * g)

    return lambda: step(x, c)


def tf_child(path: str, batch: int, warm: int, n: int) -> dict[str, float]:
    return _times(tf_step(path, batch), warm, n)


def torch_step(path: str, batch: int, name: str) -> Callable[[], None]:
    """A step of the model loaded by tfgrad.torch.qat: ``name`` "eager", "eager, layer by
    layer" or "compiled" (the program as one operator)."""
    import torch

    import tfgrad.torch.qat as tq

    x, c = (torch.from_numpy(a) for a in _batch(path, batch))
    lr = torch.tensor(0.05)
    m = tq.load_keras(path).train()
    m.fused = name != "eager, layer by layer"
    run = torch.compile(m) if name == "compiled" else m
    # (the parameters listed once, as an optimizer holds them: walking the module tree
    # each step cost ~1 ms; the update in torch's foreach ops, as its optimizers run
    # theirs: TF's p - lr * g, a product then a difference, the same bits as
    # p.sub_(lr * p.grad) per parameter)
    params = list(m.parameters())

    def step() -> None:
        (run(x) * c).sum().backward()
        with torch.no_grad():
            torch._foreach_sub_(params, torch._foreach_mul([p.grad for p in params], lr))
        for p in params:
            p.grad = None

    return step


def torch_rows(path: str, batch: int, warm: int, n: int, compiled: bool) -> dict[str, dict]:
    names = ("eager", "eager, layer by layer", "compiled") if compiled else ("eager",)
    return {f"tfgrad.torch.qat ({name})": _times(torch_step(path, batch, name),
                                                 warm + (2 if compiled else 0), n)
            for name in names}


SERVED = {"tfmot in TF (Eigen)": "tf", "tfgrad.torch.qat (eager)": "torch-eager",
          "tfgrad.torch.qat (compiled)": "torch-compiled",
          "tfgrad.jax.qat (jit, exact)": "jax-exact"}


def serve(kind: str, path: str, batch: int, warm: int) -> None:
    """One implementation's step in a process of its own: "ready" once warm, then for
    each line n on stdin, n steps and their wall times (ms, JSON) on stdout."""
    if kind == "tf":
        step = tf_step(path, batch)
    elif kind.startswith("torch"):
        step = torch_step(path, batch, "compiled" if kind == "torch-compiled" else "eager")
    else:
        step = jax_step(path, batch, "exact", fused=True)
    for _ in range(warm + 2):
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        ts = []
        for _ in range(int(line)):
            t0 = time.perf_counter()
            step()
            ts.append((time.perf_counter() - t0) * 1e3)
        print(json.dumps(ts), flush=True)


def interleaved(path: str, batch: int, warm: int, n: int, rounds: int,
                names: list[str]) -> dict[str, dict]:
    """Each implementation's step in a process of its own (TF-Eigen: TF_ENABLE_ONEDNN_OPTS
    =0), alive throughout and idle while another runs: ``rounds`` rounds of n steps each,
    the order turned every round; per implementation the median step of each round and
    its ratio to TF-Eigen's in the same round."""
    procs = {}
    for name in names:
        env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0")
        procs[name] = subprocess.Popen(
            [sys.executable, __file__, "--serve", SERVED[name], path, "--batch", str(batch),
             "--warm", str(warm)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env)
    per: dict[str, list[float]] = {name: [] for name in names}
    try:
        for name, proc in procs.items():
            while (line := proc.stdout.readline()) and line.strip() != "ready":
                pass
            if not line:
                raise SystemExit(f"{name}: its process ended before its step was ready")
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                procs[name].stdin.write(f"{n}\n")
                procs[name].stdin.flush()
                per[name].append(statistics.median(json.loads(procs[name].stdout.readline())))
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    ref = per[names[0]]
    rows = {}
    for name, ms in per.items():
        ratios = [a / b for a, b in zip(ms, ref)]
        rows[name] = {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
                      "ratio": statistics.median(ratios), "ratio_min": min(ratios),
                      "ratio_max": max(ratios)}
    return rows


def jax_step(path: str, batch: int, impl: str, fused: bool) -> Callable[[], None]:
    """A jitted step of the model under ``use_impl(impl)``, one callback each way where
    ``fused`` and the model allows it; traced (and run once) before it is returned."""
    import jax
    import jax.numpy as jnp

    import tfgrad.jax as tj
    import tfgrad.jax.qat as jq

    m = jq.load_keras(path)
    m.fused = m.fused and fused
    x, c = (jnp.asarray(a) for a in _batch(path, batch))

    def loss(params: dict, state: dict) -> tuple[jax.Array, dict]:
        y, new = m.apply({"params": params, "state": state}, x, training=True)
        return jnp.sum(y * c), new["state"]

    @jax.jit
    def step(v: dict) -> dict:
        g, state = jax.grad(loss, has_aux=True)(v["params"], v["state"])
        params = jax.tree_util.tree_map(lambda p, d: p - jnp.float32(0.05) * d,
                                        v["params"], g)
        return {"params": params, "state": state}

    box = [{"params": m.variables["params"], "state": m.variables["state"]}]

    def run() -> None:
        box[0] = step(box[0])
        jax.block_until_ready(box[0])

    with tj.use_impl(impl):  # (read when the step is traced)
        run()
    return run


def jax_rows(path: str, batch: int, warm: int, n: int) -> dict[str, dict]:
    import tfgrad.jax.qat as jq

    fused = jq.load_keras(path).fused  # (one callback each way, where the model allows it)
    runs = [("exact", "exact", True), ("native", "native", True)]
    if fused:
        runs.insert(1, ("exact", "exact, a callback per op", False))
    return {f"tfgrad.jax.qat (jit, {label})": _times(jax_step(path, batch, impl, one), warm, n)
            for impl, label, one in runs}


def build(model: str) -> str:
    """tfmot's ``quantize_model`` of the tfgrad.testing.qat model ``model``, saved (.h5) in
    a new folder by a process of its own (TF's Eigen kernels); the file's path."""
    path = os.path.join(tempfile.mkdtemp(prefix="tfgrad-qat-bench-"), f"{model}_qat.h5")
    subprocess.run([sys.executable, __file__, "--build", path, "--model", model], check=True,
                   env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0"))
    return path


def measure(smoke: bool = False, batch: int = 32, model: str = "mobilenet_v2"
            ) -> dict[str, dict]:
    warm, n = (1, 2) if smoke else (3, 15)
    path = build(model)
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
    inter = "ratio" in rows["tfmot in TF (Eigen)"]
    print(f"QAT {model} training step, batch {batch} (ms: median [min, max]; ratio to "
          f"tfmot in TF-Eigen{', per round [range]' if inter else ''})")
    width = max(map(len, rows))
    for name, r in rows.items():
        ratio = (f"{r['ratio']:5.2f}x [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]"
                 if "ratio" in r else f"{r['median_ms'] / ref:5.2f}x")
        print(f"  {name:{width}s} {r['median_ms']:9.1f} [{r['min_ms']:.1f}, {r['max_ms']:.1f}]"
              f"  {ratio}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="two steps each, no compile (CI)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--model", default=None, help="a tfgrad.testing.qat model (default "
                   "mobilenet_v2; cnn with --smoke)")
    p.add_argument("--json", help="also write the results as JSON")
    p.add_argument("--interleave", action="store_true",
                   help="TF-Eigen and tfgrad.torch.qat in one process, steps in turn")
    p.add_argument("--rounds", type=int, default=7, help="rounds with --interleave")
    p.add_argument("--build", help=argparse.SUPPRESS)
    p.add_argument("--tf", help=argparse.SUPPRESS)
    p.add_argument("--jax", help=argparse.SUPPRESS)
    p.add_argument("--serve", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
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
    if args.serve:
        serve(args.serve[0], args.serve[1], args.batch, args.warm)
        return 0
    model = args.model or ("cnn" if args.smoke else "mobilenet_v2")
    if args.interleave:
        path = build(model)
        warm, n = (1, 2) if args.smoke else (3, 15)
        names = list(SERVED)[:2] if args.smoke else list(SERVED)
        rows = interleaved(path, args.batch, warm, n, max(1, args.rounds), names)
    else:
        rows = measure(args.smoke, args.batch, model)
    report(rows, model, args.batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
