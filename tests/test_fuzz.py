"""Hypothesis fuzzing of every raw op, each op in its own subprocess.

Property (tests/fuzz_strategies.py, ``check_call``): a call with arbitrary ranks, shapes
(zero, huge, overflowing), dtypes, attr values, NaN/Inf, non-contiguous, read-only,
broadcast or Python-list inputs either returns outputs of the documented shapes and
dtypes, or raises ``InvalidArgumentError`` / a deliberate ``TypeError``. Nothing else:
no other exception, no crash, no hang, no input modified, no output aliasing an input.

Each op runs in a subprocess (tests/fuzz_worker.py), so a segfault or an abort is a
failure naming the op and the example (the worker saves it before every call), not a
lost test session. Two subprocesses run at a time (one per worker under pytest-xdist).

- CI (default): ``TFGRAD_FUZZ_EXAMPLES`` examples per op (20; about 400 in all).
- Long mode: ``pytest -m fuzz tests/test_fuzz.py`` runs ``TFGRAD_FUZZ_LONG_EXAMPLES``
  (default 500) per op with a fresh seed; tools/fuzz_long.py runs 100,000+ in parallel,
  resumable.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tfgrad._opdefs import OPS

ROOT = Path(__file__).resolve().parent.parent
ALL_OPS = sorted(OPS)
CI_EXAMPLES = int(os.environ.get("TFGRAD_FUZZ_EXAMPLES", "20"))
LONG_EXAMPLES = int(os.environ.get("TFGRAD_FUZZ_LONG_EXAMPLES", "500"))
TIMEOUT = int(os.environ.get("TFGRAD_FUZZ_TIMEOUT", "300"))


def _implemented(op: str) -> bool:
    fam = OPS[op].family
    return (ROOT / "src" / "tfgrad" / "ops" / f"{fam}.py").exists()


def run_worker(op: str, examples: int, seed: int, workdir: Path,
               timeout: int = TIMEOUT) -> dict:
    """Fuzz ``op`` in a subprocess; return the worker's report, or one describing how it
    died (signal, exit code, timeout) with the example it was running."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, "-m", "tests.fuzz_worker", "--op", op, "--examples", str(examples),
           "--seed", str(seed), "--dir", str(workdir)]
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return {"op": op, "status": "hang", "seed": seed,
                "error": f"no result after {timeout} s (stderr: {(e.stderr or '')[-2000:]})",
                "example": _current(workdir)}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"op": op, "status": "crash", "seed": seed,
            "error": f"exit code {p.returncode}; stderr:\n{p.stderr[-3000:]}",
            "example": _current(workdir)}


def _current(workdir: Path) -> str:
    f = workdir / "current.txt"
    return f.read_text() if f.exists() else "(none: it died before the first example)"


def _message(r: dict) -> str:
    return (f"{r['op']} fuzz {r['status']} (seed {r.get('seed')}): example "
            f"{r.get('example', '?')}\n{r.get('error', '')}")


@pytest.fixture(scope="module")
def ci_report(request, tmp_path_factory):
    """``ci_report(op)``: the CI run's report of ``op``."""
    base = tmp_path_factory.mktemp("fuzz")

    def fuzz(op: str) -> dict:
        return run_worker(op, CI_EXAMPLES, zlib.crc32(op.encode()), base / op)

    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-xdist: each test fuzzes its own op, the workers side by side (every
        # worker holds the whole session's items: a worker would fuzz every op below)
        return fuzz
    selected = {item.callspec.params["op"] for item in request.session.items
                if item.originalname == "test_fuzz" and hasattr(item, "callspec")}
    ops = [op for op in ALL_OPS if _implemented(op) and op in selected]
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        reports = dict(zip(ops, ex.map(fuzz, ops)))
    return reports.__getitem__


@pytest.mark.parametrize("op", ALL_OPS)
def test_fuzz(op, ci_report):
    """Bounded CI run: a few examples per op, fixed seeds (reproducible)."""
    if not _implemented(op):
        pytest.skip(f"the {OPS[op].family} family is not implemented")
    r = ci_report(op)
    assert r["status"] == "ok", _message(r)
    assert r["examples"] >= 1


@pytest.mark.fuzz
@pytest.mark.parametrize("op", ALL_OPS)
def test_fuzz_long(op, tmp_path):
    """Hand runs: ``pytest -m fuzz`` (more examples, a fresh seed each run)."""
    if not _implemented(op):
        pytest.skip(f"the {OPS[op].family} family is not implemented")
    seed = int.from_bytes(os.urandom(4), "little")
    r = run_worker(op, LONG_EXAMPLES, seed, tmp_path, timeout=max(TIMEOUT, 1800))
    assert r["status"] == "ok", _message(r)


def test_worker_reports_a_crash(tmp_path, monkeypatch):
    """The harness itself: a worker that segfaults is reported with the example it ran."""
    monkeypatch.setenv("TFGRAD_FUZZ_SELFTEST", "crash")
    r = run_worker("FakeQuantWithMinMaxArgs", 1, 0, tmp_path, timeout=120)
    assert r["status"] == "crash", r
    assert r["example"].startswith("FakeQuantWithMinMaxArgs(")
