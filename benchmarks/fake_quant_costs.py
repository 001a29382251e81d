"""Measure the Eigen cost constants of the fake-quant gradient sums on TF 2.21.

    python benchmarks/fake_quant_costs.py

TF's Eigen full reducer splits a sum across its intra-op threads when its cost model
says so: threads = int((n * cost - 1e5) / 1e5 + 0.9). With 2 threads the split starts
where n * cost >= 2.1e5. This script finds that n by bisection (comparing TF's sum with
the 1- and 2-shard models of tfgrad._tf.eigen) for the Vars gradient (a flat sum)
and the PerChannel gradient (a sum over a matrix chip), and prints the implied cost per
value. TF 2.21 gives n = 50150 and n = 44801 (44800, a multiple of 16, sums the same
either way), consistent with costs of exactly 67/16 and 75/16 per value (thresholds 50150
and 44800): tfgrad.ops.fake_quant.COST_FLAT and COST_CHIP.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

from tfgrad._tf.eigen import sharded_sum  # noqa: E402

F32 = np.float32


def shards_used(tf, n: int, chip: bool, rng: np.random.Generator) -> set[int]:
    """The shard counts (1 or 2) whose model reproduces TF's dmax on random data."""
    fits = {1, 2}
    for _ in range(3):
        g = rng.standard_normal(n).astype(F32)
        if chip:  # every value above the range: dmax is the column's sum
            out = tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
                gradients=np.repeat(g[:, None], 3, 1), inputs=np.full((n, 3), 5, F32),
                min=-np.ones(3, F32), max=np.ones(3, F32))
            got = out[2].numpy()[1]
        else:
            out = tf.raw_ops.FakeQuantWithMinMaxVarsGradient(
                gradients=g, inputs=np.full(n, 5, F32), min=F32(-1), max=F32(1))
            got = out[2].numpy()
        fits &= {k for k in (1, 2) if sharded_sum(g, k) == got}
    return fits


def threshold(tf, chip: bool, lo: int = 20001, hi: int = 80001) -> int:
    """Smallest n that TF sums in 2 shards, skipping the sizes where one and two shards
    are the same computation (n a multiple of 16: the shard boundary is the tree's split)."""
    rng = np.random.default_rng(0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits = shards_used(tf, mid, chip, rng)
        while fits == {1, 2}:  # both models agree on this size: try a neighbour
            mid += 1
            if mid >= hi:  # (lo, hi) holds only sizes where 1 and 2 shards sum alike
                return hi
            fits = shards_used(tf, mid, chip, rng)
        if not fits:
            raise SystemExit(f"neither shard model reproduces TF at n = {mid}")
        if fits == {2}:
            hi = mid
        else:
            lo = mid
    return hi


def main() -> int:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    for name, chip in (("flat (Vars gradient)", False), ("chip (PerChannel gradient)", True)):
        n = threshold(tf, chip)
        print(f"{name}: 2 shards from n = {n}; cost per value in "
              f"({2.1e5 / n:.6f}, {2.1e5 / (n - 2):.6f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
