"""SwiGLU in the gate_up kernel's epilogue (`mma_gemv(..., glu=True)`, `QuantLinear.glu`): the model's
decode steps give the same logits with and without it, and it runs where the dispatcher's gate_up kernel
has the epilogue. The kernel itself against gate_up + SwiGLU: tests/test_kernels_int4_mma.py."""

import dataclasses

import pytest
import torch

from gearshift.dispatch import strategies
from gearshift.kernels import switches


def test_switch_and_cpu_fallback(model_dir):
    """On CPU (and with the switch off) there is no epilogue to run: `glu` says None and the MLP runs as before."""
    from gearshift.model.loader import load_model

    lm = load_model(model_dir("tiny"), quantize="int4", group_size=32, progress=False)
    mlp = lm.model.model.layers[0].mlp
    x = torch.randn(2, lm.model.config.hidden_size)
    assert switches.glu_epilogue_on() and mlp.gate_up_proj.glu(x, "w4a16") is None
    assert ("glu_epilogue", True) in switches.state()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_decode_steps_are_bit_identical_with_the_epilogue(monkeypatch):
    """W4A16 on x; W4A8 and W4A4 on the norm's codes, down then quantizing the product itself."""
    from gearshift.model.tiny import build_random_model

    calls = []
    real = strategies.STRATEGIES["w4a16_mma"]

    def spy(x2, store, cfg, **kw):  # (kw: the fragment layout's x_tiles / y_tiles)
        y = real.run_glu(x2, store, cfg, **kw)
        calls.append(y is not None)
        return y

    monkeypatch.setitem(strategies.STRATEGIES, "w4a16_mma", dataclasses.replace(real, run_glu=spy))
    codes_calls = []
    int8 = strategies.STRATEGIES["w4a8_mma_int8"]

    def spy_codes(codes, store, cfg, dtype):
        y = int8.run_glu_codes(codes, store, cfg, dtype)
        codes_calls.append(y is not None)
        return y

    monkeypatch.setitem(strategies.STRATEGIES, "w4a8_mma_int8", dataclasses.replace(int8, run_glu_codes=spy_codes))
    model = build_random_model("llama3-8b", weights="int4-prog", num_hidden_layers=2, device="cuda")
    try:
        for mode in ("w4a16", "w4a8", "w4a4"):
            for b in (1, 4, 8, 16):
                out = {}
                ids = torch.randint(0, 1000, (b, 12), device="cuda")
                for on in (False, True):
                    switches.set_switches(glu_epilogue=on, glu_epilogue_codes=on)
                    cache = model.new_cache(b, 64)
                    model(ids, cache, [0] * b, [12] * b, mode=mode, logits="last")
                    out[on] = model(ids[:, -1:], cache, [12] * b, [1] * b, mode=mode, logits="last")
                assert torch.equal(out[True], out[False]), (mode, b)
    finally:
        switches.set_switches(glu_epilogue=True, glu_epilogue_codes=False)
    assert any(calls) and any(codes_calls)  # the map's gate_up tiles at some of these sizes have the epilogue
