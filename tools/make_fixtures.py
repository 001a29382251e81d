"""Regenerate the golden fixtures in tests/fixtures/ by running TensorFlow 2.21.

    pip install -e ".[tf]"
    python tools/make_fixtures.py              # every family
    python tools/make_fixtures.py fake_quant   # one family

Each case of the op-case table (tfgrad/testing/cases/) is built with its fixed seed and run
through tf.raw_ops on TF's reference CPU kernels (TF_ENABLE_ONEDNN_OPTS=0). Cases that
TF's CPU kernel refuses (``tf_call``) are run in their TF-computable equivalent form.
Generating a family whose outputs depend on the processor (batch_norm) also writes
tests/fixtures/processor.json: which approximate reciprocal square root the processor has
(see tests/fixture_store.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests import fixture_store, oracle  # noqa: E402
from tests.cases import FAMILIES  # noqa: E402
from tfgrad import testing  # noqa: E402


def main(argv: list[str]) -> int:
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, oneDNN opts off")
    families = argv or list(FAMILIES)
    fixture_store.FIXTURES.mkdir(exist_ok=True)
    for fam in families:
        cases, _ = FAMILIES[fam]
        data: dict[str, np.ndarray] = {}
        for case in cases:
            kwargs = case.kwargs()
            outs = oracle.expected(case, kwargs)
            data.update(fixture_store.pack(case.id, kwargs, outs))
        path = fixture_store.FIXTURES / f"{fam}.npz"
        np.savez_compressed(path, **data)
        print(f"{fam}: {len(cases)} cases -> {path.relative_to(ROOT)} "
              f"({path.stat().st_size // 1024} KiB)")
        if hasattr(testing.family(fam), "processor_dependent"):  # (batch norm's rsqrtps)
            fixture_store.record_processor()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
