"""Softmax in jax.numpy, jittable on any backend: TF's order (max, shifted, exp, row sum,
reciprocal, one multiply) with XLA's exp and sum: a few ulps from TF (BOUNDS); the exact
path is ``tfgrad.ops.softmax``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_TINY = np.float32(np.finfo(np.float32).tiny)

BOUNDS: dict[str, dict[str, dict[str, float]]] = {"Softmax": {"softmax": {"float32": 8}}}

NOTES: dict[str, str] = {
    "Softmax": "XLA's exp and sum order, and an exact reciprocal where TF uses rcpps and "
    "a Newton step: a few ulps.",
}


def _ftz(v: jax.Array) -> jax.Array:
    return jnp.where(jnp.abs(v) < _TINY, jnp.zeros_like(v), v)


def Softmax(*, logits: jax.Array) -> jax.Array:
    if logits.size == 0:
        return jnp.zeros(logits.shape, jnp.float32)
    x = _ftz(logits)
    mx = jnp.max(x, axis=-1, keepdims=True)
    e = _ftz(jnp.exp(_ftz(x - mx)))
    s = jnp.sum(e, axis=-1, keepdims=True)
    return _ftz(e * (np.float32(1) / s))
