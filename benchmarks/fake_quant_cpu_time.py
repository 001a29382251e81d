"""CPU time per call of the fake-quant benchmarks, for machines shared with other work.

    OMP_WAIT_POLICY=passive python benchmarks/fake_quant_cpu_time.py [--threads N]

Wall-clock timings (benchmarks/run.py) on a machine whose cores are busy with other
processes measure the scheduler more than the kernels. The process CPU time (all threads,
user + system) that one call consumes is much less sensitive to that: this script reports
it, for tfgrad and for TF (whose threads are counted too), next to the median wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numba
import numpy as np

import tfgrad
from tfgrad.testing.cases.fake_quant import BENCHES
from tfgrad.testing.harness import _default_tf, tf_module


def measure(fn, repeat: int = 9) -> tuple[float, float]:
    """Median (cpu ms, wall ms) per call after a warm-up call."""
    fn()
    cpu, wall = [], []
    for _ in range(repeat):
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return 1e3 * statistics.median(cpu), 1e3 * statistics.median(wall)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=numba.get_num_threads())
    args = p.parse_args()
    numba.set_num_threads(args.threads)
    tf = tf_module()
    print(f"numba threads: {args.threads}")
    head = ("op", "tfgrad cpu", "wall", "TF cpu", "wall", "cpu ratio")
    print("{:42s} {:>10s} {:>8s} {:>9s} {:>8s} {:>9s}".format(*head))
    for b in BENCHES:
        kw = b.make(np.random.default_rng(0), False)
        fn = getattr(tfgrad.raw_ops, b.name)
        ours = measure(lambda: fn(**kw))  # noqa: B023
        theirs = measure(_default_tf(tf, b.name, kw)) if tf else (float("nan"),) * 2
        print(f"{b.name:42s} {ours[0]:10.2f} {ours[1]:8.2f} {theirs[0]:9.2f} {theirs[1]:8.2f} "
              f"{theirs[0] / ours[0]:8.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
