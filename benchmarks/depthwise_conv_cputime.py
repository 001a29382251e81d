"""Single-thread CPU time of tfgrad vs TF (default oneDNN build) at the benchmark shapes.

    python benchmarks/depthwise_conv_cputime.py

On a shared machine wall-clock timings mostly measure the scheduler. This runs each
framework in its own subprocess on one thread (NUMBA_NUM_THREADS=1; TF intra- and
inter-op parallelism 1) and reports the process CPU time (``time.process_time``, all
threads counted), the minimum over repeats: how much work each implementation does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_CHILD = r"""
import json, os, sys, time
import numpy as np
from tfgrad.testing.cases.depthwise_conv import BENCHES
which = sys.argv[1]
if which == "tf":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
else:
    import tfgrad
out = {}
for b in BENCHES:
    kw = b.make(np.random.default_rng(0), False)
    if which == "tf":
        t = {k: tf.constant(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        op = getattr(tf.raw_ops, b.name)
        fn = lambda: op(**t)
    else:
        op = getattr(tfgrad.raw_ops, b.name)
        fn = lambda: op(**kw)
    fn()
    ts = []
    for _ in range(7):
        t0 = time.process_time(); fn(); ts.append(time.process_time() - t0)
    out[b.name + " " + b.shape] = 1e3 * min(ts)
print(json.dumps(out))
"""


def _run(which: str) -> dict[str, float]:
    env = dict(os.environ, NUMBA_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3",
               OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _CHILD, which],
                         env=env, check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ours, tf = _run("tfgrad"), _run("tf")
    print("| op | case | tfgrad CPU ms | TF CPU ms | TF / tfgrad |")
    print("|---|---|---|---|---|")
    for k in ours:
        op, case = k.split(" ", 1)
        print(f"| {op} | {case} | {ours[k]:.2f} | {tf[k]:.2f} | {tf[k] / ours[k]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
