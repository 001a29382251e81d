"""BiasAdd, BiasAddGrad, Identity: TF 2.21's behaviours pinned (docs/bias_add.md).

1. BiasAdd flushes denormal operands and sums (FTZ / DAZ) and returns value's NaN when
   both operands are NaN; NCHW is computed on the CPU, as TF's CPU kernel does;
2. BiasAddGrad NHWC is TF's ReduceOuterDimensions: a single row passes through untouched
   (-0 and denormals kept), more rows are summed from +0 in TF's row blocks;
3. BiasAddGrad NCHW is ReduceMiddleDimensions (ranges cutting rows, Eigen's full reducer
   per piece);
4. the blocks depend on TF's intra-op thread count: the model against TF live with 1 and
   4 threads (a subprocess each);
5. the gradient table: BiasAdd's value gradient is the incoming gradient (Identity), its
   bias gradient BiasAddGrad; BiasAddGrad's gradient broadcasts (TF's reshape + tile);
6. results do not depend on the Numba thread count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

import tfgrad
from tests import oracle
from tfgrad import raw_ops
from tfgrad._tf import redux
from tfgrad.ops import bias_add as ba

F32 = np.float32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(op: str, impl: str = "kernel", **kw):
    with tfgrad.use_impl(impl):
        return getattr(raw_ops, op)(**kw)


def both(op: str, **kw) -> np.ndarray:
    k = run(op, "kernel", **kw)
    oracle.assert_outputs(op, k, run(op, "reference", **kw), what="kernel vs reference")
    if oracle.tensorflow() is not None:
        oracle.assert_outputs(op, k, oracle.run_tf(op, kw), what="vs live TF")
    return k


def test_bias_add_flushes_and_picks_value_nan():
    v = np.array([[-0.0, 1e-40, 1.0, np.nan]], F32)
    nan2 = np.array([0xFFC00002], np.uint32).view(F32)[0]
    b = np.array([-1e-40, 0.0, -1.0 + 2**-23, nan2], F32)
    out = both("BiasAdd", value=v, bias=b)
    assert np.signbit(out[0, 0]) and out[0, 0] == 0  # -0 + (-denormal -> -0) = -0
    assert out[0, 1] == 0 and not np.signbit(out[0, 1])
    assert out[0, 2] == 2**-23
    assert out.view(np.uint32)[0, 3] == np.float32(np.nan).view(np.uint32)  # value's NaN
    inf = both("BiasAdd", value=np.full((9, 1), np.inf, F32), bias=np.array([-np.inf], F32))
    assert (inf.view(np.uint32) == 0xFFC00000).all()  # inf - inf: the default NaN


def test_bias_add_nchw():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((2, 3, 4, 5)).astype(F32)
    b = rng.standard_normal(3).astype(F32)
    out = both("BiasAdd", value=v, bias=b, data_format="NCHW")
    assert np.array_equal(out, v + b[:, None, None])


def test_single_row_passes_through():
    g = np.array([[-0.0, 1e-40, -1e-40, 3.0]], F32)
    out = both("BiasAddGrad", out_backprop=g)
    assert (out.view(np.uint32) == g.view(np.uint32)).all()
    two = both("BiasAddGrad", out_backprop=np.concatenate([g, np.zeros_like(g)]))
    assert two.tolist() == [0.0, 0.0, 0.0, 3.0] and not np.signbit(two[0])


def test_empty_shapes():
    assert both("BiasAddGrad", out_backprop=np.zeros((0, 3), F32)).tolist() == [0, 0, 0]
    assert both("BiasAddGrad", out_backprop=np.zeros((3, 0), F32)).shape == (0,)


# TF in a process of its own with argv[1] intra-op threads, on BiasAddGrad cases given as
# JSON; prints the outputs' bits.
_TF_SCRIPT = r"""
import json, os, sys
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
out = []
for shape, fmt, seed in json.loads(sys.argv[2]):
    g = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    r = tf.raw_ops.BiasAddGrad(out_backprop=g, data_format=fmt).numpy()
    out.append(r.view(np.uint32).tolist())
print(json.dumps(out))
"""
_THREAD_CASES = [((5000, 3), "NHWC", 1), ((300, 8, 9), "NHWC", 2), ((6, 5, 700), "NCHW", 3),
                 ((40, 3, 50), "NCHW", 4), ((2000, 40), "NHWC", 5)]


@pytest.mark.live
@pytest.mark.parametrize("threads", [1, 4])
def test_thread_count_dependent_blocks(threads, monkeypatch):
    if oracle.tensorflow() is None:
        pytest.skip("TensorFlow is not installed")
    res = subprocess.run([sys.executable, "-c", _TF_SCRIPT, str(threads),
                          json.dumps(_THREAD_CASES)], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    want = json.loads(res.stdout.strip().splitlines()[-1])
    for (shape, fmt, seed), bits in zip(_THREAD_CASES, want):
        g = np.random.default_rng(seed).standard_normal(shape).astype(F32)
        b, c, hw = ba.three_dims(g.shape, fmt)
        got = (redux.reduce_outer(g.reshape(b, c), threads) if hw == 1
               else redux.reduce_middle(g.reshape(b, c, hw), threads))
        assert got.view(np.uint32).tolist() == bits, (shape, fmt, threads)


def test_numba_threads_do_not_change_bits():
    rng = np.random.default_rng(3)
    g = rng.standard_normal((16, 28, 28, 16)).astype(F32)
    v = rng.standard_normal(g.shape).astype(F32)
    b = rng.standard_normal(16).astype(F32)
    old = numba.get_num_threads()
    results = []
    try:
        for t in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(t)
            results.append((run("BiasAddGrad", out_backprop=g),
                            run("BiasAdd", value=v, bias=b)))
    finally:
        numba.set_num_threads(old)
    for r in results[1:]:
        oracle.assert_same(r[0], results[0][0])
        oracle.assert_same(r[1], results[0][1])


def test_gradient_table_torch():
    torch = pytest.importorskip("torch")
    import tfgrad.torch

    rng = np.random.default_rng(4)
    v = torch.tensor(rng.standard_normal((5, 3)).astype(F32), requires_grad=True)
    b = torch.tensor(rng.standard_normal(3).astype(F32), requires_grad=True)
    up = torch.tensor(rng.standard_normal((5, 3)).astype(F32))
    y = tfgrad.torch.bias_add(v, b)
    gv, gb = torch.autograd.grad(y, (v, b), up, create_graph=True)
    assert torch.equal(gv, up)  # TF passes the incoming gradient on
    oracle.assert_same(gb.detach().numpy(), run("BiasAddGrad", out_backprop=up.numpy()))
    # BiasAddGrad's gradient: the incoming gradient tiled over the rows (TF's tile)
    u = torch.tensor(rng.standard_normal((5, 3)).astype(F32), requires_grad=True)
    s = tfgrad.torch.bias_add_grad(u)
    w = torch.tensor(rng.standard_normal(3).astype(F32))
    (gu,) = torch.autograd.grad(s, u, w)
    assert torch.equal(gu, w.expand(5, 3))
