"""A small JAX classifier with fractional average pooling (TF's kernel), trained under jit.

Two 3x3 convolutions (``jax.lax``), each followed by ReLU and ``tfgrad.jax.fractional_avg_pool``
with ratio sqrt(2) (TF 2.21's FractionalAvgPool and FractionalAvgPoolGrad: on one CPU device
tfgrad's exact kernels, bit for bit; on a GPU or a mesh the native XLA code, drawing the same
pooling regions), then a linear layer. The
pooling seeds are traced arrays drawn from the step's PRNG key, so every step pools
over new regions without recompiling the jitted step. The gradient uses the regions of
the step's own forward pass (saved by the custom_vjp).

The data are synthetic 16x16 images with a bright blob in one of four quadrants (the label).

    python examples/jax_fractional_pool.py           # 60 steps
    python examples/jax_fractional_pool.py --quick   # 3 tiny steps (CI)
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import jax
import jax.numpy as jnp

import tfgrad.jax as tj

RATIO = [1.0, math.sqrt(2), math.sqrt(2), 1.0]


def init(key: jax.Array, width: int = 8, classes: int = 4) -> dict:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w1": jax.random.normal(k1, (3, 3, 1, width)) * math.sqrt(2 / 9),
        "w2": jax.random.normal(k2, (3, 3, width, 2 * width)) * math.sqrt(2 / (9 * width)),
        # 16 -> 11 -> 7 pixels after the two poolings (floor(n / sqrt(2)), as TF computes)
        "w3": jax.random.normal(k3, (7 * 7 * 2 * width, classes)) * 0.01,
        "b3": jnp.zeros(classes),
    }


def conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def forward(params: dict, x: jax.Array, seeds: jax.Array) -> jax.Array:
    x = jax.nn.relu(conv(x, params["w1"]))
    x = tj.fractional_avg_pool(x, RATIO, deterministic=True, seed=seeds[0], seed2=seeds[1]).output
    x = jax.nn.relu(conv(x, params["w2"]))
    x = tj.fractional_avg_pool(x, RATIO, overlapping=True, deterministic=True,
                               seed=seeds[2], seed2=seeds[3]).output
    return x.reshape(x.shape[0], -1) @ params["w3"] + params["b3"]


def loss_fn(params: dict, x: jax.Array, y: jax.Array, seeds: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(forward(params, x, seeds))
    return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()


@jax.jit
def train_step(params: dict, x: jax.Array, y: jax.Array, key: jax.Array,
               lr: float = 0.1) -> tuple[dict, jax.Array]:
    seeds = jax.random.randint(key, (4,), 1, 2**31 - 1)  # new pooling regions each step
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y, seeds)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


@functools.partial(jax.jit, static_argnums=(1, 2))
def blobs(key: jax.Array, n: int, size: int = 16) -> tuple[jax.Array, jax.Array]:
    """A Gaussian blob in quadrant `label` (0..3), plus noise."""
    k1, k2, k3 = jax.random.split(key, 3)
    label = jax.random.randint(k1, (n,), 0, 4)
    half = size / 2
    centre = jnp.stack([(label // 2) * half + half / 2, (label % 2) * half + half / 2], 1)
    centre = centre + jax.random.uniform(k2, (n, 2), minval=-2, maxval=2)
    r, c = jnp.meshgrid(jnp.arange(size), jnp.arange(size), indexing="ij")
    d2 = (r[None] - centre[:, 0, None, None]) ** 2 + (c[None] - centre[:, 1, None, None]) ** 2
    img = jnp.exp(-d2 / 6.0) + 0.2 * jax.random.normal(k3, (n, size, size))
    return img[..., None], label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 tiny steps (for CI)")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    steps, batch = (3, 8) if args.quick else (args.steps, 32)

    key = jax.random.PRNGKey(0)
    key, k = jax.random.split(key)
    params = init(k)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        key, kd, ks = jax.random.split(key, 3)
        x, y = blobs(kd, batch)
        params, loss = train_step(params, x, y, ks)
        if step == 1 or step % 10 == 0 or step == steps:
            print(f"step {step:3d}  loss {float(loss):.4f}")
    x, y = blobs(jax.random.PRNGKey(1), 16 if args.quick else 256)
    logits = jax.jit(forward)(params, x, jnp.array([1, 2, 3, 4]))
    acc = float((logits.argmax(1) == y).mean())
    print(f"eval accuracy {acc:.2f}  ({time.perf_counter() - t0:.1f}s)")


if __name__ == "__main__":
    main()
