"""``tfgrad demo``: quantization-aware training of a small MobileNet-style classifier.

Data: scikit-learn's bundled 8x8 digits (1,797 images, nothing is downloaded), a fixed
stratified 80/20 split (the same held-out images for every seed).

Network (NHWC, float32). Every step marked [tfgrad] runs a tfgrad op forward and its
gradient op backward; the rest is plain NumPy::

    x [N, 8, 8, 1]
    depthwise 3x3, channel multiplier 16  [tfgrad DepthwiseConv2dNative, weights fake-quantized
                                           per channel: FakeQuantWithMinMaxVarsPerChannel]
    batch norm                            [tfgrad FusedBatchNormV3]
    ReLU6, then fake quant with learned min/max   [tfgrad FakeQuantWithMinMaxVars]
    depthwise 3x3 on 16 channels -> batch norm -> ReLU6 -> fake quant
    pointwise 1x1 conv 16 -> 32 (NumPy matmul, per-channel fake-quant weights)
      -> batch norm -> ReLU6 -> fake quant
    fractional average pooling 8x8 -> 5x5 (ratio sqrt 2, pseudo-random, overlapping)
                                          [tfgrad FractionalAvgPool]
    dense 800 -> 10 (NumPy, per-channel fake-quant weights) -> softmax cross-entropy

Backward: DepthwiseConv2dNativeBackpropInput/-Filter, FusedBatchNormGradV3,
FakeQuantWithMinMaxVarsGradient (which also gives the gradients of the learned
activation ranges), FakeQuantWithMinMaxVarsPerChannelGradient, FractionalAvgPoolGrad.
Weights use TFLite's int8 scheme: symmetric per-channel ranges with narrow_range (codes
-127..127); activations are asymmetric per tensor with learned [min, max]. Adam, cosine
learning-rate decay. Every random choice (initialisation, shuffling, pooling sequences) is
drawn from one generator seeded by --seed, so a seed gives the same run on a machine.

Evaluation runs batch norm in inference mode with the running statistics and a fixed
pooling sequence, once in float (fake quant off) and once with --bits fake quantization.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ._common import CLIError, optional, out_dir, require, use_agg_backend

F32 = np.float32
STRIDES = [1, 1, 1, 1]
EPSILON = 1e-3
POOL_RATIO = [1.0, 1.414, 1.414, 1.0]
TRAIN, EVAL_QUANT, EVAL_FLOAT = "train", "eval-quant", "eval-float"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo", help="train a quantization-aware digits classifier with tfgrad's kernels",
        description="Train a small quantization-aware MobileNet-style classifier on "
        "scikit-learn's bundled 8x8 digits with tfgrad's kernels only (forward and "
        "backward, in NumPy + Numba), then report the held-out accuracy in float and with "
        "fake quantization. Needs the 'demo' extra: pip install 'tfgrad[demo]'.")
    p.add_argument("--epochs", type=int, default=12, help="training epochs (default 12)")
    p.add_argument("--bits", type=int, default=8,
                   help="fake-quantization bit width, 2..16 (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", metavar="DIR", default="tfgrad-demo",
                   help="where the PNG and the JSON summary go (default ./tfgrad-demo)")
    p.add_argument("--batch-size", type=int, default=32, help="(default 32)")
    p.add_argument("--lr", type=float, default=4e-3, help="Adam learning rate (default 4e-3)")
    p.add_argument("--train-size", type=int, default=None, metavar="N",
                   help="train on the first N training images only (quick checks)")
    p.add_argument("--threads", type=int, default=1,
                   help="Numba threads (default 1: on 8x8 images a parallel region's start-up "
                   "costs more than it saves; results are the same for any count)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    return p


# --------------------------------------------------------------------------------------
# Layers. Each keeps what its backward needs from the last forward (one batch in flight).
# --------------------------------------------------------------------------------------
class Layer:
    params: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]

    def __init__(self) -> None:
        self.params, self.grads = {}, {}

    def forward(self, x: np.ndarray, mode: str) -> np.ndarray:
        raise NotImplementedError

    def backward(self, g: np.ndarray, need_input: bool = True) -> np.ndarray | None:
        """The parameters' gradients into ``grads``; the input's gradient, or None when
        ``need_input`` is false (the model's first layer: nothing takes it)."""
        raise NotImplementedError


class WeightQuant:
    """Per-channel (last axis) symmetric narrow-range fake quantization of a weight."""

    def __init__(self, bits: int) -> None:
        self.bits = bits

    def ranges(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        amax = np.abs(w.reshape(-1, w.shape[-1])).max(axis=0)
        amax = np.maximum(amax, F32(1e-6)).astype(F32)  # keep min < max for dead channels
        return -amax, amax

    def forward(self, w: np.ndarray, mode: str) -> np.ndarray:
        import tfgrad

        self.w = w
        if mode == EVAL_FLOAT:
            return w
        self.min, self.max = self.ranges(w)
        return tfgrad.raw_ops.FakeQuantWithMinMaxVarsPerChannel(
            inputs=w, min=self.min, max=self.max, num_bits=self.bits, narrow_range=True)

    def backward(self, g: np.ndarray) -> np.ndarray:
        import tfgrad

        # The range follows the weights (it is not learned): only the input gradient is used.
        return tfgrad.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
            gradients=g, inputs=self.w, min=self.min, max=self.max, num_bits=self.bits,
            narrow_range=True).backprops_wrt_input

    def codes(self, w: np.ndarray) -> np.ndarray:
        """The integer code of every quantized weight (for the histogram)."""
        wq = self.forward(w, EVAL_QUANT)
        scale = (self.max - self.min) / F32(2**self.bits - 2)
        return np.rint(wq / scale).ravel()


class DepthwiseConv(Layer):
    def __init__(self, rng: np.random.Generator, channels: int, multiplier: int,
                 bits: int) -> None:
        super().__init__()
        std = math.sqrt(2.0 / 9.0)
        self.params["w"] = (rng.standard_normal((3, 3, channels, multiplier)) * std).astype(F32)
        self.quant = WeightQuant(bits)

    def forward(self, x: np.ndarray, mode: str) -> np.ndarray:
        import tfgrad

        w = self.params["w"]
        kh, kw, c, m = w.shape
        # Per output channel k * m + q: quantize the filter viewed as [3, 3, c * m].
        self.wq = self.quant.forward(w.reshape(kh, kw, c * m), mode).reshape(w.shape)
        self.x = x
        return tfgrad.raw_ops.DepthwiseConv2dNative(input=x, filter=self.wq, strides=STRIDES,
                                                    padding="SAME")

    def backward(self, g: np.ndarray, need_input: bool = True) -> np.ndarray | None:
        import tfgrad

        w = self.params["w"]
        dwq = tfgrad.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=self.x, filter_sizes=np.array(w.shape, np.int32), out_backprop=g,
            strides=STRIDES, padding="SAME")
        kh, kw, c, m = w.shape
        self.grads["w"] = self.quant.backward(dwq.reshape(kh, kw, c * m)).reshape(w.shape)
        if not need_input:
            return None
        return tfgrad.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=np.array(self.x.shape, np.int32), filter=self.wq, out_backprop=g,
            strides=STRIDES, padding="SAME")


class Pointwise(Layer):
    """1x1 convolution (or, on a [N, C] input, a dense layer): x @ w (+ b), in NumPy."""

    def __init__(self, rng: np.random.Generator, cin: int, cout: int, bits: int,
                 bias: bool = False) -> None:
        super().__init__()
        self.params["w"] = (rng.standard_normal((cin, cout)) * math.sqrt(2.0 / cin)).astype(F32)
        if bias:
            self.params["b"] = np.zeros(cout, F32)
        self.quant = WeightQuant(bits)

    def forward(self, x: np.ndarray, mode: str) -> np.ndarray:
        self.shape = x.shape
        self.x2 = x.reshape(-1, x.shape[-1])
        self.wq = self.quant.forward(self.params["w"], mode)
        y = self.x2 @ self.wq
        if "b" in self.params:
            y = y + self.params["b"]
        return y.reshape(*x.shape[:-1], -1)

    def backward(self, g: np.ndarray, need_input: bool = True) -> np.ndarray | None:
        g2 = g.reshape(-1, g.shape[-1])
        self.grads["w"] = self.quant.backward(self.x2.T @ g2)
        if "b" in self.params:
            self.grads["b"] = g2.sum(axis=0)
        if not need_input:
            return None
        return (g2 @ self.wq.T).reshape(self.shape)


class BatchNorm(Layer):
    def __init__(self, channels: int, momentum: float = 0.1) -> None:
        super().__init__()
        self.params["scale"] = np.ones(channels, F32)
        self.params["offset"] = np.zeros(channels, F32)
        self.running_mean = np.zeros(channels, F32)
        self.running_var = np.ones(channels, F32)
        self.momentum = momentum

    def forward(self, x: np.ndarray, mode: str) -> np.ndarray:
        import tfgrad

        training = mode == TRAIN
        out = tfgrad.raw_ops.FusedBatchNormV3(
            x=x, scale=self.params["scale"], offset=self.params["offset"],
            mean=self.running_mean, variance=self.running_var, epsilon=EPSILON,
            exponential_avg_factor=self.momentum if training else 1.0, is_training=training)
        if training:
            # With exponential_avg_factor f, batch_mean/batch_variance are the updated
            # running statistics: (1 - f) * running + f * batch (Bessel-corrected variance).
            self.running_mean, self.running_var = out.batch_mean, out.batch_variance
            self.x, self.saved = x, (out.reserve_space_1, out.reserve_space_2,
                                     out.reserve_space_3)
        return out.y

    def backward(self, g: np.ndarray, need_input: bool = True) -> np.ndarray | None:
        import tfgrad

        r1, r2, r3 = self.saved
        out = tfgrad.raw_ops.FusedBatchNormGradV3(
            y_backprop=g, x=self.x, scale=self.params["scale"], reserve_space_1=r1,
            reserve_space_2=r2, reserve_space_3=r3, epsilon=EPSILON, is_training=True)
        self.grads["scale"], self.grads["offset"] = out.scale_backprop, out.offset_backprop
        return out.x_backprop


class ReLU6Quant(Layer):
    """ReLU6 (NumPy), then per-tensor fake quantization with a learned [min, max].

    TF's gradient reaches min/max only from the values clipped outside the nudged range,
    so a range starting at ReLU6's [0, 6] would never move. It starts at [0, 3] (three
    standard deviations of a batch-normalized activation) and follows the loss from there;
    min stays 0, as nothing lies below it after ReLU6.
    """

    def __init__(self, bits: int) -> None:
        super().__init__()
        self.params["min"] = np.array(0.0, F32)
        self.params["max"] = np.array(3.0, F32)
        self.bits = bits

    def forward(self, x: np.ndarray, mode: str) -> np.ndarray:
        import tfgrad

        self.x = x
        r = np.clip(x, F32(0), F32(6))
        if mode == EVAL_FLOAT:
            return r
        self.r = r
        return tfgrad.raw_ops.FakeQuantWithMinMaxVars(
            inputs=r, min=self.params["min"], max=self.params["max"], num_bits=self.bits)

    def backward(self, g: np.ndarray, need_input: bool = True) -> np.ndarray | None:
        import tfgrad

        out = tfgrad.raw_ops.FakeQuantWithMinMaxVarsGradient(
            gradients=g, inputs=self.r, min=self.params["min"], max=self.params["max"],
            num_bits=self.bits)
        self.grads["min"], self.grads["max"] = out.backprop_wrt_min, out.backprop_wrt_max
        # TF's Relu6Grad: the gradient passes where 0 < x < 6.
        return out.backprops_wrt_input * ((self.x > 0) & (self.x < 6))


class FractionalAvgPool(Layer):
    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.rng = rng
        self.eval_seeds = self._seeds()

    def _seeds(self) -> tuple[int, int]:
        # Both non-zero: with deterministic=True, (0, 0) would mean "draw random seeds".
        s = self.rng.integers(1, 2**31, size=2)
        return int(s[0]), int(s[1])

    def forward(self, x: np.ndarray, mode: str) -> np.ndarray:
        import tfgrad

        seed, seed2 = self._seeds() if mode == TRAIN else self.eval_seeds
        out = tfgrad.raw_ops.FractionalAvgPool(
            value=x, pooling_ratio=POOL_RATIO, pseudo_random=True, overlapping=True,
            deterministic=True, seed=seed, seed2=seed2)
        self.shape, self.rows, self.cols = x.shape, out.row_pooling_sequence, \
            out.col_pooling_sequence
        return out.output

    def backward(self, g: np.ndarray, need_input: bool = True) -> np.ndarray | None:
        import tfgrad

        return tfgrad.raw_ops.FractionalAvgPoolGrad(
            orig_input_tensor_shape=np.array(self.shape, np.int64), out_backprop=g,
            row_pooling_sequence=self.rows, col_pooling_sequence=self.cols, overlapping=True)


class Flatten(Layer):
    def forward(self, x: np.ndarray, mode: str) -> np.ndarray:
        self.shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, g: np.ndarray, need_input: bool = True) -> np.ndarray | None:
        return g.reshape(self.shape)


def build_model(rng: np.random.Generator, bits: int) -> list[Layer]:
    pooled = int(np.floor(F32(8) / F32(POOL_RATIO[1])))  # TF's float32 output size: 5
    return [
        DepthwiseConv(rng, 1, 16, bits), BatchNorm(16), ReLU6Quant(bits),
        DepthwiseConv(rng, 16, 1, bits), BatchNorm(16), ReLU6Quant(bits),
        Pointwise(rng, 16, 32, bits), BatchNorm(32), ReLU6Quant(bits),
        FractionalAvgPool(rng), Flatten(),
        Pointwise(rng, pooled * pooled * 32, 10, bits, bias=True),
    ]


def forward(model: list[Layer], x: np.ndarray, mode: str) -> np.ndarray:
    for layer in model:
        x = layer.forward(x, mode)
    return x


def backward(model: list[Layer], g: np.ndarray,
             before: Callable[[Layer], None] | None = None) -> None:
    """Every layer's backward, last to first (``before`` called with each layer first);
    the first layer's input gradient is not computed (nothing takes it)."""
    for i in reversed(range(len(model))):
        if before is not None:
            before(model[i])
        g = model[i].backward(g, need_input=i > 0)


def softmax_xent(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy and its gradient with respect to the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = len(labels)
    loss = float(-np.log(p[np.arange(n), labels] + 1e-12).mean())
    p[np.arange(n), labels] -= 1
    return loss, (p / n).astype(F32)


class Adam:
    def __init__(self, model: list[Layer], lr: float, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8) -> None:
        self.model, self.lr, self.b1, self.b2, self.eps, self.t = model, lr, b1, b2, eps, 0
        self.m = [{k: np.zeros_like(v) for k, v in layer.params.items()} for layer in model]
        self.v = [{k: np.zeros_like(v) for k, v in layer.params.items()} for layer in model]

    def step(self, lr: float) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for layer, m, v in zip(self.model, self.m, self.v):
            for k, p in layer.params.items():
                g = layer.grads[k]
                m[k] = self.b1 * m[k] + (1 - self.b1) * g
                v[k] = self.b2 * v[k] + (1 - self.b2) * g * g
                update = lr * (m[k] / c1) / (np.sqrt(v[k] / c2) + self.eps)
                layer.params[k] = (p - update).astype(F32)


def accuracy(model: list[Layer], x: np.ndarray, y: np.ndarray, mode: str) -> float:
    return float((forward(model, x, mode).argmax(axis=1) == y).mean())


def load_digits(seed_split: int = 0) -> tuple[np.ndarray, ...]:
    datasets = require("sklearn.datasets", "demo", "tfgrad demo")
    model_selection = require("sklearn.model_selection", "demo", "tfgrad demo")
    digits = datasets.load_digits()
    x = (digits.images / 16.0).astype(F32)[..., None]  # [1797, 8, 8, 1] in [0, 1]
    y = digits.target.astype(np.int64)
    return tuple(model_selection.train_test_split(x, y, test_size=0.2, stratify=y,
                                                  random_state=seed_split))


def _compile(model: list[Layer], x: np.ndarray, y: np.ndarray) -> float:
    """One step and both evaluations on a copy of the model (compiles or loads every
    kernel); its seconds. Depthwise's gradient kernels, the costliest to compile, are
    compiled meanwhile by a second process (_start_depthwise_grads) when there is a
    second core: the backward waits for it there and loads them from Numba's cache."""
    t0 = time.perf_counter()
    child = _start_depthwise_grads(model, x)

    def wait_at_depthwise(layer: Layer) -> None:
        if isinstance(layer, DepthwiseConv) and child is not None:
            child.wait()

    try:
        scratch = copy.deepcopy(model)
        forward(scratch, x, EVAL_QUANT)
        forward(scratch, x, EVAL_FLOAT)
        backward(scratch, softmax_xent(forward(scratch, x, TRAIN), y)[1], wait_at_depthwise)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
    return time.perf_counter() - t0


def _start_depthwise_grads(model: list[Layer], x: np.ndarray) -> subprocess.Popen | None:
    """A process running each depthwise layer's gradient ops at the step's shapes (the
    layers keep x's N, H, W: SAME, stride 1), which compiles their kernels into the
    on-disk cache; None on one core or without the JIT. (Numba rewrites a function's
    cache index whole: the two processes must not compile one function in different
    signatures at once, so this one runs no depthwise gradient before that one ends.)"""
    import numba

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if (cores or 1) < 2 or numba.config.DISABLE_JIT:
        return None
    code = ("from tfgrad._cli.demo import depthwise_grads; import sys; "
            "depthwise_grads(sys.argv[1], int(sys.argv[2]))")
    try:
        return subprocess.Popen([sys.executable, "-c", code, depthwise_specs(model, x),
                                 str(numba.get_num_threads())], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None


def depthwise_specs(model: list[Layer], x: np.ndarray) -> str:
    """Each depthwise layer's (input shape, filter shape, whether the backward takes its
    input's gradient: not the first layer's) for input ``x``, as JSON."""
    return json.dumps([[[*x.shape[:3], m.params["w"].shape[2]], list(m.params["w"].shape), i > 0]
                       for i, m in enumerate(model) if isinstance(m, DepthwiseConv)])


def depthwise_grads(specs: str, threads: int) -> None:
    """The second process of _start_depthwise_grads: DepthwiseConv2dNativeBackpropFilter,
    and -Input where the backward takes it, on random float32 inputs of each (input
    shape, filter shape, input gradient?) in ``specs``."""
    import numba

    import tfgrad

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    rng = np.random.default_rng(0)
    for xs, ws, need_input in json.loads(specs):
        gs = [*xs[:3], ws[2] * ws[3]]
        x, w, g = (rng.standard_normal(s).astype(F32) for s in (xs, ws, gs))
        tfgrad.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=np.array(ws, np.int32), out_backprop=g, strides=STRIDES,
            padding="SAME")
        if need_input:
            tfgrad.raw_ops.DepthwiseConv2dNativeBackpropInput(
                input_sizes=np.array(xs, np.int32), filter=w, out_backprop=g,
                strides=STRIDES, padding="SAME")


def plot(path: Path, history: list[dict[str, Any]], step_losses: list[float],
         codes: np.ndarray, bits: int, final: dict[str, float]) -> None:
    use_agg_backend()
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc, ax_hist) = plt.subplots(1, 3, figsize=(15, 4.2))
    steps_per_epoch = len(step_losses) / max(len(history), 1)
    ax_loss.plot(np.arange(1, len(step_losses) + 1) / steps_per_epoch, step_losses,
                 lw=0.6, alpha=0.5, label="per batch")
    epochs = [h["epoch"] for h in history]
    ax_loss.plot(epochs, [h["loss"] for h in history], "o-", label="epoch mean")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", title="training loss", yscale="log")
    ax_loss.legend()
    ax_acc.plot(epochs, [100 * h["train_accuracy"] for h in history], "o-", label="train")
    ax_acc.plot(epochs, [100 * h["test_accuracy"] for h in history], "s-",
                label=f"test (int{bits} fake-quant)")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="accuracy")
    ax_acc.legend(loc="lower right")
    ax_acc.grid(alpha=0.3)
    qmax = 2 ** (bits - 1) - 1
    bins = np.arange(-qmax - 0.5, qmax + 1.5, max(1, (2 * qmax + 1) // 255))
    ax_hist.hist(codes, bins=bins, color="tab:purple")
    ax_hist.set(xlabel=f"int{bits} code (per-channel scale, narrow range)", ylabel="weights",
                title="quantized weights, all layers")
    fig.suptitle(f"tfgrad demo: test accuracy float32 {100 * final['float32']:.1f}%, "
                 f"int{bits} fake-quant {100 * final['fake_quant']:.1f}%")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train(model: list[Layer], x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
          y_test: np.ndarray, args: argparse.Namespace, rng: np.random.Generator,
          tqdm: Any) -> tuple[list[dict[str, Any]], list[float], float]:
    """The training loop: one tqdm bar per epoch; the held-out accuracy after each."""
    opt = Adam(model, args.lr)
    n = len(x_train)
    steps = math.ceil(n / args.batch_size)
    history: list[dict[str, Any]] = []
    step_losses: list[float] = []
    t_train = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        order = rng.permutation(n)
        losses, correct = [], 0
        # Updated by hand: a bar iterating over range() closes itself before the held-out
        # accuracy is known.
        bar = tqdm(total=steps, desc=f"epoch {epoch:>2}/{args.epochs}", unit="batch",
                   disable=args.no_progress, file=sys.stderr, leave=True, ncols=110)
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            progress = ((epoch - 1) * steps + i) / (args.epochs * steps)
            lr = args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
            logits = forward(model, x_train[idx], TRAIN)
            loss, dlogits = softmax_xent(logits, y_train[idx])
            backward(model, dlogits)
            opt.step(lr)
            losses.append(loss)
            step_losses.append(loss)
            correct += int((logits.argmax(axis=1) == y_train[idx]).sum())
            seen = min((i + 1) * args.batch_size, n)
            bar.set_postfix(loss=f"{np.mean(losses):.3f}", acc=f"{100 * correct / seen:.1f}%",
                            refresh=False)
            bar.update(1)
        test_acc = accuracy(model, x_test, y_test, EVAL_QUANT)
        bar.set_postfix(loss=f"{np.mean(losses):.3f}", acc=f"{100 * correct / n:.1f}%",
                        test=f"{100 * test_acc:.1f}%")
        bar.close()
        history.append({"epoch": epoch, "loss": float(np.mean(losses)),
                        "train_accuracy": correct / n, "test_accuracy": test_acc,
                        "seconds": time.perf_counter() - t0})
        if args.no_progress:
            h = history[-1]
            print(f"epoch {epoch}/{args.epochs}: loss {h['loss']:.4f}, train "
                  f"{100 * h['train_accuracy']:.1f}%, test {100 * test_acc:.1f}%", flush=True)
    return history, step_losses, time.perf_counter() - t_train


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.bits <= 16:
        raise CLIError(f"--bits must be between 2 and 16, got {args.bits}")
    if args.epochs < 1:
        raise CLIError(f"--epochs must be at least 1, got {args.epochs}")
    t_start = time.perf_counter()
    require("sklearn", "demo", "tfgrad demo")
    tqdm = require("tqdm", "demo", "tfgrad demo").tqdm
    if not args.no_plot:
        require("matplotlib", "demo", "tfgrad demo (the PNG; --no-plot skips it)")
    import numba

    import tfgrad

    if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
        raise CLIError(f"--threads must be between 1 and {numba.config.NUMBA_NUM_THREADS}")
    numba.set_num_threads(args.threads)
    x_train, x_test, y_train, y_test = load_digits()
    if args.train_size:
        x_train, y_train = x_train[:args.train_size], y_train[:args.train_size]
    rng = np.random.default_rng(args.seed)
    model = build_model(rng, args.bits)
    print(f"tfgrad {tfgrad.__version__} demo: {len(x_train)} training and {len(x_test)} "
          f"held-out 8x8 digits, {args.epochs} epochs, int{args.bits} fake quantization, "
          f"seed {args.seed}, {numba.get_num_threads()} Numba threads", flush=True)
    compile_s = _compile(model, x_train[:4], y_train[:4])
    print(f"kernels ready in {compile_s:.1f} s (Numba compiles on first use and caches on "
          "disk; `python -m tfgrad warmup` does it ahead)", flush=True)

    # The NumPy matmuls here are tiny: BLAS threads would only contend with Numba's.
    threadpoolctl = optional("threadpoolctl")  # installed with scikit-learn
    limits = (threadpoolctl.threadpool_limits(1, "blas") if threadpoolctl
              else contextlib.nullcontext())
    with limits:
        history, step_losses, train_s = train(model, x_train, y_train, x_test, y_test, args,
                                              rng, tqdm)
        final = {"float32": accuracy(model, x_test, y_test, EVAL_FLOAT),
                 "fake_quant": accuracy(model, x_test, y_test, EVAL_QUANT)}
    weight_layers = [m for m in model if isinstance(m, (DepthwiseConv, Pointwise))]
    codes = np.concatenate([
        m.quant.codes(m.params["w"].reshape(*m.params["w"].shape[:2], -1)
                      if isinstance(m, DepthwiseConv) else m.params["w"])
        for m in weight_layers])
    out = out_dir(args.out)
    png = out / "demo.png"
    if not args.no_plot:
        plot(png, history, step_losses, codes, args.bits, final)
    summary = {
        "tfgrad": tfgrad.__version__,
        "config": {"epochs": args.epochs, "bits": args.bits, "seed": args.seed,
                   "batch_size": args.batch_size, "lr": args.lr, "n_train": len(x_train),
                   "n_test": len(x_test), "numba_threads": numba.get_num_threads()},
        "test_accuracy": final,
        "history": history,
        "activation_ranges": [[float(m.params["min"]), float(m.params["max"])]
                              for m in model if isinstance(m, ReLU6Quant)],
        "seconds": {"kernels_ready": compile_s, "training": train_s,
                    "total": time.perf_counter() - t_start},
        "png": None if args.no_plot else str(png),
    }
    (out / "demo.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"trained in {train_s:.1f} s; wrote {'' if args.no_plot else str(png) + ' and '}"
          f"{out / 'demo.json'}")
    print(f"test accuracy: float32 {100 * final['float32']:.1f}%, "
          f"int{args.bits} fake-quant {100 * final['fake_quant']:.1f}%")
    return 0

