"""Agreement of tfgrad's depthwise convolution with TF 2.21's default (oneDNN) build.

    python tools/depthwise_conv_onednn.py [--seed N]

tfgrad reproduces TF's Eigen kernels bit for bit (TF_ENABLE_ONEDNN_OPTS=0). The default
TF build rewrites DepthwiseConv2dNative (f32 / f16 / bf16) and, except with EXPLICIT
padding, both backprops to oneDNN kernels, which accumulate with FMA (f32) or in float32
(f16 / bf16) and so round differently. This script runs TF with oneDNN on in a
subprocess on the same inputs and prints, per op and dtype, the largest distance in
ulps (of T) and the largest relative difference (to the largest |output|) over a set of
shapes, including NCHW and dilated ones that oneDNN computes.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tfgrad  # noqa: E402
from tests.oracle import ulp_distance  # noqa: E402
from tfgrad._tf.depthwise import window  # noqa: E402

_CHILD = """
import os, pickle, sys
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
calls = pickle.loads(sys.stdin.buffer.read())
outs = []
for op, kw in calls:
    try:
        with tf.device("/CPU:0"):
            outs.append(np.asarray(getattr(tf.raw_ops, op)(**kw).numpy()))
    except Exception as e:  # noqa: BLE001
        outs.append(type(e).__name__ + ": " + str(e).splitlines()[0][:200])
sys.stdout.buffer.write(pickle.dumps(outs))
"""

# (N, H, W, C, M, fh, fw, stride, padding, dilation, nchw)
SHAPES = [
    (2, 9, 8, 16, 1, 3, 3, 1, "SAME", 1, False),
    (2, 12, 11, 8, 2, 5, 5, 2, "VALID", 1, False),
    (1, 10, 10, 4, 8, 3, 3, 1, "SAME", 1, False),
    (2, 9, 9, 8, 1, 3, 3, 2, "SAME", 2, False),
    (2, 8, 7, 8, 3, 3, 3, 1, "SAME", 1, True),
    (1, 16, 16, 32, 1, 7, 7, 1, "SAME", 1, False),
]
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float64": np.float64}
OPS = ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
       "DepthwiseConv2dNativeBackpropFilter")


def _calls(rng: np.random.Generator) -> list[tuple[str, str, str, dict[str, Any]]]:
    calls = []
    for N, H, W, C, M, fh, fw, s, pad, d, nchw in SHAPES:
        oh, _ = window("", H, fh, s, d, pad, (0, 0))
        ow, _ = window("", W, fw, s, d, pad, (0, 0))
        if nchw:
            attrs = {"strides": [1, 1, s, s], "dilations": [1, 1, d, d], "data_format": "NCHW"}
            xs, gs = (N, C, H, W), (N, C * M, oh, ow)
        else:
            attrs = {"strides": [1, s, s, 1], "dilations": [1, d, d, 1]}
            xs, gs = (N, H, W, C), (N, oh, ow, C * M)
        attrs["padding"] = pad
        desc = f"[{N},{H},{W},{C}] {fh}x{fw} M={M} s={s} {pad} d={d}{' NCHW' if nchw else ''}"
        for name, dt in DTYPES.items():
            x = rng.standard_normal(xs).astype(dt)
            w = rng.standard_normal((fh, fw, C, M)).astype(dt)
            g = rng.standard_normal(gs).astype(dt)
            calls += [
                (OPS[0], name, desc, {"input": x, "filter": w, **attrs}),
                (OPS[1], name, desc, {"input_sizes": np.array(xs, np.int32), "filter": w,
                                      "out_backprop": g, **attrs}),
                (OPS[2], name, desc, {"input": x, "filter_sizes": np.array(
                    (fh, fw, C, M), np.int32), "out_backprop": g, **attrs}),
            ]
    return calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    calls = _calls(np.random.default_rng(args.seed))
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")
    res = subprocess.run([sys.executable, "-c", _CHILD], env=env, check=True,
                         input=pickle.dumps([(op, kw) for op, _, _, kw in calls]),
                         capture_output=True)
    tf_outs = pickle.loads(res.stdout)
    worst: dict[tuple[str, str, str], list] = {}
    for (op, dname, desc, kw), ref in zip(calls, tf_outs):
        ours = getattr(tfgrad.raw_ops, op)(**kw)
        kind = "NCHW" if "NCHW" in desc else "dilated" if "d=1" not in desc else "NHWC"
        key = (op, dname, kind)
        if isinstance(ref, str):
            worst.setdefault(key, [0, 0.0, 0.0, "", "oneDNN build: " + ref.split(":")[0]])
            continue
        if ours.shape != ref.shape:
            print(f"{op} {dname} {desc}: shape {ours.shape} vs oneDNN {ref.shape}")
            continue
        a, b = ours.astype(np.float64), ref.astype(np.float64)
        ulps = int(ulp_distance(ours, ref).max()) if ours.size else 0
        top = float(np.abs(b).max()) if b.size else 0.0
        # The difference in ulps of the largest output (raw ulps blow up near zero).
        scaled = float(np.abs(a - b).max() / np.spacing(ref.dtype.type(top)).astype(
            np.float64)) if top else 0.0
        rel = float(np.abs(a - b).max() / top) if top else 0.0
        note = ""
        if kind == "dilated" and op != OPS[0]:
            kw1 = dict(kw, dilations=[1, 1, 1, 1])
            d1 = getattr(tfgrad.raw_ops, op)(**kw1).astype(np.float64)
            rel1 = float(np.abs(d1 - b).max() / top) if top else 0.0
            note = (f"TF (oneDNN) returns the dilation-1 result, to {rel1:.1e}: it ignores "
                    "dilations; tfgrad computes the dilated gradient")
        w = worst.setdefault(key, [0, 0.0, 0.0, desc, note])
        if ulps >= w[0]:
            w[0], w[3] = ulps, desc
        w[1], w[2] = max(w[1], scaled), max(w[2], rel)
        w[4] = w[4] or note
    print("| op | dtype | layout | max ulp diff | max diff in ulps of max abs output | "
          "max diff / max abs output | worst case (raw ulps) | note |")
    print("|---|---|---|---|---|---|---|---|")
    for (op, dname, kind), (ulps, scaled, rel, desc, note) in sorted(worst.items()):
        print(f"| {op} | {dname} | {kind} | {ulps} | {scaled:.1f} | {rel:.2e} | {desc} | "
              f"{note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
