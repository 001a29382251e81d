"""FractionalMaxPool, FractionalAvgPool and their gradients, as TF 2.21's CPU kernels.

Bit-identical to TF, the pooling sequences drawn from the same seeds included (TF's
Philox4x32-10 streams). This module holds the sequences, the ops' checks (stricter than
TF's where TF reads or writes out of bounds) and the NumPy reference (the spec); the fused
kernels are in ``tfgrad.kernels.fractional_pool``, run by ``tfgrad.dispatch.
fractional_pool``. The TF behaviours reproduced, the differences from TF and the tests that
pin them: docs/fractional_pool.md.

The adapters' implementations (``tfgrad.torch``, ``tfgrad.jax``) share the seeds, the
cells and the checks of the sequences with these ops: ``seeds``, ``cell_bounds``,
``check_gradient_sequences`` and ``max_grad_mismatch``.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError, UnimplementedError
from .._tf.fpenv import flush_denormals, flushed
from .._validate import check_alloc, shape_str

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1


# --------------------------------------------------------------------------------------
# Philox4x32-10 and TF's pooling sequences
# --------------------------------------------------------------------------------------
def _philox_blocks(counter: int, key: tuple[int, int], n: int) -> np.ndarray:
    """The ``n`` 128-bit Philox4x32-10 outputs for counters ``counter .. counter+n-1``
    (a 128-bit integer), as a uint32 array [n, 4] of the lanes in order."""
    ctr = [(counter + i) & ((1 << 128) - 1) for i in range(n)]
    c = [np.array([(v >> (32 * j)) & _M32 for v in ctr], np.uint64) for j in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    m32 = np.uint64(_M32)
    for rnd in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k0) & m32, p1 & m32,
             ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & m32, p0 & m32]
        if rnd < 9:
            k0 = np.uint64((int(k0) + 0x9E3779B9) & _M32)
            k1 = np.uint64((int(k1) + 0xBB67AE85) & _M32)
    return np.stack(c, axis=1).astype(np.uint32)


class _Philox:
    """tsl::random::PhiloxRandom(seed, seed2) as GuardedPhiloxRandom uses it."""

    def __init__(self, seed: int, seed2: int) -> None:
        seed &= _M64
        seed2 &= _M64
        self.key = (seed & _M32, seed >> 32)
        self.counter = seed2 << 64  # lanes (0, 0, seed2 lo, seed2 hi)

    def reserve32(self, n: int) -> np.ndarray:
        """GuardedPhiloxRandom::ReserveSamples32(n): the draws of a copy of the generator
        (whole blocks, lanes in order); the shared counter advances by ceil(n/4)."""
        blocks = (n + 3) // 4
        if _config.use_reference():
            draws = _philox_blocks(self.counter, self.key, blocks).reshape(-1)
        else:
            from ..dispatch.fractional_pool import philox_blocks

            draws = philox_blocks(self.counter, self.key, blocks).reshape(-1)
        self.counter = (self.counter + blocks) & ((1 << 128) - 1)
        return draws


def _pooling_sequence(n: int, m: int, gen: _Philox, pseudo: bool) -> np.ndarray:
    """TF's GeneratePoolingSequence: cumulative cell boundaries [0, ..., n] for n -> m."""
    k = n // m
    if pseudo:
        alpha = n / m
        max_u = min((k + 2) / alpha - 1, (n + 1 - k) / alpha - (m - 1))
        x0, x1 = (int(v) for v in gen.reserve32(2)[:2])
        # random::Uint64ToDouble: 52 mantissa bits from (x0 & 0xfffff, x1), minus 1.
        bits = (1023 << 52) | ((x0 & 0xFFFFF) << 32) | x1
        u = float(np.array(bits, np.uint64).view(np.float64)) - 1.0
        u = u * max_u
        a = [1] + [int(np.ceil(alpha * (i + u))) for i in range(1, m)] + [n + 1]
        diff = np.diff(np.array(a, np.int64))
    else:
        diff = np.full(m, k, np.int64)
        diff[: n % m] += 1
        draws = gen.reserve32(m)
        for i in range(m - 1):  # TF's RandomShuffle with a modulo draw, no rejection
            j = i + int(draws[i]) % (m - i)
            diff[i], diff[j] = diff[j], diff[i]
    seq = np.zeros(m + 1, np.int64)
    np.cumsum(diff, out=seq[1:])
    return seq


def pooling_sequences(shape: tuple[int, ...], ratio: tuple[float, ...], pseudo_random: bool,
                      seed: int, seed2: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column sequences TF draws for an input ``shape`` with the given attrs."""
    out = output_shape(shape, ratio)
    gen = _Philox(seed, seed2)
    rows = _pooling_sequence(shape[1], out[1], gen, pseudo_random)
    cols = _pooling_sequence(shape[2], out[2], gen, pseudo_random)
    return rows, cols


@functools.lru_cache(maxsize=64)
def _cached_sequences(hw: tuple[int, int], ratio: tuple[float, ...], pseudo_random: bool,
                      seed: int, seed2: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    rows, cols = pooling_sequences((1, *hw, 1), ratio, pseudo_random, seed, seed2)
    return tuple(rows.tolist()), tuple(cols.tolist())


def output_shape(shape: tuple[int, ...], ratio: tuple[float, ...]) -> tuple[int, ...]:
    """floor(float32(n) / float32(ratio)) per dim, in float32 as TF computes it."""
    return tuple(int(np.floor(np.float32(n) / np.float32(r))) for n, r in zip(shape, ratio))


_SEED_CACHE: dict[tuple, tuple[int, int]] = {}
_SEED_LOCK = threading.Lock()


def _os_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")


def seeds(op: str, dtype: np.dtype, ratio: tuple[float, ...], pseudo_random: bool,
          overlapping: bool, deterministic: bool, seed: int, seed2: int) -> tuple[int, int]:
    """The (seed, seed2) TF's forward op ``op`` draws its sequences from, for these attrs
    and the input's dtype: fresh OS seeds on every call unless ``deterministic``; the
    given pair unless it is (0, 0); else a pair drawn once per process and attr set."""
    if not deterministic:
        return _os_seed(), _os_seed()  # GuardedPhiloxRandom::Init(0, 0): fresh every call
    if seed != 0 or seed2 != 0:
        return seed, seed2
    # TF draws these when the kernel is built; the eager kernel cache keeps that kernel
    # (and its seeds) per attr set for the life of the process.
    key = (op, np.dtype(dtype).str, ratio, pseudo_random, overlapping)
    with _SEED_LOCK:
        if key not in _SEED_CACHE:
            _SEED_CACHE[key] = (_os_seed(), _os_seed())
        return _SEED_CACHE[key]


# --------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------
def cell_bounds(seq: np.ndarray, m: int, n: int,
                overlapping: bool) -> tuple[np.ndarray, np.ndarray]:
    """Start and clamped end (inclusive) of the first m cells of ``seq`` over length n."""
    starts = seq[:m].astype(np.int64)
    ends = seq[1 : m + 1].astype(np.int64) - (0 if overlapping else 1)
    return starts, np.minimum(ends, n - 1)


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------
def _fmt(v: float) -> str:
    return f"{v:g}"


def _check_forward(op: str, value: np.ndarray, pooling_ratio: tuple[float, ...],
                   deterministic: bool, seed: int, seed2: int) -> None:
    kind = "max" if op == "FractionalMaxPool" else "average"
    if len(pooling_ratio) != 4:
        raise InvalidArgumentError(
            f"{op}: pooling_ratio field must specify 4 dimensions, got {list(pooling_ratio)}")
    for r in pooling_ratio:
        # `not r >= 1` also catches NaN, as TF's check does. (An infinite ratio fails the
        # size check below, as in TF.)
        if not (r >= 1):
            raise InvalidArgumentError(
                f"{op}: pooling_ratio cannot be smaller than 1, got: {_fmt(r)}")
    if not (pooling_ratio[0] == 1 and pooling_ratio[3] == 1):
        raise UnimplementedError(
            f"{op}: Fractional {kind} pooling is not yet supported on the batch nor channel "
            f"dimension. (pooling_ratio[0] and pooling_ratio[3] must be 1.0, got "
            f"{list(pooling_ratio)})")
    if not (deterministic or (seed == 0 and seed2 == 0)):
        raise InvalidArgumentError(
            f"{op}: Both seed and seed2 should be 0 if deterministic is false "
            f"(got seed={seed}, seed2={seed2})")
    if value.ndim != 4:
        raise InvalidArgumentError(
            f"{op}: tensor_in must be 4-dimensional, got shape {shape_str(value.shape)}")
    for i, (n, r) in enumerate(zip(value.shape, pooling_ratio)):
        if not (np.float32(n) >= np.float32(r)):
            raise InvalidArgumentError(
                f"{op}: Pooling ratio is higher than input dimension size for dimension {i}. "
                f"Input dim size: {n} pooling ratio: {_fmt(r)}")


def _vals(seq: np.ndarray) -> str:
    """The values as TF prints a flat tensor: right-aligned to the widest, one space
    apart (the first 64 only: TF prints them all)."""
    v = [str(int(x)) for x in seq.reshape(-1)[:64]]
    width = max(map(len, v), default=0)
    return " ".join(x.rjust(width) for x in v) + (" ..." if seq.size > 64 else "")


def _check_sequence_shape(op: str, name: str, seq: np.ndarray, cells: int,
                          of: tuple[str, tuple[int, ...]]) -> None:
    """A vector of at least cells + 1 values (``of``: the tensor that has ``cells``, and its
    shape). Both gradients read only the first cells + 1 (see _check_sequence_values)."""
    if seq.ndim != 1:
        raise InvalidArgumentError(
            f"{op}: {name} must be a vector, received shape "
            f"{shape_str(seq.shape)}")
    if seq.shape[0] <= cells:
        # TF's words (FractionalAvgPoolGrad's; its MaxPoolGrad does not check)
        tf_name = name.replace("_pooling_sequence", "_seq_tensor") if "Avg" in op else name
        raise InvalidArgumentError(
            f"{op}: Given {of[0]} shape {shape_str(of[1])}, {tf_name} must have at least "
            f"{cells + 1} elements, but got {seq.shape[0]} ({name}: one more than the "
            f"{cells} pooling cells of {of[0]})")


def _tf_cells(seq: np.ndarray, n: int, overlapping: bool) -> tuple[np.ndarray, np.ndarray]:
    """Start and clamped end of every cell of ``seq`` as TF computes them: in int64, where
    ``seq[i + 1] - 1`` wraps (-2**63 - 1 is 2**63 - 1)."""
    s = seq.astype(np.int64)
    with np.errstate(over="ignore"):
        ends = s[1:] - np.int64(0 if overlapping else 1)
    return s[:-1], np.minimum(ends, np.int64(n - 1))


def _check_avg_grad_signs(op: str, rows: np.ndarray, cols: np.ndarray, h: int, w: int,
                          mr: int, mc: int, overlapping: bool) -> None:
    """TF's one value check of FractionalAvgPoolGrad: every cell it reads starts and ends
    (clamped) at or after 0. TF checks row cell 0, then every column cell, then the other
    row cells; the message is TF's."""
    def bad(seq: np.ndarray, n: int, m: int) -> np.ndarray:
        s, e = _tf_cells(seq[: m + 1], n, overlapping)
        return (s < 0) | (e < 0)

    rb, cb = bad(rows, h, mr), bad(cols, w, mc)
    if rb[0] or (rb.any() and not cb.any()):
        raise InvalidArgumentError(
            f"{op}: Row sequence tensor values must not be negative, got {_vals(rows)} "
            f"(row_pooling_sequence: row cell {int(np.argmax(rb))} would start or end "
            "before row 0)")
    if cb.any():
        raise InvalidArgumentError(
            f"{op}: Column sequence tensor values must not be negative, got {_vals(cols)} "
            f"(col_pooling_sequence: column cell {int(np.argmax(cb))} would start or end "
            "before column 0)")


def _check_sequence_values(op: str, name: str, seq: np.ndarray, n: int,
                           cells: int | None = None, overlapping: bool = False) -> None:
    """The values of one gradient's sequence over an input dimension of size n, for
    ``cells`` output cells (default: one fewer than the values).

    The first cells + 1 values must be strictly increasing within [0, n] (TF reads outside
    its input, clamps, or drops empty cells otherwise). Values after them: the
    FractionalAvgPoolGrad kernel never reads them, so neither does tfgrad; the
    FractionalMaxPoolGrad kernel pools every cell of its sequences into its
    orig_output-sized buffers, past their end for the extra ones, so there they must form
    cells that TF leaves empty (each start past its clamped end).
    """
    used = seq if cells is None else seq[: cells + 1]
    if not (used.size == 0 or (used.min() >= 0 and used.max() <= n)):
        raise InvalidArgumentError(
            f"{op}: {name} values must lie in [0, {n}] (the input size), got {_vals(used)}")
    if not np.all(np.diff(used) > 0):
        raise InvalidArgumentError(
            f"{op}: {name} must be strictly increasing (every pooling cell non-empty), got "
            f"{_vals(used)}")
    if op == "FractionalMaxPoolGrad" and cells is not None and seq.size > cells + 1:
        s, e = _tf_cells(seq[cells:], n, overlapping)
        full = s <= e
        if full.any():
            k = cells + int(np.argmax(full))
            raise InvalidArgumentError(
                f"{op}: {name} has {seq.size} values for the {cells} pooling cells of "
                f"orig_output; its extra cells must be empty (TF pools them too, writing "
                f"past its orig_output-sized buffers), but cell {k} spans [{int(s[k - cells])}, "
                f"{int(e[k - cells])}]")


def check_gradient_sequences(op: str, rows: np.ndarray, cols: np.ndarray, h: int, w: int,
                             mr: int, mc: int, overlapping: bool) -> None:
    """The value checks of a gradient op's sequences (``op``: FractionalAvgPoolGrad or
    FractionalMaxPoolGrad), in TF's order, for an input of h x w pooled into mr x mc
    cells (the checks of their shapes come first: ``check``)."""
    if op == "FractionalAvgPoolGrad":
        _check_avg_grad_signs(op, rows, cols, h, w, mr, mc, overlapping)
    _check_sequence_values(op, "row_pooling_sequence", rows, h, mr, overlapping)
    _check_sequence_values(op, "col_pooling_sequence", cols, w, mc, overlapping)


def max_grad_mismatch(op: str) -> InvalidArgumentError:
    """The error of FractionalMaxPoolGrad when orig_output is not the max pooling of
    orig_input over the sequences (TF's tensor_out_dup check)."""
    return InvalidArgumentError(
        f"{op}: tensor_out_dup is not the same as tensor_out (orig_output is not the max "
        "pooling of orig_input over these sequences; a cell whose first element is NaN, "
        "or whose elements are all -inf, never matches the forward op's output)")


def check(op: str, args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every check of ``op``'s arguments that needs only their shapes, dtypes and attrs (and
    the values of its shape input), in TF's order; array inputs may be shape-only
    placeholders (see :mod:`tfgrad._shapes`). The pooling sequences' values are checked by
    the ops themselves. Returns the forward ops' output shapes."""
    if op == "FractionalAvgPoolGrad":
        _check_avg_grad(op, args["orig_input_tensor_shape"], args["out_backprop"],
                        args["row_pooling_sequence"], args["col_pooling_sequence"])
        return {}
    if op == "FractionalMaxPoolGrad":
        _check_max_grad(op, args["orig_input"], args["orig_output"], args["out_backprop"],
                        args["row_pooling_sequence"], args["col_pooling_sequence"])
        return {}
    value = args["value"]
    _check_forward(op, value, args["pooling_ratio"], args["deterministic"], args["seed"],
                   args["seed2"])
    out = output_shape(tuple(int(d) for d in value.shape), args["pooling_ratio"])
    check_alloc(op, "output", out, value.dtype)
    return {"output": out, "row_pooling_sequence": (out[1] + 1,),
            "col_pooling_sequence": (out[2] + 1,)}


# --------------------------------------------------------------------------------------
# Forward ops
# --------------------------------------------------------------------------------------
def _forward(op: str, value: np.ndarray, pooling_ratio: tuple[float, ...], pseudo_random: bool,
             overlapping: bool, deterministic: bool, seed: int,
             seed2: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out_shape = check(op, locals())["output"]
    shape = tuple(int(d) for d in value.shape)
    s, s2 = seeds(op, value.dtype, pooling_ratio, pseudo_random, overlapping, deterministic,
                   seed, seed2)
    if _config.use_reference() or not deterministic:
        rows, cols = pooling_sequences(shape, pooling_ratio, pseudo_random, s, s2)
    else:  # a pure function of these; drawing it costs more than a small op's kernel
        r, c = _cached_sequences((shape[1], shape[2]), tuple(pooling_ratio), pseudo_random,
                                 s, s2)
        rows, cols = np.array(r, np.int64), np.array(c, np.int64)
    rs, re = cell_bounds(rows, out_shape[1], shape[1], overlapping)
    cs, ce = cell_bounds(cols, out_shape[2], shape[2], overlapping)
    with flush_denormals():
        if _config.use_reference():
            fn = _max_pool_reference if op == "FractionalMaxPool" else _avg_pool_reference
            out = fn(value, rs, re, cs, ce)
        else:
            from ..dispatch import fractional_pool as D

            if op == "FractionalMaxPool":
                out = D.max_pool(value, rs, re, cs, ce, _lowest(value.dtype))
            else:
                out = D.avg_pool(value, rs, re, cs, ce)
    return out, rows, cols


def _lowest(dtype: np.dtype) -> Any:
    """Eigen::NumTraits<T>::lowest()."""
    dtype = np.dtype(dtype)
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    return dtype.type(info.min)


def FractionalMaxPool(value: np.ndarray, pooling_ratio: tuple[float, ...], pseudo_random: bool,
                      overlapping: bool, deterministic: bool, seed: int,
                      seed2: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _forward("FractionalMaxPool", value, pooling_ratio, pseudo_random, overlapping,
                    deterministic, seed, seed2)


def FractionalAvgPool(value: np.ndarray, pooling_ratio: tuple[float, ...], pseudo_random: bool,
                      overlapping: bool, deterministic: bool, seed: int,
                      seed2: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _forward("FractionalAvgPool", value, pooling_ratio, pseudo_random, overlapping,
                    deterministic, seed, seed2)


# --------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------
def _check_avg_grad(op: str, shp: np.ndarray, g: np.ndarray, rows: np.ndarray,
                    cols: np.ndarray) -> tuple[int, ...]:
    if not (shp.ndim == 1 and shp.size == 4):
        raise InvalidArgumentError(  # (TF's words, its missing space included)
            f"{op}: original input tensor shape must be1-dimensional and 4 elements, got "
            f"shape {shape_str(shp.shape)}")
    if g.ndim != 4:
        raise InvalidArgumentError(
            f"{op}: out_backprop must be 4-dimensional, got shape "
            f"{shape_str(g.shape)}")
    if min(g.shape) <= 0:
        raise InvalidArgumentError(
            f"{op}: out_backprop must be positive for all dimension, got:{min(g.shape)} "
            f"(out_backprop has shape {shape_str(g.shape)})")
    dims = [int(d) for d in shp]
    for what, d in zip(("Batch", "Rows", "Columns", "Depth"), dims):
        if d < 0:
            raise InvalidArgumentError(
                f"{op}: Expected a non-negative size, got {d} "
                f"(orig_input_tensor_shape {dims})")
        if d == 0:
            raise InvalidArgumentError(
                f"{op}: {what} dimension of input must not be 0 "
                f"(orig_input_tensor_shape {dims})")
    in_shape = check_alloc(op, "the input gradient", dims, g.dtype)
    n, h, w, c = in_shape
    if not (g.shape[0] == n and g.shape[3] == c):
        raise InvalidArgumentError(
            f"{op}: out_backprop {shape_str(g.shape)} must have the batch and depth of "
            f"orig_input_tensor_shape {shape_str(in_shape)}")
    of = ("out_backprop", tuple(g.shape))
    _check_sequence_shape(op, "row_pooling_sequence", rows, g.shape[1], of)
    _check_sequence_shape(op, "col_pooling_sequence", cols, g.shape[2], of)
    return in_shape


def _check_max_grad(op: str, x: np.ndarray, y: np.ndarray, g: np.ndarray, rows: np.ndarray,
                    cols: np.ndarray) -> None:
    for name, a in (("orig_input", x), ("orig_output", y)):
        if a.ndim != 4:
            raise InvalidArgumentError(
                f"{op}: {name} should be a tensor of rank 4, got shape "
                f"{shape_str(a.shape)}")
        if a.size == 0:
            raise InvalidArgumentError(
                f"{op}: {name} must not be empty, got shape {shape_str(a.shape)}")
    for name, s in (("row_pooling_sequence", rows), ("col_pooling_sequence", cols)):
        if s.ndim != 1:
            raise InvalidArgumentError(
                f"{op}: {name} must be a vector, received shape "
                f"{shape_str(s.shape)}")
    if rows.size * cols.size > x.size:
        raise InvalidArgumentError(
            f"{op}: Pooling region has more elements than the input tensor. "
            f"row_pooling_sequence: {rows.size} values, col_pooling_sequence: "
            f"{cols.size} values, orig_input: {shape_str(x.shape)}")
    if g.shape != y.shape:
        raise InvalidArgumentError(
            f"{op}: out_backprop must have the shape of orig_output {shape_str(y.shape)}, got "
            f"{shape_str(g.shape)}")
    if not (y.shape[0] == x.shape[0] and y.shape[3] == x.shape[3]):
        raise InvalidArgumentError(
            f"{op}: orig_output {shape_str(y.shape)} must have the batch and depth of "
            f"orig_input {shape_str(x.shape)}")
    of = ("orig_output", tuple(y.shape))
    _check_sequence_shape(op, "row_pooling_sequence", rows, y.shape[1], of)
    _check_sequence_shape(op, "col_pooling_sequence", cols, y.shape[2], of)


def FractionalAvgPoolGrad(orig_input_tensor_shape: np.ndarray, out_backprop: np.ndarray,
                          row_pooling_sequence: np.ndarray, col_pooling_sequence: np.ndarray,
                          overlapping: bool) -> np.ndarray:
    op = "FractionalAvgPoolGrad"
    in_shape = _check_avg_grad(op, orig_input_tensor_shape, out_backprop, row_pooling_sequence,
                               col_pooling_sequence)
    g, (_, h, w, _) = out_backprop, in_shape
    mr, mc = g.shape[1], g.shape[2]
    check_gradient_sequences(op, row_pooling_sequence, col_pooling_sequence, h, w, mr, mc,
                             overlapping)
    rs, re = cell_bounds(row_pooling_sequence, g.shape[1], h, overlapping)
    cs, ce = cell_bounds(col_pooling_sequence, g.shape[2], w, overlapping)
    with flush_denormals():
        if _config.use_reference():
            return _avg_pool_grad_reference(in_shape, g, rs, re, cs, ce)
        from ..dispatch import fractional_pool as D

        return D.avg_pool_grad(in_shape, g, rs, re, cs, ce)


def _int_range(dtype: np.dtype) -> tuple[float, float]:
    """[lo, hi) of doubles that convert to integer T without overflow (0, 0 for floats)."""
    if np.dtype(dtype).kind != "i":
        return 0.0, 0.0
    bits = np.dtype(dtype).itemsize * 8
    return -float(2 ** (bits - 1)), float(2 ** (bits - 1))


def FractionalMaxPoolGrad(orig_input: np.ndarray, orig_output: np.ndarray,
                          out_backprop: np.ndarray, row_pooling_sequence: np.ndarray,
                          col_pooling_sequence: np.ndarray, overlapping: bool) -> np.ndarray:
    op = "FractionalMaxPoolGrad"
    x, y, g = orig_input, orig_output, out_backprop
    _check_max_grad(op, x, y, g, row_pooling_sequence, col_pooling_sequence)
    check_gradient_sequences(op, row_pooling_sequence, col_pooling_sequence, x.shape[1],
                             x.shape[2], y.shape[1], y.shape[2], overlapping)
    rs, re = cell_bounds(row_pooling_sequence, y.shape[1], x.shape[1], overlapping)
    cs, ce = cell_bounds(col_pooling_sequence, y.shape[2], x.shape[2], overlapping)
    with flush_denormals():
        if _config.use_reference():
            out, ok = _max_pool_grad_reference(x, y, g, rs, re, cs, ce)
        else:
            from ..dispatch import fractional_pool as D

            out = D.max_pool_grad(x, y, g, rs, re, cs, ce)
            ok = out is not None
    if not ok:
        raise max_grad_mismatch(op)
    return out


# --------------------------------------------------------------------------------------
# NumPy references (the readable specification; loops over cells, vectors over depth)
# --------------------------------------------------------------------------------------
def _max_pool_reference(x: np.ndarray, rs: np.ndarray, re: np.ndarray, cs: np.ndarray,
                        ce: np.ndarray) -> np.ndarray:
    out = np.full((x.shape[0], rs.size, cs.size, x.shape[3]), _lowest(x.dtype), x.dtype)
    for i in range(rs.size):
        for j in range(cs.size):
            acc = out[:, i, j, :]
            for h in range(rs[i], re[i] + 1):
                for w in range(cs[j], ce[j] + 1):
                    v = x[:, h, w, :]
                    acc[...] = np.where(acc < v, v, acc)  # NaN never replaces acc
    # TF's x86 max instruction returns a denormal (DAZ) as 0
    return flushed(out) if x.dtype.kind == "f" else out


def _avg_pool_reference(x: np.ndarray, rs: np.ndarray, re: np.ndarray, cs: np.ndarray,
                        ce: np.ndarray) -> np.ndarray:
    out = np.zeros((x.shape[0], rs.size, cs.size, x.shape[3]), x.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(rs.size):
            for j in range(cs.size):
                acc = np.zeros((x.shape[0], x.shape[3]), x.dtype)
                for h in range(rs[i], re[i] + 1):
                    for w in range(cs[j], ce[j] + 1):
                        acc = acc + x[:, h, w, :]  # in T: integer sums wrap
                count = (re[i] - rs[i] + 1) * (ce[j] - cs[j] + 1)
                if x.dtype.kind == "f":
                    out[:, i, j, :] = acc / x.dtype.type(count)
                else:  # C++ integer division truncates toward zero
                    q = acc // count
                    out[:, i, j, :] = np.where((acc < 0) & (acc % count != 0), q + 1, q)
    return out


def _avg_pool_grad_reference(in_shape: tuple[int, ...], g: np.ndarray, rs: np.ndarray,
                             re: np.ndarray, cs: np.ndarray, ce: np.ndarray) -> np.ndarray:
    acc = np.zeros(in_shape, np.float64)
    for r in range(rs.size):
        for c in range(cs.size):
            count = (re[r] - rs[r] + 1) * (ce[c] - cs[c] + 1)
            share = g[:, r, c, :].astype(np.float64) / count
            for h in range(rs[r], re[r] + 1):
                for w in range(cs[c], ce[c] + 1):
                    acc[:, h, w, :] += share
    if g.dtype.kind == "f":
        return acc.astype(g.dtype)
    lo, hi = _int_range(g.dtype)
    ok = (acc >= lo) & (acc < hi)
    # static_cast<T>(double) truncates; out of range, x86 gives T's minimum.
    return np.where(ok, np.trunc(np.where(ok, acc, 0.0)), lo).astype(g.dtype)


def _max_pool_grad_reference(x: np.ndarray, y: np.ndarray, g: np.ndarray, rs: np.ndarray,
                             re: np.ndarray, cs: np.ndarray,
                             ce: np.ndarray) -> tuple[np.ndarray, bool]:
    n, h_in, w_in, depth = x.shape
    out = np.zeros(x.shape, x.dtype)
    b_idx = np.arange(n)[:, None]
    d_idx = np.arange(depth)[None, :]
    with np.errstate(over="ignore"):
        for i in range(rs.size):
            for j in range(cs.size):
                best = x[:, rs[i], cs[j], :].copy()
                arg = np.full((n, depth), rs[i] * w_in + cs[j])
                for h in range(rs[i], re[i] + 1):
                    for w in range(cs[j], ce[j] + 1):
                        v = x[:, h, w, :]
                        better = best < v  # ties keep the first maximum
                        best = np.where(better, v, best)
                        arg = np.where(better, h * w_in + w, arg)
                if not np.all(best == y[:, i, j, :]):
                    return out, False
                hh, ww = arg // w_in, arg % w_in
                out[b_idx, hh, ww, d_idx] += g[:, i, j, :]
    return out, True
