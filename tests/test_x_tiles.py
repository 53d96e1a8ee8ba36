"""Inputs in the fragment kernel's layout (`kernels/x_tiles.py`, `XTiles`): the producers (RMSNorm, gate_up's
SwiGLU epilogue) write them where the next linear's kernel reads them, and the model's decode steps give the
same logits with the switch on and off. The kernels themselves: tests/test_fragment_asm.py,
test_kernels_int4_mma.py, test_kernels_rmsnorm.py."""

import dataclasses

import pytest
import torch

from gearshift.dispatch import strategies
from gearshift.kernels import switches
from gearshift.kernels.x_tiles import XTiles, from_x_tiles, to_x_tiles, x_tile_rows


def test_xtiles_carries_its_rows():
    x = torch.randn(2, 5, 256, dtype=torch.bfloat16)
    t = XTiles(to_x_tiles(x.reshape(10, 256)), tuple(x.shape))
    assert t.tokens == 10 and t.data.shape == (x_tile_rows(10), 256) and x_tile_rows(10) == 16
    assert torch.equal(t.rows(), x) and torch.equal(from_x_tiles(t.data, 10), x.reshape(10, 256))
    assert [x_tile_rows(m) for m in (1, 8, 9, 16, 17, 33)] == [8, 8, 16, 16, 32, 48]


def test_cpu_linears_take_xtiles_and_never_ask_for_them(model_dir):
    """On CPU no kernel reads the layout (`x_tiles_for` says no), and a linear handed `XTiles` anyway runs on
    its rows: the same result."""
    from gearshift.model.loader import load_model

    lm = load_model(model_dir("tiny"), quantize="int4", group_size=32, progress=False)
    lin = lm.model.model.layers[0].mlp.gate_up_proj
    assert not lin.x_tiles_for("w4a16", 12, torch.float32)
    x = torch.randn(12, lm.model.config.hidden_size)
    assert torch.equal(lin(XTiles(to_x_tiles(x), tuple(x.shape)), "w4a16"), lin(x, "w4a16"))  # (hidden 128)
    assert ("x_tiles", True) in switches.state()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_decode_steps_are_bit_identical_with_x_tiles(monkeypatch):
    """W4A16 steps of 1, 4, 12 and 16 sequences with the producers writing the layout and without (and of 2 with
    it for o and down only); the fragment kernel reads it (its `run_tiles`), and SwiGLU's epilogue writes down's
    input in it, at the token counts `switches.x_tiles_on` takes."""
    from gearshift.model.tiny import build_random_model

    tiles_calls, glu_tiles = [], []
    real = strategies.STRATEGIES["w4a16_mma"]

    def spy_tiles(data, m, store, cfg):
        y = real.run_tiles(data, m, store, cfg)
        tiles_calls.append(y is not None)
        return y

    def spy_glu(x2, store, cfg, **kw):
        glu_tiles.append(bool(kw.get("y_tiles")))
        return real.run_glu(x2, store, cfg, **kw)

    monkeypatch.setitem(strategies.STRATEGIES, "w4a16_mma", dataclasses.replace(real, run_tiles=spy_tiles,
                                                                                  run_glu=spy_glu))
    model = build_random_model("llama3-8b", weights="int4", num_hidden_layers=2, device="cuda")
    before = switches.state()
    try:  # (one-token prompts: the prefill runs the decode step's kernels, nothing else to compile)
        for b, on_switches in ((4, {}), (12, {}), (16, {}), (1, {}), (2, {"x_tiles_linears": "o+down"})):
            out = {}
            ids = torch.randint(0, 1000, (b, 2), device="cuda")
            for on in (False, True):
                switches.set_switches(x_tiles=on, **(on_switches if on else {}))
                cache = model.new_cache(b, 64)
                first = model(ids[:, :1], cache, [0] * b, [1] * b, mode="w4a16", logits="last")
                out[on] = (first, model(ids[:, 1:], cache, [1] * b, [1] * b, mode="w4a16", logits="last"))
            assert all(torch.equal(a, b_) for a, b_ in zip(out[True], out[False])), b
    finally:
        switches.set_switches(**dict(before))
    assert any(tiles_calls) and any(glu_tiles)  # the map's few-token tiles of some linears read the layout
