import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# the tabled thresholds (tfgrad._compile.wake_us): the tests' sizes reach the parallel
# kernels wherever they were chosen to, however slowly this machine wakes threads
os.environ.setdefault("TFGRAD_WAKE_US", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from tests import oracle  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # tfgrad warmup first: in a fresh clone it compiles every kernel on two processes into
    # the cache the rest of the run loads from (tests/test_warmup.py).
    items.sort(key=lambda item: item.nodeid.split("::")[0] != "tests/test_warmup.py")
    if oracle.tensorflow() is not None:
        return
    skip = pytest.mark.skip(reason="TensorFlow 2.21 is not installed (pip install -e .[tf])")
    for item in items:
        if "live" in item.keywords:
            item.add_marker(skip)
