"""``import tfgrad`` starts glibc's malloc at its grown thresholds (tfgrad._config.tune_malloc):
an array freed and allocated again reuses the heap's pages instead of faulting in fresh
ones; a user's own malloc settings and TFGRAD_MALLOC=0 leave malloc alone."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="glibc's mallopt only")

# 8 MiB allocated, written, freed, then again: the page faults of the second time
_PROBE = """
import json, resource, sys
import numpy as np
import tfgrad
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.empty(2 << 20, np.float32); a[:] = 1; del a
f0 = faults()
b = np.empty(2 << 20, np.float32); b[:] = 2
print(json.dumps({"tuned": tfgrad._config.MALLOC_TUNED, "faults": faults() - f0}))
"""


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "TFGRAD_MALLOC")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_arrays_reuse_the_heap() -> None:
    tuned = _probe()
    assert tuned["tuned"] is True
    # 8 MiB is 2,048 pages: glibc's starting thresholds map it afresh, and its pages
    # fault in again (466 faults on this VM, where transparent huge pages take some)
    assert tuned["faults"] < 100, tuned


@pytest.mark.parametrize("env", [{"TFGRAD_MALLOC": "0"},
                                 {"MALLOC_TRIM_THRESHOLD_": "131072"},
                                 {"MALLOC_MMAP_THRESHOLD_": "131072"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}])
def test_user_settings_win(env: dict[str, str]) -> None:
    assert _probe(**env)["tuned"] is False
