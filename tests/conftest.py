import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton decorates kernels at import time; the interpreter must be chosen before any test
    # module imports gearshift.kernels (the engine itself never runs Triton on CPU tensors).
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(4, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """Write a tiny random model folder once per preset and session."""
    cache = {}

    def make(preset: str = "tiny", **overrides):
        key = (preset, tuple(sorted(overrides.items())))
        if key not in cache:
            from gearshift.model.tiny import write_random_model

            name = preset + "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
            cache[key] = write_random_model(tmp_path_factory.mktemp("models") / name, preset, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="module")
def one_thread():
    """Toy shapes: one intra-op thread is fastest and immune to oversubscribed CI cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny_int4(model_dir):
    """The tiny random model with its linears in group-32 int4 (W4A16/W4A8/W4A4 all run on it)."""
    from gearshift.model.loader import load_model, quantize_linears

    loaded = load_model(model_dir("tiny"), progress=False)
    quantize_linears(loaded, "int4", 32, progress=False)
    return loaded
