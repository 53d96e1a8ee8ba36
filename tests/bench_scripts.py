"""Loading a benchmark script's kernels into a test (imported by name, like `hopper.py`): the
scripts under `benchmarks/` are not a package, so they load from their paths."""
import importlib.util
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(relpath: str):
    """The module at benchmarks/<relpath>, executed once per call."""
    path = BENCHMARKS / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device() -> str:
    """Where the kernel tests run: the GPU if there is one, else the CPU under TRITON_INTERPRET=1."""
    return "cuda" if torch.cuda.is_available() else "cpu"


test_device.__test__ = False  # (a helper, not a test, despite its name)
