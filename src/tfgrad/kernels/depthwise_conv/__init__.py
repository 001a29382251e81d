"""Depthwise convolution's compiled kernels (NHWC), and the table of their variants.

Each op has a generic kernel (any filter size, float32 / float64 and the half types
rounded after every step), and for the filter sizes in :data:`SIZES` in float32 /
float64 register-blocked kernels compiled per filter size and flags (the taps unroll).
:data:`VARIANTS` declares every one of those; ``tfgrad.dispatch.depthwise_conv`` picks
one per call and ``tfgrad warmup`` compiles them all. How they compute TF's order of
operations: docs/depthwise_conv.md ("How the kernels compute it").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._simd import HOST_AVX512


@dataclass(frozen=True)
class Variant:
    """One register-blocked kernel: the op, the filter size and the compile-time flags."""

    op: str
    """``"forward"``, ``"backprop_input"`` or ``"backprop_filter"``."""
    fh: int
    fw: int
    stream: bool = False
    """Outputs written with non-temporal stores (forward; BackpropInput with M = 1). A
    run-time argument, as ``pstream``: the variants that differ only in these share one
    compiled kernel (the dispatch passes the flags)."""
    blocked: bool = False
    """BackpropInput with M > 1 on whole lane vectors: out_backprop rows read through a
    ring blocked by lane vector."""
    pstream: bool = False
    """BackpropInput with M = 2 on a streamed output: the pair blocks' stores
    non-temporal."""
    pair: bool = False
    """Pair code (AVX-512 only): BackpropInput's blocks take two lane vectors at a time
    where M = 2 (checked at run time: every blocked BackpropInput kernel holds it there,
    one kernel per size and dtype for every M; a pair-free twin compiled the same
    non-pair code once more, benchmarks/RESULTS.md); BackpropFilter's sweeps where C * M
    is two lane vectors (set exactly there: the other shapes ran up to 1.4x slower in the
    kernel with pair code). A kernel without it holds no pair code, so it compiles none
    of the pair helpers' instances."""


SIZES = ((1, 1), (2, 2), (3, 3), (5, 5), (7, 7))
"""The filter sizes with register-blocked kernels (float32 / float64)."""


def filter_rows_per_sweep(fw: int) -> int:
    """BackpropFilter: filter rows whose tap accumulators share one sweep of out_backprop:
    as many (up to 3) as fit in the vector registers beside the operands. On AVX2 a
    vector takes two of 16 registers: 3x3 takes 3 rows, 5x5 one (two rows' 10
    accumulators would spill)."""
    return min(3, max(1, (21 if HOST_AVX512 else 9) // fw))


def filter_pairs(fw: int) -> bool:
    """Whether BackpropFilter's sweeps take two lane vectors where C * M is two of them:
    on AVX-512, where both vectors' accumulators fit in the registers."""
    return HOST_AVX512 and 2 * filter_rows_per_sweep(fw) * fw <= 21


def _flags(op: str, fw: int) -> tuple[dict[str, bool], ...]:
    if op == "forward":
        return ({"stream": False}, {"stream": True})
    if op == "backprop_input":
        # (streaming with M = 1 only; pstream with pair only, which implies blocked: a
        # streamed output's pixels are whole lines, so C * M is whole lane vectors)
        blocked = ({"blocked": True, "pair": True},
                   {"blocked": True, "pair": True, "pstream": True}) if HOST_AVX512 else (
                       {"blocked": True},)
        return ({}, {"stream": True}, *blocked)
    return ({}, {"pair": True}) if filter_pairs(fw) else ({},)


VARIANTS: tuple[Variant, ...] = tuple(
    Variant(op, fh, fw, **flags) for op in ("forward", "backprop_input", "backprop_filter")
    for fh, fw in SIZES for flags in _flags(op, fw))
"""Every register-blocked kernel a call can select on this machine."""

_BUILT: dict[Variant, Any] = {}


def kernel(v: Variant) -> Any:
    """The compiled kernel of variant ``v`` (built on first use; Numba compiles it on its
    first call, or loads it from its on-disk cache). The kernel modules are imported
    here."""
    if v not in _BUILT:
        if v not in VARIANTS:
            raise KeyError(f"no register-blocked depthwise kernel {v}")
        from . import backprop_filter, backprop_input, forward

        # (stream and pstream: run-time arguments of one kernel)
        same = Variant(v.op, v.fh, v.fw, blocked=v.blocked, pair=v.pair)
        if same not in _BUILT:
            if v.op == "forward":
                _BUILT[same] = forward.make_vec(v.fh, v.fw)
            elif v.op == "backprop_input":
                _BUILT[same] = backprop_input.make_vec(v.fh, v.fw, blocked=v.blocked,
                                                       pair=v.pair)
            else:
                _BUILT[same] = backprop_filter.make_vec(v.fh, v.fw, pair=v.pair)
        _BUILT[v] = _BUILT[same]
    return _BUILT[v]
