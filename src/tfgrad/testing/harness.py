"""Benchmark harness: time one op in tfgrad, TensorFlow and PyTorch in the same run.

A :class:`Bench` says how to build the op's inputs and how to call it in each framework;
``run`` times every available implementation (median of repeats after warm-up), measures
the machine's copy bandwidth once and reports each op against the memory-traffic floor:
the bytes the op must read and write divided by that bandwidth.

TensorFlow is imported as installed: its default build (oneDNN on), unless the caller set
TF_ENABLE_ONEDNN_OPTS=0 first. The header of every report says which.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Bench:
    name: str
    """Op name (as in tf.raw_ops)."""
    shape: str
    """Human description of the case (shape, attrs)."""
    make: Callable[[np.random.Generator, bool], dict[str, Any]]
    """Builds the raw_ops kwargs; the flag asks for the small smoke-mode size."""
    nbytes: Callable[[dict[str, Any]], int]
    """Bytes the op must read and write at the least (inputs read once, outputs written once)."""
    torch: Callable[[dict[str, Any]], Callable[[], Any]] | None = None
    """Returns a zero-argument closure running PyTorch's closest equivalent."""
    tf: Callable[[dict[str, Any]], Callable[[], Any]] | None = None
    """Returns a closure running TF; default: tf.raw_ops.<name> on tf constants."""


def tf_module() -> Any | None:
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return tf


def torch_module() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def time_it(fn: Callable[[], Any], *, repeat: int = 7, min_time: float = 0.05) -> float:
    """Median seconds per call: warm up, then ``repeat`` samples of >= min_time each."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_time / once))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def time_interleaved(fns: dict[str, Callable[[], Any]], *, repeat: int = 7,
                     min_time: float = 0.05) -> dict[str, float]:
    """Median seconds per call of each closure, their samples taken in turn (a, b, c, a, b,
    c, ...) rather than one after another: a VM whose memory speed drifts over minutes
    (RESULTS.md, the two phases) then slows every implementation alike, not just the one
    that happened to run during a slow spell."""
    inner = {}
    for k, fn in fns.items():
        fn()
        t0 = time.perf_counter()
        fn()
        inner[k] = max(1, int(min_time / max(time.perf_counter() - t0, 1e-7)))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner[k]):
                fn()
            samples[k].append((time.perf_counter() - t0) / inner[k])
    return {k: statistics.median(v) for k, v in samples.items()}


_BANDWIDTH: float | None = None


def copy_bandwidth(nbytes: int = 256 * 2**20) -> float:
    """Measured bytes per second of a large array copy (read + write both counted)."""
    global _BANDWIDTH
    if _BANDWIDTH is None:
        a = np.ones(nbytes // 8)
        b = np.empty_like(a)
        t = time_it(lambda: np.copyto(b, a), repeat=5, min_time=0.2)
        _BANDWIDTH = 2 * a.nbytes / t
    return _BANDWIDTH


def array_bytes(*arrays: Any) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays))


def _default_tf(tf: Any, name: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    kw = {k: tf.constant(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    op = getattr(tf.raw_ops, name)
    return lambda: op(**kw)


def place(kwargs: dict[str, Any], offset: int = 0) -> dict[str, Any]:
    """kwargs with every array input copied to ``offset`` bytes past a 64-byte line.

    TF runs on ``tf.constant`` copies, which its allocator puts on a 64-byte line; tfgrad
    and PyTorch (``torch.from_numpy``) run on these very buffers. ``offset=0`` gives all
    three inputs on a line, the same start TF's kernels get. A large NumPy allocation
    starts 16 bytes past one (glibc's mmap header), and there every 64-byte vector load
    spans two lines: ``--offset 16`` measures that case (depthwise 3x3 up to 1.3x slower
    in tfgrad; see benchmarks/RESULTS.md)."""
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, np.ndarray) and v.ndim > 0:
            raw = np.empty(v.nbytes + 64 + offset, np.uint8)
            start = -raw.ctypes.data % 64 + offset
            a = raw[start:start + v.nbytes].view(v.dtype).reshape(v.shape)
            a[...] = v
            v = a
        out[k] = v
    return out


def run_bench(b: Bench, *, smoke: bool = False, seed: int = 0, offset: int = 0,
              interleave: bool = False) -> dict[str, Any]:
    import tfgrad

    kwargs = place(b.make(np.random.default_rng(seed), smoke), offset)
    fn = getattr(tfgrad.raw_ops, b.name)
    repeat, min_time = (2, 0.0) if smoke else (7, 0.1)
    fns: dict[str, Callable[[], Any]] = {"tfgrad": lambda: fn(**kwargs)}
    tf = tf_module()
    if tf is not None:
        fns["tf"] = b.tf(kwargs) if b.tf else _default_tf(tf, b.name, kwargs)
    torch = torch_module()
    if torch is not None and b.torch is not None:
        torch.set_num_threads(os.cpu_count() or 1)
        fns["torch"] = b.torch(kwargs)
    if interleave:
        secs = time_interleaved(fns, repeat=repeat, min_time=min_time)
    else:
        secs = {k: time_it(f, repeat=repeat, min_time=min_time) for k, f in fns.items()}
    row: dict[str, Any] = {"op": b.name, "case": b.shape}
    for k, t in secs.items():
        row[f"{k}_ms"] = 1e3 * t
    for k in ("tf", "torch"):
        if k in secs:
            row[f"speedup_vs_{k}"] = secs[k] / secs["tfgrad"]
    floor_ms = 1e3 * b.nbytes(kwargs) / copy_bandwidth(16 * 2**20 if smoke else 256 * 2**20)
    row["floor_ms"] = floor_ms
    row["x_floor"] = row["tfgrad_ms"] / floor_ms
    return row


def merge_rounds(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per benchmark from several rounds of the whole suite: the median of each
    time, ratios of those medians, and the range of each round's own ratio (on a shared
    VM one round can be 30% off; the spread shows how far)."""
    merged = []
    for rows in zip(*rounds):
        row: dict[str, Any] = {"op": rows[0]["op"], "case": rows[0]["case"],
                               "rounds": len(rows)}
        for k in ("tfgrad_ms", "tf_ms", "torch_ms", "floor_ms"):
            if k in rows[0]:
                row[k] = statistics.median(r[k] for r in rows)
        for k, num, den in (("speedup_vs_tf", "tf_ms", "tfgrad_ms"),
                            ("speedup_vs_torch", "torch_ms", "tfgrad_ms"),
                            ("x_floor", "tfgrad_ms", "floor_ms")):
            if num in row:
                row[k] = row[num] / row[den]
                each = [r[num] / r[den] for r in rows]
                row[k + "_range"] = [min(each), max(each)]
        merged.append(row)
    return merged


def environment() -> dict[str, Any]:
    import numba

    import tfgrad

    env = {
        "machine": platform.machine(),
        "processor": tfgrad._config.cpu_name(),
        "cores": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "tfgrad": tfgrad.__version__,
        "copy_bandwidth_GBps": None,
    }
    tf = tf_module()
    if tf is not None:
        env["tensorflow"] = tf.__version__
        env["tf_onednn"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1 (default)")
    torch = torch_module()
    if torch is not None:
        env["torch"] = torch.__version__
    return env


def format_table(rows: list[dict[str, Any]]) -> str:
    cols = [("op", "op", "{}"), ("case", "case", "{}"), ("tfgrad_ms", "tfgrad ms", "{:.3f}"),
            ("tf_ms", "TF ms", "{:.3f}"), ("speedup_vs_tf", "vs TF", "{:.2f}x"),
            ("torch_ms", "torch ms", "{:.3f}"), ("speedup_vs_torch", "vs torch", "{:.2f}x"),
            ("floor_ms", "floor ms", "{:.3f}"), ("x_floor", "x floor", "{:.2f}")]
    if rows and "speedup_vs_tf_range" in rows[0]:  # merged rounds: add each ratio's range
        cols.insert(5, ("speedup_vs_tf_range", "range", "{0[0]:.2f}-{0[1]:.2f}"))
        cols.insert(8, ("speedup_vs_torch_range", "range", "{0[0]:.2f}-{0[1]:.2f}"))
        cols.append(("x_floor_range", "range", "{0[0]:.2f}-{0[1]:.2f}"))
    return render_table(rows, cols)


def render_table(rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> str:
    """Aligned text columns: (key, title, format) each; "-" where a row lacks the key."""
    table = [[title for _, title, _ in cols]]
    for r in rows:
        table.append([fmt.format(r[k]) if k in r else "-" for k, _, fmt in cols])
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(rows: list[dict[str, Any]], env: dict[str, Any], path: str | None) -> str:
    env = dict(env, copy_bandwidth_GBps=round(copy_bandwidth() / 1e9, 2))
    text = "\n".join(f"{k}: {v}" for k, v in env.items()) + "\n\n" + format_table(rows)
    if path:
        with open(path, "w") as f:
            json.dump({"environment": env, "results": rows}, f, indent=1)
    return text
