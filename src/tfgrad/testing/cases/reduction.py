"""Op cases for the reduction family: Sum and Mean (see tfgrad/testing/cases/__init__.py).

Every path of TF's ReductionOp (docs/reduction.md): copies (nothing reduced), full, inner,
outer, middle, generic (reduce 0 and 2 of 3 runs) and transposed reductions, empty
inputs, negative axes, int64 axes, keep_dims, and the shapes of a training step
(GlobalAveragePooling2D's Mean over [1, 2] of NHWC, a loss mean, moments). Values carry
float16 mantissas with spread exponents, so that float32 sums round and the order shows,
and a few specials (+-0, denormals; inf / NaN in some cases).

Full reductions stay under 108388 values here: from there TF splits the sum by its thread
count (tests/test_reduction.py covers that live).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgrad import InvalidArgumentError as IAE
from tfgrad._errors import InvalidDtypeError

from ..harness import Bench, array_bytes, torch_module
from . import Case, ErrorCase, Warmup

F32 = np.float32
_OPS = ("Sum", "Mean")


def values(rng: np.random.Generator, shape: tuple[int, ...], special: bool = True,
           nonfinite: bool = False) -> np.ndarray:
    """float16 mantissas times 2**[-12, 12), with +-0 and denormals (inf / NaN too)."""
    n = int(np.prod(shape))
    x = rng.standard_normal(n).astype(np.float16).astype(F32)
    x *= np.exp2(rng.integers(-12, 12, n)).astype(F32)
    if special and n >= 8:
        idx = rng.choice(n, 4, replace=False)
        x[idx] = np.array([0.0, -0.0, 1e-40, -3e-39], F32)
    if nonfinite and n >= 16:
        idx = rng.choice(n, 2, replace=False)
        x[idx] = np.array([np.inf, np.nan], F32)[: len(idx)]
    return x.reshape(shape)


_CASES: list[Case] = []


def _add(name: str, shape: tuple[int, ...], axis: Any, keep: bool = False,
         dtype: Any = np.int32, special: bool = True, nonfinite: bool = False,
         ops: tuple[str, ...] = _OPS) -> None:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        ax = np.array(axis, dtype)
        return dict(input=values(rng, shape, special, nonfinite), axis=ax, keep_dims=keep)

    for op in ops:
        _CASES.append(Case(op, name, make))


# Nothing reduced: TF copies the input (-0 and denormals survive).
_add("no_axes", (3, 4), [])
_add("size1_axis", (5, 1, 3), [1])
_add("leading_size1", (1, 6), [0])
_add("scalar", (), [])
_add("all_size1", (1, 1), [0, 1])
# Empty tensors
_add("empty_input_kept_dims", (0, 3), [0])  # Sum 0, Mean NaN
_add("empty_output", (3, 0), [0])
_add("empty_full", (0,), [0])
# Full reductions (Eigen's tree: leaves of 8192, packets of 8, a scalar tail)
for _n in (1, 7, 8, 31, 32, 33, 100, 8192, 8193):
    _add(f"full{_n}", (_n,), [0])
_add("full16391", (16391,), [0], ops=("Sum",))
_add("full24583", (24583,), [0], ops=("Mean",))
_add("loss_mean32", (32,), [0])
_add("loss_mean16", (16,), [0])
_add("full_2d", (37, 41), [0, 1])
_add("full_4d_neg", (2, 3, 5, 7), [-1, 0, 2, 1])
_add("full_nonfinite", (300,), [0], nonfinite=True)
# Inner reductions ([r, c] along c): Eigen's tree from each row's flat index
for _r, _c in ((5, 37), (32, 10), (7, 1)):
    _add(f"inner{_r}x{_c}", (_r, _c), [1])
_add("inner3x8200", (3, 8200), [1], ops=("Sum",))
_add("inner2x9000", (2, 9000), [1], ops=("Mean",))
_add("inner_keep", (4, 3, 50), [2], keep=True)
# Outer reductions ([r, c] along r): packets of 8 columns, lanes when r >= 16
for _r, _c in ((37, 5), (15, 19), (16, 19), (17, 33), (40, 64), (1000, 3), (17, 1030)):
    _add(f"outer{_r}x{_c}", (_r, _c), [0])
_add("outer_nonfinite", (20, 16), [0], nonfinite=True)
# Middle reductions ([a, b, c] along b)
for _a, _b, _c in ((3, 20, 11), (3, 20, 8), (4, 15, 13), (5, 17, 16), (2, 40, 3),
                   (7, 33, 9), (3, 17, 200)):
    _add(f"middle{_a}x{_b}x{_c}", (_a, _b, _c), [1])
# GlobalAveragePooling2D (Mean over H, W of NHWC) and moments-style reductions
_add("gap_1x7x7x640", (1, 7, 7, 640), [1, 2], ops=("Mean",))
_add("gap_4x7x7x20", (4, 7, 7, 20), [1, 2])
_add("gap_keep", (3, 5, 5, 16), [1, 2], keep=True)
_add("moments_nhwc", (8, 5, 5, 16), [0, 1, 2], keep=True)
_add("moments_small", (4, 6, 6, 3), [0, 1, 2])
# Reduce runs 0 and 2 of 3 (GenericDimReducer: last reduced dim outermost)
for _s in ((3, 4, 5), (6, 7, 9), (20, 3, 30)):
    _add(f"zero_two_{'x'.join(map(str, _s))}", _s, [0, 2])
_add("zero_two_size1", (2, 1, 3, 1, 4), [0, 3, 4])
# Four or more runs: transposed to [kept, reduced], then inner reductions
_add("transpose_4d_13", (2, 3, 4, 5), [1, 3])
_add("transpose_4d_02", (2, 3, 4, 5), [0, 2])
_add("transpose_5d", (3, 3, 3, 3, 3), [0, 2, 4])
_add("transpose_5d_keep", (2, 3, 2, 3, 4), [1, 3], keep=True)
# Axis forms: int64, negative, unsorted (a 0-d axis: tests/test_reduction.py; the
# adapters take shape inputs as lists)
_add("axis_int64", (6, 10), [-1], dtype=np.int64)
_add("axis_unsorted", (3, 4, 5), [2, 0])

CASES: list[Case] = _CASES


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
def _x(*shape: int) -> np.ndarray:
    return np.ones(shape, F32)


def _ax(*v: int, dtype: Any = np.int32) -> np.ndarray:
    return np.array(v, dtype)


_RANGE = r"Invalid reduction dimension \({} for input with {} dimension\(s\)"
_DUP = r"Invalid reduction arguments: Axes contains duplicate dimension: {}"
ERROR_CASES: list[ErrorCase] = []
for _op in _OPS:
    ERROR_CASES += [
        ErrorCase(_op, "axis_too_large", lambda: dict(input=_x(2, 3), axis=_ax(2)), IAE,
                  _RANGE.format(2, 2)),
        ErrorCase(_op, "axis_too_negative", lambda: dict(input=_x(2, 3), axis=_ax(-3)), IAE,
                  _RANGE.format(-3, 2)),
        ErrorCase(_op, "axis_on_scalar", lambda: dict(input=_x(), axis=_ax(0)), IAE,
                  _RANGE.format(0, 0)),
        ErrorCase(_op, "duplicate_axis", lambda: dict(input=_x(2, 3), axis=_ax(1, 1)), IAE,
                  _DUP.format(1)),
        ErrorCase(_op, "duplicate_negative_axis",
                  lambda: dict(input=_x(2, 3), axis=_ax(0, -2, dtype=np.int64)), IAE,
                  _DUP.format(0)),
        ErrorCase(_op, "float64_input",
                  lambda: dict(input=np.ones(3, np.float64), axis=_ax(0)), InvalidDtypeError,
                  r"float32", tf_rejects=False,
                  why="TF computes Sum/Mean in float64; tfgrad implements float32 only (the "
                  "QAT training step's type) and refuses the others"),
    ]


# --------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------
def _bench(shape: tuple[int, ...], smoke_shape: tuple[int, ...], axis: list[int]
           ) -> Callable[[np.random.Generator, bool], dict[str, Any]]:
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        s = smoke_shape if smoke else shape
        return dict(input=rng.standard_normal(s).astype(F32), axis=np.array(axis, np.int32),
                    keep_dims=False)
    return make


def _bench_bytes(kw: dict[str, Any]) -> int:
    return array_bytes(kw["input"])


def _bench_torch(mean: bool) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def build(kw: dict[str, Any]) -> Callable[[], Any]:
        torch = torch_module()
        x = torch.from_numpy(kw["input"])
        dims = [int(a) for a in np.asarray(kw["axis"]).reshape(-1)]
        if mean:
            return lambda: torch.mean(x, dims)
        return lambda: torch.sum(x, dims)
    return build


BENCHES = [
    Bench("Mean", "GAP [32,7,7,1280] axes [1,2]", _bench((32, 7, 7, 1280), (2, 7, 7, 16), [1, 2]),
          _bench_bytes, torch=_bench_torch(True)),
    Bench("Sum", "[16,56,56,128] axes [0,1,2]", _bench((16, 56, 56, 128), (2, 8, 8, 16),
                                                      [0, 1, 2]),
          _bench_bytes, torch=_bench_torch(False)),
    Bench("Sum", "[1048576] full", _bench((1 << 20,), (1000,), [0]), _bench_bytes,
          torch=_bench_torch(False)),
    Bench("Mean", "[32] loss", _bench((32,), (32,), [0]), _bench_bytes,
          torch=_bench_torch(True)),
]


# --------------------------------------------------------------------------------------
# Warmup and large inputs
# --------------------------------------------------------------------------------------
def _warm(shape: tuple[int, ...], axis: list[int]) -> Callable[[np.random.Generator],
                                                                dict[str, Any]]:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        return dict(input=rng.standard_normal(shape).astype(F32),
                    axis=np.array(axis, np.int32), keep_dims=False)
    return make


# Every kernel threaded (work >= 2**16): full, inner, outer, middle, zero_two, transpose.
WARMUP: list[Warmup] = [
    Warmup(op, f"{list(s)} axes {a}", _warm(s, a), large=True)
    for op in _OPS
    for s, a in (((200000,), [0]), ((512, 256), [1]), ((512, 256), [0]),
                 ((16, 64, 128), [1]), ((64, 32, 64), [0, 2]), ((8, 16, 8, 128), [1, 3]),
                 ((4096, 1024), [0]))  # (tasks streaming over 2 MB: lane_sums_rows)
]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    """A larger input (tests/test_determinism.py runs it on 1 and 2 threads): a GAP-style
    middle reduction big enough for the threaded kernel."""
    def make() -> dict[str, Any]:
        g = np.random.default_rng(1)
        x = g.standard_normal((16, 7, 7, 640)).astype(F32)
        return dict(input=x, axis=np.array([1, 2], np.int32), keep_dims=False)
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {op: _large(op) for op in _OPS}
