"""Data-parallel quantization-aware training in JAX with tfgrad's ops, on a mesh of devices.

A small MobileNet-style network: two depthwise convolutions
(``tfgrad.jax.depthwise_conv2d_native``) whose filters are fake-quantized per output
channel (``fake_quant_with_min_max_vars_per_channel``), each followed by TF's fused batch
norm (``fused_batch_norm_v3``, training mode, running statistics updated by the op),
ReLU6 and activation fake quantization with learned ranges
(``fake_quant_with_min_max_vars``: the gradient reaches min and max), then global average
pooling and a linear layer. The gradients are TF's gradient ops.

The batch is split over a mesh of devices two ways:

- ``jit`` with the batch on a ``NamedSharding``: XLA partitions the step; batch norm's
  statistics are the whole batch's (as on one device).
- ``shard_map`` with ``pmean``-ed gradients and running statistics: each device normalises
  with its own shard's statistics, as ``tf.distribute.MirroredStrategy`` does with
  (non-synchronised) batch normalization.

Under ``tfgrad.jax.use_impl("auto")`` (the default), a computation over several devices
runs the native XLA implementation of every op: nothing is gathered onto one device. On a
CPU-only machine the example makes JAX show ``--devices`` host devices (default 4).

    python examples/jax_sharded_qat.py            # 40 steps, batch 64, 4 devices
    python examples/jax_sharded_qat.py --quick    # 3 tiny steps (CI)
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from typing import Any

Params = dict[str, Any]
EPSILON = 1e-3  # Keras' BatchNormalization
MOMENTUM_FACTOR = 0.01  # exponential_avg_factor = 1 - Keras' momentum 0.99


def set_host_devices(n: int) -> None:
    """Make JAX's CPU backend show ``n`` devices (before jax is imported)."""
    if "jax" in sys.modules:
        return
    flag = f"--xla_force_host_platform_device_count={n}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


# --------------------------------------------------------------------------------------
# The model (pure functions of params and state; jax imported lazily, see main)
# --------------------------------------------------------------------------------------
def init(key: Any, classes: int = 4) -> tuple[Params, Params]:
    import jax
    import jax.numpy as jnp

    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "dw1": jax.random.normal(k1, (3, 3, 1, 8)) * math.sqrt(2 / 9),   # 1 -> 8 channels
        "dw2": jax.random.normal(k2, (3, 3, 8, 2)) * math.sqrt(2 / 9),   # 8 -> 16, stride 2
        "bn1": {"scale": jnp.ones(8), "offset": jnp.zeros(8)},
        "bn2": {"scale": jnp.ones(16), "offset": jnp.zeros(16)},
        "act1": {"min": jnp.float32(0.0), "max": jnp.float32(6.0)},
        "act2": {"min": jnp.float32(0.0), "max": jnp.float32(6.0)},
        "w": jax.random.normal(k3, (16, classes)) * 0.1,
        "b": jnp.zeros(classes),
    }
    state = {"bn1": {"mean": jnp.zeros(8), "variance": jnp.ones(8)},
             "bn2": {"mean": jnp.zeros(16), "variance": jnp.ones(16)}}
    return params, state


def _quantized_filter(w: Any) -> Any:
    """Per-output-channel fake quantization of a [kh, kw, C, M] filter (range: the
    filter's own, as TF's LastValueQuantizer)."""
    import jax
    import jax.numpy as jnp

    import tfgrad.jax as tj

    flat = w.reshape(w.shape[0], w.shape[1], -1)  # output channel c * M + m is last
    lo = jax.lax.stop_gradient(jnp.minimum(flat.min(axis=(0, 1)), 0.0))
    hi = jax.lax.stop_gradient(jnp.maximum(flat.max(axis=(0, 1)), 0.0))
    return tj.fake_quant_with_min_max_vars_per_channel(flat, lo, hi, narrow_range=True
                                                       ).reshape(w.shape)


def _block(x: Any, w: Any, bn: Params, act: Params, stats: Params, stride: int,
           training: bool) -> tuple[Any, Params]:
    import jax.numpy as jnp

    import tfgrad.jax as tj

    y = tj.depthwise_conv2d_native(x, _quantized_filter(w), [1, stride, stride, 1], "SAME")
    out = tj.fused_batch_norm_v3(y, bn["scale"], bn["offset"], stats["mean"],
                                 stats["variance"], epsilon=EPSILON,
                                 exponential_avg_factor=MOMENTUM_FACTOR,
                                 is_training=training)
    y = jnp.clip(out.y, 0.0, 6.0)  # ReLU6
    y = tj.fake_quant_with_min_max_vars(y, act["min"], act["max"])
    new = {"mean": out.batch_mean, "variance": out.batch_variance} if training else stats
    return y, new


def forward(params: Params, state: Params, x: Any, training: bool = True
            ) -> tuple[Any, Params]:
    y, s1 = _block(x, params["dw1"], params["bn1"], params["act1"], state["bn1"], 1, training)
    y, s2 = _block(y, params["dw2"], params["bn2"], params["act2"], state["bn2"], 2, training)
    logits = y.mean(axis=(1, 2)) @ params["w"] + params["b"]
    return logits, {"bn1": s1, "bn2": s2}


def loss_fn(params: Params, state: Params, x: Any, labels: Any) -> tuple[Any, Params]:
    import jax

    logits, new_state = forward(params, state, x)
    logp = jax.nn.log_softmax(logits)
    return -(logp[jax.numpy.arange(labels.shape[0]), labels]).mean(), new_state


def _sgd(params: Params, grads: Params, lr: float) -> Params:
    import jax

    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


def train_step(params: Params, state: Params, x: Any, labels: Any, lr: float = 0.05
               ) -> tuple[Params, Params, Any]:
    """One SGD step on the whole batch (jit it; shard its batch for data parallelism)."""
    import jax

    (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x,
                                                                          labels)
    return _sgd(params, grads, lr), new_state, loss


def shard_map_step(mesh: Any, axis: str = "batch", lr: float = 0.05) -> Any:
    """``train_step`` under ``shard_map``: each device's shard, its own batch statistics,
    gradients, loss and running statistics averaged over the devices (``pmean``)."""
    import jax
    from jax.sharding import PartitionSpec as P

    def local(params: Params, state: Params, x: Any, labels: Any) -> tuple:
        # Differentiate each device's own copy of the (replicated) parameters: its
        # gradient is the device's alone, then averaged explicitly.
        mine = jax.lax.pcast(params, (axis,), to="varying")
        (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(mine, state, x,
                                                                              labels)
        grads, new_state, loss = jax.lax.pmean((grads, new_state, loss), axis)
        return _sgd(params, grads, lr), new_state, loss

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(axis), P(axis)),
                                 out_specs=(P(), P(), P())))


def per_shard_step(params: Params, state: Params, x: Any, labels: Any, shards: int,
                   lr: float = 0.05) -> tuple[Params, Params, Any]:
    """What ``shard_map_step`` computes, on one device: the shards' losses (each with its
    own batch statistics) averaged, through ``jax.vmap``."""
    import jax

    xs = x.reshape(shards, -1, *x.shape[1:])
    ys = labels.reshape(shards, -1)

    def mean_loss(p: Params) -> tuple:
        losses, states = jax.vmap(loss_fn, in_axes=(None, None, 0, 0))(p, state, xs, ys)
        return losses.mean(), jax.tree_util.tree_map(lambda s: s.mean(0), states)

    (loss, new_state), grads = jax.value_and_grad(mean_loss, has_aux=True)(params)
    return _sgd(params, grads, lr), new_state, loss


def blobs(key: Any, n: int, size: int = 16) -> tuple[Any, Any]:
    """Synthetic NHWC images: a Gaussian blob in quadrant ``label`` (0..3), plus noise."""
    import jax
    import jax.numpy as jnp

    k1, k2, k3 = jax.random.split(key, 3)
    label = jax.random.randint(k1, (n,), 0, 4)
    half = size / 2
    centre = jnp.stack([(label // 2) * half + half / 2, (label % 2) * half + half / 2], 1)
    centre = centre + jax.random.uniform(k2, (n, 2), minval=-2, maxval=2)
    r, c = jnp.meshgrid(jnp.arange(size), jnp.arange(size), indexing="ij")
    d2 = (r[None] - centre[:, 0, None, None]) ** 2 + (c[None] - centre[:, 1, None, None]) ** 2
    img = 3.0 * jnp.exp(-d2 / 6.0) + 0.3 * jax.random.normal(k3, (n, size, size))
    return img[..., None], label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 tiny steps (for CI)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--devices", type=int, default=4,
                        help="host devices to show on a CPU-only machine (default 4)")
    parser.add_argument("--shard-map", action="store_true",
                        help="shard_map with pmean-ed gradients instead of a sharded jit")
    args = parser.parse_args()
    set_host_devices(args.devices)

    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    steps, batch = (3, 16) if args.quick else (args.steps, 64)
    n = len(jax.devices())
    # Auto axes: XLA partitions the step from the inputs' shardings (GSPMD / Shardy)
    mesh = jax.make_mesh((n,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    on_batch = NamedSharding(mesh, P("batch"))
    step = (shard_map_step(mesh) if args.shard_map
            else jax.jit(functools.partial(train_step)))
    print(f"{n} {jax.devices()[0].platform} device(s), "
          f"{'shard_map' if args.shard_map else 'sharded jit'}, batch {batch}")

    key = jax.random.PRNGKey(0)
    key, k = jax.random.split(key)
    params, state = init(k)
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        key, kd = jax.random.split(key)
        x, y = jax.device_put(blobs(kd, batch), on_batch)
        params, state, loss = step(params, state, x, y)
        if i == 1 or i % 10 == 0 or i == steps:
            print(f"step {i:3d}  loss {float(loss):.4f}")
    x, y = blobs(jax.random.PRNGKey(1), 64 if args.quick else 512)
    logits, _ = jax.jit(functools.partial(forward, training=False))(params, state, x)
    acc = float((logits.argmax(1) == y).mean())
    print(f"eval accuracy {acc:.2f}  ({time.perf_counter() - t0:.1f}s)")


if __name__ == "__main__":
    main()
