"""The benchmarks keep working: run every one once on tiny shapes (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tfgrad.testing import harness
from tfgrad.testing.cases import batch_norm, depthwise_conv

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


def _bounds():
    """benchmarks/bounds.py (that folder is no package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("bounds")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_rounds_are_merged_into_medians_and_ranges():
    rounds = [[{"op": "A", "case": "c", "tfgrad_ms": t, "tf_ms": f, "floor_ms": 1.0}]
              for t, f in ((1.0, 3.0), (2.0, 3.0), (4.0, 6.0))]
    (row,) = harness.merge_rounds(rounds)
    assert row["tfgrad_ms"] == 2.0 and row["tf_ms"] == 3.0 and row["rounds"] == 3
    assert row["speedup_vs_tf"] == 1.5  # the ratio of the medians
    assert row["speedup_vs_tf_range"] == [1.5, 3.0]  # each round's own ratio
    assert row["x_floor_range"] == [1.0, 4.0] and "speedup_vs_torch" not in row
    assert "range" in harness.format_table([row])


def test_interleaved_timing_takes_the_samples_in_turn():
    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in ("a", "b", "c")}
    secs = harness.time_interleaved(fns, repeat=3, min_time=0.0)
    assert set(secs) == {"a", "b", "c"} and all(t >= 0 for t in secs.values())
    # two warm-up calls each, one implementation after another, then samples in turn
    assert calls == ["a", "a", "b", "b", "c", "c"] + ["a", "b", "c"] * 3


def test_run_bench_interleaved_reports_every_implementation():
    row = harness.run_bench(depthwise_conv.BENCHES[0], smoke=True, interleave=True)
    assert row["tfgrad_ms"] > 0 and row["x_floor"] > 0
    for k in ("tf", "torch"):
        if f"{k}_ms" in row:
            assert row[f"speedup_vs_{k}"] == row[f"{k}_ms"] / row["tfgrad_ms"]


def test_inputs_are_placed_at_the_asked_offset_from_a_line():
    import numpy as np

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    kw = {"x": x, "sizes": np.array([1, 2], np.int32), "strides": [1, 2, 2, 1],
          "scalar": np.float32(3)}
    for offset in (0, 16, 48):
        placed = harness.place(kw, offset)
        for k in ("x", "sizes"):
            assert placed[k].ctypes.data % 64 == offset
            assert placed[k].dtype == kw[k].dtype and placed[k].flags.c_contiguous
            np.testing.assert_array_equal(placed[k], kw[k])
            assert not np.shares_memory(placed[k], kw[k])
        assert placed["strides"] is kw["strides"] and placed["scalar"] is kw["scalar"]


def test_bounds_smoke(tmp_path):
    out = tmp_path / "bounds.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/bounds.py"), "--smoke", "--family",
         "depthwise_conv", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["environment"]["mac_rate_G_per_s"] > 0
    for row in data["results"]:
        assert row["stream_ms"] > 0 and row["arith_ms"] > 0
        assert row["bound_ms"] == max(row["stream_ms"], row["arith_ms"])


def test_bounds_count_the_ops_bytes_and_multiply_adds():
    bounds = _bounds()
    import numpy as np

    rng = np.random.default_rng(0)
    grad = next(b for b in batch_norm.BENCHES if b.name == "FusedBatchNormGradV3")
    kw = grad.make(rng, True)
    # reads y_backprop and x, writes x_backprop: two inputs and one x-sized output
    assert [a.nbytes for a in bounds._big_inputs(kw)] == [kw["x"].nbytes] * 2
    assert grad.nbytes(kw) - 2 * kw["x"].nbytes == kw["x"].nbytes
    for b in depthwise_conv.BENCHES:
        kw = b.make(rng, True)
        fh, fw, C, M = (kw["filter"].shape if "filter" in kw
                        else tuple(int(v) for v in kw["filter_sizes"]))
        if "out_backprop" in kw:
            n_out = kw["out_backprop"].size
        else:  # the forward: count output elements from TF's window arithmetic by hand
            N, H, W, _ = kw["input"].shape
            s = kw["strides"][1]
            if kw["padding"] == "SAME":
                oh, ow = -(-H // s), -(-W // s)
            else:
                oh, ow = (H - fh) // s + 1, (W - fw) // s + 1
            n_out = N * oh * ow * C * M
        assert bounds._macs(b, kw) == n_out * fh * fw


def test_adapter_benchmark_smoke(tmp_path):
    import pytest

    pytest.importorskip("torch")
    out = tmp_path / "adapters.json"
    qat = importlib.util.find_spec("tensorflow_model_optimization") is not None and \
        importlib.util.find_spec("jax") is not None
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/adapters.py"), "--smoke",
                        "--json", str(out)] + (["--qat"] if qat else []),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    if qat:  # the QAT step: tfmot in TF (both builds), tfgrad.torch.qat, tfgrad.jax.qat
        assert {"tfmot in TF (Eigen)", "tfmot in TF (oneDNN, default)",
                "tfgrad.torch.qat (eager)", "tfgrad.jax.qat (jit, exact)"} <= set(
            data["qat_step_ms"])
        assert all(v["median_ms"] > 0 for v in data["qat_step_ms"].values())
    assert all(v["median"] > 0 for v in data["times_us"].values())
    steps = data["training_step_ms"]
    assert {"batch 8, 1 thread: tfgrad.torch eager",
            "batch 8, 1 thread: plain torch eager"} <= set(steps)
    assert all(v["median"] > 0 for v in steps.values())
    if importlib.util.find_spec("jax") is not None:
        assert set(data["jax_training_step_ms"]) == {
            "batch 8: tfgrad.jax exact", "batch 8: tfgrad.jax native", "batch 8: plain JAX"}
        assert all(v["median"] > 0 for v in data["jax_training_step_ms"].values())
    for path in ("raw_ops over the kernel", "tfgrad.torch forward over the kernel",
                 "tfgrad.torch forward + backward over the kernels and the floor"):
        for op in ("fq", "dw"):  # (no bound asserted: the smoke run times 5 calls)
            assert f"{op} {path}" in data["overheads_us"]


def test_cold_start_smoke(tmp_path):
    """benchmarks/cold_start.py, on the warm cache: the demo's compile step in a child
    process, its seconds and compile events reported."""
    out = tmp_path / "cold.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/cold_start.py"), "--warm",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "kernels ready median" in r.stdout
    (run,) = json.loads(out.read_text())["this"]
    assert run["ready"] > 0 and isinstance(run["spans"], list)


def test_ab_inprocess_smoke(tmp_path):
    """benchmarks/ab_inprocess.py: HEAD's package copied under another name and run beside
    a second copy (--null): both import, run the op, give the same bits, and are timed."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                      capture_output=True).returncode:
        import pytest

        pytest.skip("not a git checkout")
    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/ab_inprocess.py"), "--null",
                        "--family", "fake_quant", "--op", "FakeQuantWithMinMaxArgs", "--smoke",
                        "--rounds", "2", "--calls", "2"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("FakeQuantWithMinMaxArgs")]
    assert rows and all("new/base" in line for line in rows), r.stdout
    assert "differ" not in r.stdout
    assert list(tmp_path.glob("tfgrad-ab/*/tfgrad_base/raw_ops.py"))
    assert list(tmp_path.glob("tfgrad-ab/*/tfgrad_null/raw_ops.py"))


def test_ab_inprocess_compares_bits():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        ab = importlib.import_module("ab_inprocess")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import numpy as np

    a = np.array([0.0, 1.0], np.float32)
    assert ab.equal_bits((a, a), (a.copy(), a.copy()))
    assert not ab.equal_bits(a, np.array([-0.0, 1.0], np.float32))  # (== would say equal)
    assert not ab.equal_bits(a, a.astype(np.float64))
    assert not ab.equal_bits((a,), (a, a))


def test_qat_step_interleaved_smoke(tmp_path):
    """benchmarks/qat_step.py --interleave: TF-Eigen's step and tfgrad.torch.qat's in one
    process (restarted with TF_ENABLE_ONEDNN_OPTS=0), a ratio per round."""
    import pytest

    pytest.importorskip("tensorflow_model_optimization")
    pytest.importorskip("torch")
    out = tmp_path / "qat.json"
    env = {k: v for k, v in __import__("os").environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/qat_step.py"), "--interleave",
                        "--smoke", "--rounds", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert set(rows) == {"tfmot in TF (Eigen)", "tfgrad.torch.qat (eager)"}
    assert rows["tfmot in TF (Eigen)"]["ratio"] == 1.0
    assert all(v["median_ms"] > 0 and v["ratio_min"] <= v["ratio"] <= v["ratio_max"]
               for v in rows.values())


def test_qat_step_ops_smoke(tmp_path):
    """benchmarks/qat_step_ops.py: TF-Eigen's step op by op from TF's profiler, and
    tfgrad.torch.qat's raw-op calls timed, in one process: the same ops found on both
    sides, every figure positive."""
    import pytest

    pytest.importorskip("tensorflow_model_optimization")
    pytest.importorskip("torch")
    out = tmp_path / "ops.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/qat_step_ops.py"), "--smoke",
                        "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["tf_step_ms"] > 0 and res["tfgrad_step_ms"] > 0 and res["tf_busy_ms"] > 0
    # (Conv2D too, but TF's grappler fuses some with their BiasAdd: _FusedConv2D)
    for op in ("FusedBatchNormV3", "FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsGradient"):
        assert res["tf_ops"][op][0] > 0 and res["tfgrad_ops"][op][0] > 0, op
        assert res["tf_ops"][op][1] == res["tfgrad_ops"][op][1] >= 1, op  # (calls a step)
    assert "TF-Eigen step" in r.stdout and "outside tfgrad's ops" in r.stdout
