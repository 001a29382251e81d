"""MaxPool and MaxPoolGrad: TF 2.21's behaviours pinned (docs/max_pool.md).

1. MaxPool never takes a NaN: a window of NaNs, or of -inf, gives the lowest finite
   value (the start of TF's running maximum); of equal values the first stays (+0 then
   -0 gives +0, -0 then +0 gives -0); denormals count, and come out, as zeros of their
   sign; the same for any channel count (Eigen's packets and scalar tail agree);
2. MaxPoolGrad does not read orig_output's values; its argmax is the window's first
   element unless a later one is larger: the first of tied maxima, a NaN when first;
3. an input under several windows sums their gradients in the output's order, from +0,
   each addition flushed (FTZ / DAZ);
4. with no windows (empty output) tfgrad's gradient is zeros (TF's is uninitialized);
5. kernel == reference on random geometries; the same bits on 1 and 2 Numba threads;
6. the gradient table: MaxPool's gradient is MaxPoolGrad of its input and output
   (torch autograd and jax.grad), MaxPoolGrad has none (TF's MaxPoolGradGrad is not
   implemented).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import tfgrad
from tests import oracle
from tfgrad import raw_ops

F32 = np.float32
DEN = np.finfo(F32).smallest_subnormal
LOWEST = np.finfo(F32).min


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


def _row(*values: float, depth: int = 1) -> np.ndarray:
    """One row of pixels [1, 1, len(values), depth], each pixel's channels equal."""
    return np.repeat(np.array(values, F32)[:, None], depth, 1)[None, None]


POOL_ROW = {"strides": [1, 1, 1, 1], "padding": "VALID"}


def bits(a: np.ndarray) -> set[int]:
    return set(np.asarray(a, F32).view(np.uint32).ravel().tolist())


@pytest.mark.parametrize("depth", [1, 3, 8, 9, 17, 20])
@pytest.mark.parametrize("window,expected", [
    ((np.nan, 1.0), 1.0), ((1.0, np.nan), 1.0), ((np.nan, np.nan), LOWEST),
    ((-np.inf, -np.inf), LOWEST), ((0.0, -0.0), 0.0), ((-0.0, 0.0), -0.0),
    ((DEN, 0.0), 0.0), ((-0.0, DEN), -0.0), ((-DEN, -1.0), -0.0), ((DEN, -1.0), 0.0),
])
def test_max_pool_nan_inf_zero_signs_denormals(depth, window, expected):
    y = both("MaxPool", input=_row(*window, depth=depth), ksize=[1, 1, 2, 1], **POOL_ROW)
    assert bits(y) == bits(np.array([expected], F32))


def _grad_of_row(*values: float) -> np.ndarray:
    x = _row(*values)
    g = np.array([[[[1.5]]]], F32)
    y = np.array([[[[123.0]]]], F32)  # (any values: TF reads only the shape)
    return both("MaxPoolGrad", orig_input=x, orig_output=y, grad=g,
                ksize=[1, 1, len(values), 1], **POOL_ROW).ravel()


@pytest.mark.parametrize("window,argmax", [
    ((1.0, 1.0, 1.0), 0), ((np.nan, 2.0, 1.0), 0), ((1.0, np.nan, 2.0), 2),
    ((0.0, -0.0, 0.0), 0), ((-0.0, 0.0, 1.0), 2), ((DEN, 0.0, -1.0), 0),
    ((-1.0, DEN, 0.0), 1), ((-np.inf, -np.inf, -np.inf), 0), ((np.nan,) * 3, 0),
    ((LOWEST, -np.inf, 0.0), 2),
])
def test_max_pool_grad_argmax_rule(window, argmax):
    dx = _grad_of_row(*window)
    assert dx.tolist() == [1.5 if i == argmax else 0.0 for i in range(3)]


def test_max_pool_grad_reads_only_the_shape_of_orig_output():
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, (2, 6, 6, 3)).astype(F32)
    g = rng.standard_normal((2, 3, 3, 3)).astype(F32)
    a = dict(ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME")
    one = both("MaxPoolGrad", orig_input=x, orig_output=np.zeros((2, 3, 3, 3), F32),
               grad=g, **a)
    two = both("MaxPoolGrad", orig_input=x, orig_output=np.full((2, 3, 3, 3), 7, F32),
               grad=g, **a)
    assert one.tobytes() == two.tobytes()


@pytest.mark.parametrize("grads", [(1e8, 1.0, -1e8), (1.0, 1e8, -1e8), (-1e8, 1e8, 1.0)])
def test_max_pool_grad_sums_in_the_output_order(grads):
    """Three windows (1x3, stride 1, SAME) share their maximum: ((0 + g0) + g1) + g2."""
    x = _row(0.0, 5.0, 0.0)
    g = np.array(grads, F32).reshape(1, 1, 3, 1)
    dx = both("MaxPoolGrad", orig_input=x, orig_output=np.zeros_like(g), grad=g,
              ksize=[1, 1, 3, 1], strides=[1, 1, 1, 1], padding="SAME").ravel()
    acc = F32(0)
    for v in grads:
        acc = F32(acc + F32(v))
    assert dx[1] == acc and dx[0] == dx[2] == 0


def test_max_pool_grad_sums_flush_and_start_at_plus_zero():
    x = _row(0.0, 5.0, 0.0)
    tiny = np.finfo(F32).tiny
    cases = {
        (DEN, DEN, 0.0): 0x0,                                  # denormal operands: 0
        (-0.0, -0.0, -0.0): 0x0,                               # +0 + -0 = +0
        (tiny, -np.nextafter(tiny, F32(0)), 0.0): 0x00800000,  # DAZ: tiny + (-0)
        (tiny * 1.5, -tiny * 2, -0.0): 0x80000000,             # FTZ: -0.5 tiny -> -0
    }
    for grads, expected in cases.items():
        g = np.array(grads, F32).reshape(1, 1, 3, 1)
        dx = both("MaxPoolGrad", orig_input=x, orig_output=np.zeros_like(g), grad=g,
                  ksize=[1, 1, 3, 1], strides=[1, 1, 1, 1], padding="SAME")
        assert int(dx.view(np.uint32).ravel()[1]) == expected, grads


def test_max_pool_grad_without_windows_is_zeros():
    """TF returns its output buffer uninitialized here (probed: varying garbage)."""
    x = np.ones((2, 3, 3, 2), F32)
    y = np.zeros((2, 0, 0, 2), F32)
    for impl in ("kernel", "reference"):
        dx = run("MaxPoolGrad", impl, orig_input=x, orig_output=y, grad=y,
                 ksize=[1, 4, 4, 1], strides=[1, 1, 1, 1], padding="VALID")
        assert dx.shape == x.shape and not dx.any() and not np.signbit(dx).any()


def _random_call(rng: np.random.Generator, dtype) -> tuple[dict, dict]:
    N, H, W, C = (int(v) for v in rng.integers(1, 7, 4))
    kh, kw = (int(v) for v in rng.integers(1, 4, 2))
    sh, sw = (int(v) for v in rng.integers(1, 4, 2))
    padding = str(rng.choice(["SAME", "VALID", "EXPLICIT"]))
    pads = [0, 0, int(rng.integers(0, kh)), int(rng.integers(0, kh)),
            int(rng.integers(0, kw)), int(rng.integers(0, kw)), 0, 0]
    attrs = dict(ksize=[1, kh, kw, 1], strides=[1, sh, sw, 1], padding=padding,
                 explicit_paddings=pads if padding == "EXPLICIT" else [])
    x = rng.integers(-3, 4, (N, H, W, C)).astype(dtype)
    x[rng.random(x.shape) < 0.1] = np.nan
    return attrs, {"input": x}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_equals_reference_on_random_geometries(dtype):
    rng = np.random.default_rng(7)
    for _ in range(40):
        attrs, kw = _random_call(rng, dtype)
        try:
            y = run("MaxPool", "reference", **kw, **attrs)
        except tfgrad.InvalidArgumentError:
            continue  # (VALID windows larger than the input: negative size)
        oracle.assert_outputs("MaxPool", run("MaxPool", **kw, **attrs), y)
        g = rng.standard_normal(y.shape).astype(dtype)
        grad_kw = dict(orig_input=kw["input"], orig_output=y, grad=g, **attrs)
        oracle.assert_outputs("MaxPoolGrad", run("MaxPoolGrad", **grad_kw),
                              run("MaxPoolGrad", "reference", **grad_kw))


def test_same_bits_on_one_and_two_threads():
    from tfgrad.testing.cases.max_pool import LARGE

    for op, make in LARGE.items():
        kw = make()
        outs = []
        for n in (1, 2):
            old = numba.get_num_threads()
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
            try:
                outs.append(run(op, **kw).tobytes())
            finally:
                numba.set_num_threads(old)
        assert outs[0] == outs[1], op


def test_gradient_table_torch_and_jax():
    torch = pytest.importorskip("torch")
    import tfgrad.torch as tt

    rng = np.random.default_rng(3)
    x = rng.integers(-2, 3, (2, 6, 6, 3)).astype(F32)
    g = rng.standard_normal((2, 3, 3, 3)).astype(F32)
    attrs = dict(ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME")
    want = run("MaxPoolGrad", orig_input=x, orig_output=run("MaxPool", input=x, **attrs),
               grad=g, **attrs)
    xt = torch.from_numpy(x).requires_grad_()
    tt.max_pool(xt, **attrs).backward(torch.from_numpy(g))
    assert xt.grad.numpy().tobytes() == want.tobytes()
    jax = pytest.importorskip("jax")
    from tfgrad.jax import raw_ops as jr

    _, vjp = jax.vjp(lambda a: jr.MaxPool(input=a, **attrs), jax.numpy.asarray(x))
    assert np.asarray(vjp(jax.numpy.asarray(g))[0]).tobytes() == want.tobytes()
    assert "MaxPoolGrad" not in tfgrad._gradients.GRADIENTS
    assert "MaxPoolGrad" not in tfgrad._gradients.LINEARISED
