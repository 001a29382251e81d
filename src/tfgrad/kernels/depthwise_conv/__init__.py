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


@dataclass(frozen=True)
class Variant:
    """One register-blocked kernel: the op, the filter size and the compile-time flags."""

    op: str
    """``"forward"``, ``"backprop_input"`` or ``"backprop_filter"``."""
    fh: int
    fw: int
    stream: bool = False
    """Outputs written with non-temporal stores (forward; BackpropInput with M = 1)."""
    blocked: bool = False
    """BackpropInput with M > 1 on whole lane vectors: out_backprop rows read through a
    ring blocked by lane vector."""
    pstream: bool = False
    """BackpropInput with M = 2 on a streamed output: the pair blocks' stores
    non-temporal."""


SIZES = ((1, 1), (2, 2), (3, 3), (5, 5), (7, 7))
"""The filter sizes with register-blocked kernels (float32 / float64)."""

_FLAGS: dict[str, tuple[dict[str, bool], ...]] = {
    "forward": ({"stream": False}, {"stream": True}),
    # (streaming with M = 1 only; pstream implies blocked: a streamed output's pixels are
    # whole lines, so C * M is whole lane vectors)
    "backprop_input": ({}, {"stream": True}, {"blocked": True},
                       {"blocked": True, "pstream": True}),
    "backprop_filter": ({},),
}

VARIANTS: tuple[Variant, ...] = tuple(
    Variant(op, fh, fw, **flags) for op, combos in _FLAGS.items() for fh, fw in SIZES
    for flags in combos)
"""Every register-blocked kernel a call can select."""

_BUILT: dict[Variant, Any] = {}


def kernel(v: Variant) -> Any:
    """The compiled kernel of variant ``v`` (built on first use; Numba compiles it on its
    first call, or loads it from its on-disk cache). The table itself loads no Numba:
    the kernel modules are imported here."""
    if v not in _BUILT:
        if v not in VARIANTS:
            raise KeyError(f"no register-blocked depthwise kernel {v}")
        from . import backprop_filter, backprop_input, forward

        if v.op == "forward":
            _BUILT[v] = forward.make_vec(v.fh, v.fw, stream=v.stream)
        elif v.op == "backprop_input":
            _BUILT[v] = backprop_input.make_vec(v.fh, v.fw, stream=v.stream, blocked=v.blocked,
                                                pstream=v.pstream)
        else:
            _BUILT[v] = backprop_filter.make_vec(v.fh, v.fw)
    return _BUILT[v]
