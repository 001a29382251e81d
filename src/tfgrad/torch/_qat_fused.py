"""tfgrad.torch.qat's fused exact path: a whole forward of :mod:`tfgrad.qat._exec`'s program
as one autograd node in eager mode (:class:`_Fused`), and as one operator of the graph
under ``torch.compile`` (``tfgrad::qat_program`` and ``tfgrad::qat_program_backward``),
the same bits as the layers run one by one."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..qat import _exec


def _own(g: np.ndarray | None, seen: set[int]) -> torch.Tensor | None:
    """A gradient as a tensor no other gradient shares (torch may keep it as .grad and
    add into it)."""
    if g is None:
        return None
    if not g.flags.owndata or id(g) in seen:
        g = g.copy()
    seen.add(id(g))
    return torch.from_numpy(g)


def gradients(tape: _exec.Tape, out_slots: Sequence[int], grads: Sequence[Any],
              wanted: Sequence[int | None]) -> list[torch.Tensor | None]:
    """TF's gradients of the slots in ``wanted`` (None: not wanted) from the outputs'
    ``grads`` (tensors, or None), each a tensor of its own."""
    given = {s: np.ascontiguousarray(g.detach().numpy(), np.float32)
             for s, g in zip(out_slots, grads) if g is not None}
    g = tape.backward(given)
    seen: set[int] = set()
    return [_own(g[s], seen) if s is not None else None for s in wanted]


def as_tensors(outs: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """The program's outputs as tensors, never an input's memory."""
    return [torch.from_numpy(o.copy() if any(np.may_share_memory(o, x) for x in inputs)
                             else o) for o in outs]


class _Fused(torch.autograd.Function):
    """A whole forward of the exact path as one autograd node (tfgrad.qat._exec).

    The tape lives as long as torch keeps the node's saved tensors: an empty tensor saved
    for the backward holds it, and torch frees that after the backward (a second backward
    is then torch's own error) or keeps it under ``retain_graph`` (a second backward
    replays the tape, as the layers' nodes would)."""

    @staticmethod
    def forward(ctx: Any, run: Any, n_in: int, *tensors: torch.Tensor) -> Any:
        outs, tape, slots, keys = run(tensors)
        box = [tape]
        holder = torch.empty(0)
        weakref.finalize(holder, box.clear)  # (the box, not ctx: no cycle through the node)
        ctx.save_for_backward(holder)
        ctx.box, ctx.slots, ctx.keys, ctx.n_in = box, slots, keys, n_in
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grads: Any) -> Any:
        _ = ctx.saved_tensors  # (torch's error where the graph was freed by a backward)
        n_in, slots = ctx.n_in, ctx.slots
        want = ctx.needs_input_grad[2:]
        result = gradients(ctx.box[0], slots[n_in:], grads,
                           [s if w else None for s, w in zip([*slots[:n_in], *ctx.keys], want)])
        return (None, None, *result)


class Bound:
    """``KerasModel._bind``'s walk, kept for the next fused forwards while
    :meth:`holds`: every layer and quantizer is the same module, with the same training
    flag and no hooks, and every tensor the same object on the same memory, dtype, shape,
    strides and ``requires_grad`` (an optimizer's in-place updates keep all of them;
    ``.to()``, ``.data =``, ``requires_grad_``, ``train()`` or a replaced parameter do
    not). The program reads the same :class:`~tfgrad.qat._exec.State` then."""

    __slots__ = ("state", "params", "keys", "modules", "tensors", "walk")

    def __init__(self, state: _exec.State, params: list[torch.Tensor],
                 keys: list[tuple[str, str]], modules: list[tuple[nn.Module, bool]],
                 tensors: list[tuple[dict, str, torch.Tensor, int, Any, tuple, tuple,
                                     bool]],
                 walk: list[tuple[dict, str, nn.Module]]) -> None:
        self.state, self.params, self.keys = state, params, keys
        self.modules, self.tensors, self.walk = modules, tensors, walk

    def holds(self) -> bool:
        for owner, key, module in self.walk:
            if owner.get(key) is not module:
                return False
        for m, training in self.modules:
            if m.training is not training or hooked(m):
                return False
        for owner, attr, t, ptr, dtype, shape, stride, rg in self.tensors:
            if (owner.get(attr) is not t or t.data_ptr() != ptr or t.dtype is not dtype
                    or t.shape != shape or t.stride() != stride or t.requires_grad is not rg):
                return False
        return True


def global_hooks() -> bool:
    m = nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks
                or m._global_backward_hooks or m._global_backward_pre_hooks)


def hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


MODELS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
"""The models by id: the compiled operator's first argument names its model."""
TAPES = _exec.Tapes(keep=64)
"""The compiled forwards' tapes: each dropped when its token tensor is (freed with the
graph that saved it for the backward, after the backward unless ``retain_graph``); at
most 64 (several forwards before one backward: gradient accumulation)."""


def token(entry: Any) -> torch.Tensor:
    """A tensor naming ``entry`` (a tape, its output slots and leaf slots) in
    :data:`TAPES`, which drops the entry when the tensor goes (with the graph that saved
    it for the backward); 0 for no entry (no gradient wanted)."""
    if entry is None:
        return torch.zeros(1, dtype=torch.int64)
    key = TAPES.put(entry)
    held = torch.tensor([key], dtype=torch.int64)
    weakref.finalize(held, TAPES.take, key)
    return held


def _model(key: int) -> Any:
    m = MODELS.get(key)
    if m is None:
        raise RuntimeError("tfgrad.torch.qat: the model of this compiled graph is gone")
    return m


@torch.library.custom_op("tfgrad::qat_program", mutates_args=(), schema=(
    "(int model, Tensor[] xs, Tensor[] params, Tensor[] state, bool[] need, bool grad) "
    "-> Tensor[]"))
def program_op(model: int, xs: list[torch.Tensor], params: list[torch.Tensor],
                state: list[torch.Tensor], need: list[bool], grad: bool
                ) -> list[torch.Tensor]:
    """A whole forward of the exact path in a compiled graph (``KerasModel._compiled``):
    the outputs, a token naming the tape its backward takes, the new state (ranges and
    moving statistics, which the graph copies into the buffers)."""
    return _model(model)._run_lists(xs, params, state, need, grad)


@program_op.register_fake
def _(model: int, xs: list[torch.Tensor], params: list[torch.Tensor],
      state: list[torch.Tensor], need: list[bool], grad: bool) -> list[torch.Tensor]:
    n = xs[0].shape[0]
    outs = [xs[0].new_empty((n, *shape[1:])) for shape in _model(model)._output_shapes]
    return [*outs, xs[0].new_empty((1,), dtype=torch.int64),
            *(torch.empty_like(t) for t in state)]


@torch.library.custom_op("tfgrad::qat_program_backward", mutates_args=(), schema=(
    "(int model, Tensor token, Tensor?[] grads, Tensor[] xs, Tensor[] params, bool[] need) "
    "-> Tensor[]"))
def _program_backward_op(model: int, token: torch.Tensor, grads: list[torch.Tensor | None],
                         xs: list[torch.Tensor], params: list[torch.Tensor], need: list[bool]
                         ) -> list[torch.Tensor]:
    """TF's gradient of a :func:`_program_op` forward, of each input and parameter in
    ``need`` (in order)."""
    entry = TAPES.get(int(token.reshape(-1)[0]))  # (dropped with the token: retain_graph)
    if entry is None:
        raise RuntimeError(
            "tfgrad.torch.qat: the compiled forward's tape is gone (more than "
            f"{TAPES.keep} forwards ran since); run the forward again")
    tape, slots, leaf_slots = entry
    n_x = len(xs)
    wanted = [(slots[i] if i < n_x else leaf_slots[i - n_x]) if w else None
              for i, w in enumerate(need)]
    got = gradients(tape, slots[n_x:], grads, wanted)
    return [torch.zeros_like(t) if v is None else v
            for t, v, w in zip([*xs, *params], got, need) if w]


@_program_backward_op.register_fake
def _(model: int, token: torch.Tensor, grads: list[torch.Tensor | None],
      xs: list[torch.Tensor], params: list[torch.Tensor], need: list[bool]
      ) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t, wanted in zip([*xs, *params], need) if wanted]


def _program_setup(ctx: Any, inputs: tuple, output: list[torch.Tensor]) -> None:
    model, xs, params, state, need, _ = inputs
    ctx.model, ctx.need, ctx.n_x = model, need, len(xs)
    ctx.n_state, ctx.n_out = len(state), len(output) - 1 - len(state)
    ctx.save_for_backward(output[ctx.n_out], *xs, *params)


def _program_backward(ctx: Any, grads: list[torch.Tensor | None]) -> tuple:
    token, *rest = ctx.saved_tensors
    xs, params = rest[:ctx.n_x], rest[ctx.n_x:]
    got = iter(_program_backward_op(ctx.model, token, list(grads[:ctx.n_out]), xs, params,
                                    ctx.need))
    gx: list[torch.Tensor | None] = [None] * len(xs)
    gp: list[torch.Tensor | None] = [None] * len(params)
    for i, wanted in enumerate(ctx.need):
        if wanted:
            if i < len(xs):
                gx[i] = next(got)
            else:
                gp[i - len(xs)] = next(got)
    return None, gx, gp, [None] * ctx.n_state, None, None


program_op.register_autograd(_program_backward, setup_context=_program_setup)
