"""MaxPool and MaxPoolGrad on the compiled kernels (``tfgrad.kernels.max_pool``): flat
contiguous views, the float type's constants, the thread split (output rows for the
forward, images for the gradient: TF's bits either way)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compile import launch
from ..kernels import max_pool as k

Geometry = Any
"""``tfgrad.ops.max_pool.Geometry`` (the layer above: not imported here)."""

_FAMILY = "max_pool"


def _dims(geo: Geometry) -> tuple[int, ...]:
    return (geo.N, geo.H, geo.W, geo.C, geo.KH, geo.KW, geo.sh, geo.sw, geo.OH, geo.OW,
            geo.pt, geo.pl)


def forward(x: np.ndarray, geo: Geometry) -> np.ndarray:
    out = np.empty((geo.N, geo.OH, geo.OW, geo.C), x.dtype)
    if out.size == 0:
        return out
    fi = np.finfo(x.dtype)
    work = out.size * geo.KH * geo.KW
    launch(_FAMILY, k.forward, work, np.ascontiguousarray(x).reshape(-1), out.reshape(-1),
           *_dims(geo), fi.min, fi.tiny, x.dtype.type(0), units=geo.N * geo.OH)
    return out


def grad(x: np.ndarray, g: np.ndarray, geo: Geometry) -> np.ndarray:
    out = np.empty(x.shape, x.dtype)
    if g.size == 0:
        out[...] = 0
        return out
    m = np.empty(geo.N * geo.C, x.dtype)
    a = np.empty(geo.N * geo.C, np.int64)
    work = g.size * geo.KH * geo.KW
    launch(_FAMILY, k.grad, work, np.ascontiguousarray(x).reshape(-1),
           np.ascontiguousarray(g).reshape(-1), out.reshape(-1), m, a, *_dims(geo),
           np.finfo(x.dtype).tiny, x.dtype.type(0), units=geo.N)
    return out
