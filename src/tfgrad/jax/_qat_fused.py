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


def range_attrs(node: Node, q: Quantizer) -> tuple[str, str]:
    """The Keras attribute names of a quantizer's two range variables in its node."""
    attrs = {w.name: w.attr for w in node.weights}
    return attrs[q.min_name], attrs[q.max_name]


def _places(node: Node) -> list[tuple[str, Quantizer]]:
    """A node's quantizers by place as tfgrad.qat._exec names them (a weight's by the
    weight's attr)."""
    return [(place.removeprefix("weight:"), q) for place, q in node.quantizers()]


class Spec:
    """One dry run of the program (per shapes, training flag and what wants a gradient):
    the tape's structure, and the values its backward reads, packed into one flat buffer
    per dtype (the residuals: a callback's every result array costs a copy and its own
    bookkeeping; the program's tape holds about a thousand)."""

    def __init__(self, tape: _exec.Tape, leaves: dict[tuple[str, str], int],
                 slots: list[int], n_inputs: int):
        self.records, self.needs = tape.records, tape.needs
        self.n_values = len(tape.values)
        self.names = [r[0] for r in tape.records]
        read, shaped = tape.reads()
        # shapes alone: a zero-strided array of the shape stands in for the value
        self.placeholders = {s: np.broadcast_to(np.zeros((), tape.values[s].dtype),
                                                tape.values[s].shape) for s in shaped}
        dtypes: dict[np.dtype, int] = {}
        self.layout: list[tuple[int, int, int, int, tuple[int, ...]]] = []
        """(slot, buffer, offset, size, shape) of each value the backward reads."""
        sizes: list[int] = []
        for s in sorted(read):
            v = tape.values[s]
            d = dtypes.setdefault(np.dtype(v.dtype), len(dtypes))
            if d == len(sizes):
                sizes.append(0)
            self.layout.append((s, d, sizes[d], v.size, tuple(v.shape)))
            sizes[d] += -(-v.size // 16) * 16  # (64-byte offsets for float32)
        self.buffers = [jax.ShapeDtypeStruct((n,), d) for d, n in zip(dtypes, sizes)]
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

    def pack(self, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        bufs = [np.empty(b.shape, b.dtype) for b in self.buffers]
        for s, d, at, n, _ in self.layout:
            bufs[d][at:at + n] = values[s].reshape(-1)
        return bufs

    def unpack(self, bufs: Sequence[np.ndarray]) -> list[Any]:
        values: list[Any] = [None] * self.n_values
        for s, v in self.placeholders.items():
            values[s] = v
        arrays = [np.asarray(b) for b in bufs]
        for s, d, at, n, shape in self.layout:
            values[s] = arrays[d][at:at + n].reshape(shape)
        return values


class Fused:
    """The exact path of a whole ``apply`` as one host callback forward and one backward:
    :mod:`tfgrad.qat._exec`'s program of TF's ops on NumPy arrays (the one
    ``tfgrad.torch.qat`` runs as one autograd node), the same bits as the op-by-op path
    without a callback per op. The forward returns the values the backward reads as
    residuals; their shapes come from a dry run of the program when the apply is traced.
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
            n_x, n_p = len(xs), len(ps)
            xa, pa, sa = arrays[:n_x], arrays[n_x:n_x + n_p], arrays[n_x + n_p:]
            st, fresh = fused._state(pkeys, skeys, pa, sa, need_p, training)
            outs, tape, _, _ = fused.program.forward(
                [np.asarray(x) for x in xa], st, spec is not None, list(need_x), batch_range)
            res: list[np.ndarray] = []
            if spec is not None:
                if (len(tape.values) != spec.n_values
                        or [r[0] for r in tape.records] != spec.names):
                    raise RuntimeError("tfgrad.jax.qat: the fused program's tape differs "
                                       "from its dry run (please report this)")
                res = spec.pack(tape.values)
            return (*outs, *fresh, *res)

        def forward_call(need_x: Sequence[bool], need_p: Sequence[bool], spec: Spec | None,
                         out_specs: list, *operands: jax.Array) -> list[jax.Array]:
            host = functools.partial(host_forward, need_x, need_p, spec)
            host._tfgrad_host = True  # type: ignore[attr-defined]  # (_exact's lowering)
            result = [*out_specs, *(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in ss),
                      *(spec.buffers if spec is not None else ())]
            return list(jax.pure_callback(host, result, *operands,
                                          vmap_method="sequential"))

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
            outs, new, res = got[:n_out], got[n_out:n_out + n_s], got[n_out + n_s:]
            shapes = ([(tuple(v.shape), v.dtype) for v in xv],
                      [(tuple(v.shape), v.dtype) for v in pv])
            static.append((spec, need_x, need_p, shapes))  # (residuals are arrays only)
            return (tuple(outs), tuple(new)), tuple(res)

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
                    return fused.backward(spec, pkeys, arrays[:len(res)],
                                          {k: arrays[len(res) + i] for i, k in enumerate(given)},
                                          wanted, x_shapes, p_shapes)

                host._tfgrad_host = True  # type: ignore[attr-defined]
                specs = [jax.ShapeDtypeStruct(*(x_shapes if w == "x" else p_shapes)[k])
                         for w, k in wanted]
                grads = list(jax.pure_callback(host, specs, *res,
                                               *(ct_outs[k] for k in given),
                                               vmap_method="sequential"))
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

    def backward(self, spec: Spec, pkeys: list, res: Sequence[np.ndarray],
                 cts: dict[int, np.ndarray], wanted: list[tuple[str, int]],
                 x_shapes: list, p_shapes: list) -> tuple[np.ndarray, ...]:
        tape = _exec.Tape(spec.unpack(res), spec.records, spec.needs, spec.traces,
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
