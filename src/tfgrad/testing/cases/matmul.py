"""Op cases for MatMul (see tfgrad/testing/cases/__init__.py).

Shapes cover each of TF's paths on this machine (2 intra-op threads, AMD Zen 4: L1 32 KiB
as Eigen reads it, oneDNN's AVX-512 sgemm): Eigen Core's vector products (K == 1, a
vector output stored by rows or by columns, a 1 x 1 output, Eigen's lazy product under
K + M + N < 20), and the contraction's sequential, parallel and K-sharded plans with
oneDNN's K passes and one-wide edge blocks (gemv_t, gemv_n, their corner), every
combination of transposes. Inputs are normal values times powers of two in [2^-8, 2^8)
(so the summation order shows in the bits), with zeros, denormals (read as zero: DAZ),
infinities and NaN in the specials case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad._opdefs import OPS

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
OP = "MatMul"


def spread(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal values times 2^[-8, 8): sums whose order shows in the last bits."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(F32)


def _operands(rng: np.random.Generator, m: int, k: int, n: int, ta: bool, tb: bool
              ) -> dict[str, Any]:
    return dict(a=spread(rng, (k, m) if ta else (m, k)), b=spread(rng, (n, k) if tb else (k, n)),
                transpose_a=ta, transpose_b=tb)


def _maker(m: int, k: int, n: int, ta: bool, tb: bool
           ) -> Callable[[np.random.Generator], dict[str, Any]]:
    return lambda rng: _operands(rng, m, k, n, ta, tb)


def _specials(rng: np.random.Generator) -> dict[str, Any]:
    kw = _operands(rng, 9, 40, 20, False, False)
    a = kw["a"]
    a[0, :4] = [0.0, -0.0, 1e-40, -1e-40]        # zeros, denormals (DAZ reads them as 0)
    a[1, 0], a[2, 3], a[3, 5] = np.inf, -np.inf, np.nan
    a[4, :] = 1e-20                                # products that flush (FTZ)
    kw["b"][:, 0] = 0.0
    kw["b"][5, 1] = 3e38                           # an overflowing sum
    a[5, 5] = 3e38
    return kw


# (name, M, K, N, transposes): after the transposes; the plan each takes on this machine.
# Small shapes run all four transpose pairs; the larger ones one (the fixtures stay small:
# tests/test_matmul.py runs larger plans against TF live).
_ALL = ((False, False), (False, True), (True, False), (True, True))
_SHAPES = [
    ("k1", 6, 1, 7, _ALL),                     # Core: exact products
    ("lazy", 3, 9, 5, _ALL),                   # Core: K + M + N < 20, lazy coefficients
    ("vec_n", 7, 300, 1, _ALL),                # Core: output column (row-major GEMV /
    ("vec_n_even", 8, 21, 1, _ALL),            #   column-major; a last odd row's half packet)
    ("vec_m", 1, 300, 9, _ALL),                # Core: output row, column blocks of 16
    ("vec_m_k100", 1, 100, 40, _ALL),          # Core: one column block (K < 128)
    ("dot", 1, 16, 1, _ALL),                   # Core: 1 x 1
    ("small", 5, 7, 9, _ALL),                  # contraction, unblocked (all dims < 48)
    ("seq", 9, 320, 20, _ALL),                 # sequential, one FMA chain of 320
    ("seq_blocks", 5, 1000, 3, _ALL),          # sequential, k-blocks 336 + 336 + 328
    ("seq_passes", 9, 400, 8, _ALL),           # one k-block, oneDNN passes 200 + 200
    ("seq_passes_767", 3, 767, 5, _ALL),       # 384 + 383
    ("gemv_t", 2, 20, 49, _ALL),               # Eigen's last m-block one wide: last column
    ("gemv_t_k100", 9, 100, 49, ((False, True),)),
    ("gemv_n", 25, 200, 16, ((True, False),)),  # last n-block one wide: last row
    ("parallel", 96, 200, 96, ((False, True),)),  # 2 threads: the parallel plan
]

CASES: list[Case] = []
for _name, _m, _k, _n, _pairs in _SHAPES:
    for _ta, _tb in _pairs:
        CASES.append(Case(OP, f"{_name}_{_m}x{_k}x{_n}_ta{int(_ta)}_tb{int(_tb)}",
                          _maker(_m, _k, _n, _ta, _tb)))
CASES += [
    Case(OP, "specials", _specials),
    Case(OP, "empty_k0", lambda rng: dict(a=np.zeros((3, 0), F32), b=np.zeros((0, 4), F32))),
    Case(OP, "empty_m0", lambda rng: dict(a=np.zeros((0, 5), F32), b=spread(rng, (5, 4)))),
    Case(OP, "grad_attrs", lambda rng: dict(**_operands(rng, 9, 50, 11, True, False),
                                            grad_a=True, grad_b=False)),
]
# A 1 x 1 output over a long K: summed left to right unless b is transposed and a is not
# (then Eigen's inner product: four packet accumulators); K = 300 and K % 32 = 7 and 27.
CASES += [Case(OP, f"dot_1x{k}x1_ta{int(ta)}_tb{int(tb)}", _maker(1, k, 1, ta, tb))
          for k in (300, 39, 59) for ta, tb in _ALL]


def _negzero(m: int, k: int, n: int, ta: bool, tb: bool
             ) -> Callable[[np.random.Generator], dict[str, Any]]:
    """Every product -0 (a < 0, b = +0): the sums -0, or +0 where TF adds them to a
    zeroed output."""
    def make(rng: np.random.Generator) -> dict[str, Any]:
        kw = _operands(rng, m, k, n, ta, tb)
        kw["a"] = -np.abs(kw["a"])
        kw["b"] = np.zeros_like(kw["b"])
        return kw
    return make


# (the vector paths' signed zeros: exact products, lazy, inner product, GEMV)
CASES += [Case(OP, f"negzero_{m}x{k}x{n}_ta{int(ta)}_tb{int(tb)}", _negzero(m, k, n, ta, tb))
          for m, k, n in ((1, 1, 1), (1, 5, 2), (1, 40, 1), (40, 1, 1), (9, 30, 1))
          for ta, tb in _ALL]


def underflowing(rng: np.random.Generator, m: int, k: int, n: int, signs: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A [m, k], B [k, n] whose products all fall below the smallest normal (1e-25 *
    1e-25: flushed to zeros of their signs), A's values all negative ("negative"), of
    mixed signs ("mixed"), or negative in its first half of k ("halves"): chains flushed
    to -0, which TF stores as they are for the first K pass, in the AVX2 kernel's edge
    tiles too."""
    a = (np.abs(rng.standard_normal((m, k))) * 1e-25).astype(F32)
    b = (np.abs(rng.standard_normal((k, n))) * 1e-25).astype(F32)
    if signs == "negative":
        a = -a
    elif signs == "mixed":
        a *= np.where(rng.random(a.shape) < 0.5, F32(-1), F32(1))
    else:
        a[:, :k // 2] *= -1
    return a, b


def _underflow(m: int, k: int, n: int, signs: str
               ) -> Callable[[np.random.Generator], dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        a, b = underflowing(rng, m, k, n, signs)
        return dict(a=a, b=b)
    return make


# (flushed chains: 1-3-row and 8-wide edge tiles on oneDNN's AVX2 kernel, and its 6-row
# tiles; on AVX-512 the smalln kernel and the 16-wide ones)
CASES += [Case(OP, f"underflow_{m}x{k}x{n}_{signs}", _underflow(m, k, n, signs))
          for m, k, n in ((5, 1000, 3), (9, 400, 8), (49, 300, 45))
          for signs in ("negative", "mixed")]


def processor_dependent(case: Case, kwargs: dict[str, Any]) -> set[str]:
    """The contraction's outputs (min(M, K, N) > 1): their order follows TF's intra-op
    thread count, the L1 size Eigen reads and oneDNN's instruction set. Eigen Core's
    vector products (compiled for AVX without FMA) are the same on every x86 processor."""
    a, b = kwargs["a"], kwargs["b"]
    ta, tb = kwargs.get("transpose_a", False), kwargs.get("transpose_b", False)
    m = a.shape[1] if ta else a.shape[0]
    k = a.shape[0] if ta else a.shape[1]
    n = b.shape[0] if tb else b.shape[1]
    return {"product"} if min(m, k, n) > 1 else set()


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
def _kw(a: tuple[int, ...], b: tuple[int, ...], **over: Any) -> Callable[[], dict[str, Any]]:
    return lambda: dict(a=np.ones(a, F32), b=np.ones(b, F32), **over)


ERROR_CASES: list[ErrorCase] = [
    ErrorCase(OP, "ranks_differ", _kw((2, 3, 4), (4, 2)), IAE,
              r"In\[0\] and In\[1\] has different ndims: \[2,3,4\] vs. \[4,2\]"),
    ErrorCase(OP, "vector", _kw((2,), (2, 2)), IAE,
              r"In\[0\] and In\[1\] has different ndims: \[2\] vs. \[2,2\]"),
    ErrorCase(OP, "rank3", _kw((2, 3, 4), (2, 4, 2)), IAE,
              r"In\[0\] and In\[1\] ndims must be == 2: 3"),
    ErrorCase(OP, "rank1", _kw((3,), (3,)), IAE, r"In\[0\] and In\[1\] ndims must be == 2: 1"),
    ErrorCase(OP, "incompatible", _kw((2, 3), (4, 2)), IAE,
              r"Matrix size-incompatible: In\[0\]: \[2,3\], In\[1\]: \[4,2\]"),
    ErrorCase(OP, "incompatible_t", _kw((3, 2), (4, 2), transpose_a=True, transpose_b=True),
              IAE, r"Matrix size-incompatible: In\[0\]: \[3,2\], In\[1\]: \[4,2\]"),
    ErrorCase(OP, "float64", lambda: dict(a=np.ones((2, 3)), b=np.ones((3, 2))), TypeError,
              "float64", tf_rejects=False,
              why="TF computes float64 (Eigen's gebp for doubles); tfgrad float32 only"),
]


# --------------------------------------------------------------------------------------
# Benchmarks: MobileNet's dense / 1x1 shapes
# --------------------------------------------------------------------------------------
def _bench_make(m: int, k: int, n: int, smoke_shape: tuple[int, int, int], ta: bool = False,
                tb: bool = False) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        mm, kk, nn = smoke_shape if smoke else (m, k, n)
        return _operands(rng, mm, kk, nn, ta, tb)
    return make


def _bench_bytes(kw: dict[str, Any]) -> int:
    a, b = kw["a"], kw["b"]
    ta, tb = kw.get("transpose_a", False), kw.get("transpose_b", False)
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    return array_bytes(a) + array_bytes(b) + 4 * m * n


def _bench_torch(kw: dict[str, Any]) -> Callable[[], Any]:
    torch = torch_module()
    assert torch is not None
    a, b = torch.from_numpy(kw["a"]), torch.from_numpy(kw["b"])
    if kw.get("transpose_a"):
        a = a.T
    if kw.get("transpose_b"):
        b = b.T
    return lambda: torch.mm(a, b)


BENCHES = [
    Bench(OP, "[6272,96]x[96,576] (1x1 conv 14x14, batch 32)",
          _bench_make(6272, 96, 576, (64, 24, 32)), _bench_bytes, torch=_bench_torch),
    Bench(OP, "[32,1280]x[1280,10] (classifier)", _bench_make(32, 1280, 10, (8, 64, 10)),
          _bench_bytes, torch=_bench_torch),
    Bench(OP, "[32,10]x[1280,10]^T (classifier, da)",
          _bench_make(32, 10, 1280, (8, 10, 64), tb=True), _bench_bytes, torch=_bench_torch),
    Bench(OP, "[32,1280]^T x[32,10] (classifier, db)",
          _bench_make(1280, 32, 10, (64, 8, 10), ta=True), _bench_bytes, torch=_bench_torch),
]


# --------------------------------------------------------------------------------------
# Warmup and the larger input
# --------------------------------------------------------------------------------------
WARMUP: list[Warmup] = [
    Warmup(OP, f"{m}x{k}x{n}_ta{int(ta)}_tb{int(tb)}", _maker(m, k, n, ta, tb),
           large=m * n * k >= 1 << 18)
    for (m, k, n) in ((9, 40, 20), (256, 300, 256)) for ta in (False, True)
    for tb in (False, True)
]


def _large() -> dict[str, Any]:
    """Large enough for the kernel's threads (and a parallel plan, an edge block)."""
    return _operands(np.random.default_rng(3), 257, 700, 193, False, True)


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large for name, op in OPS.items() if op.family == "matmul"}
