"""tfgrad.jax.qat's fused exact path: a whole ``apply`` as one host callback forward and
one backward over :mod:`tfgrad.qat._exec`'s program (see :class:`Fused`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..dispatch.minmax import batch_range
from ..qat import Node, Plan, Quantizer, _exec
from . import _choice, _exact
from ._primitives import _no_gradient


def range_attrs(node: Node, q: Quantizer) -> tuple[str, str]:
    """The Keras attribute names of a quantizer's two range variables in its node."""
    attrs = {w.name: w.attr for w in node.weights}
    return attrs[q.min_name], attrs[q.max_name]


def _places(node: Node) -> list[tuple[str, Quantizer]]:
    """A node's quantizers by place as tfgrad.qat._exec names them (a weight's by the
    weight's attr)."""
    return [(place.removeprefix("weight:"), q) for place, q in node.quantizers()]


class _Tapes(_exec.Tapes):
    """The forwards' tapes, host-side, by the token the forward callback returns as its
    residual: the backward callback takes its tape from here instead of the tape's values
    passing through XLA as residuals (MobileNetV2 at batch 32: 27 MB packed, copied out
    and into fresh XLA buffers each step). A backward whose tape is gone (a vjp kept and
    called later, or twice) runs the forward again on its inputs, kept as residuals too:
    the program is deterministic, so the same tape."""

    def put_token(self, values: list[Any]) -> np.ndarray:
        return np.array([self.put(values)], np.int32)

    def take_token(self, token: Any) -> list[Any] | None:
        return self.take(int(np.asarray(token).reshape(-1)[0]))


TAPES = _Tapes()


def _first_order(host: Any, specs: list, *operands: Any) -> Any:
    """A callback of the program (its forward, its backward), whose derivative inside a
    derivative is refused as TF refuses it (the gradient ops have none), rather than by
    JAX's message about callbacks."""

    @jax.custom_jvp
    def call(*ops: Any) -> Any:
        return jax.pure_callback(host, specs, *ops, vmap_method="sequential")

    @call.defjvp
    def _(primals: tuple, tangents: tuple) -> Any:  # (the op-by-op path's error)
        raise _no_gradient("FakeQuantWithMinMaxVarsGradient")

    return call(*operands)


TOKEN = jax.ShapeDtypeStruct((1,), np.int32)


def _owned(v: np.ndarray) -> bool:
    """Whether ``v``'s memory is an array NumPy allocated (not a callback operand's XLA
    buffer, which outlives the callback only as long as XLA wants)."""
    while v.base is not None:
        if type(v.base) is not np.ndarray:
            return False
        v = v.base
    return v.flags.owndata


class Spec:
    """One dry run of the program (per shapes, training flag and what wants a gradient):
    the tape's structure, and which of its values its backward reads (a tape kept for
    the backward keeps only those: :class:`_Tapes`)."""

    def __init__(self, tape: _exec.Tape, leaves: dict[tuple[str, str], int],
                 slots: list[int], n_inputs: int):
        self.records, self.needs = tape.records, tape.needs
        self.n_values = len(tape.values)
        self.names = [r[0] for r in tape.records]
        read, shaped = tape.reads()
        self.read = sorted(read)
        # shapes alone: a zero-strided array of the shape stands in for the value
        self.placeholders = {s: np.broadcast_to(np.zeros((), tape.values[s].dtype),
                                                tape.values[s].shape) for s in shaped}
        self.leaves = leaves
        self.in_slots, self.out_slots = slots[:n_inputs], slots[n_inputs:]
        self.traces: dict[tuple, list] = {}
        """The backward's op calls, noted once per signature (tfgrad.qat._exec._Ops)."""
        self.steps: dict[int, list] = {}
        """The records' gradient calls, worked out once (``Tape.steps``)."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)  # (pickled without the traces: closures, per process)
        state["traces"], state["steps"] = {}, {}
        return state

    def kept(self, tape: _exec.Tape) -> list[Any]:
        """The values of ``tape`` (a run of this spec) that its backward reads, each in
        memory of its own (a callback operand's copied)."""
        if len(tape.values) != self.n_values or [r[0] for r in tape.records] != self.names:
            raise RuntimeError("tfgrad.jax.qat: the fused program's tape differs from its "
                               "dry run (please report this)")
        values: list[Any] = [None] * self.n_values
        for s, v in self.placeholders.items():
            values[s] = v
        for s in self.read:
            v = tape.values[s]
            values[s] = v if _owned(v) else v.copy()
        return values


class Fused:
    """The exact path of a whole ``apply`` as one host callback forward and one backward:
    :mod:`tfgrad.qat._exec`'s program of TF's ops on NumPy arrays (the one
    ``tfgrad.torch.qat`` runs as one autograd node), the same bits as the op-by-op path
    without a callback per op. The forward keeps its tape for the backward (:class:`_Tapes`);
    the tape's structure comes from a dry run of the program when the apply is traced.
    Used where every op would run exact (``use_impl("exact")``, or ``"auto"`` with the
    CPU as JAX's only device), without ``axis_name`` (the replica means sit inside the
    forward), and where the program runs the layers (``_exec.unsupported``; dropout
    while training)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.program = _exec.Program(plan)
        walk = [n for n in plan.nodes if n.kind != "InputLayer"]
        self.ranges = {(n.name, a): (n.name, where + suffix) for n in walk
                       for where, q in _places(n)
                       for a, suffix in zip(range_attrs(n, q), ("_min", "_max"))}
        # the program's training flags: every layer and quantizer alike
        self.flags = {t: {**{n.name: t for n in walk},
                          **{f"{n.name}/{where}": t for n in walk for where, _ in _places(n)}}
                      for t in (False, True)}
        self.specs: dict[tuple, Spec] = {}
        self.outs: dict[tuple, list[jax.ShapeDtypeStruct]] = {}

    def usable(self, training: bool, axis_name: str | None) -> bool:
        impl = _choice.current()
        exact = impl == "exact" or (impl == "auto" and jax.default_backend() == "cpu"
                                    and jax.device_count() == 1)
        return (exact and axis_name is None and _exact.LEAN_LOWERING
                and self.program.runs(self.flags[training]))

    def _state(self, pkeys: list, skeys: list, ps: Sequence[np.ndarray],
               ss: Sequence[np.ndarray], need_p: Sequence[bool], training: bool
               ) -> tuple[_exec.State, list[np.ndarray]]:
        """The program's state: the params as they are, the state copied (the program
        updates ranges and moving statistics in place)."""
        arrays: dict[tuple[str, str], np.ndarray] = {}
        trainable: dict[tuple[str, str], bool] = {}
        for k, a, need in zip(pkeys, ps, need_p):
            arrays[self.ranges.get(k, k)] = np.asarray(a)
            if need:
                trainable[self.ranges.get(k, k)] = True
        fresh = [np.array(a, copy=True) for a in ss]
        for k, a in zip(skeys, fresh):
            arrays[self.ranges.get(k, k)] = a
        return _exec.State(arrays, trainable, self.flags[training]), fresh

    def _dry_run(self, pkeys: list, skeys: list, xs: Sequence[Any], ps: Sequence[Any],
                 ss: Sequence[Any], need_x: Sequence[bool], need_p: Sequence[bool],
                 training: bool, grad: bool) -> tuple:
        """The program on zeros of these shapes (the tape's structure and the outputs'
        shapes do not depend on the values)."""
        def zeros(v: Any) -> np.ndarray:
            return np.zeros(v.shape, np.dtype(v.dtype))

        state, _ = self._state(pkeys, skeys, [zeros(p) for p in ps], [zeros(s) for s in ss],
                               need_p, training)
        with np.errstate(all="ignore"):
            return self.program.forward([zeros(x) for x in xs], state, grad, list(need_x),
                                        batch_range)

    def spec(self, key: tuple, pkeys: list, skeys: list, xs: Sequence[Any],
             ps: Sequence[Any], ss: Sequence[Any], need_x: Sequence[bool],
             need_p: Sequence[bool], training: bool) -> Spec:
        found = self.specs.get(key)
        if found is None:
            _, tape, leaves, slots = self._dry_run(pkeys, skeys, xs, ps, ss, need_x, need_p,
                                                   training, True)
            if len(self.specs) >= 64:
                self.specs.clear()
            found = self.specs[key] = Spec(tape, leaves, slots, len(xs))
        return found

    def apply(self, variables: Mapping[str, Any], xs: Sequence[jax.Array], training: bool
              ) -> tuple[list[jax.Array], dict[str, dict[str, jax.Array]]]:
        params, state = variables.get("params", {}), variables.get("state", {})
        pkeys = [(layer, a) for layer, vs in params.items() for a in vs]
        skeys = [(layer, a) for layer, vs in state.items() for a, v in vs.items()
                 if jnp.issubdtype(jnp.result_type(v), jnp.floating)]
        ps = [jnp.asarray(params[k][a]) for k, a in pkeys]
        ss = [jnp.asarray(state[k][a]) for k, a in skeys]
        fused = self

        def host_forward(need_x: Sequence[bool], need_p: Sequence[bool], spec: Spec | None,
                         *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
            outs, tape, fresh = fused.run_program(pkeys, skeys, arrays, need_x, need_p,
                                                  training, spec is not None)
            if spec is None:
                return (*outs, *fresh)
            return (*outs, *fresh, TAPES.put_token(spec.kept(tape)))

        def forward_call(need_x: Sequence[bool], need_p: Sequence[bool], spec: Spec | None,
                         out_specs: list, *operands: jax.Array) -> list[jax.Array]:
            host = functools.partial(host_forward, need_x, need_p, spec)
            host._tfgrad_host = True  # type: ignore[attr-defined]  # (_exact's lowering)
            result = [*out_specs, *(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in ss),
                      *((TOKEN,) if spec is not None else ())]
            return list(_first_order(host, result, *operands))

        n_out = len(self.plan.outputs)
        out_specs = self.out_specs(xs, ps, ss, pkeys, skeys, training)

        static: list[tuple] = []

        @jax.custom_vjp
        def run(xs: tuple, ps: tuple, ss: tuple) -> tuple:
            got = forward_call((False,) * len(xs), (False,) * len(ps), None, out_specs,
                               *xs, *ps, *ss)
            return tuple(got[:n_out]), tuple(got[n_out:])

        def run_fwd(xs: tuple, ps: tuple, ss: tuple) -> tuple:
            need_x = tuple(bool(x.perturbed) for x in xs)
            need_p = tuple(bool(p.perturbed) for p in ps)
            xv = [x.value for x in xs]
            pv = [p.value for p in ps]
            sv = [s.value for s in ss]
            key = (training, need_x, need_p, *((tuple(v.shape), str(v.dtype))
                                               for v in (*xv, *pv, *sv)))
            spec = fused.spec(key, pkeys, skeys, xv, pv, sv, need_x, need_p, training)
            got = forward_call(need_x, need_p, spec, out_specs, *xv, *pv, *sv)
            n_s = len(sv)
            outs, new, token = got[:n_out], got[n_out:n_out + n_s], got[n_out + n_s]
            shapes = ([(tuple(v.shape), v.dtype) for v in xv],
                      [(tuple(v.shape), v.dtype) for v in pv])
            static.append((spec, need_x, need_p, shapes))  # (residuals are arrays only)
            # (the inputs: to run the forward again where the tape is gone)
            return (tuple(outs), tuple(new)), (token, *xv, *pv, *sv)

        def run_bwd(res: tuple, cts: tuple) -> tuple:
            spec, need_x, need_p, (x_shapes, p_shapes) = static[-1]
            ct_outs = [None if isinstance(c, jax.custom_derivatives.SymbolicZero) else c
                       for c in cts[0]]
            given = [k for k, c in enumerate(ct_outs) if c is not None]
            wanted = ([("x", k) for k, n in enumerate(need_x) if n]
                      + [("p", k) for k, n in enumerate(need_p) if n])
            grads: list[Any] = []
            if wanted and given:
                def host(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
                    values = TAPES.take_token(arrays[0])
                    if values is None:
                        values = spec.kept(fused.run_program(
                            pkeys, skeys, arrays[1:len(res)], need_x, need_p, training,
                            True)[1])
                    return fused.backward(spec, pkeys, values,
                                          {k: arrays[len(res) + i] for i, k in enumerate(given)},
                                          wanted, x_shapes, p_shapes)

                host._tfgrad_host = True  # type: ignore[attr-defined]
                specs = [jax.ShapeDtypeStruct(*(x_shapes if w == "x" else p_shapes)[k])
                         for w, k in wanted]
                grads = list(_first_order(host, specs, *res, *(ct_outs[k] for k in given)))
            gx: list[Any] = [None] * len(need_x)
            gp: list[Any] = [None] * len(need_p)
            for (w, k), g in zip(wanted, grads):
                (gx if w == "x" else gp)[k] = g
            return tuple(gx), tuple(gp), (None,) * len(cts[1])

        run.defvjp(run_fwd, run_bwd, symbolic_zeros=True)
        outs, new = run(tuple(xs), tuple(ps), tuple(ss))
        new_state = {layer: dict(vs) for layer, vs in state.items()}
        for (layer, a), v in zip(skeys, new):
            new_state[layer][a] = v
        return list(outs), new_state

    def out_specs(self, xs: Sequence[jax.Array], ps: Sequence[jax.Array],
                  ss: Sequence[jax.Array], pkeys: list, skeys: list, training: bool
                  ) -> list[jax.ShapeDtypeStruct]:
        """The outputs' shapes and dtypes."""
        key = (training, *((tuple(v.shape), str(v.dtype)) for v in (*xs, *ps, *ss)))
        found = self.outs.get(key)
        if found is None:
            outs, _, _, _ = self._dry_run(pkeys, skeys, xs, ps, ss, [False] * len(xs),
                                          [False] * len(ps), training, False)
            if len(self.outs) >= 64:
                self.outs.clear()
            found = self.outs[key] = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs]
        return found

    def run_program(self, pkeys: list, skeys: list, arrays: Sequence[np.ndarray],
                    need_x: Sequence[bool], need_p: Sequence[bool], training: bool,
                    grad: bool) -> tuple[list[np.ndarray], _exec.Tape, list[np.ndarray]]:
        """The program on a callback's arrays (the inputs, the params, the state): its
        outputs, its tape, the new state."""
        n_x, n_p = len(need_x), len(need_p)
        xa, pa, sa = arrays[:n_x], arrays[n_x:n_x + n_p], arrays[n_x + n_p:]
        st, fresh = self._state(pkeys, skeys, pa, sa, need_p, training)
        outs, tape, _, _ = self.program.forward([np.asarray(x) for x in xa], st, grad,
                                                list(need_x), batch_range)
        return outs, tape, fresh

    def backward(self, spec: Spec, pkeys: list, values: list[Any],
                 cts: dict[int, np.ndarray], wanted: list[tuple[str, int]],
                 x_shapes: list, p_shapes: list) -> tuple[np.ndarray, ...]:
        tape = _exec.Tape(values, spec.records, spec.needs, spec.traces,
                          spec.steps)
        g = tape.backward({spec.out_slots[k]: np.ascontiguousarray(c, np.float32)
                           for k, c in cts.items()})
        out = []
        for w, k in wanted:
            if w == "x":
                slot: int | None = spec.in_slots[k]
                shape, dtype = x_shapes[k]
            else:
                key = pkeys[k]
                slot = spec.leaves.get(self.ranges.get(key, key))
                shape, dtype = p_shapes[k]
            v = g[slot] if slot is not None else None
            out.append(np.zeros(shape, dtype) if v is None
                       else np.ascontiguousarray(v, dtype=dtype))
        return tuple(out)
