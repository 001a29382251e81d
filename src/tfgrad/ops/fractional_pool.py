"""FractionalMaxPool, FractionalAvgPool and their gradients, as TF 2.21's CPU kernels.

Pooling sequences
    TF draws them from ``tsl::random::PhiloxRandom`` (Philox4x32-10) keyed by
    ``(seed, seed2)``: key = (seed lo32, seed hi32), counter = (0, 0, seed2 lo32, seed2 hi32),
    both seeds reinterpreted as uint64. Rows are generated first, then columns, from the
    same generator; each generation first *reserves* its draws (the counter advances by
    ceil(draws / 4) blocks), even when the size divides exactly.

    - random (``pseudo_random=False``): ``diff = [k+1]*r + [k]*(m-r)`` (k = n // m,
      r = n % m), then for i = 0 .. m-2 swap ``diff[i]`` with ``diff[i + u32 % (m - i)]``.
    - pseudo-random: ``u = RandDouble() * min((k+2)/a - 1, (n+1-k)/a - (m-1))`` with
      a = n / m in double; ``a_i = int(ceil(a * (i + u)))``, ``a_0 = 1``, ``a_m = n + 1``.

    The returned sequence is the cumulative sum ``[0, d0, d0+d1, ..., n]``.

Seeds (what tfgrad does, matching TF's eager behaviour)
    - ``deterministic=True`` with a non-zero seed pair: a pure function of the seeds,
      bit-identical to TF.
    - ``deterministic=True`` with ``seed == seed2 == 0``: TF draws two random 64-bit seeds
      when the kernel is constructed and its eager kernel cache keeps that kernel per attr
      set, so the sequences repeat inside one process but not across processes. tfgrad
      draws them from the OS once per (op, T, pooling_ratio, pseudo_random, overlapping) and
      keeps them for the life of the process.
    - ``deterministic=False``: both seeds must be 0 (TF's error otherwise); fresh seeds are
      drawn from the OS on every call.

Cells
    Cell i spans ``[s_i, e_i]`` with ``e_i = s_{i+1}`` when overlapping else
    ``s_{i+1} - 1``, clamped to ``n - 1``. Output sizes are ``floor(float32(n) / ratio)``
    computed in float32 (``10 / float32(10/3)`` is 3.0000000298, so 3).

Computation (each verified bit-exact against TF 2.21)
    - Max: the accumulator starts at the dtype's lowest value (float32: -3.4028235e38, not
      -inf) and updates as ``acc = v if acc < v else acc``, so NaN never wins and an
      all-NaN or all--inf cell gives the lowest finite value.
    - Avg: sum in T in row-major cell order, then divide by the count in T; integer
      division truncates toward zero and integer sums wrap.
    - MaxGrad: replays the forward with ``best = first element; best = v if best < v`` (ties
      go to the first maximum in row-major order), requires every replayed maximum to equal
      ``orig_output`` (``==``; so a NaN first in its cell, or a cell of only -inf, makes TF
      and tfgrad raise ``tensor_out_dup is not the same as tensor_out``), then adds each
      ``out_backprop`` element to its argmax in T, in output row-major order. TF first
      requires ``len(rows) * len(cols) <= orig_input.size``, which rejects the forward
      op's own sequences on tiny inputs ([1,2,2,2] at ratio 1: 3 * 3 > 8); tfgrad keeps
      that check.
    - AvgGrad: ``double(g) / count`` is added, in output row-major order, into a float64
      accumulator per input element starting at +0.0, which is rounded to T once; integers
      truncate, and values outside T's range become T's minimum (what x86's cvttsd2si
      gives TF). An input element lies in at most 2 x 2 cells (the sequences are strictly
      increasing), so the fused kernel sums each element's shares in a register and
      rounds once: no float64 array the size of the input, as TF allocates.

NaN payloads
    Where two NaNs are added (Avg sums, AvgGrad and MaxGrad accumulations), TF's x86 add
    returns the incoming operand's NaN; tfgrad's result is NaN there too but may carry
    the other NaN's payload and sign (LLVM does not keep the operand order of an add;
    see the README). A live campaign of ~551,000 calls found no other difference.

Denormals (TF runs its kernels with FTZ and DAZ set, ``tfgrad._fpenv``)
    Sums, shares and comparisons read a denormal as 0 and flush denormal results. TF's
    max is an x86 max instruction, which returns a denormal as a zero of its sign, so
    FractionalMaxPool never outputs a denormal (and of -denormal then +denormal keeps
    -0, the earlier of equals); MaxGrad's replay copies values and compares them under
    DAZ, so its check accepts those zeros. MaxGrad adds only the g of the cells whose
    argmax an element is: a sum that flushes to -0 stays -0.

Fused kernels (``tfgrad.kernels.fractional_pool``)
    Forward ops: one task per (batch, output row). For float32/float64 each cell keeps
    the running maxima or sums of eight channel vectors in registers over its taps (the
    max is order-free: a NaN never wins and the earlier of -0/+0 stays; the sums keep
    TF's row-major order) and writes its outputs once. For outputs of 4 MiB or more the
    stores are non-temporal (no read-for-ownership of lines that would leave the caches
    before use anyway) and each cell prefetches the input lines of the next row cell.
    Gradients: one task per (batch, output
    row cell r), owning the input rows whose last covering cell is r; AvgGrad computes
    the shares ``double(g)/count`` of rows r-1 and r once per task (2 output rows of
    float64), MaxGrad finds each cell's argmax (its position in the cell) and then
    *gathers* per input element the g of the cells whose argmax it is, in TF's order,
    instead of TF's racy-if-parallel scatter. For float32/float64 with whole channel
    vectors the two are fused: a task of up to 8 row cells keeps the positions (exact in
    T) of its current and previous row cell in a small buffer, recomputing the row cell
    before its first, so no output-sized argmax array is written; other dtypes record
    an int32 argmax array first. Every output element is
    written by exactly one task in TF's order, so results do not depend on the thread
    count. Small problems run on one thread (a parallel launch costs more).

Validation beyond TF (TF accepts these, reads out of bounds or crashes; tfgrad raises
InvalidArgumentError before any kernel runs):
    - grads: sequences must be vectors of exactly ``out_rows + 1`` / ``out_cols + 1``
      values, strictly increasing (every cell non-empty), within ``[0, input size]``;
    - MaxGrad: ``out_backprop`` must have ``orig_output``'s shape, and ``orig_output``
      ``orig_input``'s batch and depth (TF reads uninitialised memory or writes past its
      buffers otherwise);
    - AvgGrad: ``out_backprop``'s batch and depth must equal ``orig_input_tensor_shape``'s;
    - forward: pooling ratios must be finite (TF rejects inf only through its size check).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import numpy as np

from .. import _config
from .._errors import InvalidArgumentError
from .._fpenv import flush_denormals, flushed
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
            from ..kernels.fractional_pool import philox_blocks

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


def _seeds(op: str, dtype: np.dtype, ratio: tuple[float, ...], pseudo_random: bool,
           overlapping: bool, deterministic: bool, seed: int, seed2: int) -> tuple[int, int]:
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
def _cells(seq: np.ndarray, m: int, n: int, overlapping: bool) -> tuple[np.ndarray, np.ndarray]:
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
        # `not r >= 1` also catches NaN, as TF's check does.
        if not (r >= 1):
            raise InvalidArgumentError(
                f"{op}: pooling_ratio cannot be smaller than 1, got: {_fmt(r)}")
        if not np.isfinite(r):
            raise InvalidArgumentError(f"{op}: pooling_ratio must be finite, got: {_fmt(r)}")
    if not (pooling_ratio[0] == 1 and pooling_ratio[3] == 1):
        raise InvalidArgumentError(
            f"{op}: Fractional {kind} pooling is not yet supported on the batch nor channel "
            f"dimension (pooling_ratio[0] and pooling_ratio[3] must be 1.0, got "
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


def _check_sequence_shape(op: str, name: str, seq: np.ndarray, cells: int) -> None:
    if seq.ndim != 1:
        raise InvalidArgumentError(
            f"{op}: {name} must be a vector, received shape "
            f"{shape_str(seq.shape)}")
    if seq.shape[0] != cells + 1:
        raise InvalidArgumentError(
            f"{op}: {name} must have {cells + 1} elements (one more than the {cells} pooling "
            f"cells of out_backprop), got {seq.shape[0]}")


def _check_sequence_values(op: str, name: str, seq: np.ndarray, n: int) -> None:
    if not (seq.size == 0 or (seq.min() >= 0 and seq.max() <= n)):
        raise InvalidArgumentError(
            f"{op}: {name} values must lie in [0, {n}] (the input size), got {seq.tolist()}")
    if not np.all(np.diff(seq) > 0):
        raise InvalidArgumentError(
            f"{op}: {name} must be strictly increasing (every pooling cell non-empty), got "
            f"{seq.tolist()}")


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
    s, s2 = _seeds(op, value.dtype, pooling_ratio, pseudo_random, overlapping, deterministic,
                   seed, seed2)
    if _config.use_reference() or not deterministic:
        rows, cols = pooling_sequences(shape, pooling_ratio, pseudo_random, s, s2)
    else:  # a pure function of these; drawing it costs more than a small op's kernel
        r, c = _cached_sequences((shape[1], shape[2]), tuple(pooling_ratio), pseudo_random,
                                 s, s2)
        rows, cols = np.array(r, np.int64), np.array(c, np.int64)
    rs, re = _cells(rows, out_shape[1], shape[1], overlapping)
    cs, ce = _cells(cols, out_shape[2], shape[2], overlapping)
    with flush_denormals():
        if _config.use_reference():
            fn = _max_pool_reference if op == "FractionalMaxPool" else _avg_pool_reference
            out = fn(value, rs, re, cs, ce)
        else:
            from ..kernels import fractional_pool as K

            x = _kernel_input(value)
            if op == "FractionalMaxPool":
                out = K.max_pool(x, rs, re, cs, ce, _lowest(value.dtype))
            else:
                out = K.avg_pool(x, rs, re, cs, ce)
    return out, rows, cols


def _kernel_input(a: np.ndarray) -> np.ndarray:
    """C-contiguous and writeable: Numba types a read-only array differently, and one
    compiled specialisation per dtype keeps compile time down (the kernels never write
    their inputs)."""
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()


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
        raise InvalidArgumentError(
            f"{op}: original input tensor shape must be 1-dimensional and 4 elements, got "
            f"shape {shape_str(shp.shape)}")
    if g.ndim != 4:
        raise InvalidArgumentError(
            f"{op}: out_backprop must be 4-dimensional, got shape "
            f"{shape_str(g.shape)}")
    if min(g.shape) <= 0:
        raise InvalidArgumentError(
            f"{op}: out_backprop must be positive for all dimension, got "
            f"shape {shape_str(g.shape)}")
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
    _check_sequence_shape(op, "row_pooling_sequence", rows, g.shape[1])
    _check_sequence_shape(op, "col_pooling_sequence", cols, g.shape[2])
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
    _check_sequence_shape(op, "row_pooling_sequence", rows, y.shape[1])
    _check_sequence_shape(op, "col_pooling_sequence", cols, y.shape[2])


def FractionalAvgPoolGrad(orig_input_tensor_shape: np.ndarray, out_backprop: np.ndarray,
                          row_pooling_sequence: np.ndarray, col_pooling_sequence: np.ndarray,
                          overlapping: bool) -> np.ndarray:
    op = "FractionalAvgPoolGrad"
    in_shape = _check_avg_grad(op, orig_input_tensor_shape, out_backprop, row_pooling_sequence,
                               col_pooling_sequence)
    g, (_, h, w, _) = out_backprop, in_shape
    _check_sequence_values(op, "row_pooling_sequence", row_pooling_sequence, h)
    _check_sequence_values(op, "col_pooling_sequence", col_pooling_sequence, w)
    rs, re = _cells(row_pooling_sequence, g.shape[1], h, overlapping)
    cs, ce = _cells(col_pooling_sequence, g.shape[2], w, overlapping)
    with flush_denormals():
        if _config.use_reference():
            return _avg_pool_grad_reference(in_shape, g, rs, re, cs, ce)
        from ..kernels import fractional_pool as K

        return K.avg_pool_grad(in_shape, _kernel_input(g), rs, re, cs, ce)


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
    _check_sequence_values(op, "row_pooling_sequence", row_pooling_sequence, x.shape[1])
    _check_sequence_values(op, "col_pooling_sequence", col_pooling_sequence, x.shape[2])
    rs, re = _cells(row_pooling_sequence, y.shape[1], x.shape[1], overlapping)
    cs, ce = _cells(col_pooling_sequence, y.shape[2], x.shape[2], overlapping)
    with flush_denormals():
        if _config.use_reference():
            out, ok = _max_pool_grad_reference(x, y, g, rs, re, cs, ce)
        else:
            from ..kernels import fractional_pool as K

            out = K.max_pool_grad(_kernel_input(x), _kernel_input(y), _kernel_input(g), rs,
                                  re, cs, ce)
            ok = out is not None
    if not ok:
        raise InvalidArgumentError(
            f"{op}: orig_output is not the max pooling of orig_input over these sequences "
            "(tensor_out_dup is not the same as tensor_out); a cell whose first element is "
            "NaN, or whose elements are all -inf, never matches the forward op's output")
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
