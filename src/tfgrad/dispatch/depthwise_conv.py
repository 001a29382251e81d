"""The depthwise ops on the compiled kernels (``tfgrad.kernels.depthwise_conv``): float32 /
float64 working copies and the rounding mode of the half types, the output buffers
(streamed when large), the kernel for the call (a register-blocked variant of the table
``kernels.depthwise_conv.VARIANTS`` where one applies, else the generic one; the exact
redo of -0 outputs), the tasks and the threads. Geometry arrives checked by
``tfgrad.ops.depthwise_conv``, which also sets TF's FTZ / DAZ.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compile import kernel_array, threads
from .._tf.depthwise import Geometry
from ..kernels._pool import run as pool_run
from ..kernels._simd import HOST_AVX512, STREAM_MIN_BYTES, aligned_empty, stream_output
from ..kernels.depthwise_conv import SIZES, Variant, filter_pairs, kernel
from ..kernels.depthwise_conv import backprop_filter as kbf
from ..kernels.depthwise_conv import backprop_input as kbi
from ..kernels.depthwise_conv import forward as kf
from ..kernels.depthwise_conv.common import BF16, F16, NONE

_FAMILY = "depthwise_conv"
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

_STREAM_MIN_BYTES = STREAM_MIN_BYTES
"""Outputs this big whose pixels are whole 64-byte lines are written with non-temporal
stores (register-blocked kernels): no read-for-ownership of lines only written. (Tests
lower it.)"""


def _vec(mode: int, op: str, fh: int, fw: int, **flags: bool) -> Any:
    """The register-blocked kernel ``Variant(op, fh, fw, **flags)``, or None where there is
    none (other filter sizes, and the half types, which round after every step). Looked
    up by a plain tuple: building and hashing the Variant cost ~1.3 us a call."""
    key = (mode, op, fh, fw, *flags.items())
    vec = _VECS.get(key, _NONE)
    if vec is _NONE:
        vec = _VECS[key] = (None if mode != NONE or (fh, fw) not in SIZES
                            else kernel(Variant(op, fh, fw, **flags)))
    return vec


_VECS: dict[tuple, Any] = {}
_NONE = object()


def _macs(geo: Geometry) -> int:
    """The op's multiply-adds: one per out_backprop (output) element and tap."""
    return geo.N * geo.oh * geo.ow * geo.C * geo.M * geo.fh * geo.fw


def _threads(work: int) -> int:
    return threads(_FAMILY, work)


def _run(kernel: Any, ntasks: int, work: int, *args: Any) -> None:
    """kernel(*args, ctl, size, ntasks) over the tasks [0, ntasks), on the threads the
    family's policy gives ``work`` (the op's multiply-adds; ``tfgrad._compile``), which
    claim chunks of tasks as they come free (``kernels._pool``). Every task computes the
    same bits whichever thread runs it."""
    pool_run(kernel, ntasks, _threads(work), *args)


def _prepare(*arrays: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.dtype, int]:
    """Contiguous float32 / float64 arrays for the kernels, T and the rounding mode.

    Read-only inputs are copied (never written either way): one array type per dtype
    keeps the number of compiled specialisations at two."""
    dt = arrays[0].dtype
    mode = NONE if dt in (_F32, _F64) else F16 if dt == np.float16 else BF16
    wdt = _work_dtype(dt)
    return tuple(kernel_array(a, wdt) for a in arrays), dt, mode


def _work_dtype(dt: np.dtype) -> np.dtype:
    return _F64 if dt == _F64 else _F32


def _group(mode: int) -> int:
    """Terms per register-accumulated pass: 4, or 1 where T rounds after every step."""
    return 4 if mode == NONE else 1


def _weight_tile(w: np.ndarray, ow: int) -> np.ndarray:
    """[fh, fw, JT * C * M]: each tap's weights repeated for JT output pixels (about
    16 KiB per tap), the other operand of the kernels' contiguous runs."""
    fh, fw, C, M = w.shape
    cm = max(1, C * M)
    jt = max(1, min(ow, 4096 // cm))
    return np.ascontiguousarray(np.tile(w.reshape(fh, fw, 1, C * M), (1, 1, jt, 1))
                                .reshape(fh, fw, jt * C * M))


def forward(x: np.ndarray, w: np.ndarray, geo: Geometry) -> np.ndarray:
    (x, w), dt, mode = _prepare(x, w)
    work = _macs(geo)
    # A large output of whole-line pixels goes out with non-temporal stores (register
    # kernels): no read-for-ownership of lines that are only written.
    out, stream = stream_output((geo.N, geo.oh, geo.ow, geo.C * geo.M), _work_dtype(dt),
                                _STREAM_MIN_BYTES)
    vec = _vec(mode, "forward", geo.fh, geo.fw, stream=stream)
    negz = np.zeros(geo.N * geo.oh, np.bool_)  # output rows with a -0 (dilated: to redo)
    if out.size and vec is not None:
        _run(vec, geo.N * geo.oh, work, x, w, out, geo.sh, geo.sw, geo.dh, geo.dw, geo.pt,
             geo.pl, negz, stream)
    elif out.size:
        _run(kf.generic, geo.N * geo.oh, work, x, w, _weight_tile(w, geo.ow), out, geo.sh,
             geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, mode, _group(mode), negz)
    if (geo.dh > 1 or geo.dw > 1) and negz.any():  # TF's inserted zeros
        kf.redo_negzero(x, w, out, geo.sh, geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, mode, negz)
    return out.astype(dt, copy=False)


def backprop_input(w: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    (w, g), dt, mode = _prepare(w, g)
    work = _macs(geo)
    out, stream = stream_output((geo.N, geo.H, geo.W, geo.C), _work_dtype(dt),
                                _STREAM_MIN_BYTES)
    if out.size == 0:
        return out.astype(dt, copy=False)
    if geo.M == 0:  # the empty sum (TF leaves this output uninitialised)
        return np.zeros(out.shape, dt)
    lanes = 4 if dt == _F64 else 8
    args = (geo.sh, geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, mode, lanes)
    # (M > 1 writes out after the multiplier reduction, one value at a time: no streaming,
    # but for M = 2's pair blocks, which write whole lane vectors of out: ``pstream``)
    # (M > 1 on whole lane vectors: out_backprop rows through a ring blocked by lane vector)
    # (M = 2 there on AVX-512: pair blocks, two lane vectors each, over whole pairs)
    nl = 64 // g.dtype.itemsize
    blocked = geo.M > 1 and geo.C * geo.M % nl == 0
    pair = HOST_AVX512 and blocked  # (the kernel with pair code; its blocks check M = 2)
    v_stream = stream and geo.M == 1
    v_pstream = stream and pair and geo.M == 2 and geo.C * geo.M % (2 * nl) == 0
    vec = _vec(mode, "backprop_input", geo.fh, geo.fw, stream=v_stream, blocked=blocked,
               pstream=v_pstream, pair=pair)
    finite = bool(np.isfinite(w).all())
    negz = np.zeros(geo.N * geo.H, np.bool_)  # input rows with a -0 to redo
    if finite and vec is not None:
        _run(vec, geo.N * geo.H, work, w, g, out, *args[:6], lanes, negz, v_stream,
             v_pstream)
    elif finite and mode == NONE:
        _run(kbi.finite, geo.N * geo.H, work, w, _weight_tile(w, geo.ow), g, out,
             *args, _group(mode), negz)
    else:
        # The taps that miss compute w * 0: NaN for an inf filter value, and in the half
        # types a -0 (a product that underflowed) becomes +0 when w >= 0.
        _run(kbi.generic, geo.N * geo.H, work, w, g, out, *args)
        negz[:] = geo.dh > 1 or geo.dw > 1  # (TF's inserted zeros)
    if negz.any():
        kbi.redo_negzero(w.reshape(geo.fh, geo.fw, geo.C, geo.M), g, out, *args, negz)
    return out.astype(dt, copy=False)


def backprop_filter(x: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    (x, g), dt, mode = _prepare(x, g)
    wdt = _work_dtype(dt)
    shape = (geo.fh, geo.fw, geo.C, geo.M)
    total = np.zeros(shape, wdt)
    if total.size == 0 or geo.N == 0 or geo.oh * geo.ow == 0:
        return total.astype(dt, copy=False)  # (TF returns uninitialised memory for these)
    work = _macs(geo)
    nthreads = _threads(work)
    bufs = aligned_empty((geo.N, geo.fh, geo.fw, geo.C * geo.M), wdt)
    # (C * M two lane vectors on AVX-512: sweeps over both)
    pair = filter_pairs(geo.fw) and geo.C * geo.M == 2 * (64 // x.dtype.itemsize)
    vec = _vec(mode, "backprop_filter", geo.fh, geo.fw, pair=pair)
    if vec is not None and geo.N >= nthreads:
        _run(vec, geo.N, work, x, g, bufs, geo.sh, geo.sw, geo.dh, geo.dw, geo.pt, geo.pl)
    elif geo.dw == 1 and geo.N >= nthreads:  # one task per image, filter rows as runs
        _run(kbf.by_rows, geo.N, work, x, g, bufs, geo.sh, geo.sw, geo.dh, geo.pt,
             geo.pl, mode, _group(mode))
    else:
        # Enough (image, channel block) tasks for every thread; the blocking does not
        # change any element's arithmetic.
        nkb = min(geo.C, max(1, -(-2 * nthreads // geo.N)))
        kblock = -(-geo.C // nkb)
        _run(kbf.by_channel_blocks, geo.N * -(-geo.C // kblock), work, x, g, bufs, kblock,
             geo.sh, geo.sw, geo.dh, geo.dw, geo.pt, geo.pl, mode, _group(mode))
    kbf.sum_images(bufs, total, mode)
    return total.astype(dt, copy=False)
