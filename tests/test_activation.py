"""Relu, Relu6, ReluGrad, Relu6Grad: TF 2.21's behaviours pinned (docs/activation.md).

1. Relu of a negative denormal: +0 in the packet body, the denormal itself for the first
   value of an odd scalar tail, -0 for the tail's pairs (float32: packets of 8, float64: 4);
2. Relu6 keeps denormals and -0 in its whole tail, flushes them to +0 in the body;
3. bfloat16 flushes in its body (-denormal gives -0), float16 never flushes;
4. NaN passes through Relu / Relu6 with its payload and sign;
5. the gradients multiply: zeros of the gradient's sign, inf * 0 = the default NaN, NaN
   gradients quietened (bfloat16: canonical), denormal gradients and features flushed;
6. the gradient table: Relu's and Relu6's gradients use the forward's output, the gradient
   ops' gradients their features (second derivatives as TF's tape);
7. large tensors (TF's threads) live, and the same bits on 1 or 2 Numba threads.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import tfgrad
from tests import oracle
from tfgrad import raw_ops

F32 = np.float32


def run(op: str, impl: str = "kernel", **kw):
    with tfgrad.use_impl(impl):
        return getattr(raw_ops, op)(**kw)


def both(op: str, **kw) -> np.ndarray:
    """Kernel result, after checking the reference and (where installed) TF live."""
    k = run(op, "kernel", **kw)
    oracle.assert_outputs(op, k, run(op, "reference", **kw), what="kernel vs reference")
    if oracle.tensorflow() is not None:
        oracle.assert_outputs(op, k, oracle.run_tf(op, kw), what="vs live TF")
    return k


def signs(a: np.ndarray) -> str:
    """'+' / '-' zeros, 'd' a kept denormal, 'x' anything else."""
    tiny = np.finfo(a.dtype).tiny if a.dtype != np.dtype("bfloat16") else 1.2e-38
    out = []
    for v in a.astype(np.float64):
        if v == 0:
            out.append("-" if np.signbit(v) else "+")
        else:
            out.append("d" if abs(v) < tiny else "x")
    return "".join(out)


@pytest.mark.parametrize("n,expected", [
    (1, "d"), (2, "--"), (3, "d--"), (7, "d------"), (8, "+" * 8), (9, "+" * 8 + "d"),
    (12, "+" * 8 + "----"), (15, "+" * 8 + "d------"), (1003, "+" * 1000 + "d--"),
])
def test_relu_negative_denormal_body_and_tail(n, expected):
    assert signs(both("Relu", features=np.full(n, -1e-40, F32))) == expected


def test_relu_float64_packets_of_four():
    x = np.full(7, -1e-310)
    assert signs(both("Relu", features=x)) == "++++d--"


def test_relu6_tail_keeps_denormals_and_negative_zero():
    assert signs(both("Relu6", features=np.full(11, -1e-40, F32))) == "+" * 8 + "ddd"
    assert signs(both("Relu6", features=np.full(11, -0.0, F32))) == "+" * 8 + "---"
    assert signs(both("Relu", features=np.full(11, -0.0, F32))) == "+" * 8 + "---"


def test_half_types():
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    assert signs(both("Relu", features=np.full(11, -1e-40, bf))) == "-" * 8 + "ddd"
    h = both("Relu", features=np.array([-1e-7, 1e-7, -0.0, -1.0], np.float16))
    assert signs(h) == "+d-+"


def test_nan_passes_with_payload():
    bits = np.array([0x7FC00001, 0xFFC00002, 0x7F800003] * 3, np.uint32)
    for op in ("Relu", "Relu6"):
        out = both(op, features=bits.view(F32))
        assert (out.view(np.uint32) == bits).all(), op


def test_gradients_multiply():
    g = np.array([1.5, -1.5, -1.5, np.inf, -np.inf, 1e-40, 2.0, 2.0, 2.0], F32)
    f = np.array([1.0, -1.0, 1e-40, -1.0, 6.0, 1.0, np.nan, 6.0, 5.9999995], F32)
    r = both("ReluGrad", gradients=g, features=f)
    assert signs(r[:3]) == "x--" and r[0] == 1.5
    assert r[3].view(np.uint32) == 0xFFC00000 and r[4] == -np.inf  # inf * 0; 6 > 0
    r6 = both("Relu6Grad", gradients=g, features=f)
    assert r6[4].view(np.uint32) == 0xFFC00000 and r6[7] == 0 and r6[8] == 2.0
    assert signs(r[5:7]) == "++"  # a denormal gradient flushed; NaN features mask out


def test_gradient_table_second_order():
    torch = pytest.importorskip("torch")
    import tfgrad.torch

    x = torch.tensor(np.array([-2.0, 0.5, 3.0, 7.0, 6.0], F32), requires_grad=True)
    y = tfgrad.torch.relu6(x)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert g.tolist() == [0.0, 1.0, 1.0, 0.0, 0.0]
    (gg,) = torch.autograd.grad(g.sum(), x, allow_unused=True)
    assert gg is None or not gg.any()  # TF: zeros_like(features)
    tf = oracle.tensorflow()
    if tf is not None:
        xt = tf.constant(x.detach().numpy())
        with tf.GradientTape() as tape:
            tape.watch(xt)
            yt = tf.nn.relu6(xt)
        oracle.assert_same(g.detach().numpy(), tape.gradient(yt, xt).numpy())


@pytest.mark.live
def test_large_live_and_threads():
    if oracle.tensorflow() is None:
        pytest.skip("TensorFlow is not installed")
    rng = np.random.default_rng(5)
    n = 1_000_003
    x = rng.uniform(-8, 8, n).astype(F32)
    x[rng.random(n) < 0.01] = -1e-40
    x[-3:] = -1e-40
    g = rng.standard_normal(n).astype(F32)
    for op, kw in (("Relu6", dict(features=x)), ("Relu", dict(features=x)),
                   ("ReluGrad", dict(gradients=g, features=x))):
        want = oracle.run_tf(op, kw)
        old = numba.get_num_threads()
        try:
            for t in sorted({1, numba.config.NUMBA_NUM_THREADS}):
                numba.set_num_threads(t)
                oracle.assert_outputs(op, run(op, **kw), want, what=f"{t} threads")
        finally:
            numba.set_num_threads(old)
