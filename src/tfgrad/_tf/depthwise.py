"""Depthwise convolution's geometry, as TF computes it, and the rule for TF's explicitly
dilated filter: what the NumPy reference (``tfgrad.ops.depthwise_conv``) and the kernels
(``tfgrad.kernels.depthwise_conv``, which compile :func:`gap_turns_plus`) share.

Numba keys a cached kernel on its own file only: after editing :func:`gap_turns_plus`,
clear the kernels' ``__pycache__``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._errors import InvalidArgumentError


@dataclass(frozen=True)
class Geometry:
    """Shapes and window parameters of one depthwise convolution (NHWC order)."""

    N: int
    H: int
    W: int
    C: int
    M: int
    fh: int
    fw: int
    oh: int
    ow: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    """Padding before the first row (top)."""
    pl: int
    """Padding before the first column (left)."""


def window(op: str, n: int, f: int, s: int, d: int, padding: str,
           pads: tuple[int, int]) -> tuple[int, int]:
    """(output size, padding before) along one spatial dim, as TF's
    GetWindowedOutputSizeVerbose (C++ division truncates toward zero)."""
    fe = (f - 1) * d + 1 if f > 0 else 0
    if fe > 2**63 - 1:  # (TF's own window arithmetic is int64, as the kernels')
        raise InvalidArgumentError(
            f"{op}: effective filter size (filter_size - 1) * dilation + 1 = {fe} does not "
            f"fit in int64 [filter_size: {f}, dilation: {d}]")
    if padding == "SAME":
        o = (n + s - 1) // s
        need = max(0, (o - 1) * s + fe - n)
        return o, need // 2
    pb, pa = pads if padding == "EXPLICIT" else (0, 0)
    num = n + pb + pa - fe + s
    o = abs(num) // s * (1 if num >= 0 else -1)
    if o < 0:
        raise InvalidArgumentError(
            f"{op}: Computed output size would be negative: {o} [input_size: {n}, "
            f"effective_filter_size: {fe}, stride: {s}]")
    return o, pb


def gap_turns_plus(a, n, ch, p0, q0, sgn, r, c, fh, fw, dh, dw, sp, sq):  # type: ignore[no-untyped-def]  # noqa: E501
    """Whether the inserted zeros of TF's explicitly dilated filter between real tap (r, c)
    and the next one in row-major order turn a -0 sum into +0 (the kernels compile this
    function too).

    Tap (r, c) reads position (p0 + sgn * r * dh, q0 + sgn * c * dw): sgn = +1 for the
    forward (positions in x), -1 for BackpropInput (positions in out_backprop's
    zero-filled, stride-spread grid). An inserted tap adds 0 * v, nothing for a
    non-finite v (the dilated convolution has no such tap). 0 * v is +0 exactly when v
    is finite without a sign bit, and a +0 added to a -0 sum makes it +0 (adding a zero
    changes nothing else). Position (p, q) reads v = a[n, p / sp, q / sq, ch] when sp
    divides p, sq divides q and the element exists, else 0: the padding, or a
    position between out_backprop's strides. So the answer needs no loop over the gap's
    taps, which a huge dilation would make endless: a gap that reaches a 0 turns the sum
    +0, and one that does not lies inside ``a`` and is scanned."""
    if c + 1 < fw:  # the columns between taps c and c + 1 of filter row r
        if dw == 1:
            return False
        pa = pb = p0 + sgn * r * dh
        qa, qb = q0 + sgn * (c * dw + 1), q0 + sgn * ((c + 1) * dw - 1)
    elif r + 1 < fh:  # the rows between filter rows r and r + 1, every column
        if dh == 1:
            return False
        pa, pb = p0 + sgn * (r * dh + 1), p0 + sgn * ((r + 1) * dh - 1)
        qa, qb = q0, q0 + sgn * (fw - 1) * dw
    else:
        return False
    p1, p2, q1, q2 = min(pa, pb), max(pa, pb), min(qa, qb), max(qa, qb)
    if (sp > 1 and p2 > p1) or (sq > 1 and q2 > q1) or p1 % sp != 0 or q1 % sq != 0:
        return True  # a position between two strides
    r1, r2, c1, c2 = p1 // sp, p2 // sp, q1 // sq, q2 // sq
    if r1 < 0 or c1 < 0 or r2 >= a.shape[1] or c2 >= a.shape[2]:
        return True  # the padding
    for i in range(r1, r2 + 1):
        for j in range(c1, c2 + 1):
            v = a[n, i, j, ch]
            if np.isfinite(v) and not np.signbit(v):
                return True
    return False
