"""TF's Relu / Relu6 kernels per float type: the bit layout, and which of Eigen's code
paths (packet body, scalar tail) computes each value of a flat tensor, as measured on TF
2.21's AVX build (tfgrad.ops.activation explains the kinds; docs/activation.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Position kinds of the forward (see the module docstring).
BODY, SELECT, PAIR = 0, 1, 2
# NaN results of the gradients' multiplication: quietened payload (x86), canonical with
# the sign (bfloat16's scalar conversion), canonical positive (bfloat16's packet one).
QUIET, SIGNED, CANONICAL = 0, 1, 2


@dataclass(frozen=True)
class Format:
    """A float type's bit layout and how TF's kernels treat it."""

    uint: Any
    sign: int
    normal: int
    """The smallest normal's bits: below it (in magnitude) DAZ reads a zero."""
    inf: int
    quiet: int
    six: int
    packet: int
    """Values per AVX packet; 0: no packet/scalar difference."""
    daz: bool
    body_relu: int
    tail_first: int
    """Relu's kind for the first tail value when the tail has odd length."""
    tail_relu: int
    tail_relu6: int
    body_nan: int
    tail_nan: int


FORMATS: dict[str, Format] = {
    "float32": Format(np.uint32, 1 << 31, 0x00800000, 0x7F800000, 0x00400000, 0x40C00000,
                      8, True, BODY, SELECT, PAIR, SELECT, QUIET, QUIET),
    "float64": Format(np.uint64, 1 << 63, 1 << 52, 0x7FF << 52, 1 << 51, 0x4018 << 48,
                      4, True, BODY, SELECT, PAIR, SELECT, QUIET, QUIET),
    "bfloat16": Format(np.uint16, 0x8000, 0x0080, 0x7F80, 0x0040, 0x40C0,
                       8, True, PAIR, SELECT, SELECT, SELECT, CANONICAL, SIGNED),
    "float16": Format(np.uint16, 0x8000, 0x0400, 0x7C00, 0x0200, 0x4600,
                      0, False, SELECT, SELECT, SELECT, SELECT, QUIET, QUIET),
}


def kinds(n: int, fmt: Format, relu6: bool) -> tuple[int, int, int, int]:
    """``(body_end, body_kind, first_kind, tail_kind)`` for a flat tensor of n values:
    values [0, body_end) are the packet body; the tail's first value (if the tail has
    odd length) is ``first_kind``, the others ``tail_kind``."""
    if fmt.packet == 0:
        return n, fmt.body_relu, fmt.body_relu, fmt.body_relu
    end = n - n % fmt.packet
    if relu6:
        return end, fmt.body_relu, fmt.tail_relu6, fmt.tail_relu6
    first = fmt.tail_first if (n - end) % 2 else fmt.tail_relu
    return end, fmt.body_relu, first, fmt.tail_relu


