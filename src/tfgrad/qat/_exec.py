"""A QAT model's exact path as one program of TF's ops on NumPy arrays, and its gradient.

:class:`Program` runs a plan's layers as ``tfgrad.torch.qat``'s exact path runs them, op for
op (the quantizers' range updates in float32, fake quantization, Conv2D, depthwise
convolution, batch norm, MatMul, BiasAdd, Relu/Relu6, Mean, pooling, Softmax, adds, pads,
concatenations, reshapes), recording each op on a tape; :meth:`Tape.backward` replays the
tape in reverse with TF's gradient functions: the gradient ops of
:data:`tfgrad._gradients.GRADIENTS`, TF's composites for Mean (the gradient broadcast and
divided by the float32 count) and Softmax (``(g - Sum(g * y, -1)) * y``), a gradient
reaching a tensor from several consumers added in the order they arrive (the reverse of
the forward, as torch's engine adds them). A framework wraps a whole training step in one
autograd node around it, and pays the Python of one call per op instead of its own
machinery per op (``tfgrad.torch.qat``: ``KerasModel.fused``).

Layers it does not run (2-D batch norm, dilated Conv2D, separable convolutions, other
activations, dropout while training): :func:`unsupported` names the first; the framework
then runs the model layer by layer.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _api, _gradients
from .._opdefs import OPS
from .._opdefs._types import REQUIRED
from .._tf.fpenv import flushed
from .._tf.minmax import numpy_batch_range  # (the adapters pass TF's bits: dispatch.minmax)
from .._validate import max_bytes_set
from ._plan import Node, Plan, Quantizer, _padding2d
from ._ranges import RangeOps, updated_range

F32 = np.float32
_EMA = F32(1.0 - 0.999)  # float32(1 - 0.999), as assign_moving_average converts it
_ACTIVATIONS = ("linear", "noop", "relu", "relu6", "softmax")
MinMax = Callable[[np.ndarray, bool], tuple[np.ndarray, np.ndarray]]
"""The batch's range: reduce_min / reduce_max over all axes, or per last axis."""


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def unsupported(plan: Plan) -> str | None:
    """Why the program cannot run this plan (its first such layer), or None."""
    for n in plan.nodes:
        kind, cfg = n.kind, n.config
        why = None
        if kind in ("InputLayer", "QuantizeLayer", "Add", "Concatenate", "ZeroPadding2D",
                    "AveragePooling2D", "MaxPooling2D", "GlobalAveragePooling2D",
                    "Dropout", "Flatten", "Reshape"):
            pass
        elif kind == "Conv2D":
            if _pair(cfg.get("dilation_rate", 1)) != (1, 1):
                why = "a dilated Conv2D"
        elif kind == "DepthwiseConv2D":
            pass
        elif kind == "Dense":
            if len(n.input_shapes[0]) != 2:
                why = "a Dense layer on a tensor of rank above 2"
        elif kind == "BatchNormalization":
            if len(n.input_shapes[0]) != 4:
                why = "a batch norm of rank 2"
        elif kind == "ReLU":
            mx = cfg.get("max_value")
            if mx is not None and float(mx) != 6.0:
                why = "a ReLU with max_value other than 6"
        elif kind == "Softmax":
            if int(cfg.get("axis", -1)) not in (-1, len(n.output_shape) - 1):
                why = "a softmax over another axis than the last"
        elif kind != "Activation":
            why = f"a {kind} layer"
        if why is None and n.activation not in _ACTIVATIONS:
            why = f"the activation {n.activation!r}"
        if why is not None:
            return f"layer {n.name!r}: {why}"
    return None


def _defaults(op_name: str) -> dict[str, Any]:
    return {a.name: a.default for a in OPS[op_name].attrs if a.default is not REQUIRED}


_DEFAULTS = {name: _defaults(name) for name in OPS}


_NUMPY_OPS = RangeOps(np.minimum, np.maximum)


@dataclass
class Tape:
    """The values of one forward and the ops between them (slots: indices of ``values``)."""

    values: list[np.ndarray]
    records: list[tuple[str, dict[str, int], dict[str, Any], tuple[int, ...]]]
    needs: list[bool]
    """Whether a gradient must reach the slot (it leads to a leaf that wants one)."""
    traces: dict[Any, list] | None = None
    """The backward's op calls by the outputs' gradients' signature (:class:`_Ops`), kept
    by the program for the signature of the forward that made this tape."""
    steps: dict[int, list] | None = None
    """Each record's gradient calls worked out (:meth:`_prepared`), by record, kept
    likewise: the same for every tape of that signature."""

    def backward(self, grads: Mapping[int, np.ndarray]) -> list[np.ndarray | None]:
        """The gradient of every slot (None where none reaches it), from the outputs'."""
        traces = self.traces
        sig = None
        if traces is not None:
            sig = tuple((s, type(v), v.dtype, v.shape, v.strides) for s, v in grads.items())
        ops = self._ops = _Ops(traces, sig)
        g = self._backward(grads)
        ops.keep()
        return g

    def _backward(self, grads: Mapping[int, np.ndarray]) -> list[np.ndarray | None]:
        g: list[np.ndarray | None] = [None] * len(self.values)
        for slot, v in grads.items():
            g[slot] = v
        vals, needs = self.values, self.needs

        def add(slot: int, v: np.ndarray) -> None:
            if needs[slot]:
                old = g[slot]
                g[slot] = v if old is None else old + v

        for at in range(len(self.records) - 1, -1, -1):
            name, ins, attrs, outs = self.records[at]
            gouts = [g[s] for s in outs]
            if all(x is None for x in gouts):
                continue
            if name == "add":  # y = a + b + ...: each operand gets the gradient
                for s in ins.values():
                    add(s, gouts[0])
            elif name == "pad":
                (t, b), (lf, r) = attrs["pads"]
                y = gouts[0]
                add(ins["x"], y[:, t:y.shape[1] - b, lf:y.shape[2] - r, :])
            elif name == "concat":
                axis, at = attrs["axis"], 0
                for s in ins.values():
                    n = vals[s].shape[axis]
                    add(s, np.take(gouts[0], np.arange(at, at + n), axis=axis))
                    at += n
            elif name == "reshape":
                add(ins["x"], gouts[0].reshape(vals[ins["x"]].shape))
            elif name == "Mean":  # TF's _MeanGrad: broadcast, divided by float32(count)
                x = vals[ins["input"]]
                y = vals[outs[0]]
                count = F32(x.size // max(1, y.size))
                keep = [1 if a in attrs["axis"] else d for a, d in enumerate(x.shape)]
                add(ins["input"], np.ascontiguousarray(
                    np.broadcast_to(gouts[0].reshape(keep) / count, x.shape)))
            elif name == "Softmax":  # TF's _SoftmaxGrad on TF's Sum, flushed as TF's FTZ
                y, gy = vals[outs[0]], gouts[0]
                s = self._ops.call("Sum", {"input": flushed(gy * y), "axis": [y.ndim - 1],
                                           "keep_dims": True})
                add(ins["logits"], flushed(flushed(gy - s) * y))
            else:
                self._gradient(at, name, ins, attrs, outs, gouts, add)
        return g

    def reads(self) -> tuple[set[int], set[int]]:
        """The slots whose values :meth:`backward` reads, and those whose shapes alone
        it reads (a framework that keeps the tape's values elsewhere between the forward
        and the backward keeps only the first)."""
        values: set[int] = set()
        shapes: set[int] = set()
        for name, ins, attrs, outs in self.records:
            if name in ("add", "pad"):
                continue
            if name == "concat":
                shapes.update(ins.values())
            elif name == "reshape":
                shapes.add(ins["x"])
            elif name == "Mean":
                shapes.update((ins["input"], outs[0]))
            elif name == "Softmax":
                values.add(outs[0])
            else:  # (as _gradient reads them)
                for step in _gradients.steps(name, attrs):
                    if step.op == "Identity":
                        continue
                    for _, kind, src, k in step.sources:
                        if kind == "grad":  # (zeros of its shape where no gradient came)
                            shapes.add(outs[k])
                        elif kind == "shape":
                            shapes.add(ins[src])
                        elif kind == "input":
                            values.add(ins[src])
                        else:
                            values.add(outs[k])
        return values, shapes - values

    def _prepared(self, at: int, name: str, ins: dict[str, int], attrs: dict[str, Any],
                  outs: tuple[int, ...]) -> list[tuple]:
        """Record ``at``'s gradient calls that reach a slot wanting a gradient: (op or None
        for an Identity, its attrs, its inputs as (argument, kind, output index, slot),
        the (slot, result index) of each gradient it gives)."""
        memo = self.steps
        found = memo.get(at) if memo is not None else None
        if found is None:
            needs = self.needs
            found = []
            for step in _gradients.steps(name, attrs):
                if not any(k in ins and needs[ins[k]] for k, _, _ in step.gives):
                    continue
                if step.op == "Identity":  # (BiasAdd's value: the gradient itself)
                    found.append((None, None, step.sources[0][3],
                                  tuple((ins[k], 0) for k, _, _ in step.gives)))
                    continue
                sources = tuple((arg, kind, k, ins[src] if kind in ("shape", "input")
                                 else outs[k]) for arg, kind, src, k in step.sources)
                found.append((step.op, step.call_attrs(attrs), sources,
                              tuple((ins[k], r) for k, _, r in step.gives if k in ins)))
            if memo is not None:
                memo[at] = found
        return found

    def _gradient(self, at: int, name: str, ins: dict[str, int], attrs: dict[str, Any],
                  outs: tuple[int, ...], gouts: list[Any], add: Callable) -> None:
        """TF's gradient function of a raw op: the table's gradient calls."""
        vals = self.values
        for op, base, sources, gives in self._prepared(at, name, ins, attrs, outs):
            if op is None:
                for slot, _ in gives:
                    add(slot, gouts[sources])
                continue
            args = dict(base)
            for arg, kind, k, slot in sources:
                if kind == "grad":
                    v = gouts[k]
                    args[arg] = v if v is not None else np.zeros_like(vals[slot])
                elif kind == "shape":
                    args[arg] = list(vals[slot].shape)
                else:
                    args[arg] = vals[slot]
            res = self._ops.call(op, args)
            res = res if isinstance(res, tuple) else (res,)
            for slot, r in gives:
                add(slot, res[r])


def _op(name: str, args: dict[str, Any]) -> Any:
    """tfgrad's raw op on NumPy arrays: an array, or a tuple of them."""
    return _api.run(OPS[name], args)


def _replayed(name: str, entry: tuple | None, args: dict[str, Any]) -> Any:
    """A call noted on an earlier run of the same signature: on its signature-cache entry,
    or the plain call where the cache kept none."""
    return _op(name, args) if entry is None else _api.run_cached(name, entry, args)


def _bound(entry: tuple | None, ins: dict[str, int], full: dict[str, Any]
           ) -> tuple[Callable, dict[str, Any], tuple[tuple[str, int], ...]] | None:
    """A script's op call on its signature-cache entry, worked out once
    (:func:`tfgrad._api.split_entry`, the script's attrs as its constants): the entry's
    rest, its arguments but the slots' values, and the (argument, slot) pairs those come
    from; None without an entry."""
    if entry is None:
        return None
    rest, args, names = _api.split_entry(entry, full)
    if any(n not in ins for n in names):
        return None
    return rest, args, tuple((n, ins[n]) for n in names)


_TRACES = 8  # signatures kept per program (forwards) and per forward (backwards)


class Tapes:
    """Forwards' tapes kept host-side for their backwards, by a token (an int) that the
    framework passes through its graph instead of the tape's values (tfgrad.jax.qat's
    callbacks, tfgrad.torch.qat's compiled operator). At most ``keep`` are kept: a
    backward takes its tape; a forward whose backward never runs is dropped in turn."""

    KEEP = 4

    def __init__(self, keep: int | None = None) -> None:
        self.keep = self.KEEP if keep is None else keep
        self.tapes: dict[int, Any] = {}
        self.lock = threading.Lock()
        self.count = itertools.count(1)

    def put(self, values: Any) -> int:
        token = next(self.count) % (2**31 - 1)  # (fits an int32: JAX's default int)
        with self.lock:
            while len(self.tapes) >= self.keep:
                self.tapes.pop(next(iter(self.tapes)))
            self.tapes[token] = values
        return token

    def take(self, token: int) -> Any:
        """The tape of ``token`` (removed), or None where it is gone."""
        with self.lock:
            return self.tapes.pop(token, None)

    def get(self, token: int) -> Any:
        """The tape of ``token`` (kept), or None where it is gone."""
        with self.lock:
            return self.tapes.get(token)

    def clear(self) -> None:
        with self.lock:
            self.tapes.clear()


class _Sig:
    """A forward's signature (a tuple) with its hash computed once: it spans every state
    array, and a tuple's hash is recomputed at each dict lookup."""

    __slots__ = ("t", "h")

    def __init__(self, t: tuple):
        self.t, self.h = t, hash(t)

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is _Sig and self.t == other.t)


class _Ops:
    """The raw-op calls of one forward or backward, in order. The first run of a
    signature (every leaf's type, dtype, shape and strides, and the flags: so every op's
    arguments have the same signatures, op after op) notes each call's entry in
    tfgrad._api's signature cache; a later run of that signature calls the entries one
    after the other instead of computing and looking up each call's signature (the
    per-call checks and compute stay the entry's). A call whose name differs from the
    noted one (never expected) ends the replay: the rest runs the plain way."""

    def __init__(self, traces: dict[Any, list] | None, sig: Hashable | None):
        self.traces, self.sig = traces, sig
        self.replay: list | None = None
        self.trace: list | None = None
        if traces is not None and sig is not None and not max_bytes_set():
            self.replay = traces.get(sig)
            if self.replay is None:
                self.trace = []
        self.k = 0

    def call(self, name: str, args: dict[str, Any]) -> Any:
        r = self.replay
        if r is not None:
            k = self.k
            self.k = k + 1
            if k < len(r) and r[k][0] == name:
                return _replayed(name, r[k][1], args)
            self.replay = None
        op = OPS[name]
        key = _api.signature(op, args)
        res = _api.run(op, args, key)
        if self.trace is not None:
            self.trace.append((name, _api.cached(key)))
        return res

    def keep(self) -> None:
        """Keep the trace of a run that ended (the first of its signature)."""
        traces = self.traces
        if self.trace is not None and traces is not None:
            if len(traces) >= _TRACES:
                traces.clear()
            traces[self.sig] = self.trace
            self.trace = None


# The steps of a forward's script (:class:`_Run`): how a replay makes each value again.
_OP, _INPUT, _STATE, _COPY, _CONST, _DERIVED, _RANGE, _STATS = range(8)


def _add(*vals: np.ndarray) -> np.ndarray:
    total = vals[0]
    for other in vals[1:]:
        total = total + other
    return total


def _concat(*args: Any) -> np.ndarray:
    return np.concatenate(args[:-1], axis=args[-1])


def _pad(v: np.ndarray, pads: tuple) -> np.ndarray:
    (t, b), (lf, r) = pads  # (zeros, the image copied in: np.pad's result, ~10x sooner)
    out = np.zeros((v.shape[0], v.shape[1] + t + b, v.shape[2] + lf + r, v.shape[3]), v.dtype)
    out[:, t:t + v.shape[1], lf:lf + v.shape[2], :] = v
    return out


def _reshape(v: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return v.reshape(shape)


class _Run:
    """One forward: values, and the tape when a gradient is wanted. The first run of a
    signature also writes its script (``script``): each value's step, which
    :meth:`Program._replay` runs for the later forwards of that signature instead of
    walking the layers again (the records and slots are the same)."""

    def __init__(self, grad: bool, minmax: MinMax,
                 replica_mean: Callable[[np.ndarray], np.ndarray] | None, ops: _Ops,
                 script: list | None = None):
        self.ops = ops
        self.script = script
        self.values: list[np.ndarray] = []
        self.needs: list[bool] = []
        self.records: list[tuple[str, dict[str, int], dict[str, Any], tuple[int, ...]]] = []
        self.grad = grad
        self.minmax = minmax
        self.range_ops = _NUMPY_OPS if replica_mean is None else _NUMPY_OPS._replace(
            replica_mean=lambda lo, hi: (replica_mean(lo), replica_mean(hi)))

    def leaf(self, v: np.ndarray, needs: bool = False, src: tuple | None = None) -> int:
        """A value the tape starts from; ``src``: how a replay gets it ((_INPUT, k),
        (_STATE, key), (_COPY, key): a copy of a state array), None: ``v`` itself."""
        self.values.append(v)
        self.needs.append(needs and self.grad)
        if self.script is not None:
            self.script.append((_CONST, v) if src is None else src)
        return len(self.values) - 1

    def _record(self, name: str, ins: dict[str, int], attrs: dict[str, Any],
                outs: Sequence[np.ndarray]) -> tuple[int, ...]:
        needs = False
        if self.grad:
            wants = self.needs
            for s in ins.values():
                if wants[s]:
                    needs = True
                    break
        values, wants = self.values, self.needs
        slots = []
        for o in outs:
            slots.append(len(values))
            values.append(o)
            wants.append(needs)
        if needs:
            self.records.append((name, ins, attrs, tuple(slots)))
        return tuple(slots)

    def op(self, name: str, ins: dict[str, int], **attrs: Any) -> tuple[int, ...]:
        """Run raw op ``name`` (inputs by slot; attrs and shape inputs as given, the rest
        TF's defaults); its outputs' slots."""
        full = {**_DEFAULTS[name], **attrs}
        args = dict(full)
        for k, s in ins.items():
            args[k] = self.values[s]
        res = self.ops.call(name, args)
        if self.script is not None:  # (the call's signature-cache entry, as _Ops notes it)
            trace = self.ops.trace
            entry = trace[-1][1] if trace else None
            self.script.append((_OP, name, entry, ins, full, _bound(entry, ins, full)))
        return self._record(name, ins, full, res if isinstance(res, tuple) else (res,))

    def op1(self, name: str, ins: dict[str, int], **attrs: Any) -> int:
        return self.op(name, ins, **attrs)[0]

    def derived(self, name: str, ins: dict[str, int], fn: Callable[..., np.ndarray],
                *extra: Any, **attrs: Any) -> int:
        """A value the tape differentiates itself (``name``: add, concat, pad, reshape):
        ``fn(*inputs' values, *extra)``."""
        out = fn(*[self.values[s] for s in ins.values()], *extra)
        if self.script is not None:
            self.script.append((_DERIVED, fn, tuple(ins.values()), extra))
        return self._record(name, ins, attrs, (out,))[0]

    def side(self, step: tuple) -> None:
        """A step that writes the state (a range update, batch norm's statistics), run now
        and kept in the script."""
        if self.script is not None:
            self.script.append(step)


@dataclass
class State:
    """The arrays one forward reads and updates, by (layer name, attribute): the Keras
    weights (``kernel``, ``moving_mean``, ...) and each quantizer's range as
    ``<where>_min`` / ``<where>_max`` (``kernel``, ``pre_activation``,
    ``post_activation``, ``output``). Updated in place: ranges and moving statistics."""

    arrays: Mapping[tuple[str, str], np.ndarray]
    trainable: Mapping[tuple[str, str], bool]
    """Which arrays want gradients (their slots are leaves of the tape)."""
    training: Mapping[str, bool]
    """Per layer (Keras' training flag); quantizers under ``<layer>/<where>``."""
    layout: Mapping[tuple[str, str], np.ndarray] | None = None
    """Arrays whose types, dtypes, shapes and strides stand for ``arrays``' in the
    forward's signature, where the caller has them as the same objects call after call
    and passes fresh copies of them as ``arrays`` (see :meth:`Program._arrays_signature`);
    None: ``arrays`` themselves."""


class Program:
    """A plan's exact path on NumPy arrays (see the module's docstring)."""

    def __init__(self, plan: Plan):
        why = unsupported(plan)
        if why is not None:
            raise ValueError(f"tfgrad.qat: the fused program does not run {why}")
        self.plan = plan
        self._walk = [n for n in plan.nodes if n.kind != "InputLayer"]
        self._dropout = [n for n in self._walk if n.kind == "Dropout"]
        self._traces: dict[_Sig, list] = {}
        self._scripts: dict[_Sig, tuple] = {}
        self._backward_traces: dict[_Sig, tuple[dict[Any, list], dict[int, list]]] = {}
        self._last_arrays: tuple | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (torch.save of a model) without the traces: they hold the ops' prepared
        closures, and a new process prepares its own."""
        state = dict(self.__dict__)
        state["_traces"], state["_backward_traces"], state["_scripts"] = {}, {}, {}
        state["_last_arrays"] = None
        return state

    def _arrays_signature(self, arrays: Mapping[tuple[str, str], np.ndarray]) -> tuple:
        """The state arrays' part of a forward's signature: (name, type, dtype, shape,
        strides) of each. A framework passes the same array objects step after step (its
        parameters' views): then the last part is reused, not rebuilt (~450 arrays in a
        MobileNetV2). The arrays are kept, so that their ids stay theirs. (An array whose
        shape or strides were set in place would go unseen: the callers pass views of
        their own, torch's cached per tensor and checked against its memory and shape,
        JAX's fresh each call.)"""
        keys, held = tuple(arrays), tuple(arrays.values())
        ids = tuple(map(id, held))
        last = getattr(self, "_last_arrays", None)  # (a program pickled before it had one)
        if last is not None and last[0] == keys and last[1] == ids:
            return last[3]
        part = tuple((k, type(a), a.dtype, a.shape, a.strides) for k, a in arrays.items())
        self._last_arrays = (keys, ids, held, part)
        return part

    def runs(self, training: Mapping[str, bool]) -> bool:
        """Whether the program runs the model with these training flags (dropout while
        training needs the framework's random numbers)."""
        return not any(training.get(n.name, False) and float(n.config.get("rate", 0.0)) > 0
                       for n in self._dropout)

    def forward(self, inputs: Sequence[np.ndarray], state: State, grad: bool,
                inputs_need_grad: Sequence[bool] = (),
                minmax: MinMax = numpy_batch_range,
                replica_mean: Callable[[np.ndarray], np.ndarray] | None = None
                ) -> tuple[list[np.ndarray], Tape, dict[tuple[str, str], int], list[int]]:
        """The model's outputs on ``inputs`` (ranges and statistics updated in ``state``
        where training); the tape, the slot of each trainable array, the inputs' slots
        and the outputs' slots (last)."""
        sig = _Sig((grad, tuple(bool(n) for n in inputs_need_grad),
                    tuple((type(x), x.dtype, x.shape, x.strides) for x in inputs),
                    self._arrays_signature(state.arrays if state.layout is None
                                           else state.layout),
                    tuple(state.trainable.items()), tuple(state.training.items())))
        script = getattr(self, "_scripts", {}).get(sig)  # (pickled before it had them)
        if script is not None and not max_bytes_set():
            run = self._replay(script, inputs, state, grad, minmax, replica_mean)
            leaves, in_slots, outs = script[3], script[4], script[5]
        else:
            ops = _Ops(self._traces, sig)
            run = _Run(grad, minmax, replica_mean, ops,
                       [] if ops.trace is not None else None)
            values: dict[str, int] = {}
            in_slots = []
            for k, (name, x) in enumerate(zip(self.plan.inputs, inputs)):
                need = bool(inputs_need_grad[k]) if k < len(inputs_need_grad) else False
                values[name] = run.leaf(x, need, (_INPUT, k))
                in_slots.append(values[name])
            leaves = {}
            for node in self._walk:
                values[node.name] = self._layer(run, node, [values[i] for i in node.inputs],
                                                 state, leaves)
            outs = [values[o] for o in self.plan.outputs]
            ops.keep()
            if run.script is not None:
                scripts = self.__dict__.setdefault("_scripts", {})
                if len(scripts) >= _TRACES:
                    scripts.clear()
                scripts[sig] = (run.script, run.records, run.needs, leaves, in_slots, outs)
        backward = self._backward_traces
        memo = backward.get(sig)
        if memo is None:
            if len(backward) >= _TRACES:
                backward.clear()
            memo = backward[sig] = ({}, {})
        tape = Tape(run.values, run.records, run.needs, *memo)
        return [run.values[s] for s in outs], tape, leaves, in_slots + outs

    def _replay(self, script: tuple, inputs: Sequence[np.ndarray], state: State, grad: bool,
                minmax: MinMax, replica_mean: Callable[[np.ndarray], np.ndarray] | None
                ) -> _Run:
        """A forward of a signature that ran before: its script's steps (the values in
        the same order, the same ops' signature-cache entries called with the same
        argument signatures, so the same slots), its records and needs."""
        run = _Run(grad, minmax, replica_mean, _Ops(None, None))
        steps, run.records, run.needs = script[0], script[1], script[2]
        values, arrays = run.values, state.arrays
        for step in steps:
            kind = step[0]
            if kind == _OP:
                _, name, entry, ins, full, bound = step
                if bound is not None:  # (the entry's arguments, but for the slots' values)
                    rest, args, pairs = bound
                    args = dict(args)
                    for k, s in pairs:
                        args[k] = values[s]
                    res = _api.run_rest(name, rest, args)
                else:
                    args = dict(full)
                    for k, s in ins.items():
                        args[k] = values[s]
                    res = _replayed(name, entry, args)
                if type(res) is tuple:
                    values.extend(res)
                else:
                    values.append(res)
            elif kind == _STATE:
                values.append(arrays[step[1]])
            elif kind == _COPY:
                values.append(arrays[step[1]].copy())
            elif kind == _DERIVED:
                values.append(step[1](*[values[s] for s in step[2]], *step[3]))
            elif kind == _RANGE:
                self._update_range(run, step[1], arrays[step[2]], arrays[step[3]],
                                   values[step[4]])
            elif kind == _STATS:
                arrays[step[1]][...] = values[step[3]]
                arrays[step[2]][...] = values[step[4]]
            elif kind == _INPUT:
                values.append(inputs[step[1]])
            else:  # _CONST
                values.append(step[1])
        return run

    # ----------------------------------------------------------------------------------
    def _weight(self, run: _Run, node: Node, attr: str, state: State,
                leaves: dict[tuple[str, str], int], quantize: bool = True) -> int:
        """A Keras weight, through its quantizer (kernels) where ``quantize``."""
        key = (node.name, attr)
        slot = leaves.get(key)
        if slot is None:
            slot = run.leaf(state.arrays[key], state.trainable.get(key, False), (_STATE, key))
            if state.trainable.get(key, False):
                leaves[key] = slot
        q = node.weight_quantizers.get(attr) if quantize else None
        if q is not None:
            slot = self._quantize(run, node, attr, q, slot, state)
        return slot

    def _quantize(self, run: _Run, node: Node, where: str, q: Quantizer, x: int,
                  state: State) -> int:
        """One of tfmot's quantizers (tfgrad.torch.qat.RangeQuantizer, in NumPy)."""
        kmin, kmax = (node.name, where + "_min"), (node.name, where + "_max")
        mn, mx = state.arrays[kmin], state.arrays[kmax]
        if state.training.get(f"{node.name}/{where}", False):
            self._update_range(run, q, mn, mx, run.values[x])
            run.side((_RANGE, q, kmin, kmax, x))
        lo_s, hi_s = run.leaf(mn.copy(), src=(_COPY, kmin)), run.leaf(mx.copy(), src=(_COPY, kmax))
        name = ("FakeQuantWithMinMaxVarsPerChannel" if q.per_axis
                else "FakeQuantWithMinMaxVars")
        return run.op1(name, {"inputs": x, "min": lo_s, "max": hi_s}, num_bits=q.num_bits,
                       narrow_range=q.narrow_range)

    @staticmethod
    def _update_range(run: _Run, q: Quantizer, mn: np.ndarray, mx: np.ndarray,
                      x: np.ndarray) -> None:
        bmin, bmax = run.minmax(x, q.per_axis)
        lo, hi = updated_range(q, mn, mx, bmin, bmax, F32(0.0), _EMA, run.range_ops)
        mn[...] = lo
        mx[...] = hi

    def _activate(self, run: _Run, x: int, name: str) -> int:
        if name in ("linear", "noop"):
            return x
        if name == "relu":
            return run.op1("Relu", {"features": x})
        if name == "relu6":
            return run.op1("Relu6", {"features": x})
        return run.op1("Softmax", {"logits": x})  # (unsupported() allows no other)

    def _bias_act(self, run: _Run, node: Node, y: int, state: State,
                  leaves: dict[tuple[str, str], int]) -> int:
        if (node.name, "bias") in state.arrays:
            b = self._weight(run, node, "bias", state, leaves, quantize=False)
            y = run.op1("BiasAdd", {"value": y, "bias": b})
        if node.pre_activation is not None:
            y = self._quantize(run, node, "pre_activation", node.pre_activation, y, state)
        y = self._activate(run, y, node.activation)
        if node.post_activation is not None:
            y = self._quantize(run, node, "post_activation", node.post_activation, y, state)
        return y

    def _layer(self, run: _Run, node: Node, xs: list[int], state: State,
               leaves: dict[tuple[str, str], int]) -> int:
        kind, cfg = node.kind, node.config
        training = state.training.get(node.name, False)
        x = xs[0] if xs else -1
        if kind == "QuantizeLayer":
            y = x
        elif kind == "Conv2D":
            s = _pair(cfg.get("strides", 1))
            k = self._weight(run, node, "kernel", state, leaves)
            y = run.op1("Conv2D", {"input": x, "filter": k}, strides=[1, s[0], s[1], 1],
                        padding=str(cfg["padding"]).upper())
            y = self._bias_act(run, node, y, state, leaves)
        elif kind == "DepthwiseConv2D":
            s, d = _pair(cfg.get("strides", 1)), _pair(cfg.get("dilation_rate", 1))
            k = self._weight(run, node, "depthwise_kernel", state, leaves)
            y = run.op1("DepthwiseConv2dNative", {"input": x, "filter": k},
                        strides=[1, s[0], s[1], 1], padding=str(cfg["padding"]).upper(),
                        dilations=[1, d[0], d[1], 1])
            y = self._bias_act(run, node, y, state, leaves)
        elif kind == "Dense":
            k = self._weight(run, node, "kernel", state, leaves)
            y = run.op1("MatMul", {"a": x, "b": k})
            y = self._bias_act(run, node, y, state, leaves)
        elif kind == "BatchNormalization":
            y = self._batch_norm(run, node, x, state, leaves, training)
        elif kind == "ReLU":
            mx = cfg.get("max_value")
            y = self._activate(run, x, "relu6" if mx is not None else "relu")
        elif kind == "Activation":
            y = self._activate(run, x, node.activation)
        elif kind == "Add":
            y = run.derived("add", {str(i): s for i, s in enumerate(xs)}, _add)
        elif kind == "Concatenate":
            axis = int(cfg.get("axis", -1)) % run.values[xs[0]].ndim
            y = run.derived("concat", {str(i): s for i, s in enumerate(xs)}, _concat, axis,
                            axis=axis)
        elif kind == "ZeroPadding2D":
            pads = _padding2d(cfg["padding"])
            y = run.derived("pad", {"x": x}, _pad, pads, pads=pads)
        elif kind in ("AveragePooling2D", "MaxPooling2D"):
            k = _pair(cfg.get("pool_size", 2))
            s = _pair(cfg.get("strides") or k)
            y = run.op1("MaxPool" if kind == "MaxPooling2D" else "AvgPool", {"value": x}
                        if kind == "AveragePooling2D" else {"input": x},
                        ksize=[1, *k, 1], strides=[1, *s, 1],
                        padding=str(cfg.get("padding", "valid")).upper())
        elif kind == "GlobalAveragePooling2D":
            keep = bool(cfg.get("keepdims", False))
            y = run.op1("Mean", {"input": x}, axis=[1, 2], keep_dims=keep)
        elif kind == "Dropout":  # (inference, or a rate of 0: runs() checks first)
            y = x
        elif kind in ("Flatten", "Reshape"):
            v = run.values[x]
            shape = ((v.shape[0], math.prod(v.shape[1:])) if kind == "Flatten"
                     else (v.shape[0], *[int(t) for t in cfg["target_shape"]]))
            y = run.derived("reshape", {"x": x}, _reshape, shape)
        elif kind == "Softmax":
            y = run.op1("Softmax", {"logits": x})
        else:  # (unsupported() refuses every other kind)
            raise NotImplementedError(kind)
        if node.output is not None:
            y = self._quantize(run, node, "output", node.output, y, state)
        return y

    def _batch_norm(self, run: _Run, node: Node, x: int, state: State,
                    leaves: dict[tuple[str, str], int], training: bool) -> int:
        cfg = node.config
        c = run.values[x].shape[-1]
        gamma = (self._weight(run, node, "gamma", state, leaves, quantize=False)
                 if (node.name, "gamma") in state.arrays else run.leaf(np.ones(c, F32)))
        beta = (self._weight(run, node, "beta", state, leaves, quantize=False)
                if (node.name, "beta") in state.arrays else run.leaf(np.zeros(c, F32)))
        # Keras' fused path: tf.compat.v1.nn.fused_batch_norm raises epsilon to 1.001e-5
        eps = max(float(cfg.get("epsilon", 1e-3)), 1.001e-5)
        momentum = float(cfg.get("momentum", 0.99))
        kmean, kvar = (node.name, "moving_mean"), (node.name, "moving_variance")
        mean, var = state.arrays[kmean], state.arrays[kvar]
        ins = {"x": x, "scale": gamma, "offset": beta,
               "mean": run.leaf(mean.copy(), src=(_COPY, kmean)),
               "variance": run.leaf(var.copy(), src=(_COPY, kvar))}
        if training:
            y, bm, bv = run.op("FusedBatchNormV3", ins, epsilon=eps,
                               exponential_avg_factor=1.0 - momentum, data_format="NHWC",
                               is_training=True)[:3]
            if run.values[x].shape[0] > 0:
                mean[...] = run.values[bm]
                var[...] = run.values[bv]
                run.side((_STATS, kmean, kvar, bm, bv))
            return y
        return run.op("FusedBatchNormV3", ins, epsilon=eps, data_format="NHWC",
                      is_training=False)[0]
