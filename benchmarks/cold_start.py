"""The demo's first run in a fresh Numba cache: "kernels ready" seconds and what compiled.

Each run is a new process with an empty ``NUMBA_CACHE_DIR`` that builds the demo's model
and takes its compile step (``tfgrad._cli.demo._compile``: one training step, one eval in
each mode), as ``python -m tfgrad demo`` does before training. Variants (source trees,
environment settings) run alternately, so that the machine's drift falls on each alike::

    python benchmarks/cold_start.py --pairs 3                      # this checkout
    python benchmarks/cold_start.py --variant base=/tmp/base/src \\
        --variant new=src --pairs 4                               # two trees, A/B
    python benchmarks/cold_start.py --variant on=src \\
        --variant off=src:TFGRAD_MALLOC=0                          # an environment A/B

It prints, per variant, the median wall seconds of the step and of the whole process,
and the compile CPU seconds of the top-level kernels by module (Numba's ``numba:compile``
events; a kernel's time includes the helpers it compiles). Issue #42 item 6's target is
20 s for "kernels ready" on 2 cores.
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
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
from numba.core import event
import numpy as np

depth = [0]
spans = []  # (top-level?, module.qualname, cpu seconds)

class Recorder(event.Listener):
    def on_start(self, ev):
        depth[0] += 1
        ev.data["_t"] = time.process_time()
        ev.data["_top"] = depth[0] == 1
    def on_end(self, ev):
        depth[0] -= 1
        fn = ev.data["dispatcher"].py_func
        spans.append((ev.data["_top"], f"{fn.__module__}.{fn.__qualname__}",
                      time.process_time() - ev.data["_t"]))

event.register("numba:compile", Recorder())
import tfgrad
from tfgrad._cli import demo
t_import = time.perf_counter() - t_start
rng = np.random.default_rng(0)
model = demo.build_model(rng, 8)
x = rng.random((4, 8, 8, 1), dtype=np.float32)
y = np.arange(4, dtype=np.int64)
ready = demo._compile(model, x, y)
print(json.dumps({"ready": ready, "import": t_import, "spans": spans,
                  "total": time.perf_counter() - t_start, "cpu": time.process_time()}))
"""


def run_once(src: Path, env_extra: dict[str, str], warm: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="tfgrad_cold_") as cache:
        env = dict(os.environ, PYTHONPATH=str(src), **env_extra)
        if not warm:
            env["NUMBA_CACHE_DIR"] = cache
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                             text=True, check=False)
    if out.returncode:
        raise SystemExit(f"child failed ({src}, {env_extra}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_variant(text: str) -> tuple[str, Path, dict[str, str]]:
    label, _, rest = text.partition("=")
    tree, *envs = rest.split(":")
    extra = dict(e.split("=", 1) for e in ",".join(envs).split(",") if e)
    return label, Path(tree or ROOT / "src").resolve(), extra


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", action="append", metavar="LABEL=SRC[:ENV=VAL,...]",
                   help="a source tree (its src/ folder) and environment settings; "
                   "repeatable (default: this checkout)")
    p.add_argument("--pairs", type=int, default=1, help="rounds over the variants")
    p.add_argument("--top", type=int, default=12, help="kernels listed per variant")
    p.add_argument("--json", metavar="PATH", help="write every run's numbers here")
    p.add_argument("--warm", action="store_true",
                   help="Numba's usual cache instead of an empty one (a smoke run: loads)")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in (args.variant or [f"this={ROOT / 'src'}"])]
    runs: dict[str, list[dict]] = defaultdict(list)
    for r in range(args.pairs):
        for label, src, extra in variants:
            t0 = time.perf_counter()
            res = run_once(src, extra, args.warm)
            runs[label].append(res)
            print(f"round {r + 1} {label}: kernels ready {res['ready']:.1f} s, process "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
    for label, _, _ in variants:
        rs = runs[label]
        ready = [r["ready"] for r in rs]
        print(f"\n{label}: kernels ready median {statistics.median(ready):.1f} s "
              f"[{min(ready):.1f}, {max(ready):.1f}], import "
              f"{statistics.median(r['import'] for r in rs):.1f} s, process CPU "
              f"{statistics.median(r['cpu'] for r in rs):.1f} s")
        by: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            acc: dict[str, float] = defaultdict(float)
            for top, name, s in r["spans"]:
                if top:
                    acc[name] += s
            for name, s in acc.items():
                by[name].append(s)
        total = sum(statistics.median(v) for v in by.values())
        print(f"  top-level compiles: {total:.1f} CPU s in {len(by)} kernels")
        for name, v in sorted(by.items(), key=lambda kv: -statistics.median(kv[1]))[:args.top]:
            print(f"  {statistics.median(v):6.2f}  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
