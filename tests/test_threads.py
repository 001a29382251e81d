"""Thread safety: the ops called from several Python threads at once give the serial bits.

Every case of the op-case table and every LARGE input of tests/test_determinism.py runs
once serially, then twice each from a ThreadPoolExecutor of 4 threads in shuffled order
(so different ops and different shapes overlap), mixed with NumPy-reference runs of every
third case (``use_impl`` is per thread). The check runs in a subprocess: with
Numba's ``workqueue`` threading layer, concurrent parallel kernels abort the process,
which must show up as a failure rather than kill the test session.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import tfgrad
from tests.test_determinism import all_calls, outputs

ROOT = Path(__file__).resolve().parent.parent


def _bits(out: tuple[np.ndarray, ...], any_nan: bool = False) -> tuple[bytes, ...]:
    """The outputs' bytes; ``any_nan``: every NaN made the same NaN (the NumPy references
    promise TF's NaN positions, not which NaN an operation returns where two meet)."""
    if any_nan:
        out = tuple(np.where(np.isnan(o), np.array(np.nan, o.dtype), o)
                    if np.issubdtype(o.dtype, np.floating) else o for o in out)
    return tuple(np.ascontiguousarray(o).tobytes() + str((o.shape, o.dtype)).encode()
                 for o in out)


def check(repeats: int = 2, threads: int = 4) -> list[str]:
    """Return the ids of calls whose threaded results differ from the serial ones."""
    calls = all_calls()
    inputs = {cid: make() for cid, _, make in calls}
    ops = {cid: op for cid, op, _ in calls}
    serial_out = {cid: outputs(ops[cid], inputs[cid]) for cid in inputs}
    serial = {(cid, impl): _bits(out, impl == "reference")
              for cid, out in serial_out.items() for impl in ("kernel", "reference")}

    def run(job: tuple[str, str]) -> tuple[str, str, tuple[bytes, ...]]:
        cid, impl = job
        with tfgrad.use_impl(impl):
            return cid, impl, _bits(outputs(ops[cid], inputs[cid]), impl == "reference")

    # The NumPy references are slow: every third case (not LARGE), once.
    ref = [cid for i, cid in enumerate(inputs) if i % 3 == 0 and not cid.endswith("/LARGE")]
    jobs = [(cid, "kernel") for cid in inputs for _ in range(repeats)]
    jobs += [(cid, "reference") for cid in ref]
    random.Random(0).shuffle(jobs)
    with ThreadPoolExecutor(threads) as ex:
        results = list(ex.map(run, jobs))
    return sorted({f"{cid} [{impl}]" for cid, impl, bits in results
                   if bits != serial[cid, impl]})


def test_concurrent_calls_match_serial():
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    code = ("import sys, numba; from tests.test_threads import check; bad = check(); "
            "print('threading layer:', numba.threading_layer()); print('DIFFER', bad); "
            "sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, (f"threaded calls failed (exit {p.returncode}):\n"
                               f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


_WORKERS = """
import numba, numpy as np
import tfgrad
r = tfgrad.raw_ops
x = np.full((4, 64, 64, 32), 1e-39, np.float32)  # big enough for the threaded kernels
c = np.ones(32, np.float32)
r.FusedBatchNormV3(x=x, scale=c, offset=c, mean=c, variance=c, is_training=False)
r.DepthwiseConv2dNative(input=x, filter=np.ones((3, 3, 32, 1), np.float32),
                        strides=[1, 1, 1, 1], padding="SAME")
r.FractionalAvgPool(value=x, pooling_ratio=[1.0, 1.5, 1.5, 1.0], deterministic=True,
                    seed=1, seed2=1)

@numba.njit(parallel=True)
def products(a):
    out = np.empty(a.size, np.float32)
    for i in numba.prange(a.size):
        out[i] = a[i] * np.float32(1e-20)
    return out

main = np.float32(1e-20) * np.float32(1e-20)
print(int((products(np.full(4096, 1e-20, np.float32)) != 0).sum()), int(main != 0))
"""


def test_numba_worker_threads_keep_their_floating_point_environment():
    """The ops flush denormals as TF (FTZ / DAZ) on the calling thread and in each
    parallel loop body, and put every thread's MXCSR back: the user's own Numba code
    still computes denormals afterwards, on the caller and on Numba's workers (which
    tfgrad starts before its first flushed block, as a new thread inherits MXCSR)."""
    out = subprocess.run([sys.executable, "-c", _WORKERS], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["4096", "1"]


class _Twins:
    """Stands in for a compiled kernel pair: which twin ``launch`` ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.parallel = lambda: self.ran.append("parallel")
        self.serial = lambda: self.ran.append("serial")


def test_launch_scales_thresholds_by_the_wake_cost(monkeypatch):
    import numba
    import pytest

    from tfgrad import _compile

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread: every call is serial")
    _compile.start_workers()
    k = _Twins()
    fq, mm = _compile.POLICY["fake_quant"], _compile.POLICY["matmul"]
    assert fq.wake_us == 2.0 and mm.wake_us == 45.0
    lo, mlo = fq.parallel_min, mm.parallel_min
    for wake, family, work, want in (
            (0.0, "fake_quant", lo - 1, "serial"), (0.0, "fake_quant", lo, "parallel"),
            (2.0, "fake_quant", lo, "parallel"), (40.0, "fake_quant", 19 * lo, "serial"),
            (40.0, "fake_quant", 20 * lo, "parallel"),
            # a threshold measured with sleeping threads: scaled only past that cost
            (40.0, "matmul", mlo, "parallel"), (90.0, "matmul", mlo, "serial"),
            (90.0, "matmul", 2 * mlo, "parallel")):
        monkeypatch.setattr(_compile, "_WAKE_US", wake)
        k.ran.clear()
        _compile.launch(family, k, work)
        assert k.ran == [want], (wake, family, work)
    monkeypatch.setitem(_compile.POLICY, "fake_quant", _compile.Threading(0))
    k.ran.clear()
    _compile.launch("fake_quant", k, 1)  # (a threshold of 0: every call threaded)
    assert k.ran == ["parallel"]


def _wake_in_subprocess(env_value: str | None, threads: int = 2) -> subprocess.CompletedProcess:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    env.pop("TFGRAD_WAKE_US", None)
    if env_value is not None:
        env["TFGRAD_WAKE_US"] = env_value
    code = ("import numpy as np, tfgrad\nfrom tfgrad import _compile as c\n"
            "print(c.wake_us())\n"
            "print(tfgrad.raw_ops.Relu(features=np.ones(4, np.float32)).sum())\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_wake_cost_measured_or_given():
    got = _wake_in_subprocess(None)
    assert got.returncode == 0, got.stderr
    assert float(got.stdout.split()[0]) > 0.0
    got = _wake_in_subprocess("40")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[:2] == ["40.0", "4.0"]
    got = _wake_in_subprocess(None, threads=1)  # one thread: nothing to wake
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[:2] == ["0.0", "4.0"]


def test_wake_cost_measured_before_the_first_threaded_launch():
    """A process whose first ops enter no flushed block (fake quant alone) measures the
    wake cost before its first call big enough to thread, as every other process: it
    ran on sleeping threads at any cost before."""
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    env.pop("TFGRAD_WAKE_US", None)
    code = ("import numpy as np, tfgrad\nfrom tfgrad import _compile as c\n"
            "n = c.POLICY['fake_quant'].parallel_min\n"
            "tfgrad.raw_ops.FakeQuantWithMinMaxVars(inputs=np.ones(n, np.float32), "
            "min=np.float32(-1), max=np.float32(1))\n"
            "print(c._WORKERS_STARTED, c._WAKE_US > 0)\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["True", "True"]


def test_bad_wake_setting_is_a_clear_error():
    for bad in ("fast", "-1", "nan", "inf"):
        got = _wake_in_subprocess(bad)
        assert got.returncode != 0
        assert "TFGRAD_WAKE_US must be" in got.stderr and repr(bad) in got.stderr, got.stderr


def _omp_display(code: str, **env_values: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NUMBA_NUM_THREADS="2", OMP_DISPLAY_ENV="VERBOSE", **env_values)
    if "OMP_WAIT_POLICY" not in env_values:
        env.pop("OMP_WAIT_POLICY", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


_LAUNCH = ("import os, tfgrad\nfrom tfgrad import _compile\n"
           "print(os.environ.get('OMP_WAIT_POLICY'))\n"
           "_compile.start_workers()\n"
           "print(os.environ.get('OMP_WAIT_POLICY'))\n")


def test_numbas_runtime_waits_passively_and_the_environment_stays():
    """Numba's OpenMP runtime loads with a passive wait (its threads spinning between
    regions slowed a busy machine 25x), and the environment is left as it was: a child
    process, or a torch imported later, keeps OpenMP's own default. A user's setting wins."""
    got = _omp_display(_LAUNCH)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["None", "None"]
    assert "GOMP_SPINCOUNT = '0'" in got.stderr, got.stderr  # (PASSIVE: no spinning)
    got = _omp_display(_LAUNCH, OMP_WAIT_POLICY="ACTIVE")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["ACTIVE", "ACTIVE"]
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in got.stderr, got.stderr


def test_a_torch_imported_after_tfgrad_keeps_its_own_wait():
    pytest.importorskip("torch")
    code = "import tfgrad\nimport torch\n" + _LAUNCH.replace("import os, tfgrad", "import os")
    got = _omp_display(code)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["None", "None"]
    # torch's runtime loads (and shows its settings) first, with OpenMP's default spin
    first = got.stderr.split("OPENMP DISPLAY ENVIRONMENT END")[0]
    assert "GOMP_SPINCOUNT = '" in first and "GOMP_SPINCOUNT = '0'" not in first, got.stderr
