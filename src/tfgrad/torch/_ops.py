"""tfgrad's ops as PyTorch operators: ``torch.ops.tfgrad.<op_name>``.

Everything here is generated from two tables: the op table (:mod:`tfgrad._opdefs`: the
schema, the fake implementation's shapes and dtypes through :mod:`tfgrad._shapes`) and the
gradient table (:mod:`tfgrad._gradients`: which gradient op each backward calls, with which
saved tensors). Per operator:

- schema: TF's inputs (``Tensor``; shape inputs as ``SymInt[]``) and attrs with TF's
  defaults, in the order of tfgrad's functional API; the fractional-pool forward ops take an
  optional ``Tensor seeds`` ([seed, seed2], read on the host when the op runs) so that a
  compiled graph draws new regions without recompiling;
- kernels: CPU tensors run the exact Numba kernels (zero-copy, TF 2.21's bits); every other
  device, and the CPU under ``use_impl("portable")``, the portable implementation in torch
  ops (:mod:`tfgrad.torch._portable`), after the same argument checks;
- a fake (meta) implementation: output shapes and dtypes (sizes taken straight from an
  input, such as the batch, stay symbolic), and trace-time argument errors;
- autocast (CPU and CUDA): each float input cast by its rule (:func:`autocast_rules`);
- autograd: the backward calls the gradient operator(s) TF's gradient function calls, so
  higher derivatives follow the table; gradient ops that TF differentiates through a
  composite are differentiated through their portable implementation; ops TF gives no
  gradient raise when differentiated;
- vmap: one call per batch element (the ops have no batching rule of their own).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch

from .. import _gradients, _shapes, raw_ops
from .._errors import InvalidArgumentError
from .._opdefs import OPS, REQUIRED, Attr, OpDef

NAMESPACE = "tfgrad"

_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
}
_TORCH_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}
_IMPLS = ("auto", "exact", "portable")


# --------------------------------------------------------------------------------------
# Choosing the implementation
# --------------------------------------------------------------------------------------
_impl = "auto"


class use_impl:  # noqa: N801 (a function that is also a context manager)
    """Choose the implementation behind tfgrad's operators, process-wide.

    ``"auto"`` (the default): the exact kernels for CPU tensors, the portable code on every
    other device. ``"exact"``: the exact kernels only (a tensor off the CPU is an error).
    ``"portable"``: the portable torch code on every device, the CPU included.

    ``tfgrad.torch.use_impl("portable")`` sets it until changed; ``with
    tfgrad.torch.use_impl("portable"): ...`` sets it inside the block (autograd's own
    threads see it too, so backward passes use the same choice).
    """

    def __init__(self, name: str) -> None:
        global _impl
        if name not in _IMPLS:
            raise ValueError(f"tfgrad.torch.use_impl: implementation must be one of "
                             f"{', '.join(map(repr, _IMPLS))}, got {name!r}")
        self._previous, _impl = _impl, name

    def __enter__(self) -> use_impl:
        return self

    def __exit__(self, *exc: object) -> None:
        global _impl
        _impl = self._previous


def current_impl() -> str:
    return _impl


# --------------------------------------------------------------------------------------
# Schemas and argument binding
# --------------------------------------------------------------------------------------
_SCHEMA_TYPES = {"int": "int", "float": "float", "bool": "bool", "string": "str",
                 "list(int)": "int[]", "list(float)": "float[]"}


def _default(a: Attr) -> str:
    v = a.default
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(repr(float(x)) if a.type == "list(float)" else str(int(x))
                               for x in v) + "]"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def _attrs_in_order(op: OpDef) -> list[Attr]:
    """Required attrs first, then those with defaults (tfgrad's functional order)."""
    return ([a for a in op.attrs if a.default is REQUIRED]
            + [a for a in op.attrs if a.default is not REQUIRED])


def takes_seeds(op: OpDef) -> bool:
    return op.family == "fractional_pool" and not op.name.endswith("Grad")


def schema(op: OpDef) -> str:
    args = [f"{'SymInt[]' if i.is_shape else 'Tensor'} {i.name}" for i in op.inputs]
    for a in _attrs_in_order(op):
        default = "" if a.default is REQUIRED else "=" + _default(a)
        args.append(f"{_SCHEMA_TYPES[a.type]} {a.name}{default}")
    if takes_seeds(op):
        args.append("Tensor? seeds=None")
    outs = ("Tensor" if len(op.outputs) == 1
            else "(" + ", ".join("Tensor" for _ in op.outputs) + ")")
    return f"({', '.join(args)}) -> {outs}"


class _Binder:
    """Positional/keyword arguments of an operator call -> a dict by name (the dispatcher
    passes a prefix positionally and leaves trailing defaults out)."""

    def __init__(self, op: OpDef) -> None:
        self.names = ([i.name for i in op.inputs] + [a.name for a in _attrs_in_order(op)]
                      + (["seeds"] if takes_seeds(op) else []))
        self.defaults = {a.name: a.default for a in op.attrs if a.default is not REQUIRED}
        if takes_seeds(op):
            self.defaults["seeds"] = None

    def __call__(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = dict(self.defaults)
        bound.update(zip(self.names, args))
        bound.update(kwargs)
        return bound


# --------------------------------------------------------------------------------------
# Tensors <-> NumPy (zero-copy on the CPU)
# --------------------------------------------------------------------------------------
def dtype_name(op: OpDef, name: str, t: torch.Tensor) -> str:
    dt = _DTYPE_NAMES.get(t.dtype)
    if dt is None:
        raise TypeError(f"{op.name}: input '{name}' has dtype {t.dtype}, which no tfgrad op "
                        f"takes (float16, bfloat16, float32, float64, int32, int64)")
    return dt


_ALLOWED = {(op.name, i.name): (i.dtype,) if i.dtype else op.type_attr(i.type_attr).allowed
            for op in OPS.values() for i in op.inputs}
"""The dtypes each input takes."""


def _tensor_input(op: OpDef, name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op.name}: input '{name}' must be a torch.Tensor, got "
                        f"{type(t).__name__}; wrap values with torch.tensor(...)")
    if t.layout != torch.strided:
        raise TypeError(f"{op.name}: input '{name}' has layout {t.layout}; only dense "
                        "(strided) tensors are supported: call .to_dense() first")
    allowed = _ALLOWED[op.name, name]
    if _DTYPE_NAMES.get(t.dtype) not in allowed:  # (no silent casts, unlike NumPy inputs)
        raise TypeError(
            f"{op.name}: input '{name}' has dtype {t.dtype}, but the op takes "
            f"{', '.join('torch.' + a for a in allowed)} (as TF's CPU kernel); convert it "
            "explicitly, e.g. with .float()")
    return t


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().resolve_neg()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: reinterpret the bits
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _fresh(outs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
           ) -> tuple[torch.Tensor, ...]:
    """Operator outputs may alias no input and no other output (as TF's are fresh)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    result = []
    for o in outs:
        ptr = o.untyped_storage().data_ptr()
        if o.numel() and ptr in seen:
            o = o.clone()
            ptr = o.untyped_storage().data_ptr()
        seen.add(ptr)
        result.append(o)
    return tuple(result)


# --------------------------------------------------------------------------------------
# Implementations
# --------------------------------------------------------------------------------------
def _seed_attrs(a: dict[str, Any]) -> dict[str, Any]:
    """A ``seeds`` tensor replaces seed/seed2 (deterministic, as TF with explicit seeds)."""
    seeds = a.get("seeds")
    if seeds is None:
        return {}
    if seeds.numel() != 2 or seeds.dtype not in (torch.int32, torch.int64):
        raise InvalidArgumentError(f"seeds must be an integer tensor of 2 values (seed, seed2), "
                                   f"got dtype {seeds.dtype} and shape {list(seeds.shape)}")
    s, s2 = (int(v) for v in seeds.reshape(-1).tolist())
    return {"seed": s, "seed2": s2, "deterministic": True}


def _split(op: OpDef, a: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensor inputs, and everything else (shape inputs as int tuples, attrs)."""
    tensors, rest = {}, {}
    for i in op.inputs:
        if i.is_shape:
            rest[i.name] = tuple(int(v) for v in a[i.name])
        else:
            tensors[i.name] = _tensor_input(op, i.name, a[i.name])
    rest.update({at.name: a[at.name] for at in op.attrs})
    rest.update(_seed_attrs(a))
    return tensors, rest


def _device(op: OpDef, tensors: dict[str, torch.Tensor]) -> torch.device:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise InvalidArgumentError(
            f"{op.name}: inputs are on different devices "
            f"({', '.join(f'{k}: {t.device}' for k, t in tensors.items())}); move them to one")
    return next(iter(devices))


def _exact(op: OpDef, tensors: dict[str, torch.Tensor], rest: dict[str, Any]
           ) -> tuple[torch.Tensor, ...]:
    arrays = {k: to_numpy(t) for k, t in tensors.items()}
    out = getattr(raw_ops, op.name)(**arrays, **rest)
    outs = tuple(out) if isinstance(out, tuple) else (out,)
    # (contiguous, as the fake implementations' outputs: the kernels may give an input's
    # layout, which only the eager path keeps)
    return tuple(_from_numpy(np.asarray(o, order="C")) for o in outs)


def portable_function(op: OpDef) -> Callable[..., Any]:
    module = importlib.import_module(f"tfgrad.torch._portable.{op.family}")
    return getattr(module, op.name)


def _portable(op: OpDef, tensors: dict[str, torch.Tensor], rest: dict[str, Any]
              ) -> tuple[torch.Tensor, ...]:
    args = {k: _shapes.placeholder(tuple(t.shape), dtype_name(op, k, t))
            for k, t in tensors.items()}
    kwargs, _ = _shapes.bind_and_infer(op.name, {**args, **rest})
    kwargs.update(tensors)  # (the tensors themselves, the validated attrs)
    kwargs.update({i.name: rest[i.name] for i in op.inputs if i.is_shape})
    out = portable_function(op)(**kwargs)
    return tuple(out) if isinstance(out, tuple) else (out,)


OPERATOR_CPU: dict[str, Callable[[dict[str, Any]], Any]] = {}
"""TF op name -> the operator's CPU kernel on its arguments by name through the eager
calls' cached signature (``tfgrad.torch._eager``), or ``_eager.FALLBACK`` where that path
cannot prove the call valid (then the checks below say what is wrong)."""


def _kernel(op: OpDef, cpu: bool) -> Callable[..., Any]:
    bind = _Binder(op)
    name = op.name

    def run(*args: Any, **kwargs: Any) -> Any:
        a = bind(args, kwargs)
        if cpu and _impl != "portable":
            out = OPERATOR_CPU[name](a)
            if out is not _eager.FALLBACK:
                return out
        tensors, rest = _split(op, a)
        device = _device(op, tensors)
        if cpu and _impl != "portable":
            outs = _exact(op, tensors, rest)
        elif _impl == "exact":
            raise InvalidArgumentError(
                f"{op.name}: tfgrad's exact kernels run on CPU tensors only, got tensors on "
                f"{device}; use tfgrad.torch.use_impl('auto') (the portable implementation "
                "off the CPU) or move the inputs with .cpu()")
        else:  # (contiguous, as the fake implementations declare: torch's ops may
            # follow their inputs' strides, which a compiled graph leaves free)
            outs = tuple(o.contiguous() for o in _portable(op, tensors, rest))
        outs = _fresh(outs, list(tensors.values()))
        return outs if len(outs) > 1 else outs[0]

    run.__name__ = op.snake_name
    return run


# --------------------------------------------------------------------------------------
# Fake (meta) implementation
# --------------------------------------------------------------------------------------
def _hint(v: Any) -> int:
    """A size's example value, without adding a guard on a symbolic one."""
    if isinstance(v, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        return int(optimization_hint(v))
    return int(v)


def _computed_size(op: OpDef, output: str, shape: tuple[int, ...],
                   tensors: dict[str, torch.Tensor], a: dict[str, Any]) -> list[Any]:
    """An output shape TF computes from the input sizes (depthwise convolution's and the
    fractional pools' forwards). The sizes it takes straight from an input (the batch, the
    channels) stay symbolic, so a graph serves every batch size; the spatial sizes, which
    TF derives from the image size and the attrs (the pooling ratio: floats), specialise
    the graph on the image size, and the checks ran on the inputs' example sizes."""
    size: list[Any] = list(shape)
    if op.name == "DepthwiseConv2dNative":
        x, f = tensors["input"].shape, tensors["filter"].shape
        n, h, w, c = (0, 2, 3, 1) if a["data_format"] == "NCHW" else (0, 1, 2, 3)
        for s in (x[h], x[w], f[0], f[1]):
            int(s)  # (a guard: the output's height and width depend on these)
        size[n], size[c] = x[n], x[c] * f[3]  # (out_depth = in_depth * multiplier)
        return size
    if "value" not in tensors:  # any other op: its example sizes, each a guard
        for t in tensors.values():
            for s in t.shape:
                int(s)
        return size
    x = tensors["value"].shape  # fractional pooling: NHWC
    int(x[1]), int(x[2])  # (guards: the rows, columns and sequences depend on H and W)
    if output == "output":
        size[0], size[3] = x[0], x[3]
    return size


def _fake(op: OpDef) -> Callable[..., Any]:
    bind = _Binder(op)

    def fake(*args: Any, **kwargs: Any) -> Any:
        a = bind(args, kwargs)
        tensors = {i.name: _tensor_input(op, i.name, a[i.name])
                   for i in op.inputs if not i.is_shape}
        device = _device(op, tensors)
        arguments: dict[str, Any] = {
            k: _shapes.placeholder(tuple(_hint(s) for s in t.shape), dtype_name(op, k, t))
            for k, t in tensors.items()}
        for i in op.inputs:
            if i.is_shape:
                arguments[i.name] = [_hint(v) for v in a[i.name]]
        arguments.update({at.name: a[at.name] for at in op.attrs})
        if a.get("seeds") is not None:  # (any seeds: the shapes do not depend on them)
            arguments.update(seed=1, seed2=1, deterministic=True)
        specs = _shapes.infer(op.name, arguments)
        outs = []
        for o, (shape, dt) in zip(op.outputs, specs):
            rule = o.shape
            if rule.startswith("like "):
                size: Any = tensors[rule[5:]].shape
            elif rule.startswith("values of "):
                size = list(a[rule[10:]])
            elif rule in ("()", "(0,)"):
                size = shape
            else:
                size = _computed_size(op, o.name, shape, tensors, a)
            outs.append(torch.empty(size, dtype=_TORCH_DTYPES[dt], device=device))
        return tuple(outs) if len(outs) > 1 else outs[0]

    return fake


# --------------------------------------------------------------------------------------
# Autograd, from the gradient table
# --------------------------------------------------------------------------------------
def _autograd(op: OpDef) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """setup_context and backward for the operator's autograd, and setup_context on the
    arguments by name (the eager calls')."""
    bind = _Binder(op)
    out_names = [o.name for o in op.outputs]
    input_names = [i.name for i in op.inputs]
    # (an op TF gives no gradient keeps its outputs differentiable: the backward raises)
    diff_outputs = set(_gradients.differentiable_outputs(op.name)
                       if _gradients.has_gradient(op.name) else out_names)
    non_diff = [k for k, n in enumerate(out_names) if n not in diff_outputs]

    tensor_inputs = [i.name for i in op.inputs if not i.is_shape]
    rest_names = [n for n in bind.names if n not in tensor_inputs]  # (seeds: a tensor)
    when = sorted({k for c in _gradients.GRADIENTS.get(op.name, ()) for k in c.when})
    shaped = sorted({src.name for c in _gradients.GRADIENTS.get(op.name, ())
                     for src in c.args.values() if src.kind == "shape"})
    n_rest = len(bind.names) - len(input_names)
    linearised = op.name in _gradients.LINEARISED
    plans: dict[tuple, tuple[list[tuple[str, str]], tuple[_gradients.Step, ...]]] = {}

    def plan(a: dict[str, Any]) -> tuple[list[tuple[str, str]], tuple[_gradients.Step, ...]]:
        """What the backward reads (a running statistic updated in place after the
        forward, as batch norm's in inference, must not be saved when unused) and the
        gradient calls, per value of the attrs that choose the calls."""
        key = tuple(a[k] for k in when)
        found = plans.get(key)
        if found is None:
            steps = _gradients.steps(op.name, a)
            need = {(kind, name) for s in steps for _, kind, name, _ in s.sources
                    if kind in ("input", "output")}
            if linearised:
                need |= {("input", n) for n in tensor_inputs}
            found = plans[key] = (sorted(need), steps)
        return found

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        setup(ctx, bind(inputs, {}), output)

    def setup(ctx: Any, a: dict[str, Any], output: Any) -> None:
        """setup_context on the arguments by name (every one given)."""
        outs = output if isinstance(output, tuple) else (output,)
        ctx.bound = {n: a[n] for n in rest_names if not isinstance(a[n], torch.Tensor)}
        ctx.shapes = {n: tuple(a[n].shape) for n in shaped}
        # (what a missing incoming gradient is replaced by: zeros of the output's shape)
        ctx.outs = [(t.shape, t.dtype) for t in outs]
        need, ctx.steps = plan(a)
        ctx.names = [n for _, n in need]
        ctx.save_for_backward(*(a[n] if k == "input" else outs[out_names.index(n)]
                                for k, n in need))
        if non_diff:
            ctx.mark_non_differentiable(*(outs[k] for k in non_diff))

    def backward(ctx: Any, *grads: Any) -> tuple:
        saved = dict(zip(ctx.names, ctx.saved_tensors))
        result: list[Any] = [None] * len(input_names)
        if linearised:
            got = _linearised_vjp(op, saved, ctx.bound, dict(zip(out_names, grads)))
            for k, n in enumerate(input_names):
                result[k] = got.get(n)
        elif op.name not in _gradients.GRADIENTS:
            raise RuntimeError(
                f"tfgrad.torch: TF registers no gradient for {op.name}, so it has no "
                "derivative here: take the first gradient without create_graph=True (or "
                "detach it).")
        needs = ctx.needs_input_grad
        bound = ctx.bound
        for step in ctx.steps:
            if not any(needs[k] for _, k, _ in step.gives):
                continue
            args: dict[str, Any] = step.call_attrs(bound)
            for name, kind, src, index in step.sources:
                if kind == "grad":
                    g = grads[index]
                    if g is None:
                        shape, dtype = ctx.outs[index]
                        device = next((t.device for t in (*grads, *saved.values())
                                       if t is not None), torch.device("cpu"))
                        g = torch.zeros(shape, dtype=dtype, device=device)
                    args[name] = g
                elif kind == "shape":
                    args[name] = list(ctx.shapes[src])
                else:
                    args[name] = saved[src]
            res = _eager.invoke(step.op, args)
            res = res if isinstance(res, tuple) else (res,)
            for _, k, r in step.gives:
                result[k] = res[r]
        return (*result, *(None,) * n_rest)

    return setup_context, backward, setup


def _linearised_vjp(op: OpDef, saved: dict[str, torch.Tensor], bound: dict[str, Any],
                    grads: dict[str, Any]) -> dict[str, Any]:
    """The vector-Jacobian product of the op's portable implementation (TF differentiates
    its composite the same way), connected to the graph under ``create_graph=True``."""
    lin = _gradients.LINEARISED[op.name]
    create = torch.is_grad_enabled()
    with torch.enable_grad():
        leaves = {k: (v if create and v.requires_grad else v.detach().requires_grad_())
                  if k in lin.inputs else v.detach() for k, v in saved.items()
                  if k in {i.name for i in op.inputs}}
        kwargs: dict[str, Any] = dict(leaves)
        for i in op.inputs:
            if i.is_shape:
                kwargs[i.name] = tuple(int(v) for v in bound[i.name])
        kwargs.update({at.name: bound[at.name] for at in op.attrs})
        out = portable_function(op)(**kwargs)
        outs = dict(zip([o.name for o in op.outputs], out if isinstance(out, tuple) else (out,)))
        pairs = [(outs[n], grads[n]) for n in lin.outputs if grads.get(n) is not None]
        if not pairs:
            return {}
        xs = [leaves[n] for n in lin.inputs]
        # An output that does not depend on the inputs (a Mean of an empty batch: NaN
        # made from nothing) has no graph: it adds nothing to their gradients.
        pairs = [(o, g) for o, g in pairs if o.requires_grad]
        gs = (torch.autograd.grad([o for o, _ in pairs], xs, [g for _, g in pairs],
                                  create_graph=create, allow_unused=True)
              if pairs else [None] * len(xs))
    return {n: (g if g is not None else torch.zeros_like(x))
            for n, x, g in zip(lin.inputs, xs, gs)}


# --------------------------------------------------------------------------------------
# vmap: one call per batch element
# --------------------------------------------------------------------------------------
def _vmap(op: OpDef) -> Callable[..., Any]:
    n_out = len(op.outputs)

    def rule(info: Any, in_dims: tuple, *args: Any, **kwargs: Any) -> tuple:
        fn = OPERATORS[op.name]
        results = []
        for b in range(info.batch_size):
            call = [a.select(d, b) if isinstance(a, torch.Tensor) and d is not None else a
                    for a, d in zip(args, in_dims)]
            r = fn(*call, **kwargs)
            results.append(r if isinstance(r, tuple) else (r,))
        stacked = tuple(torch.stack([r[k] for r in results]) for k in range(n_out))
        if n_out == 1:
            return stacked[0], 0
        return stacked, (0,) * n_out

    return rule


# --------------------------------------------------------------------------------------
# Autocast, from the op table
# --------------------------------------------------------------------------------------
_HALF = (torch.float16, torch.bfloat16)
_LOWER_PRECISION_FAMILIES = ("depthwise_conv",)
"""Families that run in autocast's dtype, as torch's own convolutions do."""


def autocast_rules(op: OpDef) -> dict[str, str]:
    """How autocast casts each tensor input of ``op`` (torch's categories):

    - ``"float32"``: an input whose op takes no half dtype (fake quantization; pooling;
      batch norm's float32 scale, offset and statistics): float16/bfloat16 tensors are
      cast to float32, as torch's float32 ops do;
    - ``"lower"``: depthwise convolution: float32 tensors run in autocast's dtype, as
      torch's conv2d;
    - ``"promote"``: batch norm's x and y_backprop: left as they are (a half x with float32
      statistics, as TF's FusedBatchNormV2/V3), or both at the wider of their dtypes.
    Integer inputs and float64 tensors are never cast.
    """
    rules = {}
    for i in op.inputs:
        if i.is_shape:
            continue
        allowed = _ALLOWED[op.name, i.name]
        if not any(a in ("float16", "bfloat16", "float32") for a in allowed):
            continue  # (integer inputs: pooling sequences)
        if not any(a in ("float16", "bfloat16") for a in allowed):
            rules[i.name] = "float32"
        elif op.family in _LOWER_PRECISION_FAMILIES:
            rules[i.name] = "lower"
        else:
            rules[i.name] = "promote"
    return rules


def _autocast_kernel(op: OpDef, device_type: str) -> Callable[..., Any]:
    key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(
        device_type))
    rules = autocast_rules(op)
    index = {i.name: k for k, i in enumerate(op.inputs)}
    promote = [index[n] for n, r in rules.items() if r == "promote"]

    def eligible(t: Any) -> bool:
        return (isinstance(t, torch.Tensor) and t.is_floating_point()
                and t.device.type == device_type and t.dtype != torch.float64)

    def kernel(_keyset: Any, *args: Any, **kwargs: Any) -> Any:
        a = list(args)
        lower = torch.get_autocast_dtype(device_type)
        wide = [a[k].dtype for k in promote if k < len(a) and eligible(a[k])]
        widest = torch.float32 if torch.float32 in wide else None
        for name, rule in rules.items():
            k = index[name]
            if k >= len(a) or not eligible(a[k]):
                continue
            if rule == "float32" and a[k].dtype in _HALF:
                a[k] = a[k].float()
            elif rule == "lower" and a[k].dtype == torch.float32:
                a[k] = a[k].to(lower)
            elif rule == "promote" and widest is not None:
                a[k] = a[k].to(widest)
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return OPERATORS[op.name](*a, **kwargs)

    return kernel


_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")


def _register_autocast(op: OpDef) -> None:
    for device_type in ("cpu", "cuda"):
        if torch._C._is_autocast_available(device_type):
            key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
            _LIB.impl(op.snake_name, _autocast_kernel(op, device_type), key, with_keyset=True)


# --------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------
def _autograd_cpu(defn: Any, cpu: Callable[..., Any]) -> Callable[..., Any]:
    """The operator's AutogradCPU kernel: a call that records no gradient (grad mode off,
    or no input requiring one; what a compiled graph's calls are) on plain CPU tensors (no
    other key below autograd: not fake, functional, negated or traced) runs the CPU
    kernel directly, ~10 us less than torch.library's autograd wrapper and redispatch;
    every other call goes through that wrapper."""
    from torch._library.autograd import make_autograd_impl

    wrapper = make_autograd_impl(defn._opoverload, defn)
    below, dense = torch._C._after_autograd_keyset, torch._C.DispatchKey.CPU
    grad_enabled, any_requires_grad = torch._C.is_grad_enabled, torch._C._any_requires_grad

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if (keyset & below).highestPriorityTypeId() == dense and not (
                grad_enabled() and any_requires_grad(*args)):
            return cpu(*args, **kwargs)
        return wrapper(keyset, *args, **kwargs)

    return kernel


def _register(op: OpDef) -> Any:
    defn = torch.library.custom_op(f"{NAMESPACE}::{op.snake_name}", _kernel(op, cpu=False),
                                   mutates_args=(), schema=schema(op),
                                   tags=(torch.Tag.flexible_layout,))
    # (the CPU kernel registered directly, not through register_kernel: its wrappers, a
    # dynamo guard and an aliasing check that _fresh already makes, cost ~5 us a call)
    cpu = _kernel(op, cpu=True)
    _LIB.impl(op.snake_name, cpu, "CPU")
    defn.register_fake(_fake(op))
    setup_context, backward, _ = _autograd(op)
    defn.register_autograd(backward, setup_context=setup_context)
    _LIB.impl(op.snake_name, _autograd_cpu(defn, cpu), "AutogradCPU", with_keyset=True)
    defn.register_vmap(_vmap(op))
    return getattr(getattr(torch.ops, NAMESPACE), op.snake_name).default


OPERATORS: dict[str, Any] = {}
"""TF op name -> its operator (``torch.ops.tfgrad.<op_name>.default``)."""

for _op in OPS.values():
    OPERATORS[_op.name] = _register(_op)
    _register_autocast(_op)
del _op

# (the eager calls build on everything above; the operators' backward calls them)
from . import _eager  # noqa: E402

__all__ = ["OPERATORS", "autocast_rules", "current_impl", "schema", "use_impl"]
