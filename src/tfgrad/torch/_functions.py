"""``tfgrad.torch.<op_name>``: the operators as functions with TF's wrapper signatures.

Generated from the op table, as ``tfgrad.<op_name>``: inputs positional, attrs as keywords
with TF's defaults, ``name=`` accepted and ignored; multi-output ops return
``raw_ops.<Op>.Output`` namedtuples of tensors. Shape inputs (``input_sizes``,
``filter_sizes``, ``orig_input_tensor_shape``) take any sequence of ints (or an integer
tensor). The fractional-pool forward ops also take ``seed`` and ``seed2`` as integer
tensors: the operator then reads them when it runs (deterministic, as explicit seeds are
in TF), so a compiled graph draws new regions each step without recompiling.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from .. import _api, _validate, raw_ops
from .._errors import InvalidArgumentError
from .._opdefs import OPS, OpDef
from ._eager import EAGER, FALLBACK, plain_eager
from ._ops import OPERATORS, takes_seeds


def _as_ints(v: Any) -> list[int]:
    if isinstance(v, torch.Tensor):
        return [int(x) for x in v.reshape(-1).tolist()]
    return [int(x) for x in v]


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _seed_tensor(op: OpDef, name: str, v: Any) -> torch.Tensor:
    """A seed given as a tensor: one integer (a float one is refused, as JAX refuses it,
    rather than truncated: seed=tensor(1.9) is not seed 1)."""
    t = torch.as_tensor(v)
    if t.dtype not in _INT_DTYPES or t.numel() != 1:
        raise TypeError(f"tfgrad.torch.{op.snake_name}(): '{name}' must be an int or an "
                        f"integer tensor of one value, got a {t.dtype} tensor of shape "
                        f"{list(t.shape)}")
    return t.reshape(()).to(torch.int64)


def _signature(op: OpDef) -> inspect.Signature:
    """tfgrad's functional signature, annotated with what the torch function takes and
    returns (tensors, not NumPy arrays)."""
    sig = _api._signature(op, "snake")
    params = []
    for p in sig.parameters.values():
        if p.annotation == "ArrayLike":
            inp = next(i for i in op.inputs if i.name == p.name)
            p = p.replace(annotation="Sequence[int] | torch.Tensor" if inp.is_shape
                          else "torch.Tensor")
        elif takes_seeds(op) and p.name in ("seed", "seed2"):
            p = p.replace(annotation="int | torch.Tensor")
        params.append(p)
    # (a multi-output op returns raw_ops.<Op>.Output, a namedtuple, here of tensors)
    ret = "torch.Tensor" if len(op.outputs) == 1 else f"tfgrad.raw_ops.{op.name}.Output"
    return sig.replace(parameters=params, return_annotation=ret)


def _clear_type_error(op: OpDef, sig: inspect.Signature, args: tuple,
                      kwargs: dict[str, Any]) -> Exception | None:
    """When torch's argument parser refuses an attr ("Expected a value of type 'int' ...
    but instead found type 'int'" for an int out of int64's range), tfgrad's own check of
    the attr says what is wrong (TypeError or InvalidArgumentError, as tfgrad.<op_name>)."""
    try:
        bound = sig.bind(*args, **kwargs).arguments
    except TypeError as e:
        return e
    for a in op.attrs:
        if a.name in bound and not isinstance(bound[a.name], torch.Tensor):
            try:
                _validate.check_attr(op, a, bound[a.name])
            except (TypeError, InvalidArgumentError) as e:
                return e
    return None


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
    sig = _signature(op)
    output = getattr(raw_ops, op.name).Output if len(op.outputs) > 1 else None
    shape_inputs = [i.name for i in op.inputs if i.is_shape]
    seeds = takes_seeds(op)
    names = list(sig.parameters)
    # torch's argument parser turns any number into a bool; TF's binding refuses them
    bools = [(names.index(a.name), a.name) for a in op.attrs if a.type == "bool"]

    params = [n for n in names if n != "name"]
    known = frozenset(params)
    eager = EAGER[op.name]

    def eager_call(args: tuple, kwargs: dict[str, Any]) -> Any:
        """The call without the dispatcher (``_eager.invoke``), or FALLBACK."""
        if len(args) > len(params):
            return FALLBACK
        a = dict(zip(params, args))
        for k, v in kwargs.items():
            if k in a or k not in known:
                return FALLBACK
            a[k] = v
        for n in shape_inputs:
            if n in a:
                v = a[n]
                if type(v) is not list:
                    try:
                        a[n] = _as_ints(v)
                    except Exception:  # (the operator's path says what is wrong)
                        return FALLBACK
        if seeds and (isinstance(a.get("seed"), torch.Tensor)
                      or isinstance(a.get("seed2"), torch.Tensor)):
            return FALLBACK
        return eager(a)

    def fn(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            kwargs.pop("name", None)
        if not torch.compiler.is_compiling() and plain_eager():
            out = eager_call(args, kwargs)
            if out is not FALLBACK:
                return output(*out) if output is not None else out
        try:
            out = call(args, kwargs)
        except RuntimeError as e:  # the dispatcher's argument parsing: a wrong type
            if not str(e).startswith(prefix):
                raise
            clear = _clear_type_error(op, sig, args, kwargs)
            if clear is not None:
                raise clear from None
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
                pair = [_seed_tensor(op, k, bound.pop(k, 0)) for k in ("seed", "seed2")]
                bound["seeds"] = torch.stack(pair)
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
