"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, tmp_path, monkeypatch):
    if "import torch" in code:
        pytest.importorskip("torch")
    if "model_qat.h5" in code:  # the QAT example reads a tfmot model: made here by tfmot
        pytest.importorskip("tf_keras")
        pytest.importorskip("tensorflow_model_optimization")
        from tfgrad.testing import qat

        _, path = qat.tfmot_qat("cnn", str(tmp_path))
        (tmp_path / "model_qat.h5").write_bytes(Path(path).read_bytes())
        monkeypatch.chdir(tmp_path)
    exec(compile("import numpy as np\nimport tfgrad\n" + code, "README.md", "exec"), {})


def test_readme_has_the_two_commands():
    assert '\npip install -e ".[demo]" && python -m tfgrad demo\n' in README
    assert '\npip install -e ".[test]" && pytest -n auto --maxprocesses 4\n' in README
