import os
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton decorates kernels at import time; the interpreter must be chosen before any test
    # module imports gearshift.kernels (the engine itself never runs Triton on CPU tensors).
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(4, os.cpu_count() or 1))

_started = pytest.StashKey[float]()


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the K-th of N round-robin slices of the collected tests (1 <= K <= N): the "
                          "GPU suite takes longer than one lent device call allows, so it runs as N calls")
    parser.addoption("--resume", default=None, metavar="FILE",
                     help="leave out the tests whose ids FILE lists and append to it the id of each test that "
                          "passes: the GPU suite outgrows one device call, and one session's device time, so a "
                          "later run goes on where the earlier ones stopped")
    parser.addoption("--stop-after", default=None, type=float, metavar="SECONDS",
                     help="start no test once SECONDS have passed since the run began; it ends with its summary "
                          "and exit code 2, which a `timeout` kill would lose")


def pytest_collection_modifyitems(config, items):
    resume = config.getoption("--resume")
    if resume:
        done = set(Path(resume).read_text().splitlines()) if Path(resume).is_file() else set()
        config.hook.pytest_deselected(items=[it for it in items if it.nodeid in done])
        items[:] = [it for it in items if it.nodeid not in done]
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        k, n = (int(v) for v in spec.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard takes K/N with 1 <= K <= N, got {spec!r}")
    config.hook.pytest_deselected(items=[it for i, it in enumerate(items) if i % n != k - 1])
    items[:] = items[k - 1::n]


def pytest_sessionstart(session):
    session.config.stash[_started] = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """--resume: one id per line, written as each test passes, so a run killed by a device limit keeps its record."""
    report = (yield).get_result()
    resume = item.config.getoption("--resume")
    if resume and report.when == "call" and report.passed:
        with open(resume, "a") as f:
            f.write(report.nodeid + "\n")


def pytest_runtest_teardown(item):
    budget = item.config.getoption("--stop-after")
    if budget is not None and time.monotonic() - item.config.stash[_started] > budget:
        item.session.shouldstop = f"--stop-after {budget:g}: the time for starting tests is up"


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


SM90_PRELUDE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def ptx(fn, signature, constexprs, num_warps=4, num_stages=1, ints16=()):
    # ints16: integer arguments the JIT would see as multiples of 16 (e.g. K = 4096)
    import inspect
    constexprs = dict(constexprs)  # constexprs left out take the kernel's defaults, as a launch would
    for n, par in inspect.signature(fn.fn).parameters.items():
        if n not in signature and n not in constexprs and par.default is not inspect.Parameter.empty:
            constexprs[n] = par.default
    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
             if t.startswith("*") or n in ints16}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]

try:  # can this machine compile for sm_90 at all? (exit 3: skip; later errors fail the test)
    import importlib.util, os, tempfile
    _path = os.path.join(tempfile.mkdtemp(), "sm90_probe.py")
    with open(_path, "w") as f:
        f.write("import triton\nimport triton.language as tl\n@triton.jit\ndef probe(p):\n    tl.store(p, 1.0)\n")
    _spec = importlib.util.spec_from_file_location("sm90_probe", _path)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    ptx(_mod.probe, {"p": "*fp32"}, {})
except Exception as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(3)
"""


@pytest.fixture(scope="session")
def compile_sm90():
    """Run a script that fills `out` (dict name -> PTX) with `ptx(...)` compiles for sm_90, in a fresh
    process (the suite runs the interpreter; Triton ships ptxas, so no GPU is needed). Skips the
    test where this machine cannot compile for sm_90 at all; a kernel that fails to compile fails."""
    import json
    import subprocess
    import sys

    pytest.importorskip("triton")

    def run(body: str) -> dict:
        script = SM90_PRELUDE + "\nout = {}\n" + body + "\njson.dump(out, sys.stdout)\n"
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
        if r.returncode == 3:
            pytest.skip(f"cannot compile for sm_90 here: {r.stderr.strip().splitlines()[-1:]}")
        if r.returncode != 0:
            pytest.fail(f"sm_90 compile failed: {r.stderr.strip()[-2000:]}")
        return json.loads(r.stdout)

    return run
