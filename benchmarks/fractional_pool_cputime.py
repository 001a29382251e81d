"""CPU time per call of the fractional pooling benchmarks, tfgrad vs TF, one thread each.

    python benchmarks/fractional_pool_cputime.py [--threads N]

On a shared, oversubscribed machine wall-clock timings of parallel code mostly measure
how long the OS leaves threads waiting. This measures the process CPU time per call
(median of repeats) with tfgrad's Numba pool and TF's intra-op pool limited to the same
number of threads (default 1): the work each implementation does, which is what the wall
time becomes on an idle machine. The benchmark cases are those of
tfgrad/testing/cases/fractional_pool.py (BENCHES).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def cpu_ms(fn, repeat: int = 9) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        samples.append(time.process_time() - t0)
    return 1e3 * statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.environ["NUMBA_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tfgrad
    from tfgrad.testing.cases import fractional_pool as B

    print(f"threads={args.threads}  TF {tf.__version__} "
          f"(TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')})")
    print(f"{'op':24s} {'case':40s} {'tfgrad cpu ms':>13s} {'TF cpu ms':>10s} {'ratio':>7s}")
    for b in B.BENCHES:
        kw = b.make(np.random.default_rng(0), False)
        fn = getattr(tfgrad.raw_ops, b.name)
        ours = cpu_ms(lambda fn=fn, kw=kw: fn(**kw))
        k = {key: tf.constant(v) if isinstance(v, np.ndarray) else v for key, v in kw.items()}
        op = getattr(tf.raw_ops, b.name)
        theirs = cpu_ms(lambda op=op, k=k: op(**k))
        print(f"{b.name:24s} {b.shape:40s} {ours:13.2f} {theirs:10.2f} {theirs / ours:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
