import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# the tabled thresholds (tfgrad._compile.wake_us): the tests' sizes reach the parallel
# kernels wherever they were chosen to, however slowly this machine wakes threads
os.environ.setdefault("TFGRAD_WAKE_US", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from tests import oracle  # noqa: E402


def _runs_warmup_test(config) -> bool:
    test = Path(__file__).with_name("test_warmup.py")
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if path == test or path in test.parents:
            return True
    return False


def pytest_sessionstart(session):
    # In a fresh clone (CI) tfgrad warmup compiles every kernel, on two processes, into the
    # cache the whole run then loads from: here, once, before any test and before
    # pytest-xdist starts its workers (which inherit the report's path); test_warmup.py
    # asserts on the report.
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    from tests import test_warmup

    if not _runs_warmup_test(config) or not test_warmup.session_cache_is_empty():
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("an empty Numba cache: tfgrad warmup compiles every kernel first "
                            "(minutes; tests/test_warmup.py)")
    where = Path(tempfile.mkdtemp(prefix="tfgrad-warmup-"))
    report = where / "report.json"
    report.write_text(json.dumps(test_warmup.warm_and_check(where, None)))
    os.environ[test_warmup.SESSION_WARMUP] = str(report)
    session.config.add_cleanup(lambda: shutil.rmtree(where, ignore_errors=True))


def pytest_collection_modifyitems(config, items):
    if oracle.tensorflow() is not None:
        return
    skip = pytest.mark.skip(reason="TensorFlow 2.21 is not installed (pip install -e .[tf])")
    for item in items:
        if "live" in item.keywords:
            item.add_marker(skip)
