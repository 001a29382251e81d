"""``python -m tfgrad``: every subcommand once, in its quick mode, in a subprocess.

Subcommands whose extra is not installed are skipped (the demo needs scikit-learn, tqdm
and matplotlib; conformance needs TensorFlow); their "install tfgrad[...]" error is
tested by hiding the package from the child process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tfgrad
from tfgrad._opdefs import FAMILIES, OPS

ROOT = Path(__file__).resolve().parent.parent


def tfgrad_cli(*args: str, timeout: float = 300, hide: tuple[str, ...] = (),
               env: dict[str, str] | None = None, cwd: Path = ROOT
               ) -> subprocess.CompletedProcess:
    """Run ``python -m tfgrad args`` (with the modules in ``hide`` made unimportable)."""
    code = "import sys\n"
    for mod in hide:
        code += f"sys.modules[{mod!r}] = None\n"
    code += "from tfgrad.__main__ import main\nsys.exit(main(sys.argv[1:]))\n"
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=full_env)


def has(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


QUICK_FAMILY = next(iter(FAMILIES))
"""The family of the quick runs: the op table's first."""


# --- top level -----------------------------------------------------------------------------
def test_help_and_version():
    r = tfgrad_cli("--help")
    assert r.returncode == 0
    for sub in ("demo", "bench", "conformance", "ops", "warmup"):
        assert sub in r.stdout
    r = tfgrad_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tfgrad {tfgrad.__version__}"
    assert tfgrad_cli().returncode == 2  # no subcommand: usage


def test_console_script_entry_point():
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="console_scripts") if e.name == "tfgrad"]
    if not eps:
        pytest.skip("tfgrad is not installed as a distribution")
    assert eps[0].value == "tfgrad.__main__:main"


# --- ops -----------------------------------------------------------------------------------
def test_ops_lists_every_op():
    r = tfgrad_cli("ops")
    assert r.returncode == 0, r.stderr
    for name, op in OPS.items():
        assert re.search(rf"^{name}  \(tfgrad\.{op.snake_name}, family {op.family}\)$",
                         r.stdout, re.M)
        for a in op.attrs:
            assert f"    {a.name}: {a.type}" in r.stdout


def test_ops_one_op_by_either_name():
    a = tfgrad_cli("ops", "--op", "FusedBatchNormV3")
    b = tfgrad_cli("ops", "--op", "fused_batch_norm_v3")
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout
    assert "x: T in {float16, bfloat16, float32}" in a.stdout
    assert "data_format: string = 'NHWC', one of NHWC, NCHW, NDHWC, NCDHW" in a.stdout
    assert "reserve_space_3: U" in a.stdout
    assert "FusedBatchNormV2" not in a.stdout


def test_ops_unknown_op_is_a_clean_error():
    r = tfgrad_cli("ops", "--op", "Conv3D")
    assert r.returncode == 2
    assert "tfgrad ops: error:" in r.stderr and "Conv3D" in r.stderr
    assert "Traceback" not in r.stderr


def test_ops_markdown_and_json():
    r = tfgrad_cli("ops", "--markdown")
    assert r.returncode == 0
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("| op") and len(lines) == 2 + len(OPS)
    assert "| `DepthwiseConv2dNative` | depthwise_conv | float16, bfloat16, float32, float64 |" \
        in lines
    r = tfgrad_cli("ops", "--json", "--family", "fractional_pool")
    data = json.loads(r.stdout)
    assert [d["name"] for d in data] == [n for n, o in OPS.items()
                                         if o.family == "fractional_pool"]
    ratio = next(a for a in data[0]["attrs"] if a["name"] == "pooling_ratio")
    assert ratio == {"name": "pooling_ratio", "type": "list(float)", "required": True,
                     "min_length": 4}


# --- warmup --------------------------------------------------------------------------------
def test_warmup_one_family():
    r = tfgrad_cli("warmup", "--family", QUICK_FAMILY, "--small", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"warmup: \d+ calls in [\d.]+ s \(kernel\); 0 failed", r.stdout)


def test_warmup_jobs_split_a_family_by_its_groups():
    """``--jobs`` runs depthwise's three ops in separate processes (WARMUP_GROUPS, which
    cover the family's ops once each); the other families stay whole."""
    from tfgrad._cli.warmup import units
    from tfgrad.testing.cases import depthwise_conv

    groups = [o for g in depthwise_conv.WARMUP_GROUPS for o in g]
    assert sorted(groups) == sorted(n for n, o in OPS.items() if o.family == "depthwise_conv")
    assert units(["fake_quant", "depthwise_conv"], None) == [
        ("fake_quant", None), *(("depthwise_conv", list(g)) for g in depthwise_conv.WARMUP_GROUPS)]
    bi = "DepthwiseConv2dNativeBackpropInput"
    assert units(["depthwise_conv"], [bi]) == [("depthwise_conv", [bi])]


def test_warmup_jobs_default_is_the_cpus_it_may_use(monkeypatch):
    """Without ``--jobs`` warmup runs a process per CPU of its affinity mask (not the
    machine's count: a container or ``taskset`` gets fewer), at most MAX_JOBS."""
    from tfgrad._cli import warmup

    monkeypatch.setattr(warmup.os, "sched_getaffinity", lambda pid: {0, 5, 7}, raising=False)
    assert warmup.default_jobs() == 3
    monkeypatch.setattr(warmup.os, "sched_getaffinity", lambda pid: set(range(96)),
                        raising=False)
    assert warmup.default_jobs() == warmup.MAX_JOBS
    monkeypatch.setattr(warmup.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert warmup.default_jobs() == 1


def test_warmup_refuses_jobs_below_one():
    r = tfgrad_cli("warmup", "--family", QUICK_FAMILY, "--small", "-q", "--jobs", "0")
    assert r.returncode == 2 and "--jobs must be at least 1, not 0" in r.stderr


# --- demo ----------------------------------------------------------------------------------
DEMO_QUICK = ("demo", "--epochs", "1", "--train-size", "192", "--no-progress")


@pytest.mark.skipif(not has("sklearn", "tqdm", "matplotlib"), reason="extra 'demo' not installed")
def test_demo_quick_run_is_deterministic(tmp_path):
    """Same seed, same history: also across Numba thread counts (1, then 2)."""
    import numba

    runs = []
    for k in range(2):
        out = tmp_path / str(k)
        threads = str(min(k + 1, numba.config.NUMBA_NUM_THREADS))
        r = tfgrad_cli(*DEMO_QUICK, "--seed", "3", "--threads", threads, "--out", str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        last = r.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"test accuracy: float32 \d+\.\d%, int8 fake-quant \d+\.\d%", last)
        assert (out / "demo.png").stat().st_size > 10_000
        runs.append(json.loads((out / "demo.json").read_text()))
    a, b = runs
    assert a["config"]["bits"] == 8 and a["config"]["n_train"] == 192
    for h in a["history"] + b["history"]:
        del h["seconds"]
    assert a["history"] == b["history"] and a["test_accuracy"] == b["test_accuracy"]
    assert len(a["activation_ranges"]) == 3
    assert any(hi != 3.0 for _, hi in a["activation_ranges"])  # the ranges are learned


_DEMO_GRADS = r"""
import json, sys
import numba, numpy as np
from tfgrad._cli import demo
from tfgrad.kernels import depthwise_conv as K
from tfgrad.kernels.depthwise_conv import backprop_filter, backprop_input, common, forward

def used():  # every depthwise kernel's compiled signatures
    found = {(repr(v), str(s)) for v, k in K._BUILT.items() for s in k.signatures}
    for mod in (backprop_filter, backprop_input, common, forward):
        for name, f in vars(mod).items():
            for d in (f, getattr(f, "parallel", None), getattr(f, "serial", None)):
                if isinstance(d, numba.core.dispatcher.Dispatcher):
                    found |= {(mod.__name__ + "." + name, str(s)) for s in d.signatures}
    return found

rng = np.random.default_rng(0)
model = demo.build_model(rng, 8)
x = rng.random((4, 8, 8, 1), dtype=np.float32)
demo.depthwise_grads(demo.depthwise_specs(model, x), numba.get_num_threads())
child = used()
demo.forward(model, x, demo.TRAIN)  # the forward's own kernels
fwd = used()
demo.backward(model, np.ones((4, 10), np.float32))
print(json.dumps([sorted(child), sorted(used() - fwd)]))
"""


def test_demo_second_process_compiles_what_the_backward_takes():
    """The demo's first step leaves depthwise's gradient kernels to a second process
    (demo._start_depthwise_grads), which runs the two ops on the shapes the backward
    gives them: it must select the same kernels with the same signatures, or the
    backward compiles them again instead of loading them from the cache."""
    r = subprocess.run([sys.executable, "-c", _DEMO_GRADS], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    child, backward = json.loads(r.stdout.strip().splitlines()[-1])
    assert any("backprop_input" in k for k, _ in child)
    assert any("backprop_filter" in k for k, _ in child)
    assert {tuple(p) for p in backward} <= {tuple(p) for p in child}


def test_demo_backward_skips_only_the_unused_input_gradient(monkeypatch):
    """The demo's first layer takes the images: its backward computes the weights'
    gradient and no input gradient (nor does the second process compile one); every
    parameter's gradient is the one a full backward gives, bit for bit."""
    import copy

    from tfgrad._cli import demo

    rng = np.random.default_rng(1)
    model = demo.build_model(rng, 8)
    x = rng.random((4, 8, 8, 1), dtype=np.float32)
    g = rng.standard_normal((4, 10)).astype(np.float32)
    demo.forward(model, x, demo.TRAIN)
    full = copy.deepcopy(model)
    gi = g
    for layer in reversed(full):
        gi = layer.backward(gi)
    assert gi is not None and gi.shape == x.shape
    shapes = []
    op = tfgrad.raw_ops.DepthwiseConv2dNativeBackpropInput

    def counted(**kw):
        shapes.append(tuple(kw["input_sizes"]))
        return op(**kw)

    monkeypatch.setattr(tfgrad.raw_ops, "DepthwiseConv2dNativeBackpropInput", counted)
    demo.backward(model, g)
    assert shapes == [(4, 8, 8, 16)]  # the second depthwise layer's only
    for a, b in zip(model, full, strict=True):
        assert a.grads.keys() == b.grads.keys()
        for k in a.grads:
            np.testing.assert_array_equal(a.grads[k], b.grads[k])
    specs = json.loads(demo.depthwise_specs(model, x))
    assert [s[2] for s in specs] == [False, True]


@pytest.mark.skipif(not has("sklearn", "tqdm"), reason="extra 'demo' not installed")
def test_demo_bits_flag(tmp_path):
    r = tfgrad_cli(*DEMO_QUICK, "--bits", "4", "--no-plot", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "int4 fake-quant" in r.stdout.strip().splitlines()[-1]
    assert json.loads((tmp_path / "demo.json").read_text())["png"] is None


def test_demo_without_its_extra_says_what_to_install(tmp_path):
    r = tfgrad_cli("demo", "--out", str(tmp_path), hide=("sklearn",))
    assert r.returncode == 2
    assert "install the extra: pip install 'tfgrad[demo]'" in r.stderr.lower()
    assert "Traceback" not in r.stderr


def test_demo_rejects_bad_bits():
    r = tfgrad_cli("demo", "--bits", "1")
    assert r.returncode == 2 and "--bits must be between 2 and 16" in r.stderr


# --- bench ---------------------------------------------------------------------------------
def test_bench_quick(tmp_path):
    fam = QUICK_FAMILY
    r = tfgrad_cli("bench", "--quick", "--family", fam, "--no-torch", "--out", str(tmp_path),
                   *(() if has("matplotlib") else ("--no-plot",)))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["results"] and all("tfgrad_ms" in row for row in data["results"])
    assert {row["op"] for row in data["results"]} <= set(OPS)
    header = (tmp_path / "bench.csv").read_text().splitlines()[0]
    assert header.startswith("op,case,tfgrad_ms,tf_ms,torch_ms")
    assert "tfgrad ms" in r.stdout and "x floor" in r.stdout
    if has("tensorflow"):
        assert all("tf_ms" in row for row in data["results"])
    if has("matplotlib"):
        assert (tmp_path / "bench.png").is_file()


def test_bench_list():
    r = tfgrad_cli("bench", "--list")
    assert r.returncode == 0, r.stderr


def test_bench_and_conformance_need_no_checkout(tmp_path):
    """What they load ships in the package: a copy of it alone (no tests/, no benchmarks/,
    run from elsewhere) lists every benchmark and runs the conformance check."""
    site = tmp_path / "site"
    shutil.copytree(Path(tfgrad.__file__).parent, site / "tfgrad",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(site), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    where = subprocess.run([sys.executable, "-c", "import tfgrad; print(tfgrad.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env=dict(os.environ, **env))
    assert where.stdout.strip() == str(site / "tfgrad" / "__init__.py"), where
    r = tfgrad_cli("bench", "--list", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    from tfgrad import testing

    for fam in FAMILIES:
        for b in testing.family(fam).BENCHES:
            assert re.search(rf"^{b.name} +{re.escape(b.shape)}$", r.stdout, re.M), b.name
    if has("tensorflow"):  # (the NumPy reference: nothing to compile)
        r = tfgrad_cli("conformance", "--family", QUICK_FAMILY, "--cases", "1", "--seed", "1",
                       "--impl", "reference", "--no-errors", env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "seed 1;" in r.stdout


# --- conformance ---------------------------------------------------------------------------
@pytest.mark.live
def test_conformance_quick():
    fam = QUICK_FAMILY
    r = tfgrad_cli("conformance", "--family", fam, "--cases", "1", "--seed", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "seed 1;" in r.stdout and "bit-identical" in r.stdout
    ops = [n for n, o in OPS.items() if o.family == fam]
    assert any(re.search(rf"^{op}\s+1\s", r.stdout, re.M) for op in ops), r.stdout


def test_conformance_without_tensorflow_says_what_to_install():
    r = tfgrad_cli("conformance", "--cases", "1", hide=("tensorflow",))
    assert r.returncode == 2
    assert "pip install 'tfgrad[tf]'" in r.stderr


def test_conformance_comparison_rules():
    """Bit-identical unless the case documents ulps; -0.0 vs +0.0 only passes with ulps."""
    from tests import oracle
    from tfgrad._cli.conformance import _compare

    a = np.array([1.0, -0.0, np.nan], np.float32)
    assert _compare(oracle, "Op", a, a.copy(), {}, ["y"])[:3] == (True, True, 0)
    z = np.array([1.0, 0.0, np.nan], np.float32)
    ident, within, ulp, _, why = _compare(oracle, "Op", a, z, {}, ["y"])
    assert (ident, within, ulp) == (False, False, 0) and "signed zeros" in why
    assert _compare(oracle, "Op", a, z, {"y": 1}, ["y"])[:3] == (False, True, 0)
    b = a.copy()
    b[0] = np.nextafter(np.nextafter(b[0], np.float32(2)), np.float32(2))
    assert _compare(oracle, "Op", b, a, {"y": 1}, ["y"])[:3] == (False, False, 2)
    assert _compare(oracle, "Op", b, a, {"y": 2}, ["y"])[:3] == (False, True, 2)
    assert _compare(oracle, "Op", a[:2], a, {}, ["y"])[1] is False  # shape
    i = np.array([1, 2], np.int64)
    assert _compare(oracle, "Op", (a, i), (a, i + 1), {}, ["y", "n"])[1] is False
