"""The benchmarks keep working: run every one once on tiny shapes (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/run.py"), "--smoke", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    for row in data["results"]:
        assert row["tfgrad_ms"] > 0 and row["floor_ms"] > 0


def test_rounds_are_merged_into_medians_and_ranges():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import harness
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rounds = [[{"op": "A", "case": "c", "tfgrad_ms": t, "tf_ms": f, "floor_ms": 1.0}]
              for t, f in ((1.0, 3.0), (2.0, 3.0), (4.0, 6.0))]
    (row,) = harness.merge_rounds(rounds)
    assert row["tfgrad_ms"] == 2.0 and row["tf_ms"] == 3.0 and row["rounds"] == 3
    assert row["speedup_vs_tf"] == 1.5  # the ratio of the medians
    assert row["speedup_vs_tf_range"] == [1.5, 3.0]  # each round's own ratio
    assert row["x_floor_range"] == [1.0, 4.0] and "speedup_vs_torch" not in row
    assert "range" in harness.format_table([row])
