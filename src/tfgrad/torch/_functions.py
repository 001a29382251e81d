"""``tfgrad.torch.<op_name>``: the 19 operators as functions with TF's wrapper signatures.

Generated from the op table, as ``tfgrad.<op_name>``: inputs positional, attrs as keywords
with TF's defaults, ``name=`` accepted and ignored; multi-output ops return
``raw_ops.<Op>.Output`` namedtuples of tensors. Shape inputs (``input_sizes``,
``filter_sizes``, ``orig_input_tensor_shape``) take any sequence of ints (or an integer
tensor). The fractional-pool forward ops also take ``seed`` and ``seed2`` as integer
tensors: the operator then reads them when it runs (deterministic, as explicit seeds are
in TF), so a compiled graph draws new regions each step without recompiling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _api, raw_ops
from .._opdefs import OPS, OpDef
from ._ops import OPERATORS, takes_seeds


def _as_ints(v: Any) -> list[int]:
    if isinstance(v, torch.Tensor):
        return [int(x) for x in v.reshape(-1).tolist()]
    return [int(x) for x in v]


_AUTODIFF = (torch._C._functorch.TransformType.Grad, torch._C._functorch.TransformType.Jvp)


def _refuse_func_autodiff(op: OpDef) -> None:
    """torch.func's grad/vjp/jvp/jacrev cannot differentiate a custom operator in torch
    2.13 (its registered autograd is an autograd.Function without setup_context, which
    functorch requires); say so instead of torch's internal message. vmap works."""
    if torch.compiler.is_compiling():
        return
    stack = torch._C._functorch.get_interpreter_stack()
    if stack and any(i.key() in _AUTODIFF for i in stack):
        raise RuntimeError(
            f"tfgrad.torch.{op.snake_name}: torch.func.grad / vjp / jvp / jacrev cannot "
            "differentiate PyTorch custom operators in torch 2.13; use torch.autograd.grad "
            "(or Tensor.backward), which runs TF's gradient ops. torch.vmap is supported.")


def make_function(op: OpDef) -> Callable[..., Any]:
    operator = OPERATORS[op.name]
    sig = _api._signature(op, "snake")
    output = getattr(raw_ops, op.name).Output if len(op.outputs) > 1 else None
    shape_inputs = [i.name for i in op.inputs if i.is_shape]
    seeds = takes_seeds(op)
    names = list(sig.parameters)
    # torch's argument parser turns any number into a bool; TF's binding refuses them
    bools = [(names.index(a.name), a.name) for a in op.attrs if a.type == "bool"]

    def fn(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("name", None)
        try:
            out = call(args, kwargs)
        except RuntimeError as e:  # the dispatcher's argument parsing: a wrong type
            if not str(e).startswith(prefix):
                raise
            raise TypeError(f"tfgrad.torch.{str(e)[len('tfgrad::'):]}") from None
        return output(*out) if output is not None else out

    prefix = f"tfgrad::{op.snake_name}() "

    def call(args: tuple, kwargs: dict[str, Any]) -> Any:
        _refuse_func_autodiff(op)
        for i, n in bools:
            v = args[i] if i < len(args) else kwargs.get(n, False)
            if not isinstance(v, bool):
                raise TypeError(f"tfgrad.torch.{op.snake_name}(): Expected bool for argument "
                                f"'{n}' not {type(v).__name__}")
        if shape_inputs or seeds:
            bound = sig.bind(*args, **kwargs).arguments
            for n in shape_inputs:
                bound[n] = _as_ints(bound[n])
            if seeds and any(isinstance(bound.get(k), torch.Tensor) for k in ("seed", "seed2")):
                pair = [torch.as_tensor(bound.pop(k, 0)).reshape(()) for k in ("seed", "seed2")]
                bound["seeds"] = torch.stack([p.to(torch.int64) for p in pair])
                bound["deterministic"] = True
            return operator(**bound)
        return operator(*args, **kwargs)

    fn.__name__ = fn.__qualname__ = op.snake_name
    fn.__module__ = "tfgrad.torch"
    fn.__doc__ = (f"``torch.ops.tfgrad.{op.snake_name}``: TF's ``{op.name}`` on torch tensors, "
                  "differentiable as TF differentiates it.\n\n" + _api.docstring(op, "snake"))
    fn.__signature__ = sig  # type: ignore[attr-defined]
    return fn


FUNCTIONS: dict[str, Callable[..., Any]] = {op.snake_name: make_function(op) for op in OPS.values()}
