"""SparseSoftmaxCrossEntropyWithLogits in jax.numpy, jittable on any backend.

TF's kernel step by step (the spec: :mod:`tfgrad.ops.softmax_xent`, TF's behaviours
docs/softmax_xent.md): Eigen's ``pexp`` in float32 ops, each product rounded before its
add (``_r``: XLA would contract them into FMAs), Eigen's tree for the row sums, FTZ / DAZ
flushes. The values TF takes through the C library's ``expf`` / ``logf`` (the scalar
tails: the last ``classes % 8`` of each row's sum, the last ``(batch * classes) % 8`` of
backprop; the loss's log) use XLA's ``exp`` / ``log`` in float32 (JAX's default has no
float64 for glibc's algorithm): a unit in the last place off now and then (BOUNDS).

The gradient is TF's ``_SparseSoftmaxCrossEntropyWithLogitsGrad``: ``grad_loss[:, None] *
backprop`` with this backprop held constant, and for an incoming gradient of backprop the
softmax's Jacobian through ``jax.nn.softmax``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..._tf import expf as _e

_F32 = jnp.float32
_TINY = np.float32(np.finfo(np.float32).tiny)
_NAN = np.float32(np.nan)
_LEAF = 8 * 1024

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "SparseSoftmaxCrossEntropyWithLogits": {"loss": {"float32": 2},
                                            "backprop": {"float32": 2}},
}

NOTES: dict[str, str] = {
    "SparseSoftmaxCrossEntropyWithLogits": "The values TF computes with the C library's "
    "expf / logf (scalar tails, the loss's log) use XLA's exp / log: up to 2 ulps.",
}

Array = Any


def _ftz(v: Array) -> Array:
    return jnp.where(jnp.abs(v) < _TINY, v * np.float32(0), v)


def _r(v: Array) -> Array:
    """v rounded once: a select XLA cannot fold keeps it out of an FMA."""
    return jnp.where(jnp.isnan(v), _NAN, v)


def _madd(a: Array, b: Any, c: Any) -> Array:
    return _ftz(_r(_ftz(_r(a * b))) + c)


def _pexp(x0: Array) -> Array:
    x = jnp.where(x0 > _e.EXP_HI, _e.EXP_HI, x0)
    m = jnp.floor(_madd(x, _e.LOG2EF, _e.HALF))
    r = _madd(m, _e.C1, x)
    r = _madd(m, _e.C2, r)
    r2 = _ftz(_r(r * r))
    p_even = _madd(r2, _e.P6, _e.P4)
    p_odd = _madd(r2, _e.P5, _e.P3)
    p_even = _madd(r2, p_even, _e.P2)
    p_low = _ftz(r + np.float32(1))
    y = _madd(r, p_odd, p_even)
    y = _madd(r2, y, p_low)
    # y * 2**m exactly where it is a normal float32 (m + 127 in [1, 254] after the split),
    # zero below (FTZ); in two exact steps so that no factor over- or underflows.
    mi = m.astype(jnp.int32)
    h = jnp.clip(mi // 2, -126, 127)
    s = _r(_r(y * jnp.ldexp(np.float32(1), h)) * jnp.ldexp(np.float32(1), mi - h))
    s = jnp.where(jnp.abs(s) < _TINY, np.float32(0), s)
    out = jnp.where(s >= x0, s, x0)
    out = jnp.where(x0 < _e.EXP_LO, np.float32(0), out)
    return jnp.where(jnp.isnan(x0), x0, out)


def _expf(x: Array) -> Array:
    return _ftz(jnp.exp(x))


def _leaf(sh: Array) -> Array:
    n = sh.shape[1]
    n4, n8 = (n // 32) * 32, (n // 8) * 8
    e = jnp.concatenate([_pexp(sh[:, :n8]), _expf(sh[:, n8:])], axis=1)
    acc = jnp.zeros((sh.shape[0], 32), _F32)
    if n4:  # the accumulators' loop, rolled: steps of 32 columns
        steps = e[:, :n4].reshape(sh.shape[0], n4 // 32, 32).transpose(1, 0, 2)
        acc = jax.lax.fori_loop(0, n4 // 32, lambda j, a: _ftz(a + steps[j]), acc)
    p = acc[:, 0:8]
    for q in (8, 16, 24):
        p = _ftz(p + acc[:, q:q + 8])
    for j in range(n4, n8, 8):
        p = _ftz(p + e[:, j:j + 8])
    tail = jnp.zeros(sh.shape[0], _F32)
    for j in range(n8, n):
        tail = _ftz(tail + e[:, j])
    b = _ftz(p[:, :4] + p[:, 4:])
    h = _ftz(_ftz(b[:, 0] + b[:, 2]) + _ftz(b[:, 1] + b[:, 3]))
    return _ftz(tail + h)


def _tree(sh: Array, fm: int, off: int, n: int) -> Array:
    if n <= _LEAF:
        return _leaf(sh[:, off:off + n])
    at = 8 * -(-(fm + off + -(-n // 2)) // 8) - fm
    nl = at - off
    left = _ftz(_tree(sh, fm, off, nl) + np.float32(0))
    return _ftz(left + _tree(sh, fm, at, n - nl))


def _row_sums(sh: Array) -> Array:
    b, c = sh.shape
    if c <= _LEAF:
        return _leaf(sh)
    out = jnp.zeros(b, _F32)
    rows = np.arange(b)
    for fm in range(8):
        pick = rows[(rows * c) % 8 == fm]
        if pick.size:
            out = out.at[pick].set(_tree(sh[pick], fm, 0, c))
    return out


def _forward(f: Array, labels: Array) -> tuple[Array, Array]:
    b, c = f.shape
    x = _ftz(f)
    mx = jnp.max(x, axis=1, keepdims=True)  # (NaN-propagating)
    sh = _ftz(x - mx)
    sums = _row_sums(sh)
    lab = labels.astype(jnp.int32)
    valid = (lab >= 0) & (lab < c)  # else NaN rows, as TF's generators (its GPU kernel)
    picked = jnp.take_along_axis(sh, jnp.clip(lab, 0, c - 1)[:, None], axis=1)[:, 0]
    loss = jnp.where(valid, _ftz(_ftz(jnp.log(sums)) - picked), _NAN)
    flat = sh.reshape(-1)
    n8 = (flat.size // 8) * 8
    e = jnp.concatenate([_pexp(flat[:n8]), _expf(flat[n8:])]).reshape(b, c)
    onehot = (jnp.arange(c)[None, :] == lab[:, None]).astype(_F32)
    backprop = jnp.where(valid[:, None], _ftz(_ftz(e / sums[:, None]) - onehot), _NAN)
    return loss, backprop


def SparseSoftmaxCrossEntropyWithLogits(*, features: Array, labels: Array,
                                        primal_outputs: tuple[Array, ...] | None = None
                                        ) -> tuple[Array, Array]:
    """``primal_outputs``: the op's own (loss, backprop) when differentiated (the adapter
    passes them): TF's gradient multiplies by the forward's backprop output, so the linear
    term takes those bits (TF's, under the exact implementation) rather than this code's."""
    features = jnp.asarray(features)
    b, c = features.shape
    if b == 0:
        return jnp.zeros(0, _F32), jnp.zeros((0, c), _F32)
    # (labels outside [0, classes): NaN rows; on the host TF's error is raised before)
    loss, backprop = _forward(jax.lax.stop_gradient(features), labels)
    if primal_outputs is not None:
        backprop = primal_outputs[1]
    bp = jax.lax.stop_gradient(backprop)
    lin = jnp.sum(features * bp, axis=1)
    lin0 = jax.lax.stop_gradient(lin)
    loss = loss + jnp.where(jnp.isfinite(lin0), lin - lin0, np.float32(0))
    sm = jax.nn.softmax(features, axis=1)
    backprop = bp + (sm - jax.lax.stop_gradient(sm))
    return loss, backprop
