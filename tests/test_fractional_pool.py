"""Family tests for FractionalMaxPool / FractionalAvgPool and their gradients.

Pins the TF 2.21 behaviours listed in ``tfgrad.ops.fractional_pool``'s docstring, checks
the Philox sequence emulation against 240 stored TF seed combinations, and runs property
tests (kernel == reference, invalid sequences rejected), adjoint/finite-difference checks
and thread-count determinism. Expected values are TF's (fixtures, live) or computed by
hand from the definition.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgrad
from tests import oracle
from tfgrad.dispatch import fractional_pool as fpk
from tfgrad.ops import fractional_pool as fp

raw = tfgrad.raw_ops
ROOT = Path(__file__).resolve().parents[1]
SEQ_FIXTURE = ROOT / "tests" / "fixtures" / "fractional_pool_sequences.npz"
F32, F64, I64 = np.float32, np.float64, np.int64
LOW32 = np.finfo(F32).min


def _both(fn):
    """Run ``fn`` with the kernel and the reference; return both results."""
    out = []
    for impl in ("kernel", "reference"):
        with tfgrad.use_impl(impl):
            out.append(fn())
    return out


def _combos():
    d = np.load(SEQ_FIXTURE)
    ends = np.cumsum(d["lengths"])
    seqs = np.split(d["sequences"].astype(I64), ends[:-1])
    for k in range(d["seeds"].shape[0]):
        seed, seed2 = (int(v) for v in d["seeds"][k])
        h, w = (int(v) for v in d["sizes"][k])
        rh, rw = (float(v) for v in d["ratios"][k])
        yield (seed, seed2, h, w, rh, rw, bool(d["pseudo"][k])), seqs[2 * k], seqs[2 * k + 1]


# --------------------------------------------------------------------------------------
# Sequences
# --------------------------------------------------------------------------------------
def test_sequences_match_tf_for_240_seed_combinations():
    n = 0
    for (seed, seed2, h, w, rh, rw, pseudo), rows, cols in _combos():
        r, c = fp.pooling_sequences((1, h, w, 1), (1.0, rh, rw, 1.0), pseudo, seed, seed2)
        assert r.tolist() == rows.tolist(), (seed, seed2, h, w, rh, rw, pseudo)
        assert c.tolist() == cols.tolist(), (seed, seed2, h, w, rh, rw, pseudo)
        n += 1
    assert n >= 200


def test_sequences_through_the_public_op():
    for k, ((seed, seed2, h, w, rh, rw, pseudo), rows, cols) in enumerate(_combos()):
        if k % 12:
            continue
        op = raw.FractionalAvgPool if k % 24 else raw.FractionalMaxPool
        res = op(value=np.zeros((1, h, w, 1), F32), pooling_ratio=[1.0, rh, rw, 1.0],
                 pseudo_random=pseudo, deterministic=True, seed=seed, seed2=seed2)
        assert res.row_pooling_sequence.dtype == I64
        assert res.row_pooling_sequence.tolist() == rows.tolist()
        assert res.col_pooling_sequence.tolist() == cols.tolist()


def test_sequence_examples_from_tf():
    # TF 2.21: seed (1, 2), 10 -> 6 per dim (semantics notes, run on TF).
    r, c = fp.pooling_sequences((1, 10, 10, 1), (1.0, 1.5, 1.5, 1.0), False, 1, 2)
    assert r.tolist() == c.tolist() == [0, 1, 3, 4, 6, 8, 10]
    r, _ = fp.pooling_sequences((1, 10, 10, 1), (1.0, 1.5, 1.5, 1.0), True, 1, 2)
    assert r.tolist() == [0, 2, 3, 5, 7, 8, 10]
    # tf.nn.fractional_max_pool(seed=7) runs the raw op with (87654321, 7).
    r, _ = fp.pooling_sequences((1, 10, 10, 1), (1.0, 1.5, 1.5, 1.0), False, 87654321, 7)
    assert r.tolist() == [0, 2, 4, 6, 7, 9, 10]


def test_output_size_is_computed_in_float32():
    # 10 / float32(10/3) = 3.0000000298 -> 3 cells; 10 / float32(1.1) -> 9.
    res = raw.FractionalMaxPool(value=np.zeros((1, 10, 10, 1), F32),
                                pooling_ratio=[1.0, 10 / 3, 1.1, 1.0], deterministic=True,
                                seed=1, seed2=2)
    assert res.output.shape == (1, 3, 9, 1)
    assert res.row_pooling_sequence.size == 4 and res.col_pooling_sequence.size == 10


def test_divisible_dim_still_consumes_draws():
    # Rows 8 -> 4 are [0,2,4,6,8] whatever the seed, but their draws still advance the
    # generator, so the columns differ from a generator that skipped them.
    r, c = fp.pooling_sequences((1, 8, 10, 1), (1.0, 2.0, 1.5, 1.0), False, 5, 6)
    assert r.tolist() == [0, 2, 4, 6, 8]
    gen = fp._Philox(5, 6)
    fresh = fp._pooling_sequence(10, 6, gen, False)
    gen2 = fp._Philox(5, 6)
    gen2.reserve32(4)
    advanced = fp._pooling_sequence(10, 6, gen2, False)
    assert c.tolist() == advanced.tolist()
    assert fresh.size == advanced.size  # (the values may or may not coincide)


def test_deterministic_with_zero_seeds_repeats_within_process():
    x = np.zeros((1, 40, 40, 1), F32)
    kw = dict(pooling_ratio=[1.0, 1.5, 1.5, 1.0], deterministic=True)
    first = raw.FractionalMaxPool(value=x, **kw)
    for _ in range(3):
        again = raw.FractionalMaxPool(value=x, **kw)
        assert again.row_pooling_sequence.tolist() == first.row_pooling_sequence.tolist()
        assert again.col_pooling_sequence.tolist() == first.col_pooling_sequence.tolist()


def test_cached_sequences_are_fresh_arrays_equal_to_drawn_ones():
    x = np.zeros((1, 9, 11, 1), F32)
    kw = dict(pooling_ratio=[1.0, 1.3, 1.7, 1.0], pseudo_random=True, deterministic=True,
              seed=3, seed2=4)
    first = raw.FractionalMaxPool(value=x, **kw)
    first.row_pooling_sequence[:] = -1  # a caller's edit must not reach the cache
    second = raw.FractionalMaxPool(value=x, **kw)
    rows, cols = fp.pooling_sequences(x.shape, (1.0, 1.3, 1.7, 1.0), True, 3, 4)
    np.testing.assert_array_equal(second.row_pooling_sequence, rows)
    np.testing.assert_array_equal(second.col_pooling_sequence, cols)
    assert second.row_pooling_sequence.dtype == np.int64


def test_nondeterministic_draws_fresh_seeds_every_call():
    x = np.zeros((1, 40, 40, 1), F32)
    seen = {tuple(raw.FractionalAvgPool(value=x, pooling_ratio=[1.0, 1.5, 1.5, 1.0])
                  .row_pooling_sequence.tolist()) for _ in range(10)}
    assert len(seen) > 1  # 40 -> 26 has C(26, 14) orders: a repeat of all 10 is impossible


def test_zero_seed_cache_is_per_attr_set():
    key = ("FractionalMaxPool", np.dtype(F32), (1.0, 1.5, 1.5, 1.0), False, False)
    a = fp.seeds(*key, True, 0, 0)
    assert fp.seeds(*key, True, 0, 0) == a
    b = fp.seeds("FractionalAvgPool", *key[1:], True, 0, 0)
    assert b != a  # another kernel draws its own pair (2**-128 chance of a clash)
    assert fp.seeds(*key, True, 3, 4) == (3, 4)


# --------------------------------------------------------------------------------------
# The documented example and pinned TF behaviours
# --------------------------------------------------------------------------------------
def test_documented_example_forward():
    # TF's FractionalAvgPool doc: values [20, 5, 16, 3, 7], sequence [0, 2, 4],
    # overlapping: 16 is used twice, the result is [41/3, 26/3].
    x = np.array([20, 5, 16, 3, 7], F64).reshape(1, 1, 5, 1)
    rs, re = fp.cell_bounds(np.array([0, 1]), 1, 1, True)
    cs, ce = fp.cell_bounds(np.array([0, 2, 4]), 2, 5, True)
    assert cs.tolist() == [0, 2] and ce.tolist() == [2, 4]
    ref = fp._avg_pool_reference(x, rs, re, cs, ce)
    ker = fpk.avg_pool(x, rs, re, cs, ce)
    for out in (ref, ker):
        assert out.ravel().tolist() == [41 / 3, 26 / 3]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_documented_example_gradient(dtype):
    # Each out_backprop element is spread evenly over its cell's 3 inputs; index 2 is in
    # both cells: [a/3, a/3, a/3 + b/3, b/3, b/3].
    g = np.array([41 / 3, 26 / 3], dtype).reshape(1, 1, 2, 1)
    for out in _both(lambda: raw.FractionalAvgPoolGrad(
            orig_input_tensor_shape=[1, 1, 5, 1], out_backprop=g,
            row_pooling_sequence=np.array([0, 1]), col_pooling_sequence=np.array([0, 2, 4]),
            overlapping=True)):
        a, b = float(g.ravel()[0]) / 3, float(g.ravel()[1]) / 3
        assert out.dtype == dtype
        assert out.ravel().tolist() == [dtype(v) for v in (a, a, 0.0 + a + b, b, b)]


def test_max_pool_starts_at_lowest_and_ignores_nan():
    k = dict(pooling_ratio=[1.0, 2.0, 2.0, 1.0], deterministic=True, seed=1, seed2=2)
    for x, want in [(np.full((1, 2, 2, 1), -np.inf, F32), LOW32),  # not -inf
                    (np.array([np.nan, 1, 3, 2], F32).reshape(1, 2, 2, 1), 3.0),
                    (np.full((1, 2, 2, 1), np.nan, F32), LOW32)]:
        for out in _both(lambda x=x: raw.FractionalMaxPool(value=x, **k).output):
            assert out.ravel().tolist() == [want]


def test_avg_pool_integer_division_truncates():
    k = dict(pooling_ratio=[1.0, 1.0, 2.0, 1.0], deterministic=True, seed=1, seed2=2)
    x = np.array([4, 7, -4, -7], np.int32).reshape(1, 1, 4, 1)
    for out in _both(lambda: raw.FractionalAvgPool(value=x, **k).output):
        assert out.ravel().tolist() == [5, -5]  # 11 // 2 = 5, -11 / 2 -> -5 (not -6)


def test_max_grad_ties_go_to_first_maximum():
    x = np.array([[5, 5, 1], [5, 2, 5], [0, 5, 5]], F32).reshape(1, 3, 3, 1)
    for out in _both(lambda: raw.FractionalMaxPoolGrad(
            orig_input=x, orig_output=np.full((1, 1, 1, 1), 5, F32),
            out_backprop=np.ones((1, 1, 1, 1), F32), row_pooling_sequence=np.array([0, 3]),
            col_pooling_sequence=np.array([0, 3]))):
        assert out.ravel().tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0]


def test_max_grad_overlapping_boundary_accumulates():
    x = np.array([[5, 5, 1], [5, 2, 5], [0, 5, 5]], F32).reshape(1, 3, 3, 1)
    g = np.array([1, 10, 100, 1000], F32).reshape(1, 2, 2, 1)
    # cells [0..1]x[0..1], [0..1]x[1..2], [1..2]x[0..1], [1..2]x[1..2]; first maxima
    # (0,0), (0,1), (1,0), (1,2).
    for out in _both(lambda: raw.FractionalMaxPoolGrad(
            orig_input=x, orig_output=np.full((1, 2, 2, 1), 5, F32), out_backprop=g,
            row_pooling_sequence=np.array([0, 1, 2]), col_pooling_sequence=np.array([0, 1, 2]),
            overlapping=True)):
        assert out.ravel().tolist() == [1, 10, 0, 100, 0, 1000, 0, 0, 0]


def test_avg_grad_overlapping_counts():
    for out in _both(lambda: raw.FractionalAvgPoolGrad(
            orig_input_tensor_shape=[1, 3, 3, 1], out_backprop=np.ones((1, 2, 2, 1), F32),
            row_pooling_sequence=np.array([0, 1, 3]), col_pooling_sequence=np.array([0, 1, 3]),
            overlapping=True)):
        assert out.ravel().tolist() == [0.25, 0.5, 0.25, 0.5, 1.0, 0.5, 0.25, 0.5, 0.25]


def test_avg_grad_integer_truncates_and_saturates_to_min():
    for out in _both(lambda: raw.FractionalAvgPoolGrad(
            orig_input_tensor_shape=[1, 3, 3, 1],
            out_backprop=np.array([-10], np.int32).reshape(1, 1, 1, 1),
            row_pooling_sequence=np.array([0, 3]), col_pooling_sequence=np.array([0, 3]))):
        assert out.ravel().tolist() == [-1] * 9  # -10/9 = -1.11 -> -1
    big = np.full((1, 2, 2, 1), 2**31 - 1, np.int32)
    for out in _both(lambda: raw.FractionalAvgPoolGrad(
            orig_input_tensor_shape=[1, 3, 3, 1], out_backprop=big,
            row_pooling_sequence=np.array([0, 2, 3]), col_pooling_sequence=np.array([0, 2, 3]),
            overlapping=True)):
        # cells [0..2]x[0..2] (9 inputs), [0..2]x[2..2] (3), [2..2]x[0..2] (3), [2..2]x[2..2]
        # (1). Corner (2, 2): M/9 + M/3 + M/3 + M > int32 max -> int32 min, as x86 gives TF.
        assert out[0, 2, 2, 0] == np.iinfo(np.int32).min
        assert out[0, 0, 0, 0] == int((2**31 - 1) / 9)


def test_negative_zero_gradients_come_back_positive():
    # TF adds into zeroed buffers: +0.0 + -0.0 = +0.0.
    g = np.full((1, 1, 1, 1), -0.0, F32)
    for out in _both(lambda: raw.FractionalAvgPoolGrad(
            orig_input_tensor_shape=[1, 2, 2, 1], out_backprop=g,
            row_pooling_sequence=np.array([0, 2]), col_pooling_sequence=np.array([0, 2]))):
        assert not np.signbit(out).any()
    x = np.arange(4, dtype=F32).reshape(1, 2, 2, 1)
    for out in _both(lambda: raw.FractionalMaxPoolGrad(
            orig_input=x, orig_output=np.full((1, 1, 1, 1), 3, F32), out_backprop=g,
            row_pooling_sequence=np.array([0, 2]), col_pooling_sequence=np.array([0, 2]))):
        assert not np.signbit(out).any()


@pytest.mark.parametrize("depth", [1, 16])  # 16 float32: the register-blocked kernels
def test_denormals_flush_as_tf(depth):
    """TF runs its kernels with FTZ and DAZ set: a denormal reads as 0 in sums and
    comparisons, and TF's max (an x86 max instruction) returns it as a zero of its sign;
    the first of equal values stays (-0 before +0)."""
    sub = F32(1e-39)
    x = np.full((1, 2, 2, depth), sub, F32)
    x[0, 0, 0] = -sub
    seq = np.array([0, 2])
    kw = dict(pooling_ratio=[1.0, 2.0, 2.0, 1.0], pseudo_random=False, overlapping=False,
              deterministic=True, seed=1, seed2=1)
    for y in _both(lambda: raw.FractionalMaxPool(value=x, **kw).output):
        assert y.shape == (1, 1, 1, depth) and not y.any() and np.signbit(y).all()
    for y in _both(lambda: raw.FractionalAvgPool(value=x, **kw).output):
        assert not y.any()
    g = np.full((1, 1, 1, depth), sub, F32)
    for out in _both(lambda: raw.FractionalAvgPoolGrad(
            orig_input_tensor_shape=[1, 2, 2, depth], out_backprop=g,
            row_pooling_sequence=seq, col_pooling_sequence=seq)):
        assert not out.any()
    # the replayed maxima are the raw denormals, equal to TF's flushed zeros under DAZ;
    # the denormal g then adds as 0
    for out in _both(lambda: raw.FractionalMaxPoolGrad(
            orig_input=x, orig_output=np.full((1, 1, 1, depth), -0.0, F32), out_backprop=g,
            row_pooling_sequence=seq, col_pooling_sequence=seq)):
        assert not out.any()
    assert sub * F32(1) != 0  # the caller's environment is unchanged


@pytest.mark.parametrize("depth", [1, 16])
def test_max_grad_sum_flushed_to_minus_zero_stays(depth):
    """Input (1, 1) is the maximum of cells (0, 0) and (0, 1) but not of the two below:
    TF adds g00 + g01 = -5e-40, which flushes to -0, and nothing more."""
    x = np.array([[0, 0, 0], [0, 5, 0], [9, 0, 9]], F32).reshape(1, 3, 3, 1)
    g = np.array([1.9e-38, -1.95e-38, 1, 1], F32).reshape(1, 2, 2, 1)
    x, g = np.repeat(x, depth, axis=3), np.repeat(g, depth, axis=3)
    y = np.repeat(np.array([5, 5, 9, 9], F32).reshape(1, 2, 2, 1), depth, axis=3)
    seq = np.array([0, 1, 2])
    for out in _both(lambda: raw.FractionalMaxPoolGrad(
            orig_input=x, orig_output=y, out_backprop=g, row_pooling_sequence=seq,
            col_pooling_sequence=seq, overlapping=True)):
        assert not out[0, 1, 1].any() and np.signbit(out[0, 1, 1]).all()


@pytest.mark.live
@pytest.mark.parametrize("dtype", [F32, F64])
def test_live_denormal_inputs(dtype):
    """Inputs and gradients in and around the denormal range, serial and threaded
    kernels, bit-identical to TF (zeros' signs included)."""
    rng = np.random.default_rng(3)
    scales = {F32: (1e-39, 1e-37), F64: (1e-310, 1e-307)}[dtype]
    for shape in ((2, 9, 11, 3), (2, 13, 10, 16), (4, 60, 50, 16)):
        for sc in scales:
            x = (rng.standard_normal(shape) * sc).astype(dtype)
            kw = dict(pooling_ratio=[1.0, 1.44, 1.73, 1.0], pseudo_random=True,
                      overlapping=True, deterministic=True, seed=7, seed2=3)
            for op, gop in (("FractionalAvgPool", "FractionalAvgPoolGrad"),
                            ("FractionalMaxPool", "FractionalMaxPoolGrad")):
                want = oracle.run_tf(op, dict(kw, value=x))
                g = (rng.standard_normal(want[0].shape) * sc).astype(dtype)
                seqs = dict(row_pooling_sequence=want[1], col_pooling_sequence=want[2],
                            overlapping=True)
                gkw = dict(orig_input_tensor_shape=np.array(shape, I64), out_backprop=g,
                           **seqs) if op == "FractionalAvgPool" else dict(
                    orig_input=x, orig_output=want[0], out_backprop=g, **seqs)
                gwant = oracle.run_tf(gop, gkw)
                for impl in ("kernel", "reference"):
                    with tfgrad.use_impl(impl):
                        oracle.assert_same(getattr(raw, op)(value=x, **kw).output, want[0],
                                           what=f"{impl} {op} {shape} {sc}")
                        oracle.assert_same(getattr(raw, gop)(**gkw), gwant,
                                           what=f"{impl} {gop} {shape} {sc}")


def test_max_grad_rejects_small_inputs_like_tf():
    # TF checks len(rows) * len(cols) <= orig_input.size, which fails for the forward op's
    # own sequences on tiny inputs: [1,2,2,2] at ratio 1 has 3 * 3 = 9 > 8 elements.
    x = np.arange(8, dtype=F32).reshape(1, 2, 2, 2)
    kw = dict(pooling_ratio=[1.0, 1.0, 1.0, 1.0], deterministic=True, seed=1, seed2=1)
    y, rows, cols = raw.FractionalMaxPool(value=x, **kw)
    with pytest.raises(tfgrad.InvalidArgumentError, match="Pooling region has more elements"):
        raw.FractionalMaxPoolGrad(orig_input=x, orig_output=y, out_backprop=y,
                                  row_pooling_sequence=rows, col_pooling_sequence=cols)
    x3 = np.arange(12, dtype=F32).reshape(1, 2, 2, 3)  # 9 <= 12: accepted
    y, rows, cols = raw.FractionalMaxPool(value=x3, **kw)
    out = raw.FractionalMaxPoolGrad(orig_input=x3, orig_output=y, out_backprop=y,
                                    row_pooling_sequence=rows, col_pooling_sequence=cols)
    assert out.tolist() == x3.tolist()


def test_error_cases_that_tf_accepts_say_why():
    from tests.cases.fractional_pool import ERROR_CASES

    for c in ERROR_CASES:
        assert c.tf_rejects or len(c.why) > 20, c.id


# --------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------
@st.composite
def _grad_problem(draw, valid=True):
    n = draw(st.integers(1, 2))
    h = draw(st.integers(1, 9))
    w = draw(st.integers(1, 9))
    c = draw(st.integers(1, 5))
    dt = draw(st.sampled_from([F32, F64, np.int32, np.int64]))
    ov = draw(st.booleans())

    def seq(size):
        m = draw(st.integers(1, size))
        if valid:
            vals = draw(st.lists(st.integers(0, size), min_size=m + 1, max_size=m + 1,
                                 unique=True))
            return np.array(sorted(vals), I64), m
        vals = draw(st.lists(st.integers(-2, size + 2), min_size=1, max_size=m + 3))
        return np.array(vals, I64), m

    rows, mr = seq(h)
    cols, mc = seq(w)
    seed = draw(st.integers(0, 2**32 - 1))
    return n, h, w, c, dt, ov, rows, mr, cols, mc, seed


def _arrays(n, h, w, c, dt, mr, mc, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dt).kind == "f":
        x = (rng.standard_normal((n, h, w, c)) * 4).round().astype(dt)  # ties
        g = rng.standard_normal((n, mr, mc, c)).astype(dt)
    else:
        x = rng.integers(-4, 4, (n, h, w, c)).astype(dt)
        g = rng.integers(-100, 100, (n, mr, mc, c)).astype(dt)
    return x, g


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(_grad_problem())
def test_kernel_equals_reference_on_generated_sequences(p):
    n, h, w, c, dt, ov, rows, mr, cols, mc, seed = p
    x, g = _arrays(n, h, w, c, dt, mr, mc, seed)
    with tfgrad.use_impl("reference"):
        y = fp._max_pool_reference(x, *fp.cell_bounds(rows, mr, h, ov),
                                   *fp.cell_bounds(cols, mc, w, ov))
    kw = dict(row_pooling_sequence=rows, col_pooling_sequence=cols, overlapping=ov)
    if rows.size * cols.size <= x.size:  # else TF's (and tfgrad's) region-size check fails
        a, b = _both(lambda: raw.FractionalMaxPoolGrad(orig_input=x, orig_output=y,
                                                       out_backprop=g, **kw))
        oracle.assert_same(a, b)
    a, b = _both(lambda: raw.FractionalAvgPoolGrad(orig_input_tensor_shape=x.shape,
                                                   out_backprop=g, **kw))
    oracle.assert_same(a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 2), st.integers(1, 24), st.integers(1, 12),
       st.sampled_from([8, 16, 24, 32, 48]), st.sampled_from([F32, F64]), st.booleans(),
       st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_fused_max_grad_equals_reference(monkeypatch, n, h, w, c, dt, ov, stream, specials,
                                         seed):
    """The fused float max gradient (argmax codes per task of up to 8 row cells, the row
    cell before recomputed; whole channel vectors; non-temporal stores when streaming):
    equal to the reference, or the same error when a replayed maximum differs from
    orig_output (a NaN first in its cell, or a cell of only -inf)."""
    monkeypatch.setattr(fpk, "_STREAM_MIN_BYTES", 0 if stream else 1 << 62)
    rng = np.random.default_rng(seed)
    ratio = [1.0, float(rng.uniform(1, min(h, 3.0))), float(rng.uniform(1, min(w, 3.0))), 1.0]
    x = rng.integers(-3, 3, (n, h, w, c)).astype(dt)  # ties
    if specials:
        mask = rng.random(x.shape) < 0.05
        x[mask] = rng.choice(np.array([np.nan, -np.inf, np.inf, -0.0], dt), int(mask.sum()))
    fwd = raw.FractionalMaxPool(value=x, pooling_ratio=ratio, overlapping=ov,
                                deterministic=True, seed=seed + 1, seed2=3)
    g = rng.standard_normal(fwd.output.shape).astype(dt)
    kw = dict(orig_input=x, orig_output=fwd.output, out_backprop=g,
              row_pooling_sequence=fwd.row_pooling_sequence,
              col_pooling_sequence=fwd.col_pooling_sequence, overlapping=ov)
    results = []
    for impl in ("kernel", "reference"):
        with tfgrad.use_impl(impl):
            try:
                results.append(raw.FractionalMaxPoolGrad(**kw))
            except tfgrad.InvalidArgumentError as e:
                results.append(str(e))
    if isinstance(results[1], str):
        assert results[0] == results[1]
    else:
        oracle.assert_same(results[0], results[1])


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(_grad_problem(valid=False))
def test_arbitrary_sequences_are_rejected_or_computed(p):
    """Any sequence either raises InvalidArgumentError or gives the reference's result:
    the kernels only ever see checked indices."""
    n, h, w, c, dt, ov, rows, mr, cols, mc, seed = p
    x, g = _arrays(n, h, w, c, dt, mr, mc, seed)
    y = np.zeros((n, mr, mc, c), dt)
    kw = dict(row_pooling_sequence=rows, col_pooling_sequence=cols, overlapping=ov)
    for call in (lambda: raw.FractionalAvgPoolGrad(orig_input_tensor_shape=x.shape,
                                                   out_backprop=g, **kw),
                 lambda: raw.FractionalMaxPoolGrad(orig_input=x, orig_output=y,
                                                   out_backprop=g, **kw)):
        try:
            a, b = _both(call)
        except tfgrad.InvalidArgumentError:
            continue
        oracle.assert_same(a, b)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 2), st.integers(1, 12), st.integers(1, 12), st.integers(1, 9),
       st.floats(1.0, 3.0), st.floats(1.0, 3.0), st.booleans(), st.booleans(),
       st.sampled_from([F32, F64, np.int32, np.int64]), st.integers(1, 2**63 - 1))
def test_forward_kernel_equals_reference(n, h, w, c, rh, rw, ov, ps, dt, seed):
    rh, rw = min(rh, h), min(rw, w)
    x = (np.random.default_rng(seed % 2**32).standard_normal((n, h, w, c)) * 20).astype(dt)
    kw = dict(pooling_ratio=[1.0, rh, rw, 1.0], pseudo_random=ps, overlapping=ov,
              deterministic=True, seed=seed, seed2=7)
    for op in (raw.FractionalMaxPool, raw.FractionalAvgPool):
        a, b = _both(lambda op=op: op(value=x, **kw))
        oracle.assert_outputs(op.OP_NAME, a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 2), st.integers(1, 9), st.integers(1, 9),
       st.sampled_from([8, 15, 16, 17, 64, 127, 128, 129, 144, 256]), st.floats(1.0, 3.0),
       st.floats(1.0, 3.0), st.booleans(), st.sampled_from([F32, F64]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_register_blocked_forwards_equal_reference(monkeypatch, n, h, w, c, rh, rw, ov, dt,
                                                   stream, seed):
    """The float kernels' vector blocks (8 vectors, then 1, then scalars), with and
    without non-temporal stores and prefetch: NaN never wins a maximum, the earlier of
    -0/+0 stays, sums keep TF's order, whatever the channel count's remainder."""
    monkeypatch.setattr(fpk, "_STREAM_MIN_BYTES", 0 if stream else 1 << 62)
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 3, (n, h, w, c)).astype(dt)  # many ties
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30], dt)
    mask = rng.random(x.shape) < 0.1
    x[mask] = rng.choice(specials, int(mask.sum()))
    rh, rw = min(rh, h), min(rw, w)
    kw = dict(pooling_ratio=[1.0, rh, rw, 1.0], overlapping=ov, deterministic=True,
              seed=seed + 1, seed2=7)
    for op in (raw.FractionalMaxPool, raw.FractionalAvgPool):
        a, b = _both(lambda op=op: op(value=x, **kw))
        oracle.assert_outputs(op.OP_NAME, a, b)
        # -0 vs +0 too: the maxima must pick the same zero as TF's order
        num = ~np.isnan(b.output)
        assert np.array_equal(np.signbit(a.output[num]), np.signbit(b.output[num]))


def test_gradients_are_adjoints_and_match_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 11, 13, 3))  # float64, distinct values: no ties
    kw = dict(pooling_ratio=[1.0, 1.44, 1.73, 1.0], deterministic=True, seed=11, seed2=12)
    for ov in (False, True):
        avg = raw.FractionalAvgPool(value=x, overlapping=ov, **kw)
        mx = raw.FractionalMaxPool(value=x, overlapping=ov, **kw)
        seqs = dict(row_pooling_sequence=avg.row_pooling_sequence,
                    col_pooling_sequence=avg.col_pooling_sequence, overlapping=ov)
        g = rng.standard_normal(avg.output.shape)
        dx = rng.standard_normal(x.shape)
        ga = raw.FractionalAvgPoolGrad(orig_input_tensor_shape=x.shape, out_backprop=g, **seqs)
        # avg pooling is linear: <A x, g> == <x, A^T g>
        assert np.isclose(np.vdot(avg.output, g), np.vdot(x, ga), rtol=1e-12)
        gm = raw.FractionalMaxPoolGrad(orig_input=x, orig_output=mx.output, out_backprop=g,
                                       **seqs)
        eps = 1e-7
        for op, grad in ((raw.FractionalAvgPool, ga), (raw.FractionalMaxPool, gm)):
            hi = op(value=x + eps * dx, overlapping=ov, **kw).output
            lo = op(value=x - eps * dx, overlapping=ov, **kw).output
            fd = np.vdot(g, hi - lo) / (2 * eps)
            assert np.isclose(fd, np.vdot(grad, dx), rtol=1e-6), (op.OP_NAME, ov)


_THREAD_SCRIPT = r"""
import hashlib, numpy as np, tfgrad
raw = tfgrad.raw_ops
rng = np.random.default_rng(0)
h = hashlib.sha256()
same = True


def outputs(x, ov):
    kw = dict(pooling_ratio=[1.0, 1.44, 1.73, 1.0], overlapping=ov, deterministic=True,
              seed=5, seed2=6)
    m = raw.FractionalMaxPool(value=x, **kw)
    a = raw.FractionalAvgPool(value=x, **kw)
    g = np.random.default_rng(1).standard_normal(m.output.shape).astype(np.float32)
    s = dict(row_pooling_sequence=m.row_pooling_sequence,
             col_pooling_sequence=m.col_pooling_sequence, overlapping=ov)
    return (m.output, a.output,
            raw.FractionalMaxPoolGrad(orig_input=x, orig_output=m.output, out_backprop=g, **s),
            raw.FractionalAvgPoolGrad(orig_input_tensor_shape=x.shape, out_backprop=g, **s))


# 45 channels: vector blocks plus scalar tails; 48: the fused max gradient, whose tasks
# start mid-image and recompute the row cell before them.
for x in (rng.integers(-3, 3, (3, 23, 29, 45)).astype(np.float32),
          rng.integers(-3, 3, (3, 41, 29, 48)).astype(np.float32)):
    for ov in (False, True):
        got = outputs(x, ov)
        with tfgrad.use_impl("reference"):
            ref = outputs(x, ov)
        same &= all(np.array_equal(p, q) for p, q in zip(got, ref))
        for out in got:
            h.update(np.ascontiguousarray(out).tobytes())
print(h.hexdigest(), same)
"""


def test_results_do_not_depend_on_thread_count():
    digests = []
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads)
        p = subprocess.run([sys.executable, "-c", _THREAD_SCRIPT], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        digests.append(p.stdout.split())
    assert digests[0] == digests[1]
    assert digests[0][1] == "True"  # and equal to the reference


# --------------------------------------------------------------------------------------
# Live TF
# --------------------------------------------------------------------------------------
@pytest.mark.live
def test_live_sequences_for_fresh_seeds():
    tf = oracle.tensorflow()
    rng = np.random.default_rng()
    from tools.fractional_pool_sequences import combos, tf_sequences

    for c in combos(60, rng):
        rows, cols = tf_sequences(tf, c)
        seed, seed2, h, w, rh, rw, pseudo = c
        r, cc = fp.pooling_sequences((1, h, w, 1), (1.0, rh, rw, 1.0), pseudo, seed, seed2)
        assert r.tolist() == rows.tolist() and cc.tolist() == cols.tolist(), c


@pytest.mark.live
@pytest.mark.parametrize("dtype", [F32, F64, np.int32, np.int64])
def test_live_attr_sweep(dtype):
    """Every (overlapping, pseudo_random) pair, random ratios, shapes and 64-bit seeds,
    all four ops, against TF on fresh inputs."""
    rng = np.random.default_rng()
    for ov in (False, True):
        for ps in (False, True):
            n, h, w, c = (int(v) for v in rng.integers(1, [3, 20, 20, 20]))
            rh, rw = float(rng.uniform(1, min(h, 4))), float(rng.uniform(1, min(w, 4)))
            x = ((rng.standard_normal((n, h, w, c)) * 30).astype(dtype))
            kw = dict(pooling_ratio=[1.0, rh, rw, 1.0], pseudo_random=ps, overlapping=ov,
                      deterministic=True, seed=int(rng.integers(-(2**63), 2**63)),
                      seed2=int(rng.integers(-(2**63), 2**63)))
            what = f"{kw} shape {x.shape}"
            for op in ("FractionalMaxPool", "FractionalAvgPool"):
                want = oracle.run_tf(op, dict(value=x, **kw))
                oracle.assert_outputs(op, getattr(raw, op)(value=x, **kw), want, what=what)
            y, rows, cols = oracle.run_tf("FractionalMaxPool", dict(value=x, **kw))
            g = (rng.standard_normal(y.shape) * 30).astype(dtype)
            s = dict(row_pooling_sequence=rows, col_pooling_sequence=cols, overlapping=ov)
            gk = dict(orig_input=x, orig_output=y, out_backprop=g, **s)
            if rows.size * cols.size > x.size:
                # Tiny inputs (e.g. [1, 1, 3, 1]): TF's own sequences trip TF's "Pooling
                # region has more elements than the input tensor" check; both reject.
                with pytest.raises(tfgrad.InvalidArgumentError, match="more elements"):
                    raw.FractionalMaxPoolGrad(**gk)
                with pytest.raises(Exception, match="more elements"):
                    oracle.run_tf("FractionalMaxPoolGrad", gk)
            else:
                oracle.assert_same(raw.FractionalMaxPoolGrad(**gk),
                                   oracle.run_tf("FractionalMaxPoolGrad", gk), what=what)
            ak = dict(orig_input_tensor_shape=np.array(x.shape, I64), out_backprop=g, **s)
            oracle.assert_same(raw.FractionalAvgPoolGrad(**ak),
                               oracle.run_tf("FractionalAvgPoolGrad", ak), what=what)


@pytest.mark.live
def test_live_pinned_behaviours():
    # NaN in the vectorised (8-wide) channel path too, -inf cells, ties, -0.0, saturation.
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 6, 6, 19)).astype(F32)
    x[0, 0, 0, :8] = np.nan
    x[0, 1, 1, 3:12] = np.nan
    x[0, 2:4, 2:4, 5] = -np.inf
    kw = dict(pooling_ratio=[1.0, 2.0, 2.0, 1.0], deterministic=True, seed=1, seed2=2)
    oracle.assert_outputs("FractionalMaxPool", raw.FractionalMaxPool(value=x, **kw),
                          oracle.run_tf("FractionalMaxPool", dict(value=x, **kw)))
    cases = [
        ("FractionalAvgPoolGrad", dict(
            orig_input_tensor_shape=np.array([1, 1, 5, 1], I64),
            out_backprop=np.array([41 / 3, 26 / 3], F64).reshape(1, 1, 2, 1),
            row_pooling_sequence=np.array([0, 1], I64),
            col_pooling_sequence=np.array([0, 2, 4], I64), overlapping=True)),
        ("FractionalAvgPoolGrad", dict(
            orig_input_tensor_shape=np.array([1, 3, 3, 1], I64),
            out_backprop=np.full((1, 2, 2, 1), 2**31 - 1, np.int32),
            row_pooling_sequence=np.array([0, 2, 3], I64),
            col_pooling_sequence=np.array([0, 2, 3], I64), overlapping=True)),
        ("FractionalAvgPoolGrad", dict(
            orig_input_tensor_shape=np.array([1, 3, 3, 1], I64),
            out_backprop=np.full((1, 2, 2, 1), -(2**63), np.int64),
            row_pooling_sequence=np.array([0, 2, 3], I64),
            col_pooling_sequence=np.array([0, 2, 3], I64), overlapping=True)),
        ("FractionalAvgPoolGrad", dict(
            orig_input_tensor_shape=np.array([1, 2, 2, 1], I64),
            out_backprop=np.full((1, 1, 1, 1), -0.0, F32),
            row_pooling_sequence=np.array([0, 2], I64),
            col_pooling_sequence=np.array([0, 2], I64), overlapping=False)),
        ("FractionalMaxPoolGrad", dict(
            orig_input=np.array([[5, 5, 1], [5, 2, 5], [0, 5, 5]], F32).reshape(1, 3, 3, 1),
            orig_output=np.full((1, 2, 2, 1), 5, F32),
            out_backprop=np.array([1, 10, 100, -0.0], F32).reshape(1, 2, 2, 1),
            row_pooling_sequence=np.array([0, 1, 2], I64),
            col_pooling_sequence=np.array([0, 1, 2], I64), overlapping=True)),
    ]
    for op, k in cases:
        oracle.assert_same(getattr(raw, op)(**k), oracle.run_tf(op, k), what=op)


# --------------------------------------------------------------------------------------
# Sequences longer than needed; where TF 2.21 crashes
# --------------------------------------------------------------------------------------
def _avg_grad_kw(rows, cols):
    return dict(orig_input_tensor_shape=np.array([1, 3, 3, 1], I64),
                out_backprop=np.arange(1, 5, dtype=F32).reshape(1, 2, 2, 1),
                row_pooling_sequence=np.array(rows, I64),
                col_pooling_sequence=np.array(cols, I64), overlapping=False)


def test_avg_grad_ignores_values_after_its_cells():
    """TF's FractionalAvgPoolGrad reads (and checks) only the first out_rows + 1 /
    out_cols + 1 values; whatever follows is ignored."""
    want = raw.FractionalAvgPoolGrad(**_avg_grad_kw([0, 1, 3], [0, 2, 3]))
    for rows, cols in (([0, 1, 3, 2], [0, 2, 3]), ([0, 1, 3, -5, 2**62], [0, 2, 3, -(2**63)])):
        kw = _avg_grad_kw(rows, cols)
        for got in _both(lambda kw=kw: raw.FractionalAvgPoolGrad(**kw)):
            oracle.assert_same(got, want)
    with pytest.raises(tfgrad.InvalidArgumentError,
                       match="Row sequence tensor values must not be negative, got  0 -1  3  9"):
        raw.FractionalAvgPoolGrad(**_avg_grad_kw([0, -1, 3, 9], [0, 2, 3]))
    with pytest.raises(tfgrad.InvalidArgumentError, match=r"must lie in \[0, 3\]"):
        raw.FractionalAvgPoolGrad(**_avg_grad_kw([0, 1, 4, 2], [0, 2, 3]))


_XT = np.array([[5, 5, 1], [5, 2, 5], [0, 5, 5]], F32).reshape(1, 3, 3, 1)


@pytest.mark.parametrize("ov", [False, True])
@pytest.mark.parametrize("rows,ok", [([0, 3, 3], True), ([0, 3, 9, -(2**63)], True),
                                     ([0, 3, 2, 1], True), ([0, 3, -5], True),
                                     ([0, 1, 3], False), ([0, 3, 0, 2], False)])
def test_max_grad_accepts_extra_cells_only_when_empty(rows, ok, ov):
    """TF's FractionalMaxPoolGrad pools every cell of its sequences, past its
    orig_output-sized buffers for the extra ones: only extra cells TF leaves empty (start
    past the clamped end) are safe, and then they change nothing."""
    kw = dict(orig_input=_XT, orig_output=np.full((1, 1, 1, 1), 5, F32),
              out_backprop=np.ones((1, 1, 1, 1), F32),
              col_pooling_sequence=np.array([0, 3], I64), overlapping=ov)
    want = raw.FractionalMaxPoolGrad(row_pooling_sequence=np.array([0, 3], I64), **kw)
    call = lambda: raw.FractionalMaxPoolGrad(row_pooling_sequence=np.array(rows, I64), **kw)  # noqa: E731
    if ok:
        for got in _both(call):
            oracle.assert_same(got, want)
    else:
        with pytest.raises(tfgrad.InvalidArgumentError, match="its extra cells must be empty"):
            call()


@pytest.mark.live
def test_live_tf_over_long_sequences():
    # AvgPoolGrad: the values after the first out_rows + 1 are never read.
    kw = _avg_grad_kw([0, 1, 3, -5, 2**62], [0, 2, 3, -1])
    oracle.assert_same(oracle.run_tf("FractionalAvgPoolGrad", kw),
                       oracle.run_tf("FractionalAvgPoolGrad", _avg_grad_kw([0, 1, 3], [0, 2, 3])))
    oracle.assert_same(raw.FractionalAvgPoolGrad(**kw), oracle.run_tf("FractionalAvgPoolGrad", kw))
    # MaxPoolGrad: an extra, non-empty row cell of batch 0 is pooled into batch 1's slot
    # (for the last batch, past the buffer): TF's own replay then fails, though the first
    # two values make a valid sequence (batch 1's cell holds 7, batch 0's rows 1-2 hold 100).
    x = np.zeros((2, 3, 3, 1), F32)
    x[0, 0, :, 0], x[0, 1:] = [1, 2, 3], 100
    x[1, 0, :, 0], x[1, 1:] = [7, 6, 5], 50
    kw = dict(orig_input=x, orig_output=np.array([3, 7], F32).reshape(2, 1, 1, 1),
              out_backprop=np.ones((2, 1, 1, 1), F32), col_pooling_sequence=np.array([0, 3], I64),
              overlapping=False)
    short, long = (dict(kw, row_pooling_sequence=np.array(r, I64)) for r in ([0, 1], [0, 1, 3]))
    oracle.assert_same(raw.FractionalMaxPoolGrad(**short),
                       oracle.run_tf("FractionalMaxPoolGrad", short))
    with pytest.raises(Exception, match="tensor_out_dup is not the same as tensor_out"):
        oracle.run_tf("FractionalMaxPoolGrad", long)
    with pytest.raises(tfgrad.InvalidArgumentError, match="cell 1 spans \\[1, 2\\]"):
        raw.FractionalMaxPoolGrad(**long)


def _seqs(rows, cols):
    return dict(row_pooling_sequence=np.array(rows, I64), col_pooling_sequence=np.array(cols, I64))


_SHAPE = dict(orig_input_tensor_shape=np.array([1, 3, 3, 1], I64))
_CRASHES = {  # inputs TF 2.21 crashes on (a signal), and tfgrad rejects
    "avg_grad_deeper_out_backprop": ("FractionalAvgPoolGrad", dict(
        _SHAPE, out_backprop=np.ones((1, 2, 2, 64), F32), **_seqs([0, 1, 3], [0, 2, 3]))),
    "avg_grad_larger_out_backprop_batch": ("FractionalAvgPoolGrad", dict(
        _SHAPE, out_backprop=np.ones((64, 2, 2, 1), F32), **_seqs([0, 1, 3], [0, 2, 3]))),
    "max_grad_sequence_value_min_int64": ("FractionalMaxPoolGrad", dict(
        orig_input=np.ones((1, 3, 3, 1), F32), orig_output=np.ones((1, 1, 1, 1), F32),
        out_backprop=np.ones((1, 1, 1, 1), F32), **_seqs([-(2**63), 3], [0, 3]))),
}


@pytest.mark.live
@pytest.mark.parametrize("name", sorted(_CRASHES))
def test_live_tf_crashes_where_tfgrad_raises(name):
    """What docs/hardening.md and the README claim: TF 2.21 (Eigen kernels) dies of a
    signal on these (heap corruption: SIGABRT from glibc, or SIGSEGV)."""
    op, kw = _CRASHES[name]
    code = ("import pickle, sys\nimport tensorflow as tf\n"
            "op, kw = pickle.loads(sys.stdin.buffer.read())\ngetattr(tf.raw_ops, op)(**kw)\n")
    import pickle

    p = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((op, kw)),
                       capture_output=True, timeout=600,
                       env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0",
                            "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert p.returncode < 0, (p.returncode, p.stderr[-2000:])
    with pytest.raises(tfgrad.InvalidArgumentError):
        getattr(raw, op)(**kw)
