"""tfgrad's ops as JAX primitives, generated from the op table and the gradient table.

Per op two primitives, created on first use:

``tfgrad_<op_name>``, the op.
  Abstract evaluation: output shapes and dtypes from :func:`tfgrad._shapes.infer`, which
  also raises tfgrad's argument errors while the function is traced. Lowering: the exact
  callback (:mod:`._exact`) or the native code (:mod:`._native`), chosen per platform when
  the computation is lowered (:mod:`._choice`); native code is fenced (its floating inputs
  and outputs pass through selects, so no FMA is contracted across its boundary; see
  :func:`_fenced`) and lowered as one device's computation (under ``shard_map`` too).
  ``vmap``: each batching adds a level (which operands carry a leading batch axis) and the
  implementation is ``jax.vmap``-ed over the levels: XLA batches the native code; the
  callback loops over the elements.
  JVP: the op itself for the primal, ``tfgrad_<op_name>_jvp`` for the tangents.

``tfgrad_<op_name>_jvp``, the op's linearisation, linear in the tangents.
  Its transpose (reverse mode: ``jax.grad``, ``jax.vjp``) is TF's gradient: the gradient
  ops of :data:`tfgrad._gradients.GRADIENTS`, with the forward inputs, outputs and
  incoming gradients TF's gradient function gives them. These are ops of this module
  again, so higher derivatives follow the table. Its value (forward mode: ``jax.jvp``,
  ``jax.jacfwd``, ``jax.hessian``) is the transpose of that gradient, found as TF's
  ``ForwardAccumulator`` does: differentiating the gradient with respect to its incoming
  gradient (a double vjp, through the table). Where TF defines no such second derivative
  (fake quantization, fractional max pooling) JAX differentiates the native gradient op.

Ops in :data:`tfgrad._gradients.LINEARISED` (the batch-norm gradients,
``FractionalAvgPoolGrad``) take their tangents from ``jax.jvp`` of their native
implementation, which JAX transposes itself, as TF differentiates its composite; except
those whose TF gradient is a composite of ops (Softmax: :data:`_COMPOSITES`), whose
linearisation transposes to that composite on this module's ops. Ops with
no gradient in TF raise ``LookupError`` when a tangent reaches one of their float inputs.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import _gradients, _shapes
from .._opdefs import get_op_def
from .._validate import DTYPES, dtype_name
from . import _choice, _exact

Levels = tuple[tuple[bool, ...], ...]
"""vmap levels of an equation, outermost first: per level, which operands carry its batch
axis (the outermost level's axis comes first)."""
Signature = tuple[tuple[tuple[int, ...], str], ...]
"""Unbatched (shape, dtype name) of each operand."""


@dataclass(frozen=True)
class OpCall:
    """One application of an op: the static parameters of its equation."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    """Normalised attrs (as ``tfgrad._validate.bind`` returns them), sorted by name."""
    static: tuple[tuple[str, tuple[int, ...]], ...]
    """Shape inputs (``Input.is_shape``), as tuples of ints."""
    names: tuple[str, ...]
    """The operands: the array inputs in the op's order, then traced attrs (seeds)."""
    impl: str
    """``"auto"``, ``"exact"`` or ``"native"``, resolved when lowered."""

    def kwargs(self) -> dict[str, Any]:
        return {**dict(self.static), **dict(self.attrs)}

    def __repr__(self) -> str:  # (as jaxprs print it)
        args = ", ".join(f"{k}={v!r}" for k, v in (*self.static, *self.attrs))
        return f"{self.op}({args}; impl={self.impl})"


@dataclass(frozen=True)
class Linearisation:
    """Static parameters of a ``_jvp`` equation. Its operands: the op's operands, the
    forward outputs in ``outputs``, then the tangents of the inputs in ``tangents``."""

    call: OpCall
    outputs: tuple[str, ...]
    tangents: tuple[str, ...]
    diff_outputs: tuple[str, ...]
    """The outputs it gives tangents of (those TF's gradient function reads)."""

    def __repr__(self) -> str:
        return f"{self.call!r} d[{', '.join(self.diff_outputs)}]/d[{', '.join(self.tangents)}]"


# --------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def specs(call: OpCall, signature: Signature) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
    """The op's unbatched output (shape, dtype), as JAX holds them (no 64-bit types
    without ``jax_enable_x64``); raises the op's argument errors."""
    op = get_op_def(call.op)
    inputs = {i.name for i in op.inputs}
    args: dict[str, Any] = call.kwargs()
    for name, (shape, dt) in zip(call.names, signature):
        # a traced attr's value is unknown: its checks run when the op runs
        args[name] = _shapes.placeholder(shape, dt) if name in inputs else 0
    return tuple((tuple(s), np.dtype(jax.dtypes.canonicalize_dtype(DTYPES[d])))
                 for s, d in _shapes.infer(call.op, args))


def signature(values: Sequence[Any]) -> Signature:
    return tuple((tuple(np.shape(v)), dtype_name(np.dtype(v.dtype))) for v in values)


def _unbatch(shapes: Sequence[tuple[int, ...]], levels: Levels
             ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The batch sizes of the levels and each operand's unbatched shape."""
    sizes = []
    for i, mask in enumerate(levels):
        k = mask.index(True)
        sizes.append(shapes[k][sum(levels[j][k] for j in range(i))])
    return tuple(sizes), [tuple(s)[sum(m[k] for m in levels):] for k, s in enumerate(shapes)]


def _batched(fn: Callable[..., list], levels: Levels,
             keep: Levels | None = None) -> Callable[..., list]:
    """``fn`` of unbatched operands, vmapped over ``levels``. Outputs carry every level's
    axis, except where ``keep`` (per level, per output) is False: those are summed over it
    (the cotangent of an operand that the level does not batch)."""
    for i in reversed(range(len(levels))):
        fn = _vmap_level(fn, levels[i], None if keep is None else keep[i])
    return fn


def _vmap_level(fn: Callable[..., list], mask: tuple[bool, ...],
                keep: tuple[bool, ...] | None) -> Callable[..., list]:
    in_axes = tuple(0 if m else None for m in mask)

    def level(*args: Any) -> list:
        outs = jax.vmap(fn, in_axes=in_axes)(*args)
        return list(outs) if keep is None else [o if k else o.sum(0)
                                                for o, k in zip(outs, keep)]
    return level


# --------------------------------------------------------------------------------------
# The implementations
# --------------------------------------------------------------------------------------
def native_op(op_name: str) -> Callable[..., Any]:
    family = get_op_def(op_name).family
    try:
        module = importlib.import_module(f"tfgrad.jax._native.{family}")
    except ModuleNotFoundError as e:
        if e.name != f"tfgrad.jax._native.{family}":
            raise
        raise NotImplementedError(
            f"tfgrad.jax: there is no native implementation of {op_name} yet; use "
            "tfgrad.jax.use_impl('exact')") from None
    return getattr(module, op_name)


def takes_primal_outputs(op_name: str) -> bool:
    """Whether the op's native function takes ``primal_outputs``: the op's own outputs
    (TF's bits under the exact implementation), which its linearisation uses as constants
    where TF's gradient function reads the forward's outputs (the loss's backprop)."""
    return "primal_outputs" in inspect.signature(native_op(op_name)).parameters


def native_function(call: OpCall, with_outputs: bool = False) -> Callable[..., list]:
    """The native implementation as a function of the unbatched operands (followed, with
    ``with_outputs``, by the op's outputs, passed on as ``primal_outputs``)."""
    fn, kwargs = native_op(call.op), call.kwargs()
    n = len(call.names)

    def apply(*operands: jax.Array) -> list:
        extra = {"primal_outputs": tuple(operands[n:])} if with_outputs else {}
        operands = operands[:n]
        out = fn(**kwargs, **dict(zip(call.names, operands)), **extra)
        outs = out if isinstance(out, tuple) else (out,)
        want = specs(call, signature(operands))
        for o, (shape, _) in zip(outs, want):
            if tuple(o.shape) != shape:
                raise AssertionError(f"tfgrad.jax._native: {call.op} returned shape "
                                     f"{tuple(o.shape)}, expected {shape}")
        # (only the 64-bit sequences change: int32 without jax_enable_x64)
        return [jnp.asarray(o).astype(dt) for o, (_, dt) in zip(outs, want)]
    return apply


def exact_function(call: OpCall) -> Callable[..., list]:
    def result(operands: Sequence[jax.Array]) -> list[jax.ShapeDtypeStruct]:
        return [jax.ShapeDtypeStruct(s, d) for s, d in specs(call, signature(operands))]
    return _exact.function(call.op, call.names, dict(call.static), dict(call.attrs), result)


# --------------------------------------------------------------------------------------
# The op primitive
# --------------------------------------------------------------------------------------
_OP_PRIMITIVES: dict[str, Primitive] = {}
_LIN_PRIMITIVES: dict[str, Primitive] = {}


def op_primitive(op_name: str) -> Primitive:
    p = _OP_PRIMITIVES.get(op_name)
    if p is None:
        p = Primitive("tfgrad_" + get_op_def(op_name).snake_name)
        p.multiple_results = True
        p.def_impl(functools.partial(_eager, p))
        p.def_abstract_eval(_op_abstract)
        mlir.register_lowering(p, functools.partial(_op_lowering, cpu=False))
        mlir.register_lowering(p, functools.partial(_op_lowering, cpu=True), platform="cpu")
        batching.primitive_batchers[p] = functools.partial(_batch, p)
        ad.primitive_jvps[p] = _op_jvp
        _OP_PRIMITIVES[op_name] = p
    return p


def bind(op_name: str, operands: dict[str, Any], static: dict[str, tuple[int, ...]],
         attrs: dict[str, Any], impl: str, names: Sequence[str] | None = None
         ) -> dict[str, jax.Array]:
    """Apply an op (attrs normalised) to its operands; its outputs by name."""
    op = get_op_def(op_name)
    if names is None:
        names = tuple(i.name for i in op.inputs if not i.is_shape)
    call = OpCall(op_name, tuple(sorted(attrs.items())), tuple(sorted(static.items())),
                  tuple(names), impl)
    values = _vary_together([operands[n] for n in names])
    outs = op_primitive(op_name).bind(*values, call=call, levels=())
    return dict(zip((o.name for o in op.outputs), outs))


def _vary_together(values: list) -> list:
    """Under ``shard_map``: operands made to vary over the same manual axes, as jax.numpy
    does (so the gradient of an invariant operand is ``psum``-ed over the devices)."""
    varying = [jax.typeof(v).manual_axis_type.varying for v in values]
    union = frozenset().union(*varying)
    return [v if not (union - vs) else jax.lax.pcast(v, tuple(sorted(union - vs)), to="varying")
            for v, vs in zip(values, varying)]


@functools.lru_cache(maxsize=1024)
def _jitted(p: Primitive, params: tuple) -> Callable[..., Any]:
    kw = dict(params)
    return jax.jit(lambda *args: p.bind(*args, **kw))


def _eager(p: Primitive, *args: Any, **params: Any) -> Any:
    if jax.config.jax_disable_jit:  # run the implementation op by op
        levels = params["levels"]
        if "lin" in params:
            return _batched(functools.partial(_lin_value, params["lin"]), levels)(*args)
        call = params["call"]
        impl = _choice.resolve_eager(call.impl, list(args))
        fn = exact_function(call) if impl == "exact" else native_function(call)
        return _batched(fn, levels)(*args)
    return _jitted(p, tuple(sorted(params.items())))(*args)


def _aval(inputs: Sequence[ShapedArray], shape: tuple[int, ...], dtype: Any) -> ShapedArray:
    """An output's abstract value. Under ``shard_map`` it varies over the manual mesh axes
    any input varies over (the native code mixes them as jax.numpy does)."""
    varying = [a for a in inputs if a.manual_axis_type.varying]
    if not varying:
        return ShapedArray(shape, dtype)
    axes = frozenset().union(*(a.manual_axis_type.varying for a in varying))
    sharding = jax.sharding.NamedSharding(varying[0].sharding.mesh,
                                          jax.sharding.PartitionSpec(*(None,) * len(shape)))
    return varying[0].update(shape=shape, dtype=dtype, weak_type=False, sharding=sharding,
                             manual_axis_type=varying[0].manual_axis_type.update(varying=axes))


def _op_abstract(*avals: ShapedArray, call: OpCall, levels: Levels) -> list[ShapedArray]:
    sizes, base = _unbatch([a.shape for a in avals], levels)
    sig = tuple((s, dtype_name(np.dtype(a.dtype))) for s, a in zip(base, avals))
    return [_aval(avals, sizes + s, d) for s, d in specs(call, sig)]


def _local(ctx: Any) -> Any:
    """The lowering context with plain operand types: an op is one device's computation,
    so under ``shard_map`` its implementation must not see the manual axes (JAX would make
    its internal derivatives sum over the devices)."""
    def plain(avals: Any) -> Any:
        return [ShapedArray(a.shape, a.dtype) if isinstance(a, ShapedArray) else a
                for a in avals]
    return ctx.replace(avals_in=plain(ctx.avals_in), avals_out=plain(ctx.avals_out))


def _op_lowering(ctx: Any, *args: Any, call: OpCall, levels: Levels, cpu: bool) -> Any:
    impl = _choice.resolve(call.impl, ctx, cpu)
    if impl == "exact":
        fn = _batched(exact_function(call), levels)
    else:
        fn = _fenced(_batched(native_function(call), levels))
    return mlir.lower_fun(fn, multiple_results=True)(_local(ctx), *args)


def _rounded(v: Any) -> Any:
    """A floating ``v`` through a select on itself (``v`` where ``v == v``, else ``v + v``:
    ``v`` in every case, a NaN's payload kept): whatever consumes it consumes a select,
    not the multiply that may have produced it. The condition varies per element: LLVM
    moves a multiply past a select whose condition is uniform (``where(flag, 0, a * b) +
    c`` with a scalar flag was contracted, measured). Other dtypes unchanged."""
    if not jnp.issubdtype(v.dtype, jnp.floating):
        return v
    return jnp.where(v == v, v, v + v)


def _fenced(fn: Callable[..., list]) -> Callable[..., list]:
    """``fn`` with every floating input and output rounded as TF rounds them: each passes
    through :func:`_rounded`, so XLA:CPU cannot contract a multiply on one side of the
    op's boundary and an add on the other into one FMA (XLA compiles with LLVM's FP-op
    fusion on). Measured with jax 0.10.2 on 100,000 elements: without the selects
    FakeQuantWithMinMaxVars' output added to by the caller differed in 24-37% of the
    elements, batch norm's inference ``y`` (scale, offset, mean, variance the caller's
    products) in 16-19%, ``x_backprop`` added to in 20-33%; 0 with them
    (tests/test_jax_native.py). The optimization barriers around the op keep XLA's
    algebraic simplifier from rewriting across the boundary (it runs while they stand: a
    division by a constant behind one stays a division, measured), but they do not stop the
    contraction: XLA:CPU removes them before fusion and code generation (so the caller's
    elementwise code may also be fused into the op's loops; the selects keep the bits)."""
    def fenced(*args: Any) -> list:
        ins = jax.lax.optimization_barrier(tuple(_rounded(a) for a in args))
        return [_rounded(o) for o in jax.lax.optimization_barrier(tuple(fn(*ins)))]
    return fenced


def _batch(p: Primitive, args: Sequence[Any], dims: Sequence[Any], *, levels: Levels,
           **params: Any) -> tuple[list, list[int]]:
    """A new level, its axis moved to the front of the operands it batches."""
    mask = tuple(d is not None for d in dims)
    args = [a if d is None else jnp.moveaxis(a, d, 0)
            for a, d in zip(args, dims)]
    outs = p.bind(*args, levels=(mask,) + levels, **params)
    return outs, [0] * len(outs)


def _no_gradient(op_name: str) -> LookupError:
    return LookupError(
        f"tfgrad.jax: TF 2.21 defines no gradient for {op_name} (TF: 'No gradient defined "
        f"for operation ... (op type: {op_name})'), so it cannot be differentiated: a "
        "second derivative of fake quantization or fractional max pooling does not exist in "
        "TF")


def _op_jvp(primals: Sequence[Any], tangents: Sequence[Any], *, call: OpCall,
            levels: Levels) -> tuple[list, list]:
    outs = op_primitive(call.op).bind(*primals, call=call, levels=levels)
    out_names = [o.name for o in get_op_def(call.op).outputs]
    tangents_out: list[Any] = [ad.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]
    live = [n for n, x, t in zip(call.names, primals, tangents)
            if type(t) is not ad.Zero and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not live:
        return outs, tangents_out
    if not _gradients.has_gradient(call.op):
        raise _no_gradient(call.op)
    index = {n: i for i, n in enumerate(call.names)}
    if call.op in _gradients.LINEARISED and call.op not in _COMPOSITES:
        lin = _gradients.LINEARISED[call.op]
        tans = [n for n in live if n in lin.inputs]
        douts: Sequence[str] = lin.outputs
        if not tans:
            return outs, tangents_out
        # (an op whose gradient function reads its own outputs gets them: the exact
        # implementation's, not the native code's re-computation)
        with_outputs = takes_primal_outputs(call.op)
        native = _batched(native_function(call, with_outputs),
                          tuple(m + (True,) * len(outs) for m in levels)
                          if with_outputs else levels)
        consts = list(outs) if with_outputs else []

        def restricted(*values: Any) -> list:
            operands = list(primals)
            for n, v in zip(tans, values):
                operands[index[n]] = v
            result = native(*operands, *consts)
            return [result[out_names.index(o)] for o in douts]

        _, touts = jax.jvp(restricted, [primals[index[n]] for n in tans],
                           [tangents[index[n]] for n in tans])
    else:
        gives, used = _uses(call)
        tans = [n for n in live if n in gives]
        if not tans:
            return outs, tangents_out
        douts = tuple(n for n in out_names if ("grad", n) in used)
        saved = tuple(n for n in out_names if ("output", n) in used)
        lin = Linearisation(call, saved, tuple(tans), douts)
        masks = tuple(m + (True,) * len(saved) + tuple(m[index[n]] for n in tans)
                      for m in levels)
        touts = lin_primitive(call.op).bind(
            *primals, *(outs[out_names.index(n)] for n in saved),
            *(tangents[index[n]] for n in tans), lin=lin, levels=masks)
    for n, t in zip(douts, touts):
        tangents_out[out_names.index(n)] = t
    return outs, tangents_out


# --------------------------------------------------------------------------------------
# TF's gradient, from the table
# --------------------------------------------------------------------------------------
Runner = Callable[[str, dict, dict, dict, str], dict]


def _run_native(op_name: str, operands: dict, static: dict, attrs: dict, impl: str) -> dict:
    op = get_op_def(op_name)
    call = OpCall(op_name, tuple(sorted(attrs.items())), tuple(sorted(static.items())),
                  tuple(i.name for i in op.inputs if not i.is_shape), impl)
    outs = native_function(call)(*(operands[n] for n in call.names))
    return dict(zip((o.name for o in op.outputs), outs))


def _softmax_grad(xs: dict, outs: dict, cts: dict, impl: str, run: Runner) -> dict[str, Any]:
    """TF's _SoftmaxGrad (nn_grad.py), a composite of TF ops: ``(grad - Sum(grad *
    softmax, -1, keep_dims)) * softmax``, on tfgrad's Sum; the last product rounded
    before anything consumes it (no FMA with a later add)."""
    y, g = outs["softmax"], cts["softmax"]
    s = run("Sum", {"input": g * y}, {"axis": (y.ndim - 1,)}, {"keep_dims": True},
            impl)["output"]
    return {"logits": _rounded((g - s) * y)}


@dataclass(frozen=True)
class _Composite:
    """A gradient TF writes as a composite of ops rather than as gradient ops."""

    fn: Callable[[dict, dict, dict, str, Runner], dict[str, Any]]
    gives: tuple[str, ...]
    reads: tuple[tuple[str, str], ...]
    """(kind, name): the forward outputs and incoming gradients it reads."""


_COMPOSITES = {
    "Softmax": _Composite(_softmax_grad, ("logits",), (("output", "softmax"),
                                                       ("grad", "softmax"))),
}
"""Reverse mode of these ops is TF's composite, through the linearisation primitive as the
table's gradient ops are (the op table's LINEARISED entry serves torch's portable vjp)."""


def _uses(call: OpCall) -> tuple[set[str], list[tuple[str, str]]]:
    """The inputs TF's gradient gives gradients of, and what it reads."""
    comp = _COMPOSITES.get(call.op)
    if comp is not None:
        return set(comp.gives), list(comp.reads)
    steps = _gradients.steps(call.op, dict(call.attrs))
    return ({k for s in steps for k, _, _ in s.gives},
            [(kind, name) for s in steps for _, kind, name, _ in s.sources])


def _gradient(call: OpCall, xs: dict, outs: dict, cts: dict, want: Sequence[str],
              run: Runner = bind) -> dict[str, Any]:
    """TF's gradient function: the gradient ops ``calls(op, attrs)`` name, with the forward
    inputs ``xs``, outputs ``outs`` and the outputs' cotangents ``cts`` (unbatched)."""
    comp = _COMPOSITES.get(call.op)
    if comp is not None:
        return {k: v for k, v in comp.fn(xs, outs, cts, call.impl, run).items() if k in want}
    attrs = dict(call.attrs)
    grads = {}
    for step in _gradients.steps(call.op, attrs):
        if not any(k in want for k, _, _ in step.gives):
            continue
        operands, static = {}, {}
        for name, kind, src, _ in step.sources:
            if kind == "shape":
                static[name] = tuple(int(d) for d in np.shape(xs[src]))
            else:
                operands[name] = {"input": xs, "output": outs, "grad": cts}[kind][src]
        result = run(step.op, operands, static, step.call_attrs(attrs), call.impl)
        names = get_op_def(step.op).outputs
        grads.update({k: result[names[o].name] for k, _, o in step.gives if k in want})
    return grads


# --------------------------------------------------------------------------------------
# The linearisation primitive
# --------------------------------------------------------------------------------------
def lin_primitive(op_name: str) -> Primitive:
    p = _LIN_PRIMITIVES.get(op_name)
    if p is None:
        p = Primitive("tfgrad_" + get_op_def(op_name).snake_name + "_jvp")
        p.multiple_results = True
        p.def_impl(functools.partial(_eager, p))
        p.def_abstract_eval(_lin_abstract)
        mlir.register_lowering(p, _lin_lowering)
        batching.primitive_batchers[p] = functools.partial(_batch, p)
        ad.primitive_jvps[p] = _lin_jvp
        ad.primitive_transposes[p] = _lin_transpose
        _LIN_PRIMITIVES[op_name] = p
    return p


def _split(lin: Linearisation, operands: Sequence[Any]) -> tuple[dict, dict, list]:
    n, m = len(lin.call.names), len(lin.outputs)
    return (dict(zip(lin.call.names, operands[:n])), dict(zip(lin.outputs, operands[n:n + m])),
            list(operands[n + m:]))


def _lin_abstract(*avals: ShapedArray, lin: Linearisation, levels: Levels
                  ) -> list[ShapedArray]:
    n = len(lin.call.names)
    sizes, base = _unbatch([a.shape for a in avals], levels)
    sig = tuple((s, dtype_name(np.dtype(a.dtype))) for s, a in zip(base[:n], avals[:n]))
    out = dict(zip((o.name for o in get_op_def(lin.call.op).outputs), specs(lin.call, sig)))
    return [_aval(avals, sizes + out[o][0], out[o][1]) for o in lin.diff_outputs]


def _lin_value(lin: Linearisation, *operands: Any) -> list:
    """The tangents of the outputs (unbatched): the transpose of TF's gradient, as the
    derivative of the gradient with respect to the incoming cotangents."""
    xs, outs, tangents = _split(lin, operands)
    out_specs = dict(zip((o.name for o in get_op_def(lin.call.op).outputs),
                         specs(lin.call, signature(list(xs.values())))))
    calls = [c for c in _gradients.calls(lin.call.op, dict(lin.call.attrs))
             if set(c.gives) & set(lin.tangents)]
    # TF differentiates the gradient ops through the table where it can (depthwise,
    # batch norm, average pooling); elsewhere JAX differentiates the native gradient op.
    run = bind if all(_gradients.has_gradient(c.op) for c in calls) else _run_native

    def gradient(*cts: Any) -> list:
        g = _gradient(lin.call, xs, outs, dict(zip(lin.diff_outputs, cts)), lin.tangents, run)
        return [g[t] for t in lin.tangents]

    # The gradient is linear in the cotangents: its derivative anywhere is the gradient
    # itself (at ones, not zeros: flushing denormal cotangents, as TF's FTZ does, has a
    # zero derivative at 0).
    _, pull = jax.vjp(gradient, *(jnp.ones(*out_specs[o]) for o in lin.diff_outputs))
    return list(pull(tangents))


def _lin_lowering(ctx: Any, *args: Any, lin: Linearisation, levels: Levels) -> Any:
    fn = _batched(functools.partial(_lin_value, lin), levels)
    return mlir.lower_fun(fn, multiple_results=True)(_local(ctx), *args)


def _lin_jvp(primals: Sequence[Any], tangents: Sequence[Any], *, lin: Linearisation,
             levels: Levels) -> tuple[list, list]:
    fn = _batched(functools.partial(_lin_value, lin), levels)
    out, tout = jax.jvp(fn, list(primals), [ad.instantiate_zeros(t) for t in tangents])
    return list(out), list(tout)


def _lin_transpose(cts: Sequence[Any], *operands: Any, lin: Linearisation,
                   levels: Levels) -> list:
    """TF's gradient (reverse mode)."""
    k = len(lin.call.names) + len(lin.outputs)
    fixed, tangents = operands[:k], operands[k:]
    if any(ad.is_undefined_primal(x) for x in fixed):
        raise NotImplementedError("tfgrad.jax: a linearisation's saved values are linear")
    cts = [ad.instantiate_zeros(ct) for ct in cts]

    def gradient(*args: Any) -> list:
        xs, outs, cs = _split(lin, args)
        g = _gradient(lin.call, xs, outs, dict(zip(lin.diff_outputs, cs)), lin.tangents)
        return [g[t] for t in lin.tangents]

    in_levels = tuple(m[:k] + (True,) * len(cts) for m in levels)
    keep = tuple(m[k:] for m in levels)
    grads = _batched(gradient, in_levels, keep)(*fixed, *cts)
    return [None] * k + [g if ad.is_undefined_primal(t) else None
                         for g, t in zip(grads, tangents)]
