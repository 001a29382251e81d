"""``tfgrad bench``: time every op against TensorFlow and PyTorch, in one process.

The benchmark shapes are the families' ``BENCHES`` (``tfgrad.testing.cases.<family>``)
and the timing is ``tfgrad.testing.harness``'s, both shipped with the package. Each
number is the median of repeated runs after warm-up (``harness.time_it``); TensorFlow and
PyTorch are timed when importable and skipped otherwise. TensorFlow runs as installed
(its default oneDNN build) unless ``--tf-eigen``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .. import testing
from ..testing import FAMILIES
from ._common import CLIError, optional, out_dir, use_agg_backend

COLUMNS = ("op", "case", "tfgrad_ms", "tf_ms", "torch_ms", "speedup_vs_tf", "speedup_vs_torch",
           "floor_ms", "x_floor", "error")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench", help="time every op against TensorFlow and PyTorch (table, CSV/JSON, PNG)",
        description="Time every forward and gradient op at the benchmark shapes in tfgrad, "
        "TensorFlow and PyTorch (those installed), print a table with speed-ups and the "
        "fraction of the memory-traffic floor, and write it as CSV, JSON and a bar chart. "
        "TF and the chart need the 'bench' extra.")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes, few repeats: checks every benchmark runs (CI)")
    p.add_argument("--family", action="append", choices=FAMILIES, help="only this family")
    p.add_argument("--op", action="append", metavar="NAME", help="only this op (repeatable)")
    p.add_argument("--out", metavar="DIR", default="tfgrad-bench",
                   help="where bench.csv, bench.json and bench.png go (default ./tfgrad-bench)")
    p.add_argument("--no-tf", action="store_true", help="do not time TensorFlow")
    p.add_argument("--no-torch", action="store_true", help="do not time PyTorch")
    p.add_argument("--tf-eigen", action="store_true",
                   help="time TF's Eigen kernels (TF_ENABLE_ONEDNN_OPTS=0) instead of its "
                   "default oneDNN build")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--seed", type=int, default=0, help="seed of the benchmark inputs")
    return p


def load(families: list[str] | None) -> tuple[ModuleType, list[Any], list[str]]:
    """harness, the Bench list, and the problems met loading the family modules (one
    broken family does not hide the others)."""
    from ..testing import harness

    modules, problems = testing.load(families)
    return harness, [b for m in modules.values() for b in m.BENCHES], problems


def _time(harness: ModuleType, fn: Any, quick: bool) -> float:
    repeat, min_time = (2, 0.0) if quick else (7, 0.1)
    return 1e3 * harness.time_it(fn, repeat=repeat, min_time=min_time)


def measure(harness: ModuleType, b: Any, *, quick: bool, seed: int, tf: Any,
            torch: Any) -> dict[str, Any]:
    """One row: as ``harness.run_bench``, but a framework that fails is noted, not fatal."""
    import tfgrad

    row: dict[str, Any] = {"op": b.name, "case": b.shape}
    try:
        kwargs = b.make(np.random.default_rng(seed), quick)
        fn = getattr(tfgrad.raw_ops, b.name)
        row["tfgrad_ms"] = _time(harness, lambda: fn(**kwargs), quick)
    except Exception as e:
        row["error"] = f"tfgrad: {type(e).__name__}: {e}"
        return row
    errors = []
    if tf is not None:
        try:
            call = b.tf(kwargs) if b.tf else harness._default_tf(tf, b.name, kwargs)
            row["tf_ms"] = _time(harness, call, quick)
            row["speedup_vs_tf"] = row["tf_ms"] / row["tfgrad_ms"]
        except Exception as e:
            errors.append(f"TF: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    if torch is not None and b.torch is not None:
        try:
            torch.set_num_threads(os.cpu_count() or 1)
            row["torch_ms"] = _time(harness, b.torch(kwargs), quick)
            row["speedup_vs_torch"] = row["torch_ms"] / row["tfgrad_ms"]
        except Exception as e:
            errors.append(f"torch: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    floor_ms = 1e3 * b.nbytes(kwargs) / harness.copy_bandwidth(
        16 * 2**20 if quick else 256 * 2**20)
    row["floor_ms"] = floor_ms
    row["x_floor"] = row["tfgrad_ms"] / floor_ms if floor_ms > 0 else float("nan")
    if errors:
        row["error"] = "; ".join(errors)
    return row


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, ""))
                        for k in COLUMNS})


def plot(path: Path, rows: list[dict[str, Any]], env: dict[str, Any]) -> None:
    use_agg_backend()
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "tfgrad_ms" in r]
    if not rows:
        return
    labels = [f"{r['op']}\n{r['case']}" for r in rows]
    y = np.arange(len(rows))
    fig, (ax_s, ax_f) = plt.subplots(1, 2, figsize=(14, 2.6 + 0.42 * len(rows)), sharey=True,
                                     gridspec_kw={"width_ratios": [2, 1]},
                                     layout="constrained")
    h = 0.38
    for k, (key, name, color) in enumerate((("speedup_vs_tf", "vs TensorFlow", "tab:orange"),
                                            ("speedup_vs_torch", "vs PyTorch", "tab:red"))):
        vals = [r.get(key, np.nan) for r in rows]
        if not np.all(np.isnan(vals)):
            ax_s.barh(y + (k - 0.5) * h, vals, height=h, label=name, color=color)
    ax_s.axvline(1.0, color="k", lw=0.8)
    ax_s.set_xscale("log")
    ax_s.set(xlabel="speed-up of tfgrad (x, log scale; > 1 is faster)",
             title="tfgrad speed-up (median time ratio)")
    ax_s.set_yticks(y, labels, fontsize=7)
    ax_s.invert_yaxis()
    ax_s.legend(loc="lower right")
    ax_s.grid(axis="x", alpha=0.3, which="both")
    ax_f.barh(y, [r.get("x_floor", np.nan) for r in rows], color="tab:blue")
    ax_f.axvline(1.0, color="k", lw=0.8)
    ax_f.set_xscale("log")
    ax_f.set(xlabel="tfgrad time / memory-traffic floor", title="distance from the floor")
    ax_f.grid(axis="x", alpha=0.3, which="both")
    tf_build = env.get("tf_onednn", "")
    fig.suptitle(f"tfgrad {env.get('tfgrad')} on {env.get('processor')} "
                 f"({env.get('cores')} cores); TF {env.get('tensorflow', '-')} "
                 f"(TF_ENABLE_ONEDNN_OPTS={tf_build}), torch {env.get('torch', '-')}"
                 + ("\nQUICK MODE: tiny shapes, not the ones named; the timings mean nothing"
                    if str(env.get("mode", "")).startswith("quick") else ""),
                 fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.tf_eigen:
        if sys.modules.get("tensorflow") is not None:
            raise CLIError("--tf-eigen must be set before TensorFlow is imported")
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tfgrad

    names = []
    for o in args.op or []:
        try:
            names.append(tfgrad.get_op_def(o).name)
        except KeyError as e:
            raise CLIError(e.args[0]) from None
    families = args.family
    if names:
        families = sorted({tfgrad.OPS[n].family for n in names} & set(families or FAMILIES))
    harness, benches, problems = load(families)
    if names:
        benches = [b for b in benches if b.name in names]
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    covered = {b.name for b in benches}
    wanted = [o.name for o in tfgrad.OPS.values()
              if (not args.family or o.family in args.family)
              and (not names or o.name in names)]
    uncovered = [o for o in wanted if o not in covered]
    if args.list:
        for b in benches:
            print(f"{b.name:<44} {b.shape}")
        if uncovered:
            print(f"no benchmark for: {', '.join(uncovered)}")
        return 0
    if not benches:
        raise CLIError("no benchmarks to run" + (f" ({'; '.join(problems)})" if problems else ""))

    tf = None if args.no_tf else harness.tf_module()
    torch = None if args.no_torch else harness.torch_module()
    if tf is None and not args.no_tf:
        print("note: TensorFlow is not installed; its column is skipped "
              "(pip install 'tfgrad[bench]')", file=sys.stderr)
    if torch is None and not args.no_torch:
        print("note: PyTorch is not installed; its column is skipped "
              "(pip install 'tfgrad[torch]')", file=sys.stderr)
    rows = []
    t0 = time.perf_counter()
    for i, b in enumerate(benches, 1):
        row = measure(harness, b, quick=args.quick, seed=args.seed, tf=tf, torch=torch)
        rows.append(row)
        ms = f"{row['tfgrad_ms']:.3f} ms" if "tfgrad_ms" in row else "failed"
        print(f"[{i}/{len(benches)}] {b.name} {b.shape}: {ms}"
              + (f"  ({row['error']})" if "error" in row else ""), file=sys.stderr, flush=True)
    env = harness.environment()
    if tf is None:
        env.pop("tensorflow", None)
        env.pop("tf_onednn", None)
    if torch is None:
        env.pop("torch", None)
    env["copy_bandwidth_GBps"] = round(harness.copy_bandwidth() / 1e9, 2)
    env["mode"] = "quick (tiny shapes; timings not meaningful)" if args.quick else "full"
    env["seconds"] = round(time.perf_counter() - t0, 1)

    out = out_dir(args.out)
    write_csv(out / "bench.csv", rows)
    (out / "bench.json").write_text(json.dumps(
        {"environment": env, "results": rows, "uncovered_ops": uncovered,
         "load_problems": problems}, indent=1, default=float) + "\n")
    written = [out / "bench.csv", out / "bench.json"]
    if not args.no_plot:
        if optional("matplotlib") is None:
            print("note: matplotlib is not installed; no chart (pip install 'tfgrad[bench]')",
                  file=sys.stderr)
        else:
            plot(out / "bench.png", rows, env)
            written.append(out / "bench.png")
    print("\n".join(f"{k}: {v}" for k, v in env.items()))
    print()
    print(harness.format_table([r for r in rows if "tfgrad_ms" in r]))
    failed = [r for r in rows if "tfgrad_ms" not in r]
    notes = [r for r in rows if "tfgrad_ms" in r and "error" in r]
    for r in failed:
        print(f"FAILED {r['op']} {r['case']}: {r['error']}")
    for r in notes:
        print(f"note {r['op']} {r['case']}: {r['error']}")
    if uncovered:
        print(f"no benchmark for: {', '.join(uncovered)}")
    print("wrote " + ", ".join(map(str, written)))
    return 1 if failed else 0
