"""SparseSoftmaxCrossEntropyWithLogits in torch tensor ops, on any device with float64.

TF's kernel step by step (the spec: :mod:`tfgrad.ops.softmax_xent`, TF's behaviours
docs/softmax_xent.md), one torch op per float32 rounding: Eigen's ``pexp`` in float32
ops (no fused multiply-adds), the C library's ``expf`` transcribed in float64 ops
(``tfgrad._tf.expf.glibc_expf``), Eigen's tree for the row sums (four 8-lane
accumulators, packets, a scalar tail, then its horizontal sum; rows over 8192 classes in
its split tree), FTZ / DAZ flushes. ``backprop`` is bit-identical to the exact kernel;
``loss`` takes ``log`` in float64 rounded to float32, which is the C library's ``logf``
but where that one is not correctly rounded (see BOUNDS).

The gradient is TF's ``_SparseSoftmaxCrossEntropyWithLogitsGrad``: ``grad_loss[:, None] *
backprop`` with the op's backprop held constant (one multiply: TF's bits), and for an
incoming gradient of backprop the softmax's Jacobian, here through torch's softmax.
"""

from __future__ import annotations

import numpy as np
import torch

from ..._tf import expf as _e
from ...ops.softmax_xent import check_labels

_F32 = torch.float32
_TINY = float(np.finfo(np.float32).tiny)
_LEAF = 8 * 1024

BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "SparseSoftmaxCrossEntropyWithLogits": {"loss": {"float32": 1},
                                            "backprop": {"float32": 0}},
}

NOTES: dict[str, str] = {
    "SparseSoftmaxCrossEntropyWithLogits": "loss: log in float64 rounded once, not the C "
    "library's logf (which is not always correctly rounded): up to 1 ulp.",
}


def _ftz(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v.abs() < _TINY, v * 0.0, v)


def _c(v: float, like: torch.Tensor) -> torch.Tensor:
    """A float32 constant as a tensor (a host scalar can become a reciprocal multiply)."""
    return torch.tensor(np.float32(v), dtype=_F32, device=like.device)


def _madd(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return _ftz(_ftz(a * b) + c)  # Eigen's pmadd without FMA


def _pexp(x0: torch.Tensor) -> torch.Tensor:
    """Eigen's pexp_float (x0 flushed)."""
    c = lambda v: _c(v, x0)  # noqa: E731
    x = torch.where(x0 > c(_e.EXP_HI), c(_e.EXP_HI), x0)
    m = torch.floor(_madd(x, c(_e.LOG2EF), c(_e.HALF)))
    r = _madd(m, c(_e.C1), x)
    r = _madd(m, c(_e.C2), r)
    r2 = _ftz(r * r)
    p_even = _madd(r2, c(_e.P6), c(_e.P4))
    p_odd = _madd(r2, c(_e.P5), c(_e.P3))
    p_even = _madd(r2, p_even, c(_e.P2))
    p_low = _ftz(r + c(1.0))
    y = _madd(r, p_odd, p_even)
    y = _madd(r2, y, p_low)
    s = torch.ldexp(y.double(), m.double())  # exact: y * 2**m in float64
    out = torch.where(s.abs() < _TINY, torch.zeros_like(s), s).to(_F32)
    out = torch.where(out >= x0, out, x0)  # pmax(ldexp(y, m), x)
    out = torch.where(x0 < c(_e.EXP_LO), torch.zeros_like(out), out)
    return torch.where(torch.isnan(x0), x0, out)


def _expf(x: torch.Tensor) -> torch.Tensor:
    """The C library's expf (tfgrad._tf.expf.glibc_expf), flushed."""
    xd = x.double()
    z = _e.EXPF_INV_LN2_N * xd
    kd = (z + _e.EXPF_SHIFT) - _e.EXPF_SHIFT  # round to an integer, ties to even
    r = z - kd
    k = kd.to(torch.int64)
    scale = torch.tensor(_e.EXPF_SCALE, dtype=torch.float64, device=x.device)
    s = torch.ldexp(scale[torch.remainder(k, _e.EXPF_N)],
                    torch.div(k, _e.EXPF_N, rounding_mode="floor").double())
    y = (_e.EXPF_C[0] * r + _e.EXPF_C[1]) * (r * r) + (_e.EXPF_C[2] * r + 1.0)
    out = _ftz((y * s).to(_F32))
    out = torch.where(x < _c(_e.EXPF_UNDERFLOW, x), torch.zeros_like(out), out)
    return torch.where(torch.isnan(x), x, out)


def _leaf(sh: torch.Tensor) -> torch.Tensor:
    """Eigen's leaf over the columns of sh [rows, n] (n <= 8192): exp of the packets by
    pexp, of the scalar tail by expf; four 8-lane accumulators, packets, tail, predux."""
    n = sh.shape[1]
    n4, n8 = (n // 32) * 32, (n // 8) * 8
    e = torch.cat([_pexp(sh[:, :n8]), _expf(sh[:, n8:])], dim=1)
    acc = torch.zeros(sh.shape[0], 32, dtype=_F32, device=sh.device)
    for j in range(0, n4, 32):
        acc = _ftz(acc + e[:, j:j + 32])
    p = acc[:, 0:8]
    for q in (8, 16, 24):
        p = _ftz(p + acc[:, q:q + 8])
    for j in range(n4, n8, 8):
        p = _ftz(p + e[:, j:j + 8])
    tail = torch.zeros(sh.shape[0], dtype=_F32, device=sh.device)
    for j in range(n8, n):
        tail = _ftz(tail + e[:, j])
    b = _ftz(p[:, :4] + p[:, 4:])
    h = _ftz(_ftz(b[:, 0] + b[:, 2]) + _ftz(b[:, 1] + b[:, 3]))
    return _ftz(tail + h)


def _tree(sh: torch.Tensor, fm: int, off: int, n: int) -> torch.Tensor:
    """Eigen's tree over columns [off, off + n) of rows whose flat start is fm mod 8."""
    if n <= _LEAF:
        return _leaf(sh[:, off:off + n])
    at = 8 * -(-(fm + off + -(-n // 2)) // 8) - fm
    nl = at - off
    left = _ftz(_tree(sh, fm, off, nl) + 0.0)
    return _ftz(left + _tree(sh, fm, at, n - nl))


def _row_sums(sh: torch.Tensor) -> torch.Tensor:
    b, c = sh.shape
    if c <= _LEAF:
        return _leaf(sh)
    out = torch.empty(b, dtype=_F32, device=sh.device)
    rows = torch.arange(b, device=sh.device)
    for fm in range(8):  # rows grouped by where their tree's split points fall
        pick = rows[(rows * c) % 8 == fm]
        if pick.numel():
            out[pick] = _tree(sh[pick], fm, 0, c)
    return out


def _forward(f: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, c = f.shape
    x = _ftz(f)
    mx = x.amax(dim=1, keepdim=True)  # (NaN-propagating: any NaN makes the row NaN)
    sh = _ftz(x - mx)
    sums = _row_sums(sh)
    lab = labels.to(torch.int64)
    valid = (lab >= 0) & (lab < c)
    picked = torch.gather(sh, 1, lab.clamp(0, c - 1)[:, None])[:, 0]
    logs = _ftz(torch.log(sums.double()).to(_F32))
    nan = torch.tensor(float("nan"), dtype=_F32, device=f.device)
    loss = torch.where(valid, _ftz(logs - picked), nan)
    flat = sh.reshape(-1)
    n8 = (flat.numel() // 8) * 8
    e = torch.cat([_pexp(flat[:n8]), _expf(flat[n8:])]).reshape(b, c)
    onehot = (torch.arange(c, device=f.device)[None, :] == lab[:, None]).to(_F32)
    backprop = torch.where(valid[:, None], _ftz(_ftz(e / sums[:, None]) - onehot), nan)
    return loss, backprop


def SparseSoftmaxCrossEntropyWithLogits(*, features: torch.Tensor, labels: torch.Tensor
                                        ) -> tuple[torch.Tensor, torch.Tensor]:
    b, c = features.shape
    if b == 0:
        return (features.new_zeros(0), features.new_zeros(0, c))
    # Labels outside [0, classes): TF's CPU error, checked on the host for plain eager
    # tensors (a sync, as TF's CPU kernel); under tracing (a tensor subclass) NaN rows
    # instead, as TF's generators give on its GPU.
    if type(labels) is torch.Tensor and not torch.compiler.is_compiling():
        check_labels("SparseSoftmaxCrossEntropyWithLogits", labels.cpu().numpy(), c)
    with torch.no_grad():
        loss, backprop = _forward(features.detach(), labels)
    if not features.requires_grad:
        return loss, backprop
    # TF's gradient: grad_loss[:, None] * backprop (the op's bits, constant), and the
    # softmax's Jacobian for an incoming gradient of backprop. Both terms are 0 in value.
    lin = (features * backprop).sum(1)
    loss = loss + torch.where(torch.isfinite(lin.detach()), lin - lin.detach(),
                              torch.zeros_like(lin))
    sm = torch.softmax(features, dim=1)
    backprop = backprop + (sm - sm.detach())
    return loss, backprop
