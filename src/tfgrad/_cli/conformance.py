"""``tfgrad conformance``: tfgrad against TensorFlow 2.21 on fresh random cases.

The cases come from the op-case table shipped with the package
(``tfgrad.testing.cases``: one ``Case`` per attr/dtype/format combination, whose
``make(rng)`` draws the inputs), and TF runs through ``tfgrad.testing.oracle``. Each
run draws new inputs from ``--seed``, runs them in tfgrad and in TF, and compares every
output: bit-identical, or within the ulps the case documents (``Case.ulps``). The
``ErrorCase`` entries check that tfgrad and TF reject the same malformed calls.

TF is imported with ``TF_ENABLE_ONEDNN_OPTS=0`` (its Eigen kernels, the reference
tfgrad reproduces). ``--onednn`` adds a second pass on TF's default oneDNN build, in a
subprocess (the variable is read when TF loads); that pass reports how far the oneDNN
kernels are from tfgrad but does not fail the run, as they are not the reference (their
numerics differ by design, and some malformed inputs abort the process, so error cases
are not run there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import testing
from ..testing import FAMILIES
from ._common import CLIError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "conformance", help="compare every op with TensorFlow 2.21 on fresh random cases",
        description="Draw fresh random cases for every op (all attrs, dtypes and formats of "
        "the op-case table), run them in tfgrad and in TensorFlow 2.21 and print a per-op "
        "table. Exit status 1 on any disagreement beyond the documented tolerances. Needs "
        "tensorflow-cpu==2.21.0 (pip install 'tfgrad[tf]').")
    p.add_argument("--cases", type=int, default=None, metavar="N",
                   help="random cases per op, spread over its attr/dtype/format variants "
                   "(default: 2 per variant)")
    p.add_argument("--op", action="append", metavar="NAME", help="only this op (repeatable)")
    p.add_argument("--family", action="append", choices=FAMILIES, help="only this family")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the random draws (default: a fresh one, printed)")
    p.add_argument("--impl", choices=("kernel", "reference"), default="kernel",
                   help="tfgrad implementation to check (default: the Numba kernels)")
    p.add_argument("--no-errors", action="store_true", help="skip the error cases")
    p.add_argument("--onednn", action="store_true",
                   help="also compare with TF's default oneDNN build (a subprocess; reported, "
                   "not failing)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="print every disagreement")
    p.add_argument("--tf-build", choices=("eigen", "onednn"), default="eigen",
                   help=argparse.SUPPRESS)  # internal: the oneDNN pass's subprocess
    return p


@dataclass
class OpStats:
    cases: int = 0
    identical: int = 0
    within: int = 0
    """Within the case's documented ulps (bit-identical ones included)."""
    max_ulp: int = 0
    max_abs: float = 0.0
    """Largest absolute difference from TF over finite elements."""
    failures: list[str] = field(default_factory=list)
    errors_total: int = 0
    errors_agreed: int = 0
    skipped: int = 0

    def ok(self) -> bool:
        return not self.failures


def load_cases(families: list[str] | None) -> tuple[list[Any], list[Any], list[str]]:
    """The Case and ErrorCase lists of these families, and the problems met loading them
    (one broken family does not hide the others)."""
    modules, problems = testing.load(families)
    cases = [c for m in modules.values() for c in m.CASES]
    errors = [c for m in modules.values() for c in m.ERROR_CASES]
    return cases, errors, problems


def plan(cases: list[Any], per_op: int | None, rng: np.random.Generator) -> list[tuple[Any, int]]:
    """(case, seed) draws: ``per_op`` per op round-robin over its variants (from a random
    start), or 2 per variant."""
    by_op: dict[str, list[Any]] = defaultdict(list)
    for c in cases:
        by_op[c.op].append(c)
    draws = []
    for variants in by_op.values():
        n = per_op if per_op is not None else 2 * len(variants)
        start = int(rng.integers(len(variants)))
        for i in range(n):
            draws.append((variants[(start + i) % len(variants)], int(rng.integers(2**32))))
    return draws


def _compare(oracle: Any, op: str, got: Any, want: Any, ulps: dict[str, int],
             names: list[str]) -> tuple[bool, bool, int, float, str]:
    """(bit-identical, within tolerance, max ulp distance, max abs difference, what
    differs)."""
    got, want = oracle.as_tuple(got), oracle.as_tuple(want)
    if len(got) != len(want):
        return False, False, 0, 0.0, f"{len(got)} outputs vs TF's {len(want)}"
    identical, within, worst, worst_abs, why = True, True, 0, 0.0, ""
    for name, a, e in zip(names, got, want):
        a, e = np.asarray(a), np.asarray(e)
        if a.dtype != e.dtype or a.shape != e.shape:
            return False, False, 0, 0.0, f"{name}: {a.dtype}{list(a.shape)} vs TF's " \
                f"{e.dtype}{list(e.shape)}"
        if a.size == 0:
            continue
        if a.dtype.kind in "iub":
            if (a != e).any():
                return False, False, 0, 0.0, f"{name}: {int((a != e).sum())} integers differ"
            continue
        d = oracle.ulp_distance(a, e)
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        nan = np.isnan(a.astype(np.float64)) & np.isnan(e.astype(np.float64))
        same = (np.ascontiguousarray(a).view(bits) == np.ascontiguousarray(e).view(bits)) | nan
        m = int(d.max())
        worst = max(worst, m)
        with np.errstate(all="ignore"):
            diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
        finite = np.isfinite(diff)
        if finite.any():
            worst_abs = max(worst_abs, float(diff[finite].max()))
        if not same.all():
            identical = False
        tol = ulps.get(name, 0)
        # No tolerance means the same bits (as the tests): -0.0 and +0.0 differ there.
        bad = ~same if tol == 0 else d > tol
        if bad.any():
            within = False
            why = why or f"{name}: {int(bad.sum())} of {a.size} beyond {tol} ulp " \
                f"(max {m}{', signed zeros' if m == 0 else ''})"
    return identical, within, worst, worst_abs, why


def check_cases(draws: list[tuple[Any, int]], impl: str, stats: dict[str, OpStats],
                verbose: bool) -> None:
    import tfgrad

    from ..testing import oracle

    for case, seed in draws:
        st = stats[case.op]
        if not case.live:
            st.skipped += 1
            continue
        st.cases += 1
        where = f"{case.id} seed {seed}"
        try:
            kwargs = case.kwargs(seed)
        except Exception as e:
            st.failures.append(f"{where}: drawing the case failed: {type(e).__name__}: {e}")
            continue
        try:
            want = oracle.expected(case, kwargs)
        except Exception as e:
            st.failures.append(f"{where}: TF raised {type(e).__name__}: "
                               f"{_first_line(e)}")
            continue
        try:
            with tfgrad.use_impl(impl):
                got = getattr(tfgrad.raw_ops, case.op)(**kwargs)
        except Exception as e:
            st.failures.append(f"{where}: tfgrad raised {type(e).__name__}: {_first_line(e)}")
            continue
        names = [o.name for o in tfgrad.get_op_def(case.op).outputs]
        identical, within, worst, worst_abs, why = _compare(oracle, case.op, got, want,
                                                            case.ulps, names)
        st.identical += identical
        st.within += within
        st.max_ulp = max(st.max_ulp, worst)
        st.max_abs = max(st.max_abs, worst_abs)
        if not within:
            st.failures.append(f"{where}: {why}")
        if verbose and not within:
            print(f"  DIFFERS {where}: {why}", file=sys.stderr)


def check_errors(error_cases: list[Any], impl: str, stats: dict[str, OpStats]) -> None:
    import tfgrad

    from ..testing import oracle

    for ec in error_cases:
        st = stats[ec.op]
        st.errors_total += 1
        try:
            with tfgrad.use_impl(impl):
                getattr(tfgrad.raw_ops, ec.op)(**ec.kwargs())
        except ec.error as e:
            if not re.search(ec.match, str(e)):
                st.failures.append(f"{ec.id}: message {str(e)!r} does not match {ec.match!r}")
                continue
        except Exception as e:
            st.failures.append(f"{ec.id}: expected {ec.error.__name__}, tfgrad raised "
                               f"{type(e).__name__}: {_first_line(e)}")
            continue
        else:
            st.failures.append(f"{ec.id}: tfgrad accepted it (expected {ec.error.__name__})")
            continue
        if ec.tf_rejects:
            try:
                oracle.run_tf(ec.op, ec.kwargs())
            except oracle.tf_error_types():
                pass
            else:
                st.failures.append(f"{ec.id}: TF accepted it, tfgrad raised")
                continue
        st.errors_agreed += 1


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


def table(stats: dict[str, OpStats], ops_order: list[str], fail: str = "FAIL") -> str:
    head = ("op", "cases", "bit-identical", "within tol", "max ulp", "max |diff|",
            "errors agreed", "status")
    rows = [head]
    for op in ops_order:
        if op not in stats:
            continue
        s = stats[op]
        errs = f"{s.errors_agreed}/{s.errors_total}" if s.errors_total else "-"
        status = "ok" if s.ok() else f"{fail} ({len(s.failures)})"
        if s.cases == 0 and s.errors_total == 0:
            status = "no cases"
        rows.append((op, str(s.cases), str(s.identical), str(s.within), str(s.max_ulp),
                     f"{s.max_abs:.3g}", errs, status))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _tf_setup(build: str) -> Any:
    """Import TF with the requested build; the variable must be set before TF loads."""
    if sys.modules.get("tensorflow") is not None:
        raise CLIError("TensorFlow was imported before the oneDNN switch could be set")
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0" if build == "eigen" else "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError:
        raise CLIError("conformance needs TensorFlow 2.21 (pip install 'tfgrad[tf]', i.e. "
                       "tensorflow-cpu==2.21.0)") from None
    if not tf.__version__.startswith("2.21."):
        print(f"warning: TensorFlow {tf.__version__} is installed; tfgrad reproduces 2.21, "
              "so differences are expected", file=sys.stderr)
    return tf


def run(args: argparse.Namespace) -> int:
    import tfgrad

    tf = _tf_setup(args.tf_build)
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
    families = args.family
    if args.op:
        try:
            names = {tfgrad.get_op_def(o).name for o in args.op}
        except KeyError as e:
            raise CLIError(e.args[0]) from None
        families = sorted({tfgrad.OPS[n].family for n in names} & set(families or FAMILIES))
    cases, error_cases, problems = load_cases(families)
    if args.op:
        cases = [c for c in cases if c.op in names]
        error_cases = [c for c in error_cases if c.op in names]
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    if not cases and not error_cases:
        raise CLIError("no cases to run" + (f" ({'; '.join(problems)})" if problems else ""))
    if args.tf_build == "onednn":
        error_cases = []  # malformed inputs can abort TF's oneDNN kernels (semantics.md 5)
    rng = np.random.default_rng(seed)
    draws = plan(cases, args.cases, rng)
    stats: dict[str, OpStats] = defaultdict(OpStats)
    t0 = time.perf_counter()
    check_cases(draws, args.impl, stats, args.verbose)
    if not args.no_errors:
        check_errors(error_cases, args.impl, stats)
    seconds = time.perf_counter() - t0
    order = [o for o in tfgrad.OPS if o in stats]
    build = ("Eigen kernels, TF_ENABLE_ONEDNN_OPTS=0" if args.tf_build == "eigen"
             else "default oneDNN build")
    print(f"tfgrad {tfgrad.__version__} ({args.impl}) vs TensorFlow {tf.__version__} ({build}); "
          f"seed {seed}; {len(draws)} random cases, {len(error_cases) if not args.no_errors else 0}"
          f" error cases; {seconds:.1f} s")
    print(table(stats, order, "FAIL" if args.tf_build == "eigen" else "differs"))
    failed = [f"{op}: {f}" for op in order for f in stats[op].failures]
    if failed:
        print(f"\n{len(failed)} {'disagreement' if args.tf_build == 'eigen' else 'difference'}"
              "(s):")
        shown = 50 if args.tf_build == "eigen" else 10
        for f in failed[:shown]:
            print("  " + f)
        if len(failed) > shown:
            print(f"  ... and {len(failed) - shown} more (--json FILE has them all)")
    result = {"tfgrad": tfgrad.__version__, "tensorflow": tf.__version__, "tf_build": args.tf_build,
              "impl": args.impl, "seed": seed, "seconds": seconds,
              "ops": {op: stats[op].__dict__ for op in order}, "load_problems": problems}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    status = 1 if failed and args.tf_build == "eigen" else 0
    if args.onednn and args.tf_build == "eigen":
        status = max(status, _onednn_pass(args, seed))
    return status


def _onednn_pass(args: argparse.Namespace, seed: int) -> int:
    """Re-run the same draws against TF's default build in a fresh process (the oneDNN
    switch is read once, when TF loads). Informational: its differences do not fail."""
    cmd = [sys.executable, "-m", "tfgrad", "conformance", "--tf-build", "onednn",
           "--seed", str(seed), "--impl", args.impl, "--no-errors"]
    for o in args.op or []:
        cmd += ["--op", o]
    for fam in args.family or []:
        cmd += ["--family", fam]
    if args.cases is not None:
        cmd += ["--cases", str(args.cases)]
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")
    print("\nsecond pass: TensorFlow's default oneDNN build (informational; the oneDNN "
          "kernels differ from the Eigen reference by design)", flush=True)
    proc = subprocess.run(cmd, env=env)
    if proc.returncode not in (0, 1):
        print(f"the oneDNN pass ended with status {proc.returncode} (a negative status is a "
              "signal: TF's oneDNN kernels abort on some inputs)")
    return 0
