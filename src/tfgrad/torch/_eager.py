"""Eager calls of tfgrad's torch operators on CPU tensors, around the dispatcher (see the
comment below), and ``invoke``: an operator call that takes them where it may."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad

from .. import _api, _gradients
from .._opdefs import OPS, OpDef
from . import _ops
from ._ops import (
    _ALLOWED,
    NAMESPACE,
    OPERATORS,
    _autograd,
    _Binder,
    _fresh,
    _seed_attrs,
    takes_seeds,
    to_numpy,
)

# --------------------------------------------------------------------------------------
# Eager calls on CPU tensors, around the dispatcher
# --------------------------------------------------------------------------------------
# torch.library's custom operators cost tens of microseconds a call in Python (argument
# parsing, the autograd and backend wrappers, an autograd.Function that binds its
# arguments per call), more than a small op's kernel. Eager calls whose every tensor is a
# plain dense CPU tensor and whose attrs are plain Python values of the schema's types,
# made where nothing observes or transforms the operators (no torch.compile or tracing,
# no functorch transform, no dispatch or torch-function mode, no autocast, no profiler,
# no forward AD, not use_impl("portable")), run the exact kernels directly: the same
# checks (tfgrad.raw_ops'), the same outputs (fresh tensors), the same autograd node (an
# autograd.Function of the same name with the operator's setup_context and backward).
# Every other call, and every call this path cannot prove valid for the dispatcher (it
# then raises the dispatcher's own error), goes through the operator.
FALLBACK = object()
"""What an eager call returns when the call must go through the operator."""

_C = torch._C
_STRIDED = torch.strided
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_BF16 = np.dtype(ml_dtypes.bfloat16)


def plain_eager() -> bool:
    """Whether calls may bypass the dispatcher now (see above). Call it after
    ``torch.compiler.is_compiling()``, which dynamo folds to a constant."""
    return not (_ops._impl == "portable" or _C._are_functorch_transforms_active()
                or _C._len_torch_dispatch_stack() or _C._is_torch_function_mode_enabled()
                or _C._is_any_autocast_enabled() or _C._get_tracing_state() is not None
                or _C._autograd._profiler_enabled() or _forward_ad._current_level >= 0)


def _tensor(a: Any) -> torch.Tensor:
    if type(a) is not np.ndarray:
        a = np.asarray(a)
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _array(t: torch.Tensor) -> np.ndarray:
    """A plain dense CPU tensor's values as an array, zero-copy where torch allows it
    (``force``: detached in C++, ~0.35 us less than ``detach()``; a negative bit resolved,
    as ``to_numpy`` does)."""
    try:
        return t.numpy(force=True)
    except TypeError:  # (bfloat16)
        return to_numpy(t)


def _owned(outs: Sequence[Any]) -> bool:
    """Whether the outputs provably alias no input and no other output: each is, or is a
    view of, an array NumPy allocated (an input's memory is torch's), and no two share
    one (else ``_fresh`` decides, on the tensors)."""
    roots = []
    for o in outs:
        if type(o) is not np.ndarray:
            return False
        while o.base is not None:
            o = o.base
            if type(o) is not np.ndarray:
                return False
        if not o.flags.owndata:
            return False
        roots.append(id(o))
    return len(roots) == 1 or len(set(roots)) == len(roots)


class _Node:
    """An eager forward's autograd node, worked out once per signature (the forward's
    ``_api`` key fixes its attrs, shapes and dtypes): what it saves (("input", k): the
    k-th tensor input; ("output", k)), the outputs it returns where some are not
    differentiable (the others bypass the node: torch wraps each output of an
    autograd.Function, ~3 us apiece), and its gradient calls."""

    __slots__ = ("save", "diff", "steps")

    def __init__(self, save: list[tuple[str, int]], diff: list[int] | None,
                 steps: list[_GradCall]) -> None:
        self.save, self.diff, self.steps = save, diff, steps


class _GradCall:
    """One gradient-op call of a ``_Node``: the op, its attrs and shape inputs (fixed by
    the forward's signature), where each tensor argument comes from (the k-th incoming
    gradient, or the k-th saved tensor), and which of ``apply``'s arguments (the payload
    first, then the tensor inputs) gets which of its outputs. ``keys``: the call's ``_api``
    signature by its arrays' (dtype, shape, strides), the rest of it being fixed."""

    __slots__ = ("op", "fixed", "sources", "gives", "keys")

    def __init__(self, op: str, fixed: dict[str, Any], sources: list[tuple[str, bool, int]],
                 gives: list[tuple[int, int]]) -> None:
        self.op, self.fixed, self.sources, self.gives = op, fixed, sources, gives
        self.keys: dict[tuple, tuple | None] = {}


_NODES_MAX = 1024


def _eager(op: OpDef) -> Callable[[dict[str, Any]], Any]:
    """``op``'s eager call on its arguments by name (the schema's; missing ones take the
    schema's defaults), or FALLBACK. The attrs' types are those of ``_api.signature``,
    which takes exactly what torch's argument parser takes and tfgrad's checks accept
    (ints, floats or ints for floats, bools, strings, lists or tuples of those)."""
    names = _Binder(op).names
    defaults = _Binder(op).defaults
    n_names = len(names)
    tensor_inputs = tuple((i.name, tuple(getattr(torch, d) for d in _ALLOWED[op.name, i.name]))
                          for i in op.inputs if not i.is_shape)
    tensor_names = [n for n, _ in tensor_inputs]
    input_names = [i.name for i in op.inputs]
    out_names = [o.name for o in op.outputs]
    n_out = len(op.outputs)
    seeds = takes_seeds(op)
    _, backward, setup = _autograd(op)
    # the backward without torch's operator machinery: every gradient call through the
    # gradient table (no linearised composite), first derivatives (no create_graph)
    direct = op.name in _gradients.GRADIENTS and op.name not in _gradients.LINEARISED
    diff_outputs = set(_gradients.differentiable_outputs(op.name)) if direct else set()
    nodes: dict[tuple, _Node] = {}

    def finish(inputs: dict[str, Any], arguments: dict[str, Any], key: tuple,
               contiguous: bool = False) -> Any:
        out = _api.run(op, arguments, key)
        if contiguous:  # (the operator's outputs, as its fake implementation declares)
            out = (np.asarray(out, order="C") if n_out == 1
                   else tuple(np.asarray(o, order="C") for o in out))
        if n_out == 1:  # (_owned's test and _tensor for one array, inline)
            if (type(out) is np.ndarray and out.base is None and out.flags.owndata
                    and out.dtype != _BF16):
                return torch.from_numpy(out)
            return _fresh((_tensor(out),), [inputs[n] for n in tensor_names])[0]
        outs = tuple(_tensor(o) for o in out)
        if not _owned(out):
            outs = _fresh(outs, [inputs[n] for n in tensor_names])
        return outs

    FINISH[op.name] = finish

    def node(a: dict[str, Any], key: tuple) -> _Node:
        """The autograd node of a forward call with arguments ``a`` and signature ``key``."""
        found = nodes.get(key)
        if found is not None:
            return found
        steps = _gradients.steps(op.name, a)
        save: list[tuple[str, int]] = []

        def slot(kind: str, name: str) -> int:
            k = (kind, tensor_names.index(name) if kind == "input" else out_names.index(name))
            if k not in save:
                save.append(k)
            return save.index(k)

        diff = [k for k, n in enumerate(out_names) if n in diff_outputs]
        calls = []
        for step in steps:
            fixed = step.call_attrs(a)
            sources = []
            for arg, kind, src, index in step.sources:
                if kind == "shape":
                    fixed[arg] = [int(v) for v in a[src].shape]
                elif kind == "grad":
                    sources.append((arg, True, diff.index(index)))
                else:
                    sources.append((arg, False, slot(kind, src)))
            gives = [(1 + tensor_names.index(input_names[k]), r) for _, k, r in step.gives
                     if input_names[k] in tensor_names]
            calls.append(_GradCall(step.op, fixed, sources, gives))
        if len(nodes) >= _NODES_MAX:
            nodes.clear()
        found = nodes[key] = _Node(save, diff if len(diff) < n_out else None, calls)
        return found

    def forward(ctx: Any, payload: tuple, *tensors: Any) -> Any:
        a, arguments, key, box = payload
        out = finish(a, arguments, key)
        if not direct:
            setup(ctx, a, out)
            ctx.direct = None
            return out
        n = ctx.direct = node(a, key)
        outs = out if n_out > 1 else (out,)
        # (a saved output that the node does not return: an intermediate, whose version
        # torch checks all the same)
        ctx.save_for_backward(*[tensors[k] if kind == "input" else outs[k]
                                for kind, k in n.save])
        if n.diff is None:
            return out
        box.append((outs, n.diff))
        return tuple(outs[k] for k in n.diff)

    def backward_eager(ctx: Any, *grads: Any) -> tuple:
        n = ctx.direct
        if n is None:  # (the operator's backward, the arguments in schema order)
            result = backward(ctx, *grads)
            return (None, *(result[input_names.index(t)] for t in tensor_names))
        needs = ctx.needs_input_grad
        saved = ctx.saved_tensors
        result: list[Any] = [None] * (1 + len(tensor_names))
        fast = not _C.is_grad_enabled() and plain_eager()
        for call in n.steps:
            if not any(needs[k] for k, _ in call.gives):
                continue
            res = None
            if fast:
                res = _gradient_call(call, grads, saved)
            if res is None:  # (create_graph, or tensors the direct call does not take)
                args = dict(call.fixed)
                for arg, is_grad, k in call.sources:
                    args[arg] = grads[k] if is_grad else saved[k]
                res = invoke(call.op, args)
            res = res if isinstance(res, tuple) else (res,)
            for k, r in call.gives:
                result[k] = res[r]
        return tuple(result)

    function = type(f"GeneratedBackwardFor_{NAMESPACE}_{op.snake_name}_default",
                    (torch.autograd.Function,),
                    {"forward": staticmethod(forward),
                     "backward": staticmethod(backward_eager)})
    # (autograd.Function.apply in C, without the Python classmethod's work for functorch,
    # which plain_eager() has excluded: ~1.5 us)
    apply = super(torch.autograd.Function, function).apply  # type: ignore[misc]

    def call(a: dict[str, Any]) -> Any:
        """``a``: arguments by schema name (no other name); missing ones take the
        schema's defaults, a missing required one falls back."""
        if len(a) != n_names:
            a = {**defaults, **a}
            if len(a) != n_names:
                return FALLBACK
        grad = False
        arguments = dict(a)  # (the tensors replaced by their arrays below)
        for n, allowed in tensor_inputs:
            t = a[n]
            if (type(t) not in _PLAIN or not t.is_cpu or t.layout is not _STRIDED
                    or t.dtype not in allowed):
                return FALLBACK
            if t.requires_grad:
                grad = True
            arguments[n] = _array(t)
        if seeds:
            t = arguments.pop("seeds")
            if t is not None:
                if type(t) not in _PLAIN or not t.is_cpu or t.layout is not _STRIDED:
                    return FALLBACK
                if t.requires_grad:
                    grad = True
                arguments.update(_seed_attrs(a))
        key = _api.signature(op, arguments)
        if key is None:
            return FALLBACK
        if grad and _C.is_grad_enabled():
            box: list[tuple] = []
            out = apply((a, arguments, key, box), *[a[n] for n in tensor_names])
            if not box:
                return out
            outs, diff = box[0]
            outs = list(outs)
            for k, t in zip(diff, out):
                outs[k] = t
            return tuple(outs)
        return finish(a, arguments, key)

    def operator_cpu(a: dict[str, Any]) -> Any:
        """The operator's CPU kernel (``a``: every argument by schema name, grad mode
        off below the autograd key): C-contiguous fresh outputs, as the fake
        implementations declare."""
        arguments = dict(a)
        for n, allowed in tensor_inputs:
            t = a[n]
            if type(t) not in _PLAIN or t.layout is not _STRIDED or t.dtype not in allowed:
                return FALLBACK
            arguments[n] = _array(t)
        if seeds:
            t = arguments.pop("seeds")
            if t is not None:
                if type(t) not in _PLAIN or t.layout is not _STRIDED:
                    return FALLBACK
                arguments.update(_seed_attrs(a))
        key = _api.signature(op, arguments)
        if key is None:
            return FALLBACK
        return finish(a, arguments, key, contiguous=True)

    _ops.OPERATOR_CPU[op.name] = operator_cpu
    return call


def _gradient_call(call: _GradCall, grads: tuple, saved: tuple) -> Any:
    """A gradient call of an eager node on its tensors' arrays, or None where a tensor is
    not a plain dense CPU tensor (then the operator's path says what is wrong)."""
    args = dict(call.fixed)
    tensors = {}
    metas: tuple = ()
    for arg, is_grad, k in call.sources:
        t = grads[k] if is_grad else saved[k]
        if type(t) not in _PLAIN or not t.is_cpu or t.layout is not _STRIDED:
            return None
        tensors[arg] = t
        a = args[arg] = _array(t)
        metas += (a.dtype, a.shape, a.strides)
    key = call.keys.get(metas, _NO_KEY)
    if key is _NO_KEY:
        if len(call.keys) >= 64:
            call.keys.clear()
        key = call.keys[metas] = _api.signature(OPS[call.op], args)
    if key is None:
        return None
    return FINISH[call.op](tensors, args, key)


_NO_KEY = object()


def invoke(op_name: str, kwargs: dict[str, Any]) -> Any:
    """The operator ``op_name`` on ``kwargs``: an eager call where it may, else through
    the dispatcher."""
    if not torch.compiler.is_compiling() and plain_eager():
        out = EAGER[op_name](dict(kwargs))
        if out is not FALLBACK:
            return out
    return OPERATORS[op_name](**kwargs)


EAGER: dict[str, Callable[[dict[str, Any]], Any]] = {}
"""TF op name -> its eager call (see ``invoke``)."""

FINISH: dict[str, Callable[[dict[str, Any], dict[str, Any], tuple], Any]] = {}
"""TF op name -> its eager call's last part: the op on validated-once arguments (arrays)
with their signature, the outputs as fresh tensors."""

for _op in OPS.values():
    EAGER[_op.name] = _eager(_op)
del _op
