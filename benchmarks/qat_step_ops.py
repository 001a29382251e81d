"""One tfmot QAT training step op by op: TF-Eigen's ops (TF's profiler) against
tfgrad.torch.qat's raw-op calls, in one process, in turn.

    python benchmarks/qat_step_ops.py [--smoke] [--model M] [--rounds 3] [--steps 10]
                                      [--json FILE]

The steps are benchmarks/qat_step.py's: tfmot's `tf.function` step in TF (its Eigen
kernels: ``TF_ENABLE_ONEDNN_OPTS=0``) and tfgrad.torch.qat's eager one-node step (torch on
one thread). Each round runs TF's steps plain (wall time), then under ``tf.profiler``
(each op kernel an event ``<node>:<OpType>`` on the host plane, summed per op type), then
tfgrad's plain, then with a timer around each raw-op call of its program
(``tfgrad._api.run_rest``; a layer's: ``run``) and each quantizer's batch range and update
(``Program._update_range``; TF's counterpart: the Min and Max ops). Medians over the rounds,
ms a step. TF runs two ops at a time on two cores: its per-op sums can exceed its step
(its busy time, the union of the ops' intervals, is printed too). What the two sums leave
of each step is the time outside the ops: the program's own Python and torch's side for
tfgrad, TF's executor for TF. benchmarks/RESULTS.md holds the runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

RANGES = "(batch range + update)"
"""tfgrad's row for the quantizers' batch ranges and range updates; TF's: Min + Max."""


def _tf_ops(logdir: str, steps: int) -> tuple[dict[str, list[float]], float]:
    """{op type: [ms, calls] a step} of the profile in ``logdir``, and the ops' busy time
    (the union of their intervals) a step, ms."""
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2  # type: ignore[no-redef]

    path = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path[-1]).read_bytes())
    host = next(p for p in space.planes if p.name == "/host:CPU")
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    spans = []
    for line in host.lines:
        for e in line.events:
            name = host.event_metadata[e.metadata_id].name
            node, _, kind = name.rpartition(":")
            if not node or "::" in name or not kind.isidentifier():
                continue  # (not an op kernel: TF's own scopes and threads)
            ops[kind][0] += e.duration_ps / 1e9 / steps
            ops[kind][1] += 1 / steps
            t0 = line.timestamp_ns * 1000 + e.offset_ps
            spans.append((t0, t0 + e.duration_ps))
    busy, start, end = 0, 0, -1
    for a, b in sorted(spans):
        if a <= end:
            end = max(end, b)
            continue
        busy += end - start if end >= 0 else 0
        start, end = a, b
    busy += end - start if end >= 0 else 0
    return dict(ops), busy / 1e9 / steps


def measure(path: str, batch: int, rounds: int, steps: int) -> dict:
    import tensorflow as tf
    import torch

    torch.set_num_threads(1)
    import qat_step

    from tfgrad import _api
    from tfgrad.qat import _exec

    tf_step = qat_step.tf_step(path, batch)
    tg_step = qat_step.torch_step(path, batch, "eager")
    for _ in range(3):
        tf_step()
        tg_step()
    timed: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    run, run_rest, update = _api.run, _api.run_rest, _exec.Program._update_range
    depth = [0]  # (a call inside a timed one is not timed again)

    def timer(name: str, fn: Callable, *args: object) -> object:
        if depth[0]:
            return fn(*args)
        depth[0] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            depth[0] -= 1
            timed[name][0] += time.perf_counter() - t0
            timed[name][1] += 1

    def timed_run(op: object, arguments: dict, key: object = _api._NO) -> object:
        return timer(op.name, run, op, arguments, key)  # type: ignore[attr-defined]

    def timed_rest(name: str, rest: Callable, kwargs: dict) -> object:
        return timer(name, run_rest, name, rest, kwargs)

    def timed_update(*args: object) -> None:
        timer(RANGES, update, *args)

    per_round = []
    for _ in range(rounds):
        tf_wall = qat_step._times(tf_step, 0, steps)["median_ms"]
        logdir = tempfile.mkdtemp(prefix="tfgrad-qat-ops-")
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(steps):
                tf_step()
        finally:
            tf.profiler.experimental.stop()
        tf_ops, tf_busy = _tf_ops(logdir, steps)
        tg_wall = qat_step._times(tg_step, 0, steps)["median_ms"]
        timed.clear()
        # (the fused program calls its ops through run_rest, the layers through run)
        _api.run, _api.run_rest = timed_run, timed_rest
        _exec.Program._update_range = staticmethod(timed_update)
        try:
            for _ in range(steps):
                tg_step()
        finally:
            _api.run, _api.run_rest = run, run_rest
            _exec.Program._update_range = staticmethod(update)
        tg_ops = {k: [v[0] * 1e3 / steps, v[1] / steps] for k, v in timed.items()}
        per_round.append({"tf_step_ms": tf_wall, "tf_busy_ms": tf_busy, "tf_ops": tf_ops,
                          "tfgrad_step_ms": tg_wall, "tfgrad_ops": tg_ops})
    return {"rounds": per_round, **_medians(per_round)}


def _medians(per_round: list[dict]) -> dict:
    """Each figure's median over the rounds (an op absent from a round counts 0 there)."""
    def med(key: str) -> float:
        return statistics.median(r[key] for r in per_round)

    def ops(key: str) -> dict[str, list[float]]:
        names = {n for r in per_round for n in r[key]}
        return {n: [statistics.median(r[key].get(n, [0, 0])[i] for r in per_round)
                    for i in (0, 1)] for n in names}

    return {"tf_step_ms": med("tf_step_ms"), "tf_busy_ms": med("tf_busy_ms"),
            "tfgrad_step_ms": med("tfgrad_step_ms"), "tf_ops": ops("tf_ops"),
            "tfgrad_ops": ops("tfgrad_ops")}


def report(res: dict) -> None:
    tf_ops, tg_ops = dict(res["tf_ops"]), dict(res["tfgrad_ops"])
    ranges = [0.0, 0.0]
    for kind in ("Min", "Max"):  # (tfmot's batch ranges)
        ms, calls = tf_ops.pop(kind, (0.0, 0.0))
        ranges = [ranges[0] + ms, ranges[1] + calls]
    tf_ops[RANGES] = ranges
    shared = sorted(set(tg_ops) & set(tf_ops),
                    key=lambda n: tg_ops[n][0] - tf_ops[n][0])
    print(f"TF-Eigen step {res['tf_step_ms']:.1f} ms (its ops busy {res['tf_busy_ms']:.1f}), "
          f"tfgrad.torch.qat eager step {res['tfgrad_step_ms']:.1f} ms; ms a step (calls)")
    width = max(map(len, [*shared, *tg_ops, "op"]))
    print(f"  {'op':{width}s} {'TF-Eigen':>16s} {'tfgrad':>16s} {'tfgrad - TF':>12s}")
    for n in shared:
        (a, ca), (b, cb) = tf_ops[n], tg_ops[n]
        print(f"  {n:{width}s} {a:9.2f} ({ca:4.0f}) {b:9.2f} ({cb:4.0f}) {b - a:+12.2f}")
    for n in sorted(set(tg_ops) - set(tf_ops)):
        print(f"  {n:{width}s} {'':>16s} {tg_ops[n][0]:9.2f} ({tg_ops[n][1]:4.0f})")
    rest = sorted(set(tf_ops) - set(tg_ops), key=lambda n: -tf_ops[n][0])
    tf_only = sum(tf_ops[n][0] for n in rest)
    print(f"  TF only ({', '.join(rest[:8])}{', ...' if len(rest) > 8 else ''}): "
          f"{tf_only:.2f} ms")
    tf_sum = sum(v[0] for v in tf_ops.values())
    tg_sum = sum(v[0] for v in tg_ops.values())
    print(f"  sums: TF {tf_sum:.1f} ms (busy {res['tf_busy_ms']:.1f}), tfgrad {tg_sum:.1f} ms; "
          f"outside tfgrad's ops: {res['tfgrad_step_ms'] - tg_sum:.1f} ms a step")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="the small CNN, one round of two "
                   "steps (CI)")
    p.add_argument("--model", default=None, help="a tfgrad.testing.qat model (default "
                   "mobilenet_v2; cnn with --smoke)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="steps a phase")
    p.add_argument("--json", help="also write the results as JSON")
    args = p.parse_args(argv)
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # (before TF's import: its Eigen kernels)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import qat_step

    rounds, steps = (1, 2) if args.smoke else (args.rounds, args.steps)
    res = measure(qat_step.build(args.model or ("cnn" if args.smoke else "mobilenet_v2")),
                  args.batch, rounds, steps)
    report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
