"""A/B of two trees' kernels in one process: ``python benchmarks/ab_inprocess.py --base REV
[--family NAME] [--op NAME] [--rounds K] [--calls N] [--threads T] [--null]``.

The base revision's package is copied (``git archive``) under another name,
``tfgrad_base``, and each benchmark of the family registry (``BENCHES``) runs through
both ``raw_ops`` on the same arrays, the calls alternated, the order swapped every round;
CPU time per call. Per round the ratio of the two medians (new / base); reported: the
median ratio with the rounds' range, and the ratio of the fastest calls. The outputs
must be the same bits. On a VM whose speed drifts between processes (the Intel Xeon of
benchmarks/RESULTS.md: single processes 0.4-2.7x apart), process pairs resolve ~10%;
in one process base against itself (``--null``) gives 0.99-1.01.

The copy lives in ``~/.cache/tfgrad-ab/<commit>`` (its Numba cache beside it, kept for
the next run). What the copy cannot share with this checkout: its kernels are compiled
apart, each tree's thread pool is its own.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def materialize(rev: str, name: str) -> Path:
    """The package of ``rev`` as ``<cache>/<commit>/<name>``; returns the folder above it."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", rev + "^{commit}"],
                         check=True, capture_output=True, text=True).stdout.strip()
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    top = home / "tfgrad-ab" / sha
    dest = top / name
    if not dest.exists():
        top.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=top) as tmp:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "src/tfgrad"],
                                     check=True, capture_output=True).stdout
            tar = Path(tmp) / "src.tar"
            tar.write_bytes(archive)
            with tarfile.open(tar) as t:
                t.extractall(tmp, filter="data")
            pkg = Path(tmp) / "src" / "tfgrad"
            # (older trees imported their op modules by absolute name)
            for f in ("_api.py", "_shapes.py"):
                p = pkg / f
                p.write_text(p.read_text().replace('f"tfgrad.ops.', 'f"{__package__}.ops.'))
            shutil.move(str(pkg), str(dest))
    return top


def equal_bits(a: Any, b: Any) -> bool:
    import numpy as np

    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(equal_bits(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def compare(fns: tuple[Any, Any], rounds: int, calls: int) -> dict[str, float]:
    for f in fns + fns:
        f()
    ratios, best = [], [float("inf"), float("inf")]
    for r in range(rounds):
        samples: list[list[float]] = [[], []]
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for _ in range(calls):
            for k in order:
                t = time.process_time()
                fns[k]()
                samples[k].append(time.process_time() - t)
        ratios.append(statistics.median(samples[1]) / statistics.median(samples[0]))
        best = [min(best[k], min(samples[k])) for k in range(2)]
    return {"base_ms": best[0] * 1e3, "ratio": statistics.median(ratios), "lo": min(ratios),
            "hi": max(ratios), "min_ratio": best[1] / best[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="HEAD", help="the base revision (default HEAD)")
    p.add_argument("--family", action="append", help="families (default depthwise_conv)")
    p.add_argument("--op", help="only this op's benchmarks")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--calls", type=int, default=20, help="calls per round and side")
    p.add_argument("--threads", type=int, default=1, help="Numba threads (default 1)")
    p.add_argument("--null", action="store_true",
                   help="base against a second copy of base: the method's own spread")
    p.add_argument("--smoke", action="store_true", help="the benchmarks' small shapes")
    args = p.parse_args(argv)
    os.environ["NUMBA_NUM_THREADS"] = str(args.threads)  # (before numba is imported)

    import importlib

    import numpy as np

    sys.path.insert(0, str(materialize(args.base, "tfgrad_base")))
    base = importlib.import_module("tfgrad_base.raw_ops")
    if args.null:
        sys.path.insert(0, str(materialize(args.base, "tfgrad_null")))
        new = importlib.import_module("tfgrad_null.raw_ops")
    else:
        new = importlib.import_module("tfgrad.raw_ops")
    from tfgrad.testing import harness, load

    modules, problems = load(args.family or ["depthwise_conv"])
    if problems:
        raise SystemExit("\n".join(problems))
    print(f"new = {'a copy of the base' if args.null else new.__file__}, base = "
          f"{base.__file__}; {args.threads} thread(s), {args.rounds} rounds x {args.calls}"
          " calls")
    for bench in (b for m in modules.values() for b in m.BENCHES):
        if args.op and bench.name != args.op:
            continue
        kw = harness.place(bench.make(np.random.default_rng(0), args.smoke))
        fb, fn = getattr(base, bench.name), getattr(new, bench.name)
        if not equal_bits(fb(**kw), fn(**kw)):
            print(f"{bench.name} {bench.shape}: the outputs differ", flush=True)
            continue
        r = compare((functools.partial(fb, **kw), functools.partial(fn, **kw)), args.rounds,
                    args.calls)
        print(f"{bench.name:42s} {bench.shape:34s} base {r['base_ms']:8.3f} ms  new/base "
              f"{r['ratio']:.3f} [{r['lo']:.3f}-{r['hi']:.3f}]  fastest {r['min_ratio']:.3f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
