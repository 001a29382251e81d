"""Fake-quant tests beyond the generic conformance tests.

- TF behaviours that surprise, one test each (the module docstring of
  tfgrad.ops.fake_quant lists them); expected values are TF 2.21's outputs as recorded
  in the research notes (semantics.md section 1) or derived by hand from the definition,
  and checked against live TF where it is installed;
- Eigen's reduction order (tree, packets, thread shards) against TF live;
- kernel == reference on hypothesis-generated shapes, ranges and attrs, and == TF live;
- results independent of the Numba thread count; no full-size temporaries.

FakeQuant is piecewise constant: its TF "gradient" is the straight-through estimator,
not a derivative, so there is no finite-difference check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgrad
from tests import oracle
from tests.cases.fake_quant import gradients, values
from tfgrad import raw_ops
from tfgrad._tf import eigen
from tfgrad.ops import fake_quant as fq

F32 = np.float32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ("kernel", "reference")


def run(op: str, impl: str = "kernel", **kw):
    with tfgrad.use_impl(impl):
        return getattr(raw_ops, op)(**kw)


def both(op: str, **kw):
    """Kernel result, after checking that the reference gives the same bits."""
    k = run(op, "kernel", **kw)
    r = run(op, "reference", **kw)
    oracle.assert_outputs(op, k, r, what="kernel vs reference")
    return k


def check_tf(op: str, got, **kw) -> None:
    """Where TF is installed, TF must give the same bits."""
    if oracle.tensorflow() is not None:
        oracle.assert_outputs(op, got, oracle.run_tf(op, kw), what="vs live TF")


def a32(*v) -> np.ndarray:
    return np.array(v, F32)


def same(x, y) -> None:
    oracle.assert_same(np.asarray(x, F32), np.asarray(y, F32))


ARGS = "FakeQuantWithMinMaxArgs"
ARGS_G = "FakeQuantWithMinMaxArgsGradient"
VARS = "FakeQuantWithMinMaxVars"
VARS_G = "FakeQuantWithMinMaxVarsGradient"
PC = "FakeQuantWithMinMaxVarsPerChannel"
PC_G = "FakeQuantWithMinMaxVarsPerChannelGradient"


# --------------------------------------------------------------------------------------
# Pinned TF behaviours (module docstring, items 1-11)
# --------------------------------------------------------------------------------------
def test_vars_divides_args_multiplies():
    # min=1, max=2 is nudged to [0, 1] with scale = f32(1/255). 0.5 * inv = 127.5 rounds
    # up to 128; 0.5 / scale = 127.49999 rounds down to 127 (semantics.md pitfall 1).
    x = a32(0, 0.5, 1, 1.5, 2)
    scale = F32(1) / F32(255)
    a = both(ARGS, inputs=x, min=1.0, max=2.0)
    v = both(VARS, inputs=x, min=F32(1), max=F32(2))
    same(a, [0, F32(128) * scale, 1, 1, 1])
    same(v, [0, F32(127) * scale, 1, 1, 1])
    same(a[1], F32("0.50196081"))
    same(v[1], F32("0.49803925"))
    check_tf(ARGS, a, inputs=x, min=1.0, max=2.0)
    check_tf(VARS, v, inputs=x, min=F32(1), max=F32(2))
    # PerChannel multiplies, as Args.
    p = both(PC, inputs=x[:, None], min=a32(1), max=a32(2))
    same(p[:, 0], a)


def test_output_exceeds_min_max():
    a = both(ARGS, inputs=a32(1.0), min=-1.0, max=1.0)
    same(a, [F32("1.00392163")])
    b = both(ARGS, inputs=a32(-7, -0.0235, 0.0235, 6, 7))
    same(b, a32("-6.02352953", 0, 0, "5.97647047", "5.97647047"))
    check_tf(ARGS, b, inputs=a32(-7, -0.0235, 0.0235, 6, 7))


def test_round_half_up():
    # scale = 1 exactly: plain rounding of x, half up (toward +inf).
    same(both(ARGS, inputs=a32(0.5, 1.5, 2.5), min=0.0, max=255.0), [1, 2, 3])
    same(both(ARGS, inputs=a32(-0.5, -1.5, -2.5), min=-128.0, max=127.0), [0, -1, -2])


def test_ranges_without_zero_are_shifted():
    same(both(VARS, inputs=a32(-3, -1.5, 0, 1), min=F32(-2), max=F32(-1)), [-1, -1, 0, 0])
    same(both(ARGS, inputs=a32(-1, 0, 2), min=1.0, max=2.0), [0, 0, 1])


def test_gradient_mask_is_the_nudged_range_not_the_documented_one():
    # min=-0.1, max=0.9 nudges to [-0.0980392, 0.9019608]; f32(0.902) is already above.
    x = a32(-0.1, -0.098, 0.9, 0.902, 0.9021)
    g = np.ones(5, F32)
    out = both(VARS_G, gradients=g, inputs=x, min=F32(-0.1), max=F32(0.9))
    same(out.backprops_wrt_input, [0, 1, 1, 0, 0])
    same(out.backprop_wrt_min, 1)
    same(out.backprop_wrt_max, 2)
    documented = g * ((x >= F32(-0.1)) & (x <= F32(0.9)))  # the public doc's formula
    assert not np.array_equal(documented, out.backprops_wrt_input)
    check_tf(VARS_G, out, gradients=g, inputs=x, min=F32(-0.1), max=F32(0.9))
    p = both(ARGS_G, gradients=g, inputs=x, min=-0.1, max=0.9)
    same(p, [0, 1, 1, 0, 0])


def test_mask_multiplies_signed_zero_and_nan():
    g = a32(-2, np.inf, np.nan, -1, 3)
    x = a32(10, 10, 10, 0, -10)
    dx = both(ARGS_G, gradients=g, inputs=x)
    # g * 0.0: -0.0 for negative g, NaN for inf and NaN; g * 1.0 = g.
    assert np.signbit(dx[0]) and dx[0] == 0
    assert np.isnan(dx[1]) and np.isnan(dx[2])
    same(dx[3:], [-1, 0])
    out = both(VARS_G, gradients=g, inputs=x, min=F32(-1), max=F32(1))
    assert np.isnan(out.backprop_wrt_max)  # inf * 0 entered the sum
    check_tf(VARS_G, out, gradients=g, inputs=x, min=F32(-1), max=F32(1))


def test_num_bits_2_and_narrow_range():
    x = np.linspace(-1, 1, 5).astype(F32)
    third = F32(2) / F32(3)
    same(both(ARGS, inputs=x, min=-1.0, max=1.0, num_bits=2), [-third, -third, 0, third, third])
    same(both(ARGS, inputs=x, min=-1.0, max=1.0, num_bits=2, narrow_range=True),
         [-1, 0, 0, 1, 1])


def test_num_bits_16():
    got = both(ARGS, inputs=a32(10.03, -10.23, 3), min=-5.0, max=5.0, num_bits=16)
    same(got, a32("4.99992371", "-5.00007629", "3.00007629"))


def test_nan_and_inf_inputs():
    got = both(ARGS, inputs=a32(np.nan, np.inf, -np.inf))
    assert np.isnan(got[0])
    same(got[1:], a32("5.97647047", "-6.02352953"))
    out = both(VARS_G, gradients=np.ones(3, F32), inputs=a32(np.nan, np.inf, -np.inf),
               min=F32(-6), max=F32(6))
    same(out.backprops_wrt_input, [0, 0, 0])  # NaN is in no mask
    same(out.backprop_wrt_min, 1)
    same(out.backprop_wrt_max, 1)


def test_vars_accepts_what_args_rejects():
    # min > max: a constant; min == max != 0: NaN; min == max == 0: zeros (semantics.md 5).
    same(both(VARS, inputs=a32(-2, 0, 2), min=F32(1), max=F32(-1)), [F32("0.99607849")] * 3)
    assert np.isnan(both(VARS, inputs=a32(0, 1), min=F32(1), max=F32(1))).all()
    same(both(VARS, inputs=a32(5, -5, np.nan), min=F32(0), max=F32(0)), [0, 0, 0])
    same(both(VARS, inputs=a32(5, -5), min=F32(-0.0), max=F32(0)), [0, 0])
    with pytest.raises(tfgrad.InvalidArgumentError, match="smaller than max"):
        run(ARGS, inputs=a32(0), min=1.0, max=-1.0)


def test_zero_range_passes_gradients_through_unflushed():
    g = a32(1e-40, -1e-40, np.inf, np.nan)
    out = both(VARS_G, gradients=g, inputs=a32(np.nan, 5, 0, 1), min=F32(0), max=F32(0))
    oracle.assert_same(out.backprops_wrt_input, g)  # a copy: denormals stay
    same(out.backprop_wrt_min, 0)
    same(out.backprop_wrt_max, 0)
    kw = dict(gradients=a32([1e-40, 1e-40], [-1e-40, 1]), inputs=a32([np.nan, 0.5], [5, 0]),
              min=a32(0, -1), max=a32(0, 1))
    pc = both(PC_G, **kw)
    oracle.assert_same(pc.backprops_wrt_input[:, 0], kw["gradients"][:, 0])
    same(pc.backprops_wrt_input[:, 1], [0, 1])  # denormal g flushed in a normal channel
    check_tf(PC_G, pc, **kw)


def test_denormals_are_flushed():
    d = F32(1e-40)
    # DAZ: a denormal max is 0, so Vars(0, 1e-40) is the zero range.
    same(both(VARS, inputs=a32(0.3, -7), min=F32(0), max=d), [0, 0])
    same(both(PC, inputs=a32([0.3, 0.3]), min=a32(0, 0), max=a32(d, 1))[0],
         [0, F32(77) * (F32(1) / F32(255))])
    # A negative denormal input is -0 (inside [0, 1]), a denormal gradient is 0.
    out = both(VARS_G, gradients=np.ones(2, F32), inputs=a32(-d, d), min=F32(0), max=F32(1))
    same(out.backprops_wrt_input, [1, 1])
    same(out.backprop_wrt_min, 0)
    dx = both(ARGS_G, gradients=a32(d, -d), inputs=a32(0, 0))
    oracle.assert_same(dx, a32(0, -0.0))
    # FTZ: 1.5e-38 - 1.4e-38 is denormal, so the sum is 0.
    out = both(VARS_G, gradients=a32(1.5e-38, -1.4e-38), inputs=a32(5, 5), min=F32(0),
               max=F32(1))
    same(out.backprop_wrt_max, 0)
    # A range so small that scale is denormal: scale = 0, NaN outputs.
    assert np.isnan(both(VARS, inputs=a32(1e-38), min=F32(-1e-37), max=F32(1e-37))).all()
    with pytest.raises(tfgrad.InvalidArgumentError, match="was: 0 >= 0"):
        run(ARGS, inputs=a32(0), min=0.0, max=1e-45)


def test_infinite_range_nan_zero_point():
    # min = -inf: scale = inf and zf = NaN, whose uint16 cast is 0 on x86, so nmin =
    # 0 * inf = NaN (no input is in range) or, narrow, 1 * inf = inf.
    x = a32(0, -np.inf, np.inf, 1)
    g = np.ones(4, F32)
    assert np.isnan(both(ARGS, inputs=x, min=-np.inf, max=1.0)).all()
    same(both(ARGS_G, gradients=g, inputs=x, min=-np.inf, max=1.0), [0, 0, 0, 0])
    narrow = both(ARGS_G, gradients=g, inputs=x, min=-np.inf, max=1.0, narrow_range=True)
    same(narrow, [0, 0, 1, 0])
    check_tf(ARGS_G, narrow, gradients=g, inputs=x, min=-np.inf, max=1.0, narrow_range=True)


@pytest.mark.parametrize("shape", [(3,), (2, 3), (2, 2, 3), (2, 1, 2, 3), (1, 2, 1, 2, 1, 3)])
def test_per_channel_any_rank(shape):
    x = np.full(shape, 0.3, F32)
    got = both(PC, inputs=x, min=-np.ones(3, F32), max=np.ones(3, F32))
    same(got, np.full(shape, F32("0.29803923")))
    out = both(PC_G, gradients=np.ones(shape, F32), inputs=x * 10, min=-np.ones(3, F32),
               max=np.ones(3, F32))
    same(out.backprop_wrt_max, np.full(3, x.size // 3))


@pytest.mark.parametrize("d", [2, 4, 8, 12, 16, 24, 29, 40, 72])
@pytest.mark.parametrize("rows", [37, 1000])
def test_per_channel_gradient_every_vector_width(d, rows):
    # The kernel runs a row's channel block as vectors of 16, then 8, then a masked one
    # (a loop below 3 channels): every mix of them, with special values in every lane.
    rng = np.random.default_rng(d * 1000 + rows)
    lo = (-np.linspace(0.5, 2.0, d)).astype(F32)
    hi = np.linspace(0.3, 3.0, d).astype(F32)
    x = values(rng, (rows, d), -1.0, 1.5)
    specials = np.array([0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan], F32)
    x[:7] = specials[:, None]
    x[7], x[8] = lo, hi  # the range's ends: inside
    x[9], x[10] = np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf)  # just outside
    g = gradients(rng, (rows, d))
    g[11:18] = specials[:, None]
    g[18:] *= np.where(rng.random((rows - 18, d)) < 0.5, F32(-1), F32(1))
    out = both(PC_G, gradients=g, inputs=x, min=lo, max=hi)
    check_tf(PC_G, out, gradients=g, inputs=x, min=lo, max=hi)


@pytest.mark.parametrize("memory,perm", [
    ((4, 8, 5, 5), (0, 2, 3, 1)), ((3, 16, 7, 9), (0, 2, 3, 1)), ((2, 3, 6, 6), (0, 2, 3, 1)),
    ((5, 20, 40), (0, 2, 1)), ((6, 5), (1, 0)), ((2, 3, 29, 4, 4), (0, 1, 3, 4, 2)),
    ((3, 7, 1, 5), (0, 2, 3, 1))])
def test_per_channel_channel_first_views(memory, perm):
    # A channels-last view of channel-first memory (what a torch NCHW layer's movedim
    # gives) runs on that memory without copies: the bits of its contiguous copy, in
    # Eigen's order over the channels-last rows, and the outputs in the input's layout.
    rng = np.random.default_rng(len(memory) * 100 + memory[1])
    x = values(rng, (int(np.prod(memory)),), -1.0, 1.5).reshape(memory).transpose(perm)
    d = x.shape[-1]
    g = gradients(rng, x.shape)
    lo = (-np.linspace(0.5, 2.0, d)).astype(F32)
    hi = np.linspace(0.3, 3.0, d).astype(F32)
    lo[d // 2] = hi[d // 2] = 0  # a channel of zeros (passes its gradient through)
    assert not x.flags.c_contiguous and x.base is not None
    xc = np.ascontiguousarray(x)
    y = both(PC, inputs=x, min=lo, max=hi)
    assert y.strides == x.strides
    same(y, run(PC, inputs=xc, min=lo, max=hi))
    out = both(PC_G, gradients=g, inputs=x, min=lo, max=hi)
    assert out.backprops_wrt_input.strides == x.strides
    oracle.assert_outputs(PC_G, out, run(PC_G, gradients=g, inputs=xc, min=lo, max=hi),
                          what="channel-first view vs contiguous")
    check_tf(PC_G, out, gradients=g, inputs=xc, min=lo, max=hi)


def test_empty():
    assert both(ARGS, inputs=np.zeros((0, 3), F32)).shape == (0, 3)
    out = both(VARS_G, gradients=np.zeros(0, F32), inputs=np.zeros(0, F32), min=F32(-1),
               max=F32(1))
    same(out.backprop_wrt_min, 0)
    out = both(PC_G, gradients=np.zeros((0, 3), F32), inputs=np.zeros((0, 3), F32),
               min=-np.ones(3, F32), max=np.ones(3, F32))
    same(out.backprop_wrt_max, [0, 0, 0])


def test_float64_and_float16_inputs_are_converted():
    x = np.array([0.1, -0.7], np.float64)
    got = run(ARGS, inputs=x)
    assert got.dtype == F32
    same(got, run(ARGS, inputs=x.astype(F32)))
    same(run(VARS, inputs=x.astype(np.float16), min=-1.0, max=1.0),
         run(VARS, inputs=x.astype(np.float16).astype(F32), min=F32(-1), max=F32(1)))


def test_error_message_formats_like_tf():
    with pytest.raises(tfgrad.InvalidArgumentError, match=r"was: 0.3 >= 0.25$"):
        run(ARGS, inputs=a32(0), min=0.3, max=0.25)
    with pytest.raises(tfgrad.InvalidArgumentError, match=r"was: 1e\+10 >= -inf$"):
        run(ARGS, inputs=a32(0), min=1e10, max=-np.inf)


# --------------------------------------------------------------------------------------
# Eigen's reduction order
# --------------------------------------------------------------------------------------
def sequential_sum(v: np.ndarray) -> F32:
    acc = F32(0)
    for t in v.astype(F32):
        acc = F32(acc + t)
    return acc


def test_eigen_order_is_not_sequential_nor_pairwise():
    rng = np.random.default_rng(7)
    g = gradients(rng, (20011,), special=False)
    x = np.full(g.shape, 5, F32)
    out = both(VARS_G, gradients=g, inputs=x, min=F32(-1), max=F32(1))
    assert out.backprop_wrt_max == eigen.full_sum(g)
    assert out.backprop_wrt_max != sequential_sum(g)
    assert out.backprop_wrt_max != np.sum(g)
    check_tf(VARS_G, out, gradients=g, inputs=x, min=F32(-1), max=F32(1))


def test_eigen_split_points():
    # Leaves of at most 8192 values; splits half way, rounded up to a packet of 8 from
    # the tensor's start (not the range's).
    assert eigen.split(0, 8193) == 4104
    assert eigen.split(4104, 4089) == 6152
    prog, starts, top, _, _ = eigen.reduction_plan(20000, 1, fq.COST_FLAT)
    leaves = [(int(f), int(m)) for op, f, m in prog if op == eigen.OP_LEAF]
    assert sum(m for _, m in leaves) == 20000
    assert all(m <= eigen.LEAF and f % 8 == 0 for f, m in leaves)


def test_shard_model():
    # TF's cost model: 2 threads from 50150 values (flat) / 44800 (per channel).
    assert eigen.num_threads(50149, fq.COST_FLAT, 2) == 1
    assert eigen.num_threads(50150, fq.COST_FLAT, 2) == 2
    assert eigen.num_threads(44799, fq.COST_CHIP, 16) == 1
    assert eigen.num_threads(80000, fq.COST_FLAT, 16) == 3
    assert eigen.num_threads(10**6, fq.COST_FLAT, 16) == 16
    assert eigen.num_threads(10**6, fq.COST_FLAT, 1) == 1
    blocks, rest = eigen.shards(80001, 3)
    assert blocks == [(0, 26667), (26667, 26667), (53334, 26667)] and rest is None


# TF in a process of its own with argv[1] intra-op threads (set once per process), on
# the arrays of the .npz file argv[2]; the scripts print the list `out` as JSON.
_TF_PREAMBLE = r"""
import json, os, sys
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
d = np.load(sys.argv[2])
out = []
"""

_TF_SCRIPT = _TF_PREAMBLE + r"""
r = tf.raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=d["g"], inputs=d["x"],
                                                min=d["lo"], max=d["hi"])
out.append([float(r[1]), float(r[2])])
r = tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
    gradients=d["g"].reshape(-1, 3), inputs=d["x"].reshape(-1, 3),
    min=np.repeat(d["lo"], 3), max=np.repeat(d["hi"], 3))
out.append([r[1].numpy().tolist(), r[2].numpy().tolist()])
print(json.dumps(out))
"""


@pytest.mark.live
@pytest.mark.parametrize("threads", [2, 3, 16])
def test_sums_match_tf_thread_pool_shards(threads, tmp_path, monkeypatch):
    """TF splits big sums across its intra-op threads; tfgrad reproduces any count."""
    rng = np.random.default_rng(threads)
    n = 3 * 70001  # flat: 210003 values (8 shards at most); per channel: 70001 rows (3)
    g = gradients(rng, (n,), special=False)
    x = values(rng, (n,), -1.0, 1.0, special=False)
    lo, hi = np.array(-0.5, F32), np.array(0.5, F32)
    np.savez(tmp_path / "d.npz", g=g, x=x, lo=lo, hi=hi)
    res = subprocess.run([sys.executable, "-c", _TF_SCRIPT, str(threads), str(tmp_path / "d.npz")],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert res.returncode == 0, res.stderr[-2000:]
    (tmin, tmax), (pmin, pmax) = json.loads(res.stdout.strip().splitlines()[-1])
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(threads))
    assert eigen.num_threads(n, fq.COST_FLAT, threads) == min(threads, 8)
    assert eigen.num_threads(n // 3, fq.COST_CHIP, threads) == min(threads, 3)
    for impl in IMPLS if threads == 3 else ("kernel",):  # the reference is slow here
        out = run(VARS_G, impl, gradients=g, inputs=x, min=lo, max=hi)
        assert (float(out.backprop_wrt_min), float(out.backprop_wrt_max)) == (tmin, tmax), impl
        out = run(PC_G, impl, gradients=g.reshape(-1, 3), inputs=x.reshape(-1, 3),
                  min=np.repeat(lo, 3), max=np.repeat(hi, 3))
        assert out.backprop_wrt_min.tolist() == pmin, impl
        assert out.backprop_wrt_max.tolist() == pmax, impl


def test_shard_model_many_threads():
    # Eigen's TensorCostModel::numThreads: int((n * cost - 1e5) / 1e5 + 0.9), at most TF's
    # count, so k threads from n * cost >= (k + 0.1) * 1e5. Vars (67/16 a value): 12 from
    # n = 288956 (12.0000325; 288955 gives 11.99999), 64 from 1530747 (64.00003;
    # 1530746: 63.99999). PerChannel (75/16 a row): 12 from 258134, 64 from 1367467.
    for n, k in ((288955, 11), (288956, 12), (1530746, 63), (1530747, 64)):
        assert eigen.num_threads(n, fq.COST_FLAT, 64) == k
    for n, k in ((258133, 11), (258134, 12), (1367466, 63), (1367467, 64)):
        assert eigen.num_threads(n, fq.COST_CHIP, 64) == k
    assert eigen.num_threads(1530747, fq.COST_FLAT, 32) == 32  # capped at TF's count
    # FullReducer's blocks: blocksize = n // threads, n // blocksize of them, what is left
    # summed first (on the calling thread): 1530747 values on 64 threads are 64 blocks of
    # 23917 and 59 left from 1530688; on 63, 63 blocks of 24297 and 35 left.
    blocks, rest = eigen.shards(1530747, 64)
    assert (len(blocks), blocks[1], rest) == (64, (23917, 23917), (1530688, 59))
    blocks, rest = eigen.shards(1530746, 63)
    assert (len(blocks), blocks[-1], rest) == (63, (1506414, 24297), (1530711, 35))
    # More blocks than threads where n < threads**2: 11 values on 4 -> 5 blocks of 2, 1 left.
    assert eigen.shards(11, 4) == ([(0, 2), (2, 2), (4, 2), (6, 2), (8, 2)], (10, 1))


_TF_THRESHOLD_SCRIPT = _TF_PREAMBLE + r"""
for k in sorted(d.files):
    g = d[k]
    if g.ndim == 1:
        r = tf.raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=g, inputs=np.full_like(g, 5),
                                                        min=np.float32(-1), max=np.float32(1))
    else:
        r = tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
            gradients=g, inputs=np.full_like(g, 5), min=-np.ones(g.shape[1], np.float32),
            max=np.ones(g.shape[1], np.float32))
    out.append(r[2].numpy().tolist())
print(json.dumps(out))
"""

# Per thread count: the sizes where TF's k-thread split starts (test_shard_model_many_threads)
# and the one below, flat (Vars) and in rows of 2 channels (PerChannel).
_THRESHOLDS = {12: ((288955, 288956), (258133, 258134)),
               64: ((1530746, 1530747), (1367466, 1367467))}


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("threads", sorted(_THRESHOLDS))
def test_sums_at_tf_shard_thresholds(threads, tmp_path, monkeypatch):
    """TF's sums at the sizes where it starts to use all its threads (T and T - 1 blocks,
    with the rest), on more threads than this machine has: every input is above the
    range, so dmax is the sum of the gradients."""
    rng = np.random.default_rng(threads)
    flat, rows = _THRESHOLDS[threads]
    data = [gradients(rng, (n,), special=False) for n in flat]
    data += [gradients(rng, (n, 2), special=False) for n in rows]
    np.savez(tmp_path / "d.npz", **{f"a{i}": g for i, g in enumerate(data)})
    res = subprocess.run([sys.executable, "-c", _TF_THRESHOLD_SCRIPT, str(threads),
                          str(tmp_path / "d.npz")], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert res.returncode == 0, res.stderr[-2000:]
    want = json.loads(res.stdout.strip().splitlines()[-1])
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(threads))
    # T - 1 and T blocks sum the same data differently: the sizes tell the splits apart.
    g = data[1]
    assert eigen.sharded_sum(g, threads) != eigen.sharded_sum(g, threads - 1)
    for g, expected in zip(data, want):
        one = np.ones(g.shape[1:], F32)
        op = VARS_G if g.ndim == 1 else PC_G
        lo, hi = (F32(-1), F32(1)) if g.ndim == 1 else (-one, one)
        out = run(op, gradients=g, inputs=np.full_like(g, 5), min=lo, max=hi)
        assert np.asarray(out.backprop_wrt_max).tolist() == expected, g.shape


_BIG_SCRIPT = r"""
import os, sys
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2)
sys.path.insert(0, sys.argv[1])
from tests.test_fake_quant import big_block_case
g, x = big_block_case()
r = tf.raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=g, inputs=x, min=np.float32(-1),
                                                max=np.float32(1))
print(float(r[2]))
"""


def big_block_case() -> tuple[np.ndarray, np.ndarray]:
    """n = 2 * 16777217 + 1 values: Eigen's shard size n // 2 = 16777217 (integer
    division), where float32(n) / 2 would give 16777218. The values make the two orders
    differ: ((1 + 2**24) + -2**24) = 0 against ((-2**24 + 1) + 2**24) = 1."""
    n = 2 * 16777217 + 1
    g = np.zeros(n, F32)
    g[[0, 20_000_000, n - 1]] = [2.0**24, -(2.0**24), 1.0]
    return g, np.full(n, 5, F32)


@pytest.mark.live
@pytest.mark.slow
def test_shard_size_is_integer_division(monkeypatch):
    res = subprocess.run([sys.executable, "-c", _BIG_SCRIPT, ROOT], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    expected = float(res.stdout.strip().splitlines()[-1])
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", "2")
    g, x = big_block_case()
    out = run(VARS_G, gradients=g, inputs=x, min=F32(-1), max=F32(1))
    assert float(out.backprop_wrt_max) == expected == 0.0


_THREADS_SCRIPT = r"""
import hashlib, sys
import numpy as np
import tfgrad
sys.path.insert(0, sys.argv[1])
from tests.cases.fake_quant import gradients, values
rng = np.random.default_rng(3)
h = hashlib.sha256()
for shape in [(60013, 3), (9000, 40), (16391, 1)]:
    g = gradients(rng, shape)
    x = values(rng, shape, -1.0, 1.5)
    lo = rng.uniform(-2, 0, shape[-1]).astype(np.float32)
    hi = rng.uniform(0, 2, shape[-1]).astype(np.float32)
    for r in tfgrad.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
            gradients=g, inputs=x, min=lo, max=hi):
        h.update(np.ascontiguousarray(r).tobytes())
    for r in tfgrad.raw_ops.FakeQuantWithMinMaxVarsGradient(
            gradients=g, inputs=x, min=lo[0], max=hi[0]):
        h.update(np.ascontiguousarray(r).tobytes())
    h.update(tfgrad.raw_ops.FakeQuantWithMinMaxVarsPerChannel(inputs=x, min=lo, max=hi).tobytes())
x = values(rng, (16 * 24 * 300,), -1.0, 1.5).reshape(16, 24, 300).transpose(0, 2, 1)
g = gradients(rng, x.shape)  # (a channels-last view of channel-first memory)
lo, hi = np.full(24, -0.7, np.float32), np.full(24, 1.1, np.float32)
for r in tfgrad.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
        gradients=g, inputs=x, min=lo, max=hi):
    h.update(np.ascontiguousarray(r).tobytes())
h.update(np.ascontiguousarray(tfgrad.raw_ops.FakeQuantWithMinMaxVarsPerChannel(
    inputs=x, min=lo, max=hi)).tobytes())
print(h.hexdigest())
"""


def test_results_do_not_depend_on_numba_threads():
    digests = []
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads, TFGRAD_TF_INTRA_OP_THREADS="2",
                   OMP_WAIT_POLICY="passive")
        res = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, ROOT], env=env,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        digests.append(res.stdout.strip())
    assert digests[0] == digests[1]


# --------------------------------------------------------------------------------------
# Property tests: kernel == reference (and == TF live) on generated cases
# --------------------------------------------------------------------------------------
_ROWS = st.sampled_from([1, 2, 7, 31, 32, 33, 255, 1000, 8191, 8192, 8193, 8200, 16383,
                         16385, 20001, 24590])


@st.composite
def fq_case(draw, per_channel: bool, big: bool = True):
    rows = draw(_ROWS) if big else draw(st.integers(0, 70))
    # d >= 32 with few leaves splits the channels into blocks across tasks.
    d = draw(st.sampled_from([1, 2, 3, 5, 33, 40])) if per_channel else 1
    lead = draw(st.sampled_from([(rows,), (1, rows), (rows, 1)])) if rows < 40 else (rows,)
    shape = lead + (d,) if per_channel else lead
    seed = draw(st.integers(0, 2**32 - 1))
    nb = draw(st.integers(2, 16))
    narrow = draw(st.booleans())
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["straddle", "positive", "negative", "tiny", "odd"]))
    lo = {"straddle": -1.3, "positive": 0.2, "negative": -5.0, "tiny": -1e-30, "odd": 0.0}[kind]
    hi = {"straddle": 0.7, "positive": 3.0, "negative": -0.3, "tiny": 3e-30, "odd": 0.0}[kind]
    if per_channel:
        lo_a = np.full(d, lo, F32) * rng.uniform(0.5, 1.5, d).astype(F32)
        hi_a = np.full(d, hi, F32) * rng.uniform(0.5, 1.5, d).astype(F32)
        mn, mx = lo_a, hi_a
    else:
        mn, mx = np.array(lo, F32), np.array(hi, F32)
    x = values(rng, shape, lo, hi, nb, narrow, special=draw(st.booleans()))
    g = gradients(rng, shape)
    return dict(gradients=g, inputs=x, min=mn, max=mx, num_bits=nb, narrow_range=narrow)


_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _fwd(kw):
    return {k: v for k, v in kw.items() if k != "gradients"}


def _args(kw):
    return dict(kw, min=float(kw["min"]), max=float(kw["max"]))


@_SETTINGS
@given(fq_case(per_channel=True))
def test_per_channel_kernel_equals_reference(kw):
    both(PC_G, **kw)
    both(PC, **_fwd(kw))


@_SETTINGS
@given(fq_case(per_channel=False))
def test_scalar_kernel_equals_reference(kw):
    both(VARS_G, **kw)
    both(VARS, **_fwd(kw))
    if kw["min"] < kw["max"]:
        both(ARGS_G, **_args(kw))
        both(ARGS, **_args(_fwd(kw)))


@pytest.mark.live
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fq_case(per_channel=True), fq_case(per_channel=False))
def test_random_cases_match_tf(pc, flat):
    if oracle.tensorflow() is None:
        pytest.skip("TensorFlow not installed")
    for op, kw in ((PC_G, pc), (PC, _fwd(pc)), (VARS_G, flat), (VARS, _fwd(flat))):
        oracle.assert_outputs(op, run(op, **kw), oracle.run_tf(op, kw), what=op)
    if flat["min"] < flat["max"]:
        for op, kw in ((ARGS_G, _args(flat)), (ARGS, _args(_fwd(flat)))):
            oracle.assert_outputs(op, run(op, **kw), oracle.run_tf(op, kw), what=op)


# --------------------------------------------------------------------------------------
# Memory: outputs plus O(channels)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [ARGS, ARGS_G, VARS, VARS_G, PC, PC_G])
def test_no_full_size_temporaries(op):
    rng = np.random.default_rng(0)
    shape = (4000, 64)
    kw = dict(gradients=gradients(rng, shape), inputs=values(rng, shape, -1, 1))
    if op in (PC, PC_G):
        kw.update(min=-np.ones(64, F32), max=np.ones(64, F32))
    elif op in (VARS, VARS_G):
        kw.update(min=np.array(-1, F32), max=np.array(1, F32))
    if op in (ARGS, VARS, PC):
        del kw["gradients"]
    run(op, **kw)  # compile first
    tracemalloc.start()
    try:
        out = run(op, **kw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    outputs = sum(np.asarray(o).nbytes for o in oracle.as_tuple(out))
    assert peak <= outputs + 64 * 1024, (peak, outputs)


@pytest.mark.live
@pytest.mark.parametrize("op", ["FakeQuantWithMinMaxVarsPerChannel",
                                "FakeQuantWithMinMaxVarsPerChannelGradient"])
def test_live_per_channel_rank0_inputs(op):
    """TF 2.21's eager kernel aborts the process on a rank-0 ``inputs``; in a tf.function
    its shape function rejects it, in the words tfgrad raises."""
    args = "inputs=x, min=-np.ones(1, np.float32), max=np.ones(1, np.float32)"
    if op.endswith("Gradient"):
        args = "gradients=x, " + args
    call = f"tf.raw_ops.{op}({args})"
    code = ("import sys, numpy as np, tensorflow as tf\nx = np.float32(0.3)\n"
            f"if sys.argv[1] == 'eager':\n    {call}\n"
            f"else:\n    tf.function(lambda x: {call})(tf.constant(x))\n")
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "0"}
    eager = subprocess.run([sys.executable, "-c", code, "eager"], capture_output=True,
                           text=True, timeout=600, env=env)
    assert eager.returncode < 0 and "Check failed: d >= 0" in eager.stderr, eager.stderr[-2000:]
    graph = subprocess.run([sys.executable, "-c", code, "graph"], capture_output=True,
                           text=True, timeout=600, env=env)
    words = "Shape must be at least rank 1 but is rank 0"
    assert graph.returncode == 1 and f"ValueError: {words}" in graph.stderr, graph.stderr[-2000:]
    kw = dict(inputs=np.float32(0.3), min=-np.ones(1, np.float32), max=np.ones(1, np.float32))
    if op.endswith("Gradient"):
        kw["gradients"] = np.float32(1)
    with pytest.raises(tfgrad.InvalidArgumentError, match=words):
        getattr(raw_ops, op)(**kw)


_EDGES = [0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38, 1.1754944e-38, 6.0, -6.0,
          1e-30, -1e-30, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 0.1, -0.1, 1.0, 255.0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_EDGES) | st.floats(width=32, allow_nan=True),
                          st.sampled_from(_EDGES) | st.floats(width=32, allow_nan=True)),
                min_size=1, max_size=9),
       st.integers(2, 16), st.booleans())
def test_compiled_nudge_is_the_references(pairs, bits, narrow):
    # The kernels nudge per call (a QAT step's ranges change every step): the compiled
    # Nudge must give the reference's values, flushes, NaN and zero-range cases included.
    mn = np.array([a for a, _ in pairs], np.float32)
    mx = np.array([b for _, b in pairs], np.float32)
    for lo, hi in ((mn, mx), (mn[:1].reshape(()), mx[:1].reshape(()))):
        with tfgrad.use_impl("kernel"):
            got = fq.nudge(lo, hi, bits, narrow)
        want = fq._nudge(lo, hi, bits, narrow)
        for name in ("nmin", "nmax", "scale", "inv", "qz", "zero"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.shape == b.shape and a.dtype == b.dtype, name
            assert a.tobytes() == b.tobytes() or (
                np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(
                    np.where(np.isnan(a), 0, a).view(np.uint32) if a.dtype == np.float32 else a,
                    np.where(np.isnan(b), 0, b).view(np.uint32) if b.dtype == np.float32 else b)
            ), (name, lo, hi, a, b)
