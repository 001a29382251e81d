"""Single-thread CPU-time benchmark of the batch-norm ops: tfgrad, TF 2.21, PyTorch.

    python benchmarks/batch_norm_bench_cpu.py [--repeat 7]

On a shared machine wall-clock timings of multi-threaded code are dominated by the other
processes. This measures the CPU time of one thread per framework (process time, best of
``--repeat`` calls), which the load hardly disturbs: tfgrad with NUMBA_NUM_THREADS=1, TF
(its default oneDNN build, or the Eigen kernels with TF_ENABLE_ONEDNN_OPTS=0) with one
intra-op thread, torch with one thread. The floor is the CPU time of reading and writing
the bytes the op must move (np.copyto of the same number of bytes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["NUMBA_NUM_THREADS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def cpu_ms(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return 1e3 * best


def _row(b, tf, tfgrad, repeat: int) -> str:  # type: ignore[no-untyped-def]
    kw = b.make(np.random.default_rng(0), False)
    t_ours = cpu_ms(lambda: getattr(tfgrad.raw_ops, b.name)(**kw), repeat)
    tkw = {k: tf.constant(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    op = getattr(tf.raw_ops, b.name)
    t_tf = cpu_ms(lambda: op(**tkw), repeat)
    t_torch = cpu_ms(b.torch(kw), repeat)
    n = b.nbytes(kw) // 2  # a copy of n bytes reads n and writes n
    src = np.ones(n // 4, np.float32)
    dst = np.empty_like(src)
    floor = cpu_ms(lambda: np.copyto(dst, src), repeat)
    return (f"{b.name} | {b.shape} | {t_ours:.2f} | {t_tf:.2f} | {t_tf / t_ours:.2f}x | "
            f"{t_torch:.2f} | {t_torch / t_ours:.2f}x | {floor:.2f} | {t_ours / floor:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    import tensorflow as tf
    import torch

    import tfgrad
    from tfgrad.testing.cases import batch_norm as bb

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    torch.set_num_threads(1)
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1 (default)")
    print(f"single thread, CPU time (best of {args.repeat}); TF_ENABLE_ONEDNN_OPTS={onednn}")
    head = ("op", "case", "tfgrad ms", "TF ms", "vs TF", "torch ms", "vs torch", "floor ms",
            "x floor")
    print(" | ".join(head))
    for b in bb.BENCHES:
        print(_row(b, tf, tfgrad, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
