"""MatMul tests beyond the generic conformance tests (docs/matmul.md lists what each pins).

- the exact float32 FMA of the reference (round-to-odd) against the compiled llvm.fma on
  hard cases (double-rounding midpoints, cancellation, overflow, FTZ);
- TF's plans (sequential / parallel / K-sharded blocks, oneDNN passes, one-wide edge
  blocks) against TF live on shapes too large for the fixtures;
- TF with 1 intra-op thread vs 2 (subprocess): different bits, each matched by the plan
  for its thread count; TF on 4 and 16 threads (subprocesses: machines with more cores
  than this one) on shapes whose plan the thread count changes;
- the gradient table against TF's _MatMulGrad (tf.GradientTape) for every transpose pair;
- kernel == reference on hypothesis shapes; results independent of Numba's thread count.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfgrad
from tests import oracle
from tfgrad import raw_ops
from tfgrad._compile import jit
from tfgrad._config import tf_intra_op_threads
from tfgrad._gradients import steps
from tfgrad._tf import contraction, onednn
from tfgrad._tf.cpuid import avx2, modelled, onednn_isa, use_onednn_isa
from tfgrad._tf.fpenv import flush_denormals
from tfgrad.kernels import matmul as km
from tfgrad.testing.cases.matmul import spread, underflowing

F32 = np.float32


def operands(rng, m, k, n, ta=False, tb=False):
    return spread(rng, (k, m) if ta else (m, k)), spread(rng, (n, k) if tb else (k, n))


def both(a, b, ta=False, tb=False):
    """The kernel's product, after checking the reference gives the same bits."""
    kw = dict(a=a, b=b, transpose_a=ta, transpose_b=tb)
    with tfgrad.use_impl("kernel"):
        k = raw_ops.MatMul(**kw)
    with tfgrad.use_impl("reference"):
        r = raw_ops.MatMul(**kw)
    oracle.assert_same(k, r, what="kernel vs reference")
    return k


def check_tf(got, **kw) -> None:
    if oracle.tensorflow() is not None:
        oracle.assert_outputs("MatMul", got, oracle.run_tf("MatMul", kw), what="vs live TF")


# --------------------------------------------------------------------------------------
# The exact FMA
# --------------------------------------------------------------------------------------
@jit
def _fma_kernel(a, b, c, out):  # pragma: no cover - compiled
    for i in range(a.size):
        out[i] = km.fma32(a[i], b[i], c[i])


def _hard_fma_inputs(rng, n=20000):
    a = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(F32)
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(F32)
    p = a.astype(np.float64) * b.astype(np.float64)
    c = (-p).astype(F32)  # cancellation: a*b + c is the product's rounding error
    half = rng.random(n) < 0.3
    # c making a*b + c land near a float32 midpoint (double rounding in float64)
    c = np.where(half, (np.float64(1.0) - p + np.ldexp(1.0, -24)).astype(F32), c)
    c[:5] = [np.inf, -np.inf, np.nan, 3e38, 0.0]
    a[5], b[5], c[5] = F32(1e-30), F32(1e-15), F32(0.0)  # flushed result
    a[6], b[6] = F32(3e38), F32(10.0)  # overflow
    return a, b, c


def test_reference_fma_is_single_rounding():
    rng = np.random.default_rng(0)
    a, b, c = _hard_fma_inputs(rng)
    out = np.empty_like(a)
    with flush_denormals():
        _fma_kernel(a, b, c, out)
        ref = onednn.fma(a, b, c)
    oracle.assert_same(ref, out, what="round-to-odd fma vs llvm.fma")
    # and a plain float64 sum would double-round some of them
    with np.errstate(over="ignore", invalid="ignore"):
        naive = (a.astype(np.float64) * b + c.astype(np.float64)).astype(F32)
    fin = np.isfinite(naive) & np.isfinite(ref)
    assert (naive[fin].view(np.int32) != ref[fin].view(np.int32)).any()


# --------------------------------------------------------------------------------------
# The plans
# --------------------------------------------------------------------------------------
def test_blocking_examples():
    """The worked examples of docs/matmul.md (Eigen's m = TF's N, n = TF's M)."""
    l1, l2, l3 = 32768, 1 << 20, 320 << 20
    p = contraction.plan(256, 256, 700, 2, l1, l2, l3)
    assert (p.path, p.shards[0].ranges) == ("parallel", ((0, 240), (240, 480), (480, 700)))
    p = contraction.plan(256, 256, 700, 1, l1, l2, l3)
    assert (p.path, p.shards[0].ranges) == ("sequential", ((0, 352), (352, 700)))
    p = contraction.plan(8, 9, 400, 1, l1, l2, l3)  # one Eigen block, two oneDNN passes
    assert p.shards[0].blocks == ((0, 400),) and p.shards[0].ranges == ((0, 200), (200, 400))
    p = contraction.plan(16, 16, 8192, 2, l1, l2, l3)
    assert p.path == "sharded" and [s.blocks[0] for s in p.shards] == [(0, 320), (4096, 4416)]
    p = contraction.plan(16, 16, 8192, 2, 49152, 2 << 20, 30 << 20)  # Intel's 48 KiB L1
    assert p.path == "sharded"
    assert contraction.plan(145, 49, 300, 2, l1, l2, l3).shards[0].gemv_m
    # Eigen's cost model takes the bandwidth of an unsharded-by-column block whatever
    # the sharding (computeBandwidth(false, bm, bn, bk)): a narrow output (Eigen's m = 8
    # to 15, TF's N: a classifier's 10 classes) costs half what it would by column, so
    # TF shards it by K or keeps it on one thread. Each plan below is TF's (live, on 2,
    # 4 and 8 threads: test_tf_thread_counts and the _LIVE_SHAPES).
    assert contraction.plan(10, 323, 1213, 2, l1, l2, l3).path == "sharded"
    assert contraction.plan(8, 1964, 57, 2, l1, l2, l3).path == "sequential"
    p = contraction.plan(12, 424, 4260, 4, l1, l2, l3)
    assert p.path == "sharded" and len(p.shards) == 4
    assert contraction.plan(12, 424, 4260, 2, l1, l2, l3).path == "parallel"
    assert contraction.combine_order(2) == [(0, 1)]
    assert contraction.combine_order(9) == [(0, 1, 2, 3), (4, 5, 6, 7), (0, 4), (0, 8)]
    assert contraction.combine_order(16)[-1] == (0, 4, 8, 12)
    # the tail (past the last whole packet of 8) of the whole output: 3 x 5 -> 8..14; rows
    # 2, 3, 0 of a 4-row output (a chunk): row 3's 16..19 (total 20), at 6..9 here
    assert contraction.combine_tail(3, 5).tolist() == list(range(8, 15))
    assert contraction.combine_tail(3, 5, (2, 4)).tolist() == [6, 7, 8, 9]


_LIVE_SHAPES = [  # (M, K, N, ta, tb): the plans too large for the fixtures
    (73, 321, 145, False, False),   # parallel, 3 k-blocks (160, 160, 1)
    (48, 700, 48, True, False),     # K-sharded, blocked shards
    (73, 321, 73, False, True),     # K-sharded
    (49, 400, 97, True, True),      # both edge blocks; the corner is gemv_n's
    (96, 200, 97, False, False),    # parallel with gemv_t
    (16, 8192, 16, False, False),   # sharded, 13 blocks each
    (32, 1280, 10, False, False),   # MobileNet's classifier
    (1280, 32, 10, True, False),    # its gradient for the weights
    (6272, 96, 64, False, False),   # a 1x1 convolution's shape (parallel)
    (323, 1213, 10, True, False),   # a narrow output: K-sharded on 2 threads (cost model)
    (402, 160, 12, False, True),    # the same, K = 160
    (1964, 57, 8, True, True),      # the same, sequential on 2 threads
]


@pytest.mark.live
@pytest.mark.parametrize("m,k,n,ta,tb", _LIVE_SHAPES)
@oracle.onednn_modelled
def test_plans_match_tf(m, k, n, ta, tb):
    if oracle.tensorflow() is None:
        pytest.skip("TensorFlow is not installed")
    rng = np.random.default_rng(m * k + n)
    a, b = operands(rng, m, k, n, ta, tb)
    with tfgrad.use_impl("kernel"):
        got = raw_ops.MatMul(a=a, b=b, transpose_a=ta, transpose_b=tb)
    check_tf(got, a=a, b=b, transpose_a=ta, transpose_b=tb)
    if m * n * k <= 4_000_000:  # the reference is slow beyond
        both(a, b, ta, tb)


@pytest.mark.live
@pytest.mark.skipif(oracle.tensorflow() is None or modelled(),
                    reason="TensorFlow is not installed, or (oneDNN's kernel modelled here) "
                    "test_plans_match_tf checks the bits")
@pytest.mark.parametrize("m,k,n,ta,tb", _LIVE_SHAPES)
def test_contraction_distance_unmodelled(m, k, n, ta, tb):
    """Where oneDNN runs a kernel tfgrad does not model (AVX without FMA, say), tfgrad keeps
    the AVX-512 kernel's order. Each order's result lies within the dot product's rounding
    bound of the exact one, so the two differ by at most |d| <= 2 K u sum |a b|
    (u = 2**-24)."""
    rng = np.random.default_rng(m * k + n)
    a, b = operands(rng, m, k, n, ta, tb)
    with tfgrad.use_impl("kernel"):
        got = raw_ops.MatMul(a=a, b=b, transpose_a=ta, transpose_b=tb).astype(np.float64)
    tf = oracle.tensorflow()
    ref = tf.raw_ops.MatMul(a=a, b=b, transpose_a=ta, transpose_b=tb).numpy()
    A, B = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
    bound = 2 * k * 2.0**-24 * (np.abs(A) @ np.abs(B))
    assert np.all(np.abs(got - ref) <= bound)


# --------------------------------------------------------------------------------------
# oneDNN's AVX2 kernel (modelled on every processor; TF's bits where it runs)
# --------------------------------------------------------------------------------------
def test_avx2_tiles():
    """The AVX2 driver's pieces and tiles (docs/matmul.md): TF's rows in pieces of 48
    (from 96 rows on; halves above 72; 96s with A transposed), columns in 16-wide tiles,
    each piece's last partial row tile (1-5 rows) and last 1-8 columns marked."""
    un, um = onednn.avx2_kinds(32, 10, 32, 10)  # 32x1280x10: the last 2 rows
    assert np.flatnonzero(un != 6).tolist() == [30, 31] and set(un[30:]) == {2}
    assert (um == 16).all()  # 10 columns: one masked 16-wide tile
    un, um = onednn.avx2_kinds(86, 40, 0, 0)  # rows 43 + 43 (halves); columns 16, 16, 8
    assert np.flatnonzero(un != 6).tolist() == [42, 85] and set(un[[42, 85]]) == {1}
    assert np.flatnonzero(um == 8).tolist() == list(range(32, 40))
    un, um = onednn.avx2_kinds(100, 8, 0, 0, trans_a=True)  # one piece of 100 rows
    assert np.flatnonzero(un != 6).tolist() == [96, 97, 98, 99] and set(un[96:]) == {4}
    assert (um == 8).all()  # 8 columns: the 8-wide kernel
    un, um = onednn.avx2_kinds(60, 60, 27, 24)  # Eigen's blocks each cut on their own
    assert np.flatnonzero(un != 6).tolist() == [24, 25, 26, 51, 52, 53]
    assert np.flatnonzero(um == 8).tolist() == list(range(16, 24)) + list(range(40, 48))
    assert onednn.nocopy_sizes(200, 48, 72) == [48, 48, 48, 56]
    assert contraction.onednn_passes(0, 700, "avx2") == [(0, 256), (256, 478), (478, 700)]


def test_avx2_copy_based_blocks():
    """oneDNN's AVX2 driver runs a call copy-based unless 1/m + 1/n >= 0.0038 (or k <= 2):
    one FMA chain per output over K passes of its own (192s from 384 on), no edge tiles.
    889 x 64 x 834 on 2 threads: Eigen's blocks of 672 columns x 456 rows; the one of
    433 rows is copy-based and holds the 1-row tile of row 888 (TF live, AVX2: its
    columns 0-671 are single chains)."""
    assert contraction.copy_based(672, 433, 64) and not contraction.copy_based(162, 433, 64)
    assert not contraction.copy_based(672, 433, 2)
    assert contraction.copy_passes(0, 300) == contraction.onednn_passes(0, 300, "avx2")
    assert contraction.copy_passes(0, 400) == [(0, 192), (192, 384), (384, 400)]
    assert contraction.onednn_passes(0, 400, "avx2") == [(0, 200), (200, 400)]
    p = contraction.plan(834, 889, 64, 2, 32768, 1 << 20, 320 << 20, "avx2")
    sh = p.shards[0]
    assert (sh.mc, sh.nc) == (672, 456)
    assert sh.copy == ((0, 456, 0, 672), (456, 889, 0, 672))
    un, um = onednn.avx2_kinds(889, 834, sh.nc, sh.mc)
    assert onednn.copy_fixes(sh, un, um) == [(456, 889, 0, 672)]
    rng = np.random.default_rng(5)
    a, b = operands(rng, 889, 16, 834)
    with use_onednn_isa("avx2"):
        got = both(a, b)
    if modelled() and onednn_isa() == "avx2":
        check_tf(got, a=a, b=b, transpose_a=False, transpose_b=False)


@pytest.mark.parametrize("m,k,n", [(44, 41, 40), (45, 40, 24), (7, 300, 9), (100, 33, 20),
                                   (201, 520, 47)])
def test_avx2_kernel_is_the_model(m, k, n):
    """The compiled AVX2 edge tiles give the NumPy model's bits (every transpose pair),
    and those differ from the AVX-512 order: the edge tiles sum otherwise."""
    rng = np.random.default_rng(m * n + k)
    differs = False
    for ta in (False, True):
        for tb in (False, True):
            a, b = operands(rng, m, k, n, ta, tb)
            with use_onednn_isa("avx2"):
                got = both(a, b, ta, tb)
            with use_onednn_isa("avx512_core"):
                other = both(a, b, ta, tb)
            differs |= got.tobytes() != other.tobytes()
    assert differs


@pytest.mark.live
def test_avx2_kernel_live(tmp_path):
    """The AVX2 model against TF's AVX2 kernel, on any processor with AVX2 and FMA: TF in
    a subprocess with ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's own switch: on an AVX-512
    processor it then runs its AVX2 kernel, the one an AVX2 processor runs), tfgrad under
    ``use_onednn_isa("avx2")``. Edge tiles (1-3 row tiles, 8-wide columns) included, and
    products that all underflow: TF stores an edge tile's first K pass as it is, so a
    pass flushed to -0 stays -0 (tfgrad gave +0 in 20 of 135 such calls before)."""
    if oracle.tensorflow() is None or not avx2():
        pytest.skip("needs TensorFlow on an x86-64 processor with AVX2 and FMA")
    rng = np.random.default_rng(11)
    calls = []
    for m, k, n in [(44, 41, 40), (45, 40, 24), (7, 300, 9), (100, 33, 20), (201, 520, 47)]:
        ta, tb = bool(rng.integers(2)), bool(rng.integers(2))
        a, b = operands(rng, m, k, n, ta, tb)
        calls.append(dict(a=a, b=b, transpose_a=ta, transpose_b=tb))
    for m, k, n in [(5, 1000, 3), (9, 400, 8), (3, 300, 5), (49, 300, 145)]:
        for signs in ("negative", "mixed", "halves"):
            a, b = underflowing(rng, m, k, n, signs)
            ta, tb = bool(rng.integers(2)), bool(rng.integers(2))
            calls.append(dict(a=np.ascontiguousarray(a.T) if ta else a,
                              b=np.ascontiguousarray(b.T) if tb else b,
                              transpose_a=ta, transpose_b=tb))
    want = _tf_on_threads(tf_intra_op_threads(), calls, tmp_path,
                          env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    with use_onednn_isa("avx2"):
        for c, w in zip(calls, want):
            got = both(c["a"], c["b"], c["transpose_a"], c["transpose_b"])
            oracle.assert_same(got, w, what="vs TF's AVX2 kernel")


_TF_THREADS = r"""
import os, sys
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
d = np.load(sys.argv[2])
out = {}
for i in range(int(d["n"])):
    if f"fs{i}" in d:
        out[f"o{i}"] = tf.raw_ops.Conv2DBackpropFilter(
            input=d[f"a{i}"], filter_sizes=d[f"fs{i}"], out_backprop=d[f"b{i}"],
            strides=[1, 1, 1, 1], padding="SAME").numpy()
    else:
        out[f"o{i}"] = tf.raw_ops.MatMul(a=d[f"a{i}"], b=d[f"b{i}"],
                                         transpose_a=bool(d[f"t{i}"][0]),
                                         transpose_b=bool(d[f"t{i}"][1])).numpy()
np.savez(sys.argv[3], **out)
"""


def _tf_on_threads(threads: int, calls: list[dict], folder, env: dict | None = None
                   ) -> list[np.ndarray]:
    """TF's outputs of ``calls`` (MatMul kwargs, or Conv2DBackpropFilter's with
    ``filter_sizes``) on ``threads`` intra-op threads: a subprocess, as TF sizes its
    pool once (and oneDNN reads ``env``'s ``ONEDNN_MAX_CPU_ISA`` once)."""
    arrays: dict[str, np.ndarray] = {"n": np.array(len(calls))}
    for i, c in enumerate(calls):
        if "filter_sizes" in c:
            arrays.update({f"a{i}": c["input"], f"b{i}": c["out_backprop"],
                           f"fs{i}": c["filter_sizes"]})
        else:
            arrays.update({f"a{i}": c["a"], f"b{i}": c["b"],
                           f"t{i}": np.array([c["transpose_a"], c["transpose_b"]])})
    src, dst = folder / f"in{threads}.npz", folder / f"out{threads}.npz"
    np.savez(src, **arrays)
    res = subprocess.run([sys.executable, "-c", _TF_THREADS, str(threads), str(src), str(dst)],
                         capture_output=True, text=True, timeout=300,
                         env=None if env is None else {**os.environ, **env})
    assert res.returncode == 0, res.stderr[-2000:]
    out = np.load(dst)
    return [out[f"o{i}"] for i in range(len(calls))]


@pytest.mark.live
@oracle.onednn_modelled
def test_one_vs_two_tf_threads(tmp_path, monkeypatch):
    """[256, 700] x [700, 256]: TF on 2 threads sums k-blocks 240/240/220 (parallel), on 1
    thread 352/348 (sequential): the bits differ, and each plan gives its TF's bits."""
    if oracle.tensorflow() is None:
        pytest.skip("TensorFlow is not installed")
    rng = np.random.default_rng(5)
    a, b = operands(rng, 256, 700, 256)
    outs = {}
    for t in (1, 2):
        [outs[t]] = _tf_on_threads(t, [dict(a=a, b=b, transpose_a=False, transpose_b=False)],
                                   tmp_path)
        monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(t))
        with tfgrad.use_impl("kernel"):
            oracle.assert_same(raw_ops.MatMul(a=a, b=b), outs[t], what=f"{t} TF threads")
    assert (outs[1] != outs[2]).mean() > 0.1


_THREAD_SHAPES = [  # (M, K, N, ta, tb): plans that the thread count changes
    (424, 4260, 12, False, True),   # 2 threads parallel; 4: four K-shards, (b0+b1)+(b2+b3)
    (323, 1213, 10, True, False),   # a narrow output, K-sharded (16 threads: 13 shards)
    (1479, 765, 10, False, True),   # 4 threads parallel; 16: eight K-shards
    (644, 259, 10, True, True),     # 4 threads: three K-shards of 96; 16: parallel
    (16, 8192, 16, False, False),   # 16 threads: ten K-shards (groups of 4, then leaders)
    (777, 555, 333, False, False),  # parallel, blocked for the thread count
    (100, 5000, 100, True, False),  # 4 threads parallel; 16: sixteen K-shards
]


@pytest.mark.live
@oracle.onednn_modelled
@pytest.mark.parametrize("threads", [4, 16])
def test_tf_thread_counts(threads, tmp_path, monkeypatch):
    """TF on more intra-op threads than this machine may have (a subprocess each): its
    MatMul plans (parallel blocking, K-sharding into up to 16 shards and their sums) and
    Conv2DBackpropFilter's, matched by the plan for that count
    (``TFGRAD_TF_INTRA_OP_THREADS``)."""
    if oracle.tensorflow() is None:
        pytest.skip("TensorFlow is not installed")
    rng = np.random.default_rng(threads)
    calls = []
    for m, k, n, ta, tb in _THREAD_SHAPES:
        a, b = operands(rng, m, k, n, ta, tb)
        calls.append(dict(a=a, b=b, transpose_a=ta, transpose_b=tb))
    # a 3x3 filter gradient with 12 output channels: Eigen's m = 12, K = the pixels
    calls.append(dict(input=spread(rng, (20, 24, 24, 64)),
                      out_backprop=spread(rng, (20, 24, 24, 12)),
                      filter_sizes=np.array([3, 3, 64, 12], np.int32)))
    want = _tf_on_threads(threads, calls, tmp_path)
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", str(threads))
    with tfgrad.use_impl("kernel"):
        for c, w in zip(calls, want):
            if "filter_sizes" in c:
                got = raw_ops.Conv2DBackpropFilter(strides=[1, 1, 1, 1], padding="SAME", **c)
            else:
                got = raw_ops.MatMul(**c)
            oracle.assert_same(got, w, what=f"{threads} TF threads")


# --------------------------------------------------------------------------------------
# Eigen Core's vector products
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("m,k,n", [(9000, 300, 1), (1, 300, 9000), (7, 1004, 1), (1, 37, 1),
                                   (1, 1004, 1), (1, 151, 1)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_vector_products(m, k, n, ta, tb):
    """GEMV by rows (8 lanes; a last odd row's half packet) or by columns (blocks of 16,
    4 from a 32000-byte stride), dots left to right or vectorised (Eigen's inner product,
    four packet accumulators): TF's bits."""
    rng = np.random.default_rng(m + n + k)
    a, b = operands(rng, m, k, n, ta, tb)
    got = both(a, b, ta, tb)
    check_tf(got, a=a, b=b, transpose_a=ta, transpose_b=tb)


@pytest.mark.parametrize("m,k,n", [(2, 2, 2), (16, 16, 16), (5, 1000, 3), (9, 400, 8),
                                   (96, 200, 96), (49, 300, 145)])
@pytest.mark.parametrize("signs", ["negative", "mixed", "halves"])
def test_underflowing_chains_keep_their_sign(m, k, n, signs):
    """Products below the smallest normal (1e-25 * 1e-25) flush to zeros of their sign
    (FTZ): a chain of them is -0 when they are negative, and TF stores the first k-range's
    chain as it is (+0 + -0 would be +0) and adds the later ones: TF's bits. (oneDNN's
    AVX-512 kernel live; its AVX2 kernel's edge tiles: test_avx2_kernel_live.)"""
    if oracle.tensorflow() is None or onednn_isa() != "avx512_core":
        pytest.skip("needs TensorFlow on an AVX-512 processor (oneDNN's avx512_core kernel)")
    a, b = underflowing(np.random.default_rng(m * k + n), m, k, n, signs)
    got = both(a, b)
    assert np.signbit(got).any() or signs != "negative"
    check_tf(got, a=a, b=b, transpose_a=False, transpose_b=False)
    x, f = a.reshape(1, 1, m, k), b.reshape(1, 1, k, n)  # a 1x1 convolution: one GEMM
    conv = dict(input=x, filter=f, strides=[1, 1, 1, 1], padding="VALID")
    with tfgrad.use_impl("kernel"):
        got = raw_ops.Conv2D(**conv)
    with tfgrad.use_impl("reference"):
        oracle.assert_same(got, raw_ops.Conv2D(**conv), what="kernel vs reference")
    oracle.assert_outputs("Conv2D", got, oracle.run_tf("Conv2D", conv), what="vs live TF")


# --------------------------------------------------------------------------------------
# The gradient
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@oracle.onednn_modelled
def test_gradient_table_is_tfs(ta, tb):
    """The two MatMuls TF's _MatMulGrad calls (operands, transposes, grad_a / grad_b), run
    through the table, give tf.GradientTape's bits."""
    rng = np.random.default_rng(int(ta) * 2 + int(tb))
    m, k, n = 33, 300, 20
    a, b = operands(rng, m, k, n, ta, tb)
    g = spread(rng, (m, n))
    fwd = {"transpose_a": ta, "transpose_b": tb, "grad_a": False, "grad_b": False}
    src = {"input": {"a": a, "b": b}, "grad": {"product": g}}
    grads = {}
    for step in steps("MatMul", fwd):
        args = {name: src[kind][f] for name, kind, f, _ in step.sources}
        ((x, _, _),) = step.gives
        grads[x] = raw_ops.MatMul(**args, **step.call_attrs(fwd))
    assert grads["a"].shape == a.shape and grads["b"].shape == b.shape
    tf = oracle.tensorflow()
    if tf is None:
        return
    ta_, tb_ = tf.constant(a), tf.constant(b)
    with tf.GradientTape() as tape:
        tape.watch([ta_, tb_])
        y = tf.raw_ops.MatMul(a=ta_, b=tb_, transpose_a=ta, transpose_b=tb)
    da, db = tape.gradient(y, [ta_, tb_], output_gradients=tf.constant(g))
    oracle.assert_same(grads["a"], da.numpy(), what="da")
    oracle.assert_same(grads["b"], db.numpy(), what="db")


# --------------------------------------------------------------------------------------
# Kernel == reference; threads
# --------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.integers(2, 70), st.integers(2, 450), st.integers(2, 70), st.booleans(),
       st.booleans(), st.integers(0, 2**31))
def test_kernel_equals_reference(m, k, n, ta, tb, seed):
    a, b = operands(np.random.default_rng(seed), m, k, n, ta, tb)
    both(a, b, ta, tb)


def test_results_do_not_depend_on_numba_threads():
    import numba

    rng = np.random.default_rng(1)
    a, b = operands(rng, 200, 300, 150)
    outs = []
    for t in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(t)
        outs.append(raw_ops.MatMul(a=a, b=b))
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    oracle.assert_same(outs[0], outs[1], what="Numba threads")


def test_denormal_inputs_read_as_zero():
    a = np.full((4, 50), 1e-40, F32)
    b = np.ones((50, 3), F32)
    assert not raw_ops.MatMul(a=a, b=b).any()
    assert not raw_ops.MatMul(a=a[:1], b=b).any()  # Eigen Core's path too

