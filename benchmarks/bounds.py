"""What the speed targets ask, against what this machine allows any implementation.

``python benchmarks/bounds.py [--smoke] [--family NAME] [--rounds K] [--json FILE]``

For every benchmark of ``run.py`` that has a PyTorch equivalent, measured alternately in
one process (medians of K rounds):

- tfgrad's time and PyTorch's;
- the **streaming bound**: a kernel that does nothing but read each of the op's inputs
  once and write an output of the op's size once, on every thread, in whole vectors,
  with non-temporal stores. No implementation of the op moves fewer bytes, so none is
  faster (the bytes are the benchmark's own ``nbytes``);
- for the depthwise ops, the **arithmetic bound**: the op's multiply-adds done as TF's
  Eigen kernel does them (a rounded multiply, then an add: no FMA, which tfgrad must
  reproduce bit for bit) at this machine's measured peak rate of vector multiplies and
  adds with operands from L1.

"1.5x faster than PyTorch" can be met only where PyTorch's time / 1.5 is at least the
larger bound; the ``torch/1.5`` and ``bound`` columns say whether it is. ``x floor`` in
``run.py`` divides by a single-threaded copy; ``x bound`` here by the streaming bound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba import prange, uint64

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import run  # noqa: E402

from tfgrad.kernels._simd import (  # noqa: E402
    aligned_empty,
    vadd,
    vload,
    vmul,
    vstore,
    vstore_nt,
    vzeros,
)
from tfgrad.testing import FAMILIES, harness  # noqa: E402

_L = 16  # float32 lanes of a _simd vector
_CHUNK = 64 * _L  # floats of the L1 block that mac_rate reads (4 KiB)


_TASKS = 4096  # parallel tasks of the streaming kernel


@numba.njit(inline="always", error_model="numpy")
def _read_part(a, k, acc):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Add task k's share of a (whole vectors) to acc."""
    n = a.size // _L
    for v in range(k * n // _TASKS, (k + 1) * n // _TASKS):
        acc = vadd(acc, vload(a, uint64(v * _L)))
    return acc


@numba.njit(parallel=True, error_model="numpy")
def _stream(a, b, c, out, sink):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Read a, b and c once and write out once (non-temporal stores of a vector the
    compiler cannot turn into a memset), each task its share of every array: inputs and
    output stream at the same time, as in a fused kernel."""
    n = out.size // _L
    for k in prange(_TASKS):
        acc = _read_part(c, k, _read_part(b, k, _read_part(a, k, vzeros(a))))
        vstore(sink, uint64(k * _L), acc)
        vec = vload(sink, uint64(0))
        for v in range(k * n // _TASKS, (k + 1) * n // _TASKS):
            vstore_nt(out, uint64(v * _L), vec)


@numba.njit(parallel=True, error_model="numpy")
def _mul_add(a: np.ndarray, n: int, tasks: int, sink: np.ndarray) -> None:  # pragma: no cover
    """n steps of four independent acc = acc + x * w (16 lanes each; x from a 4 KiB L1
    block, w in registers) per task: 64 multiply-adds a step, without FMA."""
    for t in prange(tasks):
        w = vload(a, uint64(0))
        a0 = a1 = a2 = a3 = vzeros(a)
        for s in range(n):
            i = uint64((s * 4 * _L) % (_CHUNK - 4 * _L))
            a0 = vadd(a0, vmul(vload(a, i), w))
            a1 = vadd(a1, vmul(vload(a, i + uint64(_L)), w))
            a2 = vadd(a2, vmul(vload(a, i + uint64(2 * _L)), w))
            a3 = vadd(a3, vmul(vload(a, i + uint64(3 * _L)), w))
        vstore(sink, uint64(_L * t), vadd(vadd(a0, a1), vadd(a2, a3)))


def _flat(nbytes: int) -> np.ndarray:
    """A 64-byte aligned float32 buffer of nbytes rounded up to whole vectors."""
    n = -(-nbytes // (4 * _L)) * _L
    a = aligned_empty((n,), np.dtype(np.float32))
    a[:] = 1
    return a


def mac_rate(smoke: bool) -> float:
    """Multiply-adds per second, all threads: the best of a few runs."""
    a = _flat(4 * _CHUNK)
    tasks = 4 * numba.get_num_threads()
    sink = np.empty(_L * tasks, np.float32)
    n = 1000 if smoke else 200_000
    _mul_add(a, 10, tasks, sink)
    best = min(_timed(lambda: _mul_add(a, n, tasks, sink)) for _ in range(3 if smoke else 7))
    return 64 * n * tasks / best


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _big_inputs(kw: dict[str, Any]) -> list[np.ndarray]:
    """The op's tensor inputs (not its per-channel vectors, filters or sizes: arrays of
    at least 1/16 the largest input's elements)."""
    arrays = [v for v in kw.values() if isinstance(v, np.ndarray)]
    most = max((a.size for a in arrays), default=0)
    return [a for a in arrays if 16 * a.size >= most]


def _streaming(b: harness.Bench, kw: dict[str, Any]) -> Any:
    """A closure that reads the op's large inputs once and writes the rest of its bytes."""
    big = _big_inputs(kw)
    if len(big) > 3:
        raise ValueError(f"{b.name}: more than three large inputs")
    ins = [_flat(a.nbytes) for a in big] + [_flat(0)] * (3 - len(big))
    out = _flat(b.nbytes(kw) - sum(a.nbytes for a in big))
    sink = np.zeros(_TASKS * _L, np.float32)
    return lambda: _stream(*ins, out, sink)


def _macs(b: harness.Bench, kw: dict[str, Any]) -> int | None:
    """The multiply-adds of a depthwise op (one per output element and tap), else None."""
    if not b.name.startswith("DepthwiseConv2dNative"):
        return None
    if "filter" in kw:
        fh, fw, C, M = kw["filter"].shape
    else:
        fh, fw, C, M = (int(v) for v in kw["filter_sizes"])
    g = kw.get("out_backprop")
    if g is None:
        x = kw["input"]
        _, H, W, _ = x.shape
        s, pad = kw["strides"][1], kw["padding"]
        from tfgrad._tf.depthwise import window

        oh, _ = window("bounds", H, fh, s, 1, pad, (0, 0))
        ow, _ = window("bounds", W, fw, s, 1, pad, (0, 0))
        return x.shape[0] * oh * ow * C * M * fh * fw
    return g.size * fh * fw


def measure(benches: list[harness.Bench], smoke: bool, rounds: int,
            rate: float) -> list[dict[str, Any]]:
    """One row per benchmark; ``rate``: multiply-adds per second (mac_rate)."""
    import tfgrad

    torch = harness.torch_module()
    if torch is not None:
        torch.set_num_threads(os.cpu_count() or 1)
    repeat, min_time = (2, 0.0) if smoke else (7, 0.1)
    cases = []
    for b in benches:
        kw = harness.place(b.make(np.random.default_rng(0), smoke))  # (on a line, as run.py)
        op = getattr(tfgrad.raw_ops, b.name)
        calls = {"tfgrad_ms": (lambda op=op, kw=kw: op(**kw)), "stream_ms": _streaming(b, kw)}
        if torch is not None and b.torch is not None:
            calls["torch_ms"] = b.torch(kw)
        cases.append((b, kw, calls))
    rows = []
    for b, kw, calls in cases:
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(max(1, rounds)):  # alternate, so a slow phase hits every column
            for k, fn in calls.items():
                times[k].append(1e3 * harness.time_it(fn, repeat=repeat, min_time=min_time))
        row: dict[str, Any] = {"op": b.name, "case": b.shape}
        row.update({k: statistics.median(v) for k, v in times.items()})
        macs = _macs(b, kw)
        if macs:
            row["arith_ms"] = 1e3 * macs / rate
        row["bound_ms"] = max(row["stream_ms"], row.get("arith_ms", 0.0))
        row["x_bound"] = row["tfgrad_ms"] / row["bound_ms"]
        if "torch_ms" in row:
            row["torch_over_1_5_ms"] = row["torch_ms"] / 1.5
            row["reachable"] = row["torch_over_1_5_ms"] >= row["bound_ms"]
        rows.append(row)
        print(f"  {b.name} {b.shape}: bound {row['bound_ms']:.3f} ms", file=sys.stderr)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    cols = [("op", "op", "{}"), ("case", "case", "{}"), ("tfgrad_ms", "tfgrad ms", "{:.3f}"),
            ("torch_ms", "torch ms", "{:.3f}"), ("torch_over_1_5_ms", "torch/1.5", "{:.3f}"),
            ("stream_ms", "stream ms", "{:.3f}"), ("arith_ms", "arith ms", "{:.3f}"),
            ("x_bound", "x bound", "{:.2f}"), ("reachable", "1.5x torch reachable", "{}")]
    return harness.render_table(rows, cols)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one quick run each")
    p.add_argument("--family", action="append", choices=FAMILIES)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians")
    p.add_argument("--json", help="also write the results as JSON")
    args = p.parse_args(argv)
    benches = run.benches(args.family or list(FAMILIES))
    rate = mac_rate(args.smoke)
    rows = measure(benches, args.smoke, 1 if args.smoke else args.rounds, rate)
    env = dict(harness.environment(), mac_rate_G_per_s=round(rate / 1e9, 1))
    print("\n".join(f"{k}: {v}" for k, v in env.items()) + "\n\n" + table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
