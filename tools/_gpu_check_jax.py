"""The JAX part of tools/gpu_check.py: the native path on JAX's default backend (a GPU)
against the exact CPU kernels, and one training step timed with each implementation.

    python tools/_gpu_check_jax.py [--platform cpu] [--per-op N]

1. Every case of tests/cases through ``tfgrad.jax.raw_ops.<Op>``, jitted on the default
   device under ``use_impl("native")`` (``jax_enable_x64`` on, for the float64 and int64
   cases), against ``tfgrad.raw_ops.<Op>`` (the exact kernels, on the host), within each
   family's ``BOUNDS`` (``tfgrad.jax._native.<family>``); the largest distance per op,
   output and dtype.
2. The backend's float32 division and square root against IEEE's (NumPy's) on 4M random
   operands, and ``tfgrad.jax._native._ieee.div_rn`` (the native ops' division), which must
   be IEEE's for every normal quotient.
3. One jitted training step of examples/jax_sharded_qat.py's model (batch 64, one device)
   with ``use_impl("native")`` and with ``use_impl("exact")`` (host callbacks), median of
   repeated runs.

``run(report)`` appends markdown to ``report`` and raises AssertionError if an output is
beyond its bound. ``--platform cpu`` runs the same on the CPU backend (to keep this
script working without a GPU; the CI tests cover that ground).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))


def check_cases(report: list[str], per_op: int | None = None) -> list[str]:
    """Every case natively on the default device; the failures."""
    import jax

    import tfgrad
    import tfgrad.jax as tj
    from tests.cases import CASES
    from tfgrad import _distance, _validate, raw_ops

    worst: dict[tuple[str, str, str], tuple[float, float]] = {}
    failures: list[str] = []
    seen: dict[str, int] = {}
    with jax.enable_x64(True), tj.use_impl("native"):
        for case in CASES:
            seen[case.op] = seen.get(case.op, 0) + 1
            if per_op is not None and seen[case.op] > per_op:
                continue
            op = tfgrad.get_op_def(case.op)
            bounds = importlib.import_module(f"tfgrad.jax._native.{op.family}").BOUNDS
            kwargs = case.kwargs()
            bound = _validate.bind(op, kwargs)  # the adapter casts nothing
            arrays = {i.name: jax.device_put(bound[i.name]) for i in op.inputs
                      if not i.is_shape}
            rest = {k: v for k, v in kwargs.items() if k not in arrays}
            want = getattr(raw_ops, case.op)(**kwargs)
            try:
                got = jax.jit(lambda a, op=case.op, rest=rest: getattr(tj.raw_ops, op)(
                    **a, **rest))(arrays)
            except Exception as e:  # noqa: BLE001 (reported, then the next case)
                failures.append(f"{case.id}: {type(e).__name__}: {e}")
                continue
            gots = got if isinstance(got, tuple) else (got,)
            wants = want if isinstance(want, tuple) else (want,)
            for o, g, w in zip(op.outputs, gots, wants):
                g, w = np.asarray(g), np.asarray(w)
                dt = _validate.dtype_name(w.dtype)
                b = bounds[case.op][o.name][dt]
                if g.shape != w.shape or g.dtype != w.dtype:
                    failures.append(f"{case.id} {o.name}: {g.dtype}{g.shape} != "
                                    f"{w.dtype}{w.shape}")
                    continue
                d = 0.0 if _distance.bit_identical(g, w) else _distance.distance(g, w)
                key = (case.op, o.name, dt)
                worst[key] = (max(worst.get(key, (0.0, b))[0], d), b)
                if d > b:
                    failures.append(f"{case.id} {o.name} ({dt}): {d:g} > {b:g}")
    device = jax.devices()[0]
    report.append(f"## JAX native on {device.platform} ({device.device_kind}), jax "
                  f"{jax.__version__}: every case against the exact CPU kernels\n")
    report.append("| op | output | dtype | largest distance | bound |")
    report.append("|---|---|---|---|---|")
    for (op_name, out, dt), (d, b) in sorted(worst.items()):
        cell = "bit-identical" if d == 0 else f"{d:g}"
        report.append(f"| {op_name} | {out} | {dt} | {cell} | "
                      f"{'bit-identical' if b == 0 else f'{b:g}'} |")
    report.append(f"\n{len(failures)} failure(s)" + (":" if failures else "."))
    report.extend(f"- {f}" for f in failures[:50])
    report.append("")
    return failures


def check_division(report: list[str]) -> list[str]:
    """The backend's division and square root against IEEE's; div_rn must be IEEE's."""
    import jax

    from tfgrad.jax._native._ieee import div_rn

    rng = np.random.default_rng(0)
    n = 1 << 22

    def floats(lo: int, hi: int) -> np.ndarray:
        e = rng.integers(lo, hi + 1, n).astype(np.uint32) << 23
        s = rng.integers(0, 2, n).astype(np.uint32) << 31
        return (s | e | rng.integers(0, 1 << 23, n).astype(np.uint32)).view(np.float32)

    a, b = floats(64, 190), floats(64, 190)
    v = np.abs(floats(100, 150))
    with np.errstate(all="ignore"):
        want = a / b
    root = np.sqrt(v)
    rows = [("a / b", jax.jit(lambda a, b: a / b)(a, b), want),
            ("div_rn(a, b)", jax.jit(div_rn)(a, b), want),
            ("sqrt(v)", jax.jit(jax.numpy.sqrt)(v), root)]
    report.append(f"## float32 arithmetic on {jax.devices()[0].platform}: {n} random operands "
                  "against IEEE's (normal results)\n")
    report.append("| operation | results not IEEE's |")
    report.append("|---|---|")
    failures = []
    for name, got, ieee in rows:
        normal = np.abs(ieee) >= np.finfo(np.float32).tiny  # (XLA:CPU flushes denormals)
        differ = int((np.asarray(got).view(np.uint32) != ieee.view(np.uint32))[normal].sum())
        report.append(f"| {name} | {differ} |")
        if name.startswith("div_rn") and differ:
            failures.append(f"div_rn: {differ} quotients not IEEE's")
    report.append("")
    return failures


def time_step(report: list[str], repeats: int = 20) -> None:
    """One jitted training step of the example's model, native and exact."""
    import jax
    import jax_sharded_qat as ex

    import tfgrad.jax as tj

    params, state = ex.init(jax.random.PRNGKey(0))
    x, y = ex.blobs(jax.random.PRNGKey(1), 64)
    report.append("## JAX: one training step of examples/jax_sharded_qat.py (batch 64)\n")
    report.append("| implementation | median ms | compile + first run s |")
    report.append("|---|---|---|")
    for impl in ("native", "exact"):
        with tj.use_impl(impl):
            step = jax.jit(ex.train_step)
            t0 = time.perf_counter()
            jax.block_until_ready(step(params, state, x, y))
            first = time.perf_counter() - t0
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(step(params, state, x, y))
                samples.append(time.perf_counter() - t0)
        report.append(f"| {impl} | {1e3 * statistics.median(samples):.2f} | {first:.1f} |")
    report.append("")


def run(report: list[str], per_op: int | None = None) -> None:
    failures = check_cases(report, per_op) + check_division(report)
    time_step(report)
    assert not failures, f"{len(failures)} JAX native case(s) beyond their bounds"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--platform", help="JAX platform to run on (e.g. cpu); default: JAX's")
    p.add_argument("--per-op", type=int, help="only the first N cases of each op")
    args = p.parse_args()
    if args.platform:
        import jax

        jax.config.update("jax_platforms", args.platform)
    report: list[str] = []
    try:
        run(report, args.per_op)
    finally:
        print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
