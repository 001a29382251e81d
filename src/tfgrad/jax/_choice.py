"""Which implementation runs each op: ``use_impl`` and the lowering-time ``"auto"`` rule.

The choice is recorded in each op's equation when it is traced and resolved when the
computation is lowered to XLA, where JAX knows what it compiles for:

- ``"exact"``: a host callback into tfgrad's Numba kernels (TF 2.21's bits).
- ``"native"``: the jax.numpy / jax.lax implementation (:mod:`tfgrad.jax._native`).
- ``"auto"``: ``"exact"`` when the computation is lowered for the CPU and for a single
  device, ``"native"`` otherwise (GPU/TPU, and any computation partitioned over several
  devices: a jit whose operands or outputs are sharded over a mesh, ``shard_map``,
  ``pmap``). There the callback would cost nothing; anywhere else it would copy to the
  host (GPU/TPU) or gather the operands onto one device (meshes).

The rule asks the lowering context, not the operands: under ``jit`` an operand's sharding
is not known when the function is traced (GSPMD/Shardy decide it later), but the number of
devices a computation is compiled for is known when it is lowered, and it covers every
way of partitioning (input shardings, ``with_sharding_constraint``, ``shard_map``).
"""

from __future__ import annotations

from typing import Any

import jax
from jax._src import sharding_impls

IMPLS = ("auto", "exact", "native")

# A jit-cache-sensitive context: changing it re-traces jitted functions, so a function
# compiled under one choice is not reused under another.
_context = jax.make_user_context("auto")


def current() -> str:
    """The implementation ops traced now will use (``"auto"``, ``"exact"`` or ``"native"``)."""
    return _context.value


class use_impl:  # noqa: N801 (a function that is also a context manager)
    """Choose the implementation of tfgrad's JAX ops: ``"auto"`` (default), ``"exact"`` or
    ``"native"``.

    ``tfgrad.jax.use_impl("native")`` sets it until changed; ``with
    tfgrad.jax.use_impl("native"): ...`` sets it inside the block. The choice is read when
    an op is traced (jitted functions are re-traced when it changes) and applies to its
    gradients too.

    - ``"exact"``: TF 2.21's bits, through a host callback into tfgrad's CPU kernels (on a
      GPU each op copies to the host and back; on a mesh the operands are gathered onto
      one device).
    - ``"native"``: jax.numpy / jax.lax code that XLA compiles for every backend and
      partitions over meshes; TF's semantics, within the distances documented per op.
    - ``"auto"``: ``"exact"`` where the computation is compiled for the CPU and one
      device, ``"native"`` everywhere else.
    """

    def __init__(self, name: str) -> None:
        if name not in IMPLS:
            raise ValueError(f"tfgrad.jax.use_impl: implementation must be one of "
                             f"{', '.join(map(repr, IMPLS))}, got {name!r}")
        self._previous = _context.get_global()
        _context.set_global(name)

    def __enter__(self) -> use_impl:
        return self

    def __exit__(self, *exc: object) -> None:
        _context.set_global(self._previous)


def single_device(ctx: Any) -> bool:
    """Whether the computation being lowered runs on one device (not partitioned)."""
    axis = ctx.module_context.axis_context
    if isinstance(axis, sharding_impls.ShardingContext):
        return axis.num_devices == 1
    if isinstance(axis, sharding_impls.SPMDAxisContext):  # shard_map's manual axes
        return getattr(axis.mesh, "size", 2) == 1
    return False  # pmap and anything else: several devices


def resolve(impl: str, ctx: Any, cpu: bool) -> str:
    """``"exact"`` or ``"native"`` for an op recorded with ``impl``, lowered in ``ctx``
    for the CPU (``cpu``) or another platform."""
    if impl != "auto":
        return impl
    return "exact" if cpu and single_device(ctx) else "native"


def resolve_eager(impl: str, operands: list) -> str:
    """``resolve`` for an op run without ``jit`` (under ``jax.disable_jit()``): the
    operands' devices decide."""
    if impl != "auto":
        return impl
    devices = set()
    for x in operands:
        sharding = getattr(x, "sharding", None)
        devices |= set(sharding.device_set) if sharding is not None else set()
    platforms = {d.platform for d in devices} or {jax.default_backend()}
    return "exact" if len(devices) <= 1 and platforms == {"cpu"} else "native"
