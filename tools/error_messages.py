"""Every error case of the op-case table (tests/cases) run through TensorFlow 2.21 and
tfgrad: the two error classes and messages side by side.

    python tools/error_messages.py [-k SUBSTRING[,SUBSTRING]] [--differ] [--rejected]
                                   [--subprocess]

Needs TensorFlow 2.21 (``pip install -e .[tf]``; TF's Eigen kernels,
TF_ENABLE_ONEDNN_OPTS=0). Cases that TF does not reject (``tf_rejects=False``: some of
them crash TF) run in a subprocess each, the others in this process unless
``--subprocess``. For each case it prints the class each raises and whether tfgrad's
message (after its ``Op: `` prefix) starts with TF's fixed words (up to its first value),
and whether the case's regular expression matches TF's message (TF-MATCH where not);
``--differ`` prints only the cases where one of these fails, ``--rejected`` only the cases
TF rejects (no subprocesses). Exit status 0; this is a report, not a test.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_CHILD = r"""
import os, pickle, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
op, kwargs = pickle.loads(sys.stdin.buffer.read())
try:
    with tf.device("/CPU:0"):
        out = getattr(tf.raw_ops, op)(**kwargs)
    outs = out if isinstance(out, (list, tuple)) else [out]
    print("ok\t" + " ".join(str(list(np.shape(o))) for o in outs))
except Exception as e:
    from tests import oracle
    print(type(e).__name__ + "\t" + oracle.tf_message(e).replace("\n", " "))
"""


def run_tf_subprocess(op: str, kwargs: dict) -> tuple[str, str]:
    p = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps((op, kwargs)),
                       capture_output=True, timeout=600, cwd=ROOT)
    lines = p.stdout.decode().strip().splitlines()
    if p.returncode < 0:
        last = [ln for ln in p.stderr.decode().splitlines() if ln.strip()][-1:]
        return f"CRASH (signal {-p.returncode})", " ".join(last)[:300]
    if not lines:
        return f"exit {p.returncode}", p.stderr.decode().strip()[-300:]
    cls, _, msg = lines[-1].partition("\t")
    return cls, msg


def run_tf_here(op: str, kwargs: dict) -> tuple[str, str]:
    from tests import oracle

    try:
        out = oracle.run_tf(op, kwargs)
    except Exception as e:
        return type(e).__name__, oracle.tf_message(e)
    outs = out if isinstance(out, tuple) else (out,)
    return "ok", " ".join(str(list(o.shape)) for o in outs)


def run_tfgrad(op: str, kwargs: dict) -> tuple[BaseException | None, str, str]:
    import tfgrad

    try:
        out = getattr(tfgrad.raw_ops, op)(**kwargs)
    except Exception as e:
        return e, type(e).__name__, str(e)
    outs = out if isinstance(out, tuple) else (out,)
    return None, "ok", " ".join(str(list(o.shape)) for o in outs)


def tf_fixed_words(tf_msg: str) -> str:
    """TF's message up to its first value (a shape, a tensor, "got ..."), without the
    label TF's depthwise backprops put first."""
    msg = re.sub(r"^DepthwiseConv2DBackprop(Input|Filter): ", "", tf_msg)
    return re.split(r"Tensor<|\[|\s*; NodeDef|\bgot\b", msg)[0].rstrip(" .,:")


def same_words(tf_msg: str, ours: str, op: str) -> bool:
    """tfgrad's message, after its ``Op: `` prefix, starts with TF's fixed words."""
    return bool(tf_msg) and ours.removeprefix(f"{op}: ").startswith(tf_fixed_words(tf_msg))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only cases whose id contains one of these "
                    "comma-separated strings")
    ap.add_argument("--differ", action="store_true",
                    help="only cases whose classes or words differ")
    ap.add_argument("--subprocess", action="store_true",
                    help="run TF in a subprocess for every case, not only tf_rejects=False")
    ap.add_argument("--rejected", action="store_true", help="only the cases TF rejects")
    args = ap.parse_args()
    from tests.cases import ERROR_CASES

    n = n_class = n_words = 0
    for case in ERROR_CASES:
        if not any(k in case.id for k in args.k.split(",")) or (
                args.rejected and not case.tf_rejects):
            continue
        if args.subprocess or not case.tf_rejects:
            tf_cls, tf_msg = run_tf_subprocess(case.op, case.kwargs())
        else:
            tf_cls, tf_msg = run_tf_here(case.op, case.kwargs())
        err, cls, msg = run_tfgrad(case.op, case.kwargs())
        want = case.tf_class
        class_ok = (tf_cls == want if case.tf_rejects else True) and isinstance(err, case.error)
        # (a case's tf_match documents words that differ on purpose)
        words_ok = (not case.tf_rejects or case.tf_match is not None
                    or same_words(tf_msg, msg, case.op))
        match_ok = not case.tf_rejects or bool(re.search(case.tf_match or case.match, tf_msg))
        n += 1
        n_class += class_ok
        n_words += words_ok
        if args.differ and class_ok and words_ok and match_ok:
            continue
        flags = ("" if class_ok else " CLASS") + ("" if words_ok else " WORDS")
        flags += "" if match_ok else " TF-MATCH"
        print(f"{case.id}  [{'TF rejects' if case.tf_rejects else 'TF does not reject'}; "
              f"case: {want}]{flags}\n    TF:     {tf_cls}: {tf_msg[:300]}\n"
              f"    tfgrad: {cls}: {msg[:300]}", flush=True)
    print(f"\n{n} cases: classes as the case says in {n_class} (TF's where it rejects, "
          f"tfgrad's); tfgrad's message starts with TF's fixed words in {n_words} (of the "
          "cases TF rejects; the others count as agreeing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
