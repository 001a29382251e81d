"""``tfgrad warmup`` compiles every kernel variant that the registry's inputs select.

In a fresh Numba cache, ``tfgrad warmup`` runs in one process; a second process then runs
every case of the op-case table and every benchmark shape (smoke and full size) and must
compile nothing. Slow: it compiles every kernel once (about 6 minutes on 2 idle cores); in a
fresh clone conftest runs it at the session's start, into the cache the whole run loads from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tfgrad

# Runs every case and benchmark shape once; prints [op, input, [compiled functions]] for
# each call during which Numba compiled something.
_CHECK = """
import json
import numpy as np
from numba.core import event
import tfgrad
from tfgrad import testing

compiled = []

class Compiles(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        compiled.append(f"{f.__module__}.{f.__qualname__}")

    def on_end(self, ev):
        pass

event.register("numba:compile", Compiles())
modules, problems = testing.load()
assert not problems, problems
calls = []
for m in modules.values():
    calls += [(c.op, "case " + c.name, c.kwargs) for c in m.CASES]
    calls += [(b.name, f"bench {b.shape}" + (" (smoke size)" if smoke else ""),
               lambda b=b, smoke=smoke: b.make(np.random.default_rng(0), smoke))
              for b in m.BENCHES for smoke in (True, False)]
report = []
for op, label, make in calls:
    before = len(compiled)
    getattr(tfgrad.raw_ops, op)(**make())
    if len(compiled) > before:
        report.append([op, label, compiled[before:]])
from tfgrad.dispatch.minmax import batch_range  # (the QAT ranges: no raw op runs them)
before = len(compiled)
fixed = np.ones((6, 5), np.float32)
fixed.flags.writeable = False  # (as JAX hands its arrays over)
for a in (np.ones((6, 5), np.float32), fixed):
    for per_axis in (False, True):
        batch_range(a, per_axis)
if len(compiled) > before:
    report.append(["tfgrad.qat", "batch ranges", compiled[before:]])
print(json.dumps({"calls": len(calls), "compiled": report}))
"""

# Where conftest leaves the report of the warmup it ran at the session's start.
SESSION_WARMUP = "TFGRAD_TEST_SESSION_WARMUP"


def session_cache_is_empty() -> bool:
    """No tfgrad kernel in the cache this test session loads from (a fresh clone, as in CI):
    Numba's in-tree __pycache__ folders, or NUMBA_CACHE_DIR when set."""
    where = os.environ.get("NUMBA_CACHE_DIR") or Path(tfgrad.__file__).parent
    return not any(Path(where).rglob("*.nbi"))


def warm_and_check(cwd: Path, cache: Path | None) -> dict:
    """``tfgrad warmup`` on two processes into ``cache`` (None: the session's own), then a
    second process runs every case and benchmark shape; returns what both reported."""
    # This tfgrad (not an installed one), run from outside the checkout.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(tfgrad.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = str(cache)
    warm = subprocess.run([sys.executable, "-m", "tfgrad", "warmup", "--quiet", "--jobs", "2"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    out = {"warmup_rc": warm.returncode, "warmup_log": warm.stdout[-4000:] + warm.stderr[-4000:]}
    if warm.returncode == 0:
        check = subprocess.run([sys.executable, "-c", _CHECK], cwd=cwd, env=env,
                               capture_output=True, text=True, timeout=900)
        out.update(check_rc=check.returncode, check_log=check.stderr[-4000:],
                   result=json.loads(check.stdout.splitlines()[-1]) if check.returncode == 0
                   else None)
    return out


@pytest.mark.slow
def test_after_warmup_no_case_or_benchmark_compiles(tmp_path):
    # With the session's cache empty (CI), conftest ran warmup into that cache at the
    # session's start, before any test (and before pytest-xdist's workers), so that the rest
    # of the run loads every kernel instead of compiling it again; this test reads what it
    # reported. Otherwise it warms a cache of its own, so that it still checks warmup's reach.
    recorded = os.environ.get(SESSION_WARMUP)
    if recorded:
        out = json.loads(Path(recorded).read_text())
    else:
        out = warm_and_check(tmp_path, tmp_path / "numba")
    assert out["warmup_rc"] == 0, out["warmup_log"]
    assert out["check_rc"] == 0, out["check_log"]
    result = out["result"]
    assert result["calls"] > 500
    assert not result["compiled"], "compiled after tfgrad warmup:\n" + "\n".join(
        f"{op} [{label}]: {', '.join(names)}" for op, label, names in result["compiled"])
