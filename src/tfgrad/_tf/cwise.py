"""TF's elementwise binary and unary ops on the CPU: the packet width of Eigen's evaluation
per dtype, and BCast's broadcast shape (shared by tfgrad.ops.cwise and its dispatch)."""

from __future__ import annotations

PACKET = {"float32": 8, "float64": 4, "float16": 8, "bfloat16": 8}
"""Values per AVX packet of TF's Eigen evaluation: a flat tensor's last ``size % packet``
values run Eigen's scalar code (every parallelFor block is whole packets)."""


def broadcast_shape(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...] | None:
    """TF's BCast output shape (numpy's rules), or None where the shapes are incompatible."""
    n = max(len(x), len(y))
    a, b = (1,) * (n - len(x)) + tuple(x), (1,) * (n - len(y)) + tuple(y)
    out = []
    for p, q in zip(a, b):
        if p != q and p != 1 and q != 1:
            return None
        out.append(q if p == 1 else p)
    return tuple(out)
