"""Cases for FractionalMaxPool, FractionalAvgPool and their gradients.

Forward cases draw (seed, seed2) from the case's generator (negative and > 32-bit seeds
included) with deterministic=True, so every fixture and live run checks TF's Philox
sequences too. Gradient cases use arbitrary strictly increasing sequences within
[0, input size] (not only the forward's), and MaxGrad's orig_output is the max pooling of
orig_input computed here from the definition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgrad import raw_ops
from tfgrad._opdefs import OPS

from ..harness import Bench, array_bytes
from . import Case, ErrorCase, Warmup

FLOATS = (np.float32, np.float64)
DTYPES = (np.float32, np.float64, np.int32, np.int64)
_I64 = np.int64


def _values(rng: np.random.Generator, shape: tuple[int, ...], dt: Any,
            ties: bool = False) -> np.ndarray:
    if ties:  # few distinct values: many ties in max cells
        return rng.integers(-3, 3, shape).astype(dt)
    if dt in FLOATS:
        return (rng.standard_normal(shape) * 10).astype(dt)
    return rng.integers(-50, 50, shape).astype(dt)


def _seeds(rng: np.random.Generator) -> dict[str, int]:
    kind = int(rng.integers(0, 4))
    if kind == 0:  # 64-bit seeds, either sign
        return {"seed": int(rng.integers(-(2**63), 2**63)),
                "seed2": int(rng.integers(-(2**63), 2**63))}
    if kind == 1:  # small seeds
        return {"seed": int(rng.integers(1, 1000)), "seed2": int(rng.integers(0, 1000))}
    if kind == 2:  # seed 0 with seed2 set still counts as a fixed pair
        return {"seed": 0, "seed2": int(rng.integers(1, 2**40))}
    return {"seed": int(rng.integers(1, 2**40)), "seed2": 0}


def _fwd(op: str, name: str, dt: Any, overlapping: bool, pseudo: bool,
         shape: tuple[int, int, int, int] = (2, 9, 11, 3),
         ratio: tuple[float, float] | None = None, fill: str = "") -> Case:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        x = _values(rng, shape, dt, ties=(fill == "ties"))
        if fill == "special":  # NaN / inf / -inf (max: NaN never wins, init is lowest)
            u = rng.random(shape)
            x[u < 0.15] = np.nan
            x[(u >= 0.15) & (u < 0.3)] = -np.inf
            x[(u >= 0.3) & (u < 0.35)] = np.inf
            x[0, :2, :2, 0] = -np.inf  # an all -inf cell
            x[0, :2, :2, 1 % shape[3]] = np.nan  # an all-NaN cell
        if fill == "big" and dt not in FLOATS:  # integer sums wrap
            info = np.iinfo(dt)
            x = rng.integers(info.max // 2, info.max, shape, dtype=dt)
        rh, rw = ratio if ratio else (float(rng.uniform(1, 2.5)), float(rng.uniform(1, 2.5)))
        return dict(value=x, pooling_ratio=[1.0, rh, rw, 1.0], pseudo_random=pseudo,
                    overlapping=overlapping, deterministic=True, **_seeds(rng))

    return Case(op, name, make)


def _seq(rng: np.random.Generator, n: int, m: int, free: bool) -> np.ndarray:
    """m+1 strictly increasing values in [0, n]; unless ``free``, from 0 to n as the
    forward op returns them."""
    if free:
        return np.sort(rng.choice(n + 1, m + 1, replace=False)).astype(_I64)
    inner = np.sort(rng.choice(np.arange(1, n), m - 1, replace=False))
    return np.concatenate([[0], inner, [n]]).astype(_I64)


def _cells(seq: np.ndarray, n: int, ov: bool) -> list[tuple[int, int]]:
    return [(int(seq[i]), min(int(seq[i + 1]) - (0 if ov else 1), n - 1))
            for i in range(len(seq) - 1)]


def _max_pool(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, ov: bool) -> np.ndarray:
    """Max pooling by the definition: start at the lowest value, NaN never wins."""
    n, h, w, c = x.shape
    low = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    rc, cc = _cells(rows, h, ov), _cells(cols, w, ov)
    out = np.full((n, len(rc), len(cc), c), low, x.dtype)
    for i, (r0, r1) in enumerate(rc):
        for j, (c0, c1) in enumerate(cc):
            for hh in range(r0, r1 + 1):
                for ww in range(c0, c1 + 1):
                    v = x[:, hh, ww, :]
                    out[:, i, j, :] = np.where(out[:, i, j, :] < v, v, out[:, i, j, :])
    return out


def _grad_shape(rng: np.random.Generator, shape: tuple[int, int, int, int]):
    n, h, w, c = shape
    m_r = int(rng.integers(1, h + 1)) if h > 1 else 1
    m_c = int(rng.integers(1, w + 1)) if w > 1 else 1
    return m_r, m_c


def _max_grad(name: str, dt: Any, ov: bool, shape=(2, 8, 9, 3), free: bool = False,
              ties: bool = False) -> Case:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        x = _values(rng, shape, dt, ties=ties)
        m_r, m_c = _grad_shape(rng, shape)
        rows = _seq(rng, shape[1], m_r, free)
        cols = _seq(rng, shape[2], m_c, free)
        y = _max_pool(x, rows, cols, ov)
        g = _values(rng, y.shape, dt)
        return dict(orig_input=x, orig_output=y, out_backprop=g, row_pooling_sequence=rows,
                    col_pooling_sequence=cols, overlapping=ov)

    return Case("FractionalMaxPoolGrad", name, make)


def _avg_grad(name: str, dt: Any, ov: bool, shape=(2, 8, 9, 3), free: bool = False,
              big: bool = False) -> Case:
    def make(rng: np.random.Generator) -> dict[str, Any]:
        m_r, m_c = _grad_shape(rng, shape)
        rows = _seq(rng, shape[1], m_r, free)
        cols = _seq(rng, shape[2], m_c, free)
        g_shape = (shape[0], m_r, m_c, shape[3])
        g = _values(rng, g_shape, dt)
        if big:  # sums of shares beyond T's range: TF's cast gives T's minimum
            info = np.iinfo(dt)
            g = rng.integers(info.max // 2, info.max, g_shape, dtype=dt)
            g[..., 0] = info.min
        return dict(orig_input_tensor_shape=np.array(shape, _I64), out_backprop=g,
                    row_pooling_sequence=rows, col_pooling_sequence=cols, overlapping=ov)

    return Case("FractionalAvgPoolGrad", name, make)


def _extra_values(rng: np.random.Generator, seq: np.ndarray, n: int, ov: bool,
                  empty: bool) -> np.ndarray:
    """1-4 values to append to ``seq``. Any int64 values where they are never read
    (AvgGrad); for MaxGrad (``empty``) values whose cells TF leaves empty: each start past
    its clamped end (its successor at most start - overlapping, or a start >= n)."""
    k = int(rng.integers(1, 5))
    if not empty:
        pool = np.array([-(2**63), -1, 0, n, n + 7, 2**62], _I64)
        return np.concatenate([rng.choice(pool, k), rng.integers(-50, 50, k)])[
            rng.permutation(2 * k)[:k]].astype(_I64)
    out, last = [], int(seq[-1])
    for i in range(k):
        if last >= n and rng.random() < 0.5:  # the cell starts past the input: anything
            big = [-(2**63), 2**62] if i == k - 1 else [2**62]  # (no cell starts at -2**63)
            v = int(rng.choice([n, n + 3, *big, int(rng.integers(-9, n + 9))]))
        else:  # at most last - overlapping: the cell's end comes before its start
            v = last - int(ov) - int(rng.integers(0, 4))
        out.append(v)
        last = v
    return np.array(out, _I64)


def _long(case_fn, name: str, dt: Any, ov: bool, **kw: Any) -> Case:
    """A gradient case whose sequences (one or both) have more values than its cells."""
    inner = case_fn(name, dt, ov, **kw)

    def make(rng: np.random.Generator) -> dict[str, Any]:
        args = inner.make(rng)
        n_r, n_c = (args["orig_input"].shape[1:3] if "orig_input" in args
                    else args["orig_input_tensor_shape"][1:3])
        which = int(rng.integers(0, 3))  # rows, columns or both
        for i, (key, n) in enumerate((("row_pooling_sequence", int(n_r)),
                                      ("col_pooling_sequence", int(n_c)))):
            if which in (i, 2):
                seq = args[key]
                extra = _extra_values(rng, seq, n, ov, empty="orig_input" in args)
                args[key] = np.concatenate([seq, extra]).astype(_I64)
        return args

    return Case(inner.op, name, make)


def _dt_name(dt: Any) -> str:
    return np.dtype(dt).name


CASES: list[Case] = []
for _op in ("FractionalMaxPool", "FractionalAvgPool"):
    for _dt in DTYPES:
        for _ov in (False, True):
            for _ps in (False, True):
                CASES.append(_fwd(_op, f"{_dt_name(_dt)}_ov{int(_ov)}_ps{int(_ps)}", _dt, _ov,
                                  _ps))
    CASES += [
        _fwd(_op, "ratio_exact_2", np.float32, False, False, (1, 8, 8, 2), (2.0, 2.0)),
        _fwd(_op, "ratio_1_identity", np.float32, True, True, (1, 5, 6, 2), (1.0, 1.0)),
        _fwd(_op, "ratio_float32_10_over_3", np.float32, False, True, (1, 10, 10, 2),
             (10 / 3, 1.1)),
        _fwd(_op, "ratio_large", np.float64, True, False, (1, 13, 7, 2), (4.3, 3.5)),
        _fwd(_op, "ratio_equal_dim", np.float32, False, True, (1, 5, 7, 1), (5.0, 7.0)),
        _fwd(_op, "special_values", np.float32, False, False, (1, 8, 8, 10), fill="special"),
        _fwd(_op, "special_values_ov", np.float64, True, True, (1, 8, 8, 9), fill="special"),
        _fwd(_op, "wide_channels", np.float32, True, False, (1, 7, 7, 37)),
        _fwd(_op, "int32_wrap", np.int32, True, False, (1, 6, 6, 3), fill="big"),
        _fwd(_op, "int64_wrap", np.int64, False, True, (1, 6, 6, 3), fill="big"),
        _fwd(_op, "one_row", np.float32, False, False, (2, 1, 12, 2), (1.0, 1.7)),
    ]
for _dt in DTYPES:
    for _ov in (False, True):
        CASES.append(_max_grad(f"{_dt_name(_dt)}_ov{int(_ov)}", _dt, _ov))
        CASES.append(_avg_grad(f"{_dt_name(_dt)}_ov{int(_ov)}", _dt, _ov))
CASES += [
    _max_grad("ties_ov0", np.float32, False, ties=True),
    _max_grad("ties_ov1", np.float32, True, ties=True),
    _max_grad("ties_int32_ov1", np.int32, True, ties=True),
    _max_grad("free_sequences_ov0", np.float32, False, free=True),
    _max_grad("free_sequences_ov1", np.float64, True, free=True),
    _max_grad("wide_channels_ov1", np.float32, True, shape=(2, 6, 5, 70), ties=True),
    _avg_grad("free_sequences_ov0", np.float32, False, free=True),
    _avg_grad("free_sequences_ov1", np.float64, True, free=True),
    _avg_grad("free_sequences_int32_ov1", np.int32, True, free=True),
    _avg_grad("int32_out_of_range_ov1", np.int32, True, shape=(1, 5, 5, 2), big=True),
    _avg_grad("int64_out_of_range_ov1", np.int64, True, shape=(1, 5, 5, 2), big=True),
    _avg_grad("wide_channels_ov1", np.float32, True, shape=(1, 6, 5, 70)),
    # Sequences longer than the cells need: AvgGrad ignores the extra values, MaxGrad
    # accepts extra cells that TF leaves empty (tfgrad.ops.fractional_pool).
    _long(_avg_grad, "long_sequences_ov0", np.float32, False, free=True),
    _long(_avg_grad, "long_sequences_ov1", np.float64, True),
    _long(_avg_grad, "long_sequences_int32_ov1", np.int32, True, free=True),
    _long(_max_grad, "long_sequences_ov0", np.float32, False, free=True),
    _long(_max_grad, "long_sequences_ov1", np.float64, True),
    _long(_max_grad, "long_sequences_int64_ov0", np.int64, False, ties=True),
]


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
_F = np.float32
_NOT_TF = "TF 2.21 accepts this call"
_NOT_HALF = "Value for attr 'T' of half is not in the list of allowed values: float, double"


def _fp(op: str, **over: Any):
    def kwargs() -> dict[str, Any]:
        kw: dict[str, Any] = dict(value=np.ones((1, 5, 7, 2), _F),
                                  pooling_ratio=[1.0, 1.44, 1.73, 1.0], deterministic=True,
                                  seed=1, seed2=2)
        kw.update(over)
        return kw

    return kwargs


def _apg(**over: Any):
    def kwargs() -> dict[str, Any]:
        kw: dict[str, Any] = dict(orig_input_tensor_shape=np.array([1, 3, 3, 1], _I64),
                                  out_backprop=np.ones((1, 2, 2, 1), _F),
                                  row_pooling_sequence=np.array([0, 1, 3], _I64),
                                  col_pooling_sequence=np.array([0, 2, 3], _I64),
                                  overlapping=False)
        kw.update(over)
        return kw

    return kwargs


_XT = np.array([[5, 5, 1], [5, 2, 5], [0, 5, 5]], _F).reshape(1, 3, 3, 1)


def _mpg(**over: Any):
    def kwargs() -> dict[str, Any]:
        kw: dict[str, Any] = dict(orig_input=_XT.copy(),
                                  orig_output=np.full((1, 1, 1, 1), 5, _F),
                                  out_backprop=np.ones((1, 1, 1, 1), _F),
                                  row_pooling_sequence=np.array([0, 3], _I64),
                                  col_pooling_sequence=np.array([0, 3], _I64),
                                  overlapping=False)
        kw.update(over)
        return kw

    return kwargs




def _errors() -> list[ErrorCase]:
    from tfgrad.errors import InvalidArgumentError as E
    from tfgrad.errors import InvalidDtypeError, ResourceLimitError, UnimplementedError

    out: list[ErrorCase] = []
    for op in ("FractionalMaxPool", "FractionalAvgPool"):
        kind = "max" if op == "FractionalMaxPool" else "average"
        out += [
            ErrorCase(op, "rank3", _fp(op, value=np.ones((5, 7, 2), _F)), E,
                      "tensor_in must be 4-dimensional"),
            ErrorCase(op, "ratio_len3", _fp(op, pooling_ratio=[1.0, 1.5, 1.5]), E,
                      "Length for attr 'pooling_ratio' of 3 must be at least minimum 4"),
            ErrorCase(op, "ratio_len5", _fp(op, pooling_ratio=[1.0, 1.5, 1.5, 1.0, 1.0]), E,
                      "must specify 4 dimensions"),
            ErrorCase(op, "ratio_below_1", _fp(op, pooling_ratio=[1.0, 0.5, 1.5, 1.0]), E,
                      "cannot be smaller than 1, got: 0.5"),
            ErrorCase(op, "ratio_nan", _fp(op, pooling_ratio=[1.0, float("nan"), 1.5, 1.0]),
                      E, "cannot be smaller than 1, got: nan"),
            ErrorCase(op, "ratio_inf", _fp(op, pooling_ratio=[1.0, 1.5, float("inf"), 1.0]),
                      E, "higher than input dimension size for dimension 2. Input dim size: 7 "
                      "pooling ratio: inf"),
            ErrorCase(op, "ratio_batch", _fp(op, value=np.ones((4, 5, 7, 1), _F),
                                             pooling_ratio=[2.0, 1.5, 1.5, 1.0]),
                      UnimplementedError,
                      f"Fractional {kind} pooling is not yet supported on the batch nor "
                      "channel"),
            ErrorCase(op, "ratio_channel", _fp(op, value=np.ones((1, 5, 7, 4), _F),
                                               pooling_ratio=[1.0, 1.5, 1.5, 2.0]),
                      UnimplementedError,
                      "not yet supported on the batch nor channel"),
            ErrorCase(op, "nondeterministic_seed", _fp(op, deterministic=False, seed2=0), E,
                      "Both seed and seed2 should be 0 if deterministic is false"),
            ErrorCase(op, "nondeterministic_seed2", _fp(op, deterministic=False, seed=0), E,
                      "Both seed and seed2 should be 0 if deterministic is false"),
            ErrorCase(op, "ratio_above_dim", _fp(op, pooling_ratio=[1.0, 6.0, 1.5, 1.0]), E,
                      "higher than input dimension size for dimension 1. Input dim size: 5 "
                      "pooling ratio: 6"),
            ErrorCase(op, "empty_batch", _fp(op, value=np.ones((0, 5, 7, 1), _F)), E,
                      "for dimension 0"),
            ErrorCase(op, "zero_channels", _fp(op, value=np.ones((1, 5, 7, 0), _F)), E,
                      "for dimension 3"),
            ErrorCase(op, "float16", _fp(op, value=np.ones((1, 5, 7, 1), np.float16)),
                      InvalidDtypeError, _NOT_HALF),
        ]

    op = "FractionalAvgPoolGrad"
    seq = "row_pooling_sequence"
    out += [
        ErrorCase(op, "shape_len3", _apg(orig_input_tensor_shape=np.array([1, 3, 3], _I64)),
                  E, "original input tensor shape must be1-dimensional and 4 elements"),
        ErrorCase(op, "shape_rank2",
                  _apg(orig_input_tensor_shape=np.array([[1, 3], [3, 1]], _I64)), E,
                  "original input tensor shape must be1-dimensional and 4 elements"),
        ErrorCase(op, "out_backprop_rank3", _apg(out_backprop=np.ones((1, 2, 2), _F)), E,
                  "out_backprop must be 4-dimensional"),
        ErrorCase(op, "out_backprop_empty", _apg(out_backprop=np.ones((0, 2, 2, 1), _F)), E,
                  "out_backprop must be positive for all dimension, got:0"),
        ErrorCase(op, "batch_0", _apg(orig_input_tensor_shape=np.array([0, 3, 3, 1], _I64)),
                  E, "Batch dimension of input must not be 0"),
        ErrorCase(op, "rows_0", _apg(orig_input_tensor_shape=np.array([1, 0, 3, 1], _I64)),
                  E, "Rows dimension of input must not be 0"),
        ErrorCase(op, "cols_0", _apg(orig_input_tensor_shape=np.array([1, 3, 0, 1], _I64)),
                  E, "Columns dimension of input must not be 0"),
        ErrorCase(op, "depth_0", _apg(orig_input_tensor_shape=np.array([1, 3, 3, 0], _I64)),
                  E, "Depth dimension of input must not be 0"),
        ErrorCase(op, "negative_dim",
                  _apg(orig_input_tensor_shape=np.array([1, -3, 3, 1], _I64)), E,
                  "Expected a non-negative size, got -3"),
        ErrorCase(op, "shape_overflow",
                  _apg(orig_input_tensor_shape=np.array([2**40, 2**40, 2**40, 1], _I64)), E,
                  "Encountered overflow when multiplying 1099511627776 with 1099511627776"),
        # TF tries to allocate a float64 temp of 2**65 bytes; tfgrad refuses its output
        ErrorCase(op, "shape_too_big",
                  _apg(orig_input_tensor_shape=np.array([1, 2**31, 2**31, 1], _I64)),
                  ResourceLimitError,
                  r"OOM when allocating tensor with shape\[1,2147483648,2147483648,1\] and "
                  "type"),
        ErrorCase(op, "row_seq_short", _apg(row_pooling_sequence=np.array([0, 3], _I64)), E,
                  r"Given out_backprop shape \[1,2,2,1\], row_seq_tensor must have at least 3 "
                  "elements, but got 2"),
        ErrorCase(op, "col_seq_short", _apg(col_pooling_sequence=np.array([0, 3], _I64)), E,
                  "col_seq_tensor must have at least 3 elements, but got 2"),
        ErrorCase(op, "row_seq_negative",
                  _apg(row_pooling_sequence=np.array([-1, 1, 3], _I64)), E,
                  "Row sequence tensor values must not be negative, got -1  1  3"),
        ErrorCase(op, "col_seq_negative",
                  _apg(col_pooling_sequence=np.array([0, -2, 3], _I64)), E,
                  "Column sequence tensor values must not be negative, got  0 -2  3"),
        # extra values are never read (so never checked), the first 3 are
        ErrorCase(op, "row_seq_long_negative",
                  _apg(row_pooling_sequence=np.array([0, -1, 3, 3], _I64)), E,
                  "Row sequence tensor values must not be negative, got  0 -1  3  3"),
        ErrorCase(op, "row_seq_beyond_input",
                  _apg(row_pooling_sequence=np.array([0, 1, 5], _I64)), E,
                  f"{seq} values must lie in", tf_rejects=False,
                  why=f"{_NOT_TF} and clamps cell ends to the input; such a sequence never "
                      "comes from the forward op"),
        ErrorCase(op, "row_seq_decreasing",
                  _apg(row_pooling_sequence=np.array([2, 1, 3], _I64)), E,
                  f"{seq} must be strictly increasing", tf_rejects=False,
                  why=f"{_NOT_TF} and silently drops the gradient of the empty cell"),
        # with overlapping=False cell 0 ends at -1: TF's sign check
        ErrorCase(op, "col_seq_repeated",
                  _apg(col_pooling_sequence=np.array([0, 0, 3], _I64)), E,
                  "Column sequence tensor values must not be negative, got 0 0 3"),
        ErrorCase(op, "col_seq_repeated_ov1",
                  _apg(col_pooling_sequence=np.array([0, 0, 3], _I64), overlapping=True), E,
                  "col_pooling_sequence must be strictly increasing", tf_rejects=False,
                  why=f"{_NOT_TF}; with overlapping=True cell 0 is [0, 0], a cell the forward "
                      "op never makes"),
        ErrorCase(op, "row_seq_rank2",
                  _apg(row_pooling_sequence=np.array([[0, 1, 3]], _I64)), E,
                  f"{seq} must be a vector", tf_rejects=False,
                  why=f"{_NOT_TF} (it flattens the tensor); FractionalMaxPoolGrad rejects it"),
        ErrorCase(op, "batch_mismatch",
                  _apg(orig_input_tensor_shape=np.array([2, 3, 3, 1], _I64)), E,
                  "must have the batch and depth", tf_rejects=False,
                  why=f"{_NOT_TF} and leaves the other batch entries zero; a larger "
                      "out_backprop batch writes past TF's buffer (heap corruption: "
                      "tests/test_fractional_pool.py shows TF 2.21 dying of it)"),
        ErrorCase(op, "depth_mismatch",
                  _apg(out_backprop=np.ones((1, 2, 2, 2), _F)), E,
                  "must have the batch and depth", tf_rejects=False,
                  why="TF does not check depth: a deeper out_backprop writes past its "
                      "float64 buffer (heap corruption: tests/test_fractional_pool.py shows "
                      "TF 2.21 dying of it)"),
        ErrorCase(op, "float16", _apg(out_backprop=np.ones((1, 2, 2, 1), np.float16)),
                  InvalidDtypeError, _NOT_HALF),
    ]

    op = "FractionalMaxPoolGrad"
    low = np.finfo(_F).min
    out += [
        ErrorCase(op, "orig_input_rank3", _mpg(orig_input=_XT[0].copy()), E,
                  "orig_input should be a tensor of rank 4"),
        ErrorCase(op, "orig_input_empty", _mpg(orig_input=np.zeros((0, 3, 3, 1), _F),
                                               orig_output=np.zeros((0, 1, 1, 1), _F),
                                               out_backprop=np.zeros((0, 1, 1, 1), _F)), E,
                  "orig_input must not be empty"),
        ErrorCase(op, "orig_output_rank3", _mpg(orig_output=np.full((1, 1, 1), 5, _F)), E,
                  "orig_output should be a tensor of rank 4"),
        ErrorCase(op, "orig_output_empty", _mpg(orig_output=np.zeros((1, 0, 1, 1), _F)), E,
                  "orig_output must not be empty"),
        ErrorCase(op, "seq_rank2", _mpg(row_pooling_sequence=np.array([[0, 3]], _I64)), E,
                  "row_pooling_sequence must be a vector"),
        ErrorCase(op, "seq_more_than_input",
                  _mpg(row_pooling_sequence=np.arange(4, dtype=_I64),
                       col_pooling_sequence=np.arange(4, dtype=_I64)), E,
                  "Pooling region has more elements than the input tensor"),
        ErrorCase(op, "orig_output_inconsistent",
                  _mpg(orig_output=np.full((1, 1, 1, 1), 4, _F)), E,
                  "tensor_out_dup is not the same as tensor_out"),
        ErrorCase(op, "nan_first_in_cell",
                  _mpg(orig_input=np.array([np.nan, 1, 3, 2], _F).reshape(1, 2, 2, 1),
                       orig_output=np.full((1, 1, 1, 1), 3, _F),
                       row_pooling_sequence=np.array([0, 2], _I64),
                       col_pooling_sequence=np.array([0, 2], _I64)), E,
                  "tensor_out_dup is not the same as tensor_out"),
        ErrorCase(op, "all_minus_inf_cell",
                  _mpg(orig_input=np.full((1, 2, 2, 1), -np.inf, _F),
                       orig_output=np.full((1, 1, 1, 1), low, _F),
                       row_pooling_sequence=np.array([0, 2], _I64),
                       col_pooling_sequence=np.array([0, 2], _I64)), E,
                  "tensor_out_dup is not the same as tensor_out"),
        # TF checks neither the length nor the order: the cells it does not walk, or
        # walks empty, keep its initial values, which fail its later checks
        ErrorCase(op, "row_seq_short",
                  _mpg(orig_output=np.full((1, 2, 1, 1), 5, _F),
                       out_backprop=np.ones((1, 2, 1, 1), _F)), E,
                  r"Given orig_output shape \[1,2,1,1\], row_pooling_sequence must have at "
                  "least 3 elements, but got 2", tf_match=_DUP,
                  why="TF does not check the length: the cell it does not walk fails its "
                      "tensor_out_dup check"),
        ErrorCase(op, "row_seq_decreasing",
                  _mpg(orig_output=np.array([low, 5], _F).reshape(1, 2, 1, 1),
                       out_backprop=np.ones((1, 2, 1, 1), _F),
                       row_pooling_sequence=np.array([2, 1, 3], _I64)), E,
                  "row_pooling_sequence must be strictly increasing",
                  tf_match="Invalid input backprop index: -1",
                  why="TF does not check the order: the empty cell keeps its invalid argmax"),
        ErrorCase(op, "row_seq_long",
                  _mpg(row_pooling_sequence=np.array([0, 1, 3], _I64)), E,
                  "row_pooling_sequence has 3 values for the 1 pooling cells of orig_output; "
                  "its extra cells must be empty", tf_rejects=False,
                  why="TF pools every cell of the sequence, writing the extra ones past its "
                      "orig_output-sized buffers (tests/test_fractional_pool.py)"),
        ErrorCase(op, "col_seq_long",  # extra cell 1 is empty, cell 2 is not
                  _mpg(col_pooling_sequence=np.array([0, 3, 1, 3], _I64)), E,
                  r"col_pooling_sequence has 4 values for the 1 pooling cells of orig_output; "
                  r"its extra cells must be empty .* but cell 2 spans \[1, 2\]",
                  tf_rejects=False,
                  why="TF pools the extra cell [1, 2] too, writing past its "
                      "orig_output-sized buffers"),
        ErrorCase(op, "row_seq_negative",
                  _mpg(row_pooling_sequence=np.array([-1, 3], _I64)), E,
                  "row_pooling_sequence values must lie in", tf_rejects=False,
                  why="TF does not check: it reads before orig_input (a value of -2**63 "
                      "segfaults it: tests/test_fractional_pool.py)"),
        ErrorCase(op, "col_seq_beyond_input",
                  _mpg(col_pooling_sequence=np.array([0, 9], _I64)), E,
                  "col_pooling_sequence values must lie in", tf_rejects=False,
                  why=f"{_NOT_TF} and clamps the cell to the input"),
        ErrorCase(op, "out_backprop_larger",
                  _mpg(out_backprop=np.ones((1, 2, 2, 1), _F)), E,
                  "out_backprop must have the shape of orig_output", tf_rejects=False,
                  why="TF reads past its argmax buffer (uninitialised memory: garbage, or "
                      "'Invalid input backprop index' with a garbage index)"),
        ErrorCase(op, "out_backprop_smaller",
                  _mpg(orig_output=np.full((1, 1, 2, 1), 5, _F),
                       col_pooling_sequence=np.array([0, 1, 3], _I64),
                       out_backprop=np.ones((1, 1, 1, 1), _F)), E,
                  "out_backprop must have the shape of orig_output", tf_rejects=False,
                  why=f"{_NOT_TF} and uses only the first out_backprop elements"),
        ErrorCase(op, "depth_mismatch",
                  _mpg(orig_input=np.ones((1, 3, 3, 2), _F)), E,
                  "must have the batch and depth", tf_rejects=False,
                  why="TF replays orig_input's depth into an orig_output-sized buffer, "
                      "writing past its end (here it then fails its tensor_out_dup check)"),
        ErrorCase(op, "batch_mismatch",
                  _mpg(orig_input=np.ones((2, 3, 3, 1), _F)), E,
                  "must have the batch and depth", tf_rejects=False,
                  why="TF replays orig_input's batch into an orig_output-sized buffer, "
                      "writing past its end (here it then fails its tensor_out_dup check)"),
        ErrorCase(op, "dtype_mismatch", _mpg(out_backprop=np.ones((1, 1, 1, 1), np.float64)),
                  TypeError, "dtype", tf_rejects=False,
                  why="TF's eager binding converts a float64 NumPy out_backprop to float32; "
                      "tfgrad's binder requires the inputs of one type attr to share a dtype"),
    ]
    return out


_DUP = "tensor_out_dup is not the same as tensor_out"
ERROR_CASES: list[ErrorCase] = _errors()


# --------------------------------------------------------------------------------------
# Benchmarks (tfgrad bench, benchmarks/run.py)
# --------------------------------------------------------------------------------------
# Benchmarks: fractional max/avg pooling and gradients on [16,56,56,128] float32,
# pooling_ratio [1, 1.44, 1.73, 1], overlapping off and on (seeds fixed: deterministic=True).
#
# PyTorch: ``fractional_max_pool2d`` draws its own (pseudo-random) cells from ``_random_samples``,
# so it is not the same op; it is timed on the same shapes (channels_last, same output size)
# as an approximate comparison only, forward and backward of max pooling. Torch has no
# fractional average pooling.
BENCH_SHAPE = (16, 56, 56, 128)
BENCH_SMOKE = (2, 12, 12, 8)
BENCH_RATIO = [1.0, 1.44, 1.73, 1.0]
BENCH_SEEDS = dict(deterministic=True, seed=1, seed2=2)


def _bench_x(rng: np.random.Generator, smoke: bool) -> np.ndarray:
    return rng.standard_normal(BENCH_SMOKE if smoke else BENCH_SHAPE).astype(np.float32)


def _bench_fwd_make(ov: bool):
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        return dict(value=_bench_x(rng, smoke), pooling_ratio=BENCH_RATIO, overlapping=ov,
                    **BENCH_SEEDS)

    return make


def _bench_fwd_bytes(kw: dict[str, Any]) -> int:
    x = kw["value"]
    n, h, w, c = x.shape
    out = n * int(h / 1.44) * int(w / 1.73) * c * x.itemsize
    return x.nbytes + out


def _bench_grad_inputs(rng: np.random.Generator, smoke: bool, ov: bool):
    import tfgrad

    x = _bench_x(rng, smoke)
    y, rows, cols = tfgrad.raw_ops.FractionalMaxPool(value=x, pooling_ratio=BENCH_RATIO,
                                                     overlapping=ov, **BENCH_SEEDS)
    g = rng.standard_normal(y.shape).astype(np.float32)
    return x, y, g, rows, cols


def _bench_max_grad_make(ov: bool):
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        x, y, g, rows, cols = _bench_grad_inputs(rng, smoke, ov)
        return dict(orig_input=x, orig_output=y, out_backprop=g, row_pooling_sequence=rows,
                    col_pooling_sequence=cols, overlapping=ov)

    return make


def _bench_avg_grad_make(ov: bool):
    def make(rng: np.random.Generator, smoke: bool) -> dict[str, Any]:
        x, _, g, rows, cols = _bench_grad_inputs(rng, smoke, ov)
        return dict(orig_input_tensor_shape=np.array(x.shape, np.int64), out_backprop=g,
                    row_pooling_sequence=rows, col_pooling_sequence=cols, overlapping=ov)

    return make


def _bench_max_grad_bytes(kw: dict[str, Any]) -> int:
    return array_bytes(kw["orig_input"], kw["orig_output"], kw["out_backprop"],
                       kw["orig_input"])  # inputs read + output written


def _bench_avg_grad_bytes(kw: dict[str, Any]) -> int:
    shape = tuple(int(d) for d in kw["orig_input_tensor_shape"])
    return array_bytes(kw["out_backprop"]) + int(np.prod(shape)) * 4


def _bench_torch_max_fwd(kw: dict[str, Any]):
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(kw["value"]).permute(0, 3, 1, 2)  # NHWC memory, channels_last
    n, c, h, w = x.shape
    size = (int(np.float32(h) / np.float32(1.44)), int(np.float32(w) / np.float32(1.73)))
    samples = torch.rand(n, c, 2)
    return lambda: F.fractional_max_pool2d(x, 2, output_size=size, _random_samples=samples)


def _bench_torch_max_bwd(kw: dict[str, Any]):
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(kw["orig_input"]).permute(0, 3, 1, 2).requires_grad_(False)
    n, c, h, w = x.shape
    g = torch.from_numpy(kw["out_backprop"]).permute(0, 3, 1, 2)
    size = tuple(g.shape[2:])
    samples = torch.rand(n, c, 2)
    _, idx = F.fractional_max_pool2d(x, 2, output_size=size, _random_samples=samples,
                                     return_indices=True)

    def run():  # the backward kernel alone: scatter g through the indices
        return torch.ops.aten.fractional_max_pool2d_backward(g, x, (2, 2), size, idx)

    return run


BENCHES: list[Bench] = []
for _ov in (False, True):
    _tag = f"[16,56,56,128] f32 r[1,1.44,1.73,1] ov={int(_ov)}"
    BENCHES += [
        Bench("FractionalMaxPool", _tag, _bench_fwd_make(_ov), _bench_fwd_bytes,
              torch=_bench_torch_max_fwd),
        Bench("FractionalAvgPool", _tag, _bench_fwd_make(_ov), _bench_fwd_bytes),
        Bench("FractionalMaxPoolGrad", _tag, _bench_max_grad_make(_ov), _bench_max_grad_bytes,
              torch=_bench_torch_max_bwd),
        Bench("FractionalAvgPoolGrad", _tag, _bench_avg_grad_make(_ov), _bench_avg_grad_bytes),
    ]


# --------------------------------------------------------------------------------------
# Warmup (tfgrad warmup runs these besides every case and benchmark)
# --------------------------------------------------------------------------------------
# Every op, dtype, overlapping and pseudo_random, tiny and large (threaded kernels).
_WARM_SHAPES = {False: (2, 7, 6, 3), True: (4, 64, 64, 8)}
WARMUP: list[Warmup] = []
for _large, _shape in _WARM_SHAPES.items():
    for _dt in DTYPES:
        for _ov in (False, True):
            _name = f"{_dt_name(_dt)}_{list(_shape)}_ov{int(_ov)}"
            _built = [_fwd(op, f"{_name}_ps{int(ps)}", _dt, _ov, ps, _shape, (1.44, 1.73))
                      for op in ("FractionalMaxPool", "FractionalAvgPool") for ps in (False, True)]
            _built += [_max_grad(_name, _dt, _ov, _shape), _avg_grad(_name, _dt, _ov, _shape)]
            WARMUP += [Warmup(c.op, c.name, c.make, _large) for c in _built]


def _large(op: str) -> Callable[[], dict[str, Any]]:
    """A larger input for ``op``: big enough for the kernels' threads and reductions to
    split work (tests/test_determinism.py runs it on 1 and 2 threads)."""
    def make() -> dict[str, Any]:
        g = np.random.default_rng(4)
        x = g.standard_normal((6, 61, 53, 8)).astype(np.float64)
        fwd = {"value": x, "pooling_ratio": [1.0, 1.7, 1.4, 1.0], "overlapping": True,
               "deterministic": True, "seed": 7, "seed2": 11}
        if op in ("FractionalAvgPool", "FractionalMaxPool"):
            return fwd
        if op == "FractionalAvgPoolGrad":
            out, rows, cols = raw_ops.FractionalAvgPool(**fwd)
            return {"orig_input_tensor_shape": np.array(x.shape, np.int64),
                    "out_backprop": g.standard_normal(out.shape).astype(np.float64),
                    "row_pooling_sequence": rows, "col_pooling_sequence": cols,
                    "overlapping": True}
        out, rows, cols = raw_ops.FractionalMaxPool(**fwd)
        return {"orig_input": x, "orig_output": out,
                "out_backprop": g.standard_normal(out.shape).astype(np.float64),
                "row_pooling_sequence": rows, "col_pooling_sequence": cols,
                "overlapping": True}
    return make


LARGE: dict[str, Callable[[], dict[str, Any]]] = {
    name: _large(name) for name, op in OPS.items() if op.family == "fractional_pool"}
