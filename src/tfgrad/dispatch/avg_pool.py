"""AvgPool and AvgPoolGrad on the compiled kernels (``tfgrad.kernels.avg_pool``):
contiguous inputs, one task per (image, row). ``geo`` is ``tfgrad.ops.avg_pool.Geometry``;
the counts and coefficients in T come from there too (TF's arithmetic is the ops')."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels import avg_pool as k
from ..kernels._pool import launch
from ..kernels._simd import aligned_empty

_FAMILY = "avg_pool"


def _dims(geo: Any) -> tuple[int, ...]:
    return (geo.N, geo.H, geo.W, geo.C, geo.OH, geo.OW, geo.KH, geo.KW, geo.SH, geo.SW,
            geo.PT, geo.PL)


def forward(x: np.ndarray, geo: Any, counts: np.ndarray) -> np.ndarray:
    out = aligned_empty((geo.N, geo.OH, geo.OW, geo.C), x.dtype)  # (as TF's tensors)
    work = x.size + out.size * geo.KH * geo.KW
    launch(_FAMILY, k.forward, work, np.ascontiguousarray(x).reshape(-1), out.reshape(-1),
           np.ascontiguousarray(counts).reshape(-1), *_dims(geo), units=geo.N * geo.OH)
    return out


def grad(g: np.ndarray, geo: Any, coeff: np.ndarray) -> np.ndarray:
    dx = aligned_empty((geo.N, geo.H, geo.W, geo.C), g.dtype)
    work = dx.size + g.size * geo.KH * geo.KW
    launch(_FAMILY, k.grad, work, np.ascontiguousarray(g).reshape(-1), dx.reshape(-1),
           np.ascontiguousarray(coeff).reshape(-1), *_dims(geo), units=geo.N * geo.H)
    return dx
