"""FractionalMaxPool, FractionalAvgPool and their gradients in torch tensor ops, any device.

The semantics are those of :mod:`tfgrad.ops.fractional_pool` (TF 2.21's CPU kernels).

Host work (small, documented reads): the forward ops draw their pooling sequences on the
host with tfgrad's own Philox code (``_seeds`` and ``pooling_sequences``: the same seeds
rule and bits as the NumPy op) and return them as int64 tensors on the value's device; the
gradients read their sequences to the host for the NumPy op's value checks, and
FractionalMaxPoolGrad reads one bool, whether ``orig_output`` is the max pooling of
``orig_input`` (TF's ``tensor_out_dup`` check). Cell bounds and gather indices are built
on the host from the sequences (O(H + W) values).

Device work, every step TF's operation for operation:

- forward: each cell's taps are gathered in row-major order over a fixed window (the
  largest cell), those past the cell's clamped end masked; the max is ``acc < v ? v : acc``
  from T's lowest value (NaN never wins, the earlier of equal values stays), the average
  sums in T from +0 in that order and divides by the count in T (integers truncate toward
  zero; integer sums wrap).
- MaxGrad replays the forward from each cell's first element (TF's argmax: the first
  maximum in row-major order; a NaN first stays), checks the replayed maxima against
  ``orig_output``, then each input element *gathers* the ``out_backprop`` of the (at most
  2 x 2) cells whose argmax it is, adding them in T in output row-major order from +0.
- AvgGrad: each input element gathers ``double(g) / count`` of its (at most 2 x 2) cells,
  adds them in float64 from +0.0 in output row-major order, and rounds once to T (integers
  truncate; values outside T's range become T's minimum, as x86's conversion gives TF).
  Plain tensor ops: differentiable by autograd (its adjoint averages over the same cells).

No scatter: every output element is written once, in TF's order, so the results do not
depend on the device or on atomics. AvgGrad needs float64 on the device (not on MPS).
TF's floating-point environment (FTZ and DAZ) is applied explicitly: denormal inputs read
as zeros of their sign, denormal results become zeros.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...ops import fractional_pool as _fp

# op -> output -> dtype -> largest distance allowed from tfgrad's CPU kernels (0: bit-identical)
# Every output is bit-identical: the same operations in the same order, x86 FTZ / DAZ
# applied explicitly (measured over the case table, fresh inputs and denormal inputs).
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    op: {out: {dt: 0.0 for dt in ("float32", "float64", "int32", "int64")} for out in outs}
    for op, outs in (
        ("FractionalMaxPool", ("output", "row_pooling_sequence", "col_pooling_sequence")),
        ("FractionalAvgPool", ("output", "row_pooling_sequence", "col_pooling_sequence")),
        ("FractionalMaxPoolGrad", ("output",)),
        ("FractionalAvgPoolGrad", ("output",)),
    )
}

NOTES: dict[str, str] = {}

_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int32: np.int32,
              torch.int64: np.int64}


def _ftz(v: torch.Tensor) -> torch.Tensor:
    """x86 FTZ / DAZ: a denormal becomes a zero of its sign (floats only)."""
    if not v.is_floating_point():
        return v
    return torch.where(v.abs() < torch.finfo(v.dtype).tiny, v * 0, v)


def _lowest(dtype: torch.dtype) -> Any:
    """Eigen::NumTraits<T>::lowest() (float32: -3.4028235e38, not -inf)."""
    return (torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)).min


def _host(seq: torch.Tensor) -> np.ndarray:
    """A small host copy of a pooling sequence (the one device -> host read per sequence)."""
    try:
        return seq.detach().cpu().numpy()
    except RuntimeError:  # a traced tensor (FakeTensor, FunctionalTensor) has no values
        raise RuntimeError(
            "tfgrad.torch: the portable fractional pooling reads its pooling sequences on "
            "the host, so it cannot be traced: torch.compile / torch.export of a second "
            "derivative through fractional average pooling is not supported (first "
            "derivatives are: the gradient operator is opaque to the compiler)") from None


def _taps(seq: np.ndarray, m: int, n: int, overlapping: bool,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tap indices of a fixed window per cell: (clamped index [m, k], in cell [m, k], cell
    size [m]), k the largest cell size."""
    s, e = _fp.cell_bounds(seq, m, n, overlapping)
    k = int((e - s).max()) + 1
    t = s[:, None] + np.arange(k)[None, :]
    idx = np.minimum(t, n - 1)
    return (torch.from_numpy(idx).to(device), torch.from_numpy(t <= e[:, None]).to(device),
            torch.from_numpy(e - s + 1).to(device))


def _owners(seq: np.ndarray, m: int, n: int, overlapping: bool,
            device: torch.device) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """For each position 0..n-1 the (at most) two cells holding it, earlier cell first:
    (clamped cell index, holds) pairs. The later is the last cell starting at or before
    the position; the earlier is the one before (it holds the position only when cells
    overlap and the position is the later cell's start)."""
    s, e = _fp.cell_bounds(seq, m, n, overlapping)
    pos = np.arange(n)
    last = np.searchsorted(s, pos, side="right") - 1
    out = []
    for c in (last - 1, last):
        ci = np.clip(c, 0, m - 1)
        holds = (c >= 0) & (s[ci] <= pos) & (pos <= e[ci])
        out.append((torch.from_numpy(ci).to(device), torch.from_numpy(holds).to(device)))
    return tuple(out)


def _gather2(a: torch.Tensor, r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a[:, r][:, :, c] for an NHWC-like tensor."""
    return a.index_select(1, r).index_select(2, c)


def _mask(r_ok: torch.Tensor, c_ok: torch.Tensor) -> torch.Tensor:
    return (r_ok[:, None] & c_ok[None, :])[None, :, :, None]


# --------------------------------------------------------------------------------------
# Forward ops
# --------------------------------------------------------------------------------------
def _forward(op: str, value: torch.Tensor, pooling_ratio: tuple[float, ...], pseudo_random: bool,
             overlapping: bool, deterministic: bool, seed: int,
             seed2: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shape = tuple(int(d) for d in value.shape)
    _, mr, mc, _ = _fp.output_shape(shape, tuple(pooling_ratio))
    s, s2 = _fp.seeds(op, np.dtype(_NP_DTYPES[value.dtype]), tuple(pooling_ratio),
                       pseudo_random, overlapping, deterministic, seed, seed2)
    rows, cols = _fp.pooling_sequences(shape, tuple(pooling_ratio), pseudo_random, s, s2)
    dev = value.device
    ri, rv, rn = _taps(rows, mr, shape[1], overlapping, dev)
    ci, cv, cn = _taps(cols, mc, shape[2], overlapping, dev)
    is_max = op == "FractionalMaxPool"
    x = _ftz(value)  # DAZ; TF's max instruction also returns a denormal as a zero
    acc = torch.full((shape[0], mr, mc, shape[3]), _lowest(x.dtype) if is_max else 0,
                     dtype=x.dtype, device=dev)
    for a in range(ri.shape[1]):  # taps in row-major order
        xr = x.index_select(1, ri[:, a])
        for b in range(ci.shape[1]):
            v = xr.index_select(2, ci[:, b])
            ok = _mask(rv[:, a], cv[:, b])
            if is_max:
                acc = torch.where(ok & (acc < v), v, acc)  # NaN never wins; ties keep the first
            else:
                acc = torch.where(ok, _ftz(acc + v), acc)  # the sum in T; integers wrap
    if not is_max:
        count = (rn[:, None] * cn[None, :]).to(x.dtype)[None, :, :, None]
        if x.is_floating_point():
            acc = _ftz(acc / count)
        else:  # C++ integer division truncates toward zero
            acc = torch.div(acc, count, rounding_mode="trunc")
    return acc, torch.from_numpy(rows).to(dev), torch.from_numpy(cols).to(dev)


def FractionalMaxPool(value: torch.Tensor, pooling_ratio: tuple[float, ...],
                      pseudo_random: bool, overlapping: bool, deterministic: bool, seed: int,
                      seed2: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward("FractionalMaxPool", value, pooling_ratio, pseudo_random, overlapping,
                    deterministic, seed, seed2)


def FractionalAvgPool(value: torch.Tensor, pooling_ratio: tuple[float, ...],
                      pseudo_random: bool, overlapping: bool, deterministic: bool, seed: int,
                      seed2: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward("FractionalAvgPool", value, pooling_ratio, pseudo_random, overlapping,
                    deterministic, seed, seed2)


# --------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------
def FractionalAvgPoolGrad(orig_input_tensor_shape: tuple[int, ...], out_backprop: torch.Tensor,
                          row_pooling_sequence: torch.Tensor, col_pooling_sequence: torch.Tensor,
                          overlapping: bool) -> torch.Tensor:
    op = "FractionalAvgPoolGrad"
    nb, h, w, c = (int(d) for d in orig_input_tensor_shape)
    g = out_backprop
    _, mr, mc, _ = g.shape
    rows, cols = _host(row_pooling_sequence), _host(col_pooling_sequence)
    _fp.check_gradient_sequences(op, rows, cols, h, w, mr, mc, overlapping)
    dev = g.device
    _, _, rn = _taps(rows, mr, h, overlapping, dev)
    _, _, cn = _taps(cols, mc, w, overlapping, dev)
    count = (rn[:, None] * cn[None, :]).to(torch.float64)[None, :, :, None]
    share = _ftz(_ftz(g).to(torch.float64) / count)
    acc = torch.zeros((nb, h, w, c), dtype=torch.float64, device=dev)  # +0.0, as TF's
    for r, r_ok in _owners(rows, mr, h, overlapping, dev):  # output row-major order
        for cc, c_ok in _owners(cols, mc, w, overlapping, dev):
            acc = torch.where(_mask(r_ok, c_ok), _ftz(acc + _gather2(share, r, cc)), acc)
    if g.dtype == torch.float32:
        out = acc.to(torch.float32)
        # x86 FTZ flushes what rounds to a denormal *before* the exponent is bounded:
        # below tiny - 2**-151 (ties go to tiny).
        flush = acc.abs() < float(np.finfo(np.float32).tiny) * (1 - 2.0**-25)
        return torch.where(flush, out * 0, out)
    if g.dtype == torch.float64:
        return acc
    bits = torch.iinfo(g.dtype).bits
    lo, hi = -(2.0 ** (bits - 1)), 2.0 ** (bits - 1)
    ok = (acc >= lo) & (acc < hi)
    # static_cast<T>(double) truncates; out of range, x86 gives T's minimum
    return torch.where(ok, torch.where(ok, acc, 0.0).trunc(), lo).to(g.dtype)


def FractionalMaxPoolGrad(orig_input: torch.Tensor, orig_output: torch.Tensor,
                          out_backprop: torch.Tensor, row_pooling_sequence: torch.Tensor,
                          col_pooling_sequence: torch.Tensor, overlapping: bool) -> torch.Tensor:
    op = "FractionalMaxPoolGrad"
    x, y, g = orig_input, orig_output, out_backprop
    _, h, w, _ = x.shape
    _, mr, mc, _ = y.shape
    rows, cols = _host(row_pooling_sequence), _host(col_pooling_sequence)
    _fp.check_gradient_sequences(op, rows, cols, h, w, mr, mc, overlapping)
    dev = x.device
    ri, rv, _ = _taps(rows, mr, h, overlapping, dev)
    ci, cv, _ = _taps(cols, mc, w, overlapping, dev)
    xf = _ftz(x)  # TF's replay compares under DAZ
    # TF's replay: best = the cell's first element, then best = v where best < v.
    best = _gather2(xf, ri[:, 0], ci[:, 0])
    arg = (ri[:, 0, None] * w + ci[None, :, 0])[None, :, :, None].expand_as(best)
    for a in range(ri.shape[1]):
        xr = xf.index_select(1, ri[:, a])
        for b in range(ci.shape[1]):
            v = xr.index_select(2, ci[:, b])
            better = _mask(rv[:, a], cv[:, b]) & (best < v)
            best = torch.where(better, v, best)
            arg = torch.where(better, (ri[:, a, None] * w + ci[None, :, b])[None, :, :, None],
                              arg)
    if not bool((best == _ftz(y)).all()):  # one bool read to the host
        raise _fp.max_grad_mismatch(op)
    gf = _ftz(g)  # DAZ on the added gradients
    flat = (torch.arange(h, device=dev)[:, None] * w
            + torch.arange(w, device=dev)[None, :])[None, :, :, None]
    out = torch.zeros_like(x)  # +0, as TF's setZero
    for r, r_ok in _owners(rows, mr, h, overlapping, dev):  # output row-major order
        for cc, c_ok in _owners(cols, mc, w, overlapping, dev):
            hit = _mask(r_ok, c_ok) & (_gather2(arg, r, cc) == flat)
            out = torch.where(hit, _ftz(out + _gather2(gf, r, cc)), out)
    return out
